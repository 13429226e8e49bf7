//! `com.microsoft` SparseAttention, Phi-3-small's block-sparse attention: packed or separate
//! Q/K/V `[B, S, heads * H]`, grouped key/value heads, rotary inside the op (`do_rotary`, the
//! model's cos/sin caches, interleaved or not, partial), one KV buffer `[B, kv_heads, M, H]`
//! shared by past and present, and a block mask per layout in CSR form (`block_row_indices`
//! `[L, R + 1]`, `block_col_indices` `[L, nnz]`), head `h` reading layout `h % L`.
//!
//! The semantics followed (ORT's CPU kernel, which runs only with present bound to past's
//! buffer, and so is checked against a numpy reference in `python/check_sparse_attention.py`):
//! batch entry `b` holds `T_b = key_total_sequence_lengths[b]` tokens; on a prompt
//! (`S == total_sequence_length`) its new tokens start at row 0, afterwards at `past_b = T_b -
//! S`. The new K/V rows (K after rotary, at positions `past_b + s`) replace rows `[past_b,
//! past_b + S)` of the buffer; every other row is kept. Query `s` (position `p = past_b + s`)
//! sees the keys `j <= p`, `j < T_b`; among them, a key whose block `j / block` is not listed
//! in row `p / block` of the head's layout has its score replaced by the lowest float (so a
//! query whose every key is masked weighs them alike, as ORT does). A row listing `row + 1`
//! blocks, or a layout with every block of the lower triangle, is dense. Scores are computed
//! in float32.

use crate::heads::{int, iota};
use crate::{heads, rotary};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const TYPES: &[ElemType] = &[ElemType::F32, ElemType::F16];

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    // (Key and value are left out with packed QKV: only the query is required up front.)
    require_inputs(node, 1, 11)?;
    if node.inputs.len() < 9 {
        return Err(Decline(format!("{} inputs; expected 9 to 11", node.inputs.len())));
    }
    for (i, what) in [(3, "past_key"), (4, "past_value"), (5, "block_row_indices"), (6, "block_col_indices")]
        .into_iter()
        .chain([(7, "total_sequence_length"), (8, "key_total_sequence_lengths")])
    {
        if node.input(i).is_none() {
            return Err(Decline(format!("{what} is required")));
        }
    }
    require_input_type(node, 0, TYPES)?;
    let t = node.input(0).and_then(|v| v.elem_type);
    for i in [1, 2, 3, 4, 9, 10] {
        if let Some(v) = node.input(i)
            && v.elem_type != t
        {
            return Err(Decline(format!("input {i} is {:?} and query {t:?}", v.elem_type)));
        }
    }
    for i in 5..=8 {
        require_input_type(node, i, &[ElemType::I32])?;
    }
    let (heads, kv_heads) = (node.attr_int("num_heads", 0)?, node.attr_int("kv_num_heads", 0)?);
    if heads <= 0 || kv_heads <= 0 {
        return Err(Decline(format!("num_heads={heads} and kv_num_heads={kv_heads} must be positive")));
    }
    if node.attr_int("sparse_block_size", 0)? <= 0 {
        return Err(Decline::new("sparse_block_size must be positive"));
    }
    if node.attr_int("do_rotary", 0)? == 1 && (node.input(9).is_none() || node.input(10).is_none()) {
        return Err(Decline::new("do_rotary needs cos_cache and sin_cache"));
    }
    if ep_core::lowering::input_rank(node, 0) != Some(3) {
        return Err(Decline::new("query must be 3-D [batch, sequence, hidden]"));
    }
    Ok(())
}

/// The shapes ORT's CPU kernel checks, with its reasons; returns `(layouts, blocks per row)`.
/// (The lengths ORT also checks against total_sequence_length are checked on the device, where
/// the total is read.)
fn check_shapes(ctx: &LowerCtx<'_>, g: &Geometry, rotary: bool) -> Result<(i64, i64)> {
    let rows = ctx.input(5)?.shape();
    if rows.len() != 2 || rows[0] < 1 || rows[1] < 2 || g.heads % rows[0] != 0 {
        bail!(
            "block_row_indices {rows:?} must be [num_layout, max_blocks + 1] with num_heads={} divisible by \
             num_layout",
            g.heads
        );
    }
    let (layouts, blocks) = (rows[0], rows[1] - 1);
    let cols = ctx.input(6)?.shape();
    if cols.len() != 2 || cols[0] != layouts || cols[1] > blocks * blocks {
        bail!("block_col_indices {cols:?} must be [{layouts}, max_nnz] with max_nnz at most {}", blocks * blocks);
    }
    let past = ctx.input(3)?.shape();
    if past != ctx.input(4)?.shape() {
        bail!("past_key {past:?} and past_value {:?} differ in shape", ctx.input(4)?.shape());
    }
    if past.len() != 4 || past[0] != g.batch || past[1] != g.kv_heads || past[3] != g.head {
        bail!(
            "past_key {past:?} is not [batch {}, kv_num_heads {}, max_cache_sequence_length, head {}]",
            g.batch,
            g.kv_heads,
            g.head
        );
    }
    if past[2] < g.seq {
        bail!("the KV buffer's {} rows cannot hold the query's {} tokens", past[2], g.seq);
    }
    if ctx.input(8)?.shape() != [g.batch] {
        bail!("key_total_sequence_lengths {:?} must be [batch {}]", ctx.input(8)?.shape(), g.batch);
    }
    if rotary {
        let (cos, sin) = (ctx.input(9)?.shape(), ctx.input(10)?.shape());
        if g.head % 16 != 0 {
            bail!("do_rotary needs a head size that is a multiple of 16, not {}", g.head);
        }
        if cos.len() != 2 || cos != sin {
            bail!("cos_cache {cos:?} and sin_cache {sin:?} must be 2-D and of one shape");
        }
        if cos[1] > g.head / 16 * 8 || cos[1] % 8 != 0 {
            bail!("cos_cache's width {} must be a multiple of 8 and at most half the head ({})", cos[1], g.head);
        }
    }
    Ok((layouts, blocks))
}

struct Geometry {
    batch: i64,
    seq: i64,
    heads: i64,
    kv_heads: i64,
    head: i64,
}

/// Which key blocks each block row of each layout sees, `[L, R, R]` bool, from the CSR lists
/// (on the device: the lists may be data): entry `k` of a layout's columns belongs to the
/// row whose span `[rows[r], rows[r + 1])` holds it; rows listing `r + 1` blocks, and layouts
/// with all `R (R + 1) / 2` lower blocks, see every block.
fn block_table(ctx: &LowerCtx<'_>, layouts: i64, blocks: i64, s: &Stream) -> Result<Array> {
    let rows = ops::astype(ctx.input(5)?, Dtype::I32, s)?;
    let cols = ops::astype(ctx.input(6)?, Dtype::I32, s)?;
    let nnz = cols.shape()[1];
    // Where each row's entries end (`[L, R]`), and where they start.
    let row_ends = ops::slice(&rows, &[0, 1], &[layouts, blocks + 1], s)?;
    let ends = ops::reshape(&row_ends, &[layouts, 1, blocks], s)?;
    let starts = ops::slice(&rows, &[0, 0], &[layouts, blocks], s)?;
    let slots = ops::reshape(&ops::arange(0.0, nnz as f64, 1.0, Dtype::I32, s)?, &[1, nnz, 1], s)?;
    // Row of each entry: how many rows end at or before it.
    let row_of = ops::sum_axes(&ops::astype(&ops::less_equal(&ends, &slots, s)?, Dtype::I32, s)?, &[2], true, s)?;
    // (Entries outside [rows[0], rows[R]) belong to no row.)
    let first = ops::reshape(&ops::slice(&rows, &[0, 0], &[layouts, 1], s)?, &[layouts, 1, 1], s)?;
    let end = ops::reshape(&ops::slice(&rows, &[0, blocks], &[layouts, blocks + 1], s)?, &[layouts, 1, 1], s)?;
    let used = ops::logical_and(&ops::greater_equal(&slots, &first, s)?, &ops::less(&slots, &end, s)?, s)?;
    let range = ops::reshape(&ops::arange(0.0, blocks as f64, 1.0, Dtype::I32, s)?, &[1, 1, blocks], s)?;
    let one_hot = |index: &Array| -> Result<Array> {
        Ok(ops::astype(&ops::logical_and(&ops::equal(index, &range, s)?, &used, s)?, Dtype::F32, s)?)
    };
    let by_row = one_hot(&row_of)?;
    let by_col = one_hot(&ops::reshape(&cols, &[layouts, nnz, 1], s)?)?;
    // [L, R, nnz] x [L, nnz, R]: how often each (row, column) block is listed.
    let listed = ops::greater(
        &ops::matmul(&ops::transpose_axes(&by_row, &[0, 2, 1], s)?, &by_col, s)?,
        &ops::scalar(0.0, Dtype::F32, s)?,
        s,
    )?;
    let per_row = ops::reshape(&ops::subtract(&row_ends, &starts, s)?, &[layouts, blocks, 1], s)?;
    let full_row = ops::equal(&per_row, &ops::add(&ops::reshape(&range, &[1, blocks, 1], s)?, &int(1, s)?, s)?, s)?;
    // (`end`, `[L, 1, 1]`: the layout's entry count.)
    let full_layout = ops::greater_equal(&end, &int(blocks * (blocks + 1) / 2, s)?, s)?;
    let dense = ops::logical_or(&full_row, &full_layout, s)?;
    Ok(ops::logical_or(&listed, &dense, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let query = ctx.input(0)?.clone();
    let dtype = query.dtype();
    let qs = query.shape();
    let (heads, kv_heads) = (node.attr_int("num_heads", 0)?, node.attr_int("kv_num_heads", 0)?);
    if kv_heads < 1 || heads % kv_heads != 0 {
        bail!("num_heads={heads} must be a positive multiple of kv_num_heads={kv_heads}");
    }
    let packed = ctx.optional_input(1).is_none();
    if packed != ctx.optional_input(2).is_none() {
        bail!("key and value must both be given, or both left out (packed QKV)");
    }
    let width = if packed { heads + 2 * kv_heads } else { heads };
    if qs.len() != 3 || qs[2] % width != 0 {
        bail!("query {qs:?} does not split into {width} heads");
    }
    let g = Geometry { batch: qs[0], seq: qs[1], heads, kv_heads, head: qs[2] / width };
    if g.head % 8 != 0 {
        bail!("the head size must be a multiple of 8, not {}", g.head);
    }
    if g.seq == 0 || g.batch == 0 {
        bail!("the query {qs:?} has no tokens");
    }
    for i in [1, 2] {
        if let Some(kv) = ctx.optional_input(i)
            && (kv.ndim() != 3 || kv.shape()[2] != kv_heads * g.head || kv.shape()[..2] != qs[..2])
        {
            bail!("input {i} {:?} does not hold {kv_heads} heads of {} for the query {qs:?}", kv.shape(), g.head);
        }
    }
    if ctx.input(7)?.size() != 1 {
        bail!("total_sequence_length {:?} must hold one value", ctx.input(7)?.shape());
    }
    let block = node.attr_int("sparse_block_size", 0)?;
    let rotary_on = node.attr_int("do_rotary", 0)? == 1;
    let (layouts, blocks) = check_shapes(ctx, &g, rotary_on)?;
    let rows = ctx.input(3)?.shape()[2];
    // The total is data (a decoder feeds it each step): read on the device, never on the host,
    // so one compiled graph serves every step. A prompt is a run whose total is its length.
    let total = ops::reshape(&ops::astype(ctx.input(7)?, Dtype::I32, s)?, &[1, 1, 1, 1], s)?;
    let mut limit = blocks * block;
    let mut what = format!("the {blocks} blocks of {block} the layouts cover");
    if rows < limit {
        (limit, what) = (rows, format!("the KV buffer's {rows} rows"));
    }
    if rotary_on {
        let cos_rows = ctx.input(9)?.shape()[0];
        if cos_rows < limit {
            (limit, what) = (cos_rows, format!("the cos/sin caches' {cos_rows} rows"));
        }
    }
    ctx.check_range(
        &total,
        g.seq,
        limit,
        format!("total_sequence_length is below the query's {} tokens or past {what}", g.seq),
    )?;
    let prompt = ops::equal(&total, &int(g.seq, s)?, s)?;
    let lengths = ops::astype(ctx.input(8)?, Dtype::I32, s)?;
    let t_b = ops::reshape(&lengths, &[g.batch, 1, 1, 1], s)?;
    // T_b within [1, total], and at least S after a prompt (the new rows follow the past).
    let fits = ops::logical_and(
        &ops::logical_and(&ops::greater_equal(&t_b, &int(1, s)?, s)?, &ops::less_equal(&t_b, &total, s)?, s)?,
        &ops::logical_or(&prompt, &ops::greater_equal(&t_b, &int(g.seq, s)?, s)?, s)?,
        s,
    )?;
    ctx.check(
        &fits,
        format!(
            "a key_total_sequence_lengths entry is outside [1, total_sequence_length] (or below the query's {} \
             tokens after a prompt)",
            g.seq
        ),
    )?;
    let zero = int(0, s)?;
    // (Clamped: a failed check must still build a memory-safe graph.)
    let past_b = ops::where_(&prompt, &zero, &ops::subtract(&t_b, &int(g.seq, s)?, s)?, s)?;
    let past_b = ops::clip(&past_b, Some(&zero), Some(&int(rows - g.seq, s)?), s)?;
    let positions = ops::add(&past_b, &iota(g.seq, 2, s)?, s)?; // [B, 1, S, 1]

    let to_heads = |a: &Array, n: i64| heads::split(a, n, s);
    let (q, k, v) = if packed {
        let all = to_heads(&query, width)?;
        let mut p = heads::parts(&all, &[heads, kv_heads, kv_heads], 1, false, s)?.into_iter();
        match (p.next(), p.next(), p.next()) {
            (Some(q), Some(k), Some(v)) => (q, k, v),
            _ => bail!("the packed heads did not split in three"),
        }
    } else {
        (to_heads(&query, heads)?, to_heads(ctx.input(1)?, kv_heads)?, to_heads(ctx.input(2)?, kv_heads)?)
    };
    let (q, k) = if rotary_on {
        let interleaved = node.attr_int("rotary_interleaved", 0)? == 1;
        let flat = ops::reshape(&positions, &[g.batch, g.seq], s)?;
        let (cos_cache, sin_cache) = (ctx.input(9)?.clone(), ctx.input(10)?.clone());
        let (cos, sin) = rotary::angles(ctx, &cos_cache, &sin_cache, &flat, s)?;
        let turn = |x: &Array| rotary::rotate(x, &cos, &sin, interleaved, false, s);
        (turn(&q)?, turn(&k)?)
    } else {
        (q, k)
    };

    // The buffer with rows [past_b, past_b + S) replaced by the new ones.
    let buffer_rows = iota(rows, 2, s)?;
    let offset = ops::subtract(&buffer_rows, &past_b, s)?;
    let inside =
        ops::logical_and(&ops::greater_equal(&offset, &int(0, s)?, s)?, &ops::less(&offset, &int(g.seq, s)?, s)?, s)?;
    let source = ops::broadcast_to(
        &ops::clip(&offset, Some(&int(0, s)?), Some(&int(g.seq - 1, s)?), s)?,
        &[g.batch, kv_heads, rows, g.head],
        s,
    )?;
    let present = |past: &Array, new: &Array| -> Result<Array> {
        Ok(ops::where_(&inside, &ops::take_along_axis(new, &source, 2, s)?, past, s)?)
    };
    let (present_k, present_v) = (present(ctx.input(3)?, &k)?, present(ctx.input(4)?, &v)?);
    // Bound to past's buffer (as ORT runs this op): only the new rows are written into it.
    let starts = ops::reshape(&past_b, &[g.batch], s)?;
    ctx.write_rows_at(3, &k, &starts, 2, 1)?;
    ctx.write_rows_at(4, &v, &starts, 2, 2)?;

    // Keys seen: causal and within T_b; of those, the ones the layout lists.
    let keys = iota(rows, 3, s)?;
    let seen = ops::logical_and(&ops::less_equal(&keys, &positions, s)?, &ops::less(&keys, &t_b, s)?, s)?;
    let table = block_table(ctx, layouts, blocks, s)?;
    let layout_of = ops::remainder(&ops::arange(0.0, heads as f64, 1.0, Dtype::I32, s)?, &int(layouts, s)?, s)?;
    let by_head = ops::take(&table, &layout_of, 0, s)?; // [N, R, R]
    let last = int(blocks - 1, s)?;
    let query_block = ops::clip(&ops::floor_divide(&positions, &int(block, s)?, s)?, Some(&zero), Some(&last), s)?;
    let picked = ops::take(&by_head, &ops::flatten(&query_block, s)?, 1, s)?; // [N, B * S, R]
    let picked = ops::transpose_axes(&ops::reshape(&picked, &[heads, g.batch, g.seq, blocks], s)?, &[1, 0, 2, 3], s)?;
    let key_block = ops::clip(
        &ops::floor_divide(&ops::arange(0.0, rows as f64, 1.0, Dtype::I32, s)?, &int(block, s)?, s)?,
        Some(&zero),
        Some(&last),
        s,
    )?;
    let listed = ops::take(&picked, &key_block, 3, s)?; // [B, N, S, M]

    let scale = match node.attr_float("scale", 0.0)? {
        x if x != 0.0 => x,
        _ => 1.0 / (g.head as f32).sqrt(),
    };
    let f32 = |a: &Array| -> Result<Array> { Ok(ops::astype(a, Dtype::F32, s)?) };
    let (qf, kf, vf) = (f32(&q)?, f32(&present_k)?, f32(&present_v)?);
    // Each KV head's query heads as one block of rows (query head h reads KV head h / reps).
    let reps = heads / kv_heads;
    let grouped = |last: i64| [g.batch, kv_heads, reps * g.seq, last];
    let per_head = |last: i64| [g.batch, heads, g.seq, last];
    let raw = ops::matmul(&ops::reshape(&qf, &grouped(g.head), s)?, &ops::transpose_axes(&kf, &[0, 1, 3, 2], s)?, s)?;
    let scores = ops::scale(&ops::reshape(&raw, &per_head(rows), s)?, scale, s)?;
    let lowest = ops::scalar(f32::MIN as f64, Dtype::F32, s)?;
    let scores = ops::where_(&listed, &scores, &lowest, s)?;
    let scores = ops::where_(&seen, &scores, &ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?, s)?;
    let probs = ops::softmax(&scores, -1, s)?;
    let y = ops::matmul(&ops::reshape(&probs, &grouped(rows), s)?, &vf, s)?;
    let y = ops::reshape(&y, &per_head(g.head), s)?;
    Ok(vec![ops::astype(&heads::merge(&y, s)?, dtype, s)?, present_k, present_v])
}

ep_core::register_lowering!(
    SPARSE_ATTENTION = FnLowering {
        domain: "com.microsoft",
        op: "SparseAttention",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);
