//! TensorScatter (opset 24): the ONNX KV-cache update. `present = past` with, for each batch
//! `b`, the slice `write_indices[b] .. write_indices[b] + update.shape[axis]` along `axis`
//! replaced by `update[b]` (`mode = "linear"`), or the rows written at positions taken modulo
//! the cache length (`mode = "circular"`: a write past the end wraps to the start).
//!
//! The output is declared an in-place update of `past_cache`: when ORT binds `present_cache`
//! to the buffer of `past_cache` (a cache shared by past and present), only the written rows
//! are copied. The write indices are read on the host, so the node runs eagerly.

use ep_core::graph::ElemType;
use ep_core::lowering::{FLOATS, require_input_rank, require_inputs};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, NodeInfo, Result, bail};
use std::ops::RangeInclusive;

pub struct TensorScatter;

impl TensorScatter {
    fn axis(node: &NodeInfo, rank: usize) -> std::result::Result<usize, String> {
        let axis = node.attr_int("axis", -2)?;
        let a = if axis < 0 { axis + rank as i64 } else { axis };
        if a <= 0 || a >= rank as i64 {
            return Err(format!("axis {axis} must name a non-batch axis of a rank-{rank} cache"));
        }
        Ok(a as usize)
    }
}

impl TensorScatter {
    /// Whether `mode` is "circular" (else "linear").
    fn circular(node: &NodeInfo) -> std::result::Result<bool, String> {
        match node.attr("mode") {
            None => Ok(false),
            Some(ep_core::AttrValue::String(m)) if m == "linear" => Ok(false),
            Some(ep_core::AttrValue::String(m)) if m == "circular" => Ok(true),
            Some(other) => Err(format!("mode {other:?} is not \"linear\" or \"circular\"")),
        }
    }
}

impl Lowering for TensorScatter {
    fn op_type(&self) -> &'static str {
        "TensorScatter"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        24..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 3)?;
        let rank = require_input_rank(node, 0, 2..=8)?;
        require_input_rank(node, 1, rank..=rank)?;
        for (i, v) in [node.input(0), node.input(1), node.output(0)].into_iter().enumerate() {
            let t = v.and_then(|v| v.elem_type);
            if !t.is_some_and(|t| FLOATS.contains(&t)) {
                return Err(Decline(format!("value {i} has type {t:?}; supported: {FLOATS:?}")));
            }
        }
        if let Some(idx) = node.input(2)
            && idx.elem_type != Some(ElemType::I64)
        {
            return Err(Decline(format!("write_indices has type {:?}; expected int64", idx.elem_type)));
        }
        Self::circular(node).map_err(Decline)?;
        Self::axis(node, rank)?;
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let past = ctx.input(0)?.clone();
        let update = ctx.input(1)?.clone();
        let (ps, us) = (past.shape(), update.shape());
        let axis = Self::axis(node, ps.len()).map_err(Error::new)?;
        if us.len() != ps.len() || (0..ps.len()).any(|d| d != axis && us[d] != ps[d]) || us[axis] > ps[axis] {
            bail!("update {us:?} does not fit cache {ps:?} along axis {axis}");
        }
        let batch = ps[0];
        let starts = match ctx.optional_input(2) {
            Some(_) => ctx.host_i64(2)?,
            None => vec![0; batch as usize],
        };
        if starts.len() != batch as usize {
            bail!("{} write indices for a batch of {batch}", starts.len());
        }
        let rows = us[axis];
        let circular = Self::circular(node).map_err(Error::new)?;
        let len = ps[axis];
        // Slices of the cache per batch entry: the dimensions between the batch and the axis.
        let per_batch: usize = ps[1..axis].iter().map(|&d| d as usize).product();
        let mut present = past;
        let mut patches = Vec::new();
        for (b, &start) in starts.iter().enumerate() {
            if start < 0 {
                bail!("write index {start} is negative (batch {b})");
            }
            // A circular write starts at the index modulo the cache length, as ORT's CPU EP reads it.
            let start = if circular { start % len } else { start };
            if !circular && start + rows > len {
                bail!("write index {start} + {rows} rows exceeds the cache length {len} (batch {b})");
            }
            let b = b as i64;
            // One run of rows, or two where a circular write wraps past the end.
            let first_run = rows.min(len - start);
            let runs = [(0, start, first_run), (first_run, 0, rows - first_run)];
            for &(from, at, n) in runs.iter().filter(|r| r.2 > 0) {
                let mut lo = vec![0i64; ps.len()];
                let mut hi = us.clone();
                lo[0] = b;
                hi[0] = b + 1;
                lo[axis] = from;
                hi[axis] = from + n;
                let piece = ops::slice(&update, &lo, &hi, s)?;
                lo[axis] = at;
                hi[axis] = at + n;
                present = ops::slice_update(&present, &piece, &lo, &hi, s)?;
                let first = b as usize * per_batch;
                patches.extend((first..first + per_batch).map(|outer| (outer, at as usize..(at + n) as usize)));
            }
        }
        ctx.write_back_rows(0, &present, axis, patches, 0)?;
        Ok(vec![present])
    }

    /// The write indices are read on the host.
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Never
    }
}

ep_core::register_lowering!(TENSOR_SCATTER = TensorScatter);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// A cache `[batch, ..., seq, ...]` written along a non-batch axis, `update` rows at
    /// per-batch indices that keep the write inside the cache (or at 0 without indices).
    fn tensor_scatter() -> BoxedStrategy<Case> {
        (
            float_dtype(),
            nonempty_shape(3..=4),
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            0..3u8,
            seed(),
        )
            .prop_map(|(t, past, axis_pick, len_pick, form, seed)| {
                let r = past.len();
                let axis = 1 + axis_pick.index(r - 1);
                let len = 1 + len_pick.index(past[axis] as usize) as i64;
                let mut update = past.clone();
                update[axis] = len;
                // Circular writes may start anywhere in the cache and wrap.
                let circular = form != 0 && seed % 3 == 0;
                let room = if circular { past[axis] } else { past[axis] - len + 1 };
                let mut case = Case::op("TensorScatter", 24).input("past", t, &past).input("update", t, &update);
                if form != 0 {
                    case = case.input_with(
                        "write_indices",
                        DType::I64,
                        &[past[0]],
                        Values::Uniform { lo: 0.0, hi: room as f64 },
                    );
                }
                if circular {
                    case = case.attr_str("mode", "circular");
                }
                let axis_attr = if form == 2 { axis as i64 - r as i64 } else { axis as i64 };
                let case = if form == 1 && axis == r - 2 { case } else { case.attr_int("axis", axis_attr) };
                case.output("present", t, &past).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::TENSOR_SCATTER, tensor_scatter);
}
