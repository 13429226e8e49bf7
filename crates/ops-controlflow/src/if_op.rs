//! If: runs `then_branch` or `else_branch` by the value of a boolean scalar. The condition is
//! read on the host, so the node runs eagerly; the branch's nodes are lowered like any
//! partition's, with the outer scope (the node's implicit inputs) visible to them.

use crate::body::check_body;
use ep_core::graph::{ElemType, Subgraph};
use ep_core::mlx::Array;
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

pub struct If;

/// Declines unless `graph` gives the node's outputs and every node of it can be lowered.
fn check_branch(graph: &Subgraph, branch: &str, outputs: usize) -> std::result::Result<(), Decline> {
    if graph.outputs.len() != outputs {
        return Err(Decline(format!("{branch} has {} outputs; the node has {outputs}", graph.outputs.len())));
    }
    check_body(graph, branch)
}

impl Lowering for If {
    fn op_type(&self) -> &'static str {
        "If"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        1..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        let cond = node.input(0).ok_or_else(|| Decline::new("the condition is missing"))?;
        if cond.elem_type != Some(ElemType::Bool) {
            return Err(Decline(format!("the condition has type {:?}", cond.elem_type)));
        }
        let outputs = node.outputs.len();
        for branch in ["then_branch", "else_branch"] {
            let graph = node.attr_graph(branch)?.ok_or_else(|| Decline(format!("{branch} is missing")))?;
            check_branch(graph, branch, outputs)?;
        }
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let cond = ctx.host_i64(0)?;
        if cond.len() != 1 {
            return Err(Error::new(format!("the condition has {} elements; If needs exactly one", cond.len())));
        }
        let branch = if cond[0] != 0 { "then_branch" } else { "else_branch" };
        let graph =
            node.attr_graph(branch).map_err(Error::new)?.ok_or_else(|| Error::new(format!("{branch} is missing")))?;
        ctx.run_subgraph(graph, Vec::new())
    }

    /// The condition is read on the host.
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Never
    }
}

ep_core::register_lowering!(IF = If);
