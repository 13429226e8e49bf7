//! HannWindow, HammingWindow and BlackmanWindow (cosine-sum windows of `size` samples,
//! periodic or symmetric) and MelWeightMatrix (the triangular mel filter bank of a one-sided
//! spectrum): tensors computed on the host in float64 from their scalar inputs, as ONNX
//! defines them, then rounded to the output type.

use crate::dft::scalar_input;
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// The output types made (`output_datatype`): float32 and float64. Integer outputs truncate
/// values within [0, 1], where one rounding step decides between 0 and 1; they stay on ORT's
/// CPU EP.
fn output_type(node: &NodeInfo) -> std::result::Result<Dtype, String> {
    match ElemType::from_tensor_proto(node.attr_int("output_datatype", 1)? as i32) {
        ElemType::F32 => Ok(Dtype::F32),
        ElemType::F64 => Ok(Dtype::F64),
        other => Err(format!("output_datatype {other:?} is not float or double")),
    }
}

/// `values` as an array of `dtype` (rounded on the host).
fn host_array(values: &[f64], shape: &[i64], dtype: Dtype) -> Result<Array> {
    Ok(match dtype {
        Dtype::F64 => Array::from_slice(values, shape)?,
        _ => Array::from_slice(&values.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape)?,
    })
}

fn claim_window(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::I32, ElemType::I64])?;
    output_type(node)?;
    match node.attr_int("periodic", 1)? {
        0 | 1 => Ok(()),
        v => Err(Decline(format!("periodic={v} is not 0 or 1"))),
    }
}

/// `a0 - a1 cos(2 pi i / N) + a2 cos(4 pi i / N)`, `N` the size (periodic) or one less. The
/// coefficients are float32 constants, as ONNX writes them.
fn cosine_sum(ctx: &LowerCtx<'_>, node: &NodeInfo, a0: f32, a1: f32, a2: f32) -> Result<Vec<Array>> {
    let dtype = output_type(node).map_err(ep_core::Error::new)?;
    let size = scalar_input(ctx, 0, "size")?;
    if size < 0 {
        bail!("size {size} is negative");
    }
    ep_core::lowering::check_shape(&[size], dtype)?;
    let periodic = node.attr_int("periodic", 1).map_err(ep_core::Error::new)? == 1;
    // A symmetric window of one sample divides 0 by 0: NaN, as ORT's CPU EP answers.
    let span = if periodic { size } else { size - 1 } as f64;
    let step = 2.0 * std::f64::consts::PI / span;
    let (a0, a1, a2) = (f64::from(a0), f64::from(a1), f64::from(a2));
    let values: Vec<f64> = (0..size)
        .map(|i| {
            let angle = step * i as f64;
            let third = if a2 == 0.0 { 0.0 } else { a2 * (2.0 * angle).cos() };
            a0 - a1 * angle.cos() + third
        })
        .collect();
    Ok(vec![host_array(&values, &[size], dtype)?])
}

fn lower_hann(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    cosine_sum(ctx, node, 0.5, 0.5, 0.0)
}

fn lower_hamming(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let a0 = 25.0f32 / 46.0;
    cosine_sum(ctx, node, a0, 1.0 - a0, 0.0)
}

fn lower_blackman(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let a2 = 0.16f32 / 2.0;
    cosine_sum(ctx, node, 0.5 - a2, 0.5, a2)
}

fn claim_mel(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 5, 5)?;
    for i in 0..3 {
        require_input_type(node, i, &[ElemType::I32, ElemType::I64])?;
    }
    for i in 3..5 {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    output_type(node)?;
    Ok(())
}

/// The filter bank `[dft_length / 2 + 1, num_mel_bins]`: `num_mel_bins + 2` points evenly
/// spaced in mel between the edges, each mapped to a spectrum bin, and a triangle of height 1
/// from each point over the next to the one after.
fn lower_mel(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let dtype = output_type(node).map_err(ep_core::Error::new)?;
    let mels = scalar_input(ctx, 0, "num_mel_bins")?;
    let dft_length = scalar_input(ctx, 1, "dft_length")?;
    let rate = scalar_input(ctx, 2, "sample_rate")?;
    let edge = |i: usize, what: &str| -> Result<f64> {
        match ctx.host_f64(i)?[..] {
            [v] => Ok(v),
            ref other => bail!("{what} has {} values; it must be a scalar", other.len()),
        }
    };
    let (lower, upper) = (edge(3, "lower_edge_hertz")?, edge(4, "upper_edge_hertz")?);
    if mels < 1 || dft_length < 1 || rate < 1 {
        bail!("num_mel_bins {mels}, dft_length {dft_length} and sample_rate {rate} must be positive");
    }
    let spectrum = dft_length / 2 + 1;
    ep_core::lowering::check_shape(&[spectrum, mels], dtype)?;
    let bin_of = |hz: f64| ((dft_length + 1) as f64 * hz / rate as f64).floor();
    for (hz, which) in [(lower, "lower_edge_hertz"), (upper, "upper_edge_hertz")] {
        let bin = bin_of(hz);
        if !(bin >= 0.0 && bin < spectrum as f64) {
            bail!("{which} {hz} falls on bin {bin}, outside the {spectrum} bins of the spectrum");
        }
    }
    let to_mel = |hz: f64| 2595.0 * (1.0 + hz / 700.0).log10();
    let (low, high) = (to_mel(lower), to_mel(upper));
    let count = mels as usize + 2;
    let step = (high - low) / count as f64;
    let mut points = Vec::with_capacity(count);
    for i in 0..count {
        let hz = 700.0 * (10f64.powf((low + step * i as f64) / 2595.0) - 1.0);
        let bin = bin_of(hz);
        if !(bin >= 0.0 && bin < spectrum as f64) {
            bail!("mel point {i} falls on bin {bin}, outside the {spectrum} bins of the spectrum");
        }
        points.push(bin as usize);
    }
    let m = mels as usize;
    let mut w = vec![0.0f64; spectrum as usize * m];
    for i in 0..m {
        let (left, center, right) = (points[i], points[i + 1], points[i + 2]);
        if center == left {
            w[center * m + i] = 1.0;
        } else {
            for j in left..=center {
                w[j * m + i] = (j - left) as f64 / (center - left) as f64;
            }
        }
        for j in center..right {
            w[j * m + i] = (right - j) as f64 / (right - center) as f64;
        }
    }
    Ok(vec![host_array(&w, &[spectrum, mels], dtype)?])
}

macro_rules! window {
    ($($name:ident = $op:literal, $lower:ident;)*) => {$(
        ep_core::register_lowering!(
            $name = FnLowering {
                domain: "",
                op: $op,
                opsets: 17..=i32::MAX,
                claim: claim_window,
                lower: $lower,
                safety: CompileSafety::ShapeKeyed,
                growth: None,
            }
        );
    )*};
}

window! {
    HANN = "HannWindow", lower_hann;
    HAMMING = "HammingWindow", lower_hamming;
    BLACKMAN = "BlackmanWindow", lower_blackman;
}

ep_core::register_lowering!(
    MEL_WEIGHT_MATRIX = FnLowering {
        domain: "",
        op: "MelWeightMatrix",
        opsets: 17..=i32::MAX,
        claim: claim_mel,
        lower: lower_mel,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn window(op: &'static str) -> BoxedStrategy<Case> {
        // The size is a runtime input: ORT folds a node of constants before any EP sees it.
        (0..=40i64, any::<bool>(), any::<bool>(), any::<bool>(), seed())
            .prop_map(move |(size, periodic, double, wide, seed)| {
                let dtype = if double { DType::F64 } else { DType::F32 };
                let size_type = if wide { DType::I64 } else { DType::I32 };
                let case = Case::op(op, 17).with_seed(seed);
                let case = case.input_with("size", size_type, &[], Values::Data(vec![size as f64]));
                let case = case.attr_int("periodic", i64::from(periodic));
                let case = if double { case.attr_int("output_datatype", 11) } else { case };
                case.output("y", dtype, &[size])
            })
            .boxed()
    }

    register_spec!(super::HANN, || window("HannWindow"));
    register_spec!(super::HAMMING, || window("HammingWindow"));
    register_spec!(super::BLACKMAN, || window("BlackmanWindow"));

    // Runtime inputs, as for the windows.
    register_spec!(super::MEL_WEIGHT_MATRIX, || {
        (1..=12i64, 8..=64i64, select(vec![8000i64, 16000, 22050]), 0..=3usize, seed())
            .prop_map(|(mels, dft_length, rate, band, seed)| {
                let nyquist = rate as f64 / 2.0;
                let (lower, upper) =
                    [(0.0, nyquist * 0.95), (20.0, nyquist * 0.9), (300.0, nyquist * 0.5), (0.0, 1000.0)][band];
                let scalar = |v: f64| Values::Data(vec![v]);
                Case::op("MelWeightMatrix", 17)
                    .with_seed(seed)
                    .input_with("num_mel_bins", DType::I64, &[], scalar(mels as f64))
                    .input_with("dft_length", DType::I64, &[], scalar(dft_length as f64))
                    .input_with("sample_rate", DType::I64, &[], scalar(rate as f64))
                    .input_with("lower_edge_hertz", DType::F32, &[], scalar(lower))
                    .input_with("upper_edge_hertz", DType::F32, &[], scalar(upper))
                    .output("y", DType::F32, &[dft_length / 2 + 1, mels])
            })
            .boxed()
    });
}
