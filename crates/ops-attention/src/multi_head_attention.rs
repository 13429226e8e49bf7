//! `com.microsoft` MultiHeadAttention (opset 1) as ORT's CPU kernel computes it: query
//! `[B, S, D]`, key `[B, L, D]` and value `[B, L, D_v]` (self or cross attention; `D_v` may
//! differ from `D`), the packed projection bias `[D + D + D_v]` added to Q, K and V,
//! `past_key`/`past_value` `[B, N, P, H]` concatenated before the new K/V into
//! `present_key`/`present_value` `[B, N, P + L, H]`, `key_padding_mask` (int32: `[B]` key
//! lengths, `[B, T]` or `[B, S, T]` with 0 masked and 1 kept), `attention_bias`
//! `[B or 1, N or 1, S, T]`, `scale`, `mask_filter_value` and `unidirectional`.
//!
//! The ORT semantics followed (`attention_cpu_base.h`, `attention_helper.h`):
//! - scores are `scale * q k + attention_bias + mask`, added left to right, softmax over the
//!   `T = P + L` keys;
//!   a masked key gets the finite `mask_filter_value` (default -10000) added, not `-inf`, so a
//!   row whose keys are all masked still attends (almost uniformly) to them;
//! - a `[B]` mask masks keys `j >= mask[b]`; a `[3B + 2]` mask is read the same way from its
//!   first `B` entries (the CPU kernel ignores the rest); 2-D and 3-D masks keep keys where the
//!   mask is `> 0`;
//! - `unidirectional` applies only when `S > 1`: query `i` sees keys `j <= P + i`, except the
//!   last query row, which the CPU kernel leaves unmasked (it matters for cross attention
//!   with `L > S`); causally masked scores are set to the lowest float;
//! - float16 runs as ORT runs it on the CPU EP (which has only a float32 kernel and inserts
//!   casts): everything in float32, the outputs rounded back.
//!
//! Declined: packed QKV or KV (no key/value, 5-D key), key/value in BNSH layout (4-D), the
//! shared-buffer and beam-search inputs (`past_sequence_length`, `cache_indirection`), the
//! `qk` output, a past without both present outputs (ORT's CPU kernel then attends over a
//! mismatched key set; its results even differ from session to session), and any type but
//! float32 and float16.

use crate::additive::{Causal, Scores, additive_terms, check_bias};
use crate::heads;
use ep_core::lowering::{FnLowering, input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const TYPES: &[ElemType] = &[ElemType::F32, ElemType::F16];

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 10)?;
    for i in [0, 1, 2, 3, 5, 6, 7] {
        require_input_type(node, i, TYPES)?;
    }
    require_input_type(node, 4, &[ElemType::I32])?;
    let t = node.input(0).and_then(|v| v.elem_type);
    for i in [1, 2, 3, 5, 6, 7] {
        if let Some(v) = node.input(i)
            && v.elem_type != t
        {
            return Err(Decline(format!("input {i} is {:?} and query {t:?}", v.elem_type)));
        }
    }
    if node.attr_int("num_heads", 0)? <= 0 {
        return Err(Decline::new("num_heads must be positive"));
    }
    match input_rank(node, 0) {
        Some(3) => {}
        Some(5) => return Err(Decline::new("packed QKV (query of rank 5) is not supported")),
        r => return Err(Decline(format!("query has rank {r:?}; 3 is supported"))),
    }
    if node.input(1).is_none() || node.input(2).is_none() {
        return Err(Decline::new("packed QKV or KV (key or value absent) is not supported"));
    }
    for (i, what) in [(1, "key"), (2, "value")] {
        match input_rank(node, i) {
            Some(3) => {}
            Some(4) => return Err(Decline(format!("{what} in BNSH layout (rank 4) is not supported"))),
            Some(5) => return Err(Decline(format!("packed KV ({what} of rank 5) is not supported"))),
            r => return Err(Decline(format!("{what} has rank {r:?}; 3 is supported"))),
        }
    }
    for (i, what) in [(8, "past_sequence_length (shared KV buffer)"), (9, "cache_indirection (beam search)")] {
        if node.input(i).is_some() {
            return Err(Decline(format!("{what} is not supported")));
        }
    }
    if node.output(3).is_some() {
        return Err(Decline::new("the qk output is not supported"));
    }
    let past = node.input(6).is_some();
    if past != node.input(7).is_some() {
        return Err(Decline::new("past_key and past_value must come together"));
    }
    if past && (node.output(1).is_none() || node.output(2).is_none()) {
        // Without both present outputs ORT's CPU kernel drops the past from part of the
        // computation and attends over mismatched keys (not even reproducibly): left to it.
        return Err(Decline::new("a past without both present_key and present_value outputs is left to the CPU EP"));
    }
    if let Some(r) = input_rank(node, 4)
        && !(1..=3).contains(&r)
    {
        return Err(Decline(format!("key_padding_mask has rank {r}; 1, 2 or 3 is supported")));
    }
    if let Some(r) = input_rank(node, 5)
        && r != 4
    {
        return Err(Decline(format!("attention_bias has rank {r}; 4 is expected")));
    }
    Ok(())
}

/// The key padding mask as a keep flag broadcastable to the scores `[B, N, S, T]`.
fn keep_keys(mask: &Array, batch: i64, q_len: i64, total: i64, s: &Stream) -> Result<Array> {
    let ms = mask.shape();
    let mask = ops::astype(mask, Dtype::I32, s)?;
    let zero = ops::scalar(0.0, Dtype::I32, s)?;
    Ok(match ms.as_slice() {
        // Key lengths; ORT's CPU kernel reads a (3B + 2) mask's first B entries the same way.
        [n] if *n == batch || *n == 3 * batch + 2 => {
            let lengths = if *n == batch { mask } else { ops::slice(&mask, &[0], &[batch], s)? };
            let lengths = ops::reshape(&lengths, &[batch, 1, 1, 1], s)?;
            let keys = ops::reshape(&ops::arange(0.0, total as f64, 1.0, Dtype::I32, s)?, &[1, 1, 1, total], s)?;
            ops::less(&keys, &lengths, s)?
        }
        [b, t] if *b == batch && *t == total => {
            ops::reshape(&ops::greater(&mask, &zero, s)?, &[batch, 1, 1, total], s)?
        }
        [b, q, t] if *b == batch && *q == q_len && *t == total => {
            ops::reshape(&ops::greater(&mask, &zero, s)?, &[batch, 1, q_len, total], s)?
        }
        other => {
            bail!("key_padding_mask {other:?} fits none of [{batch}], [{batch}, {total}], [{batch}, {q_len}, {total}]")
        }
    })
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let query = ctx.input(0)?;
    let dtype = query.dtype();
    let heads = node.attr_int("num_heads", 0)?;
    let f32 = |a: &Array| -> Result<Array> { Ok(ops::astype(a, Dtype::F32, s)?) };
    let (mut q, mut k, mut v) = (f32(query)?, f32(ctx.input(1)?)?, f32(ctx.input(2)?)?);
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if qs.len() != 3 || ks.len() != 3 || vs.len() != 3 {
        bail!("query {qs:?}, key {ks:?} and value {vs:?} must all be 3-D");
    }
    let (batch, q_len, hidden, kv_len, v_hidden) = (qs[0], qs[1], qs[2], ks[1], vs[2]);
    if ks[0] != batch || vs[0] != batch || ks[2] != hidden || vs[1] != kv_len {
        bail!("query {qs:?}, key {ks:?} and value {vs:?} do not fit together");
    }
    if let Some(bias) = ctx.optional_input(3) {
        let b = f32(bias)?;
        if b.shape() != [2 * hidden + v_hidden] {
            bail!("bias {:?} is not [{}]", b.shape(), 2 * hidden + v_hidden);
        }
        let parts = ops::split_at(&b, &[hidden, 2 * hidden], 0, s)?;
        q = ops::add(&q, &parts[0], s)?;
        k = ops::add(&k, &parts[1], s)?;
        v = ops::add(&v, &parts[2], s)?;
    }
    let q = heads::split(&q, heads, s)?;
    let (mut k, mut v) = (heads::split(&k, heads, s)?, heads::split(&v, heads, s)?);
    let (head, v_head) = (hidden / heads, v_hidden / heads);
    let mut past_len = 0;
    if let (Some(pk), Some(pv)) = (ctx.optional_input(6), ctx.optional_input(7)) {
        let (ks, vs) = (pk.shape(), pv.shape());
        if ks.len() != 4
            || vs.len() != 4
            || ks[..3] != vs[..3]
            || ks[..2] != [batch, heads]
            || ks[3] != head
            || vs[3] != v_head
        {
            bail!(
                "past_key {ks:?} and past_value {vs:?} must be [{batch}, {heads}, past, {head}] and [{batch}, {heads}, past, {v_head}]"
            );
        }
        past_len = pk.shape()[2];
        k = ops::concatenate(&[f32(pk)?, k], 2, s)?;
        v = ops::concatenate(&[f32(pv)?, v], 2, s)?;
    }
    let total = past_len + kv_len;

    // The terms ORT adds: the attention bias, then the padding mask (mask_filter_value where
    // a key is masked) overwritten by the causal frontier at the lowest float (the CPU kernel
    // leaves the last query row unmasked).
    let scores_at = Scores { batch, heads, q_len, total, past: past_len };
    let bias = ctx.optional_input(5).map(f32).transpose()?;
    if let Some(b) = &bias {
        check_bias(b, &scores_at)?;
    }
    let keep = ctx.optional_input(4).map(|mask| keep_keys(mask, batch, q_len, total, s)).transpose()?;
    let filter = node.attr_float("mask_filter_value", -10000.0)? as f64;
    let causal = (node.attr_int("unidirectional", 0)? == 1).then_some(Causal { last_row_open: true });
    let terms = additive_terms(bias, keep.as_ref(), filter, causal, &scores_at, s)?;

    let scale = match node.attr_float("scale", 0.0)? {
        x if x != 0.0 => x,
        _ => 1.0 / (head as f32).sqrt(),
    };
    // MLX's fused attention where it adds all there is in one term; else the terms one by one.
    let y = match terms.single() {
        Some(add) if head == v_head => ops::scaled_dot_product_attention(&q, &k, &v, scale, add, false, s)?,
        _ => {
            let qk = ops::matmul(&q, &ops::transpose_axes(&k, &[0, 1, 3, 2], s)?, s)?;
            let scores = terms.apply(ops::multiply(&qk, &ops::scalar(scale as f64, Dtype::F32, s)?, s)?, s)?;
            ops::matmul(&ops::softmax(&scores, -1, s)?, &v, s)?
        }
    };
    let y = heads::merge(&y, s)?;
    let cast = |a: &Array| -> Result<Array> { Ok(ops::astype(a, dtype, s)?) };
    let mut outs = vec![cast(&y)?, cast(&k)?, cast(&v)?];
    outs.truncate(node.outputs.len().clamp(1, 3));
    Ok(outs)
}

ep_core::register_lowering!(
    MULTI_HEAD_ATTENTION = FnLowering {
        domain: "com.microsoft",
        op: "MultiHeadAttention",
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

    /// A deterministic stream of values in `0..n` from the case's seed.
    fn draws(seed: u64, salt: u64, len: usize, n: u64) -> Vec<u64> {
        (0..len as u64)
            .map(|i| {
                let mut x = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                x ^= x >> 31;
                x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
                x ^= x >> 29;
                x % n
            })
            .collect()
    }

    register_spec!(super::MULTI_HEAD_ATTENTION, || {
        let dims = (1..=2i64, 1..=3i64, 1..=8i64, 1..=4i64, 1..=5i64, 1..=8i64);
        let flags = (0..3u8, any::<(bool, bool, bool)>(), 0..4u8, 0..3u8, 0..4u8, 0..3u8);
        (dtype_of(&[DType::F32, DType::F16]), dims, flags, seed())
            .prop_map(
                |(t, (b, n, h, sq, lk, hv), (form, (bias, causal, presents), mask, filter, attn_bias, scale), seed)| {
                    // form 0: self attention; 1: cross attention (its own length and value head
                    // size); 2: self attention after a past of min(lk, 4) rows.
                    let (kv_len, v_head, past) = match form {
                        0 => (sq, h, 0),
                        1 => (lk, hv, 0),
                        _ => (sq, h, lk.min(4)),
                    };
                    let total = past + kv_len;
                    let (d, dv) = (n * h, n * v_head);
                    let mut case = Case::domain_op("com.microsoft", "MultiHeadAttention", 1)
                        .input("query", t, &[b, sq, d])
                        .input("key", t, &[b, kv_len, d])
                        .input("value", t, &[b, kv_len, dv]);
                    case = if bias { case.input("bias", t, &[2 * d + dv]) } else { case.absent() };
                    // A large mask_filter_value (the default -10000, or -1e9) leaves a row whose keys
                    // are all masked at the mercy of float rounding (ORT adds the filter to scores of
                    // order 1): such cases keep key 0 of every row. A small one (-3) masks freely.
                    let soft = filter == 1;
                    let lo = if soft { 0 } else { 1 };
                    case = match mask {
                        0 => case.absent(),
                        1 => {
                            let lengths = draws(seed, 1, b as usize, (total + 2 - lo) as u64);
                            let data = lengths.iter().map(|&x| (x as i64 + lo) as f64).collect();
                            case.input_with("key_padding_mask", DType::I32, &[b], Values::Data(data))
                        }
                        _ => {
                            let shape: Vec<i64> = if mask == 2 { vec![b, total] } else { vec![b, sq, total] };
                            let len = shape.iter().product::<i64>() as usize;
                            let data = draws(seed, 2, len, 4)
                                .iter()
                                .enumerate()
                                .map(|(i, &x)| if !soft && i as i64 % total == 0 { 1.0 } else { x as f64 - 1.0 })
                                .collect();
                            case.input_with("key_padding_mask", DType::I32, &shape, Values::Data(data))
                        }
                    };
                    case = match attn_bias {
                        0 => case.absent(),
                        1 => case.input_with(
                            "attention_bias",
                            t,
                            &[b, n, sq, total],
                            Values::Uniform { lo: -3.0, hi: 3.0 },
                        ),
                        2 => case.input_with(
                            "attention_bias",
                            t,
                            &[1, 1, sq, total],
                            Values::Uniform { lo: -3.0, hi: 3.0 },
                        ),
                        _ => case.input_with(
                            "attention_bias",
                            t,
                            &[1, n, sq, total],
                            Values::Uniform { lo: -3.0, hi: 3.0 },
                        ),
                    };
                    if past > 0 {
                        case = case.input("past_key", t, &[b, n, past, h]).input("past_value", t, &[b, n, past, h]);
                    }
                    case = case.attr_int("num_heads", n);
                    if causal {
                        case = case.attr_int("unidirectional", 1);
                    }
                    match filter {
                        1 => case = case.attr_float("mask_filter_value", -3.0),
                        2 => case = case.attr_float("mask_filter_value", -1e9),
                        _ => {}
                    }
                    match scale {
                        1 => case = case.attr_float("scale", 0.3),
                        2 => case = case.attr_float("scale", 1.7),
                        _ => {}
                    }
                    case = case.output("output", t, &[b, sq, dv]);
                    if past > 0 || presents {
                        case = case.output("present_key", t, &[b, n, total, h]).output(
                            "present_value",
                            t,
                            &[b, n, total, v_head],
                        );
                    }
                    case.with_seed(seed)
                },
            )
            .boxed()
    });
}
