//! `com.microsoft` QLinearAveragePool and QLinearGlobalAveragePool on int8/uint8, channels
//! first or last (`channels_last`), with ORT's CPU EP's arithmetic:
//! - a window: each element dequantized in float32 (`x_scale * (x - x_zero_point)`), summed
//!   in the window's row-major order from 0, divided by the count (the kernel's size with
//!   `count_include_pad`, else the input elements it covers), then `y / y_scale + y_zero_point`
//!   rounded half to even and saturated;
//! - the whole image (QLinearGlobalAveragePool, and a window that is the whole image without
//!   pads): the integer sum less `x_zero_point * n`, times `x_scale / (y_scale * n)` in float32,
//!   saturated around `y_zero_point`, rounded half to even.
//!
//! The scales and zero points are read on the host (constants in quantized exports).

use crate::window::{Window, windows};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const Q8: &[ElemType] = &[ElemType::I8, ElemType::U8];

fn claim_io(node: &NodeInfo, zero_points_required: bool) -> std::result::Result<(), Decline> {
    require_inputs(node, 4, 5)?;
    for i in [0, 1, 3] {
        if node.input(i).is_none() {
            return Err(Decline::new(format!("input {i} is missing")));
        }
    }
    if zero_points_required && (node.input(2).is_none() || node.input(4).is_none()) {
        return Err(Decline::new("both zero points are required"));
    }
    for i in [0, 2, 4] {
        require_input_type(node, i, Q8)?;
    }
    for i in [1, 3] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    match ep_core::lowering::input_rank(node, 0) {
        Some(3..=5) => Ok(()),
        r => Err(Decline(format!("input rank {r:?}: 1 to 3 spatial axes are supported"))),
    }
}

fn claim_pool(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_io(node, false)?;
    if node.attr("dilations").is_some() {
        return Err(Decline::new("QLinearAveragePool has no dilations"));
    }
    crate::pool::claim_window(node)
}

fn claim_global(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_io(node, true)
}

struct Quant {
    x_scale: f32,
    x_zp: f32,
    y_scale: f32,
    y_zp: f32,
    t: Dtype,
    lo: f32,
    hi: f32,
}

fn quant(ctx: &LowerCtx<'_>) -> Result<Quant> {
    let t = ctx.input(0)?.dtype();
    let (lo, hi) = match t {
        Dtype::I8 => (-128.0, 127.0),
        Dtype::U8 => (0.0, 255.0),
        other => bail!("{other:?} is not int8 or uint8"),
    };
    let required = |i: usize, what: &str| -> Result<f32> {
        ctx.host_one_f32(i, what)?.ok_or_else(|| ep_core::Error::new(format!("{what} is missing")))
    };
    Ok(Quant {
        x_scale: required(1, "x_scale")?,
        x_zp: ctx.host_one_f32(2, "x_zero_point")?.unwrap_or(0.0),
        y_scale: required(3, "y_scale")?,
        y_zp: ctx.host_one_f32(4, "y_zero_point")?.unwrap_or(0.0),
        t,
        lo,
        hi,
    })
}

fn channels_last(node: &NodeInfo) -> Result<bool> {
    Ok(node.attr_int("channels_last", 0)? != 0)
}

/// `[N, *spatial, C]` to `[N, C, *spatial]` (`forward`) or back.
fn relayout(x: &Array, forward: bool, s: &Stream) -> Result<Array> {
    let r = x.ndim() as i32;
    let perm: Vec<i32> = if forward {
        [vec![0, r - 1], (1..r - 1).collect()].concat()
    } else {
        [vec![0], (2..r).collect(), vec![1]].concat()
    };
    Ok(ops::transpose_axes(x, &perm, s)?)
}

/// The whole-image average of `[N, C, *spatial]` as ORT's integer path computes it.
fn global_average(x: &Array, q: &Quant, s: &Stream) -> Result<Array> {
    let shape = x.shape();
    let n: i64 = shape[2..].iter().product();
    let scale = q.x_scale / (q.y_scale * n as f32);
    // (A NaN scale passes ORT's check and computes: NaN saturates to the lowest value.)
    if n >= 1 << 24 || scale < 2f32.powi(-32) || scale >= 256.0 {
        bail!("the scale {scale} or the image size {n} is out of the integer path's computation range");
    }
    let axes: Vec<i32> = (2..shape.len() as i32).collect();
    let sum = ops::sum_axes(&ops::astype(x, Dtype::I32, s)?, &axes, true, s)?;
    let acc = ops::subtract(&sum, &ops::scalar(f64::from(q.x_zp) * n as f64, Dtype::I32, s)?, s)?;
    let f = |v: f32| ops::scalar(f64::from(v), Dtype::F32, s);
    let v = ops::multiply(&ops::astype(&acc, Dtype::F32, s)?, &f(scale)?, s)?;
    let low = f(q.lo - q.y_zp)?;
    let v = ops::where_(&ops::isnan(&v, s)?, &low, &ops::clip(&v, Some(&low), Some(&f(q.hi - q.y_zp)?), s)?, s)?;
    let v = ops::add(&ops::round(&v, s)?, &f(q.y_zp)?, s)?;
    Ok(ops::astype(&v, q.t, s)?)
}

fn lower_global(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let q = quant(ctx)?;
    let last = channels_last(node)?;
    let x = ctx.input(0)?;
    let x = if last { relayout(x, true, s)? } else { x.clone() };
    let shape = x.shape();
    let y = if shape[..2].contains(&0) {
        // No image: an empty result.
        let out = [shape[..2].to_vec(), vec![1; shape.len() - 2]].concat();
        ops::full(&out, &ops::scalar(0.0, q.t, s)?, q.t, s)?
    } else {
        global_average(&x, &q, s)?
    };
    Ok(vec![if last { relayout(&y, false, s)? } else { y }])
}

fn lower_pool(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let q = quant(ctx)?;
    let last = channels_last(node)?;
    let x = ctx.input(0)?;
    let x = if last { relayout(x, true, s)? } else { x.clone() };
    let shape = x.shape();
    if shape.contains(&0) && shape[0] != 0 {
        bail!("input {shape:?} is empty on an axis other than the batch");
    }
    let kernel = node.attr_ints("kernel_shape")?.ok_or("kernel_shape is required")?.to_vec();
    let ceil = node.attr_int("ceil_mode", 0)? == 1;
    let w = Window::of_pool(node, &shape[2..], kernel.clone(), ceil)?;
    let y = if shape[..2].contains(&0) {
        let out = [shape[..2].to_vec(), w.out.clone()].concat();
        ops::full(&out, &ops::scalar(0.0, q.t, s)?, q.t, s)?
    } else if kernel == shape[2..] && w.pad_lo.iter().chain(&w.pad_hi).all(|&p| p == 0) {
        // ORT takes its whole-image path here.
        global_average(&x, &q, s)?
    } else {
        window_average(&x, node, &w, &q, s)?
    };
    Ok(vec![if last { relayout(&y, false, s)? } else { y }])
}

fn window_average(x: &Array, node: &NodeInfo, w: &Window, q: &Quant, s: &Stream) -> Result<Array> {
    let shape = x.shape();
    let k = shape.len() - 2;
    let out = [shape[..2].to_vec(), w.out.clone()].concat();
    if w.out.contains(&0) {
        return Ok(ops::full(&out, &ops::scalar(0.0, q.t, s)?, q.t, s)?);
    }
    let f = |v: f32| ops::scalar(f64::from(v), Dtype::F32, s);
    let centred = ops::subtract(&ops::astype(x, Dtype::I32, s)?, &ops::scalar(f64::from(q.x_zp), Dtype::I32, s)?, s)?;
    let values = ops::multiply(&f(q.x_scale)?, &ops::astype(&centred, Dtype::F32, s)?, s)?;
    // [N, C, o1, k1, o2, k2, ...], padding 0 (adds nothing to a sum).
    let win = windows(&values, w, 0.0, s)?;
    let mut acc = ops::full(&out, &f(0.0)?, Dtype::F32, s)?;
    let taps: i64 = w.kernel.iter().product();
    for tap in 0..taps {
        // The tap's offset along each axis, the last axis fastest.
        let mut rest = tap;
        let mut offset = vec![0i64; k];
        for i in (0..k).rev() {
            offset[i] = rest % w.kernel[i];
            rest /= w.kernel[i];
        }
        let mut v = win.clone();
        for i in (0..k).rev() {
            v = ops::take(&v, &Array::from_slice(&[offset[i] as i32], &[])?, 3 + 2 * i as i32, s)?;
        }
        acc = ops::add(&acc, &v, s)?;
    }
    // (Any value but 0 counts the pads, as ORT reads the attribute.)
    let include = node.attr_int("count_include_pad", 0)? != 0;
    let count = if include {
        f(taps as f32)?
    } else {
        // Per output position: the input elements its window covers, a product over axes.
        let mut counts: Option<Array> = None;
        for i in 0..k {
            let c: Vec<f32> = (0..w.out[i])
                .map(|o| {
                    let start = o * w.strides[i] - w.pad_lo[i];
                    ((start + w.kernel[i]).min(shape[2 + i]) - start.max(0)) as f32
                })
                .collect();
            let mut cshape = vec![1i64; 2 + k];
            cshape[2 + i] = w.out[i];
            let c = Array::from_slice(&c, &cshape)?;
            counts = Some(match counts {
                Some(a) => ops::multiply(&a, &c, s)?,
                None => c,
            });
        }
        counts.ok_or("a pool needs a spatial axis")?
    };
    let mean = ops::divide(&acc, &count, s)?;
    let v = ops::add(&ops::divide(&mean, &f(q.y_scale)?, s)?, &f(q.y_zp)?, s)?;
    let v = ops::round(&v, s)?;
    // NaN, an infinity or anything past int32 converts to int32's lowest value before the
    // saturation, as the CPU EP's conversion does: the type's lowest value.
    let fits = ops::less(&ops::abs(&v, s)?, &f(2147483648.0)?, s)?;
    let v = ops::where_(&fits, &ops::clip(&v, Some(&f(q.lo)?), Some(&f(q.hi)?), s)?, &f(q.lo)?, s)?;
    Ok(ops::astype(&v, q.t, s)?)
}

ep_core::register_lowering!(
    QLINEAR_AVERAGE_POOL = FnLowering {
        domain: "com.microsoft",
        op: "QLinearAveragePool",
        opsets: 1..=i32::MAX,
        claim: claim_pool,
        lower: lower_pool,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    QLINEAR_GLOBAL_AVERAGE_POOL = FnLowering {
        domain: "com.microsoft",
        op: "QLinearGlobalAveragePool",
        opsets: 1..=i32::MAX,
        claim: claim_global,
        lower: lower_global,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn full_range(t: DType) -> Values {
        match t {
            DType::I8 => Values::Uniform { lo: -128.0, hi: 128.0 },
            _ => Values::Uniform { lo: 0.0, hi: 256.0 },
        }
    }

    /// The quantization inputs after X, as constants (ORT's type inference fails without the
    /// zero points, optional as the schema makes them).
    fn quantized(case: Case, t: DType) -> Case {
        case.constant("x_scale", DType::F32, &[], Values::Uniform { lo: 0.01, hi: 0.1 })
            .constant("x_zp", t, &[], full_range(t))
            .constant("y_scale", DType::F32, &[], Values::Uniform { lo: 0.005, hi: 0.05 })
            .constant("y_zp", t, &[], full_range(t))
    }

    fn layout(nchw: &[i64], last: bool) -> Vec<i64> {
        if last { [vec![nchw[0]], nchw[2..].to_vec(), vec![nchw[1]]].concat() } else { nchw.to_vec() }
    }

    register_spec!(super::QLINEAR_GLOBAL_AVERAGE_POOL, || {
        (dtype_of(&[DType::I8, DType::U8]), 1..=3usize, any::<bool>(), seed())
            .prop_map(|(t, k, last, seed)| {
                let x: Vec<i64> = [
                    vec![1 + (seed % 2) as i64, 1 + (seed % 3) as i64],
                    (0..k).map(|i| 2 + ((seed >> i) % 4) as i64).collect(),
                ]
                .concat();
                let mut y = x.clone();
                y[2..].iter_mut().for_each(|d| *d = 1);
                let case = Case::domain_op("com.microsoft", "QLinearGlobalAveragePool", 1).input_with(
                    "x",
                    t,
                    &layout(&x, last),
                    full_range(t),
                );
                quantized(case, t)
                    .attr_int("channels_last", last as i64)
                    .output("y", t, &layout(&y, last))
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::QLINEAR_AVERAGE_POOL, || {
        let geometry = (1..=3usize, 1..=3i64, 1..=2i64, 0..=2i64, any::<bool>(), any::<bool>());
        (dtype_of(&[DType::I8, DType::U8]), geometry, any::<bool>(), seed())
            .prop_map(|(t, (k, kernel, stride, pad, ceil, include), last, seed)| {
                let spatial: Vec<i64> = (0..k).map(|i| kernel + ((seed >> (2 * i)) % 4) as i64).collect();
                let x = [vec![1 + (seed % 2) as i64, 1 + (seed % 3) as i64], spatial.clone()].concat();
                let pad = pad.min(kernel - 1);
                let out: Vec<i64> = spatial
                    .iter()
                    .map(|&d| {
                        let span = d + 2 * pad - kernel;
                        let mut o = if ceil { (span + stride - 1) / stride + 1 } else { span / stride + 1 };
                        if ceil && (o - 1) * stride >= d + pad {
                            o -= 1;
                        }
                        o
                    })
                    .collect();
                let y = [x[..2].to_vec(), out].concat();
                let case = Case::domain_op("com.microsoft", "QLinearAveragePool", 1).input_with(
                    "x",
                    t,
                    &layout(&x, last),
                    full_range(t),
                );
                quantized(case, t)
                    .attr_ints("kernel_shape", &vec![kernel; k])
                    .attr_ints("strides", &vec![stride; k])
                    .attr_ints("pads", &vec![pad; 2 * k])
                    .attr_int("ceil_mode", ceil as i64)
                    .attr_int("count_include_pad", include as i64)
                    .attr_int("channels_last", last as i64)
                    .output("y", t, &layout(&y, last))
                    .with_seed(seed)
            })
            .boxed()
    });
}
