//! The head layout every attention lowering converts to and from: `[B, S, heads * H]` (ONNX's
//! 3-D form) and `[B, heads, S, H]` (what attention computes over).

use ep_core::mlx::{Array, Stream, ops};
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
