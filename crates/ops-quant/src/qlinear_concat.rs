//! `com.microsoft` QLinearConcat (int8/uint8): each input requantized to the output's scale and
//! zero point (`saturate(round_half_even(x_scale * (x - x_zp) / y_scale) + y_zp)`, the values
//! ORT's CPU EP's per-input byte table holds) and concatenated along `axis`.

use crate::qdq::{Q8, one_value, quantize, range};
use ep_core::lowering::{FnLowering, normalize_axis, require_input_type};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let n = node.inputs.len();
    if n < 5 || !(n - 2).is_multiple_of(3) {
        return Err(Decline(format!("{n} inputs: QLinearConcat takes y_scale, y_zero_point and triples")));
    }
    let zp_type = node.input(1).and_then(|v| v.elem_type);
    for i in 0..n {
        if node.input(i).is_none() {
            return Err(Decline(format!("input {i} is missing (ORT's CPU EP reads every one)")));
        }
        if i % 3 == 0 {
            require_input_type(node, i, &[ElemType::F32])?;
        } else {
            require_input_type(node, i, Q8)?;
            if node.input(i).and_then(|v| v.elem_type) != zp_type {
                return Err(Decline::new("the inputs' and zero points' types differ"));
            }
        }
    }
    node.attr_int("axis", i64::MIN).ok().filter(|&a| a != i64::MIN).ok_or_else(|| Decline::new("axis is required"))?;
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let y_scale = one_value(ctx.input(0)?, "y_scale", s)?;
    let y_zp = one_value(ctx.input(1)?, "y_zero_point", s)?;
    let t = ctx.input(1)?.dtype();
    let mut parts: Vec<Array> = Vec::new();
    for k in 0..(node.inputs.len() - 2) / 3 {
        let x = ctx.input(2 + 3 * k)?;
        let x_scale = one_value(ctx.input(3 + 3 * k)?, "a scale", s)?;
        let x_zp = one_value(ctx.input(4 + 3 * k)?, "a zero point", s)?;
        let v = ops::multiply(&x_scale, &ops::subtract(&ops::astype(x, Dtype::F32, s)?, &x_zp, s)?, s)?;
        parts.push(quantize(&v, &y_scale, Some(&y_zp), t, range(t)?, s)?);
    }
    let rank = parts[0].ndim();
    if parts.iter().any(|p| p.ndim() != rank) {
        bail!("the inputs differ in rank");
    }
    let axis = normalize_axis(node.attr_int("axis", 0)?, rank)?;
    let first = parts[0].shape();
    for p in &parts[1..] {
        let sh = p.shape();
        if (0..rank).any(|d| d != axis && sh[d] != first[d]) {
            bail!("the inputs' shapes {first:?} and {sh:?} must match exactly except for the concatenation axis");
        }
    }
    Ok(vec![ops::concatenate(&parts, axis as i32, s)?])
}

ep_core::register_lowering!(
    QLINEAR_CONCAT = FnLowering {
        domain: "com.microsoft",
        op: "QLinearConcat",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::qdq::spec::{full_range, qtype};
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::QLINEAR_CONCAT, || {
        (qtype(), nonempty_shape(1..=3), 1..=3usize, any::<prop::sample::Index>(), seed())
            .prop_map(|(t, s, count, pick, seed)| {
                let axis = pick.index(s.len());
                let scale = Values::Uniform { lo: 0.01, hi: 0.1 };
                let mut case = Case::domain_op("com.microsoft", "QLinearConcat", 1)
                    .input_with("y_scale", DType::F32, &[], scale.clone())
                    .input_with("y_zp", t, &[], full_range(t));
                let mut out = s.clone();
                out[axis] = 0;
                for k in 0..count {
                    let mut shape = s.clone();
                    shape[axis] = s[axis] + k as i64;
                    out[axis] += shape[axis];
                    case = case
                        .input_with(&format!("x{k}"), t, &shape, full_range(t))
                        .input_with(&format!("x{k}_scale"), DType::F32, &[], scale.clone())
                        .input_with(&format!("x{k}_zp"), t, &[], full_range(t));
                }
                case.attr_int("axis", axis as i64).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });
}
