//! MatMulInteger and QLinearMatMul: 8-bit matrix products accumulated exactly in int32
//! ([`ep_core::quant::integer_matmul`]: MLX multiplies matrices in floating point only, so the
//! products are split into chunks of 256 along K, every partial sum of which is exact in
//! float32), QLinearMatMul's result requantized as ORT's CPU EP does (rounding half to even).

use crate::qdq::{Q8, quantize, range};
use ep_core::graph::ElemType;
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::integer_matmul;
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result, bail};

fn f32(a: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::astype(a, Dtype::F32, s)?)
}

fn claim_matmul_integer(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 4)?;
    for i in 0..4 {
        require_input_type(node, i, Q8)?;
    }
    for i in [0, 1] {
        if ep_core::lowering::input_rank(node, i).is_none_or(|r| r < 2) {
            return Err(Decline(format!("input {i} must have rank 2 or more")));
        }
    }
    Ok(())
}

fn lower_matmul_integer(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    // As ORT's CPU EP: a's zero point one element (a scalar or 1-D), b's that or, for a 2-D b,
    // 1-D of its columns.
    let b = ctx.input(1)?.shape();
    for (i, per_column) in [(2, false), (3, b.len() == 2)] {
        if let Some(z) = ctx.optional_input(i) {
            let sh = z.shape();
            let ok = sh.len() <= 1 && (z.size() == 1 || (per_column && sh[0] == b[1]));
            if !ok {
                bail!(
                    "the zero point {i} of shape {sh:?} must be one element{}",
                    if per_column { " or one per column" } else { "" }
                );
            }
        }
    }
    Ok(vec![integer_matmul(ctx.input(0)?, ctx.input(1)?, ctx.optional_input(2), ctx.optional_input(3), s)?])
}

fn claim_qlinear_matmul(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 8, 8)?;
    for i in [0, 2, 3, 5, 7] {
        require_input_type(node, i, Q8)?;
    }
    // (Opset 21's half-type scales are read in float32, as the float32 ones are.)
    for i in [1, 4, 6] {
        require_input_type(node, i, &[ElemType::F32, ElemType::F16, ElemType::BF16])?;
    }
    for i in [0, 3] {
        if ep_core::lowering::input_rank(node, i).is_none_or(|r| r < 2) {
            return Err(Decline(format!("input {i} must have rank 2 or more")));
        }
    }
    for i in [1, 2, 4, 5, 6, 7] {
        if node.input(i).and_then(ep_core::graph::ValueInfo::rank).is_some_and(|r| r > 1) {
            return Err(Decline::new("scales and zero points must be scalars or vectors"));
        }
    }
    Ok(())
}

/// `saturate(round(acc * (a_scale * b_scale / y_scale)) + y_zp)`, the product accumulated
/// exactly in int32.
fn lower_qlinear_matmul(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    // As ORT's CPU EP: a's and the result's scale and zero point are one element each.
    for (i, what) in [(1, "a_scale"), (2, "a_zero_point"), (6, "y_scale"), (7, "y_zero_point")] {
        let p = ctx.input(i)?;
        if p.ndim() > 1 || p.size() != 1 {
            bail!("{what} of shape {:?} must be a scalar or a 1-D tensor of one element", p.shape());
        }
    }
    let acc = integer_matmul(ctx.input(0)?, ctx.input(3)?, Some(ctx.input(2)?), Some(ctx.input(5)?), s)?;
    let n = *acc.shape().last().unwrap_or(&1);
    let a_scale = ops::reshape(&f32(ctx.input(1)?, s)?, &[], s)?;
    let b_scale = f32(ctx.input(4)?, s)?;
    let b_scale =
        if b_scale.size() > 1 { ops::reshape(&b_scale, &[1, n], s)? } else { ops::reshape(&b_scale, &[], s)? };
    let y_scale = ops::reshape(&f32(ctx.input(6)?, s)?, &[], s)?;
    let multiplier = ops::divide(&ops::multiply(&a_scale, &b_scale, s)?, &y_scale, s)?;
    let t = ctx.input(7)?.dtype();
    let one = ops::scalar(1.0, Dtype::F32, s)?;
    let zp = ops::reshape(&f32(ctx.input(7)?, s)?, &[], s)?;
    let scaled = ops::multiply(&f32(&acc, s)?, &multiplier, s)?;
    // A NaN product (a NaN scale) saturates to the type's lowest value, as ORT's CPU EP's
    // float-to-integer conversion leaves it.
    let lowest = ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?;
    let scaled = ops::where_(&ops::not_equal(&scaled, &scaled, s)?, &lowest, &scaled, s)?;
    Ok(vec![quantize(&scaled, &one, Some(&zp), t, range(t)?, s)?])
}

ep_core::register_lowering!(
    MATMUL_INTEGER = FnLowering {
        domain: "",
        op: "MatMulInteger",
        opsets: 10..=i32::MAX,
        claim: claim_matmul_integer,
        lower: lower_matmul_integer,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    QLINEAR_MATMUL = FnLowering {
        domain: "",
        op: "QLinearMatMul",
        opsets: 10..=i32::MAX,
        claim: claim_qlinear_matmul,
        lower: lower_qlinear_matmul,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::qdq::spec::{full_range, qtype};
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::MATMUL_INTEGER, || {
        (qtype(), qtype(), (1..=2i64, 1..=4i64, prop_oneof![1..=40i64, 250..=600i64], 1..=4i64), 0..3u8, seed())
            .prop_map(|(ta, tb, (batch, m, k, n), zp, seed)| {
                let a_shape = if batch > 1 { vec![batch, m, k] } else { vec![m, k] };
                let y_shape = if batch > 1 { vec![batch, m, n] } else { vec![m, n] };
                let mut case = Case::op("MatMulInteger", 10).input_with("a", ta, &a_shape, full_range(ta)).input_with(
                    "b",
                    tb,
                    &[k, n],
                    Values::int8_weights(tb),
                );
                case = match zp {
                    0 => case,
                    1 => case.input_with("a_zp", ta, &[], full_range(ta)).input_with("b_zp", tb, &[], full_range(tb)),
                    _ => case.absent().input_with("b_zp", tb, &[n], full_range(tb)),
                };
                case.output("y", DType::I32, &y_shape).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::QLINEAR_MATMUL, || {
        (qtype(), (1..=3i64, prop_oneof![1..=40i64, 250..=400i64], 1..=4i64), any::<bool>(), seed())
            .prop_map(|(t, (m, k, n), half, seed)| {
                let scale = |hi: f64| Values::Uniform { lo: hi / 4.0, hi };
                // Opset 21 takes float16 scales too.
                let (v, st) = if half { (21, DType::F16) } else { (10, DType::F32) };
                Case::op("QLinearMatMul", v)
                    .input_with("a", t, &[m, k], full_range(t))
                    .input_with("a_scale", st, &[], scale(0.05))
                    .input_with("a_zp", t, &[], full_range(t))
                    .input_with("b", t, &[k, n], Values::int8_weights(t))
                    .input_with("b_scale", st, &[], scale(0.05))
                    .input_with("b_zp", t, &[], full_range(t))
                    .input_with("y_scale", st, &[], scale(20.0))
                    .input_with("y_zp", t, &[], full_range(t))
                    .output("y", t, &[m, n])
                    .with_seed(seed)
            })
            .boxed()
    });
}
