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
/// `[B, 1, S, rotary_dim / 2]`. A position outside the caches fails the run (it is wrapped
/// into them until the check is read, so no read leaves the caches).
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
    // Checked as they are (position ids are int64: a cast to 32 bits would wrap 2^40 into
    // range), then wrapped into the caches (one remainder; the check fails the run first).
    ctx.check_range(
        positions,
        0,
        rows - 1,
        format!("a position is outside the cos/sin caches' {rows} rows (it must lie within [0, {}])", rows - 1),
    )?;
    let p = ctx.wrapped(positions, rows, s)?;
    let pick = |cache: &Array| -> Result<Array> {
        let half = cache.shape()[1];
        let rows = ops::take(cache, &p, 0, s)?;
        Ok(ops::astype(&ops::reshape(&rows, &[ps[0], 1, ps[1], half], s)?, Dtype::F32, s)?)
    };
    Ok((pick(cos_cache)?, pick(sin_cache)?))
}

/// Rotates whole heads (`rotary_dim` = head size) of the first `rotated` heads of `x`
/// (`[B, n, S, H]`, any float type) by `cos`/`sin` (`[B, 1, S, H / 2]`, float32) and passes the
/// other heads through unchanged (packed query, key and value heads: the value heads are
/// not rotated). Each feature's partner is a reversed view of the pairs (in a shapeless
/// trace, where MLX refuses a plain slice on replay, a gather of the pair axis in reverse;
/// compiled kernels read negative strides right from MLX 0.32.0 on), read by one fused
/// kernel, with no cutting of heads or halves: each pair `(a, b)` becomes `(a c - b s, b c + a s)` as
/// `x * [c, c] + partner * [-s, s]`, in float32, rounded once to `x`'s type; the tables are
/// built once per graph (`tag` names them among its shared values, `of` the inputs they
/// derive from).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rotate_leading_heads(
    ctx: &mut LowerCtx<'_>,
    x: &Array,
    (cos, sin): (&Array, &Array),
    rotated: i64,
    interleaved: bool,
    of: &[usize],
    tag: &str,
    s: &Stream,
) -> Result<Array> {
    let shape = x.shape();
    let (b, n, seq, head) = (shape[0], shape[1], shape[2], shape[3]);
    let half = cos.shape()[3];
    if 2 * half != head {
        bail!("rotary over {} of {head} features has no whole-head form", 2 * half);
    }
    // Pairs lie along a size-2 axis: [.., 2, half] split in halves, [.., half, 2] interleaved.
    let (pairs, axis, table_shape): (Vec<i64>, i32, Vec<i64>) = if interleaved {
        (vec![b, n, seq, half, 2], 4, vec![b, 1, seq, half, 1])
    } else {
        (vec![b, n, seq, 2, half], 3, vec![b, 1, seq, 1, half])
    };
    let tag = format!("{tag} rotary tables b={b} n={n}/{rotated} s={seq} half={half} interleaved={interleaved}");
    let tables = ctx.shared(of, &tag, |_| {
        let c = ops::reshape(cos, &table_shape, s)?;
        let sn = ops::reshape(sin, &table_shape, s)?;
        let c2 = ops::concatenate(&[c.clone(), c], axis, s)?;
        let s2 = ops::concatenate(&[ops::negative(&sn, s)?, sn], axis, s)?;
        let keep: Vec<bool> = (0..n).map(|h| h < rotated).collect();
        let turned = Array::from_slice(&keep, &[1, n, 1, 1, 1])?;
        Ok(vec![c2, s2, turned])
    })?;
    let x5 = ops::reshape(x, &pairs, s)?;
    // No gather along an axis: on CUDA that is a kernel of its own for NVRTC to compile on a
    // process's first run (seconds); the view costs nothing, and the shapeless trace's gather
    // shares the kernel of every int32-indexed gather of the table's type.
    let partner = if ctx.shapeless() {
        ops::take(&x5, &Array::from_slice(&[1i32, 0], &[2])?, axis, s)?
    } else {
        let mut start = vec![0i64; 5];
        start[axis as usize] = 1;
        let mut stop = pairs.clone();
        stop[axis as usize] = -3;
        let mut strides = vec![1i64; 5];
        strides[axis as usize] = -1;
        ops::slice_strided(&x5, &start, &stop, &strides, s)?
    };
    let wide = |a: &Array| ops::astype(a, Dtype::F32, s);
    let turned =
        ops::add(&ops::multiply(&wide(&x5)?, &tables[0], s)?, &ops::multiply(&wide(&partner)?, &tables[1], s)?, s)?;
    let y = ops::where_(&tables[2], &ops::astype(&turned, x.dtype(), s)?, &x5, s)?;
    Ok(ops::reshape(&y, &shape, s)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
                (x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// Whole heads rotated in place equal the cut-and-rotate form on the rotated heads, in both
    /// pair layouts and in float16, and the heads after them pass through bit for bit (an
    /// infinity and a NaN there included).
    #[test]
    fn whole_heads_rotated_in_place_equal_the_cut_form_and_pass_the_rest_through() {
        let s = Stream::cpu().unwrap();
        let (b, n, seq, head, rotated) = (2i64, 5i64, 3i64, 8i64, 3i64);
        let mut x = values((b * n * seq * head) as usize, 1);
        // A value head's infinity and NaN (head 4 of batch 0).
        let at = |h: i64, t: i64, f: i64| ((h * seq + t) * head + f) as usize;
        x[at(4, 1, 2)] = f32::INFINITY;
        x[at(4, 2, 5)] = f32::NAN;
        let cos = Array::from_slice(&values((b * seq * head / 2) as usize, 2), &[b, 1, seq, head / 2]).unwrap();
        let sin = Array::from_slice(&values((b * seq * head / 2) as usize, 3), &[b, 1, seq, head / 2]).unwrap();
        for dtype in [Dtype::F32, Dtype::F16] {
            for interleaved in [false, true] {
                let xa = ops::astype(&Array::from_slice(&x, &[b, n, seq, head]).unwrap(), dtype, &s).unwrap();
                let mut ctx = LowerCtx::new(Vec::new(), &s, &s);
                let got =
                    rotate_leading_heads(&mut ctx, &xa, (&cos, &sin), rotated, interleaved, &[], "t", &s).unwrap();
                let front = heads::part(&xa, 0, rotated, 1, false, &s).unwrap();
                let want_front = rotate(&front, &cos, &sin, interleaved, false, &s).unwrap();
                let got_front = heads::part(&got, 0, rotated, 1, false, &s).unwrap();
                let f32s = |a: &Array| ops::astype(a, Dtype::F32, &s).unwrap().to_vec::<f32>(&s).unwrap();
                assert_eq!(f32s(&got_front), f32s(&want_front), "{dtype:?} interleaved={interleaved}");
                let rest = |a: &Array| f32s(&heads::part(a, rotated, n - rotated, 1, false, &s).unwrap());
                let (g, w) = (rest(&got), rest(&xa));
                assert!(g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()), "{dtype:?} {interleaved}");
            }
        }
    }
}
