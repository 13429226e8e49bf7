//! `com.microsoft` MRotaryEmbedding: the multimodal rotary embedding of Qwen's vision-language
//! decoders (Qwen2-VL on). Each token has three positions (temporal, height, width:
//! `position_ids` `[3, B, S]`), each indexing the same cos/sin caches; column `i` of the
//! angles comes from the stream `mrope_section` assigns it (layout 0: three contiguous runs
//! of the sections' lengths; layout 1: temporal everywhere, height and width in every third
//! column from columns 1 and 2, for their sections' lengths), scaled by `scale` and rounded to
//! the input's type, then the rotation of RotaryEmbedding (3-D or 4-D input, partial rotary
//! dim, interleaved or half-split pairs).

use crate::{rotary, rotary_embedding};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// The streams (0 temporal, 1 height, 2 width) of the `half` angle columns, as ORT assigns
/// them.
fn assignment(sections: [i64; 3], interleaved: bool, half: usize) -> Vec<u8> {
    let mut by = vec![0u8; half];
    if interleaved {
        for (stream, &len) in sections.iter().enumerate().skip(1) {
            let end = (len * 3).min(half as i64).max(0) as usize;
            for col in (stream..end).step_by(3) {
                by[col] = stream as u8;
            }
        }
    } else {
        let mut col = 0usize;
        for (stream, &len) in sections.iter().enumerate() {
            for _ in 0..len {
                if col < half {
                    by[col] = stream as u8;
                    col += 1;
                }
            }
        }
    }
    by
}

/// `mrope_section` (three non-negative lengths) and `mrope_layout` (0 or 1), as ORT's kernel
/// requires them.
fn sections(node: &NodeInfo) -> std::result::Result<([i64; 3], bool), String> {
    let s = node.attr_ints("mrope_section")?.ok_or("the mrope_section attribute is required")?;
    let [a, b, c] = s[..] else { return Err(format!("mrope_section {s:?} must have 3 values")) };
    if [a, b, c].iter().any(|&v| !(0..=i32::MAX as i64).contains(&v)) {
        return Err(format!("mrope_section {s:?} must be non-negative"));
    }
    match node.attr_int("mrope_layout", 0)? {
        0 => Ok(([a, b, c], false)),
        1 => Ok(([a, b, c], true)),
        l => Err(format!("mrope_layout {l} is not 0 (sectioned) or 1 (interleaved)")),
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 4, 4)?;
    for i in [0, 2, 3] {
        require_input_type(node, i, &[ElemType::F32, ElemType::F16])?;
    }
    require_input_type(node, 1, &[ElemType::I64])?;
    if node.attr_int("is_packed_batching", 0)? != 0 {
        return Err(Decline::new("is_packed_batching is not supported"));
    }
    let (dim, heads) = (node.attr_int("rotary_embedding_dim", 0)?, node.attr_int("num_heads", 0)?);
    let big = |v: i64| !(0..=i32::MAX as i64).contains(&v);
    if big(dim) || big(heads) || (dim > 0 && heads == 0) {
        return Err(Decline(format!("rotary_embedding_dim {dim} with num_heads {heads}")));
    }
    sections(node).map(|_| ()).map_err(Decline)
}

/// The checks of ORT's kernel that read shapes: the input 3-D `[B, S, heads * H]` (with
/// `num_heads`) or 4-D `[B, heads, S, H]`, ids `[3, B, S]`, caches alike `[rows, dim / 2]`
/// with `S` rows or more, `dim` (the head, or `rotary_embedding_dim`) positive and within the
/// head, the sections summing to `dim / 2`; and an even `dim` (ORT leaves an odd one's last
/// feature unwritten: refused here). The rotary dim's half.
fn check(node: &NodeInfo, x: &[i64], ids: &[i64], cos: &[i64], sin: &[i64], sections: [i64; 3]) -> Result<i64> {
    let heads = node.attr_int("num_heads", 0)?;
    let (batch, seq, head) = match *x {
        [b, _, s, h] => (b, s, h),
        [b, s, hidden] if heads > 0 && hidden % heads == 0 => (b, s, hidden / heads),
        [_, _, hidden] => bail!("a 3-D input's hidden size {hidden} needs num_heads dividing it (num_heads {heads})"),
        _ => bail!("the input {x:?} must have rank 3 or 4"),
    };
    if ids.len() != 3 || ids[0] != 3 || ids[1] != batch || ids[2] != seq {
        bail!("position_ids {ids:?} must be [3, batch, sequence] = [3, {batch}, {seq}]");
    }
    if cos.len() != 2 || cos != sin {
        bail!("cos_cache {cos:?} and sin_cache {sin:?} must be alike and 2-D");
    }
    let dim = match node.attr_int("rotary_embedding_dim", 0)? {
        d if d > 0 => d,
        _ => head,
    };
    let empty = x.iter().product::<i64>() == 0;
    if dim > head || (!empty && (dim <= 0 || dim % 2 != 0)) {
        bail!("the rotary dimension {dim} must be positive, even (pairs of features) and at most the head size {head}");
    }
    if cos[1] != dim / 2 {
        bail!("the caches' width {} is not half the rotary dimension {dim}", cos[1]);
    }
    if sections.iter().sum::<i64>() != dim / 2 {
        bail!("mrope_section {sections:?} must sum to half the rotary dimension ({})", dim / 2);
    }
    if seq > cos[0] {
        bail!("the sequence ({seq}) is longer than the caches ({} rows)", cos[0]);
    }
    Ok(dim / 2)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (x, ids) = (ctx.input(0)?.clone(), ctx.input(1)?.clone());
    let (cos_cache, sin_cache) = (ctx.input(2)?.clone(), ctx.input(3)?.clone());
    let (secs, interleaved) = sections(node).map_err(ep_core::Error::new)?;
    let half = check(node, &x.shape(), &ids.shape(), &cos_cache.shape(), &sin_cache.shape(), secs)?;
    if x.size() == 0 {
        return Ok(vec![x]);
    }
    // Each stream's angles, [B, 1, S, half] float32, then each column from its stream.
    let is = ids.shape();
    let mut per_stream = Vec::with_capacity(3);
    for k in 0..3 {
        let positions = ops::reshape(&ops::slice(&ids, &[k, 0, 0], &[k + 1, is[1], is[2]], s)?, &is[1..], s)?;
        per_stream.push(rotary::angles(ctx, &cos_cache, &sin_cache, &positions, s)?);
    }
    let by = assignment(secs, interleaved, half as usize);
    let pick = |which: fn(&(Array, Array)) -> &Array| -> Result<Array> {
        let mut out = which(&per_stream[0]).clone();
        for (k, st) in per_stream.iter().enumerate().skip(1) {
            let mask: Vec<bool> = by.iter().map(|&b| b as usize == k).collect();
            if mask.iter().any(|&m| m) {
                out = ops::where_(&Array::from_slice(&mask, &[half])?, which(st), &out, s)?;
            }
        }
        // ORT scales each angle's cos/sin and rounds it to the input's type.
        let scale = node.attr_float("scale", 1.0)? as f64;
        if scale != 1.0 {
            // (Through the input's type and back: nothing for float32.)
            let scaled = ops::multiply(&out, &ops::scalar(scale, Dtype::F32, s)?, s)?;
            out = ops::astype(&ops::astype(&scaled, x.dtype(), s)?, Dtype::F32, s)?;
        }
        Ok(out)
    };
    let (cos, sin) = (pick(|p| &p.0)?, pick(|p| &p.1)?);
    Ok(vec![rotary_embedding::apply(ctx, node, &x, &cos, &sin, s)?])
}

ep_core::register_lowering!(
    MROTARY_EMBEDDING = FnLowering {
        domain: "com.microsoft",
        op: "MRotaryEmbedding",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(test)]
mod tests {
    use super::assignment;

    #[test]
    fn columns_go_to_the_streams_ort_assigns() {
        // Qwen2-VL's sections (16, 24, 24) shrunk: contiguous runs.
        assert_eq!(assignment([2, 3, 3], false, 8), [0, 0, 1, 1, 1, 2, 2, 2]);
        // Interleaved: height at 1, 4, ..., width at 2, 5, ..., each for its section's length.
        assert_eq!(assignment([4, 2, 2], true, 8), [0, 1, 2, 0, 1, 2, 0, 0]);
        // One full-width section is plain RoPE.
        assert_eq!(assignment([4, 0, 0], false, 4), [0, 0, 0, 0]);
    }
}

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::MROTARY_EMBEDDING, || {
        (
            dtype_of(&[DType::F32, DType::F16]),
            (1..=2i64, 1..=4i64, 1..=3i64),
            (any::<bool>(), any::<bool>(), any::<bool>()),
            (0..=3i64, 0..=3i64, any::<bool>()),
            seed(),
        )
            .prop_map(|(t, (b, s, n), (four_d, partial, interleaved), (h_sec, w_sec, layout), seed)| {
                // Sections (t, h, w) first, the head from them.
                let half = 1 + h_sec + w_sec + 2;
                let rd = 2 * half;
                let head = if partial { rd + 4 } else { rd };
                let shape = if four_d { vec![b, n, s, head] } else { vec![b, s, n * head] };
                let rows = s + 5;
                let mut case = Case::domain_op("com.microsoft", "MRotaryEmbedding", 1)
                    .input("x", t, &shape)
                    .input_with("ids", DType::I64, &[3, b, s], Values::Uniform { lo: 0.0, hi: rows as f64 })
                    .constant("cos", t, &[rows, half], Values::Uniform { lo: -1.0, hi: 1.0 })
                    .constant("sin", t, &[rows, half], Values::Uniform { lo: -1.0, hi: 1.0 })
                    .attr_ints("mrope_section", &[half - h_sec - w_sec, h_sec, w_sec])
                    .attr_int("mrope_layout", layout as i64)
                    .attr_int("interleaved", interleaved as i64)
                    .attr_int("num_heads", n);
                if partial {
                    case = case.attr_int("rotary_embedding_dim", rd);
                }
                if seed % 3 == 0 {
                    case = case.attr_float("scale", 0.5);
                }
                case.output("y", t, &shape).with_seed(seed)
            })
            .boxed()
    });
}
