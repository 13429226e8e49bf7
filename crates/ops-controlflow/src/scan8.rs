//! Scan of opset 8: the form with a batch axis. Its inputs are `sequence_lens` (optional),
//! `N` states `[batch, ...]` and `M` scan inputs `[batch, time, ...]`; the body runs on one
//! batch entry's state and time step (no batch axis), `directions` turns a scan input around,
//! and the outputs are the final states `[batch, ...]` and the scan outputs `[batch, time,
//! ...]` in iteration order. Each batch entry is unrolled as opset 9's Scan unrolls its
//! iterations (at most [`MAX_ITERATIONS`] body runs in all). Sequence lengths (entries of
//! different lengths) are left to ORT's CPU EP.

use crate::scan::{MAX_ITERATIONS, check_unrollable, slices_along, unroll};
use ep_core::graph::NodeInfo;
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, Result, bail};
use std::ops::RangeInclusive;

pub struct Scan8;

/// `(N, M, directions)` of the node: states, scan inputs, whether each scan input runs in
/// reverse.
fn layout(node: &NodeInfo) -> std::result::Result<(usize, usize, Vec<bool>), String> {
    let m = node.attr_int("num_scan_inputs", 0)?;
    // Input 0 is sequence_lens, present or not.
    let values = node.inputs.len().saturating_sub(1);
    if m < 1 || m as usize > values {
        return Err(format!("num_scan_inputs={m}; the node has {values} state and scan inputs"));
    }
    let m = m as usize;
    let directions = match node.attr_ints("directions")? {
        None => vec![false; m],
        Some(d) if d.len() == m => d
            .iter()
            .map(|&v| match v {
                0 => Ok(false),
                1 => Ok(true),
                other => Err(format!("directions holds {other}; a direction is 0 or 1")),
            })
            .collect::<std::result::Result<_, _>>()?,
        Some(d) => return Err(format!("directions has {} entries; the node has {m} scan inputs", d.len())),
    };
    Ok((values - m, m, directions))
}

impl Lowering for Scan8 {
    fn op_type(&self) -> &'static str {
        "Scan"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        8..=8
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        let (n, m, _) = layout(node).map_err(Decline)?;
        if node.input(0).is_some() {
            return Err(Decline::new("sequence_lens (batch entries of different lengths) is not supported"));
        }
        let body = node.attr_graph("body")?.ok_or_else(|| Decline::new("the body is missing"))?;
        if body.inputs.len() != n + m || body.outputs.len() != node.outputs.len() {
            return Err(Decline(format!(
                "the body takes {} inputs and gives {} outputs; the node has {} and {}",
                body.inputs.len(),
                body.outputs.len(),
                n + m,
                node.outputs.len()
            )));
        }
        if node.outputs.len() < n {
            return Err(Decline(format!("{} outputs for {n} state variables", node.outputs.len())));
        }
        check_unrollable(body)?;
        let dims = |i: usize, d: usize| node.input(i).and_then(|v| v.shape.as_ref()?.get(d).copied().flatten());
        if let (Some(b), Some(t)) = (dims(1 + n, 0), dims(1 + n, 1))
            && b * t > MAX_ITERATIONS
        {
            return Err(Decline(format!("{b} x {t} body runs; the MLX EP unrolls at most {MAX_ITERATIONS}")));
        }
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let (n, m, directions) = layout(node).map_err(Error::new)?;
        let body = node.attr_graph("body").map_err(Error::new)?.ok_or_else(|| Error::new("the body is missing"))?;
        let k = node.outputs.len() - n;
        let states: Vec<Array> = (0..n).map(|i| ctx.input(1 + i).cloned()).collect::<Result<_>>()?;
        let scans: Vec<Array> = (0..m).map(|j| ctx.input(1 + n + j).cloned()).collect::<Result<_>>()?;
        let (batch, time) = match scans[0].shape()[..] {
            [b, t, ..] => (b, t),
            ref other => bail!("scan input 0 has shape {other:?}; it needs [batch, time, ...]"),
        };
        for (i, a) in states.iter().chain(&scans).enumerate() {
            let sh = a.shape();
            if sh.first() != Some(&batch) || (i >= n && sh.get(1) != Some(&time)) {
                bail!("input {} has shape {sh:?}; scan input 0 has batch {batch} and time {time}", 1 + i);
            }
        }
        if batch * time > MAX_ITERATIONS {
            bail!("{batch} x {time} body runs; the MLX EP unrolls at most {MAX_ITERATIONS}");
        }
        // Each input cut into its batch entries.
        let entries =
            |a: &Array| -> Result<Vec<Array>> { if batch == 0 { Ok(Vec::new()) } else { slices_along(a, 0, s) } };
        let state_entries: Vec<Vec<Array>> = states.iter().map(entries).collect::<Result<_>>()?;
        let scan_entries: Vec<Vec<Array>> = scans.iter().map(entries).collect::<Result<_>>()?;
        let mut final_states: Vec<Vec<Array>> = vec![Vec::new(); n];
        let mut outputs: Vec<Vec<Array>> = vec![Vec::new(); k];
        for b in 0..batch as usize {
            let init: Vec<Array> = state_entries.iter().map(|e| e[b].clone()).collect();
            let mut slices = Vec::with_capacity(m);
            for (j, e) in scan_entries.iter().enumerate() {
                let mut parts = slices_along(&e[b], 0, s)?;
                if directions[j] {
                    parts.reverse();
                }
                slices.push(parts);
            }
            let (last, elements) = unroll(ctx, node, body, init, &slices, time as usize, k)?;
            for (f, a) in final_states.iter_mut().zip(last) {
                f.push(a);
            }
            for (o, e) in outputs.iter_mut().zip(elements) {
                if e.is_empty() {
                    bail!("a scan of no time steps: its scan outputs' shapes are not known");
                }
                o.push(ops::stack(&e, 0, s)?);
            }
        }
        if batch == 0 {
            bail!("a batch of no entries: the outputs' shapes are not known");
        }
        let mut results = Vec::with_capacity(n + k);
        for parts in final_states.into_iter().chain(outputs) {
            results.push(ops::stack(&parts, 0, s)?);
        }
        Ok(results)
    }

    /// The batch and time are dimensions of the inputs.
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::ShapeKeyed
    }
}

ep_core::register_lowering!(SCAN8 = Scan8);
