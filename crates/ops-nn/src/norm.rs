//! Normalizations: LayerNormalization (ONNX 17), RMSNormalization (23), SkipLayerNormalization
//! (`com.microsoft`), InstanceNormalization,
//! GroupNormalization (18 and 21), LpNormalization, MeanVarianceNormalization, and ORT's
//! SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (RMS norms). Statistics are
//! computed in float32 for half types, as ORT's CPU EP does.

use crate::norm_shapes::{self as shapes, Dims, declared, known};
use ep_core::lowering::{FLOATS, FnLowering, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const MS: &str = "com.microsoft";

pub(crate) fn f32_of(x: &Array, s: &Stream) -> Result<Array> {
    Ok(if x.dtype() == Dtype::F64 { x.clone() } else { ops::astype(x, Dtype::F32, s)? })
}

/// Input `i` (a scale or bias) as [`f32_of`] makes it: a constant is converted once per
/// session rather than on every run. (Not a one-element constant: inside a compiled graph
/// the engine rebuilds those exactly, which a converted copy would bypass.)
fn f32_param(ctx: &LowerCtx<'_>, i: usize) -> Result<Array> {
    if ctx.is_constant(i) && ctx.input(i)?.size() > 1 {
        return ctx.derived(i, "as float32", f32_of);
    }
    f32_of(ctx.input(i)?, ctx.stream())
}

/// `(x - mean) / sqrt(var + eps)` over `axes` (kept as size-1 dims), with the mean and
/// `1 / sqrt(var + eps)`.
pub(crate) fn standardize(x: &Array, axes: &[i32], eps: f64, s: &Stream) -> Result<(Array, Array, Array)> {
    let mean = ops::mean_axes(x, axes, true, s)?;
    let centered = ops::subtract(x, &mean, s)?;
    let var = ops::mean_axes(&ops::square(&centered, s)?, axes, true, s)?;
    let inv = ops::rsqrt(&ops::add(&var, &ops::scalar(eps, var.dtype(), s)?, s)?, s)?;
    Ok((ops::multiply(&centered, &inv, s)?, mean, inv))
}

/// The parameters (inputs from 1 on) of a layer norm, by name, as `shape_of` gives them.
fn layer_params(node: &NodeInfo, shape_of: impl Fn(usize) -> Option<Dims>) -> Vec<(&'static str, Option<Dims>)> {
    ["scale", "bias"]
        .into_iter()
        .enumerate()
        .filter(|&(i, _)| i + 1 < node.inputs.len())
        .map(|(i, n)| (n, shape_of(i + 1)))
        .collect()
}

/// The rules of [`shapes::check_layer_norm`] on the declared shapes (input 0 of known rank).
fn claim_layer_shapes(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let Some(x) = declared(node, 0) else { return Ok(()) };
    shapes::claim(shapes::check_layer_norm(&x, node.attr_int("axis", -1)?, &layer_params(node, |i| declared(node, i))))
}

/// The same rules on the runtime shapes.
fn check_layer_shapes(ctx: &LowerCtx<'_>, node: &NodeInfo) -> Result<()> {
    let x = known(&ctx.input(0)?.shape());
    let params = layer_params(node, |i| ctx.optional_input(i).map(|a| known(&a.shape())));
    Ok(shapes::check_layer_norm(&x, node.attr_int("axis", -1)?, &params)?)
}

fn claim_layer_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 3)?;
    for i in 0..3 {
        require_input_type(node, i, FLOATS)?;
    }
    claim_layer_shapes(node)
}

fn lower_layer_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    check_layer_shapes(ctx, node)?;
    let x = ctx.input(0)?;
    let s = ctx.stream();
    let r = x.ndim();
    let axis = normalize_axis(node.attr_int("axis", -1)?, r)?;
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    let axes: Vec<i32> = (axis as i32..r as i32).collect();
    let (y, mean, inv) = standardize(&f32_of(x, s)?, &axes, eps, s)?;
    let mut y = ops::multiply(&y, &f32_param(ctx, 1)?, s)?;
    if ctx.optional_input(2).is_some() {
        y = ops::add(&y, &f32_param(ctx, 2)?, s)?;
    }
    let mut outs = vec![ops::astype(&y, x.dtype(), s)?];
    // Mean and InvStdDev, when asked for, in their declared type.
    for (i, stat) in [(1, mean), (2, inv)] {
        if let Some(o) = node.output(i) {
            let t = o.elem_type.and_then(ElemType::to_mlx).unwrap_or(Dtype::F32);
            outs.push(ops::astype(&stat, t, s)?);
        } else if i < node.outputs.len() {
            outs.push(stat);
        }
    }
    Ok(outs)
}

ep_core::register_lowering!(
    LAYER_NORM = FnLowering {
        domain: "",
        op: "LayerNormalization",
        opsets: 17..=i32::MAX,
        claim: claim_layer_norm,
        lower: lower_layer_norm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

/// `x * scale / sqrt(mean(x^2) + eps)` over `axes` in float32 (no scale: 1), and the inverse
/// RMS. On GPUs, over the last axis with a per-feature scale (every LLM's norm), the result is
/// MLX's fused RMS norm, the same formula in one kernel (on the CPU MLX only falls back to
/// these same operations, measured slower inside compiled graphs); the inverse RMS is built
/// apart and computed only when it is an output.
pub(crate) fn rms_normalize(
    x: &Array,
    scale: Option<&Array>,
    axes: &[i32],
    eps: f64,
    s: &Stream,
) -> Result<(Array, Array)> {
    let w = f32_of(x, s)?;
    let ms = ops::mean_axes(&ops::square(&w, s)?, axes, true, s)?;
    let inv = ops::rsqrt(&ops::add(&ms, &ops::scalar(eps, ms.dtype(), s)?, s)?, s)?;
    let shape = x.shape();
    let last = shape.len() as i32 - 1;
    // (Not on empty inputs or a size-1 last axis: MLX 0.32.2's CPU fallback then reduces over
    // it, which crashes; see the reductions' wrappers.)
    let fused = ep_core::mlx::gpu_forms()
        && !shape.is_empty()
        && x.size() > 0
        && shape[shape.len() - 1] > 1
        && (axes == [-1] || axes == [last])
        && scale.is_some_and(|k| k.ndim() == 1 && k.shape()[0] == shape[shape.len() - 1]);
    let y = match scale {
        Some(k) if fused => ops::rms_norm(&w, &f32_of(k, s)?, eps as f32, s)?,
        Some(k) => ops::multiply(&ops::multiply(&w, &inv, s)?, &f32_of(k, s)?, s)?,
        None => ops::multiply(&w, &inv, s)?,
    };
    Ok((y, inv))
}

/// On a GPU, the RMS norm of a half-type `x` over its last axis with a scale of its type
/// (every half-precision LLM's norm) as MLX's fused kernel in that type: it accumulates in
/// float32 and rounds the normalized value before the scale, within a unit in the last place
/// of ORT's float32 computation, and it saves the two conversions on each side (on a GPU each
/// is a kernel launch with host work on every run). `None` where that form does not apply.
fn half_rms(x: &Array, scale: &Array, eps: f64, s: &Stream) -> Result<Option<Array>> {
    let shape = x.shape();
    let half = matches!(x.dtype(), Dtype::F16 | Dtype::BF16) && scale.dtype() == x.dtype();
    let fits = shape.len() >= 2
        && x.size() > 0
        && shape[shape.len() - 1] > 1
        && scale.ndim() == 1
        && scale.shape()[0] == shape[shape.len() - 1];
    if !(half && fits && ep_core::mlx::gpu_forms()) {
        return Ok(None);
    }
    Ok(Some(ops::rms_norm(x, scale, eps as f32, s)?))
}

/// The RMS norm of input 0 over the axes from `axis` on, scaled by input 1.
fn rms_of_inputs(ctx: &LowerCtx<'_>, node: &NodeInfo) -> Result<(Array, Array)> {
    check_layer_shapes(ctx, node)?;
    let x = ctx.input(0)?;
    let r = x.ndim();
    let axis = normalize_axis(node.attr_int("axis", -1)?, r)?;
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    let axes: Vec<i32> = (axis as i32..r as i32).collect();
    rms_normalize(x, Some(&f32_param(ctx, 1)?), &axes, eps, ctx.stream())
}

fn claim_rms_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    for i in 0..2 {
        require_input_type(node, i, FLOATS)?;
    }
    claim_layer_shapes(node)
}

/// `x / sqrt(mean(x^2) + eps) * scale` over the axes from `axis` on.
fn lower_rms_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (y, _) = rms_of_inputs(ctx, node)?;
    Ok(vec![ops::astype(&y, ctx.input(0)?.dtype(), ctx.stream())?])
}

ep_core::register_lowering!(
    RMS_NORM = FnLowering {
        domain: "",
        op: "RMSNormalization",
        opsets: 23..=i32::MAX,
        claim: claim_rms_norm,
        lower: lower_rms_norm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

/// ORT's SimplifiedLayerNormalization (ONNX domain, opset 1): the RMS norm, with its
/// inverse-RMS output when asked for.
fn lower_simplified_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let last = node.attr_int("axis", -1)? == -1 || node.attr_int("axis", -1)? == ctx.input(0)?.ndim() as i64 - 1;
    if node.outputs.len() < 2 && last {
        check_layer_shapes(ctx, node)?;
        let eps = node.attr_float("epsilon", 1e-5)? as f64;
        if let Some(y) = half_rms(ctx.input(0)?, ctx.input(1)?, eps, ctx.stream())? {
            return Ok(vec![y]);
        }
    }
    let (y, inv) = rms_of_inputs(ctx, node)?;
    let mut outs = vec![ops::astype(&y, ctx.input(0)?.dtype(), ctx.stream())?];
    if node.outputs.len() > 1 {
        outs.push(inv);
    }
    Ok(outs)
}

ep_core::register_lowering!(
    SIMPLIFIED_LAYER_NORM = FnLowering {
        domain: "",
        op: "SimplifiedLayerNormalization",
        opsets: 1..=22,
        claim: claim_rms_norm,
        lower: lower_simplified_norm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

/// `RMSNorm(input + skip + bias) * gamma` over the last axis; outputs: the result, (unused
/// mean), the inverse RMS, and the sum `input + skip + bias`.
fn lower_skip_simplified_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    check_skip_shapes(ctx, node)?;
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let eps = node.attr_float("epsilon", 1e-12)? as f64;
    // Half types on a GPU: the sum in the half type (ORT's sum output, which it rounds from
    // float32: the same but for a rare double-rounding tie) normalized by the fused kernel.
    let wants_stats = node.output(1).is_some() || node.output(2).is_some();
    if !wants_stats && ctx.optional_input(3).is_none() && skip_input(ctx)?.dtype() == x.dtype() {
        let sum = ops::add(x, &skip_input(ctx)?, s)?;
        if let Some(y) = half_rms(&sum, ctx.input(2)?, eps, s)? {
            let unused = ops::scalar(0.0, Dtype::F32, s)?;
            return Ok(vec![y, unused.clone(), unused, sum]);
        }
    }
    // The sum in float32, as ORT's kernel normalizes it (its sum output is rounded apart).
    let mut sum = ops::add(&f32_of(x, s)?, &f32_of(&skip_input(ctx)?, s)?, s)?;
    if ctx.optional_input(3).is_some() {
        sum = ops::add(&sum, &f32_param(ctx, 3)?, s)?;
    }
    let (y, inv) = rms_normalize(&sum, Some(&f32_param(ctx, 2)?), &[-1], eps, s)?;
    let sum = ops::astype(&sum, x.dtype(), s)?;
    let unused_mean = ops::multiply(&inv, &ops::scalar(0.0, Dtype::F32, s)?, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?, unused_mean, inv, sum])
}

/// The 1-D parameters of a skip norm (inputs from 2 on), by name, as `shape_of` gives them.
fn skip_vectors(node: &NodeInfo, shape_of: impl Fn(usize) -> Option<Dims>) -> Vec<(&'static str, Option<Dims>)> {
    let names: &[&'static str] =
        if node.op_type == "SkipLayerNormalization" { &["gamma", "beta", "bias"] } else { &["gamma", "bias"] };
    names.iter().enumerate().map(|(i, &n)| (n, shape_of(i + 2))).collect()
}

/// The rules of [`shapes::check_skip_norm`] on the declared shapes, and ORT's `epsilon >= 0`.
fn claim_skip_shapes(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let eps = node.attr_float("epsilon", 1e-12)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(Decline(format!("epsilon {eps} is negative")));
    }
    let Some(x) = declared(node, 0) else { return Ok(()) };
    let skip = declared(node, 1);
    // A skip with an empty batch (the input's is not) stays claimed and is refused when the
    // node runs: ORT's CPU kernel divides by its size (declined, it would crash the process).
    if x.len() == 3 && x[0] != Some(0) && skip.as_ref().is_some_and(|sk| sk.len() == 3 && sk[0] == Some(0)) {
        return Ok(());
    }
    shapes::claim(shapes::check_skip_norm(&x, skip.as_ref(), &skip_vectors(node, |i| declared(node, i))))
}

/// The skip input, batch `b` of the input taking batch `b % k` of a 3-D skip of `k` batches, as
/// ORT's kernel reads it (an index modulo the skip's size); a skip of the input's batch or of
/// one batch broadcasts as it is.
fn skip_input(ctx: &LowerCtx<'_>) -> Result<Array> {
    let (x, skip) = (ctx.input(0)?, ctx.input(1)?);
    let (xs, ks) = (x.shape(), skip.shape());
    if xs.len() != 3 || ks.len() != 3 || ks[0] == 1 || ks[0] == xs[0] {
        return Ok(skip.clone());
    }
    if ctx.shapeless() {
        // A shapeless replay would keep these rows for other batch sizes.
        bail!("a skip of {} batches for an input of {} is read cyclically, which needs exact shapes", ks[0], xs[0]);
    }
    let rows: Vec<i64> = (0..xs[0]).map(|b| b % ks[0]).collect();
    Ok(ops::take(skip, &Array::from_slice(&rows, &[xs[0]])?, 0, ctx.stream())?)
}

/// The same rules on the runtime shapes.
fn check_skip_shapes(ctx: &LowerCtx<'_>, node: &NodeInfo) -> Result<()> {
    let x = known(&ctx.input(0)?.shape());
    let skip = known(&ctx.input(1)?.shape());
    let vectors = skip_vectors(node, |i| ctx.optional_input(i).map(|a| known(&a.shape())));
    Ok(shapes::check_skip_norm(&x, Some(&skip), &vectors)?)
}

fn claim_skip_simplified_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 4)?;
    for i in 0..4 {
        require_input_type(node, i, FLOATS)?;
    }
    if node.output(1).is_some() {
        return Err(Decline::new("the mean output of SkipSimplifiedLayerNormalization is not defined"));
    }
    claim_skip_shapes(node)
}

ep_core::register_lowering!(
    SKIP_SIMPLIFIED_LAYER_NORM = FnLowering {
        domain: MS,
        op: "SkipSimplifiedLayerNormalization",
        opsets: 1..=i32::MAX,
        claim: claim_skip_simplified_norm,
        lower: lower_skip_simplified_norm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn claim_skip_layer_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 5)?;
    for i in 0..5 {
        require_input_type(node, i, FLOATS)?;
    }
    claim_skip_shapes(node)
}

/// `LayerNorm(input + skip + bias)` over the last axis; outputs: the result, the mean and
/// inverse standard deviation (float32), and the sum `input + skip + bias`.
fn lower_skip_layer_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    check_skip_shapes(ctx, node)?;
    let s = ctx.stream();
    let x = ctx.input(0)?;
    // The sum in float32, as ORT's kernel normalizes it (its sum output is rounded apart).
    let mut sum = ops::add(&f32_of(x, s)?, &f32_of(&skip_input(ctx)?, s)?, s)?;
    if ctx.optional_input(4).is_some() {
        sum = ops::add(&sum, &f32_param(ctx, 4)?, s)?;
    }
    let eps = node.attr_float("epsilon", 1e-12)? as f64;
    let (y, mean, inv) = standardize(&sum, &[-1], eps, s)?;
    let sum = ops::astype(&sum, x.dtype(), s)?;
    let mut y = ops::multiply(&y, &f32_param(ctx, 2)?, s)?;
    if ctx.optional_input(3).is_some() {
        y = ops::add(&y, &f32_param(ctx, 3)?, s)?;
    }
    Ok(vec![ops::astype(&y, x.dtype(), s)?, mean, inv, sum])
}

ep_core::register_lowering!(
    SKIP_LAYER_NORM = FnLowering {
        domain: MS,
        op: "SkipLayerNormalization",
        opsets: 1..=i32::MAX,
        claim: claim_skip_layer_norm,
        lower: lower_skip_layer_norm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

/// `[1, C, 1, ...]`: a per-channel parameter shaped to broadcast along axis 1 of rank `r`.
pub(crate) fn per_channel(p: &Array, r: usize, s: &Stream) -> Result<Array> {
    let mut shape = vec![1i64; r];
    if r > 1 {
        shape[1] = p.size() as i64;
    } else {
        shape[0] = p.size() as i64;
    }
    Ok(ops::reshape(&f32_of(p, s)?, &shape, s)?)
}

/// Inputs `params` of a per-channel norm must each be 1-D of the input's channel count (as
/// ORT's CPU EP requires; broadcasting another shape would answer what it refuses).
pub(crate) fn check_channel_params(ctx: &LowerCtx<'_>, params: std::ops::Range<usize>) -> Result<()> {
    let xs = ctx.input(0)?.shape();
    let c = if xs.len() > 1 { xs[1] } else { xs.first().copied().unwrap_or(1) };
    for i in params {
        let p = ctx.input(i)?;
        if p.ndim() != 1 || p.shape()[0] != c {
            bail!("input {i} {:?} must be a 1-D tensor of the {c} channels of the input {xs:?}", p.shape());
        }
    }
    Ok(())
}

fn claim_instance_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    for i in 0..3 {
        require_input_type(node, i, FLOATS)?;
    }
    if ep_core::lowering::input_rank(node, 0).is_some_and(|r| r < 3) {
        return Err(Decline::new("InstanceNormalization needs rank 3 or more"));
    }
    Ok(())
}

/// `x * a + (bias - mean * a)` with `a = scale / sqrt(var + eps)` per instance and channel, as
/// ORT's CPU EP computes it (so an infinite scale gives its NaN, not an infinity).
fn lower_instance_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream();
    let r = x.ndim();
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    check_channel_params(ctx, 1..3)?;
    let axes: Vec<i32> = (2..r as i32).collect();
    let w = f32_of(x, s)?;
    let (_, mean, inv) = standardize(&w, &axes, eps, s)?;
    let a = ops::multiply(&inv, &per_channel(ctx.input(1)?, r, s)?, s)?;
    let b = ops::subtract(&per_channel(ctx.input(2)?, r, s)?, &ops::multiply(&mean, &a, s)?, s)?;
    let y = ops::add(&ops::multiply(&w, &a, s)?, &b, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?])
}

ep_core::register_lowering!(
    INSTANCE_NORM = FnLowering {
        domain: "",
        op: "InstanceNormalization",
        opsets: 6..=i32::MAX,
        claim: claim_instance_norm,
        lower: lower_instance_norm,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

/// Scale and bias per channel from opset 21 on, per group before.
fn group_params_per_channel(node: &NodeInfo) -> bool {
    node.since_version >= 21
}

fn claim_group_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_instance_norm(node)?;
    let Some(x) = declared(node, 0) else { return Ok(()) };
    let params = [("scale", declared(node, 1)), ("bias", declared(node, 2))];
    let (g, by_channel) = (node.attr_int("num_groups", 0)?, group_params_per_channel(node));
    shapes::claim(shapes::check_group_norm(&x, g, by_channel, &params))
}

fn lower_group_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream();
    let shape = x.shape();
    let r = shape.len();
    let g = node.attr_int("num_groups", 0)?;
    let by_channel = group_params_per_channel(node);
    let params = [("scale", Some(known(&ctx.input(1)?.shape()))), ("bias", Some(known(&ctx.input(2)?.shape())))];
    shapes::check_group_norm(&known(&shape), g, by_channel, &params)?;
    let (n, c) = (shape[0], shape[1]);
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    let grouped = ops::reshape(&f32_of(x, s)?, &[n, g, -1], s)?;
    let (y, _, _) = standardize(&grouped, &[2], eps, s)?;
    let y = ops::reshape(&y, &shape, s)?;
    let (scale, bias) = (ctx.input(1)?, ctx.input(2)?);
    let (scale, bias) = if by_channel {
        (per_channel(scale, r, s)?, per_channel(bias, r, s)?)
    } else {
        let rep = |p: &Array| -> Result<Array> {
            let p = ops::reshape(&f32_of(p, s)?, &[g, 1], s)?;
            let p = ops::reshape(&ops::broadcast_to(&p, &[g, c / g], s)?, &[c], s)?;
            per_channel(&p, r, s)
        };
        (rep(scale)?, rep(bias)?)
    };
    let y = ops::add(&ops::multiply(&y, &scale, s)?, &bias, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?])
}

ep_core::register_lowering!(
    GROUP_NORM = FnLowering {
        domain: "",
        op: "GroupNormalization",
        opsets: 18..=i32::MAX,
        claim: claim_group_norm,
        lower: lower_group_norm,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_mvn(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, FLOATS)?;
    // ORT's CPU EP computes MVN for 4-D [N, C, H, W] layouts: other ranks are left to it (its
    // answer there is its own).
    if ep_core::lowering::input_rank(node, 0).is_some_and(|r| r != 4) {
        return Err(Decline::new("MeanVarianceNormalization runs here on 4-D inputs"));
    }
    Ok(())
}

/// `(x - mean) / sqrt(var)` over `axes` (default `[0, 2, 3]`), as ORT's CPU kernel computes it
/// (without the 1e-9 of ONNX's function body: a constant input gives its NaN).
fn lower_mvn(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream();
    let r = x.ndim();
    if r != 4 {
        ep_core::bail!("MeanVarianceNormalization needs a 4-D input here; it was fed {:?}", x.shape());
    }
    let axes: Vec<i32> = match node.attr_ints("axes")? {
        Some(a) => a.iter().map(|&a| normalize_axis(a, r).map(|a| a as i32)).collect::<std::result::Result<_, _>>()?,
        None => vec![0, 2, 3],
    };
    if axes.is_empty() {
        // (ORT's CPU EP refuses it too: "No valid axes are specified".)
        ep_core::bail!("MeanVarianceNormalization needs at least one axis; `axes` is empty");
    }
    let w = f32_of(x, s)?;
    let mean = ops::mean_axes(&w, &axes, true, s)?;
    let centered = ops::subtract(&w, &mean, s)?;
    let var = ops::mean_axes(&ops::square(&centered, s)?, &axes, true, s)?;
    Ok(vec![ops::astype(&ops::divide(&centered, &ops::sqrt(&var, s)?, s)?, x.dtype(), s)?])
}

ep_core::register_lowering!(
    MVN = FnLowering {
        domain: "",
        op: "MeanVarianceNormalization",
        opsets: 9..=i32::MAX,
        claim: claim_mvn,
        lower: lower_mvn,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn claim_lp_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, FLOATS)?;
    match node.attr_int("p", 2)? {
        1 | 2 => Ok(()),
        p => Err(Decline(format!("p={p} is not 1 or 2"))),
    }
}

fn lower_lp_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream();
    if x.ndim() == 0 {
        bail!("the input is a scalar: it has no axis to normalize");
    }
    let axis = normalize_axis(node.attr_int("axis", -1)?, x.ndim())? as i32;
    let w = f32_of(x, s)?;
    let norm = if node.attr_int("p", 2)? == 1 {
        ops::sum_axes(&ops::abs(&w, s)?, &[axis], true, s)?
    } else {
        ops::sqrt(&ops::sum_axes(&ops::square(&w, s)?, &[axis], true, s)?, s)?
    };
    // A zero norm gives 0, as ONNX's reference does (not 0/0).
    let zero = ops::scalar(0.0, norm.dtype(), s)?;
    let y = ops::where_(&ops::equal(&norm, &zero, s)?, &zero, &ops::divide(&w, &norm, s)?, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?])
}

ep_core::register_lowering!(
    LP_NORM = FnLowering {
        domain: "",
        op: "LpNormalization",
        opsets: 1..=i32::MAX,
        claim: claim_lp_norm,
        lower: lower_lp_norm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, register_spec};

    fn layer_norm(domain: &'static str) -> BoxedStrategy<Case> {
        (float_dtype(), nonempty_shape(1..=4), any::<prop::sample::Index>(), any::<(bool, bool)>(), seed())
            .prop_map(move |(t, s, pick, (bias, neg), seed)| {
                let r = s.len();
                let axis = pick.index(r);
                let norm_shape = s[axis..].to_vec();
                let a = if neg { axis as i64 - r as i64 } else { axis as i64 };
                let v = if domain.is_empty() { 17 } else { 1 };
                let case =
                    Case::domain_op(domain, "LayerNormalization", v).input("x", t, &s).input("scale", t, &norm_shape);
                let case = if bias { case.input("bias", t, &norm_shape) } else { case };
                case.attr_int("axis", a).attr_float("epsilon", 1e-3).output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::LAYER_NORM, || layer_norm(""));

    register_spec!(super::SIMPLIFIED_LAYER_NORM, || {
        (float_dtype(), nonempty_shape(1..=3), seed())
            .prop_map(|(t, s, seed)| {
                let last = *s.last().expect("rank >= 1");
                Case::op("SimplifiedLayerNormalization", 17)
                    .input("x", t, &s)
                    .input("scale", t, &[last])
                    .attr_float("epsilon", 1e-5)
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::SKIP_SIMPLIFIED_LAYER_NORM, || {
        (float_dtype(), 1..=2i64, 1..=4i64, 2..=8i64, any::<bool>(), seed())
            .prop_map(|(t, b, sq, h, bias, seed)| {
                let case = Case::domain_op("com.microsoft", "SkipSimplifiedLayerNormalization", 1)
                    .input("x", t, &[b, sq, h])
                    .input("skip", t, &[b, sq, h])
                    .input("gamma", t, &[h]);
                let case = if bias { case.input("bias", t, &[h]) } else { case };
                case.attr_float("epsilon", 1e-5).output("y", t, &[b, sq, h]).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::RMS_NORM, || {
        (float_dtype(), nonempty_shape(1..=4), any::<prop::sample::Index>(), opset(23..=23), seed())
            .prop_map(|(t, s, pick, v, seed)| {
                let axis = pick.index(s.len());
                Case::op("RMSNormalization", v)
                    .input("x", t, &s)
                    .input("scale", t, &s[axis..])
                    .attr_int("axis", axis as i64)
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::SKIP_LAYER_NORM, || {
        (float_dtype(), 1..=2i64, 1..=4i64, 2..=8i64, any::<(bool, bool)>(), seed())
            .prop_map(|(t, b, sq, h, (beta, bias), seed)| {
                let case = Case::domain_op("com.microsoft", "SkipLayerNormalization", 1)
                    .input("x", t, &[b, sq, h])
                    .input("skip", t, &[b, sq, h])
                    .input("gamma", t, &[h]);
                let case = match (beta, bias) {
                    (false, false) => case,
                    (true, false) => case.input("beta", t, &[h]),
                    (b, true) => {
                        let case = if b { case.input("beta", t, &[h]) } else { case.absent() };
                        case.input("bias", t, &[h])
                    }
                };
                case.attr_float("epsilon", 1e-5).output("y", t, &[b, sq, h]).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::INSTANCE_NORM, || {
        (float_dtype(), nonempty_shape(3..=4), opset(7..=22), seed())
            .prop_map(|(t, s, v, seed)| {
                let c = s[1];
                Case::op("InstanceNormalization", v)
                    .input("x", t, &s)
                    .input("scale", t, &[c])
                    .input("bias", t, &[c])
                    .attr_float("epsilon", 1e-3)
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::GROUP_NORM, || {
        (select(&[DType::F32][..]), 1..=2i64, 1..=3i64, 1..=3i64, nonempty_shape(1..=2), opset(21..=22), seed())
            .prop_map(|(t, n, g, per, spatial, v, seed)| {
                let c = g * per;
                let s = [vec![n, c], spatial].concat();
                Case::op("GroupNormalization", v)
                    .input("x", t, &s)
                    .input("scale", t, &[c])
                    .input("bias", t, &[c])
                    .attr_int("num_groups", g)
                    .attr_float("epsilon", 1e-3)
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::MVN, || {
        (select(&[DType::F32][..]), collection::vec(2..=4i64, 4), any::<bool>(), opset(13..=22), seed())
            .prop_map(|(t, s, default_axes, v, seed)| {
                let case = Case::op("MeanVarianceNormalization", v).input("x", t, &s);
                let case = if default_axes { case } else { case.attr_ints("axes", &[1, 3]) };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::LP_NORM, || {
        (
            select(&[DType::F32][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            1..=2i64,
            opset(7..=22),
            seed(),
        )
            .prop_map(|(t, s, pick, p, v, seed)| {
                let axis = pick.index(s.len()) as i64;
                Case::op("LpNormalization", v)
                    .input("x", t, &s)
                    .attr_int("axis", axis)
                    .attr_int("p", p)
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });
}
