//! STFT: the short-time Fourier transform of `[batch, length, 1 | 2]`: frames of
//! `frame_length` samples every `frame_step`, each multiplied by the window (when given) and
//! transformed, `[batch, frames, bins, 2]`. The frames are one gather, the transforms one
//! matrix product (frames past 4096 samples: two, see [`crate::large`]).

use crate::dft::scalar_input;
use crate::matrix::{MAX_POINTS, Transform};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn onesided(node: &NodeInfo) -> std::result::Result<bool, String> {
    match node.attr_int("onesided", 1)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(format!("onesided={v} is not 0 or 1")),
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 4)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::I32, ElemType::I64])?;
    if node.input(2).is_some() {
        require_input_type(node, 2, &[ElemType::F32])?;
    }
    if node.input(3).is_some() {
        require_input_type(node, 3, &[ElemType::I32, ElemType::I64])?;
    }
    if node.input(2).is_none() && node.input(3).is_none() {
        return Err(Decline::new("neither a window nor frame_length gives the frame's length"));
    }
    onesided(node)?;
    if let Some(shape) = node.input(0).and_then(|v| v.shape.clone()) {
        match shape[..] {
            [_, _, Some(c)] if c != 1 && c != 2 => {
                return Err(Decline(format!("the last axis is {c}, not 1 (real) or 2 (complex)")));
            }
            [_, _, _] => {}
            _ => return Err(Decline(format!("the signal has rank {}; STFT needs 3", shape.len()))),
        }
    }
    if let Some(Some(w)) = node.input(2).and_then(|v| v.shape.clone()).and_then(|s| s.first().copied())
        && !transformable(w)
    {
        return Err(Decline(format!(
            "a window of {w}, which does not split into two transforms of at most {MAX_POINTS} points"
        )));
    }
    Ok(())
}

/// Whether frames of `n` samples transform: up to [`MAX_POINTS`] in one matrix product,
/// longer ones in two passes ([`crate::large`]) when `n` splits into two such factors.
fn transformable(n: i64) -> bool {
    (1..=MAX_POINTS).contains(&n) || (n > MAX_POINTS && crate::large::split(n as usize).is_some())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let onesided = onesided(node).map_err(ep_core::Error::new)?;
    let x = ctx.input(0)?.clone();
    let shape = x.shape();
    let [_, length, components] = shape[..] else {
        bail!("the signal has shape {shape:?}; STFT needs [batch, length, 1 | 2]")
    };
    if components != 1 && components != 2 {
        bail!("the signal's last axis is {components}, not 1 (real) or 2 (complex)");
    }
    let step = scalar_input(ctx, 1, "frame_step")?;
    let window = ctx.optional_input(2).cloned();
    let frame = match (&window, ctx.optional_input(3).is_some()) {
        (Some(w), given) => {
            if w.ndim() != 1 {
                bail!("the window has shape {:?}; it must be one axis", w.shape());
            }
            let len = w.shape()[0];
            if given && scalar_input(ctx, 3, "frame_length")? != len {
                bail!("frame_length differs from the window's length {len}");
            }
            len
        }
        (None, true) => scalar_input(ctx, 3, "frame_length")?,
        (None, false) => bail!("neither a window nor frame_length gives the frame's length"),
    };
    if step < 1 {
        bail!("frame_step {step} is not positive");
    }
    if !transformable(frame) {
        bail!("a frame of {frame} samples, which is not 1..={MAX_POINTS} nor two transforms of at most that");
    }
    if frame > length {
        bail!("a frame of {frame} samples is longer than the signal ({length})");
    }
    let frames = (length - frame) / step + 1;
    // Sample index of every frame's every position: one gather makes `[batch, frames, frame, c]`.
    let index: Vec<i32> = (0..frames).flat_map(|f| (0..frame).map(move |j| (f * step + j) as i32)).collect();
    let index = Array::from_slice(&index, &[frames, frame])?;
    let mut framed = ops::take(&x, &index, 1, s)?;
    if let Some(w) = window {
        framed = ops::multiply(&framed, &ops::reshape(&w, &[1, 1, frame, 1], s)?, s)?;
    }
    let n = frame as usize;
    let t = Transform {
        n,
        rows: n,
        components: components as usize,
        bins: if onesided { n / 2 + 1 } else { n },
        inverse: false,
        real_out: false,
    };
    Ok(vec![crate::dft::apply(&framed, 2, &t, ctx)?])
}

ep_core::register_lowering!(
    STFT = FnLowering {
        domain: "",
        op: "STFT",
        opsets: 17..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::STFT, || {
        (1..=2i64, 1..=40i64, 1..=12i64, 1..=6i64, 0..3usize, any::<bool>(), seed())
            .prop_map(|(batch, extra, frame, step, how, onesided, seed)| {
                // One case in eight: frames past the matrix size (two passes), of a power of two
                // (for the reason DFT's long cases give), one or two of them, one signal.
                let long = seed.is_multiple_of(8);
                let (batch, frame, step, extra) = if long {
                    (1, [8192i64, 16384][(seed / 8 % 2) as usize], 4096, 1 + (seed / 16 % 2) as i64 * 4096)
                } else {
                    (batch, frame, step, extra)
                };
                // A complex signal's one-sided spectrum is its first frame / 2 + 1 bins.
                // (Long cases: real or complex by another bit of the seed.)
                let complex = if long { (seed / 32) % 2 == 0 } else { seed % 2 == 0 };
                let c = if complex { 2 } else { 1 };
                let length = frame + extra - 1;
                let frames = (length - frame) / step + 1;
                let bins = if onesided { frame / 2 + 1 } else { frame };
                // Values within ±0.5: ORT's CPU EP sums float32 exponentials of its own,
                // about 1e-5 off a float64 reference at ±1 where this EP is within 1e-6.
                let half = Values::Uniform { lo: -0.5, hi: 0.5 };
                let mut case = Case::op("STFT", 17)
                    .with_seed(seed)
                    .input_with("signal", DType::F32, &[batch, length, c], half.clone())
                    .constant("frame_step", DType::I64, &[], Values::Data(vec![step as f64]));
                // how: 0 a window, 1 frame_length alone, 2 both.
                case = if how == 1 { case.absent() } else { case.input_with("window", DType::F32, &[frame], half) };
                if how >= 1 {
                    case = case.constant("frame_length", DType::I64, &[], Values::Data(vec![frame as f64]));
                }
                if !onesided {
                    case = case.attr_int("onesided", 0);
                }
                let case = case.output("output", DType::F32, &[batch, frames, bins, 2]);
                // A long transform sums thousands of products per bin: both EPs round them.
                if long { case.summed((frame / 256) as u32) } else { case }
            })
            .boxed()
    });
}
