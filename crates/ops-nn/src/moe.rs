//! `com.microsoft` MoE and QMoE: a mixture of experts, as ORT's CPU kernels compute it.
//!
//! Each row of `input` (`[T, H]` or `[B, S, H]`) goes to `k` experts picked from its router
//! logits (`router_probs`, `[T, E]`); an expert is `fc2(act(fc1(x)))`, its weights `[E, out, in]`
//! (each product `x @ W^T`) with optional biases `[E, out]`, and the row's output is the sum of
//! its experts' outputs times their routing weights.
//! - Routing. MoE: a softmax over all experts, the `k` largest probabilities (a tie goes to the
//!   higher expert index) as weights, divided by their sum with `normalize_routing_weights`.
//!   QMoE: the `k` largest logits, their own softmax as weights (or, given `router_weights`,
//!   those weights of the picked experts, normalized on request). A weight that is not above
//!   zero (QMoE: 1e-8), NaN included, drops its expert.
//! - Activations: relu, gelu (tanh form), silu, identity, and swiglu over interleaved columns
//!   (`swiglu_fusion=1`: column `2i` the gate, `2i + 1` the linear part):
//!   `g * sigmoid(alpha * g) * (l + beta)`, `g` clipped above and `l` on both sides at
//!   `swiglu_limit`.
//! - Precision. MoE float16: each product, bias and activation rounded to float16, the weighted
//!   sum in float32 and rounded once. QMoE: weights dequantized once per session as
//!   `(q - zero_point) * scale` (2, 4 or 8 bits packed low bits first, scales per row or per
//!   `block_size` block, zero points packed likewise, default `2^(bits - 1)`), everything in
//!   float32, rounded once.
//!
//! Each token's products read only its experts' matrices (MLX's gathered matmul, in float32,
//! which its CPU kernel requires; float16 products are rounded after it). The fc3
//! gate, which ORT's CPU kernels refuse too, is declined; `use_sparse_mixer` (k = 2) routes as
//! plain top-k, as ORT's CPU kernel does.

use crate::norm::f32_of;
use ep_core::activation::Activation;
use ep_core::lowering::{FnLowering, input_rank, require_constant, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

const MS: &str = "com.microsoft";
const TYPES: &[ElemType] = &[ElemType::F32, ElemType::F16];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Act {
    /// relu, gelu (tanh form), silu, identity.
    Plain(Activation),
    SwiGlu {
        alpha: f32,
        beta: f32,
        limit: f32,
    },
}

/// The node's attributes: `(k, activation, normalize)`.
fn attrs(node: &NodeInfo) -> std::result::Result<(i64, Act, bool), String> {
    let k = node.attr_int("k", 1)?;
    if k < 1 {
        return Err(format!("k is {k}; it must be at least 1"));
    }
    let name = match node.attr("activation_type") {
        None => "relu",
        Some(AttrValue::String(v)) => v.as_str(),
        Some(other) => return Err(format!("attribute 'activation_type' should be a string, found {other:?}")),
    };
    let act = match name {
        "relu" => Act::Plain(Activation::Relu),
        "gelu" => Act::Plain(Activation::GeluTanh),
        "silu" => Act::Plain(Activation::Silu),
        "identity" => Act::Plain(Activation::Identity),
        "swiglu" => {
            if node.attr_int("swiglu_fusion", 0)? != 1 {
                return Err(
                    "swiglu needs swiglu_fusion=1 (interleaved gate and linear columns), as ORT's CPU kernel does"
                        .into(),
                );
            }
            Act::SwiGlu {
                alpha: node.attr_float("activation_alpha", 1.0)?,
                beta: node.attr_float("activation_beta", 0.0)?,
                limit: node.attr_float("swiglu_limit", f32::INFINITY)?,
            }
        }
        other => return Err(format!("activation_type '{other}' is not relu, gelu, silu, identity or swiglu")),
    };
    if node.attr_int("use_sparse_mixer", 0)? != 0 && k != 2 {
        return Err(format!("use_sparse_mixer needs k=2, not {k}"));
    }
    // (ORT's kernels normalize for the value 1 only.)
    Ok((k, act, node.attr_int("normalize_routing_weights", 0)? == 1))
}

/// The input slots: MoE's fc1/fc2 weights and biases and its fc3 ones; QMoE's likewise.
struct Slots {
    fc1: usize,
    fc1_bias: usize,
    fc2: usize,
    fc2_bias: usize,
    fc3: &'static [usize],
}

const MOE_SLOTS: Slots = Slots { fc1: 2, fc1_bias: 3, fc2: 4, fc2_bias: 5, fc3: &[6, 7] };
const QMOE_SLOTS: Slots = Slots { fc1: 2, fc1_bias: 4, fc2: 5, fc2_bias: 7, fc3: &[8, 9, 10, 13] };

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let q = node.op_type == "QMoE";
    let slots = if q { &QMOE_SLOTS } else { &MOE_SLOTS };
    if q {
        require_inputs(node, 3, 21)?;
        require_present(node, &[(3, "fc1_scales"), (5, "fc2_experts_weights"), (6, "fc2_scales")])?;
        if node.inputs.len() > 15 && node.inputs[15..].iter().any(Option::is_some) {
            return Err(Decline::new("the FP4/FP8 scale inputs (15 on) are not supported"));
        }
        for i in [2, 5, 11, 12] {
            require_input_type(node, i, &[ElemType::U8])?;
        }
        for i in [0, 1, 3, 4, 6, 7, 14] {
            require_input_type(node, i, TYPES)?;
        }
        let bits = node.attr_int("expert_weight_bits", 4)?;
        for fc in ["fc1_expert_weight_bits", "fc2_expert_weight_bits"] {
            if node.attr_int(fc, bits)? != bits {
                return Err(Decline(format!("{fc} differs from expert_weight_bits ({bits})")));
            }
        }
        if ![2, 4, 8].contains(&bits) {
            return Err(Decline(format!("expert_weight_bits {bits} is not 2, 4 or 8")));
        }
        for (i, what) in [(2, "fc1_experts_weights"), (3, "fc1_scales"), (5, "fc2_experts_weights"), (6, "fc2_scales")]
        {
            require_constant(node, i, what)?;
        }
        for (i, what) in [(11, "fc1_zero_points"), (12, "fc2_zero_points")] {
            if node.input(i).is_some() {
                require_constant(node, i, what)?;
            }
        }
        let block = node.attr_int("block_size", 0)?;
        if block != 0 && (block < 16 || block & (block - 1) != 0) {
            return Err(Decline(format!("block_size {block} is not a power of two of at least 16")));
        }
    } else {
        require_inputs(node, 3, 8)?;
        require_present(node, &[(4, "fc2_experts_weights")])?;
        for i in 0..node.inputs.len() {
            require_input_type(node, i, TYPES)?;
        }
    }
    if slots.fc3.iter().any(|&i| node.input(i).is_some()) {
        return Err(Decline::new("the fc3 gate is not supported (nor by ORT's CPU kernel)"));
    }
    if let Some(r) = input_rank(node, 0)
        && !(r == 2 || r == 3)
    {
        return Err(Decline(format!("the input has rank {r}; [T, H] or [B, S, H] expected")));
    }
    attrs(node).map(|_| ()).map_err(Decline)
}

fn require_present(node: &NodeInfo, inputs: &[(usize, &str)]) -> std::result::Result<(), Decline> {
    match inputs.iter().find(|(i, _)| node.input(*i).is_none()) {
        Some((i, what)) => Err(Decline(format!("the required input {i} ({what}) is missing"))),
        None => Ok(()),
    }
}

/// The `k` largest of each row of `scores` (`[T, E]`, float32), largest first, a tie going to
/// the higher index: `(indices [T, k] uint32, values [T, k])`.
fn top_k(scores: &Array, k: i64, s: &Stream) -> Result<(Array, Array)> {
    let e = scores.shape()[1];
    let reversed = ops::arange((e - 1) as f64, -1.0, -1.0, Dtype::U32, s)?;
    let columns = ops::reshape(&ops::arange(0.0, e as f64, 1.0, Dtype::U32, s)?, &[1, e], s)?;
    let last = ops::scalar((e - 1) as f64, Dtype::U32, s)?;
    // Ranked by (not taken, score): a taken expert sorts below every other, even one whose
    // score is -inf, so the k picks are distinct.
    let mut free = ops::full(&scores.shape(), &ops::scalar(1.0, Dtype::F32, s)?, Dtype::F32, s)?;
    let (mut picks, mut values) = (Vec::new(), Vec::new());
    for _ in 0..k {
        // Among the free experts the best score, then the last of its ties: the first maximum
        // of the reversed row is the last one of the row.
        let candidates = ops::where_(
            &ops::greater(&free, &ops::scalar(0.0, Dtype::F32, s)?, s)?,
            scores,
            &ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?,
            s,
        )?;
        let best = ops::max_axes(&candidates, &[1], true, s)?;
        let is_best = ops::logical_and(
            &ops::equal(&candidates, &best, s)?,
            &ops::greater(&free, &ops::scalar(0.0, Dtype::F32, s)?, s)?,
            s,
        )?;
        // (2 for the best, 1 for any other free expert, so a row of NaNs still picks a free one.)
        let ranked = ops::add(
            &ops::multiply(&ops::astype(&is_best, Dtype::F32, s)?, &ops::scalar(2.0, Dtype::F32, s)?, s)?,
            &free,
            s,
        )?;
        let at = ops::argmax_axis(&ops::take(&ranked, &reversed, 1, s)?, 1, true, s)?;
        let pick = ops::subtract(&last, &ops::astype(&at, Dtype::U32, s)?, s)?;
        values.push(ops::take_along_axis(scores, &pick, 1, s)?);
        free = ops::where_(&ops::equal(&columns, &pick, s)?, &ops::scalar(0.0, Dtype::F32, s)?, &free, s)?;
        picks.push(pick);
    }
    Ok((ops::concatenate(&picks, 1, s)?, ops::concatenate(&values, 1, s)?))
}

/// `w / sum(w)` per row, 0 where the sum is 0.
fn normalized(w: &Array, s: &Stream) -> Result<Array> {
    let sum = ops::sum_axes(w, &[1], true, s)?;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let safe = ops::where_(&ops::equal(&sum, &zero, s)?, &ops::scalar(1.0, Dtype::F32, s)?, &sum, s)?;
    Ok(ops::where_(&ops::equal(&sum, &zero, s)?, &zero, &ops::divide(w, &safe, s)?, s)?)
}

/// `(experts [T, k], weights [T, k] float32)` for each row.
fn route(ctx: &LowerCtx<'_>, node: &NodeInfo, rows: i64, k: i64, normalize: bool) -> Result<(Array, Array)> {
    let s = ctx.stream();
    let logits = f32_of(ctx.input(1)?, s)?;
    let e = logits.shape().last().copied().unwrap_or(0);
    if logits.shape() != [rows, e] || k > e {
        bail!("router_probs has shape {:?}; [{rows}, E] with E >= k = {k} expected", logits.shape());
    }
    if node.op_type == "QMoE" {
        let (experts, top) = top_k(&logits, k, s)?;
        let weights = match ctx.optional_input(14) {
            Some(given) => {
                if given.shape() != [rows, e] {
                    bail!("router_weights has shape {:?}; [{rows}, {e}] expected", given.shape());
                }
                let w = ops::take_along_axis(&f32_of(given, s)?, &experts, 1, s)?;
                if normalize { normalized(&w, s)? } else { w }
            }
            None => ops::softmax(&top, 1, s)?,
        };
        let keep = ops::greater(&weights, &ops::scalar(1e-8, Dtype::F32, s)?, s)?;
        Ok((experts, ops::where_(&keep, &weights, &ops::scalar(0.0, Dtype::F32, s)?, s)?))
    } else {
        let (experts, top) = top_k(&ops::softmax(&logits, 1, s)?, k, s)?;
        let weights = if normalize { normalized(&top, s)? } else { top };
        let keep = ops::greater(&weights, &ops::scalar(0.0, Dtype::F32, s)?, s)?;
        Ok((experts, ops::where_(&keep, &weights, &ops::scalar(0.0, Dtype::F32, s)?, s)?))
    }
}

/// The activation of `h` (`[.., N]`, float32), `[.., N / 2]` for swiglu.
fn activate(h: &Array, act: Act, s: &Stream) -> Result<Array> {
    let c = |v: f64| ops::scalar(v, Dtype::F32, s);
    Ok(match act {
        Act::Plain(a) => a.apply(h, s)?,
        Act::SwiGlu { alpha, beta, limit } => {
            let shape = h.shape();
            let n = *shape.last().unwrap_or(&0);
            if n % 2 != 0 {
                bail!("swiglu needs an even fc1 width, not {n}");
            }
            let mut pairs = shape[..shape.len() - 1].to_vec();
            pairs.extend([n / 2, 2]);
            let halves = ops::split_at(&ops::reshape(h, &pairs, s)?, &[1], -1, s)?;
            let [gate, lin] = &halves[..] else { bail!("the split gave {} parts", halves.len()) };
            let lim = c(limit as f64)?;
            let gate = ops::minimum(gate, &lim, s)?;
            let lin = ops::clip(lin, Some(&ops::negative(&lim, s)?), Some(&lim), s)?;
            let gated = ops::multiply(&gate, &ops::sigmoid(&ops::multiply(&gate, &c(alpha as f64)?, s)?, s)?, s)?;
            let y = ops::multiply(&gated, &ops::add(&lin, &c(beta as f64)?, s)?, s)?;
            let mut out = shape[..shape.len() - 1].to_vec();
            out.push(n / 2);
            ops::reshape(&y, &out, s)?
        }
    })
}

/// `x` (`[T, k, 1, in]`, or `[T, 1, 1, in]` shared by the row's experts) times each picked
/// expert's matrix of `wt` (float32 `[E, in, out]`), plus its bias: `[T, k, 1, out]` in `x`'s
/// type. (The product is taken in float32, which MLX's gathered matmul requires, and rounded.)
fn expert_product(x: &Array, wt: &Array, bias: Option<&Array>, experts: &Array, s: &Stream) -> Result<Array> {
    let (inner, outer) = (wt.shape()[1], wt.shape()[2]);
    // MLX 0.32.2's CUDA gathered matmul faults on matrices whose sides are not multiples of its
    // tile (an H100 run: `misaligned address`, a CUDA error that poisons the process): there
    // each token's expert matrices are gathered and multiplied as a batch instead.
    let aligned = inner % 32 == 0 && outer % 32 == 0;
    let product = if ep_core::mlx::gpu_forms() && !aligned {
        ops::matmul(&f32_of(x, s)?, &ops::take(wt, experts, 0, s)?, s)?
    } else {
        ops::gather_mm(&f32_of(x, s)?, wt, None, Some(experts), s)?
    };
    let y = ops::astype(&product, x.dtype(), s)?;
    Ok(match bias {
        Some(b) => {
            let picked = ops::take(b, experts, 0, s)?;
            ops::add(&y, &ops::expand_dims(&picked, 2, s)?, s)?
        }
        None => y,
    })
}

/// `wt` is a weight `[E, out, in]` laid out `[E, in, out]` (see [`expert_weights`]).
fn check_weight(name: &str, wt: &Array, e: i64, out: i64, inner: i64) -> Result<()> {
    if wt.shape() != [e, inner, out] {
        let shape = wt.shape();
        bail!(
            "{name} has shape [{}]; [{e}, {out}, {inner}] expected",
            [0, 2, 1].map(|d| shape.get(d).copied().unwrap_or(0)).map(|d| d.to_string()).join(", ")
        );
    }
    Ok(())
}

/// A weight `[E, out, in]` as the gathered products read it: float32 `[E, in, out]`, made once
/// per session for a constant.
fn expert_weights(w: &Array, s: &Stream) -> Result<Array> {
    if w.ndim() != 3 {
        bail!("an expert weight has shape {:?}; [E, out, in] expected", w.shape());
    }
    Ok(ops::contiguous(&ops::transpose_axes(&f32_of(w, s)?, &[0, 2, 1], s)?, s)?)
}

fn check_bias(name: &str, b: Option<&Array>, e: i64, out: i64) -> Result<()> {
    if let Some(b) = b
        && b.shape() != [e, out]
    {
        bail!("{name} has shape {:?}; [{e}, {out}] expected", b.shape());
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (k, act, normalize) = attrs(node).map_err(Error::new)?;
    let q = node.op_type == "QMoE";
    let slots = if q { &QMOE_SLOTS } else { &MOE_SLOTS };
    let x = ctx.input(0)?;
    let (t, shape) = (x.dtype(), x.shape());
    let h = *shape.last().unwrap_or(&0);
    if !(shape.len() == 2 || shape.len() == 3) {
        bail!("the input has shape {shape:?}; [T, H] or [B, S, H] expected");
    }
    let rows: i64 = shape[..shape.len() - 1].iter().product();
    let e = ctx.input(1)?.shape().last().copied().unwrap_or(0);
    let (w1, w2) = if q {
        let zero_points = [11, 12].map(|i| ctx.optional_input(i).is_some());
        let ids: Vec<usize> =
            [2, 3, 5, 6].into_iter().chain([11, 12].into_iter().filter(|&i| ctx.optional_input(i).is_some())).collect();
        let tag = format!(
            "QMoE dequantized bits={} block={} hidden={h} zero_points={zero_points:?}",
            node.attr_int("expert_weight_bits", 4).map_err(Error::new)?,
            node.attr_int("block_size", 0).map_err(Error::new)?
        );
        let w = ctx.derived_many(&ids, &tag, |args, s| {
            dequantize_all(node, args, zero_points, e, h)?.iter().map(|w| expert_weights(w, s)).collect()
        })?;
        let [w1, w2] = &w[..] else { bail!("the dequantized weights have {} parts", w.len()) };
        (w1.clone(), w2.clone())
    } else {
        let tag = "MoE expert weights float32 [E, in, out]";
        (ctx.derived(slots.fc1, tag, expert_weights)?, ctx.derived(slots.fc2, tag, expert_weights)?)
    };
    // (Laid out [E, in, out].)
    let (n1, inter) = (w1.shape().get(2).copied().unwrap_or(0), w2.shape().get(1).copied().unwrap_or(0));
    let fused = if matches!(act, Act::SwiGlu { .. }) { 2 } else { 1 };
    check_weight("fc1_experts_weights", &w1, e, fused * inter, h)?;
    check_weight("fc2_experts_weights", &w2, e, h, inter)?;
    let (b1, b2) = (ctx.optional_input(slots.fc1_bias), ctx.optional_input(slots.fc2_bias));
    check_bias("fc1_experts_bias", b1, e, n1)?;
    check_bias("fc2_experts_bias", b2, e, h)?;
    let (experts, weights) = route(ctx, node, rows, k, normalize)?;
    // MoE float16 rounds each product, bias and activation to float16; QMoE and float32 compute
    // in float32 throughout.
    let compute = if q { Dtype::F32 } else { t };
    let cast = |a: &Array| -> Result<Array> { Ok(ops::astype(a, compute, s)?) };
    let (b1, b2) = (b1.map(cast).transpose()?, b2.map(cast).transpose()?);
    let input = ops::reshape(&cast(x)?, &[rows, 1, 1, h], s)?;
    let hidden = expert_product(&input, &w1, b1.as_ref(), &experts, s)?;
    let hidden = cast(&activate(&f32_of(&hidden, s)?, act, s)?)?;
    let y = expert_product(&hidden, &w2, b2.as_ref(), &experts, s)?;
    // [T, k, 1, H] times [T, k, 1, 1], summed over the experts; a dropped expert (weight 0)
    // adds nothing, whatever its output.
    let w = ops::reshape(&weights, &[rows, k, 1, 1], s)?;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let weighted = ops::where_(&ops::greater(&w, &zero, s)?, &ops::multiply(&f32_of(&y, s)?, &w, s)?, &zero, s)?;
    let out = ops::sum_axes(&weighted, &[1, 2], false, s)?;
    Ok(vec![ops::astype(&ops::reshape(&out, &shape, s)?, t, s)?])
}

/// QMoE's fc1 and fc2 weights, `(q - zero_point) * scale` as float32 `[E, N, K]` (computed on
/// the host from the constants' bytes); `args`: fc1 weights, scales, fc2 weights, scales, then
/// the zero points `present` says are given (fc1's, fc2's).
fn dequantize_all(node: &NodeInfo, args: &[&Array], present: [bool; 2], e: i64, h: i64) -> Result<Vec<Array>> {
    let bits = node.attr_int("expert_weight_bits", 4).map_err(Error::new)? as usize;
    let block = node.attr_int("block_size", 0).map_err(Error::new)?;
    let [w1, s1, w2, s2] = args[..4] else { bail!("{} dequantization inputs", args.len()) };
    let mut rest = args[4..].iter().copied();
    let zp1 = if present[0] { rest.next() } else { None };
    let zp2 = if present[1] { rest.next() } else { None };
    let pack = 8 / bits as i64;
    // fc1 is [E, N1, H / pack]; fc2 [E, H, I / pack].
    let n1 = w1.shape().get(1).copied().unwrap_or(0);
    let inter = w2.shape().get(2).copied().unwrap_or(0) * pack;
    let fc1 = Dequantize { bits, block, e, n: n1, k: h }.run("fc1", w1, s1, zp1)?;
    let fc2 = Dequantize { bits, block, e, n: h, k: inter }.run("fc2", w2, s2, zp2)?;
    Ok(vec![fc1, fc2])
}

struct Dequantize {
    bits: usize,
    block: i64,
    e: i64,
    n: i64,
    k: i64,
}

impl Dequantize {
    /// The `count` values of `bits` each packed low bits first into `bytes`.
    fn unpack(&self, bytes: &[u8], count: usize) -> Vec<u8> {
        let (bits, mask) = (self.bits, ((1u16 << self.bits) - 1) as u8);
        let per = 8 / bits;
        (0..count).map(|i| (bytes.get(i / per).copied().unwrap_or(0) >> ((i % per) * bits)) & mask).collect()
    }

    fn run(&self, name: &str, w: &Array, scales: &Array, zero_points: Option<&Array>) -> Result<Array> {
        let (e, n, k) = (self.e as usize, self.n as usize, self.k as usize);
        if e * n * k == 0 {
            return Ok(Array::from_slice::<f32>(&[], &[self.e, self.n, self.k])?);
        }
        let per = 8 / self.bits;
        let row_bytes = k.div_ceil(per);
        let bytes = w.host_bytes().ok_or_else(|| Error::new(format!("{name} weights are not readable on the host")))?;
        if w.shape() != [self.e, self.n, row_bytes as i64] {
            bail!("{name} weights have shape {:?}; [{e}, {n}, {row_bytes}] expected", w.shape());
        }
        let blocks = if self.block > 0 { k.div_ceil(self.block as usize) } else { 1 };
        let scale = ep_core::quant::host_f32(scales)?;
        if scale.len() != e * n * blocks {
            bail!("{name} scales hold {} values; {} expected ([{e}, {n}, {blocks}])", scale.len(), e * n * blocks);
        }
        let default = (1u32 << (self.bits - 1)) as f32;
        let zeros: Vec<f32> = match zero_points {
            None => vec![default; e * n * blocks],
            Some(z) => {
                let zb = z.host_bytes().ok_or_else(|| Error::new(format!("{name} zero points are not readable")))?;
                if self.block > 0 {
                    // [E, N, ceil(blocks / pack)]: each row's blocks packed on their own.
                    let per_row = blocks.div_ceil(per);
                    if zb.len() != e * n * per_row {
                        bail!("{name} zero points hold {} bytes; {} expected", zb.len(), e * n * per_row);
                    }
                    zb.chunks_exact(per_row).flat_map(|row| self.unpack(row, blocks)).map(f32::from).collect()
                } else {
                    // [E, ceil(N / pack)]: packed across the rows.
                    let per_expert = n.div_ceil(per);
                    if zb.len() != e * per_expert {
                        bail!("{name} zero points hold {} bytes; {} expected", zb.len(), e * per_expert);
                    }
                    zb.chunks_exact(per_expert).flat_map(|row| self.unpack(row, n)).map(f32::from).collect()
                }
            }
        };
        let mut out = Vec::with_capacity(e * n * k);
        for (r, row) in bytes.chunks_exact(row_bytes).enumerate() {
            for (c, q) in self.unpack(row, k).into_iter().enumerate() {
                let g = r * blocks + if self.block > 0 { c / self.block as usize } else { 0 };
                out.push((f32::from(q) - zeros[g]) * scale[g]);
            }
        }
        Ok(Array::from_slice(&out, &[self.e, self.n, self.k])?)
    }
}

ep_core::register_lowering!(
    MOE = FnLowering {
        domain: MS,
        op: "MoE",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    QMOE = FnLowering {
        domain: MS,
        op: "QMoE",
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
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    const ACTIVATIONS: &[&str] = &["relu", "gelu", "silu", "identity", "swiglu"];

    fn unit() -> Values {
        Values::Uniform { lo: -1.0, hi: 1.0 }
    }

    /// The attributes both ops share.
    fn routed(case: Case, k: i64, act: &str, normalize: bool) -> Case {
        let case = case
            .attr_int("k", k)
            .attr_str("activation_type", act)
            .attr_int("normalize_routing_weights", normalize as i64);
        if act == "swiglu" {
            case.attr_int("swiglu_fusion", 1)
                .attr_float("activation_alpha", 1.702)
                .attr_float("activation_beta", 1.0)
                .attr_float("swiglu_limit", 7.0)
        } else {
            case
        }
    }

    /// `(dtype, rows as [T] or [1, T], H, I, E, k, activation, normalize)`.
    #[allow(clippy::type_complexity)]
    fn shapes(
        hidden: &'static [i64],
        inter: &'static [i64],
    ) -> BoxedStrategy<(DType, Vec<i64>, i64, i64, i64, i64, &'static str, bool)> {
        (
            float_dtype(),
            1..=3i64,
            any::<bool>(),
            select(hidden),
            select(inter),
            1..=4i64,
            0..2i64,
            select(ACTIVATIONS),
            any::<bool>(),
        )
            .prop_map(|(t, rows, batched, h, i, e, k, act, normalize)| {
                let lead = if batched { vec![1, rows] } else { vec![rows] };
                (t, lead, h, i, e, 1 + k.min(e - 1), act, normalize)
            })
            .boxed()
    }

    register_spec!(super::MOE, || {
        (shapes(&[2, 4, 8], &[1, 2, 4]), any::<(bool, bool)>(), seed())
            .prop_map(|((t, lead, h, i, e, k, act, normalize), (b1, b2), seed)| {
                let rows: i64 = lead.iter().product();
                let f = if act == "swiglu" { 2 } else { 1 };
                let x = [&lead[..], &[h]].concat();
                let case = Case::domain_op("com.microsoft", "MoE", 1)
                    .input_with("input", t, &x, unit())
                    .input_with("router_probs", t, &[rows, e], Values::Uniform { lo: -2.0, hi: 2.0 })
                    .constant("fc1", t, &[e, f * i, h], unit());
                let case = if b1 { case.constant("fc1_bias", t, &[e, f * i], unit()) } else { case.absent() };
                let case = case.constant("fc2", t, &[e, h, i], unit());
                let case = if b2 { case.constant("fc2_bias", t, &[e, h], unit()) } else { case };
                let case = routed(case, k, act, normalize).output("output", t, &x).with_seed(seed);
                if t == DType::F16 { float32_reference(case) } else { case }
            })
            .boxed()
    });

    /// ORT 1.31's CPU MoE kernel answers zeros for float16 (and for weights that are not
    /// initializers, or an input its output may overwrite): a float16 case is compared with the same MoE in float32, its inputs cast
    /// and its weights float32 copies (within float16's tolerance of the float16 roundings).
    fn float32_reference(case: Case) -> Case {
        let to = |t: DType| vec![("to", Attr::Int(t.onnx_code()))];
        let node = case.nodes[0].clone();
        let mut case = case;
        let mut inputs = Vec::new();
        for name in &node.inputs {
            if name.is_empty() {
                inputs.push(String::new());
                continue;
            }
            let wide = format!("{name}_f32");
            let constant = case.constants.iter().find(|c| &c.name == name).map(|c| c.shape.clone());
            case = match constant {
                Some(shape) => case.reference_constant(&wide, DType::F32, &shape, Values::CopyOf(name.clone())),
                None => case.reference("Cast", &[name], &[&wide], to(DType::F32)),
            };
            inputs.push(wide);
        }
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let attributes = node.attributes.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        // The kernel may write its output over its input's buffer before reading it when that
        // input ends there (a cast's output): the input is kept alive by a later use that
        // waits for the output, `+ x * (0 * output)`.
        case.reference_in("com.microsoft", "MoE", &inputs, &["output_f32"], attributes)
            .reference_constant("zero", DType::F32, &[], Values::Data(vec![0.0]))
            .reference("Mul", &["output_f32", "zero"], &["zeros"], vec![])
            .reference("Mul", &[inputs[0], "zeros"], &["nothing"], vec![])
            .reference("Add", &["output_f32", "nothing"], &["kept"], vec![])
            .reference("Cast", &["kept"], &["output"], to(DType::F16))
    }

    // ORT's CPU kernel runs block-wise 8-bit weights with 8-bit activations (lossy) and 2-bit
    // ones through a lookup-table product: row-wise scales for 8 bits, 4 bits both ways.
    register_spec!(super::QMOE, || {
        (
            shapes(&[16, 32], &[16, 32]),
            prop_oneof![Just((4i64, 0i64)), Just((4, 16)), Just((8, 0))],
            any::<(bool, bool, bool)>(),
            seed(),
        )
            .prop_map(
                |(
                    (t, lead, h, i, e, k, act, normalize),
                    (bits, block),
                    (zero_points, biases, router_weights),
                    seed,
                )| {
                    let rows: i64 = lead.iter().product();
                    let f = if act == "swiglu" { 2 } else { 1 };
                    let pack = 8 / bits;
                    let x = [&lead[..], &[h]].concat();
                    let bytes = Values::Uniform { lo: 0.0, hi: 256.0 };
                    // Weights within about [-0.8, 0.8], whatever the bits.
                    let top = 0.8 / f64::from(1u32 << (bits - 1));
                    let scales = Values::Uniform { lo: top / 10.0, hi: top };
                    // Scales per row, or per block of the inner dimension.
                    let scale_shape = |n: i64, kk: i64| if block > 0 { vec![e, n, kk / block] } else { vec![e, n] };
                    let zp_shape = |n: i64, kk: i64| {
                        if block > 0 {
                            vec![e, n, (kk / block + pack - 1) / pack]
                        } else {
                            vec![e, (n + pack - 1) / pack]
                        }
                    };
                    let case = Case::domain_op("com.microsoft", "QMoE", 1)
                        .input_with("input", t, &x, unit())
                        .input_with("router_probs", t, &[rows, e], Values::Uniform { lo: -2.0, hi: 2.0 })
                        .constant("fc1", DType::U8, &[e, f * i, h / pack], bytes.clone())
                        .constant("fc1_scales", t, &scale_shape(f * i, h), scales.clone());
                    let case = if biases { case.constant("fc1_bias", t, &[e, f * i], unit()) } else { case.absent() };
                    let case = case.constant("fc2", DType::U8, &[e, h, i / pack], bytes.clone()).constant(
                        "fc2_scales",
                        t,
                        &scale_shape(h, i),
                        scales,
                    );
                    let case = if biases { case.constant("fc2_bias", t, &[e, h], unit()) } else { case.absent() };
                    let case = case.absent().absent().absent();
                    let case = if zero_points {
                        case.constant("fc1_zp", DType::U8, &zp_shape(f * i, h), bytes.clone()).constant(
                            "fc2_zp",
                            DType::U8,
                            &zp_shape(h, i),
                            bytes,
                        )
                    } else {
                        case.absent().absent()
                    };
                    let case = if router_weights {
                        case.absent().input_with("router_weights", t, &[rows, e], Values::Uniform { lo: 0.0, hi: 1.0 })
                    } else {
                        case
                    };
                    let case = routed(case, k, act, normalize).attr_int("expert_weight_bits", bits);
                    let case = if block > 0 { case.attr_int("block_size", block) } else { case };
                    case.attr("accuracy_level", Attr::Int(0)).output("output", t, &x).with_seed(seed)
                },
            )
            .boxed()
    });
}
