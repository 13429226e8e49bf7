//! GroupQueryAttention's small tables built once per fixed-shape graph (which rows of a static
//! KV buffer a step keeps and writes, which keys each query sees, the key mask column) from
//! lone operations: no elementwise chain that MLX's compiler would fuse.
//!
//! On CUDA each fused chain is a kernel MLX compiles with NVRTC the first time a process (with
//! an empty kernel cache) meets it, three to six seconds each, one at a time; a lone
//! elementwise operation runs one of MLX's precompiled kernels. These tables are a few hundred
//! values computed once per decode step, so fusing them saved nothing measurable (decode 0.99x
//! with them unfused on an H100) while their three chains took 14.5 s of a decoder's first run
//! there. MLX fuses across broadcasts and elementwise operations only, so [`unfused`] ends a
//! chain, and a broadcast is ended the same way ([`widened`]).

use ep_core::Result;
use ep_core::mlx::ops::unfused;
use ep_core::mlx::{Array, Stream, ops};

/// `a` broadcast to `shape`, with no broadcast left for a chain to fuse.
fn widened(a: &Array, shape: &[i64], s: &Stream) -> Result<Array> {
    Ok(unfused(&ops::broadcast_to(a, shape, s)?, s)?)
}

/// [`widened`] for an array no chain ends in (a constant, a reshaped range): as it is where
/// it has the shape already.
fn fitted(a: &Array, shape: &[i64], s: &Stream) -> Result<Array> {
    if a.shape() == shape { Ok(a.clone()) } else { widened(a, shape, s) }
}

/// For one batch entry whose `past` rows (`[1, 1, 1, 1]` int32) are kept in a present of
/// `len` rows that `seq` new rows join, the tables `present_one` reads: `rows < past`
/// (`[1, 1, len, 1]`), the rows written (`[1, 1, len, 1]`: from `start = clip(past, 0, len -
/// seq)` on, `seq` of them; one new row goes to `past` itself, which the seqlens check holds
/// within the buffer) and, for several, the new row each row would take (`[len]` int32,
/// clamped into `0..seq`); `rows` is `0..len` along axis 2. (The tables feed every layer: MLX
/// fuses none of them into its readers.)
pub(crate) fn entry_rows(rows: &Array, past: &Array, len: i64, seq: i64, s: &Stream) -> Result<Vec<Array>> {
    let shape = [1, 1, len, 1];
    let at_past = widened(past, &shape, s)?;
    let keep = ops::less(rows, &at_past, s)?;
    if seq == 1 {
        return Ok(vec![keep, ops::equal(rows, &at_past, s)?]);
    }
    let constant = |v: i64| Array::from_slice(&vec![v.clamp(0, i32::MAX as i64) as i32; len as usize], &shape);
    let start = ops::minimum(&unfused(&ops::maximum(&at_past, &constant(0)?, s)?, s)?, &constant(len - seq)?, s)?;
    let offset = unfused(&ops::subtract(rows, &unfused(&start, s)?, s)?, s)?;
    let from = unfused(&ops::greater_equal(&offset, &constant(0)?, s)?, s)?;
    let before = unfused(&ops::less(&offset, &constant(seq)?, s)?, s)?;
    let written = ops::logical_and(&from, &before, s)?;
    let source = ops::minimum(&unfused(&ops::maximum(&offset, &constant(0)?, s)?, s)?, &constant(seq - 1)?, s)?;
    Ok(vec![keep, written, ops::flatten(&source, s)?])
}

/// Which of `len` keys (`keys`: `0..len` along axis 3) each of `seq` queries sees, with no
/// window, as `[B, 1, seq, len]` booleans: the keys below `hi`, `min(past + s + 1, total)`
/// for query `s` where `causal`, else `total` (`past`, `total`: `[B, 1, 1, 1]` int32).
/// `extends`: the queries extend a past (`total = past + seq`), so that `hi` is
/// `past + s + 1` (for one query, `total`).
pub(crate) fn keys_seen(
    keys: &Array,
    (past, total): (&Array, &Array),
    seq: i64,
    causal: bool,
    extends: bool,
    s: &Stream,
) -> Result<Array> {
    let (batch, len) = (past.shape()[0], keys.shape()[3]);
    let per_query = [batch, 1, seq, 1];
    let hi = if !causal || (extends && seq == 1) {
        total.clone()
    } else {
        let steps: Vec<i32> = (1..=seq.clamp(0, i32::MAX as i64) as i32).collect();
        let steps = Array::from_slice(&steps, &[1, 1, seq, 1])?;
        let reach = ops::add(&widened(past, &per_query, s)?, &fitted(&steps, &per_query, s)?, s)?;
        if extends { reach } else { ops::minimum(&unfused(&reach, s)?, &widened(total, &per_query, s)?, s)? }
    };
    let all = [batch, 1, seq, len];
    Ok(ops::less(&fitted(keys, &all, s)?, &widened(&hi, &all, s)?, s)?)
}

/// A key mask column: 0 where `allowed`, -inf elsewhere, in `dtype` (the logarithm of the
/// mask as numbers: exact at 1 and 0).
pub(crate) fn mask_bias(allowed: &Array, dtype: ep_core::mlx::Dtype, s: &Stream) -> Result<Array> {
    Ok(ops::log(&unfused(&ops::astype(&unfused(allowed, s)?, dtype, s)?, s)?, s)?)
}
