//! Shrink: `x + bias` where `x < -lambd`, `x - bias` where `x > lambd`, else 0 (floats;
//! float16 and bfloat16 compute in float32 and round once, as ORT's CPU EP does).

use ep_core::lowering::{FLOATS, FnLowering, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, FLOATS)?;
    let lambd = node.attr_float("lambd", 0.5).map_err(|e| Decline(e.to_string()))?;
    if lambd.is_nan() {
        return Err(Decline("lambd is NaN".into()));
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let (lambd, bias) = (node.attr_float("lambd", 0.5)? as f64, node.attr_float("bias", 0.0)? as f64);
    let t = x.dtype();
    let half = t == Dtype::F16 || t == Dtype::BF16;
    let xf = if half { ops::astype(x, Dtype::F32, s)? } else { x.clone() };
    let c = |v: f64| ops::scalar(v, xf.dtype(), s);
    let below = ops::less(&xf, &c(-lambd)?, s)?;
    let above = ops::greater(&xf, &c(lambd)?, s)?;
    // NaN is neither below nor above: 0, as ORT's CPU EP gives.
    let y = ops::where_(
        &below,
        &ops::add(&xf, &c(bias)?, s)?,
        &ops::where_(&above, &ops::subtract(&xf, &c(bias)?, s)?, &c(0.0)?, s)?,
        s,
    )?;
    Ok(vec![if half { ops::astype(&y, t, s)? } else { y }])
}

ep_core::register_lowering!(
    SHRINK = FnLowering {
        domain: "",
        op: "Shrink",
        opsets: 9..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, Values, register_spec};

    register_spec!(super::SHRINK, || {
        (float_dtype(), shape(0..=4), opset(9..=22), seed())
            .prop_map(|(t, s, v, seed)| {
                let case = Case::op("Shrink", v).input_with("x", t, &s, Values::Special);
                let case = match seed % 3 {
                    0 => case,
                    1 => case.attr("lambd", Attr::Float(1.5)),
                    _ => case.attr("lambd", Attr::Float(0.25)).attr("bias", Attr::Float(0.75)),
                };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    });
}
