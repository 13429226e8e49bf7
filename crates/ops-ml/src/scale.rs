//! Row-wise scalings: Binarizer (`x > threshold` as 1 or 0, float32; NaN input fails the
//! run, as on ORT's CPU EP), Scaler
//! (`(x - offset) * scale` to float32, per feature or for all, on 1-D and 2-D inputs), Normalizer (each row of a 1-D
//! or 2-D input divided by its max, L1 or L2 norm, to float32; a row whose norm is 0 is copied,
//! as ORT's CPU EP does).

use crate::ML;
use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

/// The input types ORT's CPU EP takes for Scaler and Normalizer that MLX holds on every device.
const INPUTS: &[ElemType] = &[ElemType::F32, ElemType::I64, ElemType::I32];

fn claim_binarizer(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32])
}

fn lower_binarizer(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let threshold = ops::scalar(node.attr_float("threshold", 0.0)? as f64, Dtype::F32, s)?;
    // ORT's CPU EP refuses NaN input: so does this, with the outputs' evaluation.
    let y = ops::astype(&ops::greater(x, &threshold, s)?, Dtype::F32, s)?;
    let numbers = ops::equal(x, x, s)?;
    ctx.check(&numbers, "the input holds NaN")?;
    Ok(vec![y])
}

ep_core::register_lowering!(
    BINARIZER = FnLowering {
        domain: ML,
        op: "Binarizer",
        opsets: 1..=i32::MAX,
        claim: claim_binarizer,
        lower: lower_binarizer,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn floats<'a>(node: &'a NodeInfo, name: &str) -> Option<&'a [f32]> {
    match node.attr(name) {
        Some(AttrValue::Floats(v)) => Some(v),
        _ => None,
    }
}

fn claim_scaler(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, INPUTS)?;
    // ORT's CPU EP takes the features from the second dimension and applies them to the flat
    // data: the same as per last dimension only for 1-D and 2-D inputs.
    require_input_rank(node, 0, 1..=2)?;
    for name in ["offset", "scale"] {
        floats(node, name).ok_or_else(|| Decline(format!("Scaler needs `{name}` (a list of floats)")))?;
    }
    Ok(())
}

fn lower_scaler(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let c = x.shape().last().copied().unwrap_or(1);
    let vector = |name: &str| -> Result<Array> {
        let v = floats(node, name).unwrap_or(&[]);
        if v.len() != 1 && v.len() as i64 != c {
            return Err(ep_core::Error::new(format!(
                "`{name}` has {} values: it must have 1 or one per feature (the input's last dimension, {c})",
                v.len()
            )));
        }
        Ok(Array::from_slice(v, &[v.len() as i64])?)
    };
    let x = ops::astype(x, Dtype::F32, s)?;
    Ok(vec![ops::multiply(&ops::subtract(&x, &vector("offset")?, s)?, &vector("scale")?, s)?])
}

ep_core::register_lowering!(
    SCALER = FnLowering {
        domain: ML,
        op: "Scaler",
        opsets: 1..=i32::MAX,
        claim: claim_scaler,
        lower: lower_scaler,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn norm(node: &NodeInfo) -> std::result::Result<&str, Decline> {
    match node.attr("norm") {
        None => Ok("MAX"),
        Some(AttrValue::String(n)) if ["MAX", "L1", "L2"].contains(&n.as_str()) => Ok(n),
        Some(other) => Err(Decline(format!("norm={other:?} is not MAX, L1 or L2"))),
    }
}

fn claim_normalizer(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, INPUTS)?;
    require_input_rank(node, 0, 1..=2)?;
    norm(node)?;
    Ok(())
}

fn lower_normalizer(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let x = ops::astype(x, Dtype::F32, s)?;
    if x.shape().contains(&0) {
        return Ok(vec![x]);
    }
    let axes = [-1];
    let by = match norm(node).map_err(|d| ep_core::Error::new(d.0))? {
        // As ORT's CPU EP: a running max from float32's lowest value that passes NaN over.
        "MAX" => {
            let skipped = ops::where_(&ops::isnan(&x, s)?, &ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?, &x, s)?;
            ops::maximum(&ops::max_axes(&skipped, &axes, true, s)?, &ops::scalar(f32::MIN as f64, Dtype::F32, s)?, s)?
        }
        "L1" => ops::sum_axes(&ops::abs(&x, s)?, &axes, true, s)?,
        _ => ops::sqrt(&ops::sum_axes(&ops::square(&x, s)?, &axes, true, s)?, s)?,
    };
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let by = ops::where_(&ops::equal(&by, &zero, s)?, &ops::scalar(1.0, Dtype::F32, s)?, &by, s)?;
    Ok(vec![ops::divide(&x, &by, s)?])
}

ep_core::register_lowering!(
    NORMALIZER = FnLowering {
        domain: ML,
        op: "Normalizer",
        opsets: 1..=i32::MAX,
        claim: claim_normalizer,
        lower: lower_normalizer,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, register_spec};

    register_spec!(super::BINARIZER, || {
        (shape(0..=3), seed())
            .prop_map(|(s, seed)| {
                let case = Case::domain_op("ai.onnx.ml", "Binarizer", 1).input("x", DType::F32, &s);
                let case = if seed % 2 == 0 { case } else { case.attr("threshold", Attr::Float(0.25)) };
                case.output("y", DType::F32, &s).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::SCALER, || {
        (select(&[DType::F32, DType::I64, DType::I32][..]), nonempty_shape(1..=2), any::<bool>(), seed())
            .prop_map(|(t, s, per_feature, seed)| {
                let c = *s.last().expect("rank >= 1") as usize;
                let n = if per_feature { c } else { 1 };
                let offset: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 * 0.25).collect();
                let scale: Vec<f32> = (0..n).map(|i| 1.5 + i as f32 * 0.5).collect();
                Case::domain_op("ai.onnx.ml", "Scaler", 1)
                    .input("x", t, &s)
                    .attr("offset", Attr::Floats(offset))
                    .attr("scale", Attr::Floats(scale))
                    .output("y", DType::F32, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::NORMALIZER, || {
        (select(&[DType::F32, DType::I64, DType::I32][..]), nonempty_shape(1..=2), 0..3usize, seed())
            .prop_map(|(t, s, n, seed)| {
                let norm = ["MAX", "L1", "L2"][n];
                Case::domain_op("ai.onnx.ml", "Normalizer", 1)
                    .input("x", t, &s)
                    .attr("norm", Attr::Str(norm.into()))
                    .output("y", DType::F32, &s)
                    .with_seed(seed)
            })
            .boxed()
    });
}
