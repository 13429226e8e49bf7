//! One query token attending over keys some of which are masked out (a static KV buffer's
//! rows past each entry's length, a local window), through MLX's fused one-query kernel.
//!
//! MLX's GPU backends run a single query's attention as one fused kernel only without an
//! array mask (with one, attention falls back to a matmul, a softmax and a matmul: a dozen
//! primitives per layer, each a kernel launch and host work in a decode step). The mask is
//! carried in the head dimension instead: the query gains a column of 1 and each key a column
//! holding 0 where it is seen and -inf where it is not, so that the extra term of each score
//! is exactly 0 or -inf; the values gain columns of 0 and the output's extra columns are cut
//! off. The kernel keeps its running maximum finite, so a key scored -inf weighs exactly 0,
//! and every kept product is the one the unpadded attention computes: the result is the masked
//! attention's. The head dimension grows to the next size MLX's kernel has (64, 96, 128).
//! On MLX's CUDA backend the EP's own kernel ([`crate::one_query`]), where asked for, takes
//! the mask instead.

use crate::heads;
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{LowerCtx, Result};

/// The head sizes MLX's fused one-query kernel has (CUDA and Metal).
const KERNEL_HEADS: [i64; 3] = [64, 96, 128];

/// The padded head size for `head`: the smallest kernel size with room for the mask column.
pub(crate) fn padded_head(head: i64) -> Option<i64> {
    KERNEL_HEADS.into_iter().find(|&d| d > head)
}

/// `softmax(q k^T * scale, keys where allowed) v` for one query token: `q` `[B, heads, 1, H]`,
/// `k`/`v` `[B, kv_heads, L, H]` (finite everywhere, masked rows included), `allowed`
/// `[B, 1, 1, L]` booleans. `None` when the head size has no padded kernel size. The mask
/// columns depend only on `allowed` and the shapes, so they are built once per graph
/// (`tag` names them among the graph's shared values, `of` the inputs they derive from).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    ctx: &mut LowerCtx<'_>,
    (q, k, v): (&Array, &Array, &Array),
    allowed: &Array,
    scale: f32,
    of: &[usize],
    tag: &str,
    shapeless: bool,
    s: &Stream,
) -> Result<Option<Array>> {
    // On CUDA, where asked for, the EP's own kernel reads the mask itself: one launch,
    // nothing padded (in fixed shapes: a shapeless replay asks each primitive for its shapes,
    // which a custom kernel's cannot give).
    if !shapeless
        && crate::one_query::serves()
        && let Some(y) = crate::one_query::attend(q, crate::one_query::Keys::Whole(k, v), allowed, scale, s)?
    {
        return Ok(Some(y));
    }
    let (qs, ks) = (q.shape(), k.shape());
    let head = qs[3];
    let Some(padded) = padded_head(head) else { return Ok(None) };
    let pad = padded - head;
    let (batch, heads_n, kv_heads, keys) = (qs[0], qs[1], ks[1], ks[2]);
    let dtype = q.dtype();
    let tag = format!("{tag} key mask columns b={batch} heads={heads_n}/{kv_heads} keys={keys} pad={pad} {dtype:?}");
    let cols = ctx.shared(of, &tag, |_| {
        let zero = ops::scalar(0.0, dtype, s)?;
        // [B, 1, L, 1]: 0 for a key seen, -inf for one masked (fixed shapes: without a chain
        // for MLX to fuse, see `lone`).
        let bias = if shapeless {
            ops::where_(allowed, &zero, &ops::scalar(f64::NEG_INFINITY, dtype, s)?, s)?
        } else {
            crate::lone::mask_bias(allowed, dtype, s)?
        };
        let bias = ops::reshape(&bias, &[batch, 1, keys, 1], s)?;
        let key_col = if pad > 1 {
            let rest = ops::full(&[batch, 1, keys, pad - 1], &zero, dtype, s)?;
            ops::concatenate(&[bias, rest], 3, s)?
        } else {
            bias
        };
        let key_col = ops::broadcast_to(&key_col, &[batch, kv_heads, keys, pad], s)?;
        let value_col = ops::full(&[batch, kv_heads, keys, pad], &zero, dtype, s)?;
        let mut q_col = vec![0.0f32; pad as usize];
        q_col[0] = 1.0;
        let q_col = ops::astype(&Array::from_slice(&q_col, &[1, 1, 1, pad])?, dtype, s)?;
        let q_col = ops::broadcast_to(&q_col, &[batch, heads_n, 1, pad], s)?;
        Ok(vec![key_col, value_col, q_col])
    })?;
    let kp = ops::concatenate(&[k.clone(), cols[0].clone()], 3, s)?;
    let vp = ops::concatenate(&[v.clone(), cols[1].clone()], 3, s)?;
    let qp = ops::concatenate(&[q.clone(), cols[2].clone()], 3, s)?;
    let y = ops::scaled_dot_product_attention(&qp, &kp, &vp, scale, None, false, s)?;
    Ok(Some(heads::part(&y, 0, head, 3, shapeless, s)?))
}

/// Whether the fused form serves `dtype` here: on a GPU (elsewhere MLX's attention is plain
/// operations, which the padding only slows down), or where a test asks for it.
pub(crate) fn serves(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) && ep_core::mlx::gpu_forms()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(shape: &[i64], seed: u32) -> Array {
        let n: i64 = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
                (x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        Array::from_slice(&v, shape).unwrap()
    }

    /// The padded fused form equals attention with the mask as an additive array, on the
    /// CPU (where MLX computes both from plain operations), for grouped heads and a mask that
    /// hides a tail and a hole.
    #[test]
    fn the_mask_in_the_head_dimension_is_the_masked_attention() {
        let s = Stream::cpu().unwrap();
        for head in [16i64, 64, 96] {
            let (b, heads_n, kv, keys) = (2, 4, 2, 37);
            let q = rand(&[b, heads_n, 1, head], 1);
            let k = rand(&[b, kv, keys, head], 2);
            let v = rand(&[b, kv, keys, head], 3);
            let seen: Vec<u8> =
                (0..b * keys).map(|i| u8::from((i % keys) < 20 + (i / keys) * 9 && i % 7 != 3)).collect();
            let allowed = ops::astype(&Array::from_slice(&seen, &[b, 1, 1, keys]).unwrap(), Dtype::Bool, &s).unwrap();
            let mut ctx = LowerCtx::new(Vec::new(), &s, &s);
            let got = attend(&mut ctx, (&q, &k, &v), &allowed, 0.3, &[], "t", false, &s).unwrap().unwrap();
            let zero = ops::scalar(0.0, Dtype::F32, &s).unwrap();
            let neg = ops::scalar(f64::NEG_INFINITY, Dtype::F32, &s).unwrap();
            let mask = ops::where_(&allowed, &zero, &neg, &s).unwrap();
            let want = ops::scaled_dot_product_attention(&q, &k, &v, 0.3, Some(&mask), false, &s).unwrap();
            assert_eq!(got.shape(), want.shape());
            let (g, w) = (got.to_vec::<f32>(&s).unwrap(), want.to_vec::<f32>(&s).unwrap());
            for (x, y) in g.iter().zip(&w) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "head {head}: {x} vs {y}");
            }
        }
        assert_eq!(padded_head(128), None);
    }
}
