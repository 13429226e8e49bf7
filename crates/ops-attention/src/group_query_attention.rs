//! `com.microsoft` GroupQueryAttention, the attention of onnxruntime-genai's decoders: packed
//! or separate Q/K/V `[B, S, heads * H]`, grouped key/value heads, rotary inside the op
//! (`do_rotary` with the model's cos/sin caches, interleaved or not, partial), a KV cache
//! `[B, kv_heads, P, H]` (8- or 4-bit codes, see `kv_quant.rs`: `[.., H / 2]` uint8 for 4
//! bits) that grows (present has `total_sequence_length` rows) or is one
//! max-length buffer shared by past and present, right padding per batch entry (`seqlens_k`),
//! causal or not, `local_window_size`, `softcap`, `attention_bias`, `smooth_softmax` and
//! `head_sink`.
//!
//! The ORT semantics followed: batch entry `b` holds `T_b = seqlens_k[b] + 1` tokens; on the
//! first prompt (`S == total_sequence_length`) its new tokens start at 0, afterwards at
//! `past_b = T_b - S`. The new K/V rows (K after rotary) go to present rows
//! `[past_b, past_b + S)`, past rows `[0, past_b)` are kept and every other row is zero.
//! Query `s` sees keys `[lo, hi)` with `hi = min(past_b + s + 1, T_b)` (causal) or `T_b`,
//! and `lo = hi - local_window_size` when the window is smaller. Scores are
//! `softcap(scale * q k) + bias`, computed in float32 for half types.
//!
//! Every position is computed on the device from `seqlens_k` (no host read); only
//! `total_sequence_length` (the present length) is read on the host, which in genai's graphs
//! is a shape and so costs nothing.

use crate::heads::{int, iota};
use crate::{heads, key_mask, rotary};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

const TYPES: &[ElemType] = &[ElemType::F32, ElemType::F16, ElemType::BF16];

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 16)?;
    if node.input(5).is_none() || node.input(6).is_none() {
        return Err(Decline::new("seqlens_k and total_sequence_length are required"));
    }
    for i in [0, 1, 2, 7, 8, 10, 11] {
        require_input_type(node, i, TYPES)?;
    }
    let t = node.input(0).and_then(|v| v.elem_type);
    for i in [1, 2] {
        if let Some(v) = node.input(i)
            && v.elem_type != t
        {
            return Err(Decline(format!("input {i} is {:?} and query {t:?}", v.elem_type)));
        }
    }
    // The caches: the query's type, or 8- or 4-bit with a scale (`kv_quant.rs`).
    if crate::kv_quant::claim(node, "k", (12, 3, 1), t)? != crate::kv_quant::claim(node, "v", (13, 4, 2), t)? {
        return Err(Decline::new("one of the K and V caches is quantized, the other not"));
    }
    require_input_type(node, 5, &[ElemType::I32])?;
    require_input_type(node, 6, &[ElemType::I32])?;
    require_input_type(node, 9, &[ElemType::I64])?;
    for (i, what) in [(14, "q_norm_weight"), (15, "k_norm_weight")] {
        if node.input(i).is_some() {
            return Err(Decline(format!("{what} is not supported")));
        }
    }
    if node.input(1).is_some() != node.input(2).is_some() || node.input(3).is_some() != node.input(4).is_some() {
        return Err(Decline::new("key/value and past_key/past_value must come in pairs"));
    }
    match (node.attr_int("qk_output", 0)?, node.output(3).is_some()) {
        (0, false) | (1 | 2, _) => {}
        (0, true) => return Err(Decline::new("output_qk is asked for but qk_output is 0")),
        (other, _) => return Err(Decline(format!("qk_output={other} is not 0, 1 (scores) or 2 (probabilities)"))),
    }
    if node.attr_int("sliding_window_cache", 0)? != 0 {
        return Err(Decline::new("sliding_window_cache is not supported"));
    }
    let (heads, kv_heads) = (node.attr_int("num_heads", 0)?, node.attr_int("kv_num_heads", 0)?);
    // (Heads that do not divide are refused when the node runs: declined, kv_num_heads above
    // num_heads would reach ORT's CPU kernel, which divides by their zero ratio.)
    if heads <= 0 || kv_heads <= 0 {
        return Err(Decline(format!("num_heads={heads} and kv_num_heads={kv_heads} must be positive")));
    }
    // ORT reads the window as a 32-bit int (2^40 becomes 0): left to it past that range.
    let window = node.attr_int("local_window_size", -1)?;
    if i32::try_from(window).is_err() {
        return Err(Decline(format!("local_window_size={window} is outside 32 bits")));
    }
    if node.attr_int("do_rotary", 0)? == 1 && (node.input(7).is_none() || node.input(8).is_none()) {
        return Err(Decline::new("do_rotary needs cos_cache and sin_cache"));
    }
    if ep_core::lowering::input_rank(node, 0) != Some(3) {
        return Err(Decline::new("query must be 3-D [batch, sequence, hidden]"));
    }
    Ok(())
}

struct Geometry {
    batch: i64,
    seq: i64,
    kv_heads: i64,
    head: i64,
}

/// Present K or V: past rows below `past_b` kept, `new` (`[B, kv_heads, S, H]`) at rows
/// `[past_b, past_b + S)`, zeros elsewhere; `len` rows.
fn present(past: Option<&Array>, new: &Array, past_b: &Array, len: i64, g: &Geometry, s: &Stream) -> Result<Array> {
    // (A row's width: the head, or half of it for a 4-bit cache's packed codes.)
    let width = new.shape()[3];
    let rows = iota(len, 2, s)?;
    let zero = ops::scalar(0.0, new.dtype(), s)?;
    let base = match past {
        Some(p) => {
            let p_len = p.shape()[2];
            let p = if p_len < len {
                ops::pad(p, &[0, 0, 0, 0], &[0, 0, len - p_len, 0], &zero, "constant", s)?
            } else {
                p.clone()
            };
            ops::where_(&ops::less(&rows, past_b, s)?, &p, &zero, s)?
        }
        None => ops::full(&[g.batch, g.kv_heads, len, width], &zero, new.dtype(), s)?,
    };
    // Row r takes new[r - past_b] where that is in [0, S).
    let offset = ops::subtract(&rows, past_b, s)?;
    let inside =
        ops::logical_and(&ops::greater_equal(&offset, &int(0, s)?, s)?, &ops::less(&offset, &int(g.seq, s)?, s)?, s)?;
    let index = ops::clip(&offset, Some(&int(0, s)?), Some(&int(g.seq - 1, s)?), s)?;
    let index = ops::broadcast_to(&index, &[g.batch, g.kv_heads, len, width], s)?;
    let gathered = ops::take_along_axis(new, &index, 2, s)?;
    Ok(ops::where_(&inside, &gathered, &base, s)?)
}

/// [`present`] for one batch entry with a past: the rows below `past_b` kept (`keep`, `[1, 1,
/// len, 1]`), the `S` new rows written from `past_b` clamped to the buffer (a position held as
/// data, so a replayed graph serves every step; an entry past the buffer fails the run
/// through the seqlens check): `written` (`[1, 1, len, 1]`) is true at the rows they go to
/// and `source` (`[len]` int32) names the new row each row would take. One new row is one
/// fused select; several are a gather of the new rows and a select (no dynamic slice update:
/// on CUDA that is an offset kernel of its own for NVRTC to compile on a first run).
fn present_one(past: &Array, new: &Array, at: &[Array], len: i64, s: &Stream) -> Result<Array> {
    let (keep, written) = (&at[0], &at[1]);
    let p_len = past.shape()[2];
    let zero = ops::scalar(0.0, new.dtype(), s)?;
    let p = if p_len < len {
        ops::pad(past, &[0, 0, 0, 0], &[0, 0, len - p_len, 0], &zero, "constant", s)?
    } else {
        past.clone()
    };
    let kept = ops::where_(keep, &p, &zero, s)?;
    if new.shape()[2] == 1 {
        return Ok(ops::where_(written, new, &kept, s)?);
    }
    Ok(ops::where_(written, &ops::take(new, &at[2], 2, s)?, &kept, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let query = ctx.input(0)?;
    let dtype = query.dtype();
    let qs = query.shape();
    let (heads, kv_heads) = (node.attr_int("num_heads", 0)?, node.attr_int("kv_num_heads", 0)?);
    if kv_heads < 1 || heads % kv_heads != 0 {
        bail!("num_heads={heads} must be a positive multiple of kv_num_heads={kv_heads}");
    }
    let packed = ctx.optional_input(1).is_none();
    let width = if packed { heads + 2 * kv_heads } else { heads };
    if qs.len() != 3 || qs[2] % width != 0 {
        bail!("query {qs:?} does not split into {width} heads");
    }
    let g = Geometry { batch: qs[0], seq: qs[1], kv_heads, head: qs[2] / width };
    if g.seq == 0 {
        bail!("the query has no tokens");
    }
    // As ORT's CPU EP: key and value hold kv_num_heads heads of the query's head size.
    for i in [1, 2] {
        if let Some(kv) = ctx.optional_input(i)
            && (kv.ndim() != 3 || kv.shape()[2] != kv_heads * g.head || kv.shape()[..2] != qs[..2])
        {
            bail!("input {i} {:?} does not hold {kv_heads} heads of {} for the query {qs:?}", kv.shape(), g.head);
        }
    }
    let f32 = |a: &Array| -> Result<Array> { Ok(ops::astype(a, Dtype::F32, s)?) };
    let shapeless = ctx.shapeless();
    let part = |a: &Array, start: i64, len: i64| heads::part(a, start, len, 1, shapeless, s);
    // [B, n, S, H]: one token's [B, 1, n * H] already lies that way.
    let to_heads = |a: &Array, n: i64| -> Result<Array> {
        if g.seq == 1 { Ok(ops::reshape(a, &[g.batch, n, 1, g.head], s)?) } else { heads::split(a, n, s) }
    };
    // Packed: every head in one array (cut into query, key and value heads once rotary is
    // done); apart: the three inputs' heads.
    let all = if packed { Some(to_heads(query, width)?) } else { None };
    let apart = match &all {
        Some(_) => None,
        None => Some([to_heads(query, heads)?, to_heads(ctx.input(1)?, kv_heads)?, to_heads(ctx.input(2)?, kv_heads)?]),
    };

    let past_k = ctx.optional_input(3).cloned();
    let past_v = ctx.optional_input(4).cloned();
    for (past, what) in [(&past_k, "past_key"), (&past_v, "past_value")] {
        if let Some(p) = past
            && p.ndim() != 4
        {
            bail!("{what} {:?} is not 4-D [batch, kv_num_heads, rows, head]", p.shape());
        }
    }
    let past_len = past_k.as_ref().map_or(0, |p| p.shape()[2]);
    let total = match ctx.host_i64(6) {
        Ok(v) => *v.first().ok_or_else(|| Error::new("total_sequence_length is empty"))?,
        // Inside a trace where the length is data (computed before the graph, as a split
        // decode step's prologue does from the attention mask): a static cache is assumed
        // (present is past's buffer, the new tokens follow a prompt), and checked on the
        // device, `S < total <= past`; a run where it does not hold is built apart.
        Err(_) if ctx.tracing() && past_len > g.seq && ctx.input(6)?.size() == 1 => {
            // (Guarded once per graph: every layer reads the same length.)
            let tag = format!("GroupQueryAttention total length guard s={} past={past_len}", g.seq);
            ctx.shared(&[6], &tag, |ctx| {
                let t = ctx.input(6)?.clone();
                ctx.guard_range(&t, g.seq + 1, past_len)?;
                Ok(Vec::new())
            })?;
            past_len
        }
        Err(e) => return Err(Error::new(format!("total_sequence_length: {e}"))),
    };
    // What ORT's CPU EP requires of the lengths: a growing cache gains the new rows, a static
    // one (a buffer at least as long) holds them.
    if let (Some(pk), Some(pv)) = (&past_k, &past_v)
        && pk.shape() != pv.shape()
    {
        bail!("past_key {:?} and past_value {:?} differ in shape", pk.shape(), pv.shape());
    }
    if total < 1 || total < g.seq || (total != past_len + g.seq && total > past_len) {
        bail!(
            "total_sequence_length {total} fits neither a growing cache (past {past_len} + new {}) nor a \
             static one (at most {past_len} rows)",
            g.seq
        );
    }
    // (As ORT checks it: its first dimension the batch; further dimensions of 1 are read
    // through. A scalar is refused.)
    let seqlens_shape = ctx.input(5)?.shape();
    if seqlens_shape.first() != Some(&g.batch) || seqlens_shape.iter().product::<i64>() != g.batch {
        bail!("seqlens_k {seqlens_shape:?} must hold one entry per batch entry ({})", g.batch);
    }
    let present_len = total.max(past_len);
    let first_prompt = g.seq == total;
    // T_b and past_b, [B, 1, 1, 1]: the same for every layer, built once per graph.
    let tag = format!("GroupQueryAttention lengths b={} s={} first={first_prompt}", g.batch, g.seq);
    let lengths = ctx.shared(&[5], &tag, |ctx| {
        let seqlens = ops::reshape(&ops::astype(ctx.input(5)?, Dtype::I32, s)?, &[g.batch, 1, 1, 1], s)?;
        // Constants of the lengths' own shape: a scalar would be broadcast first, and MLX
        // would fuse each broadcast and its one operation into a kernel of its own (on CUDA
        // NVRTC-compiled, seconds each, on a machine's first run).
        let per_entry = |v: i64| Array::from_slice(&vec![v as i32; g.batch as usize], &[g.batch, 1, 1, 1]);
        let t_b = ops::add(&seqlens, &per_entry(1)?, s)?;
        let past_b = if first_prompt { per_entry(0)? } else { ops::add(&seqlens, &per_entry(1 - g.seq)?, s)? };
        Ok(vec![seqlens, t_b, past_b])
    })?;
    let (seqlens, t_b, past_b) = (lengths[0].clone(), lengths[1].clone(), lengths[2].clone());

    let interleaved = node.attr_int("rotary_interleaved", 0)? == 1;
    let angles = if node.attr_int("do_rotary", 0)? == 1 {
        // The angles of every position: the same for every layer of a decoder (same lengths,
        // same caches), so built once per graph.
        let tag = format!("GroupQueryAttention angles b={} s={} first={first_prompt}", g.batch, g.seq);
        Some(ctx.shared(&[5, 7, 8, 9], &tag, |ctx| {
            let steps = ops::reshape(&ops::arange(0.0, g.seq as f64, 1.0, Dtype::I32, s)?, &[1, g.seq], s)?;
            let positions = match ctx.optional_input(9) {
                Some(ids) if first_prompt => {
                    let first = ops::slice(ids, &[0, 0], &[1, 1], s)?;
                    ops::add(&ops::astype(&first, Dtype::I32, s)?, &steps, s)?
                }
                Some(ids) => ops::slice(&ops::astype(ids, Dtype::I32, s)?, &[0, 0], &[g.batch, g.seq], s)?,
                None => ops::add(&ops::reshape(&past_b, &[g.batch, 1], s)?, &steps, s)?,
            };
            let positions = ops::broadcast_to(&positions, &[g.batch, g.seq], s)?;
            let (cos_cache, sin_cache) = (ctx.input(7)?.clone(), ctx.input(8)?.clone());
            let (cos, sin) = rotary::angles(ctx, &cos_cache, &sin_cache, &positions, s)?;
            Ok(vec![cos, sin])
        })?)
    } else {
        None
    };
    // Rotated in float32 and rounded back to the model's type, as the cache holds them.
    let rotate = |x: &Array, a: &[Array]| rotary::rotate(x, &a[0], &a[1], interleaved, shapeless, s);
    let (q, k, v) = match (apart, all) {
        (Some([q, k, v]), _) => match &angles {
            Some(a) => (rotate(&q, a)?, rotate(&k, a)?, v),
            None => (q, k, v),
        },
        (None, all) => {
            let all = all.ok_or_else(|| Error::new("the query holds no packed heads"))?;
            // The query, key and value heads cut apart at once (one split in a shape-keyed graph).
            let three = |x: &Array| -> Result<(Array, Array, Array)> {
                let mut p = heads::parts(x, &[heads, kv_heads, kv_heads], 1, shapeless, s)?.into_iter();
                match (p.next(), p.next(), p.next()) {
                    (Some(q), Some(k), Some(v)) => Ok((q, k, v)),
                    _ => Err(Error::new("the packed heads did not split in three")),
                }
            };
            match &angles {
                // Whole heads: the query and key heads rotated in place, the value heads passed
                // through, with no cutting before the rotation.
                Some(a) if 2 * a[0].shape()[3] == g.head => {
                    let tag = format!("GroupQueryAttention b={} s={} first={first_prompt}", g.batch, g.seq);
                    let (turned, of) = ((&a[0], &a[1]), [5, 7, 8, 9]);
                    three(&rotary::rotate_leading_heads(
                        ctx,
                        &all,
                        turned,
                        heads + kv_heads,
                        interleaved,
                        &of,
                        &tag,
                        s,
                    )?)?
                }
                // Part of each head: the query and key heads cut and rotated together.
                Some(a) => {
                    let v = part(&all, heads + kv_heads, kv_heads)?;
                    let qk = rotate(&part(&all, 0, heads + kv_heads)?, a)?;
                    let mut p = heads::parts(&qk, &[heads, kv_heads], 1, shapeless, s)?.into_iter();
                    match (p.next(), p.next()) {
                        (Some(q), Some(k)) => (q, k, v),
                        _ => bail!("the rotated heads did not split in two"),
                    }
                }
                None => three(&all)?,
            }
        }
    };
    // output_qk: 1, each query's scaled (and soft-capped, biased) scores; 2, its attention
    // probabilities: `[B, heads, S, total_sequence_length]`, 0 where a key is not seen.
    let qk_output = if node.output(3).is_some() { node.attr_int("qk_output", 0)? } else { 0 };
    // A quantized cache: the new rows stored as its codes, the present read back dequantized.
    let codecs = (
        crate::kv_quant::Codec::read(ctx, node, "k", 12, kv_heads, g.head)?,
        crate::kv_quant::Codec::read(ctx, node, "v", 13, kv_heads, g.head)?,
    );
    let quantized = codecs.0.quantized() || codecs.1.quantized();
    for (past, codec, what) in [(&past_k, &codecs.0, "past_key"), (&past_v, &codecs.1, "past_value")] {
        if let Some(p) = past
            && p.shape()[3] != codec.width(g.head)
        {
            bail!("{what} {:?} does not hold rows of {} for heads of {}", p.shape(), codec.width(g.head), g.head);
        }
    }
    if let (true, Some(pk), Some(pv)) = (ctx.shapeless() && past_len + g.seq == total, &past_k, &past_v) {
        if quantized {
            bail!("a quantized KV cache has no decode-slot form");
        }
        return decode_step(ctx, node, &g, (&q, &k, &v), (pk, pv), &past_b);
    }
    let (k, v) = (codecs.0.store(&k, s)?, codecs.1.store(&v, s)?);
    // Each entry's length within the present (the decode slot above replays a trace, whose
    // lengths grow, so it is not checked against a traced bound).
    // (Checked once per graph: every layer reads the same lengths.)
    ctx.shared(&[5], &format!("GroupQueryAttention seqlens check len={present_len}"), |ctx| {
        ctx.check_range(
            &seqlens,
            0,
            present_len - 1,
            format!("a seqlens_k entry is outside [0, {present_len}) (the present holds {present_len} rows)"),
        )?;
        Ok(Vec::new())
    })?;
    let (present_k, present_v) = match (&past_k, &past_v) {
        (Some(pk), Some(pv)) if g.batch == 1 => {
            // The rows kept and where the new ones go: the same for every layer.
            let tag =
                format!("GroupQueryAttention one entry's rows len={present_len} s={} first={first_prompt}", g.seq);
            let lone = !ctx.shapeless();
            let at = ctx.shared(&[5], &tag, |_| {
                let rows = iota(present_len, 2, s)?;
                if lone {
                    // (Fixed shapes: the same tables without a chain for MLX to fuse.)
                    return crate::lone::entry_rows(&rows, &past_b, present_len, g.seq, s);
                }
                let keep = ops::less(&rows, &past_b, s)?;
                if g.seq == 1 {
                    return Ok(vec![keep, ops::equal(&rows, &past_b, s)?]);
                }
                let last = int(present_len - g.seq, s)?;
                let start = ops::clip(&past_b, Some(&int(0, s)?), Some(&last), s)?;
                let offset = ops::subtract(&rows, &start, s)?;
                let written = ops::logical_and(
                    &ops::greater_equal(&offset, &int(0, s)?, s)?,
                    &ops::less(&offset, &int(g.seq, s)?, s)?,
                    s,
                )?;
                let source = ops::clip(&offset, Some(&int(0, s)?), Some(&int(g.seq - 1, s)?), s)?;
                Ok(vec![keep, written, ops::flatten(&source, s)?])
            })?;
            (present_one(pk, &k, &at, present_len, s)?, present_one(pv, &v, &at, present_len, s)?)
        }
        _ => (
            present(past_k.as_ref(), &k, &past_b, present_len, &g, s)?,
            present(past_v.as_ref(), &v, &past_b, present_len, &g, s)?,
        ),
    };
    if past_k.is_some() && present_len == past_len {
        // A static cache: when ORT binds present to past's buffer (genai's shared buffer),
        // only the new rows are written into it.
        let starts = ops::reshape(&past_b, &[g.batch], s)?;
        ctx.write_rows_at(3, &k, &starts, 2, 1)?;
        ctx.write_rows_at(4, &v, &starts, 2, 2)?;
    }

    // Which keys each query sees: [B, 1, S, L] (and the queries that see none), the same for
    // every layer of a decoder: built once per graph.
    let causal = node.attr_int("causal", 1)? == 1;
    let window = node.attr_int("local_window_size", -1)?;
    let tag =
        format!("GroupQueryAttention keys b={} s={} len={present_len} causal={causal} window={window}", g.batch, g.seq);
    let lone = !ctx.shapeless();
    let seen = ctx.shared(&[5], &tag, |_| {
        if lone && window < 0 {
            // (Fixed shapes: without a chain for MLX to fuse.)
            let keys = iota(present_len, 3, s)?;
            let lengths = (&past_b, &t_b);
            return Ok(vec![crate::lone::keys_seen(&keys, lengths, g.seq, causal, !first_prompt, s)?]);
        }
        // The keys [lo, hi): up to the causal frontier (capped at the last valid key) and at
        // most `window` of them.
        let hi = if causal {
            ops::minimum(&ops::add(&ops::add(&past_b, &iota(g.seq, 2, s)?, s)?, &int(1, s)?, s)?, &t_b, s)?
        } else {
            t_b.clone()
        };
        let keys = iota(present_len, 3, s)?;
        let mut allowed = ops::less(&keys, &hi, s)?;
        if window >= 0 {
            let lo = ops::maximum(&ops::subtract(&hi, &int(window, s)?, s)?, &int(0, s)?, s)?;
            allowed = ops::logical_and(&allowed, &ops::greater_equal(&keys, &lo, s)?, s)?;
            // A zero-size window sees nothing: 0.
            return Ok(vec![allowed, ops::less_equal(&hi, &lo, s)?]);
        }
        Ok(vec![allowed])
    })?;
    let allowed = seen[0].clone();
    let dead = seen.get(1).cloned();

    let scale = match node.attr_float("scale", 0.0)? {
        x if x != 0.0 => x,
        _ => 1.0 / (g.head as f32).sqrt(),
    };
    let softcap = node.attr_float("softcap", 0.0)?;
    let sink = node.attr_int("smooth_softmax", 0)? == 1 || ctx.optional_input(11).is_some();
    // The bias covers total_sequence_length keys; a longer static cache's extra keys are
    // masked anyway.
    let bias = match ctx.optional_input(10) {
        Some(b) => {
            let b = f32(b)?;
            let bs = b.shape();
            let last = bs[bs.len() - 1];
            Some(if last < present_len {
                let zero = ops::scalar(0.0, Dtype::F32, s)?;
                ops::pad(&b, &vec![0; bs.len()], &[0, 0, 0, present_len - last], &zero, "constant", s)?
            } else {
                b
            })
        }
        None => None,
    };
    // One query token over a cache whose masked keys are exactly its zeroed rows (no window):
    // MLX's fused one-query kernel, the mask carried in the head dimension.
    if g.seq == 1
        && window < 0
        && bias.is_none()
        && softcap <= 0.0
        && !sink
        && qk_output == 0
        && !quantized
        && key_mask::serves(dtype)
    {
        // A static buffer on CUDA: the EP's kernel reads past's rows and the new row in its
        // place, so the present is only an output (written in place as rows, see above).
        let fits = !shapeless && present_len == past_len && crate::one_query::serves();
        if let (true, Some(pk), Some(pv)) = (fits, &past_k, &past_v) {
            let at = ops::reshape(&past_b, &[g.batch], s)?;
            let keys = crate::one_query::Keys::Replaced { past: (pk, pv), new: (&k, &v), at: &at };
            if let Some(y) = crate::one_query::attend(&q, keys, &allowed, scale, s)? {
                return Ok(vec![heads::merge(&y, s)?, present_k, present_v]);
            }
        }
        let tag = format!("GroupQueryAttention len={present_len} causal={causal}");
        let qkv = (&q, &present_k, &present_v);
        if let Some(y) = key_mask::attend(ctx, qkv, &allowed, scale, &[5], &tag, shapeless, s)? {
            return Ok(vec![heads::merge(&y, s)?, present_k, present_v]);
        }
    }
    let (qf, kf, vf) = (f32(&q)?, codecs.0.load(&present_k, s)?, codecs.1.load(&present_v, s)?);
    // A boolean mask: MLX replaces the scores of keys not seen (an additive -inf would make a
    // masked key's infinite score NaN, where ORT never computes that score). With a bias the
    // scores are masked after it is added, below.
    let mut qk = None;
    // MLX's fused kernel on a GPU; elsewhere MLX computes the scores apart anyway, and the
    // explicit form below gives a query whose every seen score is -inf (an infinite input)
    // ORT's answer, 0, where softmax has none.
    let fused = ep_core::mlx::default_device_is_gpu();
    let y = if fused && softcap <= 0.0 && !sink && bias.is_none() && qk_output == 0 {
        ops::scaled_dot_product_attention(&qf, &kf, &vf, scale, Some(&allowed), false, s)?
    } else {
        // Each KV head's query heads as one block of rows (query head h reads KV head
        // h / reps): no copy of the keys and values per query head.
        let reps = heads / kv_heads;
        // (Sizes spelled out: MLX infers no -1 in an empty array.)
        let grouped = |last: i64| [g.batch, kv_heads, reps * g.seq, last];
        let by_head = |last: i64| [g.batch, heads, g.seq, last];
        let qg = ops::reshape(&qf, &grouped(g.head), s)?;
        let raw = ops::matmul(&qg, &ops::transpose_axes(&kf, &[0, 1, 3, 2], s)?, s)?;
        let mut scores = ops::scale(&ops::reshape(&raw, &by_head(present_len), s)?, scale, s)?;
        if softcap > 0.0 {
            let c = ops::scalar(softcap as f64, Dtype::F32, s)?;
            scores = ops::multiply(&ops::tanh(&ops::divide(&scores, &c, s)?, s)?, &c, s)?;
        }
        if let Some(b) = &bias {
            scores = ops::add(&scores, b, s)?;
        }
        let zero = ops::scalar(0.0, Dtype::F32, s)?;
        if qk_output == 1 {
            qk = Some(ops::where_(&allowed, &scores, &zero, s)?);
        }
        let neg_inf = ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?;
        scores = ops::where_(&allowed, &scores, &neg_inf, s)?;
        let none_finite = ops::isneginf(&ops::max_axes(&scores, &[3], true, s)?, s)?;
        let probs = if sink {
            // An extra logit per head (head_sink, or 0) that takes probability but no value.
            let sink_logit = match ctx.optional_input(11) {
                Some(h) => ops::reshape(&f32(h)?, &[1, heads, 1, 1], s)?,
                None => ops::scalar(0.0, Dtype::F32, s)?,
            };
            let sink_col = ops::broadcast_to(&sink_logit, &[g.batch, heads, g.seq, 1], s)?;
            let with_sink = ops::concatenate(&[scores, sink_col], 3, s)?;
            ops::split_at(&ops::softmax(&with_sink, -1, s)?, &[present_len], 3, s)?.remove(0)
        } else {
            ops::softmax(&scores, -1, s)?
        };
        if qk_output == 2 {
            // (A query that sees no key has no probabilities: 0, not softmax's NaN.)
            qk = Some(ops::where_(&allowed, &probs, &zero, s)?);
        }
        let y = ops::matmul(&ops::reshape(&probs, &grouped(present_len), s)?, &vf, s)?;
        ops::where_(&none_finite, &zero, &ops::reshape(&y, &by_head(g.head), s)?, s)?
    };
    let y = match dead {
        Some(d) => ops::where_(&d, &ops::scalar(0.0, Dtype::F32, s)?, &y, s)?,
        None => y,
    };
    let mut outputs = vec![ops::astype(&heads::merge(&y, s)?, dtype, s)?, present_k, present_v];
    if let Some(qk) = qk {
        // Over total_sequence_length keys (a static buffer's further rows are not keys).
        let qk = if total < present_len {
            let sh = qk.shape();
            ops::slice(&qk, &[0, 0, 0, 0], &[sh[0], sh[1], sh[2], total], s)?
        } else {
            qk
        };
        outputs.push(ops::astype(&qk, dtype, s)?);
    }
    Ok(outputs)
}

/// The decode slot's form for a growing cache (see [`LowerCtx::shapeless`]): present is past
/// with the new rows appended, attention runs over all of it with MLX's fused kernel (causal
/// among the new rows), and nothing is built from the cache length. It equals ORT's result
/// when every batch entry's past fills the cache (`seqlens_k + 1 - S == past`, no padding):
/// that is the guard; a padded batch reruns through the general form.
fn decode_step(
    ctx: &mut LowerCtx<'_>,
    node: &NodeInfo,
    g: &Geometry,
    (q, k, v): (&Array, &Array, &Array),
    (past_k, past_v): (&Array, &Array),
    past_b: &Array,
) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let dtype = q.dtype();
    let unsupported = [
        ("local_window_size", node.attr_int("local_window_size", -1)? >= 0),
        ("softcap", node.attr_float("softcap", 0.0)? > 0.0),
        ("smooth_softmax", node.attr_int("smooth_softmax", 0)? == 1 || ctx.optional_input(11).is_some()),
        ("attention_bias", ctx.optional_input(10).is_some()),
        ("causal=0", node.attr_int("causal", 1)? != 1 && g.seq > 1),
        ("output_qk", node.output(3).is_some()),
    ];
    if let Some((what, _)) = unsupported.iter().find(|(_, on)| *on) {
        bail!("{what} has no decode-slot form");
    }
    // The cache length as data (a shape read while building would be baked into the trace).
    let past_rows = ops::number_of_elements(past_k, &[2], Dtype::I32, s)?;
    ctx.guard(&ops::equal(past_b, &past_rows, s)?)?;
    let present_k = ops::concatenate(&[past_k.clone(), k.clone()], 2, s)?;
    let present_v = ops::concatenate(&[past_v.clone(), v.clone()], 2, s)?;
    let scale = match node.attr_float("scale", 0.0)? {
        x if x != 0.0 => x,
        _ => 1.0 / (g.head as f32).sqrt(),
    };
    // On a GPU MLX's fused kernel widens half types to float32 itself (as ORT computes
    // attention); elsewhere MLX's attention falls back to plain operations in the input type,
    // so the inputs are widened first.
    let wide = |a: &Array| -> Result<Array> {
        Ok(if ep_core::mlx::gpu_forms() { a.clone() } else { ops::astype(a, Dtype::F32, s)? })
    };
    let y = ops::scaled_dot_product_attention(
        &wide(q)?,
        &wide(&present_k)?,
        &wide(&present_v)?,
        scale,
        None,
        g.seq > 1,
        s,
    )?;
    Ok(vec![ops::astype(&heads::merge(&y, s)?, dtype, s)?, present_k, present_v])
}

ep_core::register_lowering!(
    GROUP_QUERY_ATTENTION = FnLowering {
        domain: "com.microsoft",
        op: "GroupQueryAttention",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: Some(growth),
    }
);

/// The decode slot: a cache growing along its length (axis 2 of past_key and past_value)
/// grows present_key and present_value the same way (the attention itself is MLX's fused,
/// shape-agnostic kernel); `total_sequence_length` (input 6) may hold a growing size, which
/// is read only to tell a growing cache from a static one. Anything else growing refuses.
fn growth(q: &ep_core::growth::GrowthQuery<'_>) -> ep_core::growth::GrowthResult {
    use ep_core::growth::Growth;
    let fine = |(k, g): (usize, &Growth)| match g {
        Growth::Axes(a) => matches!(k, 3 | 4) && *a == [2],
        Growth::Size => k == 6,
    };
    if !q.growing().all(fine) {
        return Err("takes a growing dimension other than the KV cache length".into());
    }
    let cache_grows = q.growing().any(|(k, _)| k == 3);
    Ok((0..q.node.outputs.len()).map(|o| (cache_grows && o > 0).then(|| Growth::Axes(vec![2]))).collect())
}

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// Per batch entry, a total length in `lo..=hi` (one entry reaching `hi`).
    fn lengths(batch: i64, lo: i64, hi: i64, seed: u64) -> Vec<i64> {
        let span = (hi - lo + 1) as u64;
        (0..batch).map(|b| if b == 0 { hi } else { lo + ((seed >> (8 * b)) % span) as i64 }).collect()
    }

    register_spec!(super::GROUP_QUERY_ATTENTION, || {
        let heads = (1..=2i64, 1..=2i64, prop_oneof![Just(16i64), Just(32)], 1..=2i64);
        let flags = (any::<(bool, bool, bool)>(), 0..3u8, 0..4u8, any::<(bool, bool)>());
        // qk_output: 0 (mostly), 1 scores, 2 probabilities; a quantized KV cache (0: none; 1,
        // 3: per tensor; 2, 4: per channel; 1, 2: 8-bit, 3, 4: 4-bit).
        let qk = prop_oneof![4 => Just(0i64), 1 => Just(1i64), 1 => Just(2i64)];
        let quant = prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8), 1 => Just(4u8)];
        (dtype_of(&[DType::F32, DType::F16]), heads, 0..3u8, (1..=4i64, 0..=5i64), flags, (qk, quant), seed())
            .prop_map(
                |(
                    t,
                    (kvh, reps, h, b),
                    phase,
                    (sq, past),
                    ((packed, rotary, interleaved), window, cache, (cap, sink)),
                    (qk_output, quant),
                    seed,
                )| {
                    let nh = kvh * reps;
                    // output_qk: ORT's CPU EP writes it only where a query sees a key (the rest
                    // of its buffer holds whatever the memory held; the EP writes 0 there), so
                    // it is compared on one-token steps over every key, without a window.
                    let (phase, window) = if qk_output > 0 { (1, 0) } else { (phase, window) };
                    // phase 0: first prompt (no past); 1: one-token decode; 2: a later prompt (B = 1).
                    let (b, sq) = match phase {
                        0 => (b, sq),
                        1 => (b, 1),
                        _ => (1, sq.max(2)),
                    };
                    let past = if phase == 0 { 0 } else { past.max(1) };
                    let total = past + sq;
                    // ORT's float32 flash path (no softcap, no smooth softmax) and its reference
                    // path disagree on the padded query rows of a windowed first prompt (rows
                    // whose outputs nothing reads): such cases are left unpadded. The EP follows
                    // the reference path.
                    let totals = match phase {
                        _ if qk_output > 0 => vec![total; b as usize],
                        0 if window > 0 => vec![sq; b as usize],
                        0 => lengths(b, 1, sq, seed),
                        _ => lengths(b, sq, total, seed),
                    };
                    // cache 0 or 1: a growing cache; else one static buffer longer than total.
                    let p_rows = if phase == 0 {
                        0
                    } else if cache < 2 {
                        past
                    } else {
                        total + (cache as i64 - 1)
                    };
                    let present_rows = total.max(p_rows);
                    let mut case = Case::domain_op("com.microsoft", "GroupQueryAttention", 1);
                    if packed {
                        case = case.input("qkv", t, &[b, sq, (nh + 2 * kvh) * h]).absent().absent();
                    } else {
                        case = case.input("q", t, &[b, sq, nh * h]).input("k", t, &[b, sq, kvh * h]).input(
                            "v",
                            t,
                            &[b, sq, kvh * h],
                        );
                    }
                    // An 8-bit cache holds codes of either sign, some of the new rows saturating;
                    // a 4-bit one any bytes (two codes each), rows half a head wide.
                    let (ct, codes, w) = match quant {
                        0 => (t, Values::default_for(t), h),
                        1 | 2 => (DType::I8, Values::Uniform { lo: -120.0, hi: 120.0 }, h),
                        _ => (DType::U8, Values::Uniform { lo: 0.0, hi: 256.0 }, h / 2),
                    };
                    // (A first prompt into a quantized cache passes an empty past: the present's type
                    // follows the past's.)
                    case = if phase == 0 && quant == 0 {
                        case.absent().absent()
                    } else {
                        case.input_with("past_k", ct, &[b, kvh, p_rows, w], codes.clone()).input_with(
                            "past_v",
                            ct,
                            &[b, kvh, p_rows, w],
                            codes,
                        )
                    };
                    let seqlens = totals.iter().map(|&x| (x - 1) as f64).collect();
                    case = case.input_with("seqlens_k", DType::I32, &[b], Values::Data(seqlens)).constant(
                        "total_len",
                        DType::I32,
                        &[],
                        Values::Data(vec![total as f64]),
                    );
                    if rotary {
                        let half = if h == 32 && interleaved { 8 } else { h / 2 };
                        case = case
                            .constant("cos", t, &[total + 4, half], Values::Uniform { lo: -1.0, hi: 1.0 })
                            .constant("sin", t, &[total + 4, half], Values::Uniform { lo: -1.0, hi: 1.0 })
                            .attr_int("do_rotary", 1)
                            .attr_int("rotary_interleaved", interleaved as i64);
                    }
                    if quant > 0 {
                        if !rotary {
                            case = case.absent().absent();
                        }
                        let scale_shape = if quant % 2 == 1 { vec![1] } else { vec![kvh, 1, h] };
                        let kind = if quant % 2 == 1 { "PER_TENSOR" } else { "PER_CHANNEL" };
                        let (bits, scales) = if quant <= 2 {
                            (8, Values::Uniform { lo: 0.005, hi: 0.02 })
                        } else {
                            (4, Values::Uniform { lo: 0.08, hi: 0.3 })
                        };
                        case = case
                            .absent()
                            .absent()
                            .absent()
                            .input_with("k_scale", DType::F32, &scale_shape, scales.clone())
                            .input_with("v_scale", DType::F32, &scale_shape, scales)
                            .attr_str("k_quant_type", kind)
                            .attr_str("v_quant_type", kind)
                            .attr_int("kv_cache_bit_width", bits);
                    }
                    if sink {
                        case = case.attr_int("smooth_softmax", 1);
                    }
                    if cap {
                        case = case.attr_float("softcap", 3.0);
                    }
                    if window > 0 {
                        case = case.attr_int("local_window_size", window as i64 * 2 - 1);
                    }
                    case = case
                        .attr_int("num_heads", nh)
                        .attr_int("kv_num_heads", kvh)
                        .output("y", t, &[b, sq, nh * h])
                        .output("present_k", ct, &[b, kvh, present_rows, w])
                        .output("present_v", ct, &[b, kvh, present_rows, w]);
                    if qk_output > 0 {
                        case = case.attr_int("qk_output", qk_output).output("output_qk", t, &[b, nh, sq, total]);
                    }
                    case.with_seed(seed)
                },
            )
            .boxed()
    });
}
