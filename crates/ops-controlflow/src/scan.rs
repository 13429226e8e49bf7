//! Scan (opset 9 on): runs `body` once per slice of the scan inputs along their scan axes,
//! threading the state variables through, and stacks the body's scan outputs. The iterations
//! are unrolled into the partition's graph (the count is a dimension, so the graph is keyed
//! by shape); each iteration's nodes are lowered like any partition's.

use crate::body::check_body;
use ep_core::graph::NodeInfo;
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, Result, bail, registry};
use std::ops::RangeInclusive;

/// The most iterations unrolled into one graph. A longer scan is left to ORT's CPU EP when
/// its length is known when the model is loaded, and fails the run with that reason when not.
pub const MAX_ITERATIONS: i64 = 4096;

pub struct Scan;

/// The node's shape of a scan: `n` states, `m` scan inputs, `k` scan outputs, and the axes and
/// directions of both sides (unnormalized axes, as given).
struct Layout {
    n: usize,
    m: usize,
    k: usize,
    input_axes: Vec<i64>,
    input_reverse: Vec<bool>,
    output_axes: Vec<i64>,
    output_reverse: Vec<bool>,
}

/// A list attribute of `len` entries (`default` each when absent).
fn per_value(node: &NodeInfo, name: &str, len: usize, default: i64) -> std::result::Result<Vec<i64>, String> {
    match node.attr_ints(name)? {
        None => Ok(vec![default; len]),
        Some(v) if v.len() == len => Ok(v.to_vec()),
        Some(v) => Err(format!("{name} has {} entries; the node has {len}", v.len())),
    }
}

fn directions(node: &NodeInfo, name: &str, len: usize) -> std::result::Result<Vec<bool>, String> {
    per_value(node, name, len, 0)?
        .into_iter()
        .map(|d| match d {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("{name} holds {other}; a direction is 0 or 1")),
        })
        .collect()
}

impl Layout {
    fn read(node: &NodeInfo) -> std::result::Result<Layout, String> {
        let m = node.attr_int("num_scan_inputs", 0)?;
        let inputs = node.inputs.len();
        if m < 1 || m as usize > inputs {
            return Err(format!("num_scan_inputs={m}; the node has {inputs} inputs"));
        }
        let m = m as usize;
        let n = inputs - m;
        let Some(k) = node.outputs.len().checked_sub(n) else {
            return Err(format!("{} outputs for {n} state variables", node.outputs.len()));
        };
        Ok(Layout {
            n,
            m,
            k,
            input_axes: per_value(node, "scan_input_axes", m, 0)?,
            input_reverse: directions(node, "scan_input_directions", m)?,
            output_axes: per_value(node, "scan_output_axes", k, 0)?,
            output_reverse: directions(node, "scan_output_directions", k)?,
        })
    }
}

/// `axis` of a rank-`rank` value, negative counting from the end.
fn normalize(axis: i64, rank: usize, what: &str) -> std::result::Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) { Ok(a as usize) } else { Err(format!("{what} {axis} is out of range for rank {rank}")) }
}

impl Lowering for Scan {
    fn op_type(&self) -> &'static str {
        "Scan"
    }

    /// (Opset 8's Scan, with its batch axis, is `scan8.rs`.)
    fn opsets(&self) -> RangeInclusive<i32> {
        9..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        let layout = Layout::read(node).map_err(Decline)?;
        let body = node.attr_graph("body")?.ok_or_else(|| Decline::new("the body is missing"))?;
        if body.inputs.len() != node.inputs.len() || body.outputs.len() != node.outputs.len() {
            return Err(Decline(format!(
                "the body takes {} inputs and gives {} outputs; the node has {} and {}",
                body.inputs.len(),
                body.outputs.len(),
                node.inputs.len(),
                node.outputs.len()
            )));
        }
        check_unrollable(body)?;
        for (j, &axis) in layout.input_axes.iter().enumerate() {
            let Some(shape) = node.input(layout.n + j).and_then(|v| v.shape.clone()) else { continue };
            let a = normalize(axis, shape.len(), "scan_input_axes entry").map_err(Decline)?;
            if let Some(t) = shape[a]
                && t > MAX_ITERATIONS
            {
                return Err(Decline(format!("{t} iterations; the MLX EP unrolls at most {MAX_ITERATIONS}")));
            }
        }
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let layout = Layout::read(node).map_err(Error::new)?;
        let body = node.attr_graph("body").map_err(Error::new)?.ok_or_else(|| Error::new("the body is missing"))?;
        let states: Vec<Array> = (0..layout.n).map(|i| ctx.input(i).cloned()).collect::<Result<_>>()?;
        // Every scan input cut into its slices along its axis, in iteration order.
        let mut slices: Vec<Vec<Array>> = Vec::with_capacity(layout.m);
        let mut count = None;
        for j in 0..layout.m {
            let x = ctx.input(layout.n + j)?.clone();
            let axis = normalize(layout.input_axes[j], x.ndim(), "scan_input_axes entry").map_err(Error::new)?;
            let t = x.shape()[axis];
            match count {
                Some(c) if c != t => bail!("scan input {j} has {t} iterations along axis {axis}; scan input 0 has {c}"),
                _ => count = Some(t),
            }
            if t > MAX_ITERATIONS {
                bail!("{t} iterations; the MLX EP unrolls at most {MAX_ITERATIONS}");
            }
            let mut parts = slices_along(&x, axis, s)?;
            if layout.input_reverse[j] {
                parts.reverse();
            }
            slices.push(parts);
        }
        let count = count.unwrap_or(0) as usize;
        let (states, elements) = unroll(ctx, node, body, states, &slices, count, layout.k, None)?;
        let mut results = states;
        for (kk, mut e) in elements.into_iter().enumerate() {
            let out = if e.is_empty() {
                // No iteration: an empty axis in the element's declared shape.
                let declared = &body.outputs[layout.n + kk];
                let dims: Option<Vec<i64>> = declared.shape.as_ref().and_then(|d| d.iter().copied().collect());
                let (Some(dims), Some(dtype)) = (dims, declared.elem_type.and_then(|t| t.to_mlx())) else {
                    bail!(
                        "scan output {kk} of a scan with no iterations: the body does not declare its shape and type"
                    );
                };
                let axis =
                    normalize(layout.output_axes[kk], dims.len() + 1, "scan_output_axes entry").map_err(Error::new)?;
                let mut shape = dims;
                shape.insert(axis, 0);
                ops::broadcast_to(&ops::scalar(0.0, dtype, s)?, &shape, s)?
            } else {
                let axis =
                    normalize(layout.output_axes[kk], e[0].ndim() + 1, "scan_output_axes entry").map_err(Error::new)?;
                if layout.output_reverse[kk] {
                    e.reverse();
                }
                ops::stack(&e, axis as i32, s)?
            };
            results.push(out);
        }
        Ok(results)
    }

    /// The iteration count is a dimension of the scan inputs.
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::ShapeKeyed
    }
}

/// A body the EP can unroll: every node lowered, none that reads data on the host.
pub(crate) fn check_unrollable(body: &ep_core::Subgraph) -> std::result::Result<(), Decline> {
    check_body(body, "body")?;
    let registry = registry::global().map_err(|e| Decline(e.to_string()))?;
    for inner in &body.nodes {
        if registry.claim(inner).is_ok_and(|l| l.compile_safety() == CompileSafety::Never) {
            return Err(Decline(format!(
                "body node '{}' ({}) reads data on the host; an unrolled scan is compiled",
                inner.name,
                inner.qualified_op()
            )));
        }
    }
    Ok(())
}

/// Runs `body` `count` times (unrolled into the trace; where the partition runs eagerly, the
/// body is a compiled closure of its own, replayed per iteration) over `states` and each scan
/// input's slices in iteration order: the final states and each of the `k` scan outputs'
/// elements in iteration order. With a `length` (an int32 scalar, Scan 8's sequence length
/// of one batch entry), the iterations from `length` on keep the states and give zeros.
#[allow(clippy::too_many_arguments)]
pub(crate) fn unroll(
    ctx: &mut LowerCtx<'_>,
    node: &NodeInfo,
    body: &ep_core::Subgraph,
    mut states: Vec<Array>,
    slices: &[Vec<Array>],
    count: usize,
    k: usize,
    length: Option<&Array>,
) -> Result<(Vec<Array>, Vec<Vec<Array>>)> {
    let s = ctx.stream();
    let n = states.len();
    let mut elements: Vec<Vec<Array>> = vec![Vec::with_capacity(count); k];
    let outer: Vec<String> = node.implicit_inputs.iter().map(|v| v.name.clone()).collect();
    for it in 0..count {
        let mut args = states.clone();
        args.extend(slices.iter().map(|parts| parts[it].clone()));
        let mut outs = ctx.run_subgraph_compiled(body, args, &outer)?;
        if outs.len() != n + k {
            bail!("the body gave {} outputs; the node has {}", outs.len(), n + k);
        }
        let mut scanned = outs.split_off(n);
        if let Some(length) = length {
            let live = ops::less(&ops::scalar(it as f64, ep_core::mlx::Dtype::I32, s)?, length, s)?;
            for (new, old) in outs.iter_mut().zip(&states) {
                *new = ops::where_(&live, new, old, s)?;
            }
            for a in &mut scanned {
                *a = ops::where_(&live, a, &ops::scalar(0.0, a.dtype(), s)?, s)?;
            }
        }
        states = outs;
        for (e, a) in elements.iter_mut().zip(scanned) {
            e.push(a);
        }
    }
    Ok((states, elements))
}

/// `x`'s slices along `axis` (that axis dropped), in order.
pub(crate) fn slices_along(x: &Array, axis: usize, s: &ep_core::mlx::Stream) -> Result<Vec<Array>> {
    let t = x.shape()[axis];
    let mut parts = if t > 1 {
        ops::split_at(x, &(1..t).collect::<Vec<_>>(), axis as i32, s)?
    } else if t == 1 {
        vec![x.clone()]
    } else {
        Vec::new()
    };
    let mut squeezed: Vec<i64> = x.shape();
    squeezed.remove(axis);
    for p in &mut parts {
        *p = ops::reshape(p, &squeezed, s)?;
    }
    Ok(parts)
}

ep_core::register_lowering!(SCAN = Scan);
