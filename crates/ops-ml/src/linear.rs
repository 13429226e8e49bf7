//! LinearRegressor: `y = x @ coefficients^T + intercepts` for `[N, C]` float32 input and
//! `targets` outputs per row (`post_transform` NONE; the others are left to ORT's CPU EP).

use crate::ML;
use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn floats<'a>(node: &'a NodeInfo, name: &str) -> &'a [f32] {
    match node.attr(name) {
        Some(AttrValue::Floats(v)) => v,
        _ => &[],
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32])?;
    require_input_rank(node, 0, 2..=2)?;
    match node.attr("post_transform") {
        None => {}
        Some(AttrValue::String(t)) if t == "NONE" => {}
        Some(other) => return Err(Decline(format!("post_transform={other:?} is not supported (NONE is)"))),
    }
    let targets = node.attr_int("targets", 1)?;
    let coefficients = floats(node, "coefficients").len() as i64;
    if targets < 1 || coefficients == 0 {
        return Err(Decline(format!("{coefficients} coefficients for {targets} target(s)")));
    }
    let intercepts = floats(node, "intercepts").len() as i64;
    if intercepts != 0 && intercepts != targets {
        return Err(Decline(format!("{intercepts} intercepts for {targets} target(s)")));
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let targets = node.attr_int("targets", 1)?;
    let coefficients = floats(node, "coefficients");
    let c = x.shape()[1];
    // ORT's CPU EP reads the first `targets * features` coefficients (any beyond are unused).
    let used = usize::try_from(targets * c).unwrap_or(usize::MAX);
    if coefficients.len() < used {
        return Err(ep_core::Error::new(format!(
            "the input has {c} features: {targets} target(s) need {used} coefficients, {} given",
            coefficients.len()
        )));
    }
    let w = Array::from_slice(&coefficients[..used], &[targets, c])?;
    let y = ops::matmul(x, &ops::transpose_axes(&w, &[1, 0], s)?, s)?;
    let intercepts = floats(node, "intercepts");
    if intercepts.is_empty() {
        return Ok(vec![y]);
    }
    Ok(vec![ops::add(&y, &Array::from_slice(intercepts, &[targets])?, s)?])
}

ep_core::register_lowering!(
    LINEAR_REGRESSOR = FnLowering {
        domain: ML,
        op: "LinearRegressor",
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
    use conformance_spec::{Attr, Case, DType, register_spec};

    register_spec!(super::LINEAR_REGRESSOR, || {
        (1..=4i64, 1..=6i64, 1..=3i64, any::<bool>(), seed())
            .prop_map(|(n, c, targets, intercepts, seed)| {
                let coefficients: Vec<f32> =
                    (0..c * targets).map(|i| ((i * 5 + seed as i64) % 9) as f32 * 0.25 - 1.0).collect();
                let case = Case::domain_op("ai.onnx.ml", "LinearRegressor", 1)
                    .input("x", DType::F32, &[n, c])
                    .attr("coefficients", Attr::Floats(coefficients))
                    .attr_int("targets", targets);
                let case = if intercepts {
                    case.attr("intercepts", Attr::Floats((0..targets).map(|t| t as f32 * 0.5 - 0.25).collect()))
                } else {
                    case
                };
                case.output("y", DType::F32, &[n, targets]).with_seed(seed)
            })
            .boxed()
    });
}
