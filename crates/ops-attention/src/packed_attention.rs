//! `com.microsoft` Attention (opset 1), the BERT-era self-attention with its projection inside:
//! `input [B, S, D_in] @ weights [D_in, D + D + D_v] + bias`, split into Q, K and V
//! (`qkv_hidden_sizes`, else three equal parts), `num_heads` heads, an optional `past`
//! `[2, B, N, P, H]` concatenated before the new K and V into `present` `[2, B, N, P + S, H]`,
//! and the scores `scale * q k + attention_bias + mask` as ORT's CPU kernel builds them:
//! - `mask_index` (int32): `[B]` key lengths (keys from the length on masked), `[2B]` end then
//!   start positions (keys before the start masked too), `[B, T]` or `[B, S, T]` keeping keys
//!   where the mask is `> 0`; a masked key gets `mask_filter_value` (default -10000) added;
//! - `unidirectional` (with `S > 1`): query `i` sees keys up to `P + i`, the others at the
//!   lowest float.
//!
//! float32, as the CPU EP's kernel. Declined: a 4-D (Megatron) mask, rotary, the shared
//! past/present buffer and `past_sequence_length`, an absent bias (ORT's kernel reads it).
//!
//! `com.microsoft` QAttention is the same with a uint8 input and an int8 or uint8 weight:
//! the projection's integer product scaled by `input_scale * weight_scale` (one value, or one
//! per projected column for the weight's scale and zero point), no attention bias.

use crate::additive::{Causal, Scores, additive_terms, check_bias};
use crate::heads;
use ep_core::lowering::{FnLowering, input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 6)?;
    for i in [0, 1, 2, 4, 5] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    require_input_type(node, 3, &[ElemType::I32])?;
    if node.input(2).is_none() {
        return Err(Decline::new("the bias (input 2) is missing: ORT's CPU kernel reads it"));
    }
    if node.inputs.get(6).is_some_and(Option::is_some) {
        return Err(Decline::new("past_sequence_length (a shared past/present buffer) is not supported"));
    }
    if node.attr_int("do_rotary", 0)? != 0 || node.attr_int("past_present_share_buffer", 0)? != 0 {
        return Err(Decline::new("do_rotary and past_present_share_buffer are not supported"));
    }
    if node.input(4).is_some() && node.input(5).is_some() {
        return Err(Decline::new("past with attention_bias is refused by ORT's kernel"));
    }
    if node.attr_int("num_heads", 0)? < 1 {
        return Err(Decline::new("num_heads must be positive"));
    }
    if input_rank(node, 3).is_some_and(|r| !(1..=3).contains(&r)) {
        return Err(Decline::new("a 4-D mask_index is not supported (nor by ORT's CPU kernel)"));
    }
    if input_rank(node, 0).is_some_and(|r| r != 3) || input_rank(node, 1).is_some_and(|r| r != 2) {
        return Err(Decline::new("input must be [B, S, D] and weights [D, 3D]"));
    }
    Ok(())
}

/// Where keys are kept, broadcastable to the scores `[B, N, S, T]`.
fn keep_keys(mask: &Array, batch: i64, q_len: i64, total: i64, s: &Stream) -> Result<Array> {
    let zero = ops::scalar(0.0, Dtype::I32, s)?;
    let keys = ops::reshape(&ops::arange(0.0, total as f64, 1.0, Dtype::I32, s)?, &[1, 1, 1, total], s)?;
    if batch == 0 {
        // No scores: the mask is not read (ORT's CPU EP does not check it either).
        return Ok(ops::greater_equal(&keys, &zero, s)?);
    }
    let column = |a: &Array| ops::reshape(a, &[batch, 1, 1, 1], s);
    Ok(match mask.shape().as_slice() {
        [n] if *n == batch => ops::less(&keys, &column(mask)?, s)?,
        // (A [3B + 2] mask: its first B entries are the ends, as ORT's CPU kernel reads it.)
        [n] if *n == 3 * batch + 2 => ops::less(&keys, &column(&ops::slice(mask, &[0], &[batch], s)?)?, s)?,
        [n] if *n == 2 * batch => {
            let end = column(&ops::slice(mask, &[0], &[batch], s)?)?;
            let start = column(&ops::slice(mask, &[batch], &[2 * batch], s)?)?;
            let start = ops::minimum(&start, &ops::scalar(total as f64, Dtype::I32, s)?, s)?;
            ops::logical_and(&ops::less(&keys, &end, s)?, &ops::greater_equal(&keys, &start, s)?, s)?
        }
        [b, t] if *b == batch && *t == total => ops::reshape(&ops::greater(mask, &zero, s)?, &[batch, 1, 1, total], s)?,
        [b, q, t] if *b == batch && *q == q_len && *t == total => {
            ops::reshape(&ops::greater(mask, &zero, s)?, &[batch, 1, q_len, total], s)?
        }
        other => bail!(
            "mask_index {other:?} fits none of [{batch}], [{}], [{}], [{batch}, {total}], [{batch}, {q_len}, {total}]",
            2 * batch,
            3 * batch + 2
        ),
    })
}

/// Where the attention inputs after the projection sit: Attention's and QAttention's differ.
struct Inputs {
    mask: usize,
    past: usize,
    bias: Option<usize>,
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() != 3 || ws.len() != 2 || ws[0] != xs[2] {
        bail!("input {xs:?} and weights {ws:?} do not fit [B, S, D] @ [D, 3D]");
    }
    let projected = ops::matmul(x, w, s)?;
    attend(ctx, node, projected, Inputs { mask: 3, past: 4, bias: Some(5) })
}

/// Attention over `projected` (`input @ weights`, `[B, S, D + D + D_v]`) plus the bias (input
/// 2).
fn attend(ctx: &mut LowerCtx<'_>, node: &NodeInfo, projected: Array, at: Inputs) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let bias = ctx.input(2)?;
    let heads = node.attr_int("num_heads", 0)?;
    let xs = projected.shape();
    let (batch, q_len, width) = (xs[0], xs[1], xs[2]);
    // (An empty list counts as none, as ORT's CPU EP reads it.)
    let sizes = match node.attr_ints("qkv_hidden_sizes")?.filter(|v| !v.is_empty()) {
        Some(v) if v.len() == 3 => v.to_vec(),
        Some(v) => bail!("qkv_hidden_sizes {v:?} must hold three sizes"),
        None if width % 3 == 0 => vec![width / 3; 3],
        None => bail!("the projection's {width} columns do not split into three equal parts"),
    };
    let (d, dk, dv) = (sizes[0], sizes[1], sizes[2]);
    if d != dk || d + dk + dv != width || bias.shape() != [width] || d % heads != 0 || dv % heads != 0 || d < 1 {
        bail!(
            "qkv_hidden_sizes {sizes:?}, {width} projected columns, bias {:?} and {heads} heads do not fit",
            bias.shape()
        );
    }
    let qkv = ops::add(&projected, bias, s)?;
    let parts = ops::split_at(&qkv, &[d, 2 * d], 2, s)?;
    let q = heads::split(&parts[0], heads, s)?;
    let (mut k, mut v) = (heads::split(&parts[1], heads, s)?, heads::split(&parts[2], heads, s)?);
    let (head, v_head) = (d / heads, dv / heads);
    let mut past_len = 0;
    if let Some(past) = ctx.optional_input(at.past) {
        let ps = past.shape();
        if ps.len() != 5 || ps[0] != 2 || ps[1] != batch || ps[2] != heads || ps[4] != head || head != v_head {
            bail!("past {ps:?} is not [2, {batch}, {heads}, P, {head}] (with equal Q and V head sizes)");
        }
        past_len = ps[3];
        let half = |i: i64| {
            ops::reshape(
                &ops::slice(past, &[i, 0, 0, 0, 0], &[i + 1, batch, heads, past_len, head], s)?,
                &[batch, heads, past_len, head],
                s,
            )
        };
        let (pk, pv) = (half(0)?, half(1)?);
        k = ops::concatenate(&[pk, k], 2, s)?;
        v = ops::concatenate(&[pv, v], 2, s)?;
    }
    let total = past_len + q_len;
    // The terms added to the scores, in ORT's order: the attention bias, then the mask (the
    // padding mask's filter value, overwritten by the lowest float past the causal frontier).
    let scores_at = Scores { batch, heads, q_len, total, past: past_len };
    let bias: Option<Array> = at.bias.and_then(|i| ctx.optional_input(i)).cloned();
    if let Some(b) = &bias {
        check_bias(b, &scores_at)?;
    }
    // A 2-D mask of one column ([1, 1] or [B, 1]) is ORT's dummy mask: no mask at all.
    let dummy = |m: &Array| m.ndim() == 2 && m.shape()[1] == 1 && (m.shape()[0] == 1 || m.shape()[0] == batch);
    let keep = match ctx.optional_input(at.mask).filter(|m| !dummy(m)).cloned() {
        Some(mask) => {
            if mask.ndim() == 1 {
                // Key lengths (end positions) must not be negative, as ORT's kernel checks.
                let ends = ops::slice(&mask, &[0], &[batch.min(mask.size() as i64)], s)?;
                ctx.check(
                    &ops::greater_equal(&ends, &ops::scalar(0.0, Dtype::I32, s)?, s)?,
                    "a mask_index end position is negative",
                )?;
            }
            Some(keep_keys(&mask, batch, q_len, total, s)?)
        }
        None => None,
    };
    let filter = f64::from(node.attr_float("mask_filter_value", -10000.0)?);
    // (Only 1 is causal, as ORT reads the attribute.)
    let causal = (node.attr_int("unidirectional", 0)? == 1).then_some(Causal { last_row_open: false });
    let terms = additive_terms(bias, keep.as_ref(), filter, causal, &scores_at, s)?;
    let scale = match node.attr_float("scale", 0.0)? {
        x if x != 0.0 => x,
        _ => 1.0 / (head as f32).sqrt(),
    };
    let qk = ops::matmul(&q, &ops::transpose_axes(&k, &[0, 1, 3, 2], s)?, s)?;
    let scores = terms.apply(ops::multiply(&qk, &ops::scalar(f64::from(scale), Dtype::F32, s)?, s)?, s)?;
    let y = heads::merge(&ops::matmul(&ops::softmax(&scores, -1, s)?, &v, s)?, s)?;
    let mut outs = vec![y];
    if node.outputs.get(1).is_some_and(Option::is_some) {
        if head != v_head {
            bail!("present stacks K and V, whose head sizes {head} and {v_head} differ");
        }
        outs.push(ops::stack(&[k, v], 0, s)?);
    }
    Ok(outs)
}

fn claim_quantized(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 5, 9)?;
    for i in 0..5 {
        if node.input(i).is_none() {
            return Err(Decline::new(format!("input {i} is missing")));
        }
    }
    require_input_type(node, 0, &[ElemType::U8])?;
    require_input_type(node, 1, &[ElemType::I8, ElemType::U8])?;
    for i in [2, 3, 4, 8] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    require_input_type(node, 5, &[ElemType::I32])?;
    let same =
        |a: usize, b: usize| node.input(b).is_none_or(|v| v.elem_type == node.input(a).and_then(|v| v.elem_type));
    if !same(0, 6) || !same(1, 7) {
        return Err(Decline::new("a zero point differs in type from its tensor"));
    }
    if node.attr_int("do_rotary", 0)? != 0 || node.attr_int("past_present_share_buffer", 0)? != 0 {
        return Err(Decline::new("do_rotary and past_present_share_buffer are not supported"));
    }
    if node.attr_int("num_heads", 0)? < 1 {
        return Err(Decline::new("num_heads must be positive"));
    }
    if input_rank(node, 5).is_some_and(|r| !(1..=3).contains(&r)) {
        return Err(Decline::new("a 4-D mask_index is not supported"));
    }
    if input_rank(node, 0).is_some_and(|r| r != 3) || input_rank(node, 1).is_some_and(|r| r != 2) {
        return Err(Decline::new("input must be [B, S, D] and weight [D, 3D]"));
    }
    Ok(())
}

/// A quantization parameter of one value, or (`per_column`) one per projected column.
fn parameter(a: &Array, columns: i64, per_column: bool, what: &str, s: &Stream) -> Result<Array> {
    let f = ops::astype(a, Dtype::F32, s)?;
    if a.size() == 1 && a.ndim() <= 1 {
        return Ok(ops::reshape(&f, &[], s)?);
    }
    if per_column && a.shape() == [columns] {
        return Ok(f);
    }
    bail!(
        "{what} of shape {:?} must be one value{}",
        a.shape(),
        if per_column { format!(" or [{columns}]") } else { String::new() }
    );
}

/// QAttention: the projection of the 8-bit input by the 8-bit weight, `(x - x_zp) @ (w - w_zp)`
/// (in float32: exact while K stays within 258 columns of full-range bytes, as close as a
/// float32 product past that), scaled by `input_scale * weight_scale`, then Attention.
fn lower_quantized(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() != 3 || ws.len() != 2 || ws[0] != xs[2] {
        bail!("input {xs:?} and weight {ws:?} do not fit [B, S, D] @ [D, 3D]");
    }
    let columns = ws[1];
    let centred = |a: &Array, zp: Option<usize>, per_column: bool, what: &str| -> Result<Array> {
        let f = ops::astype(a, Dtype::F32, s)?;
        Ok(match zp.and_then(|i| ctx.optional_input(i)) {
            Some(z) => ops::subtract(&f, &parameter(z, columns, per_column, what, s)?, s)?,
            None => f,
        })
    };
    let xc = centred(x, Some(6), false, "input_zero_point")?;
    let wc = centred(w, Some(7), true, "weight_zero_point")?;
    let scale = ops::multiply(
        &parameter(ctx.input(3)?, columns, false, "input_scale", s)?,
        &parameter(ctx.input(4)?, columns, true, "weight_scale", s)?,
        s,
    )?;
    let projected = ops::multiply(&ops::matmul(&xc, &wc, s)?, &scale, s)?;
    attend(ctx, node, projected, Inputs { mask: 5, past: 8, bias: None })
}

ep_core::register_lowering!(
    QATTENTION = FnLowering {
        domain: "com.microsoft",
        op: "QAttention",
        opsets: 1..=i32::MAX,
        claim: claim_quantized,
        lower: lower_quantized,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    ATTENTION = FnLowering {
        domain: "com.microsoft",
        op: "Attention",
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

    register_spec!(super::QATTENTION, || {
        let dims = (1..=2i64, 1..=4i64, prop_oneof![1..=8i64, 250..=300i64], 1..=2i64, 1..=4i64);
        (dims, 0..3u8, any::<(bool, bool, bool, bool)>(), 0..=2i64, seed())
            .prop_map(|((b, sq, din, n, h), mask, (causal, signed, per_column, zps), past, seed)| {
                let d = n * h;
                let total = past + sq;
                let wt = if signed { DType::I8 } else { DType::U8 };
                let weights = if signed {
                    Values::Uniform { lo: -64.0, hi: 64.0 }
                } else {
                    Values::Uniform { lo: 0.0, hi: 256.0 }
                };
                let col = if per_column { vec![3 * d] } else { vec![] };
                let mut case = Case::domain_op("com.microsoft", "QAttention", 1)
                    .input_with("x", DType::U8, &[b, sq, din], Values::Uniform { lo: 0.0, hi: 256.0 })
                    .constant("w", wt, &[din, 3 * d], weights.clone())
                    .constant("bias", DType::F32, &[3 * d], Values::Uniform { lo: -1.0, hi: 1.0 })
                    .constant("x_scale", DType::F32, &[], Values::Uniform { lo: 0.001, hi: 0.01 })
                    .constant("w_scale", DType::F32, &col, Values::Uniform { lo: 0.001, hi: 0.01 });
                let lengths: Vec<f64> = (0..b).map(|i| (1 + (seed as i64 + i) % total) as f64).collect();
                case = match mask {
                    0 => case.absent(),
                    1 => case.input_with("mask", DType::I32, &[b], Values::Data(lengths)),
                    _ => case.input_with(
                        "mask",
                        DType::I32,
                        &[b, total],
                        Values::Data(
                            (0..b * total)
                                .map(|i| if i % total == 0 { 1.0 } else { ((seed >> (i % 50)) & 1) as f64 })
                                .collect(),
                        ),
                    ),
                };
                case = if zps {
                    case.constant("x_zp", DType::U8, &[], Values::Uniform { lo: 0.0, hi: 256.0 })
                        .constant("w_zp", wt, &col, weights)
                } else {
                    case.absent().absent()
                };
                if past > 0 {
                    case =
                        case.input_with("past", DType::F32, &[2, b, n, past, h], Values::Uniform { lo: -1.0, hi: 1.0 });
                }
                case = case.attr_int("num_heads", n).attr_int("unidirectional", causal as i64).output(
                    "y",
                    DType::F32,
                    &[b, sq, d],
                );
                if past > 0 || seed % 2 == 0 {
                    case = case.output("present", DType::F32, &[2, b, n, total, h]);
                }
                case.with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::ATTENTION, || {
        let dims = (1..=2i64, 1..=4i64, 1..=6i64, 1..=2i64, 1..=4i64, 1..=3i64);
        let flags = (0..5u8, any::<(bool, bool, bool, bool)>(), 0..3u8, 0..=3i64);
        (dims, flags, seed())
            .prop_map(|((b, sq, din, n, h, hv), (mask, (causal, attn_bias, unequal, filter), scale, past), seed)| {
                // A past needs equal Q and V head sizes.
                let v_head = if unequal && past == 0 { hv } else { h };
                let (d, dv) = (n * h, n * v_head);
                let total = past + sq;
                let unit = Values::Uniform { lo: -1.0, hi: 1.0 };
                let mut case = Case::domain_op("com.microsoft", "Attention", 1)
                    .input_with("x", DType::F32, &[b, sq, din], unit.clone())
                    .constant("w", DType::F32, &[din, 2 * d + dv], unit.clone())
                    .constant("bias", DType::F32, &[2 * d + dv], unit.clone());
                // Every query keeps at least one key: a row of masked keys only is softmax over
                // scores near -10000, where float32 keeps three decimals and the EPs' different
                // summation orders show.
                let lengths =
                    |salt: i64| -> Vec<f64> { (0..b).map(|i| (1 + (seed as i64 + i + salt) % total) as f64).collect() };
                let flags = |rows: i64| -> Values {
                    Values::Data(
                        (0..rows * total)
                            .map(|i| if i % total == 0 { 1.0 } else { ((seed >> (i % 50)) & 1) as f64 })
                            .collect(),
                    )
                };
                case = match mask {
                    0 => case.absent(),
                    1 => case.input_with("mask", DType::I32, &[b], Values::Data(lengths(0))),
                    2 => {
                        let ends = lengths(0);
                        let first = if causal { 0 } else { seed as i64 % 3 };
                        let starts: Vec<f64> =
                            ends.iter().map(|&e| ((e as i64 - 1).min(first)).max(0) as f64).collect();
                        case.input_with("mask", DType::I32, &[2 * b], Values::Data([ends, starts].concat()))
                    }
                    3 => case.input_with("mask", DType::I32, &[b, total], flags(b)),
                    _ => case.input_with("mask", DType::I32, &[b, sq, total], flags(b * sq)),
                };
                case = if past > 0 {
                    case.input_with("past", DType::F32, &[2, b, n, past, h], unit.clone())
                } else {
                    case.absent()
                };
                if attn_bias && past == 0 {
                    case = case.input_with("attention_bias", DType::F32, &[1, n, sq, total], unit);
                }
                case = case.attr_int("num_heads", n).attr_int("unidirectional", causal as i64);
                if unequal {
                    case = case.attr_ints("qkv_hidden_sizes", &[d, d, dv]);
                }
                if filter {
                    case = case.attr_float("mask_filter_value", -500.0);
                }
                if scale > 0 {
                    case = case.attr_float("scale", 0.25 * scale as f32);
                }
                case = case.output("y", DType::F32, &[b, sq, dv]);
                if v_head == h && (past > 0 || seed % 2 == 0) {
                    case = case.output("present", DType::F32, &[2, b, n, total, h]);
                }
                case.with_seed(seed)
            })
            .boxed()
    });
}
