//! Rotary position embedding, shared by RotaryEmbedding (`com.microsoft` and ONNX 23) and
//! GroupQueryAttention's `do_rotary`: the first `rotary_dim` features of each head are rotated
//! by the angles of each token's position, read from the model's cos/sin caches (so any
//! frequency scaling the model baked into them is honoured); the rest pass through.
//!
//! With `h = rotary_dim / 2`, `c = cos[pos, i]`, `s = sin[pos, i]`:
//! half-split pairs `(x[i], x[i + h])`, interleaved pairs `(x[2i], x[2i + 1])`, each rotated as
//! `(a, b) -> (a c - b s, b c + a s)`. Computed in float32 and rounded once, as ORT does.

use crate::heads;
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{LowerCtx, Result, bail};

/// Rotates `x` (`[B, heads, S, H]`, any float type) by `cos`/`sin` (`[B, 1, S, rotary_dim /
/// 2]`, float32, broadcast over heads), in float32, rounded once to `x`'s type; `shapeless`:
/// building the decode slot's trace (see [`heads::part`]). The parts are cut before they are
/// widened, so that the widening and the rounding join the rotation's fused kernel.
pub(crate) fn rotate(
    x: &Array,
    cos: &Array,
    sin: &Array,
    interleaved: bool,
    shapeless: bool,
    s: &Stream,
) -> Result<Array> {
    let shape = x.shape();
    let (head, dtype) = (shape[3], x.dtype());
    let half = cos.shape()[3];
    let rd = 2 * half;
    let part = |a: &Array, start: i64, len: i64, axis: usize| heads::part(a, start, len, axis, shapeless, s);
    let (rot, pass) =
        if rd < head { (part(x, 0, rd, 3)?, Some(part(x, rd, head - rd, 3)?)) } else { (x.clone(), None) };
    let turn = |a: &Array, b: &Array| -> Result<(Array, Array)> {
        let (a, b) = (ops::astype(a, Dtype::F32, s)?, ops::astype(b, Dtype::F32, s)?);
        let y1 = ops::subtract(&ops::multiply(&a, cos, s)?, &ops::multiply(&b, sin, s)?, s)?;
        let y2 = ops::add(&ops::multiply(&b, cos, s)?, &ops::multiply(&a, sin, s)?, s)?;
        Ok((ops::astype(&y1, dtype, s)?, ops::astype(&y2, dtype, s)?))
    };
    let rotated = if interleaved {
        let mut pairs_shape = shape[..3].to_vec();
        pairs_shape.extend([half, 2]);
        let pairs = ops::reshape(&rot, &pairs_shape, s)?;
        let mut half_shape = shape[..3].to_vec();
        half_shape.push(half);
        let a = ops::reshape(&part(&pairs, 0, 1, 4)?, &half_shape, s)?;
        let b = ops::reshape(&part(&pairs, 1, 1, 4)?, &half_shape, s)?;
        let (y1, y2) = turn(&a, &b)?;
        let mut out_shape = shape[..3].to_vec();
        out_shape.push(rd);
        ops::reshape(&ops::stack(&[y1, y2], 4, s)?, &out_shape, s)?
    } else {
        let (y1, y2) = turn(&part(&rot, 0, half, 3)?, &part(&rot, half, half, 3)?)?;
        ops::concatenate(&[y1, y2], 3, s)?
    };
    Ok(match pass {
        Some(p) => ops::concatenate(&[rotated, p], 3, s)?,
        None => rotated,
    })
}

/// The rows of the cos and sin caches for `positions` (`[B, S]` integers), as float32
/// `[B, 1, S, rotary_dim / 2]`. A position outside the caches fails the run (it is clamped
/// until the check is read, so no read leaves the caches).
pub(crate) fn angles(
    ctx: &mut LowerCtx<'_>,
    cos_cache: &Array,
    sin_cache: &Array,
    positions: &Array,
    s: &Stream,
) -> Result<(Array, Array)> {
    let ps = positions.shape();
    let rows = cos_cache.shape().first().copied().unwrap_or(0).min(sin_cache.shape().first().copied().unwrap_or(0));
    if rows == 0 {
        bail!("the cos/sin caches have no rows");
    }
    // Checked and clamped in 64 bits (position ids are int64: casting first would wrap 2^40
    // into range), then narrowed for the gather.
    let p = ops::astype(positions, Dtype::I64, s)?;
    let (zero, last) = (ops::scalar(0.0, Dtype::I64, s)?, ops::scalar((rows - 1) as f64, Dtype::I64, s)?);
    let inside = ops::logical_and(&ops::greater_equal(&p, &zero, s)?, &ops::less_equal(&p, &last, s)?, s)?;
    ctx.check(
        &inside,
        format!("a position is outside the cos/sin caches' {rows} rows (it must lie within [0, {}])", rows - 1),
    )?;
    let p = ops::astype(&ops::clip(&p, Some(&zero), Some(&last), s)?, Dtype::I32, s)?;
    let pick = |cache: &Array| -> Result<Array> {
        let half = cache.shape()[1];
        let rows = ops::take(cache, &p, 0, s)?;
        Ok(ops::astype(&ops::reshape(&rows, &[ps[0], 1, ps[1], half], s)?, Dtype::F32, s)?)
    };
    Ok((pick(cos_cache)?, pick(sin_cache)?))
}
