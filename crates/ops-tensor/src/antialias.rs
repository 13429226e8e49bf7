//! Resize's `antialias` (opset 18) for linear and cubic modes: each output position reads a
//! window of the input weighted by the mode's filter, stretched by `1 / scale` when shrinking
//! (so every input position counts), as ORT's CPU EP plans it in float32: the triangle filter
//! (support 2) or the cubic one of `cubic_coeff_a` (support 4); the window is centred on the
//! position's input coordinate plus 0.5. With `exclude_outside` only the taps inside the
//! input are weighed (and renormalized); otherwise the weights of taps past either edge are
//! added to the edge tap. Weights are divided by their total.

use crate::resize::{AxisPlan, source_coordinate};
use ep_core::{NodeInfo, Result, bail};

/// The plan of one axis of `n_in` positions resized to `n_out` at `scale` (output / input).
pub(crate) fn plan(
    node: &NodeInfo,
    ctm: &str,
    mode: &str,
    n_in: i64,
    n_out: i64,
    scale: f64,
    roi: (f64, f64),
) -> Result<AxisPlan> {
    let cubic = mode == "cubic";
    let a = node.attr_float("cubic_coeff_a", -0.75)?;
    let exclude = node.attr_int("exclude_outside", 0)? != 0;
    let filter = |x: f32| -> f32 {
        let x = x.abs();
        if cubic {
            if x < 1.0 {
                ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
            } else if x < 2.0 {
                (((x - 5.0) * x + 8.0) * x - 4.0) * a
            } else {
                0.0
            }
        } else if x < 1.0 {
            1.0 - x
        } else {
            0.0
        }
    };
    let rscale = scale as f32;
    let stretch = 1.0 / rscale;
    let half_support = if cubic { 2.0f32 } else { 1.0 };
    let support = if stretch >= 1.0 { half_support * stretch } else { half_support };
    if !support.is_finite() || support > 1e6 {
        bail!("an antialiasing window of {support} positions (scale {scale})");
    }
    let window = support.ceil() as i64 * 2 + 1;
    let inv = if stretch >= 1.0 { 1.0 / stretch } else { 1.0 };
    let last = (n_in - 1) as f32;
    let mut plan = AxisPlan {
        taps: window as usize,
        indices: Vec::with_capacity((n_out * window) as usize),
        weights: Vec::with_capacity((n_out * window) as usize),
        outside: Vec::with_capacity(n_out as usize),
        real: Vec::with_capacity((n_out * window) as usize),
    };
    let mut buffer = vec![0f32; window as usize];
    for i in 0..n_out {
        let at = if stretch == 1.0 { i as f32 } else { source_coordinate(ctm, i as f32, rscale, n_in, n_out, roi) };
        let center = 0.5 + at;
        plan.outside.push(ctm == "tf_crop_and_resize" && (center - 0.5 < 0.0 || center - 0.5 > last));
        let lo_real = (center - support + 0.5).floor() as i64;
        let hi_real = (center + support + 0.5).floor() as i64;
        let hi_real = lo_real + (hi_real - lo_real).clamp(0, window);
        let (lo_cut, hi_cut) = (lo_real.clamp(0, n_in), hi_real.clamp(0, n_in));
        let (lo, hi) = if exclude { (lo_cut, hi_cut) } else { (lo_real, hi_real) };
        let count = hi - lo;
        buffer.iter_mut().for_each(|w| *w = 0.0);
        let mut total = 0f32;
        for x in 0..count {
            let w = filter(((x + lo) as f32 - center + 0.5) * inv);
            buffer[x as usize] = w;
            total += w;
        }
        if !exclude && lo_cut < hi_cut {
            // Taps before the input's start onto its first tap, past its end onto its last,
            // then the kept taps moved to the front.
            let before = (-lo).clamp(0, count - 1);
            for x in 0..before {
                buffer[before as usize] += buffer[x as usize];
            }
            let after = (count + lo - n_in).clamp(0, count - 1);
            for x in count - after..count {
                buffer[(count - after - 1) as usize] += buffer[x as usize];
            }
            if before > 0 || after > 0 {
                for x in 0..hi_cut - lo_cut {
                    buffer[x as usize] = buffer[(x + before) as usize];
                }
            }
        }
        let scale_by = if total == 0.0 { 1.0 } else { 1.0 / total };
        let kept = hi_cut - lo_cut;
        for x in 0..window {
            let real = x < kept;
            plan.indices.push(if real { lo_cut + x } else { lo_cut.min(n_in - 1) });
            plan.weights.push(if real { buffer[x as usize] * scale_by } else { 0.0 });
            plan.real.push(real);
        }
    }
    Ok(plan)
}
