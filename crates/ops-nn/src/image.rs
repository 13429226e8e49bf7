//! ORT's earlier experimental ImageScaler, kept in the ai.onnx domain for models of opset 9 or
//! older: `scale x + bias[c]` over NCHW, float32 only, as ORT's kernel.

use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_image(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32])?;
    require_input_rank(node, 0, 4..=4).map(|_| ())
}

fn claim_image_scaler(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_image(node)?;
    match node.attr("bias") {
        Some(AttrValue::Floats(_)) => Ok(()),
        _ => Err(Decline::new("attribute `bias` (floats, one per channel) is required")),
    }
}

fn lower_image_scaler(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let Some(AttrValue::Floats(bias)) = node.attr("bias") else { bail!("attribute `bias` is required") };
    let channels = x.shape()[1];
    if bias.len() as i64 != channels {
        bail!("bias holds {} values for {channels} channels", bias.len());
    }
    let scale = node.attr_float("scale", 1.0)?;
    let bias = Array::from_slice(bias, &[1, channels, 1, 1])?;
    let y = ops::multiply(x, &ops::scalar(f64::from(scale), Dtype::F32, s)?, s)?;
    Ok(vec![ops::add(&y, &bias, s)?])
}

ep_core::register_lowering!(
    IMAGE_SCALER = FnLowering {
        domain: "",
        op: "ImageScaler",
        opsets: 1..=i32::MAX,
        claim: claim_image_scaler,
        lower: lower_image_scaler,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, register_spec};

    fn nchw() -> BoxedStrategy<Vec<i64>> {
        (1..=2i64, 1..=4i64, 1..=6i64, 1..=6i64).prop_map(|(n, c, h, w)| vec![n, c, h, w]).boxed()
    }

    register_spec!(super::IMAGE_SCALER, || {
        (nchw(), any::<bool>(), opset(7..=9), seed())
            .prop_map(|(x, scaled, v, seed)| {
                let bias: Vec<f32> = (0..x[1]).map(|c| (c as f32 - 1.5) * (1.0 + (seed % 5) as f32)).collect();
                let case = Case::op("ImageScaler", v).input("x", DType::F32, &x).attr("bias", Attr::Floats(bias));
                let case = if scaled { case.attr_float("scale", 0.25 + (seed % 7) as f32 * 0.5) } else { case };
                case.output("y", DType::F32, &x).with_seed(seed)
            })
            .boxed()
    });
}
