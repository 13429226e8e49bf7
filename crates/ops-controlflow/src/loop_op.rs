//! Loop: runs `body` while the trip count lasts and the condition holds, threading the
//! loop-carried values through and stacking the body's scan outputs along a new first axis.
//! The trip count and each iteration's condition are read on the host (an early exit depends
//! on data), so the node runs eagerly: one evaluation of the condition per iteration, the
//! carried values staying in MLX memory, the body a compiled closure replayed per iteration.

use crate::body::check_body;
use ep_core::graph::{ElemType, NodeInfo};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, Result, bail};
use std::ops::RangeInclusive;

/// The most iterations one run takes; a loop still going past it fails the run with that
/// reason (a loop with neither a trip count nor a condition would run forever).
pub const MAX_ITERATIONS: i64 = 1 << 16;

pub struct Loop;

impl Lowering for Loop {
    fn op_type(&self) -> &'static str {
        "Loop"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        1..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        if node.inputs.len() < 2 {
            return Err(Decline(format!(
                "{} inputs; Loop takes the trip count and the condition first",
                node.inputs.len()
            )));
        }
        if let Some(m) = node.input(0)
            && m.elem_type != Some(ElemType::I64)
        {
            return Err(Decline(format!("the trip count has type {:?}", m.elem_type)));
        }
        if let Some(c) = node.input(1)
            && c.elem_type != Some(ElemType::Bool)
        {
            return Err(Decline(format!("the condition has type {:?}", c.elem_type)));
        }
        let body = node.attr_graph("body")?.ok_or_else(|| Decline::new("the body is missing"))?;
        let carried = node.inputs.len() - 2;
        if body.inputs.len() != carried + 2 {
            return Err(Decline(format!(
                "the body takes {} inputs; the node carries {carried} values (the body takes them, the iteration and the condition)",
                body.inputs.len()
            )));
        }
        if body.outputs.len() < carried + 1 || node.outputs.len() + 1 != body.outputs.len() {
            return Err(Decline(format!(
                "the body gives {} outputs; the node has {} and carries {carried} values",
                body.outputs.len(),
                node.outputs.len()
            )));
        }
        check_body(body, "body")
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let body = node.attr_graph("body").map_err(Error::new)?.ok_or_else(|| Error::new("the body is missing"))?;
        let carried = node.inputs.len().saturating_sub(2);
        let scanned = body.outputs.len().saturating_sub(carried + 1);
        let trip = match ctx.optional_input(0) {
            Some(_) => match ctx.host_i64(0)?[..] {
                [m] => Some(m),
                ref other => bail!("the trip count has {} values; it must be a scalar", other.len()),
            },
            None => None,
        };
        let mut keep_going = match ctx.optional_input(1) {
            Some(_) => match ctx.host_i64(1)?[..] {
                [c] => c != 0,
                ref other => bail!("the condition has {} values; it must be a scalar", other.len()),
            },
            None => true,
        };
        let mut state: Vec<Array> = (0..carried).map(|i| ctx.input(i + 2).cloned()).collect::<Result<_>>()?;
        let mut elements: Vec<Vec<Array>> = vec![Vec::new(); scanned];
        let mut it: i64 = 0;
        // The body runs as a compiled closure of its own, traced once and replayed per
        // iteration while its inputs keep their shapes.
        let outer: Vec<String> = node.implicit_inputs.iter().map(|v| v.name.clone()).collect();
        while keep_going && trip.is_none_or(|m| it < m) {
            if it >= MAX_ITERATIONS {
                bail!("the loop is still going after {MAX_ITERATIONS} iterations, the most the MLX EP runs");
            }
            let mut args = vec![Array::from_slice(&[it], &[])?, Array::from_slice(&[keep_going], &[])?];
            args.extend(state.iter().cloned());
            let mut outs = ctx.run_subgraph_compiled(body, args, &outer)?;
            if outs.len() != carried + 1 + scanned {
                bail!("the body gave {} outputs; it declares {}", outs.len(), carried + 1 + scanned);
            }
            let rest = outs.split_off(1);
            let cond = ops::astype(&outs[0], Dtype::I64, ctx.cpu_stream())?.to_vec::<i64>(ctx.cpu_stream())?;
            keep_going = match cond[..] {
                [c] => c != 0,
                _ => bail!("the body's condition has {} values; it must be a scalar", cond.len()),
            };
            let mut rest = rest;
            let per_iteration = rest.split_off(carried);
            state = rest;
            for (e, a) in elements.iter_mut().zip(per_iteration) {
                e.push(a);
            }
            it += 1;
        }
        let s = ctx.stream();
        let mut results = state;
        for (k, e) in elements.into_iter().enumerate() {
            results.push(if e.is_empty() {
                let declared = &body.outputs[1 + carried + k];
                let dims: Option<Vec<i64>> = declared.shape.as_ref().and_then(|d| d.iter().copied().collect());
                let (Some(mut dims), Some(dtype)) = (dims, declared.elem_type.and_then(|t| t.to_mlx())) else {
                    bail!(
                        "scan output {k} of a loop that ran no iteration: the body does not declare its shape and type"
                    );
                };
                dims.insert(0, 0);
                ops::broadcast_to(&ops::scalar(0.0, dtype, s)?, &dims, s)?
            } else {
                ops::stack(&e, 0, s)?
            });
        }
        Ok(results)
    }

    /// The trip count and the condition are read on the host.
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Never
    }
}

ep_core::register_lowering!(LOOP = Loop);
