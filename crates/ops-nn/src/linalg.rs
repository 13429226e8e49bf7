//! Square-matrix algebra over the last two dims: Det (the determinant) and `com.microsoft`
//! Inverse, by Gaussian elimination with partial pivoting (the row of largest magnitude in the
//! column), one step per column unrolled into the graph, in float32. MLX's own factorizations
//! run on its CPU stream only; these elementwise steps run on any device.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// The largest matrix eliminated in the graph (one unrolled step per column).
const MAX_N: i64 = 128;

fn claim_square(node: &NodeInfo, types: &[ElemType]) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, types)?;
    let Some(dims) = node.input(0).and_then(|v| v.shape.as_deref()) else { return Ok(()) };
    if dims.len() < 2 {
        return Err(Decline(format!("input rank {}: a matrix needs two dims", dims.len())));
    }
    match (dims[dims.len() - 2], dims[dims.len() - 1]) {
        (Some(m), Some(n)) if m != n => Err(Decline(format!("the matrices are {m} x {n}, not square"))),
        (_, Some(n)) if n > MAX_N => Err(Decline(format!("{n} x {n} matrices: the MLX EP eliminates up to {MAX_N}"))),
        _ => Ok(()),
    }
}

/// The input as `[batch, n, n]` float32 and its batch dims.
fn matrices(x: &Array, s: &Stream) -> Result<(Array, Vec<i64>, i64)> {
    let shape = x.shape();
    if shape.len() < 2 || shape[shape.len() - 1] != shape[shape.len() - 2] {
        bail!("the input {shape:?} is not a stack of square matrices");
    }
    let n = shape[shape.len() - 1];
    if n > MAX_N {
        bail!("{n} x {n} matrices: the MLX EP eliminates up to {MAX_N}");
    }
    let batch = shape[..shape.len() - 2].to_vec();
    let b: i64 = batch.iter().product();
    Ok((ops::reshape(&ops::astype(x, Dtype::F32, s)?, &[b, n, n], s)?, batch, n))
}

/// One elimination step's pivot: rows `k` and the largest-magnitude row at or below it in
/// column `k` swapped in `a` (`[b, n, m]`), and whether a swap happened (`[b, 1, 1]`).
fn pivot(a: &Array, k: i64, n: i64, s: &Stream) -> Result<(Array, Array)> {
    let b = a.shape()[0];
    let col = ops::abs(&ops::reshape(&ops::slice(a, &[0, 0, k], &[b, n, k + 1], s)?, &[b, n], s)?, s)?;
    let rows = ops::arange(0.0, n as f64, 1.0, Dtype::I32, s)?;
    let above = ops::less(&rows, &ops::scalar(k as f64, Dtype::I32, s)?, s)?;
    let col = ops::where_(&above, &ops::scalar(-1.0, Dtype::F32, s)?, &col, s)?;
    let p = ops::astype(&ops::argmax_axis(&col, 1, true, s)?, Dtype::I32, s)?; // [b, 1]
    let kk = ops::scalar(k as f64, Dtype::I32, s)?;
    let rows = ops::reshape(&rows, &[1, n], s)?;
    let perm =
        ops::where_(&ops::equal(&rows, &kk, s)?, &p, &ops::where_(&ops::equal(&rows, &p, s)?, &kk, &rows, s)?, s)?;
    let m = a.shape()[2];
    let perm = ops::broadcast_to(&ops::reshape(&perm, &[b, n, 1], s)?, &[b, n, m], s)?;
    let swapped = ops::reshape(&ops::not_equal(&p, &kk, s)?, &[b, 1, 1], s)?;
    Ok((ops::take_along_axis(a, &perm, 1, s)?, swapped))
}

/// Column `k` of `a` (`[b, n, m]`) as `[b, n, 1]`, and its entry on row `k` as `[b, 1, 1]`.
fn column(a: &Array, k: i64, s: &Stream) -> Result<(Array, Array)> {
    let sh = a.shape();
    let col = ops::slice(a, &[0, 0, k], &[sh[0], sh[1], k + 1], s)?;
    let p = ops::slice(&col, &[0, k, 0], &[sh[0], k + 1, 1], s)?;
    Ok((col, p))
}

/// `[b, 1, 1]`: whether matrix `i` of `a` (`[b, n, m]`) holds a NaN (which makes every entry of
/// its answer NaN, as ORT's CPU EP gives it).
fn holds_nan(a: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::any_axes(&ops::isnan(a, s)?, &[1, 2], true, s)?)
}

fn claim_det(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_square(node, &[ElemType::F32, ElemType::F16])
}

/// The determinant: the product of the pivots of an LU elimination, negated per row swap; a
/// zero pivot (a singular matrix) makes it 0.
fn lower_det(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let t = x.dtype();
    let (mut a, batch, n) = matrices(x, s)?;
    let b = a.shape()[0];
    if b == 0 || n == 0 {
        // No matrices, or 0 x 0 ones (whose determinant is 1).
        return Ok(vec![ops::full(&batch, &ops::scalar(1.0, t, s)?, t, s)?]);
    }
    let poisoned = holds_nan(&a, s)?;
    let one = ops::scalar(1.0, Dtype::F32, s)?;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let mut det = ops::full(&[b, 1, 1], &one, Dtype::F32, s)?;
    let rows = ops::reshape(&ops::arange(0.0, n as f64, 1.0, Dtype::I32, s)?, &[1, n, 1], s)?;
    for k in 0..n {
        let (swapped, flip) = pivot(&a, k, n, s)?;
        a = swapped;
        det = ops::where_(&flip, &ops::negative(&det, s)?, &det, s)?;
        let (col, p) = column(&a, k, s)?;
        det = ops::multiply(&det, &p, s)?;
        if k + 1 == n {
            break;
        }
        let safe = ops::where_(&ops::equal(&p, &zero, s)?, &one, &p, s)?;
        let below = ops::greater(&rows, &ops::scalar(k as f64, Dtype::I32, s)?, s)?;
        let factors = ops::where_(&below, &ops::divide(&col, &safe, s)?, &zero, s)?;
        let row = ops::slice(&a, &[0, k, 0], &[b, k + 1, n], s)?;
        a = ops::subtract(&a, &ops::multiply(&factors, &row, s)?, s)?;
    }
    let det = ops::where_(&poisoned, &ops::scalar(f64::NAN, Dtype::F32, s)?, &det, s)?;
    Ok(vec![ops::astype(&ops::reshape(&det, &batch, s)?, t, s)?])
}

ep_core::register_lowering!(
    DET = FnLowering {
        domain: "",
        op: "Det",
        opsets: 11..=i32::MAX,
        claim: claim_det,
        lower: lower_det,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_inverse(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_square(node, &[ElemType::F32, ElemType::F16])
}

/// The inverse by Gauss-Jordan elimination of `[A | I]`: a singular matrix answers
/// non-finite values, as a division by its zero pivot does; a matrix holding NaN answers NaN.
fn lower_inverse(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let (t, shape) = (x.dtype(), x.shape());
    let (a, _, n) = matrices(x, s)?;
    let b = a.shape()[0];
    if b == 0 || n == 0 {
        return Ok(vec![x.clone()]);
    }
    let poisoned = holds_nan(&a, s)?;
    let idx = ops::arange(0.0, n as f64, 1.0, Dtype::I32, s)?;
    let eye = ops::astype(
        &ops::equal(&ops::reshape(&idx, &[n, 1], s)?, &ops::reshape(&idx, &[1, n], s)?, s)?,
        Dtype::F32,
        s,
    )?;
    let eye = ops::broadcast_to(&ops::reshape(&eye, &[1, n, n], s)?, &[b, n, n], s)?;
    let mut a = ops::concatenate(&[a, eye], 2, s)?;
    let rows = ops::reshape(&idx, &[1, n, 1], s)?;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    for k in 0..n {
        a = pivot(&a, k, n, s)?.0;
        let (col, p) = column(&a, k, s)?;
        let row = ops::divide(&ops::slice(&a, &[0, k, 0], &[b, k + 1, 2 * n], s)?, &p, s)?;
        let on_k = ops::equal(&rows, &ops::scalar(k as f64, Dtype::I32, s)?, s)?;
        let factors = ops::where_(&on_k, &zero, &col, s)?;
        a = ops::subtract(&a, &ops::multiply(&factors, &row, s)?, s)?;
        a = ops::where_(&on_k, &row, &a, s)?;
    }
    let inv = ops::slice(&a, &[0, 0, n], &[b, n, 2 * n], s)?;
    let inv = ops::where_(&poisoned, &ops::scalar(f64::NAN, Dtype::F32, s)?, &inv, s)?;
    Ok(vec![ops::astype(&ops::reshape(&inv, &shape, s)?, t, s)?])
}

ep_core::register_lowering!(
    INVERSE = FnLowering {
        domain: "com.microsoft",
        op: "Inverse",
        opsets: 1..=i32::MAX,
        claim: claim_inverse,
        lower: lower_inverse,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// Stacks of `n x n` matrices with a dominant diagonal (well conditioned, so float32
    /// eliminations agree to tolerance), rows shuffled by the seed so pivoting swaps rows.
    fn matrices(batch: &[i64], n: i64, seed: u64, sign: bool) -> Values {
        let count: i64 = batch.iter().product();
        let mut v = Vec::new();
        let mut r = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = || {
            r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((r >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
        };
        for m in 0..count {
            let shift = (m as u64 + seed) % n as u64;
            for i in 0..n {
                let diag = (i as u64 + shift) % n as u64;
                for j in 0..n {
                    let x = next();
                    let dominant = if sign && (i + m) % 2 == 1 { -2.0 } else { 2.0 } * n as f64;
                    v.push(if j as u64 == diag { dominant + x } else { x });
                }
            }
        }
        Values::Data(v)
    }

    register_spec!(super::DET, || {
        (shape(0..=2), 1..=6i64, any::<bool>(), dtype_of(&[DType::F32, DType::F16]), seed())
            .prop_map(|(batch, n, sign, t, seed)| {
                let batch: Vec<i64> = batch.iter().map(|&d| d.clamp(1, 3)).collect();
                let x = [batch.clone(), vec![n, n]].concat();
                Case::op("Det", 11)
                    .input_with("x", t, &x, matrices(&batch, n, seed, sign))
                    .output("y", t, &batch)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::INVERSE, || {
        (shape(0..=2), 1..=6i64, any::<bool>(), dtype_of(&[DType::F32, DType::F16]), seed())
            .prop_map(|(batch, n, sign, t, seed)| {
                let batch: Vec<i64> = batch.iter().map(|&d| d.clamp(1, 3)).collect();
                let x = [batch.clone(), vec![n, n]].concat();
                Case::domain_op("com.microsoft", "Inverse", 1)
                    .input_with("x", t, &x, matrices(&batch, n, seed, sign))
                    .output("y", t, &x)
                    .with_seed(seed)
            })
            .boxed()
    });
}
