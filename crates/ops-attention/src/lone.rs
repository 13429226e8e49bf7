//! GroupQueryAttention's small tables built once per fixed-shape graph (which rows of a static
//! KV buffer a step keeps and writes, which keys each query sees, the key mask column) from
//! lone operations: no elementwise chain that MLX's compiler would fuse.
//!
//! On CUDA each fused chain is a kernel MLX compiles with NVRTC the first time a process (with
//! an empty kernel cache) meets it, three to six seconds each, one at a time; a lone
//! elementwise operation runs one of MLX's precompiled kernels. These tables are a few hundred
//! values computed once per decode step, so fusing them saved nothing measurable (decode 0.99x
//! with them unfused on an H100) while their three chains took 14.5 s of a decoder's first run
//! there. MLX fuses across broadcasts and elementwise operations only: a reshape ends a chain
//! (two reshapes leave the array as it was; a broadcast view is copied by the first).

use ep_core::Result;
use ep_core::mlx::{Array, Stream, ops};

/// `a` unchanged, as an array no elementwise chain crosses.
fn unfused(a: &Array, s: &Stream) -> Result<Array> {
    let shape = a.shape();
    let wide: Vec<i64> = std::iter::once(1).chain(shape.iter().copied()).collect();
    Ok(ops::reshape(&ops::reshape(a, &wide, s)?, &shape, s)?)
}

/// `a` broadcast to `shape` and materialized (no broadcast left for a chain to fuse).
fn widened(a: &Array, shape: &[i64], s: &Stream) -> Result<Array> {
    unfused(&ops::broadcast_to(a, shape, s)?, s)
}

/// [`widened`] for an array no chain ends in (a constant, a reshaped range): as it is where
/// it has the shape already.
fn fitted(a: &Array, shape: &[i64], s: &Stream) -> Result<Array> {
    if a.shape() == shape { Ok(a.clone()) } else { widened(a, shape, s) }
}

/// For one batch entry whose `past` rows (`[1, 1, 1, 1]` int32) are kept in a present of
/// `len` rows that `seq` new rows join: `rows < past` (`[1, 1, len, 1]`), the write position
/// `clip(past, 0, len - seq)` (`[1]`; for one new row `past` itself, unread) and
/// `rows == start` (`[1, 1, len, 1]`), as `[keep, start, written]`; `rows` is `0..len` along
/// axis 2. (The tables feed every layer: MLX fuses none of them into its readers.)
pub(crate) fn entry_rows(rows: &Array, past: &Array, len: i64, seq: i64, s: &Stream) -> Result<Vec<Array>> {
    let shape = [1, 1, len, 1];
    let at_past = widened(past, &shape, s)?;
    let keep = ops::less(rows, &at_past, s)?;
    let p = ops::reshape(past, &[1], s)?;
    if seq == 1 {
        // One new row: its position is the past's length, which the seqlens check holds
        // within the buffer (a row outside it matches nothing: no write); `start` is unread.
        return Ok(vec![keep, p, ops::equal(rows, &at_past, s)?]);
    }
    let floor = Array::from_slice(&[0i32], &[1])?;
    let ceiling = Array::from_slice(&[(len - seq).clamp(0, i32::MAX as i64) as i32], &[1])?;
    let start = ops::minimum(&unfused(&ops::maximum(&p, &floor, s)?, s)?, &ceiling, s)?;
    let at = widened(&ops::reshape(&start, &[1, 1, 1, 1], s)?, &shape, s)?;
    Ok(vec![keep, start, ops::equal(rows, &at, s)?])
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
