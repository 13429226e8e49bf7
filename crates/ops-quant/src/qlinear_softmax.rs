//! `com.microsoft` QLinearSoftmax on int8/uint8, as ORT's CPU kernel computes it: a 256-entry
//! float32 table of `exp(x_scale * (i - 255) + shift)` (built on the host in double, the
//! shift keeping a row's sum finite), each element's entry at `255 + x - max(row)`, the row's
//! entries summed in order, and `round_half_even(entry * floor(1 / y_scale) / sum)` plus the
//! zero point, saturated. The `opset` attribute picks the reduction: the trailing axes from
//! `axis` flattened into one row (before 13) or the one `axis`.

use crate::qdq::Q8;
use ep_core::lowering::{FnLowering, input_rank, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 4, 5)?;
    for i in [0, 1, 3] {
        if node.input(i).is_none() {
            return Err(Decline::new(format!("input {i} is missing")));
        }
    }
    for i in [0, 2, 4] {
        require_input_type(node, i, Q8)?;
    }
    for i in [1, 3] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    if node.attr("opset").is_none() {
        return Err(Decline::new("the opset attribute is required"));
    }
    let rank = input_rank(node, 0).ok_or_else(|| Decline::new("the input's rank is not known"))?;
    if rank == 0 {
        return Err(Decline::new("a scalar input is left to the CPU EP"));
    }
    normalize_axis(axis(node)?, rank)?;
    Ok(())
}

/// Whether the emulated Softmax is from before opset 13 (ORT keeps the attribute in an int:
/// a value past 32 bits is cut to them).
fn before_13(node: &NodeInfo) -> std::result::Result<bool, String> {
    Ok((node.attr_int("opset", 13)? as i32) < 13)
}

fn axis(node: &NodeInfo) -> std::result::Result<i64, String> {
    node.attr_int("axis", if before_13(node)? { 1 } else { -1 })
}

/// ORT's table for rows of `d` elements.
fn table(x_scale: f32, d: i64) -> Result<Array> {
    let q = f32::MAX / d as f32;
    let shift = ((f64::from(q)).ln() - 5.0).max(0.0) / f64::from(x_scale);
    let t: Vec<f32> = (0..256).map(|i| ((f64::from(i) - 255.0 + shift) * f64::from(x_scale)).exp() as f32).collect();
    Ok(Array::from_slice(&t, &[256])?)
}

/// Softmax along the last axis of `x` (`[.., D]`).
fn rows(x: &Array, x_scale: f32, y_scale: f32, y_zp: f32, s: &Stream) -> Result<Array> {
    let t = x.dtype();
    let last = x.ndim() as i32 - 1;
    let d = x.shape()[last as usize];
    let xi = ops::astype(x, Dtype::I32, s)?;
    let max = ops::max_axes(&xi, &[last], true, s)?;
    let at = ops::add(&ops::subtract(&xi, &max, s)?, &ops::scalar(255.0, Dtype::I32, s)?, s)?;
    let vt = ops::take(&table(x_scale, d)?, &at, 0, s)?;
    // In row order, as the CPU kernel adds them: the last of the running sums.
    let running = ops::cumulative(&vt, last, false, false, true, s)?;
    let sum = ops::slice(&running, &[vec![0; last as usize], vec![d - 1]].concat(), &running.shape(), s)?;
    let f = |v: f32| ops::scalar(f64::from(v), Dtype::F32, s);
    let ys = (1.0f32 / y_scale).floor();
    let q = ops::round(&ops::divide(&ops::multiply(&vt, &f(ys)?, s)?, &sum, s)?, s)?;
    // An overflowing product (or NaN) converts as x86 does: 0 for uint8, int32's lowest for
    // int8 (plus the zero point, wrapping: -128 for a zero point from 0 up, else 127).
    let finite = ops::less(&ops::abs(&q, s)?, &f(f32::INFINITY)?, s)?;
    let (lo, hi, overflow) = match t {
        Dtype::U8 => (0.0, 255.0, y_zp),
        _ => (-128.0, 127.0, if y_zp >= 0.0 { -128.0 } else { 127.0 }),
    };
    let y = ops::clip(&ops::add(&q, &f(y_zp)?, s)?, Some(&f(lo)?), Some(&f(hi)?), s)?;
    let y = ops::where_(&finite, &y, &f(overflow)?, s)?;
    Ok(ops::astype(&y, t, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let required = |i: usize, what: &str| -> Result<f32> {
        ctx.host_one_f32(i, what)?.ok_or_else(|| ep_core::Error::new(format!("{what} is missing")))
    };
    let (x_scale, y_scale) = (required(1, "X_scale")?, required(3, "y_scale")?);
    let y_zp = ctx.host_one_f32(4, "y_zero_point")?.unwrap_or(0.0);
    let x = ctx.input(0)?;
    let shape = x.shape();
    let rank = shape.len();
    if x.size() == 0 {
        return Ok(vec![x.clone()]);
    }
    let axis = normalize_axis(axis(node)?, rank)?;
    let y = if before_13(node)? {
        let outer: i64 = shape[..axis].iter().product();
        let d: i64 = shape[axis..].iter().product();
        let y = rows(&ops::reshape(x, &[outer, d], s)?, x_scale, y_scale, y_zp, s)?;
        ops::reshape(&y, &shape, s)?
    } else {
        let mut perm: Vec<i32> = (0..rank as i32).collect();
        perm.swap(axis, rank - 1);
        let y = rows(&ops::transpose_axes(x, &perm, s)?, x_scale, y_scale, y_zp, s)?;
        ops::transpose_axes(&y, &perm, s)?
    };
    Ok(vec![y])
}

ep_core::register_lowering!(
    QLINEAR_SOFTMAX = FnLowering {
        domain: "com.microsoft",
        op: "QLinearSoftmax",
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

    register_spec!(super::QLINEAR_SOFTMAX, || {
        (qtype(), nonempty_shape(1..=3), prop_oneof![Just(11i64), Just(13)], 0..4usize, 0..3u8, seed())
            .prop_map(|(t, mut shape, opset, axis, y_scale, seed)| {
                let rank = shape.len();
                // Now and then a long row (a classifier's), where the order of the sum shows.
                if seed % 4 == 0 {
                    shape[rank - 1] = 300;
                }
                let axis = (axis % rank) as i64 - if seed % 2 == 0 { 0 } else { rank as i64 };
                // 1/256 (a probability of 1 saturates), a coarser scale, and a fine one (whose
                // products overflow on short rows, as ORT's kernel answers them).
                let y_scale = [1.0 / 256.0, 0.02, 0.003][y_scale as usize];
                let zp = if t == DType::I8 { -128.0 } else { 0.0 };
                Case::domain_op("com.microsoft", "QLinearSoftmax", 1)
                    .input_with("x", t, &shape, full_range(t))
                    .constant("x_scale", DType::F32, &[], Values::Uniform { lo: 0.01, hi: 0.5 })
                    .constant("x_zp", t, &[], full_range(t))
                    .constant("y_scale", DType::F32, &[], Values::Data(vec![y_scale]))
                    .constant("y_zp", t, &[], Values::Data(vec![zp]))
                    .attr_int("opset", opset)
                    .attr_int("axis", axis)
                    .output("y", t, &shape)
                    .with_seed(seed)
            })
            .boxed()
    });
}
