//! `com.microsoft` QLinearLeakyRelu and QLinearSigmoid on int8/uint8: each element dequantized
//! (`x_scale * (x - x_zero_point)`), the activation in float32, and quantized back
//! (`saturate(round_half_even(y / y_scale) + y_zero_point)`), the values ORT's CPU EP's
//! 256-entry table holds for each byte.

use crate::qdq::{Q8, one_value, quantize, range};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    // (Input 2, x's zero point, is optional ahead of the required y scale.)
    require_inputs(node, 2, 5)?;
    if node.input(3).is_none() {
        return Err(Decline::new("y_scale (input 3) is missing"));
    }
    for i in [0, 2, 4] {
        require_input_type(node, i, Q8)?;
    }
    for i in [1, 3] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    Ok(())
}

fn scalar_input(ctx: &LowerCtx<'_>, i: usize, s: &Stream) -> Result<Option<Array>> {
    ctx.optional_input(i).map(|a| one_value(a, &format!("input {i}"), s)).transpose()
}

fn lower_with(ctx: &mut LowerCtx<'_>, f: &dyn Fn(&Array, &Stream) -> Result<Array>) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let t = x.dtype();
    let x_scale = scalar_input(ctx, 1, s)?.expect("a required input");
    let y_scale = scalar_input(ctx, 3, s)?.expect("a required input");
    let mut v = ops::astype(x, Dtype::F32, s)?;
    if let Some(zp) = scalar_input(ctx, 2, s)? {
        v = ops::subtract(&v, &zp, s)?;
    }
    let y = f(&ops::multiply(&x_scale, &v, s)?, s)?;
    let y_zp = scalar_input(ctx, 4, s)?;
    Ok(vec![quantize(&y, &y_scale, y_zp.as_ref(), t, range(t)?, s)?])
}

fn lower_leaky(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let alpha = node.attr_float("alpha", 0.01)? as f64;
    lower_with(ctx, &|x, s| {
        let zero = ops::scalar(0.0, Dtype::F32, s)?;
        let scaled = ops::multiply(x, &ops::scalar(alpha, Dtype::F32, s)?, s)?;
        Ok(ops::where_(&ops::greater_equal(x, &zero, s)?, x, &scaled, s)?)
    })
}

fn lower_sigmoid(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    lower_with(ctx, &|x, s| Ok(ops::sigmoid(x, s)?))
}

ep_core::register_lowering!(
    QLINEAR_LEAKY_RELU = FnLowering {
        domain: "com.microsoft",
        op: "QLinearLeakyRelu",
        opsets: 1..=i32::MAX,
        claim,
        lower: lower_leaky,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

ep_core::register_lowering!(
    QLINEAR_SIGMOID = FnLowering {
        domain: "com.microsoft",
        op: "QLinearSigmoid",
        opsets: 1..=i32::MAX,
        claim,
        lower: lower_sigmoid,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::qdq::spec::{full_range, qtype};
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn case(op: &'static str) -> BoxedStrategy<Case> {
        (qtype(), shape(0..=3), any::<bool>(), seed())
            .prop_map(move |(t, s, x_zp, seed)| {
                let mut case = Case::domain_op("com.microsoft", op, 1)
                    .input_with("x", t, &s, full_range(t))
                    .input_with("x_scale", DType::F32, &[], Values::Uniform { lo: 0.005, hi: 0.1 });
                case = if x_zp { case.input_with("x_zp", t, &[], full_range(t)) } else { case.absent() };
                case = case.input_with("y_scale", DType::F32, &[], Values::Uniform { lo: 0.002, hi: 0.05 });
                // (Always given: ORT's CPU EP reads the fifth input without checking it is there.)
                case = case.input_with("y_zp", t, &[], full_range(t));
                if op == "QLinearLeakyRelu" {
                    case = case.attr_float("alpha", 0.15);
                }
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::QLINEAR_LEAKY_RELU, || case("QLinearLeakyRelu"));
    register_spec!(super::QLINEAR_SIGMOID, || case("QLinearSigmoid"));
}
