//! Region-of-interest pooling over NCHW feature maps, float32, with ORT's CPU arithmetic:
//! - MaxRoiPool: each box `[batch, x1, y1, x2, y2]` scaled and rounded (halves away from
//!   zero) to pixels, cut into `pooled_shape` bins (floor/ceil edges, clamped to the map), the
//!   maximum of each bin (NaN passed over; an empty bin is 0);
//! - RoiAlign: each box `[x1, y1, x2, y2]` of image `batch_indices[r]` cut into
//!   `output_height x output_width` bins, each sampled on a grid (`sampling_ratio`, or
//!   `ceil(bin size)` per box) by bilinear interpolation, averaged in sample order, or (`max`)
//!   the largest of the weighted corner values, as ORT's kernel takes it.
//!
//! Boxes are runtime data: bins and samples are masks and gathers computed on the device; only
//! an adaptive sampling grid reads the boxes on the host for its largest size.

use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn f(v: f64, s: &Stream) -> Result<Array> {
    Ok(ops::scalar(v, Dtype::F32, s)?)
}

fn int(v: i64, s: &Stream) -> Result<Array> {
    Ok(ops::scalar(v as f64, Dtype::I32, s)?)
}

/// Column `i` of a `[R, k]` array as `[R]`.
fn column(a: &Array, i: i64, s: &Stream) -> Result<Array> {
    let r = a.shape()[0];
    Ok(ops::reshape(&ops::slice(a, &[0, i], &[r, i + 1], s)?, &[r], s)?)
}

/// C's `round`: halves away from zero, exactly (the fraction is exact in float32).
fn round_away(v: &Array, s: &Stream) -> Result<Array> {
    let whole = ops::multiply(&ops::sign(v, s)?, &ops::floor(&ops::abs(v, s)?, s)?, s)?;
    let frac = ops::abs(&ops::subtract(v, &whole, s)?, s)?;
    let step = ops::where_(&ops::greater_equal(&frac, &f(0.5, s)?, s)?, &ops::sign(v, s)?, &f(0.0, s)?, s)?;
    Ok(ops::add(&whole, &step, s)?)
}

/// Batch indices (int64, or float32 truncated toward zero) within `[0, n)`, checked (the run
/// fails otherwise) and clamped, as int32.
fn batch_index(ctx: &mut LowerCtx<'_>, b: &Array, n: i64, s: &Stream) -> Result<Array> {
    let t = b.dtype();
    let b = if t == Dtype::F32 {
        ops::multiply(&ops::sign(b, s)?, &ops::floor(&ops::abs(b, s)?, s)?, s)?
    } else {
        b.clone()
    };
    let c = |v: i64| ops::scalar(v as f64, t, s);
    let inside = ops::logical_and(&ops::greater_equal(&b, &c(0)?, s)?, &ops::less(&b, &c(n)?, s)?, s)?;
    ctx.check(&inside, format!("a batch index is outside [0, {n})"))?;
    let b = ops::where_(&inside, &b, &c(0)?, s)?;
    Ok(ops::astype(&b, Dtype::I32, s)?)
}

fn claim_max_roi_pool(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::F32])?;
    require_input_rank(node, 0, 4..=4)?;
    let ss = node.attr_float("spatial_scale", 1.0)?;
    if !(ss.is_finite() && ss > 0.0) {
        return Err(Decline(format!("spatial_scale {ss} must be positive and finite")));
    }
    match node.attr_ints("pooled_shape")? {
        Some([h, w]) if *h > 0 && *w > 0 => Ok(()),
        other => Err(Decline(format!("pooled_shape {other:?} must be two positive sizes"))),
    }
}

/// A float32 pixel coordinate converted to int32 as x86 does: anything past int32 (an
/// infinity, NaN) becomes int32's lowest value.
fn to_int(v: &Array, s: &Stream) -> Result<Array> {
    let fits = ops::less(&ops::abs(v, s)?, &f(2147483648.0, s)?, s)?;
    Ok(ops::astype(&ops::where_(&fits, v, &f(-2147483648.0, s)?, s)?, Dtype::I32, s)?)
}

fn lower_max_roi_pool(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (x, rois) = (ctx.input(0)?.clone(), ctx.input(1)?.clone());
    let [n, c, h, w] = x.shape()[..] else { bail!("X must be 4-D") };
    let Some(&[ph, pw]) = node.attr_ints("pooled_shape")? else { bail!("pooled_shape must hold two sizes") };
    let ss = f64::from(node.attr_float("spatial_scale", 1.0)?);
    if rois.ndim() != 2 || rois.shape()[1] != 5 {
        bail!("rois {:?} must be [num_rois, 5]", rois.shape());
    }
    let r = rois.shape()[0];
    let b = batch_index(ctx, &column(&rois, 0, s)?, n, s)?;
    if r == 0 || c == 0 || h == 0 || w == 0 {
        // No roi, no channel, or no pixel (every bin empty: 0).
        return Ok(vec![ops::full(&[r, c, ph, pw], &f(0.0, s)?, Dtype::F32, s)?]);
    }
    let scaled =
        |i: i64| -> Result<Array> { to_int(&round_away(&ops::multiply(&column(&rois, i, s)?, &f(ss, s)?, s)?, s)?, s) };
    let (sw, sh, ew, eh) = (scaled(1)?, scaled(2)?, scaled(3)?, scaled(4)?);
    // One axis' bins, [R, P] starts and ends within [0, len], in ORT's int32 arithmetic.
    let bins = |start: &Array, end: &Array, p: i64, len: i64| -> Result<(Array, Array)> {
        let size = ops::maximum(&ops::add(&ops::subtract(end, start, s)?, &int(1, s)?, s)?, &int(1, s)?, s)?;
        let size = ops::astype(&size, Dtype::F32, s)?;
        let bin = ops::reshape(&ops::divide(&size, &f(p as f64, s)?, s)?, &[r, 1], s)?;
        let at = ops::arange(0.0, p as f64, 1.0, Dtype::F32, s)?;
        let lo = to_int(&ops::floor(&ops::multiply(&at, &bin, s)?, s)?, s)?;
        let hi = to_int(&ops::ceil(&ops::multiply(&ops::add(&at, &f(1.0, s)?, s)?, &bin, s)?, s)?, s)?;
        let start = ops::reshape(start, &[r, 1], s)?;
        let clamp = |v: &Array| -> Result<Array> {
            Ok(ops::clip(&ops::add(v, &start, s)?, Some(&int(0, s)?), Some(&int(len, s)?), s)?)
        };
        Ok((clamp(&lo)?, clamp(&hi)?))
    };
    let (hs, he) = bins(&sh, &eh, ph, h)?;
    let (ws, we) = bins(&sw, &ew, pw, w)?;
    // Masks [R, P, len] of the positions inside each bin.
    let inside = |lo: &Array, hi: &Array, len: i64| -> Result<Array> {
        let at = ops::reshape(&ops::arange(0.0, len as f64, 1.0, Dtype::I32, s)?, &[1, 1, len], s)?;
        let lo = ops::expand_dims(lo, 2, s)?;
        let hi = ops::expand_dims(hi, 2, s)?;
        Ok(ops::logical_and(&ops::greater_equal(&at, &lo, s)?, &ops::less(&at, &hi, s)?, s)?)
    };
    let (mh, mw) = (inside(&hs, &he, h)?, inside(&ws, &we, w)?);
    // The maximum starts at float32's lowest value. (A NaN in a bin gives NaN; ORT's kernel
    // lets a later element of the bin replace it, an artifact of its argument order.)
    let lowest = f(f64::from(f32::MIN), s)?;
    let images = ops::take(&x, &b, 0, s)?; // [R, C, H, W]
    // Over W first: [R, C, H, 1, PW, W] -> [R, C, H, PW].
    let mw6 = ops::reshape(&mw, &[r, 1, 1, pw, w], s)?;
    let v = ops::expand_dims(&images, 3, s)?; // [R, C, H, 1, W]
    let v = ops::max_axes(&ops::where_(&mw6, &v, &f(f64::NEG_INFINITY, s)?, s)?, &[4], false, s)?;
    // Then over H: [R, C, PH, H, PW].
    let mh5 = ops::reshape(&mh, &[r, 1, ph, h, 1], s)?;
    let v = ops::expand_dims(&v, 2, s)?; // [R, C, 1, H, PW]
    let v = ops::max_axes(&ops::where_(&mh5, &v, &f(f64::NEG_INFINITY, s)?, s)?, &[3], false, s)?;
    let v = ops::maximum(&v, &lowest, s)?;
    let empty = ops::logical_or(
        &ops::reshape(&ops::less_equal(&he, &hs, s)?, &[r, 1, ph, 1], s)?,
        &ops::reshape(&ops::less_equal(&we, &ws, s)?, &[r, 1, 1, pw], s)?,
        s,
    )?;
    Ok(vec![ops::where_(&empty, &f(0.0, s)?, &v, s)?])
}

fn mode_is_max(node: &NodeInfo) -> std::result::Result<bool, String> {
    match node.attr("mode") {
        None => Ok(false),
        Some(AttrValue::String(m)) if m == "avg" => Ok(false),
        Some(AttrValue::String(m)) if m == "max" => Ok(true),
        Some(other) => Err(format!("mode {other:?} is not 'avg' or 'max'")),
    }
}

fn half_pixel(node: &NodeInfo) -> std::result::Result<bool, String> {
    if node.since_version < 16 {
        return Ok(false);
    }
    match node.attr("coordinate_transformation_mode") {
        None => Ok(true),
        Some(AttrValue::String(m)) if m == "half_pixel" => Ok(true),
        Some(AttrValue::String(m)) if m == "output_half_pixel" => Ok(false),
        Some(other) => Err(format!("coordinate_transformation_mode {other:?} is not supported")),
    }
}

fn claim_roi_align(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::F32])?;
    require_input_type(node, 2, &[ElemType::I64])?;
    require_input_rank(node, 0, 4..=4)?;
    mode_is_max(node).map_err(Decline)?;
    half_pixel(node).map_err(Decline)?;
    let ss = node.attr_float("spatial_scale", 1.0)?;
    if !ss.is_finite() || ss.abs() > 1e6 {
        return Err(Decline(format!("spatial_scale {ss} is not finite or past 1e6")));
    }
    let (oh, ow) = (node.attr_int("output_height", 1)?, node.attr_int("output_width", 1)?);
    let ratio = node.attr_int("sampling_ratio", 0)?;
    if oh < 1 || ow < 1 || oh > 1 << 16 || ow > 1 << 16 || !(0..=64).contains(&ratio) {
        return Err(Decline(format!("output {oh}x{ow} or sampling_ratio {ratio} out of the supported range")));
    }
    Ok(())
}

fn lower_roi_align(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (x, rois, batch) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.input(2)?.clone());
    let [n, c, h, w] = x.shape()[..] else { bail!("X must be 4-D") };
    let (oh, ow) = (node.attr_int("output_height", 1)?, node.attr_int("output_width", 1)?);
    let ratio = node.attr_int("sampling_ratio", 0)?;
    let ss = f64::from(node.attr_float("spatial_scale", 1.0)?);
    let max_mode = mode_is_max(node)?;
    let half = half_pixel(node)?;
    if rois.ndim() != 2 || rois.shape()[1] != 4 {
        bail!("rois {:?} must be [num_rois, 4]", rois.shape());
    }
    let r = rois.shape()[0];
    if batch.ndim() != 1 || batch.shape()[0] != r {
        bail!("batch_indices {:?} must hold one index per roi ({r})", batch.shape());
    }
    if r == 0 || c == 0 {
        return Ok(vec![ops::full(&[r, c, oh, ow], &f(0.0, s)?, Dtype::F32, s)?]);
    }
    let b = batch_index(ctx, &batch, n, s)?;
    let finite = ops::less(&ops::abs(&rois, s)?, &f(f64::INFINITY, s)?, s)?;
    ctx.check(&finite, "all rois values must be finite")?;
    let rois = ops::where_(&finite, &rois, &f(0.0, s)?, s)?;
    let off = if half { 0.5 } else { 0.0 };
    let edge = |i: i64| -> Result<Array> {
        Ok(ops::subtract(&ops::multiply(&column(&rois, i, s)?, &f(ss, s)?, s)?, &f(off, s)?, s)?)
    };
    let (sw, sh, ew, eh) = (edge(0)?, edge(1)?, edge(2)?, edge(3)?);
    let size = |start: &Array, end: &Array| -> Result<Array> {
        let d = ops::subtract(end, start, s)?;
        Ok(if half { d } else { ops::maximum(&d, &f(1.0, s)?, s)? })
    };
    let (rh, rw) = (size(&sh, &eh)?, size(&sw, &ew)?);
    let (bh, bw) = (ops::divide(&rh, &f(oh as f64, s)?, s)?, ops::divide(&rw, &f(ow as f64, s)?, s)?);
    // The grid per roi ([R], float), and the largest, which sizes the sample axes.
    let (gh, gw, gmax_h, gmax_w) = if ratio > 0 {
        let g = ops::full(&[r], &f(ratio as f64, s)?, Dtype::F32, s)?;
        (g.clone(), g, ratio, ratio)
    } else {
        let gh = ops::maximum(&ops::ceil(&bh, s)?, &f(0.0, s)?, s)?;
        let gw = ops::maximum(&ops::ceil(&bw, s)?, &f(0.0, s)?, s)?;
        let cpu = ctx.cpu_stream();
        // (Read before the clamp at 0: a box upside down by a bin or more along one axis only
        // makes the grid's size negative, an error in ORT's kernel; along both, no samples.)
        let (vh, vw) = (ops::ceil(&bh, s)?.to_vec::<f32>(cpu)?, ops::ceil(&bw, s)?.to_vec::<f32>(cpu)?);
        if vh.iter().zip(&vw).any(|(&a, &b)| (a < 0.0) != (b < 0.0) && a != 0.0 && b != 0.0) {
            bail!("a roi upside down by a bin or more along one axis leaves a negative sampling grid");
        }
        let largest =
            |v: &[f32]| v.iter().fold(0.0f32, |m, &x| if x.is_finite() { m.max(x) } else { m }).min(1e6) as i64;
        let (mh, mw) = (largest(&vh), largest(&vw));
        if mh.saturating_mul(mw) > 4096 {
            bail!("a sampling grid of {mh}x{mw} per bin is past what this lowering builds");
        }
        (gh, gw, mh, mw)
    };
    let count = ops::maximum(&ops::multiply(&gh, &gw, s)?, &f(1.0, s)?, s)?;
    // Sample positions along one axis: [R, P, G] and whether each sample exists.
    let samples = |start: &Array, bin: &Array, g: &Array, p: i64, gmax: i64| -> Result<(Array, Array)> {
        let col = |a: &Array| ops::reshape(a, &[r, 1, 1], s);
        let (start, bin, g) = (col(start)?, col(bin)?, col(g)?);
        let pi = ops::reshape(&ops::arange(0.0, p as f64, 1.0, Dtype::F32, s)?, &[1, p, 1], s)?;
        let gi = ops::reshape(&ops::arange(0.0, gmax.max(1) as f64, 1.0, Dtype::F32, s)?, &[1, 1, gmax.max(1)], s)?;
        let base = ops::add(&start, &ops::multiply(&pi, &bin, s)?, s)?;
        let step = ops::divide(&ops::multiply(&ops::add(&gi, &f(0.5, s)?, s)?, &bin, s)?, &g, s)?;
        let exists = ops::broadcast_to(&ops::less(&gi, &g, s)?, &[r, p, gmax.max(1)], s)?;
        Ok((ops::add(&base, &step, s)?, exists))
    };
    let (ys, ey) = samples(&sh, &bh, &gh, oh, gmax_h)?;
    let (xs, ex) = samples(&sw, &bw, &gw, ow, gmax_w)?;
    let (gy, gx) = (ys.shape()[2], xs.shape()[2]);
    // Per axis: the low and high pixel and the two weights, with samples outside [-1, len]
    // marked out.
    let axis = |v: &Array, len: i64| -> Result<(Array, Array, Array, Array, Array)> {
        let out = ops::logical_or(&ops::less(v, &f(-1.0, s)?, s)?, &ops::greater(v, &f(len as f64, s)?, s)?, s)?;
        let v = ops::maximum(v, &f(0.0, s)?, s)?;
        let v = ops::where_(&ops::isnan(&v, s)?, &f(0.0, s)?, &v, s)?;
        let low = ops::floor(&ops::minimum(&v, &f((len - 1) as f64, s)?, s)?, s)?;
        let at_end = ops::greater_equal(&low, &f((len - 1) as f64, s)?, s)?;
        let v = ops::where_(&at_end, &low, &v, s)?;
        let high = ops::where_(&at_end, &low, &ops::add(&low, &f(1.0, s)?, s)?, s)?;
        let l = ops::subtract(&v, &low, s)?;
        let hw = ops::subtract(&f(1.0, s)?, &l, s)?;
        Ok((ops::astype(&low, Dtype::I32, s)?, ops::astype(&high, Dtype::I32, s)?, hw, l, out))
    };
    let (y_lo, y_hi, hy, ly, y_out) = axis(&ys, h)?;
    let (x_lo, x_hi, hx, lx, x_out) = axis(&xs, w)?;
    // To [R, PH, GY, PW, GX].
    let ya = |a: &Array| ops::reshape(a, &[r, oh, gy, 1, 1], s);
    let xa = |a: &Array| ops::reshape(a, &[r, 1, 1, ow, gx], s);
    let valid = ops::logical_and(
        &ops::logical_and(&ya(&ey)?, &xa(&ex)?, s)?,
        &ops::logical_not(&ops::logical_or(&ya(&y_out)?, &xa(&x_out)?, s)?, s)?,
        s,
    )?;
    let zero = f(0.0, s)?;
    let weight = |a: &Array, b: &Array| -> Result<Array> {
        Ok(ops::where_(&valid, &ops::multiply(&ya(a)?, &xa(b)?, s)?, &zero, s)?)
    };
    let (w1, w2, w3, w4) = (weight(&hy, &hx)?, weight(&hy, &lx)?, weight(&ly, &hx)?, weight(&ly, &lx)?);
    // Pixels as rows of [N * H * W, C].
    let table = ops::reshape(&ops::transpose_axes(&x, &[0, 2, 3, 1], s)?, &[n * h * w, c], s)?;
    let base = ops::reshape(&ops::multiply(&b, &int(h * w, s)?, s)?, &[r, 1, 1, 1, 1], s)?;
    let dims = [r, oh, gy, ow, gx];
    // A sample outside the map reads the image's first pixel (with weight 0), as ORT's does.
    let outside = ops::logical_or(&ya(&y_out)?, &xa(&x_out)?, s)?;
    let pick = |yi: &Array, xi: &Array| -> Result<Array> {
        let at = ops::add(&ops::add(&base, &ops::multiply(&ya(yi)?, &int(w, s)?, s)?, s)?, &xa(xi)?, s)?;
        let at = ops::where_(&outside, &base, &at, s)?;
        let at = ops::reshape(&ops::broadcast_to(&at, &dims, s)?, &[-1], s)?;
        Ok(ops::reshape(&ops::take(&table, &at, 0, s)?, &[r, oh, gy, ow, gx, c], s)?)
    };
    let weighted = |wt: &Array, yi: &Array, xi: &Array| -> Result<Array> {
        Ok(ops::multiply(&ops::expand_dims(wt, 5, s)?, &pick(yi, xi)?, s)?)
    };
    let t1 = weighted(&w1, &y_lo, &x_lo)?;
    let t2 = weighted(&w2, &y_lo, &x_hi)?;
    let t3 = weighted(&w3, &y_hi, &x_lo)?;
    let t4 = weighted(&w4, &y_hi, &x_hi)?;
    // Samples in ORT's order (y major, x minor) on one axis: [R, PH, PW, C, GY * GX].
    let samples_last = |a: &Array| -> Result<Array> {
        let a = ops::transpose_axes(a, &[0, 1, 3, 5, 2, 4], s)?;
        Ok(ops::reshape(&a, &[r, oh, ow, c, gy * gx], s)?)
    };
    let y = if max_mode {
        // ORT's `std::max(a, b)`: `b` where `a < b`, else `a` (a NaN on the left stays, one on
        // the right is passed over).
        let keep_left = |a: &Array, b: &Array| -> Result<Array> { Ok(ops::where_(&ops::less(a, b, s)?, b, a, s)?) };
        let v = keep_left(&keep_left(&keep_left(&t1, &t2)?, &t3)?, &t4)?;
        let v = samples_last(&v)?;
        // Samples that do not exist take no part; a bin without any is 0. (An existing sample
        // outside the map weighs its corners by 0: 0 takes part.) The fold starts from the
        // first sample: a NaN there is the answer, later NaN are passed over.
        let exists =
            ops::expand_dims(&ops::broadcast_to(&ops::logical_and(&ya(&ey)?, &xa(&ex)?, s)?, &dims, s)?, 5, s)?;
        let exists = samples_last(&ops::broadcast_to(&exists, &[r, oh, gy, ow, gx, c], s)?)?;
        let k = gy * gx;
        let first = ops::reshape(&ops::slice(&v, &[0, 0, 0, 0, 0], &[r, oh, ow, c, 1], s)?, &[r, oh, ow, c], s)?;
        let taken = ops::logical_and(&exists, &ops::logical_not(&ops::isnan(&v, s)?, s)?, s)?;
        let later = ops::slice(
            &ops::where_(&taken, &v, &f(f64::NEG_INFINITY, s)?, s)?,
            &[0, 0, 0, 0, 1],
            &[r, oh, ow, c, k],
            s,
        )?;
        let m = if k > 1 { keep_left(&first, &ops::max_axes(&later, &[4], false, s)?)? } else { first };
        let any = ops::any_axes(&exists, &[4], false, s)?;
        ops::where_(&any, &m, &zero, s)?
    } else {
        let v = ops::add(&ops::add(&ops::add(&t1, &t2, s)?, &t3, s)?, &t4, s)?;
        // Samples past the roi's own grid are not there (0, even where a pixel is infinite).
        let exists =
            ops::expand_dims(&ops::broadcast_to(&ops::logical_and(&ya(&ey)?, &xa(&ex)?, s)?, &dims, s)?, 5, s)?;
        let v = samples_last(&ops::where_(&exists, &v, &zero, s)?)?;
        let running = ops::cumulative(&v, 4, false, false, true, s)?;
        let k = gy * gx;
        let sum = ops::slice(&running, &[0, 0, 0, 0, k - 1], &[r, oh, ow, c, k], s)?;
        let sum = ops::reshape(&sum, &[r, oh, ow, c], s)?;
        ops::divide(&sum, &ops::reshape(&count, &[r, 1, 1, 1], s)?, s)?
    };
    Ok(vec![ops::transpose_axes(&y, &[0, 3, 1, 2], s)?])
}

ep_core::register_lowering!(
    MAX_ROI_POOL = FnLowering {
        domain: "",
        op: "MaxRoiPool",
        opsets: 1..=i32::MAX,
        claim: claim_max_roi_pool,
        lower: lower_max_roi_pool,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    ROI_ALIGN = FnLowering {
        domain: "",
        op: "RoiAlign",
        opsets: 10..=i32::MAX,
        claim: claim_roi_align,
        lower: lower_roi_align,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    fn image() -> BoxedStrategy<(i64, i64, i64, i64)> {
        (1..=2i64, 1..=3i64, 2..=7i64, 2..=7i64).boxed()
    }

    register_spec!(super::MAX_ROI_POOL, || {
        (image(), 1..=3i64, 1..=3i64, 1..=3i64, prop_oneof![Just(1.0f32), Just(0.5), Just(0.25)], seed())
            .prop_map(|((n, c, h, w), r, ph, pw, ss, seed)| {
                // [batch, x1, y1, x2, y2]: boxes partly past the map, some upside down.
                let mut rois = Vec::new();
                for i in 0..r {
                    let v = |k: u64| ((seed >> (4 * i as u64 + k)) % 11) as f64 - 2.0;
                    rois.extend([
                        ((seed as i64 + i) % n) as f64,
                        v(0) / ss as f64,
                        v(1) / ss as f64,
                        v(2) / ss as f64 + 2.0,
                        v(3) / ss as f64 + 2.5,
                    ]);
                }
                Case::op("MaxRoiPool", 1)
                    .input_with("x", DType::F32, &[n, c, h, w], Values::Uniform { lo: -3.0, hi: 3.0 })
                    .input_with("rois", DType::F32, &[r, 5], Values::Data(rois))
                    .attr_ints("pooled_shape", &[ph, pw])
                    .attr_float("spatial_scale", ss)
                    .output("y", DType::F32, &[r, c, ph, pw])
                    .with_seed(seed)
            })
            .boxed()
    });

    /// `r` boxes `[x1, y1, x2, y2]` from the seed, at most a pixel upside down unless `flip`.
    fn rois(r: i64, flip: bool, seed: u64) -> Vec<f64> {
        (0..r as u64)
            .flat_map(|i| {
                let v = |k: u64| ((seed >> ((4 * i + k) % 60)) % 23) as f64 * 0.5 - 2.0;
                let (x1, y1) = (v(0), v(1));
                let (dx, dy) = (v(2) - if flip { 5.0 } else { -1.5 }, v(3) - if flip { 5.0 } else { -1.5 });
                [x1, y1, x1 + dx.max(if flip { -20.0 } else { -0.9 }), y1 + dy.max(if flip { -20.0 } else { -0.9 })]
            })
            .collect()
    }

    register_spec!(super::ROI_ALIGN, || {
        let form = (
            any::<bool>(),
            any::<bool>(),
            0..=3i64,
            prop_oneof![Just(1.0f32), Just(0.5), Just(0.25)],
            prop_oneof![Just(10u32), Just(16), Just(21)],
        );
        (image(), 1..=3i64, 1..=3i64, 1..=3i64, form, seed())
            .prop_map(|((n, c, h, w), r, oh, ow, (max, output_half, ratio, ss, v), seed)| {
                let batch: Vec<f64> = (0..r).map(|i| ((seed as i64 + i) % n) as f64).collect();
                let mut case = Case::op("RoiAlign", v)
                    .input_with("x", DType::F32, &[n, c, h, w], Values::Uniform { lo: -3.0, hi: 3.0 })
                    // [x1, y1, x2, y2] in input pixels: partly past the map (upside down only
                    // with a fixed grid: an adaptive one is then an error on the CPU EP).
                    .input_with("rois", DType::F32, &[r, 4], Values::Data(rois(r, ratio > 0, seed)))
                    .input_with("batch_indices", DType::I64, &[r], Values::Data(batch))
                    .attr_int("output_height", oh)
                    .attr_int("output_width", ow)
                    .attr_int("sampling_ratio", ratio)
                    .attr_float("spatial_scale", ss);
                if max {
                    case = case.attr("mode", Attr::Str("max".into()));
                }
                if v >= 16 && output_half {
                    case = case.attr("coordinate_transformation_mode", Attr::Str("output_half_pixel".into()));
                }
                case.output("y", DType::F32, &[r, c, oh, ow]).with_seed(seed)
            })
            .boxed()
    });
}
