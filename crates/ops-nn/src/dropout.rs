//! Dropout at inference: the output is the input, the optional mask all true. A node in
//! training mode (opset 12's `training_mode` input true, or opset 6's `is_test` = 0) is an error.

use ep_core::lowering::{ALL_TYPES, FnLowering, require_input_type};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_dropout(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, ALL_TYPES)?;
    if let Some(t) = node.input(2)
        && !t.is_constant
    {
        return Err(Decline::new("training_mode is not a constant: it may turn dropout on"));
    }
    require_input_type(node, 2, &[ElemType::Bool])?;
    if node.attr_int("is_test", 1)? == 0 {
        return Err(Decline::new("is_test=0 is training mode"));
    }
    let ratio = node.attr_float("ratio", 0.5)?;
    if !(0.0..1.0).contains(&ratio) {
        return Err(Decline(format!("ratio {ratio} is outside [0, 1)")));
    }
    Ok(())
}

fn lower_dropout(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    if let Some(t) = ctx.optional_input(2) {
        let s = ctx.cpu_stream();
        if ops::astype(t, Dtype::U8, s)?.to_vec::<u8>(s)?.first() == Some(&1) {
            bail!("Dropout in training mode is not supported");
        }
    }
    // The ratio input must lie in [0, 1), as ORT's CPU EP checks it (NaN fails).
    if let Some(r) = ctx.optional_input(1) {
        let s = ctx.stream();
        let r = ops::astype(r, Dtype::F32, s)?;
        let inside = ops::logical_and(
            &ops::greater_equal(&r, &ops::scalar(0.0, Dtype::F32, s)?, s)?,
            &ops::less(&r, &ops::scalar(1.0, Dtype::F32, s)?, s)?,
            s,
        )?;
        ctx.check(&inside, "ratio must be in the range [0, 1)")?;
    }
    let x = ctx.input(0)?;
    let mut outs = vec![x.clone()];
    if node.outputs.len() > 1 {
        outs.push(ops::full(&x.shape(), &ops::scalar(1.0, Dtype::Bool, ctx.stream())?, Dtype::Bool, ctx.stream())?);
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
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::DROPOUT, || {
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
    });
}
