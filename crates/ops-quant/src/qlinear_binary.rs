//! `com.microsoft` QLinearAdd, QLinearMul and QLinearWhere on int8/uint8, with numpy
//! broadcasting. Each output byte is a function of the input bytes alone (and, for Where, the
//! condition) once the scales and
//! zero points are known, so it is read from a table built on the host in float32 with ORT's
//! CPU EP's own operations (fused multiply-adds where its vector kernels use them, round half
//! to even, saturation): exact to the byte, and one gather on the device.
//!
//! The scales and zero points are read on the host: as constants (as quantized exports have
//! them) they cost nothing per run; a runtime value makes the partition run eagerly.

use crate::qdq::Q8;
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// The quantized type's byte values, in table order (`lo..=hi`).
fn levels(t: Dtype) -> Result<std::ops::RangeInclusive<i32>> {
    Ok(match t {
        Dtype::I8 => -128..=127,
        Dtype::U8 => 0..=255,
        other => bail!("{other:?} is not int8 or uint8"),
    })
}

/// Round half to even and saturate to `t`'s range, as ORT's requantization does: its vector
/// conversion to int32 turns a NaN, an infinity or anything past int32 into `i32::MIN`, which
/// saturates to the type's lowest value.
fn saturate(v: f32, t: Dtype) -> i32 {
    let r = levels(t).expect("checked at claim");
    let v = v.round_ties_even();
    if v.is_nan() || v.abs() >= 2147483648.0 {
        return *r.start();
    }
    v.clamp(*r.start() as f32, *r.end() as f32) as i32
}

fn table_array(values: Vec<i32>, t: Dtype) -> Result<Array> {
    let n = values.len() as i64;
    Ok(match t {
        Dtype::I8 => Array::from_slice(&values.iter().map(|&v| v as i8).collect::<Vec<_>>(), &[n])?,
        _ => Array::from_slice(&values.iter().map(|&v| v as u8).collect::<Vec<_>>(), &[n])?,
    })
}

/// The position of each byte of `x` in a table of `t`'s levels, as int32.
fn position(x: &Array, t: Dtype, s: &Stream) -> Result<Array> {
    let lo = *levels(t)?.start();
    let p = ops::astype(x, Dtype::I32, s)?;
    Ok(if lo == 0 { p } else { ops::subtract(&p, &ops::scalar(lo as f64, Dtype::I32, s)?, s)? })
}

fn claim_binary(node: &NodeInfo) -> std::result::Result<(), Decline> {
    // A, A_scale, A_zero_point?, B, B_scale, B_zero_point?, C_scale, C_zero_point?
    require_inputs(node, 7, 8)?;
    for i in [0, 1, 3, 4, 6] {
        if node.input(i).is_none() {
            return Err(Decline::new(format!("input {i} is missing")));
        }
    }
    for i in [0, 2, 3, 5, 7] {
        require_input_type(node, i, Q8)?;
    }
    for i in [1, 4, 6] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    if node.input(3).map(|v| v.elem_type) != node.input(0).map(|v| v.elem_type) {
        return Err(Decline::new("A and B differ in type"));
    }
    Ok(())
}

/// The table of `f(a, b)` over every pair of bytes (`a` major) and its gather.
fn lower_pairs(ctx: &mut LowerCtx<'_>, f: &dyn Fn(f32, f32) -> f32) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (a, b) = (ctx.input(0)?, ctx.input(3)?);
    let t = a.dtype();
    let levels = levels(t)?;
    let n = levels.clone().count() as i32;
    let mut table = Vec::with_capacity((n * n) as usize);
    for x in levels.clone() {
        for y in levels.clone() {
            table.push(saturate(f(x as f32, y as f32), t));
        }
    }
    let table = table_array(table, t)?;
    let at = ops::add(
        &ops::multiply(&position(a, t, s)?, &ops::scalar(n as f64, Dtype::I32, s)?, s)?,
        &position(b, t, s)?,
        s,
    )?;
    Ok(vec![ops::take(&table, &at, 0, s)?])
}

/// The scales and zero points of A, B and C.
struct Params {
    a: (f32, f32),
    b: (f32, f32),
    c: (f32, f32),
}

fn params(ctx: &LowerCtx<'_>) -> Result<Params> {
    let get = |scale: usize, zp: usize, name: &str| -> Result<(f32, f32)> {
        let what = format!("{name}_scale");
        let sc = ctx.host_one_f32(scale, &what)?.ok_or_else(|| ep_core::Error::new(format!("{what} is missing")))?;
        Ok((sc, ctx.host_one_f32(zp, &format!("{name}_zero_point"))?.unwrap_or(0.0)))
    };
    Ok(Params { a: get(1, 2, "A")?, b: get(4, 5, "B")?, c: get(6, 7, "C")? })
}

/// Whether ORT's broadcasting hands its kernel A as the scalar side, with the operands
/// swapped: A holds one element, or (B holding more than one) A is broadcast along the
/// innermost output axis longer than 1.
fn a_is_scalar_side(a: &[i64], b: &[i64]) -> bool {
    let count = |s: &[i64]| s.iter().product::<i64>();
    if count(a) == 1 {
        return true;
    }
    if count(b) == 1 {
        return false;
    }
    let rank = a.len().max(b.len());
    let dim = |s: &[i64], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank).rev().find(|&i| dim(a, i).max(dim(b, i)) > 1).is_some_and(|i| dim(a, i) == 1)
}

/// `(a - za) * sa + (b - zb) * sb` requantized to C as ORT's vector kernel computes it: the
/// ratios of the scales to C's, a fixed term `zc - (rx * zx + ry * zy)` and two fused
/// multiply-adds, the other operand's first, where x is the operand the kernel walks (B when
/// A is the scalar side).
fn lower_add(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let p = params(ctx)?;
    let (ra, rb) = (p.a.0 / p.c.0, p.b.0 / p.c.0);
    let fixed = |rx: f32, zx: f32, ry: f32, zy: f32| p.c.1 - rx.mul_add(zx, ry * zy);
    if a_is_scalar_side(&ctx.input(0)?.shape(), &ctx.input(3)?.shape()) {
        let fixed = fixed(rb, p.b.1, ra, p.a.1);
        lower_pairs(ctx, &|a, b| b.mul_add(rb, a.mul_add(ra, fixed)))
    } else {
        let fixed = fixed(ra, p.a.1, rb, p.b.1);
        lower_pairs(ctx, &|a, b| a.mul_add(ra, b.mul_add(rb, fixed)))
    }
}

/// `(a - za) * (b - zb) * sa * sb / sc + zc`, the integer product scaled by one ratio.
fn lower_mul(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let p = params(ctx)?;
    let ratio = (p.a.0 * p.b.0) / p.c.0;
    lower_pairs(ctx, &|a, b| ((a - p.a.1) * (b - p.b.1)) * ratio + p.c.1)
}

fn claim_where(node: &NodeInfo) -> std::result::Result<(), Decline> {
    // condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point: all
    // required, as ORT's kernel requires them.
    require_inputs(node, 9, 9)?;
    if let Some(i) = (0..9).find(|&i| node.input(i).is_none()) {
        return Err(Decline::new(format!("input {i} is missing")));
    }
    require_input_type(node, 0, &[ElemType::Bool])?;
    for i in [1, 3, 4, 6, 8] {
        require_input_type(node, i, Q8)?;
    }
    for i in [2, 5, 7] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    let t = node.input(1).map(|v| v.elem_type);
    if [3, 4, 6, 8].iter().any(|&i| node.input(i).map(|v| v.elem_type) != t) {
        return Err(Decline::new("X, Y and the zero points differ in type"));
    }
    Ok(())
}

/// Each byte of a branch requantized to Z as ORT's table holds it: `scale * (v - zp) / z_scale`
/// clamped in float32 to what fits around Z's zero point (a NaN to the lowest), rounded half
/// to even; the bytes themselves where the branch is already in Z's quantization.
fn branch_table(scale: f32, zp: f32, z: (f32, f32), t: Dtype) -> Result<Array> {
    let levels = levels(t)?;
    let (lo, hi) = (*levels.start() as f32 - z.1, *levels.end() as f32 - z.1);
    let same = scale == z.0 && zp == z.1;
    let table = levels
        .map(|v| {
            if same {
                return v;
            }
            let q = (scale * (v as f32 - zp)) / z.0;
            let q = if q.is_nan() { lo } else { q.clamp(lo, hi) };
            q.round_ties_even() as i32 + z.1 as i32
        })
        .collect();
    table_array(table, t)
}

fn lower_where(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let one = |i: usize, what: &str| -> Result<f32> {
        ctx.host_one_f32(i, what)?.ok_or_else(|| ep_core::Error::new(format!("{what} is missing")))
    };
    let x = (one(2, "x_scale")?, one(3, "x_zero_point")?);
    let y = (one(5, "y_scale")?, one(6, "y_zero_point")?);
    let z = (one(7, "z_scale")?, one(8, "z_zero_point")?);
    let (cond, xs, ys) = (ctx.input(0)?, ctx.input(1)?, ctx.input(4)?);
    let t = xs.dtype();
    let tx = ops::take(&branch_table(x.0, x.1, z, t)?, &position(xs, t, s)?, 0, s)?;
    let ty = ops::take(&branch_table(y.0, y.1, z, t)?, &position(ys, t, s)?, 0, s)?;
    Ok(vec![ops::where_(cond, &tx, &ty, s)?])
}

ep_core::register_lowering!(
    QLINEAR_WHERE = FnLowering {
        domain: "com.microsoft",
        op: "QLinearWhere",
        opsets: 1..=i32::MAX,
        claim: claim_where,
        lower: lower_where,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    QLINEAR_ADD = FnLowering {
        domain: "com.microsoft",
        op: "QLinearAdd",
        opsets: 1..=i32::MAX,
        claim: claim_binary,
        lower: lower_add,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    QLINEAR_MUL = FnLowering {
        domain: "com.microsoft",
        op: "QLinearMul",
        opsets: 1..=i32::MAX,
        claim: claim_binary,
        lower: lower_mul,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::qdq::spec::{full_range, qtype};
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn case(op: &'static str) -> BoxedStrategy<Case> {
        (qtype(), broadcast_pair(0..=3), any::<bool>(), seed())
            .prop_map(move |(t, (a, b, _), zc, seed)| {
                // ORT's CPU EP crashes on an empty operand broadcast against another.
                let (a, b): (Vec<i64>, Vec<i64>) =
                    (a.iter().map(|&d| d.max(1)).collect(), b.iter().map(|&d| d.max(1)).collect());
                let y = broadcast_shape(&a, &b).expect("dims of 1 keep a broadcastable pair");
                let scale = |lo, hi| Values::Uniform { lo, hi };
                let mut case = Case::domain_op("com.microsoft", op, 1).input_with("a", t, &a, full_range(t)).constant(
                    "a_scale",
                    DType::F32,
                    &[],
                    scale(0.005, 0.1),
                );
                // (ORT's type inference fails without A's and B's zero points, optional as they
                // are in the schema.)
                case = case
                    .constant("a_zp", t, &[], full_range(t))
                    .input_with("b", t, &b, full_range(t))
                    .constant("b_scale", DType::F32, &[], scale(0.005, 0.1))
                    .constant("b_zp", t, &[], full_range(t));
                case = case.constant("c_scale", DType::F32, &[], scale(0.01, 0.2));
                if zc {
                    case = case.constant("c_zp", t, &[], full_range(t));
                }
                case.output("y", t, &y).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::QLINEAR_WHERE, || {
        (qtype(), broadcast_pair(0..=3), 0..3u8, 0..4u8, seed())
            .prop_map(|(t, (x, y, _), cond_rank, same, seed)| {
                let (x, y): (Vec<i64>, Vec<i64>) =
                    (x.iter().map(|&d| d.max(1)).collect(), y.iter().map(|&d| d.max(1)).collect());
                let xy = broadcast_shape(&x, &y).expect("dims of 1 keep a broadcastable pair");
                // The condition broadcasts too: its trailing dims, or a scalar.
                let cond: Vec<i64> = xy[xy.len().saturating_sub(cond_rank as usize)..].to_vec();
                let out = broadcast_shape(&cond, &xy).expect("a suffix broadcasts");
                let scale = |lo, hi| Values::Uniform { lo, hi };
                // Z's own quantization on a branch (copied as it is) now and then.
                let z_scale = Values::Data(vec![0.05]);
                let z_zp = Values::Data(vec![if t == DType::I8 { -3.0 } else { 120.0 }]);
                let branch = |case: Case, name: &str, shape: &[i64], copy: bool| {
                    let (sc, zp) =
                        if copy { (z_scale.clone(), z_zp.clone()) } else { (scale(0.01, 0.2), full_range(t)) };
                    case.input_with(name, t, shape, full_range(t))
                        .constant(&format!("{name}_scale"), DType::F32, &[], sc)
                        .constant(&format!("{name}_zp"), t, &[], zp)
                };
                let case = Case::domain_op("com.microsoft", "QLinearWhere", 1).input("cond", DType::Bool, &cond);
                let case = branch(case, "x", &x, same == 1);
                let case = branch(case, "y", &y, same == 2);
                case.constant("z_scale", DType::F32, &[], z_scale.clone())
                    .constant("z_zp", t, &[], z_zp.clone())
                    .output("z", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });
    register_spec!(super::QLINEAR_ADD, || case("QLinearAdd"));
    register_spec!(super::QLINEAR_MUL, || case("QLinearMul"));
}
