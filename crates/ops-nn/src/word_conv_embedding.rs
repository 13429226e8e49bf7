//! `com.microsoft` WordConvEmbedding: per word (a row of char ids), the char embeddings `C`,
//! a 1-D convolution of window `fw` with the filters `W` (`[F, ?, fw, E]`, read as its first
//! `F * fw * E` values) plus `B`, tanh, and the maximum over the word's windows (from
//! -1e12). A word's length counts its positive ids (0 when the first is not positive); its
//! first `max(length, fw)` chars are looked up, id 0 included, the rest are zeros, as ORT's
//! kernel does. Every window position is computed and the ones past the word masked, so the
//! graph does not depend on the ids. A word of length 0 has no window: 0 (ORT's kernel leaves
//! that row of its fresh output buffer unwritten). A char id outside the table fails the run.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 4, 4)?;
    require_input_type(node, 0, &[ElemType::I32])?;
    for i in 1..4 {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    for (i, r) in [(0, 2), (1, 4), (2, 1), (3, 2)] {
        if ep_core::lowering::input_rank(node, i).is_some_and(|got| got != r) {
            return Err(Decline(format!("input {i} must have rank {r}")));
        }
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (ids, w, b, c) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.input(2)?.clone(), ctx.input(3)?.clone());
    let ([words, len], [f, _, fw, e], [v, ce]) = (
        <[i64; 2]>::try_from(ids.shape()).map_err(|_| "Sequence must be [words, chars]")?,
        <[i64; 4]>::try_from(w.shape()).map_err(|_| "W must be 4-D")?,
        <[i64; 2]>::try_from(c.shape()).map_err(|_| "C must be 2-D")?,
    );
    for (name, want) in [("embedding_size", f), ("conv_window_size", fw), ("char_embedding_size", ce)] {
        let given = node.attr_int(name, -1)?;
        if given != -1 && given != want {
            bail!("attribute {name} {given} differs from the inputs' {want}");
        }
    }
    if ce != e {
        bail!("C's embedding size {ce} differs from W's {e}");
    }
    if b.shape() != [f] {
        bail!("B of shape {:?} must hold {f} values", b.shape());
    }
    if fw < 1 || len < fw {
        bail!("a word of {len} chars is shorter than the window {fw}");
    }
    if words == 0 || f == 0 {
        return Ok(vec![ops::full(&[words, f], &ops::scalar(0.0, Dtype::F32, s)?, Dtype::F32, s)?]);
    }
    let int = |x: f64| ops::scalar(x, Dtype::I32, s);
    // Lengths [words, 1]: positive ids, 0 unless the first is positive.
    let positive = ops::greater(&ids, &int(0.0)?, s)?;
    let count = ops::sum_axes(&ops::astype(&positive, Dtype::I32, s)?, &[1], true, s)?;
    let first = ops::slice(&positive, &[0, 0], &[words, 1], s)?;
    let length = ops::where_(&first, &count, &int(0.0)?, s)?;
    let looked_up = ops::maximum(&length, &int(fw as f64)?, s)?;
    let at = ops::reshape(&ops::arange(0.0, len as f64, 1.0, Dtype::I32, s)?, &[1, len], s)?;
    let used = ops::logical_and(&ops::less(&at, &looked_up, s)?, &ops::greater(&length, &int(0.0)?, s)?, s)?;
    // Ids looked up must lie in the table.
    let inside = ops::logical_and(&ops::greater_equal(&ids, &int(0.0)?, s)?, &ops::less(&ids, &int(v as f64)?, s)?, s)?;
    ctx.check(&ops::logical_or(&ops::logical_not(&used, s)?, &inside, s)?, format!("a char id outside [0, {v})"))?;
    let safe = ops::where_(&ops::logical_and(&used, &inside, s)?, &ids, &int(0.0)?, s)?;
    let emb = ops::take(&c, &safe, 0, s)?; // [words, len, E]
    let emb = ops::where_(&ops::expand_dims(&used, 2, s)?, &emb, &ops::scalar(0.0, Dtype::F32, s)?, s)?;
    // Windows [words, U, fw * E].
    let u = len - fw + 1;
    let taps: Vec<i32> = (0..u).flat_map(|p| (0..fw).map(move |j| (p + j) as i32)).collect();
    let windows = ops::take(&emb, &Array::from_slice(&taps, &[u, fw])?, 1, s)?;
    let windows = ops::reshape(&windows, &[words, u, fw * e], s)?;
    let filters = ops::reshape(&ops::slice(&ops::reshape(&w, &[-1], s)?, &[0], &[f * fw * e], s)?, &[f, fw * e], s)?;
    let conv = ops::matmul(&windows, &ops::transpose_axes(&filters, &[1, 0], s)?, s)?;
    let act = ops::tanh(&ops::add(&conv, &b, s)?, s)?; // [words, U, F]
    // Windows that start within the looked-up chars: u <= max(length, fw) - fw.
    let starts = ops::reshape(&ops::arange(0.0, u as f64, 1.0, Dtype::I32, s)?, &[1, u], s)?;
    let valid = ops::logical_and(
        &ops::less_equal(&starts, &ops::subtract(&looked_up, &int(fw as f64)?, s)?, s)?,
        &ops::greater(&length, &int(0.0)?, s)?,
        s,
    )?;
    let floor = ops::scalar(-1e12, Dtype::F32, s)?;
    let masked = ops::where_(&ops::expand_dims(&valid, 2, s)?, &act, &floor, s)?;
    let y = ops::maximum(&ops::max_axes(&masked, &[1], false, s)?, &floor, s)?;
    // A word without chars: 0 (what ORT's kernel leaves in a fresh buffer).
    let empty = ops::less_equal(&length, &int(0.0)?, s)?;
    Ok(vec![ops::where_(&empty, &ops::scalar(0.0, Dtype::F32, s)?, &y, s)?])
}

ep_core::register_lowering!(
    WORD_CONV_EMBEDDING = FnLowering {
        domain: "com.microsoft",
        op: "WordConvEmbedding",
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

    register_spec!(super::WORD_CONV_EMBEDDING, || {
        (1..=4i64, 1..=3i64, 0..=4i64, 1..=4i64, 1..=4i64, 2..=9i64, any::<bool>(), seed())
            .prop_map(|(words, fw, extra, f, e, v, attrs, seed)| {
                let len = fw + extra;
                // Every word starts with a positive id (ORT leaves an empty word's row unwritten);
                // zeros and later positive ids mixed in after it.
                let ids: Vec<f64> = (0..words * len)
                    .map(|i| {
                        let r = (seed >> (i % 40)) as i64 + i;
                        if i % len == 0 { (1 + r % (v - 1)) as f64 } else { (r % v) as f64 }
                    })
                    .collect();
                let unit = Values::Uniform { lo: -1.0, hi: 1.0 };
                let case = Case::domain_op("com.microsoft", "WordConvEmbedding", 1)
                    .input_with("sequence", DType::I32, &[words, len], Values::Data(ids))
                    .constant("w", DType::F32, &[f, 1, fw, e], unit.clone())
                    .constant("b", DType::F32, &[f], unit.clone())
                    .constant("c", DType::F32, &[v, e], unit);
                let case = if attrs {
                    case.attr_int("embedding_size", f)
                        .attr_int("conv_window_size", fw)
                        .attr_int("char_embedding_size", e)
                } else {
                    case
                };
                case.output("y", DType::F32, &[words, f]).with_seed(seed)
            })
            .boxed()
    });
}
