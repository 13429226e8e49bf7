//! Scan of opset 8: the form with a batch axis. Its inputs are `sequence_lens` (optional),
//! `N` states `[batch, ...]` and `M` scan inputs `[batch, time, ...]`; the body runs on one
//! batch entry's state and time step (no batch axis), `directions` turns a scan input around,
//! and the outputs are the final states `[batch, ...]` and the scan outputs `[batch, time,
//! ...]` in iteration order. Each batch entry is unrolled as opset 9's Scan unrolls its
//! iterations (at most [`MAX_ITERATIONS`] body runs in all). With `sequence_lens` (int64, one
//! length in `1..=time` per entry, as ORT's CPU EP requires: another fails the run), entry
//! `b` runs `L_b` iterations over the first `L_b` steps of its scan inputs (a reversed input
//! read from step `L_b - 1` down), its final states are those after them, and its scan outputs
//! are zero past them: every entry is unrolled for `time` iterations, the later ones
//! selected away.

use crate::scan::{MAX_ITERATIONS, check_unrollable, slices_along, unroll};
use ep_core::graph::NodeInfo;
use ep_core::mlx::{Array, Dtype, ops};
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
        ep_core::lowering::require_input_type(node, 0, &[ep_core::ElemType::I64])?;
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
        // Each entry's length, an int32 scalar, checked as ORT checks them.
        let lengths = match ctx.optional_input(0).cloned() {
            Some(lens) => {
                if lens.shape() != [batch] {
                    bail!("sequence_lens {:?} must hold one length per batch entry ({batch})", lens.shape());
                }
                let reason = format!("a sequence_lens entry is outside [1, {time}] (the scan inputs' time steps)");
                ctx.check_range(&lens, 1, time, reason)?;
                let lens = ops::astype(&lens, Dtype::I32, s)?;
                Some(if batch == 0 { Vec::new() } else { slices_along(&lens, 0, s)? })
            }
            None => None,
        };
        // Each input cut into its batch entries.
        let entries =
            |a: &Array| -> Result<Vec<Array>> { if batch == 0 { Ok(Vec::new()) } else { slices_along(a, 0, s) } };
        let state_entries: Vec<Vec<Array>> = states.iter().map(entries).collect::<Result<_>>()?;
        let scan_entries: Vec<Vec<Array>> = scans.iter().map(entries).collect::<Result<_>>()?;
        let mut final_states: Vec<Vec<Array>> = vec![Vec::new(); n];
        let mut outputs: Vec<Vec<Array>> = vec![Vec::new(); k];
        for b in 0..batch as usize {
            let init: Vec<Array> = state_entries.iter().map(|e| e[b].clone()).collect();
            let length = lengths.as_ref().map(|l| &l[b]);
            let mut slices = Vec::with_capacity(m);
            for (j, e) in scan_entries.iter().enumerate() {
                let parts = match (directions[j], length) {
                    (false, _) => slices_along(&e[b], 0, s)?,
                    (true, None) => slices_along(&e[b], 0, s)?.into_iter().rev().collect(),
                    // Step L - 1 - t at iteration t (clamped: iterations from L on are not kept).
                    (true, Some(l)) => (0..time)
                        .map(|t| {
                            let at = ops::subtract(l, &ops::scalar((t + 1) as f64, Dtype::I32, s)?, s)?;
                            let at = ops::maximum(&at, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
                            Ok(ops::take(&e[b], &at, 0, s)?)
                        })
                        .collect::<Result<_>>()?,
                };
                slices.push(parts);
            }
            let (last, elements) = unroll(ctx, node, body, init, &slices, time as usize, k, length)?;
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
