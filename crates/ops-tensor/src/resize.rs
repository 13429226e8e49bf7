//! Resize (opsets 10 to 19) and Upsample (7 to 9): nearest (all four rounding modes), linear
//! and cubic (`cubic_coeff_a`, `exclude_outside`) interpolation with every coordinate
//! transformation mode, including `tf_crop_and_resize` with its ROI and extrapolation value.
//! Interpolation is separable: each resized axis is gathered at host-computed source indices
//! and combined with host-computed weights. `antialias` (linear and cubic) widens the filter
//! when shrinking, as ORT's CPU EP computes it (`antialias.rs`).

use ep_core::lowering::{ALL_TYPES, FLOATS, FnLowering, input_type, normalize_axis, require_input_type};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn string_attr<'a>(node: &'a NodeInfo, name: &str, default: &'a str) -> &'a str {
    match node.attr(name) {
        Some(AttrValue::String(s)) => s.as_str(),
        _ => default,
    }
}

fn claim_resize(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, ALL_TYPES)?;
    let mode = string_attr(node, "mode", "nearest");
    if !matches!(mode, "nearest" | "linear" | "cubic") {
        return Err(Decline(format!("mode '{mode}' is not supported")));
    }
    if mode != "nearest" && !input_type(node, 0).is_some_and(|t| FLOATS.contains(&t) || t == ElemType::F64) {
        return Err(Decline::new("linear and cubic interpolation take float inputs"));
    }
    if node.attr_int("antialias", 0)? != 0 && mode == "nearest" {
        return Err(Decline::new("antialias with nearest mode is left to the CPU EP"));
    }
    let nearest = string_attr(node, "nearest_mode", "round_prefer_floor");
    if !matches!(nearest, "round_prefer_floor" | "round_prefer_ceil" | "floor" | "ceil") {
        return Err(Decline(format!("nearest_mode '{nearest}' is not supported")));
    }
    let ctm = string_attr(node, "coordinate_transformation_mode", "half_pixel");
    if !matches!(
        ctm,
        "half_pixel"
            | "half_pixel_symmetric"
            | "pytorch_half_pixel"
            | "align_corners"
            | "asymmetric"
            | "tf_crop_and_resize"
    ) {
        return Err(Decline(format!("coordinate_transformation_mode '{ctm}' is not supported")));
    }
    let policy = string_attr(node, "keep_aspect_ratio_policy", "stretch");
    if !matches!(policy, "stretch" | "not_larger" | "not_smaller") {
        return Err(Decline(format!("keep_aspect_ratio_policy '{policy}' is not supported")));
    }
    // (ORT's antialiasing filter reads it in linear mode too.)
    let antialias = node.attr_int("antialias", 0)? != 0;
    if node.attr_int("exclude_outside", 0)? != 0 && mode != "cubic" && !(antialias && mode == "linear") {
        return Err(Decline(format!(
            "exclude_outside with mode '{mode}' (only cubic, or antialiased linear, takes it here)"
        )));
    }
    Ok(())
}

/// The interpolation of one axis: for each output position, source indices and weights.
pub(crate) struct AxisPlan {
    pub(crate) taps: usize,
    pub(crate) indices: Vec<i64>,
    pub(crate) weights: Vec<f32>,
    /// Positions outside the ROI (tf_crop_and_resize), which take the extrapolation value.
    pub(crate) outside: Vec<bool>,
    /// Per tap, whether it is one (empty: all are): positions with fewer taps than the widest
    /// are padded with taps that read nothing (not even a NaN times 0).
    pub(crate) real: Vec<bool>,
}

fn cubic_weights(t: f64, a: f64) -> [f64; 4] {
    let w = |x: f64| {
        let x = x.abs();
        if x <= 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
        } else {
            0.0
        }
    };
    [w(t + 1.0), w(t), w(1.0 - t), w(2.0 - t)]
}

/// The coordinate transformation and nearest rounding a resize uses.
#[derive(Clone, Copy)]
struct Modes<'a> {
    ctm: &'a str,
    nearest: &'a str,
}

impl<'a> Modes<'a> {
    /// Resize's attributes (ONNX defaults).
    fn of(node: &'a NodeInfo) -> Modes<'a> {
        Modes {
            ctm: string_attr(node, "coordinate_transformation_mode", "half_pixel"),
            nearest: string_attr(node, "nearest_mode", "round_prefer_floor"),
        }
    }
}

/// The input coordinate of output position `x` under the coordinate transformation `ctm`.
/// In float32, as ORT computes it: the rounding of nearest modes depends on it.
/// align_corners and tf_crop_and_resize use the unrounded resized length `in * scale`, as ONNX
/// defines them (ORT's CPU EP uses the rounded one and fails those node tests).
pub(crate) fn source_coordinate(ctm: &str, x: f32, scale: f32, n_in: i64, n_out: i64, roi: (f64, f64)) -> f32 {
    let (fin, fout) = (n_in as f32, n_out as f32);
    let flen = fin * scale;
    match ctm {
        "half_pixel" => (x + 0.5) / scale - 0.5,
        "half_pixel_symmetric" => {
            let adjustment = fout / (scale * fin);
            let center = fin / 2.0;
            center * (1.0 - adjustment) + (x + 0.5) / scale - 0.5
        }
        "pytorch_half_pixel" => {
            if n_out > 1 {
                (x + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        "align_corners" => {
            if flen == 1.0 {
                0.0
            } else {
                x * (fin - 1.0) / (flen - 1.0)
            }
        }
        "asymmetric" => x / scale,
        _ => {
            let (start, end) = (roi.0 as f32, roi.1 as f32);
            if flen != 1.0 {
                start * (fin - 1.0) + x * (end - start) * (fin - 1.0) / (flen - 1.0)
            } else {
                0.5 * (start + end) * (fin - 1.0)
            }
        }
    }
}

fn plan_axis(
    node: &NodeInfo,
    modes: Modes<'_>,
    mode: &str,
    n_in: i64,
    n_out: i64,
    scale: f64,
    roi: (f64, f64),
) -> Result<AxisPlan> {
    let ctm = modes.ctm;
    let source = |x: f64| source_coordinate(ctm, x as f32, scale as f32, n_in, n_out, roi) as f64;
    let last = n_in - 1;
    let mut plan =
        AxisPlan { taps: 0, indices: Vec::new(), weights: Vec::new(), outside: Vec::new(), real: Vec::new() };
    for o in 0..n_out {
        let x = source(o as f64);
        plan.outside.push(ctm == "tf_crop_and_resize" && (x < 0.0 || x > last as f64));
        match mode {
            "nearest" => {
                let i = match modes.nearest {
                    "round_prefer_ceil" => (x + 0.5).floor(),
                    "floor" => x.floor(),
                    "ceil" => x.ceil(),
                    _ => (x - 0.5).ceil(),
                } as i64;
                plan.taps = 1;
                plan.indices.push(i.clamp(0, last));
                plan.weights.push(1.0);
            }
            "linear" => {
                let x = x.clamp(0.0, last as f64);
                let i0 = x.floor() as i64;
                let i1 = (i0 + 1).min(last);
                // Where both taps are the last element, half of each, as ORT's CPU EP weighs them
                // (the same value, but an infinity stays one instead of inf * 0). Shrinking,
                // ORT's CPU EP reads only the taps strictly within one of the position, so a
                // whole position reads its own element alone (a NaN beside it stays out).
                let i1 = if scale < 1.0 && x == i0 as f64 { i0 } else { i1 };
                let t = if i1 == i0 { 0.5 } else { x - i0 as f64 };
                plan.taps = 2;
                plan.indices.extend([i0, i1]);
                plan.weights.extend([(1.0 - t) as f32, t as f32]);
            }
            _ => {
                let a = node.attr_float("cubic_coeff_a", -0.75)? as f64;
                let exclude = node.attr_int("exclude_outside", 0)? != 0;
                let i0 = x.floor() as i64;
                let mut w = cubic_weights(x - i0 as f64, a);
                let idx: Vec<i64> = (-1..=2).map(|k| i0 + k).collect();
                if exclude {
                    for (wk, &ik) in w.iter_mut().zip(&idx) {
                        if ik < 0 || ik > last {
                            *wk = 0.0;
                        }
                    }
                    let total: f64 = w.iter().sum();
                    if total != 0.0 {
                        w.iter_mut().for_each(|wk| *wk /= total);
                    }
                }
                plan.taps = 4;
                plan.indices.extend(idx.iter().map(|&i| i.clamp(0, last)));
                plan.weights.extend(w.iter().map(|&v| v as f32));
            }
        }
    }
    if plan.taps == 0 {
        bail!("an empty output axis");
    }
    Ok(plan)
}

/// Resamples `x` along `axis` per `plan`.
pub(crate) fn apply(x: &Array, axis: usize, plan: &AxisPlan, extrapolation: f64, s: &Stream) -> Result<Array> {
    let n_out = plan.outside.len() as i64;
    let taps = plan.taps as i64;
    let idx = Array::from_slice(&plan.indices, &[n_out * taps])?;
    let g = ops::take(x, &idx, axis as i32, s)?;
    let mut y = if taps == 1 {
        g
    } else {
        let mut shape = g.shape();
        shape.splice(axis..=axis, [n_out, taps]);
        let g = ops::reshape(&ops::astype(&g, Dtype::F32, s)?, &shape, s)?;
        let mut wshape = vec![1i64; shape.len()];
        wshape[axis] = n_out;
        wshape[axis + 1] = taps;
        let w = Array::from_slice(&plan.weights, &wshape)?;
        let mut terms = ops::multiply(&g, &w, s)?;
        if !plan.real.is_empty() {
            let real = Array::from_slice(&plan.real, &wshape)?;
            terms = ops::where_(&real, &terms, &ops::scalar(0.0, Dtype::F32, s)?, s)?;
        }
        let sum = ops::sum_axes(&terms, &[axis as i32 + 1], false, s)?;
        ops::astype(&sum, x.dtype(), s)?
    };
    if plan.outside.iter().any(|&o| o) {
        let mut mshape = vec![1i64; y.ndim()];
        mshape[axis] = n_out;
        let mask = Array::from_slice(&plan.outside, &mshape)?;
        y = ops::where_(&mask, &ops::scalar(extrapolation, y.dtype(), s)?, &y, s)?;
    }
    Ok(y)
}

/// The axes ORT's CPU EP interpolates in linear and cubic modes, which it supports only over
/// these layouts: linear 2-D and 3-D inputs, 4-D ones scaled on the inner two axes (NCHW) or
/// the middle two (NHWC), 5-D ones on the inner three; cubic 2-D inputs and 4-D NCHW ones.
fn interpolated_axes(mode: &str, scale: &[f64], antialias: bool) -> Result<Vec<usize>> {
    let one = |a: usize| scale[a] == 1.0;
    let r = scale.len();
    let axes = match (mode, r) {
        ("nearest", _) => Some(Vec::new()),
        ("linear", 2 | 3) | ("cubic", 2) => Some((0..r).collect()),
        ("linear" | "cubic", 4) if one(0) && one(1) => Some(vec![2, 3]),
        ("linear", 4) if one(0) && one(3) => Some(vec![1, 2]),
        // (Antialiased, ORT takes channels-last cubic too.)
        ("cubic", 4) if antialias && one(0) && one(3) => Some(vec![1, 2]),
        ("linear", 5) if one(0) && one(1) => Some(vec![2, 3, 4]),
        _ => None,
    };
    axes.ok_or_else(|| ep_core::Error::new(format!("{mode} mode does not resize a {r}-D input by scales {scale:?}")))
}

fn lower_resize(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    resize(ctx, node, Modes::of(node))
}

fn resize(ctx: &mut LowerCtx<'_>, node: &NodeInfo, modes: Modes<'_>) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let r = shape.len();
    let s = ctx.stream_for(x.dtype());
    let upsample = node.op_type == "Upsample";
    let read_floats = |i: usize| -> Result<Option<Vec<f64>>> {
        match ctx.optional_input(i) {
            Some(a) if a.size() > 0 => Ok(Some(ctx.host_f64(i)?)),
            _ => Ok(None),
        }
    };
    // Inputs by opset: 10: (X, scales); 11+: (X, roi, scales, sizes); Upsample 9: (X, scales).
    let (roi, scales, sizes) = if upsample {
        let scales = if node.since_version >= 9 {
            read_floats(1)?
        } else {
            node.attr("scales").and_then(|a| {
                if let AttrValue::Floats(f) = a { Some(f.iter().map(|&v| v as f64).collect()) } else { None }
            })
        };
        (None, scales, None)
    } else if node.since_version < 11 {
        (None, read_floats(1)?, None)
    } else {
        let sizes = match ctx.optional_input(3) {
            Some(a) if a.size() > 0 => Some(ctx.host_i64(3)?),
            _ => None,
        };
        (read_floats(1)?, read_floats(2)?, sizes)
    };
    let axes: Vec<usize> = match node.attr_ints("axes")? {
        Some(a) => a.iter().map(|&a| normalize_axis(a, r)).collect::<std::result::Result<_, _>>()?,
        None => (0..r).collect(),
    };
    let k = axes.len();
    let (mut out, mut scale): (Vec<i64>, Vec<f64>) = (shape.clone(), vec![1.0; r]);
    if let Some(sizes) = sizes {
        if sizes.len() != k {
            bail!("{} sizes for {k} axes", sizes.len());
        }
        let ratios: Vec<f64> = axes.iter().zip(&sizes).map(|(&a, &n)| n as f64 / shape[a] as f64).collect();
        match string_attr(node, "keep_aspect_ratio_policy", "stretch") {
            "stretch" => {
                for (j, &a) in axes.iter().enumerate() {
                    out[a] = sizes[j];
                    scale[a] = ratios[j];
                }
            }
            policy => {
                let pick = if policy == "not_larger" {
                    ratios.iter().copied().fold(f64::INFINITY, f64::min)
                } else {
                    ratios.iter().copied().fold(0.0, f64::max)
                };
                for &a in &axes {
                    scale[a] = pick;
                    out[a] = (shape[a] as f64 * pick).round() as i64;
                }
            }
        }
    } else if let Some(sc) = scales {
        if sc.len() != k {
            bail!("{} scales for {k} axes", sc.len());
        }
        for (j, &a) in axes.iter().enumerate() {
            scale[a] = sc[j];
            // In float32, as ORT computes it (3 * 1.6666666f is 5, not 4.99...).
            out[a] = (shape[a] as f32 * sc[j] as f32).floor() as i64;
        }
    } else {
        bail!("Resize needs scales or sizes");
    }
    // As ORT's CPU EP: Upsample's scales at least 1, Resize's above 0, and no empty axis
    // resized to a nonempty one. An empty result is answered without planning.
    for &a in &axes {
        let v = scale[a];
        let bad_scale = if upsample { v.is_nan() || v < 1.0 } else { shape[a] > 0 && (v.is_nan() || v <= 0.0) };
        if bad_scale {
            bail!("the scale {v} of axis {a} must be {}", if upsample { "1 or more" } else { "above 0" });
        }
        if shape[a] == 0 && out[a] != 0 {
            bail!("axis {a} is empty and cannot be resized to {}", out[a]);
        }
    }
    if out.contains(&0) {
        return Ok(vec![ops::full(&out, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?]);
    }
    // Planned on the host per output position: refuse absurd sizes before that work.
    ep_core::lowering::check_shape(&out, x.dtype())?;
    let mode = string_attr(node, "mode", "nearest");
    let mode = if upsample && mode == "bilinear" { "linear" } else { mode };
    // (The layouts ORT's CPU EP refuses are refused first, whatever the output's shape.)
    let antialias = !upsample && mode != "nearest" && node.attr_int("antialias", 0)? != 0;
    let interpolated = interpolated_axes(mode, &scale, antialias)?;
    // An output of the input's shape is the input as it is, whatever the scales, mode and
    // region, as ORT's CPU EP answers it (floor(3 * 1.25) is 3: no interpolation; nor is an
    // infinity weighed by 0 into NaN at scale 1).
    if out == shape {
        return Ok(vec![x.clone()]);
    }
    let extrapolation = node.attr_float("extrapolation_value", 0.0)? as f64;
    let mut y = x.clone();
    for (j, &a) in axes.iter().enumerate() {
        // ORT's antialiasing filter runs over every interpolated axis whose size changes; its
        // plain interpolation plans an interpolated axis even at scale 1 (its zero weights make
        // an infinite neighbour NaN there too).
        let skip = if antialias {
            out[a] == shape[a] || !interpolated.contains(&a)
        } else {
            out[a] == shape[a] && scale[a] == 1.0 && !interpolated.contains(&a)
        };
        if skip {
            continue;
        }
        let roi_a = match &roi {
            Some(v) if v.len() == 2 * k => (v[j], v[j + k]),
            _ => (0.0, 1.0),
        };
        let plan = if antialias {
            crate::antialias::plan(node, modes.ctm, mode, shape[a], out[a], scale[a], roi_a)?
        } else {
            plan_axis(node, modes, mode, shape[a], out[a], scale[a], roi_a)?
        };
        y = apply(&y, a, &plan, extrapolation, s)?;
    }
    Ok(vec![y])
}

ep_core::register_lowering!(
    RESIZE = FnLowering {
        domain: "",
        op: "Resize",
        opsets: 10..=i32::MAX,
        claim: claim_resize,
        lower: lower_resize,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_upsample(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, ALL_TYPES)?;
    let mode = string_attr(node, "mode", "nearest");
    if !matches!(mode, "nearest" | "linear" | "bilinear") {
        return Err(Decline(format!("mode '{mode}' is not supported")));
    }
    if mode != "nearest" && !input_type(node, 0).is_some_and(|t| FLOATS.contains(&t) || t == ElemType::F64) {
        return Err(Decline::new("linear interpolation takes float inputs"));
    }
    Ok(())
}

/// Upsample: Resize with the asymmetric transform and floor rounding for nearest.
fn lower_upsample(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    resize(ctx, node, Modes { ctm: "asymmetric", nearest: "floor" })
}

ep_core::register_lowering!(
    UPSAMPLE = FnLowering {
        domain: "",
        op: "Upsample",
        opsets: 7..=9,
        claim: claim_upsample,
        lower: lower_upsample,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    const MODES: &[&str] = &["nearest", "linear", "cubic"];
    const CTMS: &[&str] = &["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"];
    const NEAREST: &[&str] = &["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"];

    register_spec!(super::RESIZE, || {
        let attrs = (select(MODES), select(CTMS), select(NEAREST), any::<(bool, bool, bool)>());
        // 4-D inputs resized on their last two axes: the forms ORT's CPU EP takes for every mode.
        (float_dtype(), nonempty_shape(2..=2), collection::vec(1..=6i64, 2), attrs, opset(13..=19), seed())
            .prop_map(|(t, lead, sp, (mode, ctm, nearest, (by_sizes, exclude, antialias)), v, seed)| {
                let ctm = if ctm == "half_pixel_symmetric" && v < 19 { "half_pixel" } else { ctm };
                let x_shape = [lead.clone(), vec![3, 4]].concat();
                let r = x_shape.len();
                let mut case = Case::op("Resize", v).input("x", t, &x_shape).absent();
                let mut out = x_shape.clone();
                if by_sizes {
                    out[r - 2] = sp[0];
                    out[r - 1] = sp[1];
                    case = case.absent().constant_i64("sizes", &out);
                } else {
                    // Scales that give whole output sizes from 3 and 4; or (one case in eight)
                    // scales other than 1 that keep both sizes (floor(3 * 1.25) is 3).
                    let keep = seed % 8 == 0;
                    let (a, b) = if keep { (1.25, 1.2) } else { (sp[0] as f64 / 3.0, sp[1] as f64 / 4.0) };
                    out[r - 2] = (3.0 * a as f32).floor() as i64;
                    out[r - 1] = (4.0 * b as f32).floor() as i64;
                    let mut scales = vec![1.0; r];
                    scales[r - 2] = a;
                    scales[r - 1] = b;
                    case = case.constant("scales", DType::F32, &[r as i64], Values::Data(scales));
                }
                let mut case = case.attr_str("mode", mode).attr_str("coordinate_transformation_mode", ctm);
                if mode == "nearest" {
                    case = case.attr_str("nearest_mode", nearest);
                }
                if mode == "cubic" && exclude {
                    case = case.attr_int("exclude_outside", 1);
                }
                // Antialiasing (opset 18): linear and cubic, shrinking or growing.
                if antialias && mode != "nearest" && v >= 18 {
                    case = case.attr_int("antialias", 1);
                    if mode == "linear" && exclude {
                        case = case.attr_int("exclude_outside", 1);
                    }
                }
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::UPSAMPLE, || {
        (float_dtype(), 1..=3i64, 1..=3i64, any::<bool>(), seed())
            .prop_map(|(t, a, b, linear, seed)| {
                let x = [1, 2, 3, 2];
                let out = [1, 2, 3 * a, 2 * b];
                Case::op("Upsample", 9)
                    .input("x", t, &x)
                    .constant("scales", DType::F32, &[4], Values::Data(vec![1.0, 1.0, a as f64, b as f64]))
                    .attr_str("mode", if linear { "linear" } else { "nearest" })
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });
}
