//! `com.microsoft` MatMulInteger16: an int16 matrix product accumulated in int32, wrapping on
//! overflow as ORT's CPU EP does.
//!
//! MLX multiplies integers in floating point only, where a product of two int16 values is not
//! exact. Each operand is split into bytes, `a = 256 a_hi + a_lo` (`a_hi` in -128..=127,
//! `a_lo` in 0..=255), and the four byte products are computed exactly by the 8-bit integer
//! matrix product; they are combined modulo 2^32 in uint32 and read back as int32.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::integer_matmul;
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    for i in [0, 1] {
        require_input_type(node, i, &[ElemType::I16])?;
        if ep_core::lowering::input_rank(node, i).is_none_or(|r| r < 2) {
            return Err(Decline(format!("input {i} must have rank 2 or more")));
        }
    }
    Ok(())
}

/// `(hi, lo)` with `x = 256 hi + lo`, `lo` in 0..=255, both int32.
fn bytes(x: &Array, s: &Stream) -> Result<(Array, Array)> {
    let x = ops::astype(x, Dtype::I32, s)?;
    let lo = ops::bitwise_and(&x, &ops::scalar(255.0, Dtype::I32, s)?, s)?;
    // `(x - lo) / 256` exactly (MLX's integer floor_divide truncates toward zero).
    let hi =
        ops::astype(&ops::divide(&ops::subtract(&x, &lo, s)?, &ops::scalar(256.0, Dtype::I32, s)?, s)?, Dtype::I32, s)?;
    Ok((hi, lo))
}

fn lower(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (a_hi, a_lo) = bytes(ctx.input(0)?, s)?;
    let (b_hi, b_lo) = bytes(ctx.input(1)?, s)?;
    let product = |a: &Array, b: &Array| -> Result<Array> {
        Ok(ops::astype(&integer_matmul(a, b, None, None, s)?, Dtype::U32, s)?)
    };
    let u = |v: f64| ops::scalar(v, Dtype::U32, s);
    let hh = ops::multiply(&product(&a_hi, &b_hi)?, &u(65536.0)?, s)?;
    let mid = ops::add(&product(&a_hi, &b_lo)?, &product(&a_lo, &b_hi)?, s)?;
    let mid = ops::multiply(&mid, &u(256.0)?, s)?;
    let sum = ops::add(&ops::add(&hh, &mid, s)?, &product(&a_lo, &b_lo)?, s)?;
    Ok(vec![ops::astype(&sum, Dtype::I32, s)?])
}

ep_core::register_lowering!(
    MATMUL_INTEGER16 = FnLowering {
        domain: "com.microsoft",
        op: "MatMulInteger16",
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
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::MATMUL_INTEGER16, || {
        (1..=2i64, 1..=4i64, prop_oneof![1..=40i64, 250..=400i64], 1..=4i64, any::<bool>(), seed())
            .prop_map(|(batch, m, k, n, wide, seed)| {
                let a = if batch > 1 { vec![batch, m, k] } else { vec![m, k] };
                let y = if batch > 1 { vec![batch, m, n] } else { vec![m, n] };
                // The full int16 range (sums that wrap past int32) or small values.
                let v = if wide {
                    Values::Uniform { lo: -32768.0, hi: 32768.0 }
                } else {
                    Values::Uniform { lo: -300.0, hi: 300.0 }
                };
                Case::domain_op("com.microsoft", "MatMulInteger16", 1)
                    .input_with("a", DType::I16, &a, v.clone())
                    .input_with("b", DType::I16, &[k, n], v)
                    .output("y", DType::I32, &y)
                    .with_seed(seed)
            })
            .boxed()
    });
}
