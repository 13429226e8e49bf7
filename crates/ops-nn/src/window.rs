//! Sliding-window geometry shared by Conv and the pools: strides, dilations, explicit pads,
//! `auto_pad` and `ceil_mode`, as ONNX defines them.

use ep_core::mlx::{Array, Stream, ops};
use ep_core::{AttrValue, Decline, Error, NodeInfo, Result, bail};

/// Where each window of one spatial axis starts and how the input is padded for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub kernel: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    pub pad_lo: Vec<i64>,
    pub pad_hi: Vec<i64>,
    /// Extra padding at the end for the last partial window of `ceil_mode` (never counted as
    /// input by average pooling).
    pub ceil_extra: Vec<i64>,
    pub out: Vec<i64>,
}

fn ints_or(node: &NodeInfo, name: &str, n: usize, default: i64) -> Result<Vec<i64>> {
    Ok(match node.attr_ints(name)? {
        Some(v) if v.len() == n => v.to_vec(),
        Some(v) => bail!("attribute {name} has {} values for {n} spatial axes", v.len()),
        None => vec![default; n],
    })
}

/// Declines `auto_pad` SAME_UPPER or SAME_LOWER with a dilation other than 1: ORT's CPU EP
/// refuses it for convolutions and pads its pools for the undilated kernel (ONNX pads for the
/// dilated one, as [`Window::of`] does).
pub fn claim_same_pad_dilation(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let same = matches!(node.attr("auto_pad"), Some(AttrValue::String(s)) if s.starts_with("SAME"));
    if same && node.attr_ints("dilations")?.is_some_and(|d| d.iter().any(|&d| d != 1)) {
        return Err(Decline::new("auto_pad SAME with a dilation other than 1 is left to the CPU EP"));
    }
    Ok(())
}

impl Window {
    /// The geometry for `spatial` input dims and `kernel` (from the weight or `kernel_shape`).
    pub fn of(node: &NodeInfo, spatial: &[i64], kernel: Vec<i64>, ceil_mode: bool) -> Result<Window> {
        Window::sized(node, spatial, kernel, ceil_mode, false)
    }

    /// [`Window::of`] for a pool: explicit pads that leave no whole window give an axis of no
    /// outputs (ORT's CPU EP answers an empty result there; only a negative size is an error).
    pub fn of_pool(node: &NodeInfo, spatial: &[i64], kernel: Vec<i64>, ceil_mode: bool) -> Result<Window> {
        Window::sized(node, spatial, kernel, ceil_mode, true)
    }

    fn sized(node: &NodeInfo, spatial: &[i64], kernel: Vec<i64>, ceil_mode: bool, empty_ok: bool) -> Result<Window> {
        let n = spatial.len();
        if kernel.len() != n {
            bail!("kernel of rank {} for {n} spatial axes", kernel.len());
        }
        let mut strides = ints_or(node, "strides", n, 1)?;
        let mut dilations = ints_or(node, "dilations", n, 1)?;
        if strides.iter().chain(&dilations).chain(&kernel).any(|&v| v < 1) {
            bail!("kernel, strides and dilations must be positive");
        }
        // (An empty string is NOTSET, as ORT's CPU EP reads it.)
        let auto = match node.attr("auto_pad") {
            Some(AttrValue::String(s)) if !s.is_empty() => s.as_str(),
            _ => "NOTSET",
        };
        let (mut pad_lo, mut pad_hi) = (vec![0; n], vec![0; n]);
        let mut out = vec![0; n];
        let mut ceil_extra = vec![0; n];
        // In i128: attributes may hold any int64 (2^63 - 1 strides or pads), which must give a
        // result or an error, never an overflow.
        let fit = |v: i128, what: &str| i64::try_from(v).map_err(|_| Error::new(format!("the {what} {v} overflows")));
        for i in 0..n {
            let (x, k, st, d) = (spatial[i] as i128, kernel[i] as i128, strides[i] as i128, dilations[i] as i128);
            let eff = (k - 1) * d + 1;
            let o = match auto {
                "SAME_UPPER" | "SAME_LOWER" => {
                    // (A convolution's output size is `(x + stride - 1) / stride` in ORT's
                    // checked 64-bit arithmetic, added left to right: an error where `x +
                    // stride` overflows.)
                    if !empty_ok {
                        fit(x + st, "input size plus stride")?;
                    }
                    let o = (x + st - 1) / st;
                    let total = ((o - 1) * st + eff - x).max(0);
                    let small = total / 2;
                    let (lo, hi) = if auto == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                    (pad_lo[i], pad_hi[i]) = (fit(lo, "padding")?, fit(hi, "padding")?);
                    o
                }
                "VALID" => (x - eff) / st + 1,
                "NOTSET" => {
                    let pads = ints_or(node, "pads", 2 * n, 0)?;
                    (pad_lo[i], pad_hi[i]) = (pads[i], pads[i + n]);
                    let (lo, hi) = (pads[i] as i128, pads[i + n] as i128);
                    let span = x + lo + hi - eff;
                    // A pool as ORT's CPU EP sizes it: `span / stride` rounded up, or toward
                    // zero, plus one (so a span short of a window by less than a stride still
                    // gives one window, over what input there is, and by less than two strides
                    // none). A convolution never runs short of a window.
                    let mut o = if ceil_mode {
                        (span + st - 1).div_euclid(st) + 1
                    } else if empty_ok {
                        span / st + 1
                    } else {
                        span.div_euclid(st) + 1
                    };
                    // A last window that starts inside the end padding only is dropped.
                    if ceil_mode && (o - 1) * st >= x + lo {
                        o -= 1;
                    }
                    o
                }
                other => bail!("auto_pad '{other}' is not supported"),
            };
            if o == 0 && empty_ok && auto == "NOTSET" {
                continue;
            }
            if o < 1 || (auto == "VALID" && x < eff) {
                bail!("the window does not fit the input on spatial axis {i}");
            }
            out[i] = fit(o, "output size")?;
            let needed = (o - 1) * st + eff;
            ceil_extra[i] = fit((needed - (x + pad_lo[i] as i128 + pad_hi[i] as i128)).max(0), "padding")?;
            // One window needs no more stride than the padded input's length, and a kernel of
            // one tap no dilation: so MLX (32-bit sizes) never sees a stride of 2^40 that the
            // CPU EP accepts.
            let padded = x + pad_lo[i] as i128 + pad_hi[i] as i128;
            if o == 1 && st > padded {
                strides[i] = fit(padded.max(1), "stride")?;
            }
            if k == 1 {
                dilations[i] = 1;
            }
        }
        Ok(Window { kernel, strides, dilations, pad_lo, pad_hi, ceil_extra, out })
    }
}

/// For a convolution of `x` `[N, C, *spatial]` by `w` `[M, C/group, *kernel]`: an error when the
/// input has no channels, or an empty spatial axis whose padding leaves no output (as ORT's
/// CPU EP refuses them), and `Some(shape)` of an all-zero output (before any bias) when the
/// batch or the output channels are 0 (MLX's CPU convolution hands BLAS zero-sized matrices,
/// which ends the process) or when an empty spatial axis is padded to a window (every
/// product is with padding: the convolution is 0, as ONNX defines it and as ORT's CPU EP
/// answers with a runtime weight).
pub fn empty_conv(xs: &[i64], ws: &[i64], w: &Window) -> Result<Option<Vec<i64>>> {
    if xs[1] == 0 || (xs[2..].contains(&0) && w.out.iter().any(|&o| o < 1)) {
        bail!("invalid input shape {xs:?}: no channels or an empty spatial axis");
    }
    if xs[0] == 0 || ws[0] == 0 || xs[2..].contains(&0) {
        return Ok(Some([vec![xs[0], ws[0]], w.out.clone()].concat()));
    }
    Ok(None)
}

/// The windows of a `[N, C, *spatial]` array padded per `w` (with `pad_value`):
/// `[N, C, out1, k1, out2, k2, ...]`. Each spatial axis is gathered at host-computed tap
/// positions `o * stride + t * dilation` (MLX 0.32.2 read overlapping strided views wrongly,
/// so no `as_strided`).
pub fn windows(x: &Array, w: &Window, pad_value: f64, s: &Stream) -> Result<Array> {
    let shape = x.shape();
    let k = shape.len() - 2;
    let lo: Vec<i64> = [vec![0, 0], w.pad_lo.clone()].concat();
    let hi: Vec<i64> = [vec![0, 0], w.pad_hi.iter().zip(&w.ceil_extra).map(|(a, b)| a + b).collect()].concat();
    let mut y = if lo.iter().chain(&hi).any(|&p| p > 0) {
        ops::pad(x, &lo, &hi, &ops::scalar(pad_value, x.dtype(), s)?, "constant", s)?
    } else {
        x.clone()
    };
    for i in 0..k {
        // Axis 2 + 2i holds this spatial axis (earlier ones became (out, k) pairs).
        let axis = 2 + 2 * i;
        let taps: Vec<i64> =
            (0..w.out[i]).flat_map(|o| (0..w.kernel[i]).map(move |t| o * w.strides[i] + t * w.dilations[i])).collect();
        let idx = Array::from_slice(&taps, &[w.out[i], w.kernel[i]])?;
        y = ops::take(&y, &idx, axis as i32, s)?;
    }
    Ok(y)
}
