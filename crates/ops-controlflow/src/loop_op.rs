//! Loop: runs `body` while the trip count lasts and the condition holds, threading the
//! loop-carried values through and stacking the body's scan outputs along a new first axis.
//! In a compiled graph, a loop whose trip count is known while building (a constant, or
//! computed from shapes) and short is unrolled; a body condition that is data is carried as a
//! flag. Otherwise the partition runs eagerly: the trip count and each iteration's condition
//! are read on the host, one evaluation per iteration, the carried values staying in MLX
//! memory, the body a compiled closure replayed per iteration.

use crate::body::check_body;
use ep_core::graph::{ElemType, NodeInfo, Subgraph};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, Result, bail};
use std::ops::RangeInclusive;

/// The most iterations one run takes; a loop still going past it fails the run with that
/// reason (a loop with neither a trip count nor a condition would run forever).
pub const MAX_ITERATIONS: i64 = 1 << 16;

/// The most iterations a compiled graph unrolls (a trip count known while building).
pub const UNROLL_MAX: i64 = 64;

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
        let shape = Shape { body, carried, scanned };
        if ctx.tracing() { unrolled(ctx, &shape) } else { eager(ctx, node, &shape) }
    }

    /// Compiled when the trip count is known while building (a constant, or computed from
    /// shapes) and the loop is short (see [`UNROLL_MAX`]): it is unrolled into the graph.
    /// Otherwise the trace fails and the partition runs eagerly.
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::ShapeKeyed
    }
}

/// The body and how its outputs divide: the condition, `carried` values, `scanned` outputs.
struct Shape<'g> {
    body: &'g Subgraph,
    carried: usize,
    scanned: usize,
}

/// The one value of a scalar input known on the host; `what` names it.
fn one(values: Vec<i64>, what: &str) -> Result<i64> {
    match values[..] {
        [v] => Ok(v),
        _ => bail!("{what} has {} values; it must be a scalar", values.len()),
    }
}

/// The loop read on the host: trip count and conditions, one evaluation of the condition per
/// iteration; the body a compiled closure of its own, replayed per iteration.
fn eager(ctx: &mut LowerCtx<'_>, node: &NodeInfo, shape: &Shape<'_>) -> Result<Vec<Array>> {
    let Shape { body, carried, scanned } = *shape;
    let trip = match ctx.optional_input(0) {
        Some(_) => Some(one(ctx.host_i64(0)?, "the trip count")?),
        None => None,
    };
    let mut keep_going = match ctx.optional_input(1) {
        Some(_) => one(ctx.host_i64(1)?, "the condition")? != 0,
        None => true,
    };
    let mut state: Vec<Array> = (0..carried).map(|i| ctx.input(i + 2).cloned()).collect::<Result<_>>()?;
    let mut elements: Vec<Vec<Array>> = vec![Vec::new(); scanned];
    let mut it: i64 = 0;
    let outer: Vec<String> = node.implicit_inputs.iter().map(|v| v.name.clone()).collect();
    // A body that hands its condition back unchanged (a `for` loop's export) needs no read
    // per iteration: the iterations queue up and are evaluated with the node's outputs.
    let passed_through = trip.is_some() && passes_condition_through(body);
    while keep_going && trip.is_none_or(|m| it < m) {
        if it >= MAX_ITERATIONS {
            bail!("the loop is still going after {MAX_ITERATIONS} iterations, the most the MLX EP runs");
        }
        let mut args = vec![Array::from_slice(&[it], &[])?, Array::from_slice(&[keep_going], &[])?];
        args.extend(state.iter().cloned());
        let outs = ctx.run_subgraph_compiled(body, args, &outer)?;
        let (cond, next, per_iteration) = split(outs, shape)?;
        if !passed_through {
            let cond = ops::astype(&cond, Dtype::I64, ctx.cpu_stream())?.to_vec::<i64>(ctx.cpu_stream())?;
            keep_going = one(cond, "the body's condition")? != 0;
        }
        state = next;
        for (e, a) in elements.iter_mut().zip(per_iteration) {
            e.push(a);
        }
        it += 1;
    }
    finish(ctx, shape, state, elements)
}

/// Whether the body's condition output is its condition input, directly or through one
/// Identity.
fn passes_condition_through(body: &Subgraph) -> bool {
    let (Some(cond_in), Some(cond_out)) = (body.inputs.get(1), body.outputs.first()) else { return false };
    cond_out.name == cond_in.name
        || body.nodes.iter().any(|n| {
            n.op_type == "Identity"
                && n.domain.is_empty()
                && n.input(0).is_some_and(|v| v.name == cond_in.name)
                && n.output(0).is_some_and(|v| v.name == cond_out.name)
        })
}

/// The loop unrolled into the graph being traced: the trip count must be known while
/// building, at most [`UNROLL_MAX`]. A condition that is data (the entry one or the body's)
/// becomes a flag carried through the copies: past an exit every carried value keeps
/// its last value (selected with `where`) and the body's data checks hold; scan outputs then
/// have a data-dependent length, which only the eager form gives.
fn unrolled(ctx: &mut LowerCtx<'_>, shape: &Shape<'_>) -> Result<Vec<Array>> {
    let Shape { body, carried, scanned } = *shape;
    let known = |ctx: &LowerCtx<'_>, i: usize| ctx.optional_input(i).map(|_| ctx.host_i64(i)).transpose();
    let read = |r: Result<Option<Vec<i64>>>| {
        r.map_err(|e| Error::new(format!("the trip count or condition is data, read on the host: {e}")))
    };
    let Some(trip) = read(known(ctx, 0))? else {
        bail!("a loop without a trip count ends by its condition, read on the host");
    };
    let trip = one(trip, "the trip count")?;
    if trip > UNROLL_MAX {
        bail!("{trip} iterations: a loop of more than {UNROLL_MAX} runs eagerly, its body compiled apart");
    }
    let s = ctx.stream();
    // Whether the loop still runs: `None` while known to (every condition so far known true).
    let mut alive: Option<Array> = None;
    let mut enter = true;
    if let Some(c) = ctx.optional_input(1) {
        match known(ctx, 1) {
            Ok(Some(c)) => enter = one(c, "the condition")? != 0,
            // The entry condition is data: the first flag.
            _ if c.size() == 1 => alive = Some(ops::reshape(&ops::astype(c, Dtype::Bool, s)?, &[], s)?),
            _ => bail!("the condition has {} values; it must be a scalar", c.size()),
        }
    }
    let mut state: Vec<Array> = (0..carried).map(|i| ctx.input(i + 2).cloned()).collect::<Result<_>>()?;
    let mut elements: Vec<Vec<Array>> = vec![Vec::new(); scanned];
    // The iteration numbers as entries of one array, not scalar constants: MLX writes a
    // scalar constant into the source of a fused kernel, so each copy of the body would be
    // kernels of its own to compile.
    let count = if enter { trip.max(0) } else { 0 };
    let numbers = Array::from_slice(&(0..count).collect::<Vec<i64>>(), &[count])?;
    for it in 0..count {
        if alive.is_some() && scanned > 0 {
            bail!("the body's condition is data and the loop has scan outputs (their length is data)");
        }
        let cond_in = alive.clone().map_or_else(|| Array::from_slice(&[true], &[]), Ok)?;
        let number = ops::reshape(&ops::slice(&numbers, &[it], &[it + 1], s)?, &[], s)?;
        let mut args = vec![number, cond_in];
        args.extend(state.iter().cloned());
        let outs = match &alive {
            None => ctx.run_subgraph(body, args)?,
            Some(a) => ctx.run_branch(body, args, a)?,
        };
        let (cond, next, per_iteration) = split(outs, shape)?;
        state = match &alive {
            None => next,
            Some(a) => next
                .iter()
                .zip(&state)
                .map(|(n, o)| {
                    if n.shape() != o.shape() || n.dtype() != o.dtype() {
                        bail!("a carried value changes shape or type while the condition is data");
                    }
                    Ok(ops::where_(a, n, o, s)?)
                })
                .collect::<Result<_>>()?,
        };
        for (e, a) in elements.iter_mut().zip(per_iteration) {
            e.push(a);
        }
        let flag = ops::reshape(&ops::astype(&cond, Dtype::Bool, s)?, &[], s)?;
        // A condition computed from constants (and shapes) is known here; one that is data is
        // carried as the flag.
        match ops::astype(&flag, Dtype::I64, ctx.cpu_stream())?.to_vec::<i64>(ctx.cpu_stream()) {
            Ok(v) if v == [1] => {}
            // Known false: every later iteration is dead.
            Ok(_) => break,
            Err(_) => alive = Some(alive.map_or(Ok(flag.clone()), |a| ops::logical_and(&a, &flag, s))?),
        }
    }
    finish(ctx, shape, state, elements)
}

/// A body's outputs as (condition, carried values, scan elements).
fn split(mut outs: Vec<Array>, shape: &Shape<'_>) -> Result<(Array, Vec<Array>, Vec<Array>)> {
    if outs.len() != shape.carried + 1 + shape.scanned {
        bail!("the body gave {} outputs; it declares {}", outs.len(), shape.carried + 1 + shape.scanned);
    }
    let mut rest = outs.split_off(1);
    let per_iteration = rest.split_off(shape.carried);
    Ok((outs.remove(0), rest, per_iteration))
}

/// The node's outputs: the final carried values, then each scan output stacked (a loop that
/// ran no iteration gives an empty one of the body's declared shape).
fn finish(ctx: &LowerCtx<'_>, shape: &Shape<'_>, state: Vec<Array>, elements: Vec<Vec<Array>>) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let mut results = state;
    for (k, e) in elements.into_iter().enumerate() {
        results.push(if e.is_empty() {
            let declared = &shape.body.outputs[1 + shape.carried + k];
            let dims: Option<Vec<i64>> = declared.shape.as_ref().and_then(|d| d.iter().copied().collect());
            let (Some(mut dims), Some(dtype)) = (dims, declared.elem_type.and_then(|t| t.to_mlx())) else {
                bail!("scan output {k} of a loop that ran no iteration: the body does not declare its shape and type");
            };
            dims.insert(0, 0);
            ops::broadcast_to(&ops::scalar(0.0, dtype, s)?, &dims, s)?
        } else {
            ops::stack(&e, 0, s)?
        });
    }
    Ok(results)
}

ep_core::register_lowering!(LOOP = Loop);
