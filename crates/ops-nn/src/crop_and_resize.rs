//! `com.microsoft` CropAndResize: for each box `(y1, x1, y2, x2)` (normalized, corners
//! aligned) of image `batch_indices[r]`, a `crop_size` grid sampled bilinearly or at the
//! nearest pixel (halves away from zero), `extrapolation_value` where a sample falls outside
//! the image; float32 NCHW, as ORT's kernel. The sample positions follow its float32
//! arithmetic step by step (the first and last rows at the box's edges exactly), so the
//! results match it to the rounding of the interpolation.

use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn mode(node: &NodeInfo) -> std::result::Result<bool, String> {
    match node.attr("mode") {
        None => Ok(true),
        Some(AttrValue::String(m)) if m == "bilinear" => Ok(true),
        Some(AttrValue::String(m)) if m == "nearest" => Ok(false),
        Some(other) => Err(format!("mode {other:?} is not 'bilinear' or 'nearest'")),
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 4, 4)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::F32])?;
    require_input_type(node, 2, &[ElemType::I32])?;
    require_input_type(node, 3, &[ElemType::I32])?;
    require_input_rank(node, 0, 4..=4)?;
    mode(node).map_err(Decline)?;
    Ok(())
}

/// The sample positions along one axis, `[R, P]`: ORT's `start * (L - 1)` for the first,
/// `end * (L - 1)` for the last, `start * (L - 1) + p * scale` between them, and the centre
/// for a single sample.
fn positions(start: &Array, end: &Array, p: i64, len: i64, s: &Stream) -> Result<Array> {
    let f = |v: f64| ops::scalar(v, Dtype::F32, s);
    let lm1 = f((len - 1) as f64)?;
    if p == 1 {
        let mid = ops::multiply(&ops::add(start, end, s)?, &f(0.5)?, s)?;
        return Ok(ops::multiply(&mid, &lm1, s)?);
    }
    let first = ops::multiply(start, &lm1, s)?;
    let last = ops::multiply(end, &lm1, s)?;
    let scale = ops::divide(&ops::multiply(&ops::subtract(end, start, s)?, &lm1, s)?, &f((p - 1) as f64)?, s)?;
    let steps = ops::arange(0.0, p as f64, 1.0, Dtype::F32, s)?;
    let middle = ops::add(&first, &ops::multiply(&steps, &scale, s)?, s)?;
    let at = ops::arange(0.0, p as f64, 1.0, Dtype::I32, s)?;
    let is_last = ops::equal(&at, &ops::scalar((p - 1) as f64, Dtype::I32, s)?, s)?;
    let is_first = ops::equal(&at, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
    Ok(ops::where_(&is_first, &first, &ops::where_(&is_last, &last, &middle, s)?, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let bilinear = mode(node)?;
    let extrapolation = node.attr_float("extrapolation_value", 0.0)?;
    let size = ctx.host_i64(3)?;
    let (x, rois, batch) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.input(2)?.clone());
    let [n, c, h, w] = x.shape()[..] else { bail!("X must be 4-D") };
    let r = batch.size() as i64;
    if size.len() != 2 || size.iter().any(|&v| v < 1) {
        bail!("crop_size {size:?} must hold two positive values");
    }
    if batch.ndim() != 1 || rois.shape() != [r, 4] {
        bail!("rois {:?} must be [num_rois, 4] for batch_indices {:?}", rois.shape(), batch.shape());
    }
    let (ph, pw) = (size[0], size[1]);
    if r == 0 || c == 0 {
        return Ok(vec![ops::full(&[r, c, ph, pw], &ops::scalar(0.0, Dtype::F32, s)?, Dtype::F32, s)?]);
    }
    if n == 0 {
        bail!("X {:?} holds no image for the batch indices", x.shape());
    }
    let column = |i: i64| -> Result<Array> {
        let col = ops::slice(&rois, &[0, i], &[r, i + 1], s)?;
        Ok(ops::reshape(&col, &[r, 1], s)?)
    };
    let (y1, x1, y2, x2) = (column(0)?, column(1)?, column(2)?, column(3)?);
    let inside_batch = ops::logical_and(
        &ops::greater_equal(&batch, &ops::scalar(0.0, Dtype::I32, s)?, s)?,
        &ops::less(&batch, &ops::scalar(n as f64, Dtype::I32, s)?, s)?,
        s,
    )?;
    ctx.check(&inside_batch, format!("a batch index is outside [0, {n})"))?;
    let b = ops::clip(
        &batch,
        Some(&ops::scalar(0.0, Dtype::I32, s)?),
        Some(&ops::scalar((n - 1) as f64, Dtype::I32, s)?),
        s,
    )?;
    if h == 0 || w == 0 {
        // No pixel: every sample falls outside.
        let fill = ops::scalar(f64::from(extrapolation), Dtype::F32, s)?;
        return Ok(vec![ops::full(&[r, c, ph, pw], &fill, Dtype::F32, s)?]);
    }
    // [R, ph, 1] and [R, 1, pw].
    let ys = ops::reshape(&positions(&y1, &y2, ph, h, s)?, &[r, ph, 1], s)?;
    let xs = ops::reshape(&positions(&x1, &x2, pw, w, s)?, &[r, 1, pw], s)?;
    let f = |v: f64| ops::scalar(v, Dtype::F32, s);
    let within = |v: &Array, len: i64| -> Result<Array> {
        Ok(ops::logical_and(&ops::greater_equal(v, &f(0.0)?, s)?, &ops::less_equal(v, &f((len - 1) as f64)?, s)?, s)?)
    };
    let valid = ops::logical_and(&within(&ys, h)?, &within(&xs, w)?, s)?;
    // Pixels as rows of a [N * H * W, C] table.
    let table = ops::reshape(&ops::transpose_axes(&x, &[0, 2, 3, 1], s)?, &[n * h * w, c], s)?;
    let base = ops::reshape(&ops::multiply(&b, &ops::scalar((h * w) as f64, Dtype::I32, s)?, s)?, &[r, 1, 1], s)?;
    // In range whatever the data (a NaN position reads pixel 0; its sample is extrapolated).
    let index = |v: &Array, len: i64| -> Result<Array> {
        let v = ops::where_(&ops::equal(v, v, s)?, v, &f(0.0)?, s)?;
        let v = ops::clip(&v, Some(&f(0.0)?), Some(&f((len - 1) as f64)?), s)?;
        Ok(ops::astype(&v, Dtype::I32, s)?)
    };
    // [R, ph, pw, C] values at the pixel rows `yi`, columns `xi`.
    let pick = |yi: &Array, xi: &Array| -> Result<Array> {
        let flat =
            ops::add(&ops::add(&base, &ops::multiply(yi, &ops::scalar(w as f64, Dtype::I32, s)?, s)?, s)?, xi, s)?;
        let flat = ops::broadcast_to(&flat, &[r, ph, pw], s)?;
        let v = ops::take(&table, &ops::reshape(&flat, &[-1], s)?, 0, s)?;
        Ok(ops::reshape(&v, &[r, ph, pw, c], s)?)
    };
    let last = |a: &Array| -> Result<Array> { Ok(ops::expand_dims(a, 3, s)?) };
    let y = if bilinear {
        let (top, bottom) = (ops::floor(&ys, s)?, ops::ceil(&ys, s)?);
        let (left, right) = (ops::floor(&xs, s)?, ops::ceil(&xs, s)?);
        let y_lerp = last(&ops::subtract(&ys, &top, s)?)?;
        let x_lerp = last(&ops::subtract(&xs, &left, s)?)?;
        let (t, bt, l, rt) = (index(&top, h)?, index(&bottom, h)?, index(&left, w)?, index(&right, w)?);
        let (tl, tr, bl, br) = (pick(&t, &l)?, pick(&t, &rt)?, pick(&bt, &l)?, pick(&bt, &rt)?);
        let lerp = |a: &Array, b: &Array, t: &Array| -> Result<Array> {
            Ok(ops::add(a, &ops::multiply(&ops::subtract(b, a, s)?, t, s)?, s)?)
        };
        let upper = lerp(&tl, &tr, &x_lerp)?;
        let lower = lerp(&bl, &br, &x_lerp)?;
        lerp(&upper, &lower, &y_lerp)?
    } else {
        // Halves away from zero.
        let nearest = |v: &Array| -> Result<Array> {
            let away = ops::floor(&ops::add(&ops::abs(v, s)?, &f(0.5)?, s)?, s)?;
            Ok(ops::multiply(&ops::sign(v, s)?, &away, s)?)
        };
        pick(&index(&nearest(&ys)?, h)?, &index(&nearest(&xs)?, w)?)?
    };
    let y = ops::where_(&last(&valid)?, &y, &f(f64::from(extrapolation))?, s)?;
    Ok(vec![ops::transpose_axes(&y, &[0, 3, 1, 2], s)?])
}

ep_core::register_lowering!(
    CROP_AND_RESIZE = FnLowering {
        domain: "com.microsoft",
        op: "CropAndResize",
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
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    register_spec!(super::CROP_AND_RESIZE, || {
        let image = (1..=2i64, 1..=3i64, 1..=6i64, 1..=6i64);
        (image, 1..=3i64, 1..=4i64, 1..=4i64, any::<bool>(), any::<bool>(), seed())
            .prop_map(|((n, c, h, w), r, ph, pw, bilinear, extrapolate, seed)| {
                let batch: Vec<f64> = (0..r).map(|i| ((seed as i64 + i) % n) as f64).collect();
                let mut case = Case::domain_op("com.microsoft", "CropAndResize", 1)
                    .input("x", DType::F32, &[n, c, h, w])
                    // Boxes reaching past the image on either side, some upside down.
                    .input_with("rois", DType::F32, &[r, 4], Values::Uniform { lo: -0.3, hi: 1.3 })
                    .constant("batch_indices", DType::I32, &[r], Values::Data(batch))
                    .constant("crop_size", DType::I32, &[2], Values::Data(vec![ph as f64, pw as f64]));
                if !bilinear {
                    case = case.attr("mode", Attr::Str("nearest".into()));
                }
                if extrapolate {
                    case = case.attr_float("extrapolation_value", -2.5);
                }
                case.output("y", DType::F32, &[r, c, ph, pw]).with_seed(seed)
            })
            .boxed()
    });
}
