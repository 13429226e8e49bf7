//! Where and Clip.

use ep_core::lowering::{ALL_TYPES, FnLowering, NUMERIC, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn claim_where(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    require_input_type(node, 0, &[ElemType::Bool])?;
    require_input_type(node, 1, ALL_TYPES)?;
    require_input_type(node, 2, ALL_TYPES)
}

fn lower_where(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(1)?;
    Ok(vec![ops::where_(ctx.input(0)?, x, ctx.input(2)?, ctx.stream_for(x.dtype()))?])
}

ep_core::register_lowering!(
    WHERE = FnLowering {
        domain: "",
        op: "Where",
        opsets: 9..=i32::MAX,
        claim: claim_where,
        lower: lower_where,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn claim_clip(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 3)?;
    for i in 0..3 {
        require_input_type(node, i, NUMERIC)?;
    }
    // Before opset 11 the bounds are attributes, which ORT's CPU EP refuses unless min <= max.
    if node.since_version < 11 {
        let (lo, hi) = (node.attr_float("min", f32::MIN)?, node.attr_float("max", f32::MAX)?);
        if lo.is_nan() || hi.is_nan() || lo > hi {
            return Err(Decline(format!("Clip's min attribute {lo} is not at most its max {hi}")));
        }
    }
    Ok(())
}

/// `min(max(x, lo), hi)` with absent bounds skipped; NaN stays NaN.
fn lower_clip(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream_for(x.dtype());
    let (lo, hi) = if node.since_version >= 11 {
        (ctx.optional_input(1).cloned(), ctx.optional_input(2).cloned())
    } else {
        let bound = |name: &str| -> Result<Option<Array>> {
            match node.attr(name) {
                Some(ep_core::AttrValue::Float(v)) => Ok(Some(ops::scalar(*v as f64, x.dtype(), s)?)),
                _ => Ok(None),
            }
        };
        (bound("min")?, bound("max")?)
    };
    // An absent bound is the type's lowest (highest) finite value, as ONNX defines: for floats
    // that clamps infinities.
    let (min, max) = finite_range(x.dtype());
    let lo = match lo {
        Some(lo) => ops::astype(&lo, x.dtype(), s)?,
        None => ops::scalar(min, x.dtype(), s)?,
    };
    let hi = match hi {
        Some(hi) => ops::astype(&hi, x.dtype(), s)?,
        None => ops::scalar(max, x.dtype(), s)?,
    };
    // A NaN bound clamps nothing, as ORT's CPU EP applies it (max(x, NaN) is x there).
    let y = ops::where_(&ops::isnan(&lo, s)?, x, &ops::maximum(x, &lo, s)?, s)?;
    Ok(vec![ops::where_(&ops::isnan(&hi, s)?, &y, &ops::minimum(&y, &hi, s)?, s)?])
}

/// The lowest and highest finite values of a type (integers within f64's exact range).
fn finite_range(t: Dtype) -> (f64, f64) {
    match t {
        Dtype::F32 => (f32::MIN as f64, f32::MAX as f64),
        Dtype::F16 => (-65504.0, 65504.0),
        Dtype::BF16 => (-3.3895313892515355e38, 3.3895313892515355e38),
        Dtype::F64 => (f64::MIN, f64::MAX),
        Dtype::I8 => (i8::MIN as f64, i8::MAX as f64),
        Dtype::I16 => (i16::MIN as f64, i16::MAX as f64),
        Dtype::I32 => (i32::MIN as f64, i32::MAX as f64),
        Dtype::U8 => (0.0, u8::MAX as f64),
        Dtype::U16 => (0.0, u16::MAX as f64),
        Dtype::U32 => (0.0, u32::MAX as f64),
        // 64-bit integer bounds as the nearest f64 inside the range.
        Dtype::I64 => (-9.223372036854775e18, 9.223372036854775e18),
        Dtype::U64 => (0.0, 1.844_674_407_370_955e19),
        Dtype::Bool => (0.0, 1.0),
    }
}

ep_core::register_lowering!(
    CLIP = FnLowering {
        domain: "",
        op: "Clip",
        opsets: 6..=i32::MAX,
        claim: claim_clip,
        lower: lower_clip,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::WHERE, || {
        (
            select(&[DType::F32, DType::F16, DType::I64, DType::I32, DType::U8][..]),
            broadcast_pair(0..=3),
            broadcast_pair(0..=3),
            opset(9..=22),
            seed(),
        )
            .prop_map(|(t, (c, x, _), (_, yb, _), v, seed)| {
                let y_shape = if broadcast_shape(&broadcast_shape(&c, &x).unwrap_or_default(), &yb).is_some() {
                    yb
                } else {
                    vec![]
                };
                let out = broadcast_shape(&broadcast_shape(&c, &x).expect("pair"), &y_shape).expect("checked");
                Case::op("Where", v)
                    .input_with("c", DType::Bool, &c, Values::Uniform { lo: 0.0, hi: 2.0 })
                    .input("x", t, &x)
                    .input("y", t, &y_shape)
                    .output("z", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::CLIP, || {
        (select(&[DType::F32, DType::F16, DType::I32, DType::I64][..]), shape(0..=4), 0..4u8, opset(7..=22), seed())
            .prop_map(|(t, s, bounds, v, seed)| {
                let vals = if t.is_float() { Values::Special } else { Values::Uniform { lo: -20.0, hi: 20.0 } };
                let t = if v < 12 && !t.is_float() { DType::F32 } else { t };
                let vals = if v < 12 && !t.is_float() { Values::Special } else { vals };
                let case = Case::op("Clip", v).input_with("x", t, &s, vals);
                let (lo, hi) = (-1.5f64.max(if t.is_float() { -1.5 } else { -2.0 }), 2.0);
                let case = if v >= 11 {
                    match bounds {
                        0 => case,
                        1 => case.constant("min", t, &[], Values::Data(vec![lo.floor()])),
                        2 => case.absent().constant("max", t, &[], Values::Data(vec![hi])),
                        _ => case.constant("min", t, &[], Values::Data(vec![lo.floor()])).constant(
                            "max",
                            t,
                            &[],
                            Values::Data(vec![hi]),
                        ),
                    }
                } else {
                    let case = if bounds & 1 == 1 { case.attr_float("min", lo as f32) } else { case };
                    if bounds & 2 == 2 { case.attr_float("max", hi as f32) } else { case }
                };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    });
}
