//! `com.microsoft` EmbedLayerNormalization (what ORT's BERT optimizer makes of a model's
//! embeddings): per token, the word embedding of `input_ids` plus the position embedding (of
//! `position_ids`, or the token's position) plus the segment embedding of `segment_ids`, layer
//! normalized with `gamma` and `beta` (`epsilon` 1e-12 by default; the crate's layer-norm standardization); `mask_index` counts each
//! row's mask entries equal to 1, and `embedding_sum` is the sum before the normalization, as
//! ORT's CPU EP computes them. An id outside its table fails the run.

use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 9)?;
    // (segment_ids and segment_embedding, inputs 1 and 4, are optional among required ones.)
    for (i, name) in [(2, "word_embedding"), (3, "position_embedding"), (5, "gamma"), (6, "beta")] {
        if node.input(i).is_none() {
            return Err(Decline(format!("{name} (input {i}) is missing")));
        }
    }
    for i in [0, 1, 7, 8] {
        require_input_type(node, i, &[ElemType::I32])?;
    }
    for i in [2, 3, 4, 5, 6] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    require_input_rank(node, 0, 2..=2)?;
    if node.input(1).is_some() != node.input(4).is_some() {
        return Err(Decline::new("segment_ids and segment_embedding come together"));
    }
    let eps = node.attr_float("epsilon", 1e-12)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(Decline(format!("epsilon {eps} is not a non-negative number (ORT's CPU EP refuses it)")));
    }
    Ok(())
}

/// Rows `ids` (int32, any shape) of `table` (`[V, H]`); an id outside `[0, V)` fails the run.
fn embed(ctx: &mut LowerCtx<'_>, table: &Array, ids: &Array, what: &str, s: &Stream) -> Result<Array> {
    let ts = table.shape();
    if ts.len() != 2 {
        bail!("the {what} embedding {ts:?} is not a 2-D table");
    }
    let v = ts[0];
    if v == 0 {
        bail!("the {what} embedding has no rows");
    }
    let ids = ops::astype(ids, Dtype::I32, s)?;
    let zero = ops::scalar(0.0, Dtype::I32, s)?;
    let top = ops::scalar((v - 1) as f64, Dtype::I32, s)?;
    let inside = ops::logical_and(&ops::greater_equal(&ids, &zero, s)?, &ops::less_equal(&ids, &top, s)?, s)?;
    ctx.check(&inside, format!("a {what} id is outside [0, {v})"))?;
    let s = ctx.stream();
    let safe = ops::clip(&ids, Some(&zero), Some(&top), s)?;
    Ok(ops::take(table, &safe, 0, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let ids = ctx.input(0)?.clone();
    let (b, seq) = (ids.shape()[0], ids.shape()[1]);
    let word = ctx.input(2)?.clone();
    let h = *word.shape().last().unwrap_or(&0);
    let mut x = embed(ctx, &word, &ids, "word", s)?;
    let positions = match ctx.optional_input(8).cloned() {
        Some(p) => {
            let ps = p.shape();
            if ps.len() != 2 || ps[1] != seq || (ps[0] != 1 && ps[0] != b) {
                bail!("position_ids {ps:?} must be [{b}, {seq}] or [1, {seq}]");
            }
            p
        }
        None => ops::reshape(&ops::arange(0.0, seq as f64, 1.0, Dtype::I32, s)?, &[1, seq], s)?,
    };
    let position = ctx.input(3)?.clone();
    x = ops::add(&x, &embed(ctx, &position, &positions, "position", s)?, s)?;
    if let (Some(seg), Some(table)) = (ctx.optional_input(1).cloned(), ctx.optional_input(4).cloned()) {
        if seg.shape() != ids.shape() {
            bail!("segment_ids {:?} differ in shape from input_ids {:?}", seg.shape(), ids.shape());
        }
        x = ops::add(&x, &embed(ctx, &table, &seg, "segment", s)?, s)?;
    }
    let s = ctx.stream();
    let (gamma, beta) = (ctx.input(5)?, ctx.input(6)?);
    for (name, p) in [("gamma", gamma), ("beta", beta)] {
        if p.shape() != [h] {
            bail!("{name} {:?} must hold the {h} hidden values", p.shape());
        }
    }
    let eps = node.attr_float("epsilon", 1e-12)? as f64;
    let (normed, ..) = crate::norm::standardize(&x, &[-1], eps, s)?;
    let y = ops::add(&ops::multiply(&normed, gamma, s)?, beta, s)?;
    let mask_index = match ctx.optional_input(7) {
        Some(m) => {
            if m.shape() != ids.shape() {
                bail!("mask {:?} differs in shape from input_ids {:?}", m.shape(), ids.shape());
            }
            let ones = ops::equal(m, &ops::scalar(1.0, Dtype::I32, s)?, s)?;
            ops::astype(&ops::sum_axes(&ops::astype(&ones, Dtype::I32, s)?, &[1], false, s)?, Dtype::I32, s)?
        }
        None => ops::full(&[b], &ops::scalar(0.0, Dtype::I32, s)?, Dtype::I32, s)?,
    };
    let mut outputs = vec![y, mask_index, x];
    outputs.truncate(node.outputs.len().clamp(1, 3));
    Ok(outputs)
}

ep_core::register_lowering!(
    EMBED_LAYER_NORMALIZATION = FnLowering {
        domain: "com.microsoft",
        op: "EmbedLayerNormalization",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::EMBED_LAYER_NORMALIZATION, || {
        ((1..=2i64, 1..=5i64, 1..=8i64, 2..=9i64), any::<(bool, bool, bool, bool)>(), seed())
            .prop_map(|((b, seq, h, vocab), (segments, mask, positions, outputs), seed)| {
                let ids = Values::Uniform { lo: 0.0, hi: vocab as f64 };
                let mut case = Case::domain_op("com.microsoft", "EmbedLayerNormalization", 1).input_with(
                    "input_ids",
                    DType::I32,
                    &[b, seq],
                    ids,
                );
                case = if segments {
                    case.input_with("segment_ids", DType::I32, &[b, seq], Values::Uniform { lo: 0.0, hi: 2.0 })
                } else {
                    case.absent()
                };
                case = case.input("word_embedding", DType::F32, &[vocab, h]).input(
                    "position_embedding",
                    DType::F32,
                    &[seq + 2, h],
                );
                case = if segments { case.input("segment_embedding", DType::F32, &[2, h]) } else { case.absent() };
                case = case.input_with("gamma", DType::F32, &[h], Values::Uniform { lo: 0.5, hi: 1.5 }).input(
                    "beta",
                    DType::F32,
                    &[h],
                );
                if mask || positions {
                    case = if mask {
                        case.input_with("mask", DType::I32, &[b, seq], Values::Uniform { lo: 0.0, hi: 2.0 })
                    } else {
                        case.absent()
                    };
                }
                if positions {
                    let p = Values::Uniform { lo: 0.0, hi: (seq + 2) as f64 };
                    case = case.input_with("position_ids", DType::I32, &[1, seq], p);
                }
                // (mask_index always: ORT's type inference writes it whether the node has it or not.)
                case = case.attr_float("epsilon", 1e-5).output("output", DType::F32, &[b, seq, h]).output(
                    "mask_index",
                    DType::I32,
                    &[b],
                );
                if outputs {
                    case = case.output("embedding_sum", DType::F32, &[b, seq, h]);
                }
                // (ORT's shape inference needs the embeddings' dims known.)
                case.symbolic(false).with_seed(seed)
            })
            .boxed()
    });
}
