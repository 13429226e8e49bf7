//! The head layout every attention lowering converts to and from: `[B, S, heads * H]` (ONNX's
//! 3-D form) and `[B, heads, S, H]` (what attention computes over), and the parts cut out of
//! them.

use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{Result, bail};

/// `[B, S, heads * H]` to `[B, heads, S, H]`.
pub(crate) fn split(x: &Array, heads: i64, s: &Stream) -> Result<Array> {
    let sh = x.shape();
    if sh.len() != 3 || heads <= 0 || sh[2] % heads != 0 {
        bail!("{sh:?} does not split into {heads} heads");
    }
    let t = ops::reshape(x, &[sh[0], sh[1], heads, sh[2] / heads], s)?;
    Ok(ops::transpose_axes(&t, &[0, 2, 1, 3], s)?)
}

/// `[B, heads, S, H]` to `[B, S, heads * H]`.
pub(crate) fn merge(y: &Array, s: &Stream) -> Result<Array> {
    let sh = y.shape();
    if sh.len() == 4 && sh[2] == 1 {
        // One token: the heads already lie in order.
        return Ok(ops::reshape(y, &[sh[0], 1, sh[1] * sh[3]], s)?);
    }
    Ok(ops::reshape(&ops::transpose_axes(y, &[0, 2, 1, 3], s)?, &[sh[0], sh[2], sh[1] * sh[3]], s)?)
}

/// `[B, kv_heads, S, H]` with each head repeated `reps` times in place (NumPy `repeat`): key
/// and value heads shared by groups of query heads.
pub(crate) fn repeat(x: &Array, reps: i64, s: &Stream) -> Result<Array> {
    if reps == 1 {
        return Ok(x.clone());
    }
    let sh = x.shape();
    let t = ops::broadcast_to(&ops::expand_dims(x, 2, s)?, &[sh[0], sh[1], reps, sh[2], sh[3]], s)?;
    Ok(ops::reshape(&t, &[sh[0], sh[1] * reps, sh[2], sh[3]], s)?)
}

/// `len` entries of `x` from `start` along `axis`: a view in a shape-keyed graph; in the
/// decode slot's shapeless trace (`shapeless`), where MLX refuses a plain slice on replay, a
/// gather of those entries (int32 indices: on CUDA the kernel every int32-indexed gather of a
/// table of `x`'s type shares, where a dynamic slice needs an offset kernel of its own for
/// NVRTC to compile on a first run).
pub(crate) fn part(x: &Array, start: i64, len: i64, axis: usize, shapeless: bool, s: &Stream) -> Result<Array> {
    if shapeless {
        return Ok(ops::take_range(x, start, len, axis as i32, s)?);
    }
    let shape = x.shape();
    let mut lo = vec![0; shape.len()];
    let mut hi = shape;
    lo[axis] = start;
    hi[axis] = start + len;
    Ok(ops::slice(x, &lo, &hi, s)?)
}

/// Consecutive parts of `x` along `axis` of the given lengths (together the whole axis), as
/// [`part`] cuts them: in a shape-keyed graph one split (a single MLX primitive with an output
/// per part, where separate slices would be one primitive each).
pub(crate) fn parts(x: &Array, lens: &[i64], axis: usize, shapeless: bool, s: &Stream) -> Result<Vec<Array>> {
    let total: i64 = lens.iter().sum();
    if x.shape().get(axis) != Some(&total) {
        bail!("{:?} does not split into parts {lens:?} along axis {axis}", x.shape());
    }
    if shapeless {
        let mut start = 0;
        return lens
            .iter()
            .map(|&len| {
                let p = part(x, start, len, axis, true, s);
                start += len;
                p
            })
            .collect();
    }
    let mut bounds = Vec::with_capacity(lens.len().saturating_sub(1));
    let mut at = 0;
    for len in &lens[..lens.len().saturating_sub(1)] {
        at += len;
        bounds.push(at);
    }
    Ok(ops::split_at(x, &bounds, axis as i32, s)?)
}

/// `[1, .., n, ..]` int32 positions `0..n` along `axis` of a rank-4 shape (rows of a KV cache,
/// query tokens, keys).
pub(crate) fn iota(n: i64, axis: usize, s: &Stream) -> Result<Array> {
    let mut shape = [1i64; 4];
    shape[axis] = n;
    Ok(ops::reshape(&ops::arange(0.0, n as f64, 1.0, Dtype::I32, s)?, &shape, s)?)
}

/// An int32 scalar, to compare or offset such positions.
pub(crate) fn int(v: i64, s: &Stream) -> Result<Array> {
    Ok(ops::scalar(v as f64, Dtype::I32, s)?)
}
