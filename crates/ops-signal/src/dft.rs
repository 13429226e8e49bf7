//! DFT: the discrete Fourier transform along one axis of `[batch, ..., signal, 1 | 2]`
//! (real or complex samples), forward or inverse, full or one-sided (the first `n / 2 + 1`
//! bins, and the inverse of a real signal's half spectrum back to it), zero-padded or cut to
//! `dft_length`. Opsets 17-19 take the axis as an attribute, 20 on as an input.

use crate::large;
use crate::matrix::{MAX_POINTS, Transform};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

/// The element types transformed (ORT's CPU EP runs float32 and float64; MLX's GPUs have no
/// float64).
const TYPES: &[ElemType] = &[ElemType::F32];

fn flags(node: &NodeInfo) -> std::result::Result<(bool, bool), String> {
    let flag = |name: &str| match node.attr_int(name, 0)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(format!("{name}={v} is not 0 or 1")),
    };
    Ok((flag("inverse")?, flag("onesided")?))
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 3)?;
    require_input_type(node, 0, TYPES)?;
    if node.input(1).is_some() {
        require_input_type(node, 1, &[ElemType::I32, ElemType::I64])?;
    }
    if node.input(2).is_some() {
        require_input_type(node, 2, &[ElemType::I64])?;
    }
    let (inverse, onesided) = flags(node)?;
    if inverse && onesided && node.input(1).is_some() {
        // Where dft_length and the bins disagree, ORT's CPU EP answers by rules of its own.
        return Err(Decline::new("the inverse of a one-sided spectrum with dft_length is left to ORT"));
    }
    let Some(shape) = node.input(0).and_then(|v| v.shape.clone()) else { return Ok(()) };
    if shape.len() < 3 {
        // ORT's CPU EP reads a rank-2 input as [batch, signal] real samples.
        return Err(Decline(format!("the input has rank {}; DFT takes [batch, signal..., 1 | 2]", shape.len())));
    }
    match shape[shape.len() - 1] {
        Some(c) if c != 1 && c != 2 => {
            return Err(Decline(format!("the last axis is {c}, not 1 (real) or 2 (complex)")));
        }
        Some(1) if onesided && inverse => {
            return Err(Decline::new("the inverse of a one-sided spectrum needs complex input"));
        }
        _ => {}
    }
    // (The transform's length is the axis's, or twice its bins less one for an inverse of a
    // one-sided spectrum; with dft_length it is data, checked when the node is built.)
    let points = |len: i64| if inverse && onesided { 2 * (len - 1) } else { len };
    if node.input(1).is_none()
        && let Some(len) = shape
            .iter()
            .take(shape.len() - 1)
            .flatten()
            .map(|&l| points(l))
            .find(|&n| n > MAX_POINTS && large::split(n as usize).is_none())
    {
        return Err(Decline(format!(
            "a transform of {len} points, which does not split into two of at most {MAX_POINTS} points"
        )));
    }
    Ok(())
}

/// The one value of scalar input `i`.
pub(crate) fn scalar_input(ctx: &LowerCtx<'_>, i: usize, what: &str) -> Result<i64> {
    match ctx.host_i64(i)?[..] {
        [v] => Ok(v),
        ref other => bail!("{what} has {} values; it must be a scalar", other.len()),
    }
}

/// `x` (`[..., rows, c]` after moving `axis` next to the last one) times the transform's
/// matrix, moved back: `[..., bins, 2]`, or `[..., n, 1]` for a real output.
pub(crate) fn apply(x: &Array, axis: usize, t: &Transform, ctx: &LowerCtx<'_>) -> Result<Array> {
    let s = ctx.stream();
    let shape = x.shape();
    let r = shape.len();
    let mut perm: Vec<usize> = (0..r - 1).filter(|&d| d != axis).collect();
    perm.extend([axis, r - 1]);
    let moved = ops::transpose_axes(x, &perm.iter().map(|&d| d as i32).collect::<Vec<_>>(), s)?;
    let mut lead: Vec<i64> = perm[..r - 2].iter().map(|&d| shape[d]).collect();
    let spectrum = if t.n as i64 > MAX_POINTS {
        two_passes(&moved, t, s)?
    } else {
        lead.push((t.rows * t.components) as i64);
        let flat = ops::reshape(&moved, &lead, s)?;
        let product = ops::matmul(&flat, &t.matrix(x.dtype(), s)?, s)?;
        let (points, parts) = if t.real_out { (t.n, 1) } else { (t.bins, 2) };
        lead.pop();
        lead.extend([points as i64, parts]);
        ops::reshape(&product, &lead, s)?
    };
    // Back from `perm`: the axis returns to its place.
    let mut back = vec![0i32; r];
    for (i, &d) in perm.iter().enumerate() {
        back[d] = i as i32;
    }
    Ok(ops::transpose_axes(&spectrum, &back, s)?)
}

/// [`apply`]'s transform of `x` (`[..., rows, c]`) past [`MAX_POINTS`] points, through
/// [`large::transform`]: real samples widened to complex, zero-padded to `n` (an inverse of a
/// one-sided spectrum extended to the full one first), the bins or the real part kept.
fn two_passes(x: &Array, t: &Transform, s: &ep_core::mlx::Stream) -> Result<Array> {
    let shape = x.shape();
    let r = shape.len();
    // The passes hold a few arrays of the zero-padded complex signal alive at once (padded,
    // each pass's product, the twiddled and transposed ones): four of them must fit where
    // the process may still allocate (MLX does not survive a failed allocation).
    let rows: i64 = shape[..r - 2].iter().product();
    ep_core::lowering::check_shape(&[4, rows, t.n as i64, 2], x.dtype())?;
    let last = r as i32 - 1;
    let zero = ops::scalar(0.0, x.dtype(), s)?;
    let complex = if t.components == 1 {
        ops::concatenate(&[x.clone(), ops::multiply(x, &zero, s)?], last, s)?
    } else {
        x.clone()
    };
    let padded = |a: &Array, to: usize| -> Result<Array> {
        let have = a.shape()[r - 2] as usize;
        if have >= to {
            return Ok(a.clone());
        }
        let mut high = vec![0i64; r];
        high[r - 2] = (to - have) as i64;
        Ok(ops::pad(a, &vec![0; r], &high, &zero, "constant", s)?)
    };
    let full =
        if t.real_out { large::hermitian(&padded(&complex, t.n / 2 + 1)?, t.n, s)? } else { padded(&complex, t.n)? };
    let y = large::transform(&full, t.n, t.inverse, s)?;
    let mut stop = y.shape();
    if t.real_out {
        stop[r - 1] = 1;
    } else {
        stop[r - 2] = t.bins as i64;
    }
    Ok(ops::slice(&y, &vec![0; r], &stop, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (inverse, onesided) = flags(node).map_err(Error::new)?;
    let x = ctx.input(0)?.clone();
    let shape = x.shape();
    let r = shape.len();
    if r < 3 {
        bail!("the input has rank {r}; DFT takes [batch, signal..., 1 | 2]");
    }
    let components = shape[r - 1];
    if components != 1 && components != 2 {
        bail!("the input's last axis is {components}, not 1 (real) or 2 (complex)");
    }
    let axis = if node.since_version >= 20 {
        if ctx.optional_input(2).is_some() { scalar_input(ctx, 2, "axis")? } else { -2 }
    } else {
        node.attr_int("axis", 1).map_err(Error::new)?
    };
    let rank = r as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank - 1).contains(&axis) {
        bail!("axis {axis} is not a signal axis of a rank-{rank} input");
    }
    let axis = axis as usize;
    let len = shape[axis] as usize;
    let irfft = inverse && onesided;
    if irfft && components != 2 {
        bail!("the inverse of a one-sided spectrum needs complex input");
    }
    if irfft && ctx.optional_input(1).is_some() {
        bail!("the inverse of a one-sided spectrum with dft_length is left to ORT's CPU EP");
    }
    let n = if ctx.optional_input(1).is_some() {
        scalar_input(ctx, 1, "dft_length")?
    } else if irfft {
        2 * (len as i64 - 1)
    } else {
        len as i64
    };
    if n == 0 && (irfft || !onesided) {
        // No points (an empty axis, or one bin to invert): an empty answer, as ORT's CPU EP gives.
        let mut empty = shape.clone();
        empty[axis] = 0;
        empty[r - 1] = if irfft { 1 } else { 2 };
        let s = ctx.stream();
        return Ok(vec![ops::broadcast_to(&ops::scalar(0.0, x.dtype(), s)?, &empty, s)?]);
    }
    if n < 1 {
        bail!("dft_length {n} is not positive");
    }
    if n > MAX_POINTS && large::split(n as usize).is_none() {
        bail!("a DFT of {n} points, which does not split into two transforms of at most {MAX_POINTS} points");
    }
    let n = n as usize;
    let rows = len.min(if irfft { n / 2 + 1 } else { n });
    let t = Transform {
        n,
        rows,
        components: components as usize,
        bins: if onesided && !inverse { n / 2 + 1 } else { n },
        inverse,
        real_out: irfft,
    };
    let x = if rows < len {
        let mut stop = shape.clone();
        stop[axis] = rows as i64;
        ops::slice(&x, &vec![0; r], &stop, ctx.stream())?
    } else {
        x
    };
    Ok(vec![apply(&x, axis, &t, ctx)?])
}

ep_core::register_lowering!(
    DFT = FnLowering {
        domain: "",
        op: "DFT",
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

    register_spec!(super::DFT, || {
        (collection::vec(1..=9i64, 1..=3), 0..3usize, 0..4usize, any::<bool>(), (0..=12i64, 0..8u8), seed())
            .prop_map(|(dims, axis_pick, mode, v20, (length, big), seed)| {
                // mode: 0 forward, 1 forward one-sided, 2 inverse, 3 inverse one-sided.
                let (inverse, onesided) = (mode >= 2, mode % 2 == 1);
                // ONNX's shape inference refuses a one-sided DFT of a static complex input, so
                // the cases give one a real input (a symbolic one is answered, as ORT's CPU EP does).
                let components = match mode {
                    1 => 1,
                    3 => 2,
                    _ => 1 + (seed % 2) as i64,
                };
                let mut x = vec![1 + (seed % 2) as i64];
                x.extend(&dims);
                let signal_axes = x.len();
                x.push(components);
                let axis = 1 + axis_pick % (signal_axes - 1).max(1);
                let axis = axis.min(signal_axes - 1);
                let len = x[axis];
                // An inverse of a one-sided spectrum: no dft_length, and 2 or more bins.
                let mut length = if mode == 3 { 0 } else { length };
                if mode == 3 && len < 2 {
                    x[axis] = 2;
                }
                // One case in eight: one signal past the matrix size (two passes). Powers of
                // two only: at other lengths ORT's CPU EP sums the naive DFT in float32, off by
                // up to 5e-2 at 4100 points (the two passes' unit test checks those against
                // float64 sums).
                if big == 0 {
                    let n = [8192i64, 16384][(seed % 2) as usize];
                    for (d, v) in x.iter_mut().enumerate().take(signal_axes) {
                        if d != axis {
                            *v = 1;
                        }
                    }
                    if mode == 3 {
                        x[axis] = n / 2 + 1;
                    } else {
                        x[axis] = n - (seed % 4) as i64;
                        length = n;
                    }
                }
                let len = x[axis];
                let n = if length > 0 {
                    length
                } else if mode == 3 {
                    2 * (len - 1)
                } else {
                    len
                };
                let mut y = x.clone();
                y[axis] = if onesided && !inverse { n / 2 + 1 } else { n };
                *y.last_mut().unwrap() = if mode == 3 { 1 } else { 2 };
                let v = if v20 { 20 } else { 17 };
                // Values within ±0.5, for the reason STFT's cases give.
                let half = Values::Uniform { lo: -0.5, hi: 0.5 };
                let mut case = Case::op("DFT", v).with_seed(seed).input_with("input", DType::F32, &x, half);
                case = if length > 0 {
                    case.constant("dft_length", DType::I64, &[], Values::Data(vec![length as f64]))
                } else {
                    case.absent()
                };
                if v20 {
                    // Negative half the time.
                    let a = if seed % 3 == 0 { axis as i64 - x.len() as i64 } else { axis as i64 };
                    case = case.constant("axis", DType::I64, &[], Values::Data(vec![a as f64]));
                } else {
                    case = case.attr_int("axis", axis as i64);
                }
                if inverse {
                    case = case.attr_int("inverse", 1);
                }
                if onesided {
                    case = case.attr_int("onesided", 1);
                }
                // A long transform sums thousands of products per bin: both EPs round them.
                let case = case.output("output", DType::F32, &y);
                if n > 4096 { case.summed((n / 256) as u32) } else { case }
            })
            .boxed()
    });
}
