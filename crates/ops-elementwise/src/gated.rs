//! `com.microsoft` elementwise forms of recent decoder blocks (hyper-connections, gated
//! linear attention), rounded step by step as ORT's CPU EP rounds them:
//! - ScaledSiLU: `z = T(scale * x)`, `y = T(z * T(sigmoid(z)))`, the scale a scalar input when
//!   present, else the `alpha` attribute (default 1);
//! - GatedAdd: `x + T(y * gate)`, `gate` of shape `(..., 1)` broadcast over the last axis;
//! - LinearAttentionGate: `decay = T(decay_scale * softplus(a + dt_bias))` over the heads (the
//!   last axis of `a`; `dt_bias` and `decay_scale` float32 per head) and, when asked for,
//!   `beta = T(sigmoid(b))`, in float32.

use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const MS: &str = "com.microsoft";

/// `a` (float32) rounded to `t` and widened back: the value ORT's kernel holds in `t`. (A
/// conversion to an array's own type is the array itself: nothing for float32.)
fn round_to(a: Array, t: Dtype, s: &Stream) -> Result<Array> {
    Ok(ops::astype(&ops::astype(&a, t, s)?, Dtype::F32, s)?)
}

fn f32_of(a: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::astype(a, Dtype::F32, s)?)
}

fn claim_scaled_silu(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 2)?;
    require_input_type(node, 0, FLOATS)?;
    require_input_type(node, 1, FLOATS)?;
    match node.input(1).and_then(|v| v.rank()) {
        Some(r) if r != 0 => Err(Decline(format!("the scale has rank {r}; it must be a scalar"))),
        _ => Ok(()),
    }
}

fn lower_scaled_silu(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let t = x.dtype();
    let scale = match ctx.optional_input(1) {
        Some(k) if k.ndim() != 0 => bail!("the scale has shape {:?}; it must be a scalar", k.shape()),
        Some(k) => f32_of(k, s)?,
        None => ops::scalar(node.attr_float("alpha", 1.0)? as f64, Dtype::F32, s)?,
    };
    let z = round_to(ops::multiply(&f32_of(x, s)?, &scale, s)?, t, s)?;
    let gate = round_to(ops::sigmoid(&z, s)?, t, s)?;
    Ok(vec![ops::astype(&ops::multiply(&z, &gate, s)?, t, s)?])
}

ep_core::register_lowering!(
    SCALED_SILU = FnLowering {
        domain: MS,
        op: "ScaledSiLU",
        opsets: 1..=i32::MAX,
        claim: claim_scaled_silu,
        lower: lower_scaled_silu,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

/// ORT's CPU kernel: float32 and float16.
const GATED_ADD_TYPES: &[ElemType] = &[ElemType::F32, ElemType::F16];

fn claim_gated_add(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    ep_core::lowering::require_types(node, GATED_ADD_TYPES)
}

/// The shapes ORT's kernel accepts: `y` of `x`'s shape, `gate` of it with a last dimension of 1.
fn check_gated_add(x: &[i64], y: &[i64], gate: &[i64]) -> std::result::Result<(), String> {
    let Some((&last, prefix)) = x.split_last() else {
        return Err("X is a scalar; it needs rank 1 or more".into());
    };
    if y != x {
        return Err(format!("Y {y:?} must have the shape of X {x:?}"));
    }
    if last <= 0 {
        return Err(format!("X {x:?} has an empty last dimension"));
    }
    if gate.len() != x.len() || gate[..prefix.len()] != *prefix || gate[prefix.len()] != 1 {
        return Err(format!("gate {gate:?} must be X's shape {x:?} with a last dimension of 1"));
    }
    Ok(())
}

fn lower_gated_add(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, y, gate, s) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?, ctx.stream());
    check_gated_add(&x.shape(), &y.shape(), &gate.shape()).map_err(ep_core::Error::new)?;
    let t = x.dtype();
    let product = round_to(ops::multiply(&f32_of(y, s)?, &f32_of(gate, s)?, s)?, t, s)?;
    Ok(vec![ops::astype(&ops::add(&f32_of(x, s)?, &product, s)?, t, s)?])
}

ep_core::register_lowering!(
    GATED_ADD = FnLowering {
        domain: MS,
        op: "GatedAdd",
        opsets: 1..=i32::MAX,
        claim: claim_gated_add,
        lower: lower_gated_add,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_gate(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 4)?;
    for i in [0, 3] {
        require_input_type(node, i, GATED_ADD_TYPES)?;
    }
    for i in [1, 2] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    Ok(())
}

fn lower_gate(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (a, s) = (ctx.input(0)?, ctx.stream());
    let shape = a.shape();
    let Some(&heads) = shape.last() else { bail!("a is a scalar; it needs rank 1 or more (heads last)") };
    if heads <= 0 {
        bail!("a {shape:?} has no heads (an empty last dimension)");
    }
    let per_head = |i: usize, what: &str| -> Result<Array> {
        let v = ctx.input(i)?;
        if v.size() as i64 != heads {
            bail!("{what} has {} values; a has {heads} heads", v.size());
        }
        Ok(ops::reshape(v, &[heads], s)?)
    };
    let (bias, scale) = (per_head(1, "dt_bias")?, per_head(2, "decay_scale")?);
    let t = a.dtype();
    let v = ops::add(&f32_of(a, s)?, &bias, s)?;
    // softplus(v) = log(exp(v) + exp(0)), stable at both ends (as the Softplus lowering).
    let softplus = ops::logaddexp(&v, &ops::scalar(0.0, Dtype::F32, s)?, s)?;
    let mut outs = vec![ops::astype(&ops::multiply(&scale, &softplus, s)?, t, s)?];
    if node.outputs.len() > 1 {
        if node.output(1).is_none() {
            // An output slot left empty: nothing to compute (its place held).
            outs.push(outs[0].clone());
            return Ok(outs);
        }
        let Some(b) = ctx.optional_input(3) else { bail!("the beta output needs the b input") };
        if b.shape() != shape {
            bail!("b {:?} must have the shape of a {shape:?}", b.shape());
        }
        outs.push(ops::astype(&ops::sigmoid(&f32_of(b, s)?, s)?, t, s)?);
    }
    Ok(outs)
}

ep_core::register_lowering!(
    LINEAR_ATTENTION_GATE = FnLowering {
        domain: MS,
        op: "LinearAttentionGate",
        opsets: 1..=i32::MAX,
        claim: claim_gate,
        lower: lower_gate,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(test)]
mod tests {
    use super::check_gated_add;

    #[test]
    fn gated_add_checks_the_shapes_ort_checks() {
        assert!(check_gated_add(&[2, 3, 4], &[2, 3, 4], &[2, 3, 1]).is_ok());
        assert!(check_gated_add(&[], &[], &[]).is_err(), "a scalar X");
        assert!(check_gated_add(&[2, 4], &[2, 3], &[2, 1]).is_err(), "Y of another shape");
        assert!(check_gated_add(&[2, 4], &[2, 4], &[2, 4]).is_err(), "a gate over the last axis");
        assert!(check_gated_add(&[2, 4], &[2, 4], &[1, 1]).is_err(), "a broadcast gate");
        assert!(check_gated_add(&[2, 0], &[2, 0], &[2, 1]).is_err(), "an empty last axis");
    }
}

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::SCALED_SILU, || {
        (dtype_of(&[DType::F32, DType::F16, DType::BF16]), shape(0..=4), 0..3u8, seed())
            .prop_map(|(t, s, form, seed)| {
                let case = Case::domain_op("com.microsoft", "ScaledSiLU", 1).input_with("x", t, &s, Values::Special);
                let case = match form {
                    // The attribute (or its default), or a scalar input of another float type.
                    0 => case,
                    1 => case.attr_float("alpha", 1.0 / 0.6),
                    _ => case.input_with("scale", DType::F32, &[], Values::Uniform { lo: -3.0, hi: 3.0 }),
                };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::LINEAR_ATTENTION_GATE, || {
        (float_dtype(), nonempty_shape(1..=3), any::<bool>(), seed())
            .prop_map(|(t, s, beta, seed)| {
                let heads = *s.last().expect("rank 1 or more");
                let case = Case::domain_op("com.microsoft", "LinearAttentionGate", 1)
                    .input_with("a", t, &s, Values::Uniform { lo: -6.0, hi: 6.0 })
                    .input("dt_bias", DType::F32, &[heads])
                    .input_with("decay_scale", DType::F32, &[heads], Values::Uniform { lo: -2.0, hi: 0.0 });
                let case = if beta { case.input("b", t, &s) } else { case };
                let case = case.output("decay", t, &s);
                if beta { case.output("beta", t, &s) } else { case }.with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::GATED_ADD, || {
        (float_dtype(), nonempty_shape(1..=4), seed())
            .prop_map(|(t, s, seed)| {
                let mut gate = s.clone();
                *gate.last_mut().expect("rank 1 or more") = 1;
                Case::domain_op("com.microsoft", "GatedAdd", 1)
                    .input("x", t, &s)
                    .input("y", t, &s)
                    .input_with("gate", t, &gate, Values::Uniform { lo: -2.0, hi: 2.0 })
                    .output("output", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });
}
