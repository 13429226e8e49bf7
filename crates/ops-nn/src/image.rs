//! ORT's earlier experimental image ops, kept in the ai.onnx domain for models of opset 9 or
//! older, float32 NCHW only, as ORT's kernels: ImageScaler (`scale x + bias[c]`) and Crop (a
//! slice: `border` = left, top, right, bottom, or a `scale` = height, width window from the
//! top-left border).

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

/// Crop's `border` (four values) and optional `scale` (two), non-negative, as ORT requires.
fn crop_attributes(node: &NodeInfo) -> std::result::Result<(Vec<i64>, Option<Vec<i64>>), String> {
    let border = node.attr_ints("border")?.map(<[i64]>::to_vec).unwrap_or_default();
    if border.len() != 4 || border.iter().any(|&b| b < 0) {
        return Err(format!("border {border:?} must hold four non-negative values"));
    }
    let scale = node.attr_ints("scale")?.map(<[i64]>::to_vec);
    if let Some(sc) = &scale
        && (sc.len() != 2 || sc.iter().any(|&v| v < 0))
    {
        return Err(format!("scale {sc:?} must hold two non-negative values"));
    }
    Ok((border, scale))
}

fn claim_crop(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_image(node)?;
    crop_attributes(node).map(|_| ()).map_err(Decline)
}

fn lower_crop(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let (border, scale) = crop_attributes(node)?;
    let [n, c, h, w] = x.shape()[..] else { bail!("the input must be 4-D") };
    // (In 128 bits: attributes may hold any int64.)
    let wide = |v: i64| i128::from(v);
    let (left, top, right, bottom) = (border[0], border[1], border[2], border[3]);
    // With a scale, the right and bottom borders take no part (ORT checks only the window).
    let (bottom_edge, right_edge) = match &scale {
        Some(sc) => {
            if wide(h) < wide(top) + wide(sc[0]) || wide(w) < wide(left) + wide(sc[1]) {
                bail!("a {} x {} window from ({top}, {left}) does not fit the image ({h} x {w})", sc[0], sc[1]);
            }
            (top + sc[0], left + sc[1])
        }
        None => {
            if wide(h) < wide(top) + wide(bottom) || wide(w) < wide(left) + wide(right) {
                bail!("border {border:?} is larger than the image ({h} x {w})");
            }
            (h - bottom, w - right)
        }
    };
    Ok(vec![ops::slice(x, &[0, 0, top, left], &[n, c, bottom_edge, right_edge], s)?])
}

ep_core::register_lowering!(
    CROP = FnLowering {
        domain: "",
        op: "Crop",
        opsets: 1..=i32::MAX,
        claim: claim_crop,
        lower: lower_crop,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

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

    register_spec!(super::CROP, || {
        (nchw(), (0..=2i64, 0..=2i64, 0..=2i64, 0..=2i64), any::<bool>(), opset(1..=9), seed())
            .prop_map(|(mut x, (left, top, right, bottom), scaled, v, seed)| {
                x[2] += top + bottom;
                x[3] += left + right;
                let case =
                    Case::op("Crop", v).input("x", DType::F32, &x).attr_ints("border", &[left, top, right, bottom]);
                let (h, w) = if scaled {
                    // A window from the top-left border, within the image.
                    ((x[2] - top).min(1 + (seed % 3) as i64), (x[3] - left).min(1 + (seed % 4) as i64))
                } else {
                    (x[2] - top - bottom, x[3] - left - right)
                };
                let case = if scaled { case.attr_ints("scale", &[h, w]) } else { case };
                case.output("y", DType::F32, &[x[0], x[1], h, w]).with_seed(seed)
            })
            .boxed()
    });

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
