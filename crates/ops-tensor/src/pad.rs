//! Pad: constant, edge, reflect and wrap modes; negative pads crop. Also `com.microsoft:Pad`
//! (ORT's earlier form of opset 11's: pads and value as inputs, pads `[2 * rank]` or
//! `[1, 2 * rank]`).

use ep_core::lowering::{ALL_TYPES, FnLowering, normalize_axis, require_input_type};
use ep_core::mlx::{Array, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn mode(node: &NodeInfo) -> &str {
    match node.attr("mode") {
        Some(AttrValue::String(m)) => m.as_str(),
        _ => "constant",
    }
}

fn claim_pad(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, &[ElemType::I64])?;
    require_input_type(node, 3, &[ElemType::I64, ElemType::I32])?;
    match mode(node) {
        "constant" | "edge" | "reflect" | "wrap" => Ok(()),
        m => Err(Decline(format!("mode '{m}' is not supported"))),
    }
}

/// The source index of each output position along an axis of size `n` padded by `(lo, hi)`.
fn source_indices(n: i64, lo: i64, hi: i64, mode: &str) -> Result<Vec<i64>> {
    (-lo..n + hi)
        .map(|i| {
            Ok(match mode {
                "edge" => i.clamp(0, n - 1),
                "wrap" => i.rem_euclid(n),
                _ => {
                    // reflect: mirror without repeating the edge, period 2(n - 1).
                    if n == 1 {
                        0
                    } else {
                        let p = 2 * (n - 1);
                        let j = i.rem_euclid(p);
                        if j < n { j } else { p - j }
                    }
                }
            })
        })
        .collect()
}

fn lower_pad(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let r = shape.len();
    let s = ctx.stream_for(x.dtype());
    let (pads, value, axes) = if node.since_version >= 11 || node.domain == "com.microsoft" {
        let value = match ctx.optional_input(2) {
            Some(v) => Some(ops::reshape(v, &[], s)?),
            None => None,
        };
        let axes = if ctx.optional_input(3).is_some() { Some(ctx.host_i64(3)?) } else { None };
        (ctx.host_i64(1)?, value, axes)
    } else {
        let pads = node.attr_ints("pads")?.ok_or("Pad needs pads")?.to_vec();
        let v = node.attr_float("value", 0.0)?;
        (pads, Some(ops::scalar(v as f64, x.dtype(), s)?), None)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| normalize_axis(a, r)).collect::<std::result::Result<_, _>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        bail!("{} pads for {} axes", pads.len(), axes.len());
    }
    let (mut lo, mut hi) = (vec![0i64; r], vec![0i64; r]);
    for (k, &a) in axes.iter().enumerate() {
        lo[a] = pads[k];
        hi[a] = pads[k + axes.len()];
    }
    // The padded shape, in 128 bits (pads may be anywhere in i64), checked before any host
    // work proportional to it.
    let padded: Vec<i64> = (0..r)
        .map(|a| i64::try_from(i128::from(shape[a]) + i128::from(lo[a]) + i128::from(hi[a])).unwrap_or(i64::MAX))
        .collect();
    ep_core::lowering::check_shape(&padded, x.dtype())?;
    // An empty constant-mode result (a crop that exactly meets the padding on some axis) is
    // just that, as ORT's CPU EP answers it (the other modes have no input to copy from there,
    // which it refuses, as the path below does).
    if padded.contains(&0) && mode(node) == "constant" {
        return Ok(vec![ops::full(&padded, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?]);
    }
    // Negative pads crop first.
    let start: Vec<i64> = lo.iter().map(|&p| (-p).max(0)).collect();
    let stop: Vec<i64> = shape.iter().zip(&hi).map(|(&d, &p)| d + p.min(0)).collect();
    if start.iter().zip(&stop).any(|(a, b)| a > b) {
        bail!("pads crop more than the input has");
    }
    let mut y = ops::slice(x, &start, &stop, s)?;
    // Edge, reflect and wrap copy from the input: an axis that pads touch and crops to nothing
    // has none, which ORT's CPU EP refuses.
    if mode(node) != "constant"
        && let Some(a) = (0..r).find(|&a| (lo[a] != 0 || hi[a] != 0) && stop[a] == start[a])
    {
        bail!("mode '{}' cannot pad axis {a}: its pads crop it to nothing", mode(node));
    }
    let (lo, hi): (Vec<i64>, Vec<i64>) =
        (lo.iter().map(|&p| p.max(0)).collect(), hi.iter().map(|&p| p.max(0)).collect());
    let m = mode(node);
    if m == "constant" {
        let value = match value {
            Some(v) => ops::astype(&v, x.dtype(), s)?,
            None => ops::scalar(0.0, x.dtype(), s)?,
        };
        if lo.iter().chain(&hi).any(|&p| p > 0) {
            y = ops::pad(&y, &lo, &hi, &value, "constant", s)?;
        }
        return Ok(vec![y]);
    }
    let cropped = y.shape();
    for a in 0..r {
        if lo[a] == 0 && hi[a] == 0 {
            continue;
        }
        if cropped[a] == 0 {
            bail!("cannot pad an empty axis in mode '{m}'");
        }
        // A reflection mirrors the axis once at most, as ORT's CPU EP requires.
        if m == "reflect" && lo[a].max(hi[a]) >= cropped[a] {
            bail!("reflect pads ({}, {}) on axis {a} must be smaller than its size {}", lo[a], hi[a], cropped[a]);
        }
        let idx = source_indices(cropped[a], lo[a], hi[a], m)?;
        let n = idx.len() as i64;
        y = ops::take(&y, &Array::from_slice(&idx, &[n])?, a as i32, s)?;
    }
    Ok(vec![y])
}

ep_core::register_lowering!(
    PAD = FnLowering {
        domain: "",
        op: "Pad",
        opsets: 2..=i32::MAX,
        claim: claim_pad,
        lower: lower_pad,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    MS_PAD = FnLowering {
        domain: "com.microsoft",
        op: "Pad",
        opsets: 1..=i32::MAX,
        claim: claim_pad,
        lower: lower_pad,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_center_crop_pad(node: &NodeInfo) -> std::result::Result<(), Decline> {
    ep_core::lowering::require_inputs(node, 2, 2)?;
    require_input_type(node, 0, ALL_TYPES)?;
    // (ORT 1.31 runs CenterCropPad's function body, which takes int64 sizes only.)
    require_input_type(node, 1, &[ElemType::I64])?;
    if node.input(0).and_then(|v| v.elem_type) == Some(ElemType::String) {
        return Err(Decline::new("string input"));
    }
    Ok(())
}

/// CenterCropPad (opset 18): each of `axes` (all by default) cropped or zero-padded to its size
/// in `shape` (read on the host), centered; an odd excess is cut, and an odd shortfall padded,
/// at the end; a negative size empties the axis, as the op's function body computes it.
fn lower_center_crop_pad(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?.clone();
    let dims = x.shape();
    let r = dims.len();
    if r == 0 {
        bail!("the input is a scalar: there is no axis to crop or pad (ORT's CPU EP refuses it too)");
    }
    let sizes = ctx.host_i64(1)?;
    let axes: Vec<usize> = match node.attr_ints("axes")? {
        Some(a) => a.iter().map(|&a| normalize_axis(a, r)).collect::<std::result::Result<_, _>>()?,
        None => (0..r).collect(),
    };
    if sizes.len() != axes.len() {
        bail!("shape has {} sizes for {} axes", sizes.len(), axes.len());
    }
    let (mut lo, mut hi) = (vec![0i64; r], vec![0i64; r]);
    let (mut start, mut stop) = (vec![0i64; r], dims.clone());
    for (&a, &t) in axes.iter().zip(&sizes) {
        if t > i32::MAX as i64 {
            bail!("size {t} for axis {a} is outside 0..=2^31-1 (MLX holds dimensions as 32-bit integers)");
        }
        // A negative size empties the axis, as the op's function body (its Slice) does.
        let t = t.max(0);
        let d = dims[a];
        if t > d {
            lo[a] = (t - d) / 2;
            hi[a] = t - d - lo[a];
        } else {
            start[a] = (d - t) / 2;
            stop[a] = start[a] + t;
        }
    }
    let s = ctx.stream();
    let y = ops::slice(&x, &start, &stop, s)?;
    if lo.iter().chain(&hi).all(|&p| p == 0) {
        return Ok(vec![y]);
    }
    let zero = ops::scalar(0.0, x.dtype(), s)?;
    Ok(vec![ops::pad(&y, &lo, &hi, &zero, "constant", s)?])
}

ep_core::register_lowering!(
    CENTER_CROP_PAD = FnLowering {
        domain: "",
        op: "CenterCropPad",
        opsets: 18..=i32::MAX,
        claim: claim_center_crop_pad,
        lower: lower_center_crop_pad,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::spec_util::any_dtype;
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::PAD, || {
        let modes = select(&["constant", "edge", "reflect", "wrap"][..]);
        (
            select(&[DType::F32, DType::F64, DType::I32, DType::I64, DType::U8][..]),
            nonempty_shape(1..=3),
            collection::vec(-1..=3i64, 6),
            modes,
            any::<bool>(),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(t, s, raw, mode, with_axes, v, seed)| {
                let r = s.len();
                // Wrap is defined from opset 19; reflect needs pads smaller than the dim.
                let mode = if mode == "wrap" && v < 19 { "edge" } else { mode };
                // ORT's reflect needs pads within the dim and no cropping.
                let clampd =
                    |p: i64, d: i64| if mode == "reflect" { p.min(d - 1).max(0) } else { p.max(-((d - 1) / 2)) };
                let pads: Vec<i64> = (0..2 * r).map(|i| clampd(raw[i], s[i % r])).collect();
                let out: Vec<i64> = (0..r).map(|a| s[a] + pads[a] + pads[a + r]).collect();
                let case = Case::op("Pad", v).input("x", t, &s).constant_i64("pads", &pads);
                let case = if mode == "constant" {
                    let val = if t == DType::Bool { 1.0 } else { 2.5_f64.floor() };
                    case.constant("value", t, &[], Values::Data(vec![val]))
                } else if with_axes && v >= 18 {
                    case.absent()
                } else {
                    case
                };
                let case = if with_axes && v >= 18 {
                    let axes: Vec<i64> = (0..r as i64).collect();
                    case.constant_i64("axes", &axes)
                } else {
                    case
                };
                case.attr_str("mode", mode).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::MS_PAD, || {
        (
            nonempty_shape(1..=3),
            collection::vec(-1..=3i64, 6),
            select(&["constant", "edge", "reflect"][..]),
            any::<bool>(),
            seed(),
        )
            .prop_map(|(s, raw, mode, two_d, seed)| {
                let r = s.len();
                let clampd =
                    |p: i64, d: i64| if mode == "reflect" { p.min(d - 1).max(0) } else { p.max(-((d - 1) / 2)) };
                let pads: Vec<i64> = (0..2 * r).map(|i| clampd(raw[i], s[i % r])).collect();
                let out: Vec<i64> = (0..r).map(|a| s[a] + pads[a] + pads[a + r]).collect();
                // The pads as `[2 * rank]` or `[1, 2 * rank]`, both of which ORT takes.
                let dims: Vec<i64> = if two_d { vec![1, 2 * r as i64] } else { vec![2 * r as i64] };
                let data = Values::Data(pads.iter().map(|&p| p as f64).collect());
                let case = Case::domain_op("com.microsoft", "Pad", 1).input("x", DType::F32, &s).constant(
                    "pads",
                    DType::I64,
                    &dims,
                    data,
                );
                let case = if mode == "constant" {
                    case.constant("value", DType::F32, &[], Values::Data(vec![1.5]))
                } else {
                    case
                };
                case.attr_str("mode", mode).output("y", DType::F32, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::CENTER_CROP_PAD, || {
        (any_dtype(), nonempty_shape(1..=3), collection::vec((0..=6i64, any::<bool>()), 3), any::<bool>(), seed())
            .prop_map(|(t, s, targets, all, seed)| {
                let axes: Vec<usize> =
                    if all { (0..s.len()).collect() } else { (0..s.len()).filter(|&a| targets[a].1).collect() };
                let sizes: Vec<i64> = axes.iter().map(|&a| targets[a].0).collect();
                let mut out = s.clone();
                for (&a, &n) in axes.iter().zip(&sizes) {
                    out[a] = n;
                }
                let case = Case::op("CenterCropPad", 18).input("x", t, &s).constant_i64("shape", &sizes);
                let case = if all {
                    case
                } else {
                    case.attr_ints("axes", &axes.iter().map(|&a| a as i64).collect::<Vec<_>>())
                };
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });
}
