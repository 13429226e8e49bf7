//! ONNX Attention (opsets 23 and 24): 3-D or 4-D Q/K/V, grouped heads (GQA), past K/V
//! concatenated into present K/V, boolean or additive masks (padded to the total length),
//! causal masking aligned to the end of the past, `nonpad_kv_seqlen` (24), `scale`, `softcap`,
//! and the optional scaled-QK output (mode 0; other modes are left to the CPU EP). Hidden keys
//! take the lowest float, as ORT's CPU EP masks them; rows whose keys are all masked give 0, as
//! ORT and the ONNX reference do. Scores are computed in float32 for half types.

use crate::heads;
use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_attention(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 7)?;
    for i in [0, 1, 2, 4, 5] {
        require_input_type(node, i, FLOATS)?;
    }
    require_input_type(node, 3, &[ElemType::Bool, ElemType::F32, ElemType::F16, ElemType::BF16])?;
    require_input_type(node, 6, &[ElemType::I64])?;
    if node.input(4).is_some() != node.input(5).is_some() {
        return Err(Decline::new("past_key and past_value must come together"));
    }
    let rank = ep_core::lowering::input_rank(node, 0);
    if !matches!(rank, Some(3 | 4)) {
        return Err(Decline(format!("Q has rank {rank:?}; 3 or 4 is supported")));
    }
    if rank == Some(3) && (node.attr("q_num_heads").is_none() || node.attr("kv_num_heads").is_none()) {
        return Err(Decline::new("3-D inputs need q_num_heads and kv_num_heads"));
    }
    let mode = node.attr_int("qk_matmul_output_mode", 0)?;
    if node.output(3).is_some() && !(0..=3).contains(&mode) {
        return Err(Decline(format!("qk_matmul_output_mode={mode} is not 0 to 3")));
    }
    Ok(())
}

fn lower_attention(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let q_in = ctx.input(0)?;
    let dtype = q_in.dtype();
    let three_d = q_in.ndim() == 3;
    let f32 = |a: &Array| -> Result<Array> { Ok(ops::astype(a, Dtype::F32, s)?) };
    let (mut q, mut k, mut v) = (f32(q_in)?, f32(ctx.input(1)?)?, f32(ctx.input(2)?)?);
    if three_d {
        let (qh, kvh) = (node.attr_int("q_num_heads", 0)?, node.attr_int("kv_num_heads", 0)?);
        if qh <= 0 || kvh <= 0 {
            bail!("q_num_heads and kv_num_heads must be positive");
        }
        q = heads::split(&q, qh, s)?;
        k = heads::split(&k, kvh, s)?;
        v = heads::split(&v, kvh, s)?;
    }
    for (i, what) in [(4, "past_key"), (5, "past_value")] {
        if let Some(p) = ctx.optional_input(i)
            && p.ndim() != 4
        {
            bail!("{what} {:?} is not 4-D [batch, heads, past, head]", p.shape());
        }
    }
    let past_len = ctx.optional_input(4).map(|p| p.shape()[2]).unwrap_or(0);
    if let (Some(pk), Some(pv)) = (ctx.optional_input(4), ctx.optional_input(5)) {
        k = ops::concatenate(&[f32(pk)?, k], 2, s)?;
        v = ops::concatenate(&[f32(pv)?, v], 2, s)?;
    }
    let (present_k, present_v) = (k.clone(), v.clone());
    let (qs, ks) = (q.shape(), k.shape());
    let (batch, q_heads, q_len, head) = (qs[0], qs[1], qs[2], qs[3]);
    let (kv_heads, total) = (ks[1], ks[2]);
    // As ORT's CPU EP: one batch size, a query with tokens, a mask of rank 2 to 4.
    if ks[0] != batch || v.shape()[0] != batch || q_len < 1 || kv_heads < 1 || q_heads < 1 {
        bail!("query {qs:?}, key {ks:?} and value {:?} need one batch size and a nonempty query with heads", v.shape());
    }
    if let Some(m) = ctx.optional_input(3)
        && !(2..=4).contains(&m.ndim())
    {
        bail!("the mask {:?} must have rank 2, 3 or 4", m.shape());
    }
    let vs = v.shape();
    // (ORT checks both head sizes are positive.)
    if head < 1 || vs[3] < 1 {
        bail!("the query's head size {head} and the value's {} must be positive", vs[3]);
    }
    if vs[1] != kv_heads || vs[2] != total {
        bail!("value {vs:?} must hold the key's {kv_heads} heads of {total} positions (key {ks:?})");
    }
    if q_heads % kv_heads != 0 {
        bail!("{q_heads} query heads are not a multiple of {kv_heads} key/value heads");
    }
    let scale = match node.attr("scale") {
        Some(ep_core::AttrValue::Float(f)) => *f as f64,
        _ => 1.0 / (head as f64).sqrt(),
    };
    let reps = q_heads / kv_heads;
    let (kr, vr) = (heads::repeat(&k, reps, s)?, heads::repeat(&v, reps, s)?);
    let kt = ops::transpose_axes(&kr, &[0, 1, 3, 2], s)?;
    let scores = ops::multiply(&ops::matmul(&q, &kt, s)?, &ops::scalar(scale, Dtype::F32, s)?, s)?;
    // What is added to the scores, as ORT's CPU EP builds it: a float mask as it is (padded
    // with -inf up to the total length), and where a key is hidden (a boolean mask's false,
    // the causal frontier, opset 24's nonpad_kv_seqlen) the lowest float in its place, not
    // -inf: so a query whose only visible score is -inf attends to its hidden keys, and a
    // query whose every key is hidden gives 0.
    let neg_inf = ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?;
    let lowest = ops::scalar(f64::from(f32::MIN), Dtype::F32, s)?;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let mut bias: Option<Array> = None;
    let mut hidden: Option<Array> = None;
    let mut hide = |h: Array| -> Result<()> {
        hidden = Some(match hidden.take() {
            Some(acc) => ops::logical_or(&acc, &h, s)?,
            None => h,
        });
        Ok(())
    };
    if let Some(mask) = ctx.optional_input(3) {
        if !(2..=4).contains(&mask.ndim()) {
            ep_core::bail!("attn_mask has rank {}: it must have 2 to 4 dimensions", mask.ndim());
        }
        // Each mask dim, aligned to [batch, q_heads, q_len, keys] from the right, is 1 or
        // that dim, as ORT's CPU EP requires; the keys' may also be shorter (padded below).
        let target = [batch, q_heads, q_len, total];
        let ms = mask.shape();
        // (ORT requires the mask's query dim to be the query length itself: no broadcast.)
        if ms.len() >= 2 && ms[ms.len() - 2] != q_len {
            ep_core::bail!("attn_mask {ms:?} must have the query length {q_len} as its second-to-last dim");
        }
        let fits = ms
            .iter()
            .rev()
            .zip(target.iter().rev())
            .enumerate()
            .all(|(i, (&d, &t))| d == 1 || d == t || (i == 0 && (1..t).contains(&d)));
        if !fits {
            ep_core::bail!("attn_mask {ms:?} does not broadcast to {target:?} (batch, heads, queries, keys)");
        }
        let last = *ms.last().unwrap_or(&total);
        let pad = |m: &Array, value: &Array| -> Result<Array> {
            if last >= total {
                return Ok(m.clone());
            }
            let lo = vec![0i64; ms.len()];
            let mut hi = vec![0i64; ms.len()];
            hi[ms.len() - 1] = total - last;
            Ok(ops::pad(m, &lo, &hi, value, "constant", s)?)
        };
        if mask.dtype() == Dtype::Bool {
            let shown = ops::scalar(1.0, Dtype::Bool, s)?;
            let hidden_keys = ops::logical_not(&pad(mask, &ops::logical_not(&shown, s)?)?, s)?;
            hide(hidden_keys)?;
        } else {
            bias = Some(pad(&f32(mask)?, &neg_inf)?);
        }
    }
    let nonpad = if ctx.optional_input(6).is_some() { Some(ctx.input(6)?.clone()) } else { None };
    if node.attr_int("is_causal", 0)? == 1 {
        let i = ops::reshape(&ops::arange(0.0, q_len as f64, 1.0, Dtype::I64, s)?, &[q_len, 1], s)?;
        let j = ops::reshape(&ops::arange(0.0, total as f64, 1.0, Dtype::I64, s)?, &[1, total], s)?;
        let allowed = match (&nonpad, past_len) {
            (Some(n), 0) => {
                // Per batch: offset = nonpad[b] - q_len.
                let off = ops::reshape(
                    &ops::subtract(&ops::astype(n, Dtype::I64, s)?, &ops::scalar(q_len as f64, Dtype::I64, s)?, s)?,
                    &[batch, 1, 1, 1],
                    s,
                )?;
                ops::less_equal(&j, &ops::add(&i, &off, s)?, s)?
            }
            _ => ops::less_equal(&j, &ops::add(&i, &ops::scalar(past_len as f64, Dtype::I64, s)?, s)?, s)?,
        };
        hide(ops::logical_not(&allowed, s)?)?;
    }
    if let Some(n) = &nonpad {
        let j = ops::reshape(&ops::arange(0.0, total as f64, 1.0, Dtype::I64, s)?, &[1, 1, 1, total], s)?;
        let n = ops::reshape(&ops::astype(n, Dtype::I64, s)?, &[batch, 1, 1, 1], s)?;
        hide(ops::greater_equal(&j, &n, s)?)?;
    }
    let term = match (&hidden, &bias) {
        (Some(h), b) => Some(ops::where_(h, &lowest, b.as_ref().unwrap_or(&zero), s)?),
        (None, b) => b.clone(),
    };
    // The order ORT and the ONNX reference share: scaled QK, the softcap, then the mask term,
    // then the softmax.
    // The softcap in the inputs' type, as ORT holds it (a float16 cap past 65504 is
    // infinite: every score NaN, as ORT answers).
    let softcap = match dtype {
        Dtype::F16 => f64::from(half::f16::from_f32(node.attr_float("softcap", 0.0)?).to_f32()),
        Dtype::BF16 => f64::from(half::bf16::from_f32(node.attr_float("softcap", 0.0)?).to_f32()),
        _ => node.attr_float("softcap", 0.0)? as f64,
    };
    let capped = if softcap > 0.0 {
        let c = ops::scalar(softcap, Dtype::F32, s)?;
        ops::multiply(&ops::tanh(&ops::divide(&scores, &c, s)?, s)?, &c, s)?
    } else {
        scores.clone()
    };
    let capped_scores = capped.clone();
    let with_term = match &term {
        Some(t) => ops::add(&capped, t, s)?,
        None => capped,
    };
    let mut probs = ops::softmax(&with_term, -1, s)?;
    if let Some(t) = &term {
        // A row whose mask term is nowhere above the lowest float (every key hidden, or a
        // float mask of -inf or the lowest float throughout) attends to nothing: 0, as ORT
        // answers it (checked for both kinds of mask).
        let full = ops::broadcast_to(t, &with_term.shape(), s)?;
        let top = ops::max_axes(&full, &[-1], true, s)?;
        let dead = ops::logical_or(&ops::isneginf(&top, s)?, &ops::equal(&top, &lowest, s)?, s)?;
        probs = ops::where_(&dead, &zero, &probs, s)?;
    }
    let mut y = ops::matmul(&probs, &vr, s)?;
    if three_d {
        y = heads::merge(&y, s)?;
    }
    let cast = |a: &Array| -> Result<Array> { Ok(ops::astype(a, dtype, s)?) };
    let mut outs = vec![cast(&y)?, cast(&present_k)?, cast(&present_v)?];
    if node.outputs.len() > 3 {
        // The QK output as ONNX's function body for Attention takes it (its node tests check
        // it): 0 the scaled scores, 1 after the softcap, 2 after the mask term (a hidden key
        // -inf there), 3 the probabilities. (ORT's CPU EP returns the scaled scores for every
        // mode.)
        let qk = match node.attr_int("qk_matmul_output_mode", 0)? {
            1 => capped_scores,
            2 => match (&hidden, &bias) {
                (Some(h), b) => {
                    let term = ops::where_(h, &neg_inf, b.as_ref().unwrap_or(&zero), s)?;
                    ops::add(&capped_scores, &term, s)?
                }
                (None, Some(b)) => ops::add(&capped_scores, b, s)?,
                (None, None) => capped_scores,
            },
            3 => probs.clone(),
            _ => scores,
        };
        outs.push(cast(&qk)?);
    }
    outs.truncate(node.outputs.len().max(1));
    Ok(outs)
}

ep_core::register_lowering!(
    ATTENTION = FnLowering {
        domain: "",
        op: "Attention",
        opsets: 23..=i32::MAX,
        claim: claim_attention,
        lower: lower_attention,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::ATTENTION, || {
        let dims = (1..=2i64, 1..=2i64, 1..=2i64, 1..=4i64, 0..=3i64, 2..=4i64);
        (float_dtype(), dims, any::<(bool, bool, bool)>(), 0..3u8, 0..4i64, seed())
            .prop_map(|(t, (b, kvh, reps, sq, past, h), (three_d, causal, softcap), mask, mode, seed)| {
                let qh = kvh * reps;
                let skv = sq;
                let total = past + skv;
                let mut case = Case::op("Attention", 23);
                if three_d {
                    case = case
                        .input("q", t, &[b, sq, qh * h])
                        .input("k", t, &[b, skv, kvh * h])
                        .input("v", t, &[b, skv, kvh * h])
                        .attr_int("q_num_heads", qh)
                        .attr_int("kv_num_heads", kvh);
                } else {
                    case = case.input("q", t, &[b, qh, sq, h]).input("k", t, &[b, kvh, skv, h]).input(
                        "v",
                        t,
                        &[b, kvh, skv, h],
                    );
                }
                case = match mask {
                    0 => case.absent(),
                    1 => case.input_with("mask", DType::Bool, &[sq, total], Values::Uniform { lo: 0.0, hi: 2.0 }),
                    _ => case.input("mask", t, &[b, 1, sq, total]),
                };
                if past > 0 {
                    case = case.input("past_k", t, &[b, kvh, past, h]).input("past_v", t, &[b, kvh, past, h]);
                }
                if causal {
                    case = case.attr_int("is_causal", 1);
                }
                if softcap {
                    case = case.attr_float("softcap", 2.0);
                }
                let y_shape: Vec<i64> = if three_d { vec![b, sq, qh * h] } else { vec![b, qh, sq, h] };
                case = case.output("y", t, &y_shape);
                case = case.output("present_k", t, &[b, kvh, total, h]).output("present_v", t, &[b, kvh, total, h]);
                // The QK output in mode 0 (the one whose ORT and ONNX definitions agree).
                let case = if mode == 0 {
                    case.attr_int("qk_matmul_output_mode", 0).output("qk", t, &[b, qh, sq, total])
                } else {
                    case
                };
                case.with_seed(seed)
            })
            .boxed()
    });
}
