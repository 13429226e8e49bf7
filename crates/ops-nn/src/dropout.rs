//! Dropout. At inference (the default) the output is the input and the optional mask all true.
//! In training mode (opset 12's `training_mode` input true) each element is kept
//! where a uniform draw in [0, 1) is at least the ratio, and scaled by 1 / (1 - ratio), as
//! ORT's CPU kernel draws it; the mask says which were kept. Like the random generators, a
//! `seed` fixes the sequence of masks a session's runs draw (ORT's kernel draws on from its
//! seeded generator run after run), and without one every run draws anew. Drawing in training
//! mode keeps the partition eager: a compiled trace would replay its mask. A `training_mode`
//! that is data is assumed off in a compiled trace (a guard), and a run that turns it on is
//! built eagerly. Opset 6's `is_test` = 0 is left to ORT.

use ep_core::lowering::{ALL_TYPES, FnLowering, require_input_type};
use ep_core::mlx::{Array, Dtype, ops, random};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_dropout(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 2, &[ElemType::Bool])?;
    if node.attr_int("is_test", 1)? == 0 {
        return Err(Decline::new("is_test=0 is training mode"));
    }
    let ratio = node.attr_float("ratio", 0.5)?;
    if !(0.0..1.0).contains(&ratio) {
        return Err(Decline(format!("ratio {ratio} is outside [0, 1)")));
    }
    if node.input(2).is_some() {
        // Training mode scales the input: a float type.
        require_input_type(node, 0, &[ElemType::F32, ElemType::F16, ElemType::BF16, ElemType::F64])?;
    }
    Ok(())
}

fn lower_dropout(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let training = match ctx.optional_input(2).cloned() {
        Some(t) if ctx.tracing() && !ctx.is_constant(2) => {
            // A trace assumes inference (the usual value of a mode that is data) and holds
            // where the flag is false; a run that turns it on is built eagerly instead.
            let off = ops::logical_not(&ops::astype(&t, Dtype::Bool, ctx.stream())?, ctx.stream())?;
            ctx.guard(&off)?;
            false
        }
        Some(t) => {
            let s = ctx.cpu_stream();
            ops::astype(&t, Dtype::U8, s)?.to_vec::<u8>(s)?.first() == Some(&1)
        }
        None => false,
    };
    // The ratio input must lie in [0, 1), as ORT's CPU EP checks it (NaN fails).
    let s = ctx.stream();
    let ratio = match ctx.optional_input(1) {
        Some(r) => {
            let r = ops::reshape(&ops::astype(r, Dtype::F32, s)?, &[], s)?;
            let inside = ops::logical_and(
                &ops::greater_equal(&r, &ops::scalar(0.0, Dtype::F32, s)?, s)?,
                &ops::less(&r, &ops::scalar(1.0, Dtype::F32, s)?, s)?,
                s,
            )?;
            ctx.check(&inside, "ratio must be in the range [0, 1)")?;
            r
        }
        None => ops::scalar(0.5, Dtype::F32, s)?,
    };
    let x = ctx.input(0)?.clone();
    let (y, kept) = if training {
        if ctx.tracing() {
            bail!("Dropout in training mode draws a new mask every run; its partition runs eagerly");
        }
        let key = match node.attr("seed") {
            None => None,
            Some(_) => Some(ctx.seeded_key(node, node.attr_int("seed", 0)? as u64)?),
        };
        let (zero, one) = (ops::scalar(0.0, Dtype::F32, s)?, ops::scalar(1.0, Dtype::F32, s)?);
        let draw = random::uniform(&zero, &one, &x.shape(), Dtype::F32, key.as_ref(), s)?;
        let kept = ops::greater_equal(&draw, &ratio, s)?;
        // mask * x * scale, as ORT's kernel computes it (a dropped NaN or infinity is NaN, a
        // dropped negative -0), the scale 1 / (1 - ratio) in float32; half types in float32.
        let wide = if x.dtype() == Dtype::F64 { Dtype::F64 } else { Dtype::F32 };
        let scale = ops::astype(&ops::divide(&one, &ops::subtract(&one, &ratio, s)?, s)?, wide, s)?;
        let masked = ops::multiply(&ops::astype(&kept, wide, s)?, &ops::astype(&x, wide, s)?, s)?;
        let y = ops::astype(&ops::multiply(&masked, &scale, s)?, x.dtype(), s)?;
        (y, kept)
    } else {
        let kept = ops::full(&x.shape(), &ops::scalar(1.0, Dtype::Bool, s)?, Dtype::Bool, s)?;
        (x, kept)
    };
    let mut outs = vec![y];
    if node.outputs.len() > 1 {
        outs.push(kept);
    }
    Ok(outs)
}

ep_core::register_lowering!(
    DROPOUT = FnLowering {
        domain: "",
        op: "Dropout",
        opsets: 7..=i32::MAX,
        claim: claim_dropout,
        lower: lower_dropout,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    fn inference() -> BoxedStrategy<Case> {
        (float_dtype(), shape(0..=3), any::<(bool, bool)>(), opset(13..=22), seed())
            .prop_map(|(t, s, (mask, ratio), v, seed)| {
                let case = Case::op("Dropout", v).input("x", t, &s);
                let case = if ratio {
                    case.constant("ratio", DType::F32, &[], Values::Data(vec![0.5])).constant(
                        "training_mode",
                        DType::Bool,
                        &[],
                        Values::Data(vec![0.0]),
                    )
                } else {
                    case
                };
                let case = case.output("y", t, &s);
                let case = if mask { case.output("mask", DType::Bool, &s) } else { case };
                case.with_seed(seed)
            })
            .boxed()
    }

    /// Training mode: the mask is a draw, compared as samples (the kept share); the identity
    /// `agree` checks on both EPs, element by element,
    /// that the output is mask * x * 1 / (1 - ratio) (to the type's rounding; NaN where that is
    /// NaN). float32 inputs mix in NaN, infinities, zeros and the type's extremes.
    fn training() -> BoxedStrategy<Case> {
        let ratios = select(&[None, Some(0.0f32), Some(0.1), Some(0.25), Some(0.5), Some(0.75), Some(0.9)][..]);
        let dims = (collection::vec(1..=6i64, 0..=2), 32..=160i64);
        let types = select(&[DType::F32, DType::F16][..]);
        // The mode as a constant (true), or as a runtime input (true or false).
        let modes = select(&[(false, true), (true, true), (true, false)][..]);
        (types, dims, ratios, any::<Option<u16>>(), modes, opset(13..=22), seed())
            .prop_map(|(t, (lead, last), ratio, key, (as_input, on), v, seed)| {
                let s = [lead, vec![last]].concat();
                let values = if t == DType::F32 { Values::Special } else { Values::default_for(t) };
                let mut case = Case::op("Dropout", v).input_with("x", t, &s, values);
                case = match ratio {
                    Some(r) => case.constant("ratio", DType::F32, &[], Values::Data(vec![f64::from(r)])),
                    None => case.absent(),
                };
                let mode = Values::Data(vec![if on { 1.0 } else { 0.0 }]);
                case = if as_input {
                    case.input_with("training_mode", DType::Bool, &[], mode)
                } else {
                    case.constant("training_mode", DType::Bool, &[], mode)
                };
                if let Some(k) = key {
                    case = case.attr_int("seed", i64::from(k));
                }
                let scale = if on { 1.0f32 / (1.0 - ratio.unwrap_or(0.5)) } else { 1.0 };
                let tol = if t == DType::F32 { 2.5e-7 } else { 2e-3 };
                let to_f32 = || vec![("to", Attr::Int(DType::F32.onnx_code()))];
                // The output is not compared as a sample (which of its NaNs and infinities
                // are kept is a draw): the identity checks it against the mask.
                let mut case = case.intermediate("y").output("mask", DType::Bool, &s);
                // In float32 the values are read as they are, and a product by 1 is left out:
                // ORT removes a Cast to a value's own type and such a product, which would
                // leave those nodes on no EP.
                let (x, y) = if t == DType::F32 {
                    ("x", "y")
                } else {
                    case =
                        case.then("Cast", &["x"], &["check_x"], to_f32()).then("Cast", &["y"], &["check_y"], to_f32());
                    ("check_x", "check_y")
                };
                case = case.then("Cast", &["mask"], &["check_kept"], to_f32()).then(
                    "Mul",
                    &["check_kept", x],
                    &["check_masked"],
                    vec![],
                );
                let want = if scale == 1.0 {
                    "check_masked"
                } else {
                    case = case
                        .reference_constant("check_scale", DType::F32, &[], Values::Data(vec![f64::from(scale)]))
                        .then("Mul", &["check_masked", "check_scale"], &["check_want"], vec![]);
                    "check_want"
                };
                case.reference_constant("check_tol", DType::F32, &[], Values::Data(vec![tol]))
                    .then("Equal", &[y, want], &["check_same"], vec![])
                    .then("Sub", &[y, want], &["check_diff"], vec![])
                    .then("Abs", &["check_diff"], &["check_dev"], vec![])
                    .then("Abs", &[want], &["check_mag"], vec![])
                    .then("Mul", &["check_mag", "check_tol"], &["check_bound"], vec![])
                    .then("LessOrEqual", &["check_dev", "check_bound"], &["check_close"], vec![])
                    .then("IsNaN", &[y], &["check_nan_y"], vec![])
                    .then("IsNaN", &[want], &["check_nan_want"], vec![])
                    .then("And", &["check_nan_y", "check_nan_want"], &["check_both_nan"], vec![])
                    .then("Or", &["check_same", "check_close"], &["check_value"], vec![])
                    .then("Or", &["check_value", "check_both_nan"], &["agree"], vec![])
                    .identity_output("agree", &s)
                    .distribution()
                    .with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::DROPOUT, || prop_oneof![inference(), training()].boxed());
}
