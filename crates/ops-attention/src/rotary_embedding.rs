//! RotaryEmbedding: `com.microsoft` (input, position_ids, cos_cache, sin_cache) and ONNX 23
//! (X, cos_cache, sin_cache, optional position_ids). Input `[B, S, heads * H]` (3-D, needs
//! `num_heads` unless the rotary dim is the whole hidden size) or `[B, heads, S, H]` (4-D);
//! partial rotary through `rotary_embedding_dim`; interleaved or half-split pairs (see
//! [`crate::rotary`]). Positions: `com.microsoft` takes `[B, S]` ids or one offset (`pos =
//! offset + s`); ONNX 23 takes `[B, S]` ids, or without them reads the caches as `[B, S, dim/2]`.

use crate::{heads, rotary};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const TYPES: &[ElemType] = &[ElemType::F32, ElemType::F16, ElemType::BF16];

fn claim_common(node: &NodeInfo, x: usize, caches: [usize; 2], ids: usize) -> std::result::Result<(), Decline> {
    for i in [x, caches[0], caches[1]] {
        require_input_type(node, i, TYPES)?;
    }
    require_input_type(node, ids, &[ElemType::I64])?;
    match ep_core::lowering::input_rank(node, x) {
        Some(3 | 4) => Ok(()),
        r => Err(Decline(format!("input has rank {r:?}; 3 or 4 is supported"))),
    }
}

/// The attributes ORT's kernels refuse when the session is created: a negative
/// `rotary_embedding_dim` or `num_heads`, and (`com.microsoft`) a rotary dimension without
/// `num_heads`.
fn claim_attrs(node: &NodeInfo, dim_needs_heads: bool) -> std::result::Result<(), Decline> {
    let (dim, heads) = (node.attr_int("rotary_embedding_dim", 0)?, node.attr_int("num_heads", 0)?);
    let big = |v: i64| v > i32::MAX as i64;
    if dim < 0 || heads < 0 || big(dim) || big(heads) || (dim_needs_heads && dim > 0 && heads == 0) {
        return Err(Decline(format!("rotary_embedding_dim {dim} with num_heads {heads}")));
    }
    Ok(())
}

fn claim_ms(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 4, 4)?;
    if node.attr_int("is_packed_batching", 0)? != 0 {
        return Err(Decline::new("is_packed_batching is not supported"));
    }
    claim_attrs(node, true)?;
    claim_common(node, 0, [2, 3], 1)
}

fn claim_onnx(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 4)?;
    claim_attrs(node, false)?;
    claim_common(node, 0, [1, 2], 3)
}

/// Rotates `x` with angles `(cos, sin)` (`[B, 1, S, dim/2]` float32), any layout.
pub(crate) fn apply(
    ctx: &LowerCtx<'_>,
    node: &NodeInfo,
    x: &Array,
    cos: &Array,
    sin: &Array,
    s: &Stream,
) -> Result<Array> {
    let shape = x.shape();
    let interleaved = node.attr_int("interleaved", 0)? == 1;
    let half = cos.shape()[3];
    let heads_4d = if shape.len() == 4 {
        x.clone()
    } else {
        let heads = match node.attr_int("num_heads", 0)? {
            n if n > 0 => n,
            _ if shape[2] == 2 * half => 1,
            _ => bail!("num_heads is needed when the rotary dimension is not the whole hidden size"),
        };
        heads::split(x, heads, s)?
    };
    let head = heads_4d.shape()[3];
    if 2 * half > head {
        bail!("the caches rotate {} features; heads have {head}", 2 * half);
    }
    // (Its inputs never grow in the decode slot: it declares no growth.)
    let y = rotary::rotate(&heads_4d, cos, sin, interleaved, ctx.shapeless(), s)?;
    Ok(if shape.len() == 4 { y } else { heads::merge(&y, s)? })
}

/// The shapes ORT's kernels require: cos and sin caches alike, position ids `[batch, sequence]`
/// (`com.microsoft` also takes one offset), per-token caches (`onnx`, no ids) `[batch,
/// sequence, dim/2]`, and a cache width of half the head or of half `rotary_embedding_dim`.
fn check_shapes(node: &NodeInfo, x: &Array, ids: Option<&Array>, cos: &Array, sin: &Array, onnx: bool) -> Result<()> {
    let (xs, cs) = (x.shape(), cos.shape());
    if cs != sin.shape() {
        bail!("cos_cache {cs:?} and sin_cache {:?} must have the same shape", sin.shape());
    }
    let (batch, seq) = (xs[0], seq_len(x));
    match ids {
        Some(ids) if !(ids.shape() == [batch, seq] || (!onnx && ids.size() == 1)) => {
            bail!("position_ids {:?} must be [batch, sequence] = [{batch}, {seq}]", ids.shape())
        }
        None if onnx && (cs.len() != 3 || cs[0] != batch || cs[1] != seq) => {
            bail!("without position_ids the caches {cs:?} must be [batch, sequence, dim/2] = [{batch}, {seq}, _]")
        }
        _ => {}
    }
    let (dim, heads) = (node.attr_int("rotary_embedding_dim", 0)?, node.attr_int("num_heads", 0)?);
    if onnx && xs.len() == 3 && dim > 0 && heads == 0 {
        bail!("num_heads is needed with rotary_embedding_dim for a 3-D input");
    }
    let half = cs[cs.len() - 1];
    let head = if xs.len() == 4 { Some(xs[3]) } else { (heads > 0).then(|| xs[2] / heads) };
    if let Some(h) = head.filter(|&h| dim > h) {
        bail!("rotary_embedding_dim {dim} is more than the head size {h}");
    }
    if head.is_some_and(|h| 2 * half != h) && !(dim > 0 && 2 * half == dim) {
        bail!("the caches' width {half} is neither half the head ({head:?}) nor half rotary_embedding_dim {dim}");
    }
    Ok(())
}

/// The sequence length of `x` in either layout.
fn seq_len(x: &Array) -> i64 {
    let sh = x.shape();
    if sh.len() == 4 { sh[2] } else { sh[1] }
}

fn lower_ms(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = &ctx.input(0)?.clone();
    check_shapes(node, x, Some(ctx.input(1)?), ctx.input(2)?, ctx.input(3)?, false)?;
    let (batch, seq) = (x.shape()[0], seq_len(x));
    // int64 until the range check in `rotary::angles` (a narrowing cast would wrap 2^40).
    let ids = ops::astype(ctx.input(1)?, Dtype::I64, s)?;
    let positions = if ids.size() == 1 {
        let steps = ops::reshape(&ops::arange(0.0, seq as f64, 1.0, Dtype::I64, s)?, &[1, seq], s)?;
        ops::broadcast_to(&ops::add(&ops::reshape(&ids, &[1, 1], s)?, &steps, s)?, &[batch, seq], s)?
    } else {
        ids
    };
    let (cos_cache, sin_cache) = (ctx.input(2)?.clone(), ctx.input(3)?.clone());
    let (cos, sin) = rotary::angles(ctx, &cos_cache, &sin_cache, &positions, s)?;
    Ok(vec![apply(ctx, node, x, &cos, &sin, s)?])
}

fn lower_onnx(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = &ctx.input(0)?.clone();
    check_shapes(node, x, ctx.optional_input(3), ctx.input(1)?, ctx.input(2)?, true)?;
    let (cos, sin) = match ctx.optional_input(3).cloned() {
        Some(ids) => {
            let (cos_cache, sin_cache) = (ctx.input(1)?.clone(), ctx.input(2)?.clone());
            rotary::angles(ctx, &cos_cache, &sin_cache, &ids, s)?
        }
        None => {
            // Caches already per token: [B, S, dim/2].
            let pick = |c: &Array| -> Result<Array> {
                let cs = c.shape();
                if cs.len() != 3 {
                    bail!("without position_ids the caches must be [batch, sequence, dim/2], not {cs:?}");
                }
                Ok(ops::astype(&ops::reshape(c, &[cs[0], 1, cs[1], cs[2]], s)?, Dtype::F32, s)?)
            };
            (pick(ctx.input(1)?)?, pick(ctx.input(2)?)?)
        }
    };
    let dim = node.attr_int("rotary_embedding_dim", 0)?;
    if dim > 0 && dim != 2 * cos.shape()[3] {
        bail!("rotary_embedding_dim {dim} does not match caches of {} columns", cos.shape()[3]);
    }
    Ok(vec![apply(ctx, node, x, &cos, &sin, s)?])
}

ep_core::register_lowering!(
    ROTARY_EMBEDDING_MS = FnLowering {
        domain: "com.microsoft",
        op: "RotaryEmbedding",
        opsets: 1..=i32::MAX,
        claim: claim_ms,
        lower: lower_ms,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    ROTARY_EMBEDDING = FnLowering {
        domain: "",
        op: "RotaryEmbedding",
        opsets: 23..=i32::MAX,
        claim: claim_onnx,
        lower: lower_onnx,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// (batch, seq, heads, head, rotary dim, 4-D layout, interleaved).
    fn geometry() -> impl Strategy<Value = (i64, i64, i64, i64, i64, bool, bool)> {
        (1..=2i64, 1..=4i64, 1..=3i64, prop_oneof![Just(8i64), Just(16)], any::<(bool, bool, bool)>()).prop_map(
            |(b, s, n, h, (partial, four_d, interleaved))| {
                (b, s, n, h, if partial { h / 2 } else { h }, four_d, interleaved)
            },
        )
    }

    fn x_shape(b: i64, s: i64, n: i64, h: i64, four_d: bool) -> Vec<i64> {
        if four_d { vec![b, n, s, h] } else { vec![b, s, n * h] }
    }

    register_spec!(super::ROTARY_EMBEDDING_MS, || {
        (dtype_of(&[DType::F32, DType::F16]), geometry(), any::<bool>(), seed())
            .prop_map(|(t, (b, s, n, h, rd, four_d, interleaved), offset_ids, seed)| {
                let rows = s + 6;
                let shape = x_shape(b, s, n, h, four_d);
                let mut case = Case::domain_op("com.microsoft", "RotaryEmbedding", 1).input("x", t, &shape);
                case = if offset_ids {
                    case.constant("ids", DType::I64, &[1], Values::Data(vec![3.0]))
                } else {
                    case.input_with("ids", DType::I64, &[b, s], Values::Uniform { lo: 0.0, hi: rows as f64 })
                };
                case.constant("cos", t, &[rows, rd / 2], Values::Uniform { lo: -1.0, hi: 1.0 })
                    .constant("sin", t, &[rows, rd / 2], Values::Uniform { lo: -1.0, hi: 1.0 })
                    .attr_int("interleaved", interleaved as i64)
                    .attr_int("num_heads", n)
                    .attr_int("rotary_embedding_dim", rd)
                    .output("y", t, &shape)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::ROTARY_EMBEDDING, || {
        (dtype_of(&[DType::F32, DType::F16]), geometry(), any::<bool>(), seed())
            .prop_map(|(t, (b, s, n, h, rd, four_d, interleaved), with_ids, seed)| {
                let shape = x_shape(b, s, n, h, four_d);
                let mut case = Case::op("RotaryEmbedding", 23).input("x", t, &shape);
                let rows = s + 6;
                case = if with_ids {
                    case.constant("cos", t, &[rows, rd / 2], Values::Uniform { lo: -1.0, hi: 1.0 })
                        .constant("sin", t, &[rows, rd / 2], Values::Uniform { lo: -1.0, hi: 1.0 })
                        .input_with("ids", DType::I64, &[b, s], Values::Uniform { lo: 0.0, hi: rows as f64 })
                } else {
                    case.input("cos", t, &[b, s, rd / 2]).input("sin", t, &[b, s, rd / 2])
                };
                if !four_d {
                    case = case.attr_int("num_heads", n);
                }
                case.attr_int("interleaved", interleaved as i64)
                    .attr_int("rotary_embedding_dim", rd)
                    .output("y", t, &shape)
                    .with_seed(seed)
            })
            .boxed()
    });
}
