//! `com.microsoft` GatedRMSNorm (Mamba2's and gated linear attention's output norm):
//! `Y = X * rsqrt(mean(X^2) + epsilon) * scale * act(gate)`, the mean over each run of `C`
//! values of the last axis (`C` the scale's length, the last axis a multiple of it: a per-head
//! norm over packed heads), `act` SiLU (`silu` or `swish`, the default) or `sigmoid`. Float32 arithmetic,
//! rounded once, as ORT's CPU EP computes it (its kernel takes float32 and float16).

use crate::norm::{f32_of, rms_normalize};
use ep_core::lowering::{FnLowering, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// Whether the gate's activation is a plain sigmoid (else SiLU, also named `swish`); ORT's
/// kernel refuses other names.
fn sigmoid_gate(node: &NodeInfo) -> std::result::Result<bool, String> {
    match node.attr("activation") {
        None => Ok(false),
        Some(AttrValue::String(a)) if a == "silu" || a == "swish" => Ok(false),
        Some(AttrValue::String(a)) if a == "sigmoid" => Ok(true),
        Some(other) => Err(format!("activation {other:?} is not silu, swish or sigmoid")),
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    require_types(node, &[ElemType::F32, ElemType::F16])?;
    sigmoid_gate(node).map(|_| ()).map_err(Decline)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, scale, gate, s) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?, ctx.stream());
    let shape = x.shape();
    let Some((&last, prefix)) = shape.split_last() else { bail!("X is a scalar; it needs rank 1 or more") };
    if gate.shape() != shape {
        bail!("the gate {:?} must have the shape of X {shape:?}", gate.shape());
    }
    let c = scale.size() as i64;
    if c == 0 || last % c != 0 {
        bail!("X's last dimension {last} is not a multiple of the scale's length {c}");
    }
    if x.size() == 0 {
        return Ok(vec![x.clone()]);
    }
    let rows: Vec<i64> = prefix.iter().copied().chain([last / c, c]).collect();
    let grouped = ops::reshape(&f32_of(x, s)?, &rows, s)?;
    let scale = ops::reshape(&f32_of(scale, s)?, &[c], s)?;
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    let (normed, _) = rms_normalize(&grouped, Some(&scale), &[-1], eps, s)?;
    let z = ops::reshape(&f32_of(gate, s)?, &rows, s)?;
    let sig = ops::sigmoid(&z, s)?;
    let act = if sigmoid_gate(node).map_err(ep_core::Error::new)? { sig } else { ops::multiply(&z, &sig, s)? };
    let y = ops::multiply(&normed, &act, s)?;
    Ok(vec![ops::reshape(&ops::astype(&y, x.dtype(), s)?, &shape, s)?])
}

ep_core::register_lowering!(
    GATED_RMS_NORM = FnLowering {
        domain: "com.microsoft",
        op: "GatedRMSNorm",
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
    use conformance_spec::{Case, register_spec};

    register_spec!(super::GATED_RMS_NORM, || {
        (float_dtype(), nonempty_shape(0..=2), 1..=4i64, 1..=8i64, 0..3u8, seed())
            .prop_map(|(t, prefix, heads, c, act, seed)| {
                let x: Vec<i64> = prefix.iter().copied().chain([heads * c]).collect();
                let case = Case::domain_op("com.microsoft", "GatedRMSNorm", 1)
                    .input("x", t, &x)
                    .input("scale", t, &[c])
                    .input("gate", t, &x)
                    .attr_float("epsilon", 1e-5);
                let case = match act {
                    0 => case,
                    1 => case.attr_str("activation", if seed % 2 == 0 { "silu" } else { "swish" }),
                    _ => case.attr_str("activation", "sigmoid"),
                };
                case.output("y", t, &x).with_seed(seed)
            })
            .boxed()
    });
}
