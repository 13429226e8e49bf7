//! `com.microsoft` FusedGemm and FusedConv: ORT's optimizer's fusions of a Gemm or a Conv with
//! the activation after it (and FusedConv's optional `Z` added before the activation), on the
//! Gemm and Conv lowerings. FusedGemm reads the activation's parameters from
//! `activation_alpha`/`_beta`/`_gamma`, FusedConv from `activation_params`, as ORT's CPU EP does;
//! a parameter the activation needs and the node lacks declines it (ORT's CPU EP refuses it).

use ep_core::activation::Activation;
use ep_core::lowering::{FnLowering, Lowering, require_input_type};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn activation_name(node: &NodeInfo) -> std::result::Result<Option<&str>, String> {
    match node.attr("activation") {
        None => Ok(None),
        Some(AttrValue::String(a)) => Ok(Some(a)),
        Some(other) => Err(format!("activation should be a string, found {other:?}")),
    }
}

/// FusedGemm's activation: every name needs one (ORT's CPU EP refuses none).
fn gemm_activation(node: &NodeInfo) -> std::result::Result<Activation, String> {
    let p = |name: &str| -> std::result::Result<f64, String> {
        match node.attr(name) {
            Some(AttrValue::Float(v)) => Ok(*v as f64),
            _ => Err(format!("the activation needs {name}")),
        }
    };
    Ok(match activation_name(node)?.ok_or("FusedGemm needs an activation")? {
        "Relu" => Activation::Relu,
        "Sigmoid" => Activation::Sigmoid,
        "Tanh" => Activation::Tanh,
        "Softplus" => Activation::Softplus,
        "Softsign" => Activation::Softsign,
        "LeakyRelu" => Activation::LeakyRelu(p("activation_alpha")?),
        "Elu" => Activation::Elu(p("activation_alpha")?),
        "ThresholdedRelu" => Activation::ThresholdedRelu(p("activation_alpha")?),
        "HardSigmoid" => Activation::HardSigmoid(p("activation_alpha")?, p("activation_beta")?),
        other => return Err(format!("activation {other} is not lowered")),
    })
}

/// FusedConv's activation (none: the identity), its parameters in `activation_params`.
fn conv_activation(node: &NodeInfo) -> std::result::Result<Activation, String> {
    let params = match node.attr("activation_params") {
        Some(AttrValue::Floats(v)) => v.iter().map(|&v| v as f64).collect(),
        None => vec![],
        Some(other) => return Err(format!("activation_params should be floats, found {other:?}")),
    };
    let want = |n: usize| -> std::result::Result<(), String> {
        if params.len() == n {
            Ok(())
        } else {
            Err(format!("the activation takes {n} parameters, {} given", params.len()))
        }
    };
    Ok(match activation_name(node)? {
        None => Activation::Identity,
        Some("Relu") => Activation::Relu,
        Some("Tanh") => Activation::Tanh,
        Some("Sigmoid") => Activation::Sigmoid,
        Some("Silu") => Activation::Silu,
        Some("LeakyRelu") => {
            want(1)?;
            Activation::LeakyRelu(params[0])
        }
        Some("Clip") => {
            want(2)?;
            Activation::Clip(params[0], params[1])
        }
        Some("HardSigmoid") => {
            want(2)?;
            Activation::HardSigmoid(params[0], params[1])
        }
        Some(other) => return Err(format!("activation {other} is not one FusedConv takes")),
    })
}

fn claim_gemm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, &[ElemType::F32])?;
    crate::matmul::Gemm.claim(node)?;
    gemm_activation(node).map(|_| ()).map_err(Decline)
}

fn lower_gemm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let y = crate::matmul::Gemm.lower(ctx, node)?.remove(0);
    Ok(vec![gemm_activation(node).map_err(ep_core::Error::new)?.apply(&y, ctx.stream())?])
}

ep_core::register_lowering!(
    FUSED_GEMM = FnLowering {
        domain: "com.microsoft",
        op: "FusedGemm",
        opsets: 1..=i32::MAX,
        claim: claim_gemm,
        lower: lower_gemm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn claim_conv(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, &[ElemType::F32])?;
    if node.inputs.len() == 4 && node.input(3).is_some() {
        require_input_type(node, 3, &[ElemType::F32])?;
    }
    let mut conv = node.clone();
    conv.inputs.truncate(3);
    crate::conv::claim_conv_forward(&conv)?;
    conv_activation(node).map(|_| ()).map_err(Decline)
}

/// `act(conv(X, W) + B + Z)`, `Z` (when given) of the output's shape (unread for an empty
/// output, as ORT's CPU EP leaves it).
fn lower_conv(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let mut y = crate::conv::lower_conv(ctx, node)?.remove(0);
    let s = ctx.stream();
    if let Some(z) = ctx.optional_input(3).filter(|_| y.size() > 0) {
        if z.shape() != y.shape() {
            ep_core::bail!("Z {:?} does not have the output's shape {:?}", z.shape(), y.shape());
        }
        y = ops::add(&y, &ops::astype(z, Dtype::F32, s)?, s)?;
    }
    Ok(vec![conv_activation(node).map_err(ep_core::Error::new)?.apply(&y, s)?])
}

ep_core::register_lowering!(
    FUSED_CONV = FnLowering {
        domain: "com.microsoft",
        op: "FusedConv",
        opsets: 1..=i32::MAX,
        claim: claim_conv,
        lower: lower_conv,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, register_spec};

    const GEMM_ACTS: &[(&str, &[(&str, f32)])] = &[
        ("Relu", &[]),
        ("Sigmoid", &[]),
        ("Tanh", &[]),
        ("Softplus", &[]),
        ("Softsign", &[]),
        ("LeakyRelu", &[("activation_alpha", 0.1)]),
        ("Elu", &[("activation_alpha", 0.7)]),
        ("ThresholdedRelu", &[("activation_alpha", 0.2)]),
        ("HardSigmoid", &[("activation_alpha", 0.3), ("activation_beta", 0.4)]),
    ];

    const CONV_ACTS: &[(&str, &[f32])] = &[
        ("", &[]),
        ("Relu", &[]),
        ("Tanh", &[]),
        ("Sigmoid", &[]),
        ("LeakyRelu", &[0.2]),
        ("Clip", &[-0.5, 0.6]),
        ("HardSigmoid", &[0.3, 0.5]),
    ];

    register_spec!(super::FUSED_GEMM, || {
        ((1..=4i64, 1..=5i64, 1..=4i64), any::<(bool, bool, bool)>(), select(GEMM_ACTS), seed())
            .prop_map(|((m, k, n), (ta, tb, c), (act, params), seed)| {
                let a = if ta { [k, m] } else { [m, k] };
                let b = if tb { [n, k] } else { [k, n] };
                let mut case = Case::domain_op("com.microsoft", "FusedGemm", 1).input("a", DType::F32, &a).input(
                    "b",
                    DType::F32,
                    &b,
                );
                if c {
                    case = case.input("c", DType::F32, &[n]);
                }
                case = case
                    .attr_int("transA", ta as i64)
                    .attr_int("transB", tb as i64)
                    .attr_float("alpha", 1.5)
                    .attr_str("activation", act);
                for &(name, v) in params {
                    case = case.attr_float(name, v);
                }
                case.output("y", DType::F32, &[m, n]).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::FUSED_CONV, || {
        ((1..=2i64, 1..=3i64, 1..=3i64, 3..=6i64), any::<(bool, bool)>(), select(CONV_ACTS), seed())
            .prop_map(|((n, c, m, hw), (bias, z), (act, params), seed)| {
                let out = [n, m, hw - 2, hw - 2];
                let mut case = Case::domain_op("com.microsoft", "FusedConv", 1)
                    .input("x", DType::F32, &[n, c, hw, hw])
                    .input("w", DType::F32, &[m, c, 3, 3]);
                if bias || z {
                    case = case.input("b", DType::F32, &[m]);
                }
                if z {
                    case = case.input("z", DType::F32, &out);
                }
                if !act.is_empty() {
                    case = case.attr_str("activation", act);
                }
                if !params.is_empty() {
                    case = case.attr("activation_params", Attr::Floats(params.to_vec()));
                }
                case.attr_ints("kernel_shape", &[3, 3]).output("y", DType::F32, &out).with_seed(seed)
            })
            .boxed()
    });
}
