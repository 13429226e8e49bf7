//! If: runs `then_branch` or `else_branch` by the value of a boolean scalar; the branches'
//! nodes are lowered like any partition's, with the outer scope (the node's implicit inputs)
//! visible to them. Eagerly, the condition is read on the host and the branch taken runs as a
//! compiled closure of its own; in a compiled trace a condition known while building (a
//! constant, or computed from shapes and constants) picks its branch too. Otherwise, in a
//! trace, both branches run and each output is selected with `where`, which needs the two
//! branches' outputs to agree in shape and type; where they do not, the trace fails and the
//! partition runs eagerly (the reason is in the session summary).

use crate::body::check_body;
use ep_core::graph::{ElemType, Subgraph};
use ep_core::mlx::{Array, Dtype, ops};
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
        // A condition known while building (a constant, or computed from shapes and
        // constants: it is then part of the compiled graph's shape key) picks its branch.
        let cond = match ctx.host_i64(0) {
            Ok(cond) => cond,
            Err(_) if ctx.tracing() => return selected_on_device(ctx, node),
            Err(e) => return Err(e),
        };
        if cond.len() != 1 {
            return Err(Error::new(format!("the condition has {} elements; If needs exactly one", cond.len())));
        }
        let branch = if cond[0] != 0 { "then_branch" } else { "else_branch" };
        // Read on the host, the condition keeps the partition eager: the branch taken runs as
        // a compiled closure of its own (one per branch and input shapes), not node by node.
        let outer: Vec<String> = node.implicit_inputs.iter().map(|v| v.name.clone()).collect();
        ctx.run_subgraph_compiled(branch_graph(node, branch)?, Vec::new(), &outer)
    }

    /// Compiled: inside a trace the condition is data, and both branches are built and their
    /// outputs selected (see [`selected_on_device`]); where they cannot be, the trace fails and
    /// the partition runs eagerly, reading the condition on the host.
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::ShapeKeyed
    }
}

fn branch_graph<'n>(node: &'n NodeInfo, branch: &str) -> Result<&'n Subgraph> {
    node.attr_graph(branch).map_err(Error::new)?.ok_or_else(|| Error::new(format!("{branch} is missing")))
}

/// Both branches built on the device and each output selected by the condition with `where`,
/// when every output has one shape and type in both branches (a data check of a branch holds
/// where the branch is not taken). Otherwise an error: the condition must be read on the host.
fn selected_on_device(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let cond = ctx.input(0)?.clone();
    if cond.size() != 1 {
        return Err(Error::new(format!("the condition has {} elements; If needs exactly one", cond.size())));
    }
    let taken = ops::reshape(&ops::astype(&cond, Dtype::Bool, s)?, &[], s)?;
    let then = ctx.run_branch(branch_graph(node, "then_branch")?, Vec::new(), &taken)?;
    let other = ops::logical_not(&taken, s)?;
    let otherwise = ctx.run_branch(branch_graph(node, "else_branch")?, Vec::new(), &other)?;
    then.iter()
        .zip(&otherwise)
        .enumerate()
        .map(|(i, (a, b))| {
            if a.shape() != b.shape() || a.dtype() != b.dtype() {
                return Err(Error::new(format!(
                    "output {i} is {:?} {:?} in then_branch and {:?} {:?} in else_branch: the branches \
                     cannot be selected on the device, so the condition is read on the host",
                    a.dtype(),
                    a.shape(),
                    b.dtype(),
                    b.shape()
                )));
            }
            Ok(ops::where_(&taken, a, b, s)?)
        })
        .collect()
}

ep_core::register_lowering!(IF = If);
