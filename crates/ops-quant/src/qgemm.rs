//! `com.microsoft` QGemm: `alpha * (A - a_zp)(B - b_zp) + C` on 8-bit integers (uint8 A with
//! uint8 or int8 B, int8 with int8), B's scale and zero point per tensor or per column, the
//! int32 C in the accumulator's units. The integer product is exact (see
//! [`ep_core::quant::integer_matmul`]); the result is scaled by `(alpha * a_scale) * b_scale`
//! (divided by `y_scale` when given) as float32, or requantized around `y_zero_point`
//! (saturated in float, rounded half to even), as ORT's CPU kernel does.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::integer_matmul;
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 6, 9)?;
    for i in 0..6 {
        if node.input(i).is_none() {
            return Err(Decline::new(format!("input {i} is missing")));
        }
    }
    let a = node.input(0).and_then(|v| v.elem_type);
    let b = node.input(3).and_then(|v| v.elem_type);
    match (a, b) {
        (Some(ElemType::U8), Some(ElemType::U8 | ElemType::I8)) | (Some(ElemType::I8), Some(ElemType::I8)) => {}
        other => {
            return Err(Decline(format!(
                "A and B of types {other:?}: uint8 x uint8/int8 and int8 x int8 are supported"
            )));
        }
    }
    for (i, t) in [(2, a), (5, b)] {
        if node.input(i).and_then(|v| v.elem_type) != t {
            return Err(Decline::new(format!("zero point {i} differs in type from its matrix")));
        }
    }
    for i in [1, 4, 7] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    require_input_type(node, 6, &[ElemType::I32])?;
    if node.input(8).is_some_and(|v| v.elem_type != a) {
        return Err(Decline::new("y_zero_point differs in type from A"));
    }
    for i in [0, 3] {
        if ep_core::lowering::input_rank(node, i).is_some_and(|r| r != 2) {
            return Err(Decline::new(format!("input {i} is not a matrix")));
        }
    }
    // ORT's kernel leaves its output unwritten for an empty inner dimension: nothing to match.
    let trans = |name: &str| node.attr_int(name, 0).map(|v| v != 0);
    let inner = [(0, if trans("transA")? { 0 } else { 1 }), (3, if trans("transB")? { 1 } else { 0 })];
    if inner
        .iter()
        .any(|&(i, d)| node.input(i).and_then(|v| v.shape.as_ref()).and_then(|s| s.get(d).copied()) == Some(Some(0)))
    {
        return Err(Decline::new("an empty inner dimension is left to the CPU EP"));
    }
    Ok(())
}

/// A parameter that must hold one value, as a float32 scalar.
fn scalar(a: &Array, what: &str, s: &Stream) -> Result<Array> {
    if a.ndim() > 1 || a.size() != 1 {
        bail!("{what} of shape {:?} must be a scalar or a vector of one element", a.shape());
    }
    Ok(ops::reshape(&ops::astype(a, Dtype::F32, s)?, &[], s)?)
}

/// B's scale or zero point: one value, or one per column (`[N]`).
fn per_column(a: &Array, n: i64, what: &str) -> Result<()> {
    let shape = a.shape();
    if !(shape.is_empty() || shape == [1] || shape == [n]) {
        bail!("{what} of shape {shape:?} must be a scalar, [1] or [{n}]");
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let mut a = ctx.input(0)?.clone();
    let mut b = ctx.input(3)?.clone();
    if a.ndim() != 2 || b.ndim() != 2 {
        bail!("A {:?} and B {:?} must be matrices", a.shape(), b.shape());
    }
    if node.attr_int("transA", 0)? != 0 {
        a = ops::transpose_axes(&a, &[1, 0], s)?;
    }
    if node.attr_int("transB", 0)? != 0 {
        b = ops::transpose_axes(&b, &[1, 0], s)?;
    }
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    if b.shape()[0] != k {
        bail!("A of {k} columns cannot multiply B of {} rows", b.shape()[0]);
    }
    if k == 0 {
        bail!("the inner dimension is empty (ORT's kernel leaves such an output unwritten)");
    }
    let a_scale = scalar(ctx.input(1)?, "a_scale", s)?;
    let a_zp = ctx.input(2)?;
    scalar(a_zp, "a_zero_point", s)?;
    let (b_scale, b_zp) = (ctx.input(4)?, ctx.input(5)?);
    per_column(b_scale, n, "b_scale")?;
    per_column(b_zp, n, "b_zero_point")?;
    if b_scale.shape() != b_zp.shape() {
        bail!("b_scale {:?} and b_zero_point {:?} differ in shape", b_scale.shape(), b_zp.shape());
    }
    let mut acc = integer_matmul(&a, &b, Some(a_zp), Some(b_zp), s)?;
    if let Some(c) = ctx.optional_input(6) {
        let cs = c.shape();
        let fits = cs.len() <= 2 && cs.iter().rev().zip([n, m]).all(|(&d, full)| d == 1 || d == full);
        if !fits {
            bail!("C of shape {cs:?} does not broadcast to [{m}, {n}]");
        }
        acc = ops::add(&acc, c, s)?;
    }
    let alpha = ops::scalar(f64::from(node.attr_float("alpha", 1.0)?), Dtype::F32, s)?;
    let b_scale = ops::astype(b_scale, Dtype::F32, s)?;
    let b_scale =
        if b_scale.size() > 1 { ops::reshape(&b_scale, &[1, n], s)? } else { ops::reshape(&b_scale, &[], s)? };
    let mut scale = ops::multiply(&ops::multiply(&alpha, &a_scale, s)?, &b_scale, s)?;
    if let Some(y) = ctx.optional_input(7) {
        scale = ops::divide(&scale, &scalar(y, "y_scale", s)?, s)?;
    }
    let v = ops::multiply(&ops::astype(&acc, Dtype::F32, s)?, &scale, s)?;
    let Some(zp) = ctx.optional_input(8) else { return Ok(vec![v]) };
    let t = zp.dtype();
    let zp = scalar(zp, "y_zero_point", s)?;
    let (lo, hi) = if t == Dtype::U8 { (0.0, 255.0) } else { (-128.0, 127.0) };
    let low = ops::subtract(&ops::scalar(lo, Dtype::F32, s)?, &zp, s)?;
    let high = ops::subtract(&ops::scalar(hi, Dtype::F32, s)?, &zp, s)?;
    // Saturated in float first (a NaN to the lowest), then rounded and shifted.
    let v = ops::where_(&ops::isnan(&v, s)?, &low, &ops::minimum(&ops::maximum(&v, &low, s)?, &high, s)?, s)?;
    let y = ops::add(&ops::round(&v, s)?, &zp, s)?;
    Ok(vec![ops::astype(&y, t, s)?])
}

ep_core::register_lowering!(
    QGEMM = FnLowering {
        domain: "com.microsoft",
        op: "QGemm",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::qdq::spec::full_range;
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::QGEMM, || {
        let dims = (1..=5i64, 1..=300i64, 1..=5i64);
        let forms = (0..3u8, any::<bool>(), any::<bool>(), any::<bool>(), 0..8u8, 0..3u8);
        (dims, forms, seed())
            .prop_map(|((m, k, n), (types, ta, tb, per_col, c_form, out), seed)| {
                let k = if seed % 3 == 0 { k } else { k % 20 + 1 };
                let (at, bt) = [(DType::U8, DType::U8), (DType::U8, DType::I8), (DType::I8, DType::I8)][types as usize];
                let a = if ta { vec![k, m] } else { vec![m, k] };
                let b = if tb { vec![n, k] } else { vec![k, n] };
                let col = if per_col { vec![n] } else { vec![] };
                let mut case = Case::domain_op("com.microsoft", "QGemm", 1)
                    .input_with("a", at, &a, full_range(at))
                    .constant("a_scale", DType::F32, &[], Values::Uniform { lo: 0.01, hi: 0.1 })
                    .constant("a_zp", at, &[], full_range(at))
                    // (int8 weights within 7 bits: see `Values::int8_weights`.)
                    .input_with("b", bt, &b, Values::int8_weights(bt))
                    .constant("b_scale", DType::F32, &col, Values::Uniform { lo: 0.01, hi: 0.1 })
                    .constant("b_zp", bt, &col, Values::int8_weights(bt));
                let c_shape: Option<Vec<i64>> = [
                    None,
                    Some(vec![]),
                    Some(vec![1]),
                    Some(vec![n]),
                    Some(vec![1, n]),
                    Some(vec![m, 1]),
                    Some(vec![m, n]),
                    None,
                ][c_form as usize]
                    .clone();
                case = match &c_shape {
                    Some(c) => case.input_with("c", DType::I32, c, Values::Uniform { lo: -5000.0, hi: 5000.0 }),
                    None => case.absent(),
                };
                let case = match out {
                    0 => case.output("y", DType::F32, &[m, n]),
                    1 => case.constant("y_scale", DType::F32, &[], Values::Uniform { lo: 0.5, hi: 2.0 }).output(
                        "y",
                        DType::F32,
                        &[m, n],
                    ),
                    _ => case
                        .constant("y_scale", DType::F32, &[], Values::Uniform { lo: 0.5, hi: 2.0 })
                        .constant("y_zp", at, &[], full_range(at))
                        .output("y", at, &[m, n]),
                };
                let alpha = [1.0, 0.5, 1.7][(seed % 3) as usize];
                case.attr_int("transA", ta as i64)
                    .attr_int("transB", tb as i64)
                    .attr_float("alpha", alpha)
                    .with_seed(seed)
            })
            .boxed()
    });
}
