//! Conv (1-D, 2-D, 3-D; groups, dilations, explicit pads and `auto_pad`) on MLX's
//! channels-last convolution: the input is transposed to channels-last and back, the weight
//! once per session when it is a constant.

use crate::window::Window;
use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result, bail};

fn claim_conv(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 3)?;
    for i in 0..3 {
        require_input_type(node, i, FLOATS)?;
    }
    match ep_core::lowering::input_rank(node, 0) {
        Some(3..=5) => Ok(()),
        r => Err(Decline(format!("input rank {r:?}: 1-D, 2-D and 3-D convolutions are supported"))),
    }
}

/// `[0, 2, 3, ..., 1]`: channels-first to channels-last.
fn to_channels_last(r: usize) -> Vec<i32> {
    std::iter::once(0).chain(2..r as i32).chain(std::iter::once(1)).collect()
}

fn lower_conv(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let xs = x.shape();
    let r = xs.len();
    let ws = ctx.input(1)?.shape();
    let groups = node.attr_int("group", 1)?;
    if groups < 1 || xs[1] != ws[1] * groups || ws[0] % groups != 0 {
        bail!("input {xs:?} and weight {ws:?} do not fit group {groups}");
    }
    let kernel = ws[2..].to_vec();
    if let Some(k) = node.attr_ints("kernel_shape")?
        && k != kernel.as_slice()
    {
        bail!("kernel_shape {k:?} differs from the weight's {kernel:?}");
    }
    let w = Window::of(node, &xs[2..], kernel, false)?;
    let perm = to_channels_last(r);
    let weight = ctx
        .derived(1, "conv-weight-channels-last", |w, s| Ok(ops::transpose_axes(w, &to_channels_last(w.ndim()), s)?))?;
    let input = ops::transpose_axes(x, &perm, s)?;
    let ones = vec![1; r - 2];
    let conv = |x: &Array, k: &Array, g: i64| {
        ops::conv_general(x, k, &w.strides, &w.pad_lo, &w.pad_hi, &w.dilations, &ones, g, s)
    };
    let y = if groups > 1 && r == 5 {
        // MLX convolves groups in 1-D and 2-D only: a grouped 3-D convolution is one
        // convolution per group, concatenated along the channels.
        let (cpg, mpg) = (xs[1] / groups, ws[0] / groups);
        let cut = |a: &Array, per: i64| -> Result<Vec<Array>> {
            let bounds: Vec<i64> = (1..groups).map(|i| i * per).collect();
            Ok(ops::split_at(a, &bounds, a.ndim() as i32 - 1, s)?)
        };
        let parts = cut(&input, cpg)?;
        let kernels = ops::split_at(&weight, &(1..groups).map(|i| i * mpg).collect::<Vec<_>>(), 0, s)?;
        let ys = parts.iter().zip(&kernels).map(|(x, k)| conv(x, k, 1)).collect::<std::result::Result<Vec<_>, _>>()?;
        ops::concatenate(&ys, r as i32 - 1, s)?
    } else {
        conv(&input, &weight, groups)?
    };
    // Back to channels-first: [0, r-1, 1, ..., r-2].
    let back: Vec<i32> = std::iter::once(0).chain(std::iter::once(r as i32 - 1)).chain(1..r as i32 - 1).collect();
    let mut y = ops::transpose_axes(&y, &back, s)?;
    if let Some(b) = ctx.optional_input(2) {
        let mut shape = vec![1i64; r];
        shape[1] = b.size() as i64;
        y = ops::add(&y, &ops::reshape(b, &shape, s)?, s)?;
    }
    Ok(vec![y])
}

ep_core::register_lowering!(
    CONV = FnLowering {
        domain: "",
        op: "Conv",
        opsets: 1..=i32::MAX,
        claim: claim_conv,
        lower: lower_conv,
        safety: CompileSafety::ShapeKeyed,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!("", "Conv", || {
        let geometry = (1..=3usize, 1..=2i64, 1..=2i64, 1..=3i64, 1..=2i64, 1..=2i64, 0..=1i64);
        (
            select(&[DType::F32, DType::F32, DType::F16][..]),
            geometry,
            1..=2i64,
            0..4u8,
            any::<bool>(),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(t, (dims, n, g, cpg, stride, dil, pad), m_per_g, auto, bias, v, seed)| {
                // ORT's CPU Conv has no dilation with SAME padding.
                let dil = if auto >= 2 { 1 } else { dil };
                let c = g * cpg;
                let m = g * m_per_g;
                let spatial: Vec<i64> = (0..dims).map(|i| 5 + i as i64).collect();
                let kernel: Vec<i64> = (0..dims).map(|i| 1 + (i as i64 + seed as i64) % 3).collect();
                let x = [vec![n, c], spatial.clone()].concat();
                let wshape = [vec![m, cpg], kernel.clone()].concat();
                let unit = Values::Uniform { lo: -1.0, hi: 1.0 };
                let mut case =
                    Case::op("Conv", v).input_with("x", t, &x, unit.clone()).input_with("w", t, &wshape, unit.clone());
                if bias {
                    case = case.input_with("b", t, &[m], unit);
                }
                let mut out = vec![n, m];
                for i in 0..dims {
                    let eff = (kernel[i] - 1) * dil + 1;
                    out.push(match auto {
                        0 => (spatial[i] + 2 * pad - eff) / stride + 1,
                        1 => (spatial[i] - eff) / stride + 1,
                        _ => (spatial[i] + stride - 1) / stride,
                    });
                }
                case = case
                    .attr_int("group", g)
                    .attr_ints("strides", &vec![stride; dims])
                    .attr_ints("dilations", &vec![dil; dims]);
                case = match auto {
                    0 => case.attr_ints("pads", &vec![pad; 2 * dims]),
                    1 => case.attr_str("auto_pad", "VALID"),
                    2 => case.attr_str("auto_pad", "SAME_UPPER"),
                    _ => case.attr_str("auto_pad", "SAME_LOWER"),
                };
                case.attr_ints("kernel_shape", &kernel).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });
}
