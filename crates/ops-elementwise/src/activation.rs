//! Activations: LeakyRelu, PRelu, Elu, Selu, Celu, ThresholdedRelu, Gelu, Mish, HardSigmoid,
//! HardSwish, Softplus, Softsign, and the `com.microsoft` fused forms ORT's optimizer makes
//! (FastGelu, BiasGelu, QuickGelu, Gelu), and ORT's earlier experimental Affine, Scale,
//! ParametricSoftplus and ScaledTanh (float32, models of ai.onnx opset 9 or older). float16
//! and bfloat16 compute in float32 and round once, as ORT's CPU EP does.

use ep_core::activation::Activation;
use ep_core::lowering::{FLOATS, FnLowering, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result};

const MS: &str = "com.microsoft";

/// `f(x)` computed in float32 for half types, rounded back to `x`'s type.
fn in_f32(x: &Array, s: &Stream, f: impl FnOnce(&Array) -> Result<Array>) -> Result<Array> {
    let t = x.dtype();
    if t == Dtype::F16 || t == Dtype::BF16 {
        Ok(ops::astype(&f(&ops::astype(x, Dtype::F32, s)?)?, t, s)?)
    } else {
        f(x)
    }
}

fn c(v: f64, like: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::scalar(v, like.dtype(), s)?)
}

fn attr(node: &NodeInfo, name: &str, default: f32) -> Result<f64> {
    Ok(node.attr_float(name, default)? as f64)
}

fn claim_unary(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, FLOATS)
}

fn claim_gelu(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_unary(node)?;
    match node.attr("approximate") {
        None => Ok(()),
        Some(ep_core::AttrValue::String(a)) if a == "none" || a == "tanh" => Ok(()),
        Some(other) => Err(Decline(format!("approximate={other:?} is not supported"))),
    }
}

/// Applies a unary activation `f(x, node, stream)` to input 0.
fn unary(
    ctx: &mut LowerCtx<'_>,
    node: &NodeInfo,
    f: fn(&Array, &NodeInfo, &Stream) -> Result<Array>,
) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream();
    Ok(vec![in_f32(x, s, |x| f(x, node, s))?])
}

fn leaky_relu(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let neg = ops::less(x, &c(0.0, x, s)?, s)?;
    Ok(ops::where_(&neg, &ops::multiply(x, &c(attr(node, "alpha", 0.01)?, x, s)?, s)?, x, s)?)
}

fn elu(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let neg = ops::less(x, &c(0.0, x, s)?, s)?;
    let e = ops::multiply(&ops::expm1(x, s)?, &c(attr(node, "alpha", 1.0)?, x, s)?, s)?;
    Ok(ops::where_(&neg, &e, x, s)?)
}

fn selu(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let alpha = attr(node, "alpha", 1.673_263_2)?;
    let gamma = attr(node, "gamma", 1.050_701)?;
    let neg = ops::less_equal(x, &c(0.0, x, s)?, s)?;
    let e = ops::multiply(&ops::expm1(x, s)?, &c(alpha, x, s)?, s)?;
    Ok(ops::multiply(&ops::where_(&neg, &e, x, s)?, &c(gamma, x, s)?, s)?)
}

fn celu(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let alpha = attr(node, "alpha", 1.0)?;
    let zero = c(0.0, x, s)?;
    // `exp - 1` as ONNX writes it and ORT's CPU EP computes it (not `expm1`, which differs
    // where x / alpha is tiny: alpha = 1e30 makes the negative part 0 there, x here).
    let one = c(1.0, x, s)?;
    let t = ops::subtract(&ops::exp(&ops::divide(x, &c(alpha, x, s)?, s)?, s)?, &one, s)?;
    let e = ops::multiply(&t, &c(alpha, x, s)?, s)?;
    Ok(ops::add(&ops::maximum(x, &zero, s)?, &ops::minimum(&zero, &e, s)?, s)?)
}

fn thresholded_relu(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let keep = ops::greater(x, &c(attr(node, "alpha", 1.0)?, x, s)?, s)?;
    Ok(ops::where_(&keep, x, &c(0.0, x, s)?, s)?)
}

fn gelu_erf(x: &Array, s: &Stream) -> Result<Array> {
    Activation::Gelu.apply(x, s)
}

fn gelu_tanh(x: &Array, s: &Stream) -> Result<Array> {
    Activation::GeluTanh.apply(x, s)
}

fn gelu(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    match node.attr("approximate") {
        Some(ep_core::AttrValue::String(a)) if a == "tanh" => gelu_tanh(x, s),
        _ => gelu_erf(x, s),
    }
}

/// `log(1 + exp(x))`, stable for large |x|.
fn softplus_of(x: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::logaddexp(x, &c(0.0, x, s)?, s)?)
}

fn softplus(x: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    softplus_of(x, s)
}

fn mish(x: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    Ok(ops::multiply(x, &ops::tanh(&softplus_of(x, s)?, s)?, s)?)
}

fn hard_sigmoid_of(x: &Array, alpha: f64, beta: f64, s: &Stream) -> Result<Array> {
    let y = ops::add(&ops::multiply(x, &c(alpha, x, s)?, s)?, &c(beta, x, s)?, s)?;
    Ok(ops::clip(&y, Some(&c(0.0, x, s)?), Some(&c(1.0, x, s)?), s)?)
}

fn hard_sigmoid(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    hard_sigmoid_of(x, attr(node, "alpha", 0.2)?, attr(node, "beta", 0.5)?, s)
}

fn hard_swish(x: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    Ok(ops::multiply(x, &hard_sigmoid_of(x, 1.0 / 6.0, 0.5, s)?, s)?)
}

fn softsign(x: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    Ok(ops::divide(x, &ops::add(&ops::abs(x, s)?, &c(1.0, x, s)?, s)?, s)?)
}

fn quick_gelu(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let a = attr(node, "alpha", 1.702)?;
    Ok(ops::multiply(x, &ops::sigmoid(&ops::multiply(x, &c(a, x, s)?, s)?, s)?, s)?)
}

/// Swish (opset 24): `x * sigmoid(alpha * x)`, alpha 1 by default.
fn swish(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let a = attr(node, "alpha", 1.0)?;
    Ok(ops::multiply(x, &ops::sigmoid(&ops::multiply(x, &c(a, x, s)?, s)?, s)?, s)?)
}

/// `alpha x + beta` (ORT's earlier experimental Affine).
fn affine(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let y = ops::multiply(x, &c(attr(node, "alpha", 1.0)?, x, s)?, s)?;
    Ok(ops::add(&y, &c(attr(node, "beta", 0.0)?, x, s)?, s)?)
}

/// `scale x` (ORT's earlier experimental Scale).
fn scale(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    Ok(ops::multiply(x, &c(attr(node, "scale", 1.0)?, x, s)?, s)?)
}

/// `alpha softplus(beta x)` (ORT's earlier experimental ParametricSoftplus).
fn parametric_softplus(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let bx = ops::multiply(x, &c(attr(node, "beta", 1.0)?, x, s)?, s)?;
    Ok(ops::multiply(&softplus_of(&bx, s)?, &c(attr(node, "alpha", 1.0)?, x, s)?, s)?)
}

/// `alpha tanh(beta x)` (ORT's earlier experimental ScaledTanh).
fn scaled_tanh(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let t = ops::tanh(&ops::multiply(x, &c(attr(node, "beta", 1.0)?, x, s)?, s)?, s)?;
    Ok(ops::multiply(&t, &c(attr(node, "alpha", 1.0)?, x, s)?, s)?)
}

/// ORT's kernels for the earlier experimental activations take float32 only.
fn claim_legacy(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ep_core::ElemType::F32])
}

/// ParametricSoftplus and ScaledTanh: ORT's kernels require both `alpha` and `beta`.
fn claim_legacy_alpha_beta(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_legacy(node)?;
    for a in ["alpha", "beta"] {
        if node.attr(a).is_none() {
            return Err(Decline(format!("attribute `{a}` is required")));
        }
    }
    Ok(())
}

fn ms_gelu(x: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    gelu_erf(x, s)
}

macro_rules! activation {
    ($($name:ident: $domain:expr, $op:expr, $since:expr, $claim:ident, $f:ident;)*) => {$(
        ep_core::register_lowering!($name = FnLowering {
            domain: $domain,
            op: $op,
            opsets: $since..=i32::MAX,
            claim: $claim,
            lower: |ctx, node| unary(ctx, node, $f),
            safety: CompileSafety::Shapeless,
            growth: None,
        });
    )*};
}

activation! {
    LEAKY_RELU: "", "LeakyRelu", 6, claim_unary, leaky_relu;
    ELU: "", "Elu", 6, claim_unary, elu;
    SELU: "", "Selu", 6, claim_unary, selu;
    CELU: "", "Celu", 12, claim_unary, celu;
    THRESHOLDED_RELU: "", "ThresholdedRelu", 10, claim_unary, thresholded_relu;
    GELU: "", "Gelu", 20, claim_gelu, gelu;
    MISH: "", "Mish", 18, claim_unary, mish;
    HARD_SIGMOID: "", "HardSigmoid", 6, claim_unary, hard_sigmoid;
    HARD_SWISH: "", "HardSwish", 14, claim_unary, hard_swish;
    SWISH: "", "Swish", 24, claim_unary, swish;
    SOFTPLUS: "", "Softplus", 1, claim_unary, softplus;
    SOFTSIGN: "", "Softsign", 1, claim_unary, softsign;
    QUICK_GELU: MS, "QuickGelu", 1, claim_unary, quick_gelu;
    MS_GELU: MS, "Gelu", 1, claim_unary, ms_gelu;
    // ORT's earlier experimental ops, kept in the ai.onnx domain (models of opset 9 or older).
    AFFINE: "", "Affine", 1, claim_legacy, affine;
    SCALE: "", "Scale", 1, claim_legacy, scale;
    PARAMETRIC_SOFTPLUS: "", "ParametricSoftplus", 1, claim_legacy_alpha_beta, parametric_softplus;
    SCALED_TANH: "", "ScaledTanh", 1, claim_legacy_alpha_beta, scaled_tanh;
}

fn claim_prelu(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_types(node, FLOATS)
}

fn lower_prelu(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, slope, s) = (ctx.input(0)?, ctx.input(1)?, ctx.stream());
    let neg = ops::less(x, &c(0.0, x, s)?, s)?;
    Ok(vec![ops::where_(&neg, &ops::multiply(x, slope, s)?, x, s)?])
}

ep_core::register_lowering!(
    PRELU = FnLowering {
        domain: "",
        op: "PRelu",
        opsets: 7..=i32::MAX,
        claim: claim_prelu,
        lower: lower_prelu,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

/// The input of rank 1 or more and the bias 1-D of its last dimension, as ORT's kernels
/// require (`None`: not known); broadcasting another bias would answer what they refuse.
fn check_bias(x: Option<&[Option<i64>]>, bias: Option<&[Option<i64>]>) -> std::result::Result<(), String> {
    if x.is_some_and(<[_]>::is_empty) {
        return Err("the input is a scalar; it needs 1 or more dimensions".into());
    }
    if let Some(b) = bias {
        let last = x.and_then(|x| x.last().copied().flatten());
        if b.len() != 1 || last.zip(b[0]).is_some_and(|(l, d)| l != d) {
            return Err(format!("the bias {b:?} must be 1-D of the input's last dimension ({last:?})"));
        }
    }
    Ok(())
}

/// ORT's float16 FastGelu broadcasts its bias without checking it.
fn bias_unchecked(node: &NodeInfo) -> bool {
    node.op_type == "FastGelu" && ep_core::lowering::input_type(node, 0) == Some(ep_core::ElemType::F16)
}

fn claim_biased(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_types(node, FLOATS)?;
    if bias_unchecked(node) {
        return Ok(());
    }
    let dims = |i: usize| node.input(i).and_then(|v| v.shape.as_deref());
    check_bias(dims(0), dims(1)).map_err(Decline)
}

/// `gelu(x + bias)`: FastGelu (tanh form, bias optional) and BiasGelu (erf form).
fn lower_biased(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let known = |a: &Array| a.shape().into_iter().map(Some).collect::<Vec<_>>();
    if !bias_unchecked(node) {
        check_bias(Some(&known(ctx.input(0)?)), ctx.optional_input(1).map(known).as_deref())?;
    }
    let s = ctx.stream();
    let x = match ctx.optional_input(1) {
        Some(b) => ops::add(ctx.input(0)?, b, s)?,
        None => ctx.input(0)?.clone(),
    };
    let tanh_form = node.op_type == "FastGelu";
    Ok(vec![in_f32(&x, s, |x| if tanh_form { gelu_tanh(x, s) } else { gelu_erf(x, s) })?])
}

ep_core::register_lowering!(
    FAST_GELU = FnLowering {
        domain: MS,
        op: "FastGelu",
        opsets: 1..=i32::MAX,
        claim: claim_biased,
        lower: lower_biased,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

ep_core::register_lowering!(
    BIAS_GELU = FnLowering {
        domain: MS,
        op: "BiasGelu",
        opsets: 1..=i32::MAX,
        claim: claim_biased,
        lower: lower_biased,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, Values, register_spec};

    /// A unary activation on float shapes with special values; `attrs` draws its attributes.
    fn act(
        domain: &'static str,
        op: &'static str,
        since: u32,
        attrs: fn(u64) -> Vec<(&'static str, Attr)>,
    ) -> BoxedStrategy<Case> {
        // (An op new past opset 22 at its own opset only: ORT 1.31 runs Swish's function body at 24 alone.)
        let versions = if !domain.is_empty() {
            1..=1
        } else if since == 1 && LEGACY.contains(&op) {
            // (ORT knows these up to opset 9.)
            7..=9
        } else if since > 22 {
            since..=since
        } else {
            since.max(7)..=22
        };
        (float_dtype(), shape(0..=4), opset(versions), seed())
            .prop_map(move |(t, s, v, seed)| {
                let mut case = Case::domain_op(domain, op, v).input_with("x", t, &s, Values::Special);
                for (k, a) in attrs(seed) {
                    case = case.attr(k, a);
                }
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    /// ORT's earlier experimental ops: float32 only, ai.onnx opset 9 or older.
    const LEGACY: &[&str] = &["Affine", "Scale", "ParametricSoftplus", "ScaledTanh"];

    fn f32_only(strategy: BoxedStrategy<Case>) -> BoxedStrategy<Case> {
        strategy
            .prop_map(|mut c| {
                c.inputs[0].dtype = conformance_spec::DType::F32;
                c.outputs[0].1 = conformance_spec::DType::F32;
                c
            })
            .boxed()
    }

    fn alpha_beta(seed: u64) -> Vec<(&'static str, Attr)> {
        vec![
            ("alpha", Attr::Float(0.5 + (seed % 5) as f32 * 0.5)),
            ("beta", Attr::Float(-1.0 + (seed % 7) as f32 * 0.4)),
        ]
    }

    register_spec!(super::AFFINE, || f32_only(act("", "Affine", 1, |seed| {
        if seed % 3 == 0 { vec![] } else { alpha_beta(seed) }
    })));
    register_spec!(super::SCALE, || f32_only(act("", "Scale", 1, |seed| {
        if seed % 3 == 0 { vec![] } else { vec![("scale", Attr::Float(-2.0 + (seed % 9) as f32 * 0.5))] }
    })));
    register_spec!(super::PARAMETRIC_SOFTPLUS, || f32_only(act("", "ParametricSoftplus", 1, alpha_beta)));
    register_spec!(super::SCALED_TANH, || f32_only(act("", "ScaledTanh", 1, alpha_beta)));

    fn none(_: u64) -> Vec<(&'static str, Attr)> {
        vec![]
    }

    fn alpha(seed: u64) -> Vec<(&'static str, Attr)> {
        if seed.is_multiple_of(2) { vec![] } else { vec![("alpha", Attr::Float(0.3 + (seed % 7) as f32 * 0.25))] }
    }

    register_spec!(super::LEAKY_RELU, || act("", "LeakyRelu", 6, alpha));
    register_spec!(super::ELU, || act("", "Elu", 6, alpha));
    register_spec!(super::SELU, || act("", "Selu", 6, |seed| {
        if seed % 2 == 0 { vec![] } else { vec![("alpha", Attr::Float(1.5)), ("gamma", Attr::Float(1.2))] }
    }));
    // ORT's CPU Celu takes float32 only.
    register_spec!(super::CELU, || f32_only(act("", "Celu", 12, alpha)));
    register_spec!(super::THRESHOLDED_RELU, || act("", "ThresholdedRelu", 10, alpha));
    register_spec!(super::GELU, || act("", "Gelu", 20, |seed| {
        if seed % 2 == 0 { vec![] } else { vec![("approximate", Attr::Str("tanh".into()))] }
    }));
    register_spec!(super::MISH, || act("", "Mish", 18, none));
    register_spec!(super::HARD_SIGMOID, || act("", "HardSigmoid", 6, |seed| {
        if seed % 2 == 0 { vec![] } else { vec![("alpha", Attr::Float(0.3)), ("beta", Attr::Float(0.4))] }
    }));
    register_spec!(super::HARD_SWISH, || act("", "HardSwish", 14, none));
    register_spec!(super::SWISH, || act("", "Swish", 24, alpha));
    register_spec!(super::SOFTPLUS, || act("", "Softplus", 1, none));
    register_spec!(super::SOFTSIGN, || act("", "Softsign", 1, none));
    register_spec!(super::QUICK_GELU, || act("com.microsoft", "QuickGelu", 1, alpha));
    register_spec!(super::MS_GELU, || act("com.microsoft", "Gelu", 1, none));

    register_spec!(super::PRELU, || {
        (float_dtype(), broadcast_pair(1..=4), opset(9..=22), seed())
            .prop_map(|(t, (x, slope, _), v, seed)| {
                // The slope broadcasts to x (unidirectionally): keep only its trailing dims.
                let slope: Vec<i64> = slope
                    .iter()
                    .zip(x.iter().skip(x.len().saturating_sub(slope.len())))
                    .map(|(&sd, &xd)| if sd == xd { sd } else { 1 })
                    .collect();
                let slope = slope[slope.len().saturating_sub(x.len())..].to_vec();
                Case::op("PRelu", v)
                    .input_with("x", t, &x, Values::Special)
                    .input("slope", t, &slope)
                    .output("y", t, &x)
                    .with_seed(seed)
            })
            .boxed()
    });

    fn biased(op: &'static str, bias: bool) -> BoxedStrategy<Case> {
        (float_dtype(), nonempty_shape(1..=3), any::<bool>(), seed())
            .prop_map(move |(t, s, with_bias, seed)| {
                let last = *s.last().expect("rank >= 1");
                let case = Case::domain_op("com.microsoft", op, 1).input("x", t, &s);
                let case = if bias || with_bias { case.input("bias", t, &[last]) } else { case };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::FAST_GELU, || biased("FastGelu", false));
    register_spec!(super::BIAS_GELU, || biased("BiasGelu", true));
}
