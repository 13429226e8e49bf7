//! `com.microsoft` DecoderMaskedMultiHeadAttention: one decoding step's attention, as ORT's
//! transformer optimizer writes it for Whisper- and T5-style beam search, computed as ORT's
//! CPU kernel computes it (float32; its only kernel there).
//!
//! Self attention: query, key and value `[B, 1, N * H]` (the projection `bias`, `[3 * N * H]`,
//! added), `past_key`/`past_value` one buffer `[B, N, M, H]` each (`past_present_share_buffer`
//! = 1) of which the first `P = past_sequence_length` rows are filled: the new key and value
//! go to row `P` of `present_key`/`present_value` (the other rows are past's), and the query
//! attends to rows `0..=P`. With `cache_indirection` (`[batch, beams, M]`, beam search) row
//! `j < P` is read from the past of beam `cache_indirection[b, j]` of the entry's batch
//! (the present is not reordered). Cross attention: key and value `[B, N, L, H]` as they are
//! (no past, no present). Scores are `scale * q.k + attention_bias`, a key that
//! `mask_index` (`[B, T]`) masks gets `mask_filter_value` (default -10000) added, not
//! `-inf`: kept where the mask is `> 0`, or `!= 0` under `cache_indirection`, as ORT's two
//! paths read it. The `qk` output (`output_qk` = 1) holds the scores before the softmax.
//!
//! Where ORT's CPU kernel departs, the EP reads the op's definition: under beam search that
//! kernel reads a per-entry attention bias (`[B, ..]`) at row `b / beams`, the EP at row `b`;
//! a `past_sequence_length` of 0 that kernel reads as the whole buffer (and reads past it),
//! the EP as an empty past.
//!
//! Declined, as ORT's CPU kernel refuses them: types other than float32, a query of more than
//! one token or packed QKV, `past_present_share_buffer` = 0 with a past, a mask of any shape
//! but `[B, T]`, an attention bias in cross attention, a past without both present outputs.

use crate::heads;
use ep_core::lowering::{FnLowering, input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 11)?;
    for i in [0, 1, 2, 4, 5, 6, 10] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    for i in [3, 7, 8, 9] {
        require_input_type(node, i, &[ElemType::I32])?;
    }
    if node.attr_int("num_heads", 0)? <= 0 {
        return Err(Decline::new("num_heads must be positive"));
    }
    if input_rank(node, 0) != Some(3) {
        return Err(Decline::new("the query must be [B, 1, D]"));
    }
    if let Some(Some(s)) = node.input(0).and_then(|v| v.shape.as_ref()).map(|s| s[1])
        && s != 1
    {
        return Err(Decline(format!("a query of {s} tokens; DecoderMaskedMultiHeadAttention takes one")));
    }
    if node.input(3).is_some() && input_rank(node, 3) != Some(2) {
        return Err(Decline::new("mask_index must be [B, T]"));
    }
    if node.attr_int("output_qk", 0)? == 0 && node.output(3).is_some() {
        return Err(Decline::new("the qk output is asked for but output_qk is 0"));
    }
    let past = node.input(5).is_some() || node.input(6).is_some();
    let present = node.output(1).is_some() || node.output(2).is_some();
    if past || present {
        // Self attention over the shared buffer.
        if !(node.input(5).is_some() && node.input(6).is_some() && node.output(1).is_some() && node.output(2).is_some())
        {
            return Err(Decline::new("past_key, past_value and both present outputs come together"));
        }
        if node.attr_int("past_present_share_buffer", 0)? != 1 {
            return Err(Decline::new("a past without past_present_share_buffer=1 (ORT's CPU kernel refuses it)"));
        }
        if node.input(7).is_none() {
            return Err(Decline::new("past_sequence_length is missing"));
        }
        for i in [1, 2] {
            if input_rank(node, i) != Some(3) {
                return Err(Decline(format!("input {i} must be [B, 1, D] in self attention")));
            }
        }
        if node.input(9).is_some() && input_rank(node, 9) != Some(3) {
            return Err(Decline::new("cache_indirection must be [batch, beams, M]"));
        }
    } else {
        for i in [1, 2] {
            if input_rank(node, i) != Some(4) {
                return Err(Decline(format!("input {i} must be [B, N, L, H] in cross attention")));
            }
        }
        if node.input(4).is_some() {
            return Err(Decline::new("an attention bias in cross attention (ORT's CPU kernel refuses it)"));
        }
    }
    Ok(())
}

fn f32(a: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::astype(a, Dtype::F32, s)?)
}

/// `[B, 1, N * H]` as `[B, N, 1, H]`, with its part of the projection bias added.
fn with_bias(x: &Array, bias: Option<&Array>, part: i64, heads: i64, s: &Stream) -> Result<Array> {
    let sh = x.shape();
    let d = sh[2];
    let x = match bias {
        Some(b) => ops::add(x, &ops::slice(b, &[part * d], &[(part + 1) * d], s)?, s)?,
        None => x.clone(),
    };
    heads::split(&x, heads, s)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let heads = node.attr_int("num_heads", 0)?;
    let q = ctx.input(0)?.clone();
    let qs = q.shape();
    let (b, d) = (qs[0], qs[2]);
    if qs[1] != 1 || d % heads != 0 {
        bail!("the query {qs:?} is not one token of {heads} heads");
    }
    let h = d / heads;
    let bias = ctx.optional_input(10).cloned();
    if let Some(bb) = &bias
        && bb.shape() != [3 * d]
    {
        bail!("the bias {:?} is not [{}]", bb.shape(), 3 * d);
    }
    let scale = match node.attr_float("scale", 0.0)? {
        x if x != 0.0 => x,
        _ => 1.0 / (h as f32).sqrt(),
    };
    let filter = node.attr_float("mask_filter_value", -10000.0)? as f64;
    let q = with_bias(&q, bias.as_ref(), 0, heads, s)?;
    let self_attention = ctx.optional_input(5).is_some();
    let beams = ctx.optional_input(9).cloned();
    // The keys and values attended to, [B, N, T or M, H]; which of them count (`None`: all);
    // the present outputs.
    let (keys, values, counted, mut outputs) = if self_attention {
        let (pk, pv) = (ctx.input(5)?.clone(), ctx.input(6)?.clone());
        let m = pk.shape()[2];
        if pk.shape() != [b, heads, m, h] || pv.shape() != pk.shape() {
            bail!("past_key {:?} and past_value {:?} are not [{b}, {heads}, M, {h}]", pk.shape(), pv.shape());
        }
        let k = with_bias(ctx.input(1)?, bias.as_ref(), 1, heads, s)?;
        let v = with_bias(ctx.input(2)?, bias.as_ref(), 2, heads, s)?;
        for (x, what) in [(&k, "key"), (&v, "value")] {
            if x.shape() != [b, heads, 1, h] {
                bail!("the {what} does not match the query's {b} x {heads} heads of {h}");
            }
        }
        let psl = ctx.input(7)?;
        if psl.size() != 1 || psl.ndim() > 1 {
            bail!("past_sequence_length {:?} must be a scalar or a vector of one element", psl.shape());
        }
        let p = ops::reshape(&ops::astype(psl, Dtype::I32, s)?, &[], s)?;
        ctx.check_range(&p, 0, m - 1, format!("past_sequence_length is outside [0, {m}) (the buffer holds {m} rows)"))?;
        let rows = ops::reshape(&ops::arange(0.0, m as f64, 1.0, Dtype::I32, s)?, &[1, 1, m, 1], s)?;
        let at = ops::equal(&rows, &p, s)?;
        let present_k = ops::where_(&at, &k, &pk, s)?;
        let present_v = ops::where_(&at, &v, &pv, s)?;
        // Beam search: row j < P from the past of the beam the indirection names.
        let (read_k, read_v) = match &beams {
            Some(ci) => {
                let cs = ci.shape();
                if cs.len() != 3 || cs[0] * cs[1] != b || cs[2] != m {
                    bail!("cache_indirection {cs:?} is not [batch, beams, {m}] for {b} entries");
                }
                let w = cs[1];
                // (Only the entries of the filled rows are read, and checked.)
                let read = ops::less(&ops::reshape(&rows, &[1, 1, m], s)?, &p, s)?;
                let used = ops::where_(&read, &ops::astype(ci, Dtype::I32, s)?, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
                ctx.check_range(&used, 0, w - 1, format!("a cache_indirection entry is outside [0, {w})"))?;
                if let Some(bw) = ctx.optional_input(8) {
                    let bw = bw.clone();
                    ctx.check_range(&bw, w, w, format!("beam_width differs from cache_indirection's {w} beams"))?;
                }
                let first: Vec<i32> = (0..b).map(|e| ((e / w) * w) as i32).collect();
                let first = Array::from_slice(&first, &[b, 1, 1, 1])?;
                // (Clipped, so that a run the check above fails reads nothing out of bounds.)
                let ci = ops::clip(
                    &ops::astype(ci, Dtype::I32, s)?,
                    Some(&ops::scalar(0.0, Dtype::I32, s)?),
                    Some(&ops::scalar((w - 1) as f64, Dtype::I32, s)?),
                    s,
                )?;
                let index = ops::add(&ops::reshape(&ci, &[b, 1, m, 1], s)?, &first, s)?;
                let index = ops::broadcast_to(&index, &[b, heads, m, h], s)?;
                let gather = |past: &Array, new: &Array| -> Result<Array> {
                    Ok(ops::where_(&at, new, &ops::take_along_axis(past, &index, 0, s)?, s)?)
                };
                (gather(&pk, &k)?, gather(&pv, &v)?)
            }
            None => {
                if let Some(bw) = ctx.optional_input(8) {
                    let bw = bw.clone();
                    ctx.check_range(&bw, i32::MIN as i64, 1, "a beam_width over 1 needs cache_indirection")?;
                }
                (present_k.clone(), present_v.clone())
            }
        };
        // The mask and the attention bias cover exactly the P + 1 keys.
        for (i, what) in [(3, "mask_index"), (4, "attention_bias")] {
            if let Some(a) = ctx.optional_input(i) {
                let t = *a.shape().last().unwrap_or(&0);
                let p = p.clone();
                ctx.check_range(&p, t - 1, t - 1, format!("{what} covers {t} keys; past_sequence_length + 1 differ"))?;
            }
        }
        let counted = ops::less_equal(&ops::reshape(&rows, &[1, 1, 1, m], s)?, &p, s)?;
        // Rows past P take no part (not even a NaN there, times a probability of 0).
        let zero = ops::scalar(0.0, Dtype::F32, s)?;
        let kept = ops::less_equal(&rows, &p, s)?;
        let read_v = ops::where_(&kept, &f32(&read_v, s)?, &zero, s)?;
        (read_k, read_v, Some(counted), vec![present_k, present_v])
    } else {
        let (k, v) = (ctx.input(1)?.clone(), ctx.input(2)?.clone());
        let l = k.shape()[2];
        if k.shape() != [b, heads, l, h] || v.shape() != k.shape() {
            bail!("key {:?} and value {:?} are not [{b}, {heads}, L, {h}]", k.shape(), v.shape());
        }
        for (i, what) in [(3, "mask_index"), (4, "attention_bias")] {
            if let Some(a) = ctx.optional_input(i)
                && a.shape().last() != Some(&l)
            {
                bail!("{what} {:?} does not cover the {l} keys", a.shape());
            }
        }
        (k, v, None, Vec::new())
    };
    let width = keys.shape()[2];
    let mut scores =
        ops::scale(&ops::matmul(&f32(&q, s)?, &ops::transpose_axes(&f32(&keys, s)?, &[0, 1, 3, 2], s)?, s)?, scale, s)?;
    // The attention bias and the mask cover the T = P + 1 keys (L in cross attention); a
    // buffer's further rows are not counted. (Not `additive::additive_term`: ORT's kernel here
    // adds the bias to the scores before the mask, which a row whose every key is masked shows
    // at -10000's resolution.)
    let padded = |a: &Array, what: &str| -> Result<Array> {
        let sh = a.shape();
        let t = sh[sh.len() - 1];
        if t > width {
            bail!("{what} {sh:?} covers {t} keys; there are at most {width}");
        }
        if t == width {
            return Ok(a.clone());
        }
        let mut high = vec![0; sh.len()];
        high[sh.len() - 1] = width - t;
        let zero = ops::scalar(0.0, a.dtype(), s)?;
        Ok(ops::pad(a, &vec![0; sh.len()], &high, &zero, "constant", s)?)
    };
    if let Some(ab) = ctx.optional_input(4) {
        let sh = ab.shape();
        if sh.len() != 4 || !matches!(sh[0], 1) && sh[0] != b || !matches!(sh[1], 1) && sh[1] != heads || sh[2] != 1 {
            bail!("attention_bias {sh:?} is not [{b} or 1, {heads} or 1, 1, T]");
        }
        scores = ops::add(&scores, &padded(&f32(ab, s)?, "attention_bias")?, s)?;
    }
    if let Some(mask) = ctx.optional_input(3) {
        if mask.ndim() != 2 || mask.shape()[0] != b {
            bail!("mask_index {:?} is not [{b}, T]", mask.shape());
        }
        let zero = ops::scalar(0.0, Dtype::I32, s)?;
        let mask = ops::astype(mask, Dtype::I32, s)?;
        // (ORT's beam-search path reads `!= 0`, its other paths `> 0`.)
        let kept = if beams.is_some() && self_attention {
            ops::not_equal(&mask, &zero, s)?
        } else {
            ops::greater(&mask, &zero, s)?
        };
        let term = ops::where_(&kept, &ops::scalar(0.0, Dtype::F32, s)?, &ops::scalar(filter, Dtype::F32, s)?, s)?;
        let t = term.shape()[1];
        scores = ops::add(&scores, &padded(&ops::reshape(&term, &[b, 1, 1, t], s)?, "mask_index")?, s)?;
    }
    let qk = scores.clone();
    let scores = match &counted {
        Some(c) => ops::where_(c, &scores, &ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?, s)?,
        None => scores,
    };
    let probs = ops::softmax(&scores, -1, s)?;
    let y = ops::matmul(&probs, &f32(&values, s)?, s)?;
    let y = heads::merge(&y, s)?;
    outputs.insert(0, y.clone());
    if node.output(3).is_some() {
        // (Cross attention has no present outputs: their absent slots still take a place.)
        while outputs.len() < 3 {
            outputs.push(y.clone());
        }
        // Over the T counted keys: T = P + 1, read on the host (a run whose length is data
        // runs eagerly).
        let t = match counted {
            Some(_) => {
                let p = ctx.host_i64(7).map_err(|e| Error::new(format!("past_sequence_length: {e}")))?;
                p.first().copied().ok_or_else(|| Error::new("past_sequence_length is empty"))? + 1
            }
            None => width,
        };
        outputs.push(ops::slice(&qk, &[0, 0, 0, 0], &[b, heads, 1, t], s)?);
    }
    Ok(outputs)
}

ep_core::register_lowering!(
    DECODER_MASKED_MULTI_HEAD_ATTENTION = FnLowering {
        domain: "com.microsoft",
        op: "DecoderMaskedMultiHeadAttention",
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

    register_spec!(super::DECODER_MASKED_MULTI_HEAD_ATTENTION, || {
        let dims = (1..=2i64, 1..=3i64, prop_oneof![Just(8i64), Just(16)], 2..=6i64);
        let flags = (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), 0..3u8);
        (dims, flags, any::<bool>(), seed())
            .prop_map(|((batch, heads, h, m), (mask, bias, attention_bias, qk, beam), cross, seed)| {
                let d = heads * h;
                let f = DType::F32;
                // Beam search (self attention): two or three beams per batch entry.
                let beams = if cross || beam == 0 { 1 } else { 1 + beam as i64 };
                let b = batch * beams;
                // The filled rows: 1..M-1 (ORT's CPU kernel reads a past of 0 as the whole
                // buffer, past its end).
                let p = 1 + (seed % (m as u64 - 1)) as i64;
                let (t, l) = if cross { (m, m) } else { (p + 1, 0) };
                let mut case = Case::domain_op("com.microsoft", "DecoderMaskedMultiHeadAttention", 1).input(
                    "query",
                    f,
                    &[b, 1, d],
                );
                case = if cross {
                    case.input("key", f, &[b, heads, l, h]).input("value", f, &[b, heads, l, h])
                } else {
                    case.input("key", f, &[b, 1, d]).input("value", f, &[b, 1, d])
                };
                let bits = Values::Uniform { lo: 0.0, hi: 2.0 };
                case = if mask { case.input_with("mask_index", DType::I32, &[b, t], bits) } else { case.absent() };
                // (Under beam search ORT's CPU kernel reads a per-entry bias at row b / beams,
                // not b: one row for all there.)
                case = if attention_bias && !cross {
                    let rows = if seed.is_multiple_of(2) && beams == 1 { b } else { 1 };
                    case.input("attention_bias", f, &[rows, heads, 1, t])
                } else {
                    case.absent()
                };
                if !cross {
                    case = case
                        .input("past_key", f, &[b, heads, m, h])
                        .input("past_value", f, &[b, heads, m, h])
                        .input_with("past_sequence_length", DType::I32, &[1], Values::Data(vec![p as f64]));
                    case = if beams > 1 {
                        case.input_with("beam_width", DType::I32, &[1], Values::Data(vec![beams as f64])).input_with(
                            "cache_indirection",
                            DType::I32,
                            &[batch, beams, m],
                            Values::Uniform { lo: 0.0, hi: beams as f64 },
                        )
                    } else {
                        case.absent().absent()
                    };
                    case = case.attr_int("past_present_share_buffer", 1);
                } else if bias {
                    case = case.absent().absent().absent().absent().absent();
                }
                if bias {
                    case = case.input("bias", f, &[3 * d]);
                }
                case = case.attr_int("num_heads", heads).output("output", f, &[b, 1, d]);
                if !cross {
                    case =
                        case.output("present_key", f, &[b, heads, m, h]).output("present_value", f, &[b, heads, m, h]);
                } else if qk {
                    // (The absent present outputs keep their places.)
                    let node = case.nodes.last_mut().expect("a node");
                    node.outputs.extend([String::new(), String::new()]);
                }
                if qk {
                    case = case.attr_int("output_qk", 1).output("qk", f, &[b, heads, 1, t]);
                }
                case.with_seed(seed)
            })
            .boxed()
    });
}
