//! ConvInteger and QLinearConv: convolutions of 8-bit integers accumulated exactly in int32.
//!
//! MLX convolves in floating point only. After the zero points are subtracted every product
//! is at most 255 * 255, so a partial sum over at most 256 products is exact in float32: the
//! input channels are split into chunks of `256 / kernel elements` channels, each chunk is
//! convolved in float32, and the chunks are added in int32. Padding pads the
//! zero-point-subtracted input with 0, i.e. the input with its zero point, as ORT does.

use crate::window::{Window, empty_conv};
use ep_core::graph::ElemType;
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result, bail};

const Q8: &[ElemType] = &[ElemType::I8, ElemType::U8];
/// Products one float32 partial sum may hold exactly.
const EXACT_TERMS: i64 = 256;

fn claim_common(node: &NodeInfo, x: usize, w: usize) -> std::result::Result<(), Decline> {
    if ep_core::lowering::input_rank(node, x) != Some(4) {
        return Err(Decline::new("2-D convolutions (rank-4 input) are supported"));
    }
    if let Some(shape) = node.input(w).and_then(|v| v.shape.as_ref())
        && let [_, _, Some(kh), Some(kw)] = shape[..]
        && kh * kw > EXACT_TERMS
    {
        return Err(Decline(format!("a {kh}x{kw} kernel has more than {EXACT_TERMS} products per channel")));
    }
    crate::window::claim_same_pad_dilation(node)
}

fn claim_conv_integer(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 4)?;
    for i in 0..4 {
        require_input_type(node, i, Q8)?;
    }
    claim_common(node, 0, 1)
}

/// `[m]` or a scalar, shaped to broadcast over `[M, C, kh, kw]` weights (per output channel).
fn per_channel(p: &Array, s: &Stream) -> Result<Array> {
    if p.size() == 1 {
        return Ok(ops::reshape(p, &[], s)?);
    }
    Ok(ops::reshape(p, &[p.size() as i64, 1, 1, 1], s)?)
}

/// The int32 convolution `(x - x_zp) * (w - w_zp)`, NCHW.
fn integer_conv(
    node: &NodeInfo,
    x: &Array,
    w: &Array,
    x_zp: Option<&Array>,
    w_zp: Option<&Array>,
    s: &Stream,
) -> Result<Array> {
    let (xs, ws) = (x.shape(), w.shape());
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
    let window = Window::of(node, &xs[2..], kernel.clone(), false)?;
    // An empty spatial axis that the pads make non-empty: every window holds only padding
    // (the input's zero point), so every sum is 0, as ORT's CPU EP answers.
    if xs[1] > 0 && xs[2..].contains(&0) && window.out.iter().all(|&o| o > 0) {
        let shape = [vec![xs[0], ws[0]], window.out.clone()].concat();
        return Ok(ops::full(&shape, &ops::scalar(0.0, Dtype::I32, s)?, Dtype::I32, s)?);
    }
    if let Some(shape) = empty_conv(&xs, &ws, &window)? {
        return Ok(ops::full(&shape, &ops::scalar(0.0, Dtype::I32, s)?, Dtype::I32, s)?);
    }
    let per_chunk = (EXACT_TERMS / kernel.iter().product::<i64>()).max(0);
    if per_chunk == 0 {
        bail!("kernel {kernel:?} has more than {EXACT_TERMS} products per channel");
    }
    let mut xf = ops::astype(x, Dtype::F32, s)?;
    if let Some(z) = x_zp {
        xf = ops::subtract(&xf, &ops::reshape(&ops::astype(z, Dtype::F32, s)?, &[], s)?, s)?;
    }
    let mut wf = ops::astype(w, Dtype::F32, s)?;
    if let Some(z) = w_zp {
        wf = ops::subtract(&wf, &per_channel(&ops::astype(z, Dtype::F32, s)?, s)?, s)?;
    }
    // Channels last: x [N, H, W, C], w [M, kh, kw, C].
    let xl = ops::transpose_axes(&xf, &[0, 2, 3, 1], s)?;
    let wl = ops::transpose_axes(&wf, &[0, 2, 3, 1], s)?;
    let (cpg, mpg) = (xs[1] / groups, ws[0] / groups);
    let ones = [1, 1];
    let mut outputs = Vec::with_capacity(groups as usize);
    for g in 0..groups {
        let xg = ops::take_range(&xl, g * cpg, cpg, 3, s)?;
        let wg = ops::take_range(&wl, g * mpg, mpg, 0, s)?;
        let mut acc: Option<Array> = None;
        let mut c = 0;
        while c < cpg {
            let n = per_chunk.min(cpg - c);
            let (xc, wc) = (ops::take_range(&xg, c, n, 3, s)?, ops::take_range(&wg, c, n, 3, s)?);
            let y = ops::conv_general(
                &xc,
                &wc,
                &window.strides,
                &window.pad_lo,
                &window.pad_hi,
                &window.dilations,
                &ones,
                1,
                false,
                s,
            )?;
            let y = ops::astype(&y, Dtype::I32, s)?;
            acc = Some(match acc {
                Some(a) => ops::add(&a, &y, s)?,
                None => y,
            });
            c += n;
        }
        outputs.push(acc.expect("at least one channel per group"));
    }
    let y = if outputs.len() == 1 { outputs.remove(0) } else { ops::concatenate(&outputs, 3, s)? };
    Ok(ops::transpose_axes(&y, &[0, 3, 1, 2], s)?)
}

fn lower_conv_integer(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    // The input's zero point is one element (ONNX and ORT's CPU EP); the weight's may be one
    // per output channel, as ONNX defines it (its node tests use one; ORT's CPU EP refuses it).
    if let Some(z) = ctx.optional_input(2)
        && (z.ndim() > 1 || z.size() != 1)
    {
        bail!("x_zero_point of shape {:?} must be a scalar or one element", z.shape());
    }
    let y = integer_conv(node, ctx.input(0)?, ctx.input(1)?, ctx.optional_input(2), ctx.optional_input(3), s)?;
    Ok(vec![y])
}

fn claim_qlinear_conv(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 8, 9)?;
    for i in [0, 2, 3, 5, 7] {
        require_input_type(node, i, Q8)?;
    }
    for i in [1, 4, 6] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    require_input_type(node, 8, &[ElemType::I32])?;
    claim_common(node, 0, 3)
}

/// `saturate(round((acc + B) * x_scale * w_scale / y_scale) + y_zp)`.
fn lower_qlinear_conv(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    // As ORT's CPU EP: the input's and output's scale and zero point one element (a scalar or
    // 1-D), the weight's a scalar or 1-D of 1 or M elements.
    let m = ctx.input(3)?.shape()[0];
    for i in [1, 2, 4, 5, 6, 7] {
        let sh = ctx.input(i)?.shape();
        let per_channel = i == 4 || i == 5;
        let ok = sh.is_empty() || (sh.len() == 1 && (sh[0] == 1 || (per_channel && sh[0] == m)));
        if !ok {
            bail!("input {i} of shape {sh:?} must be a scalar or 1-D of {}", if per_channel { "1 or M" } else { "1" });
        }
    }
    let mut acc = integer_conv(node, ctx.input(0)?, ctx.input(3)?, Some(ctx.input(2)?), Some(ctx.input(5)?), s)?;
    let m = acc.shape()[1];
    let channel = |a: &Array| -> Result<Array> {
        let a = ops::astype(a, Dtype::F32, s)?;
        Ok(if a.size() > 1 { ops::reshape(&a, &[1, m, 1, 1], s)? } else { ops::reshape(&a, &[], s)? })
    };
    crate::conv::check_bias(ctx.optional_input(8), m)?;
    if let Some(b) = ctx.optional_input(8) {
        acc = ops::add(&acc, &ops::reshape(b, &[1, m, 1, 1], s)?, s)?;
    }
    let scale = ops::divide(
        &ops::multiply(&channel(ctx.input(1)?)?, &channel(ctx.input(4)?)?, s)?,
        &channel(ctx.input(6)?)?,
        s,
    )?;
    let t = ctx.input(7)?.dtype();
    let (lo, hi) = if t == Dtype::I8 { (-128.0, 127.0) } else { (0.0, 255.0) };
    let q = ops::round(&ops::multiply(&ops::astype(&acc, Dtype::F32, s)?, &scale, s)?, s)?;
    let q = ops::add(&q, &channel(ctx.input(7)?)?, s)?;
    let lowest = ops::scalar(lo, Dtype::F32, s)?;
    let q = ops::clip(&q, Some(&lowest), Some(&ops::scalar(hi, Dtype::F32, s)?), s)?;
    // A NaN (from a NaN scale) is the type's lowest value, as ORT's CPU EP converts it.
    let q = ops::where_(&ops::isnan(&q, s)?, &lowest, &q, s)?;
    Ok(vec![ops::astype(&q, t, s)?])
}

ep_core::register_lowering!(
    CONV_INTEGER = FnLowering {
        domain: "",
        op: "ConvInteger",
        opsets: 10..=i32::MAX,
        claim: claim_conv_integer,
        lower: lower_conv_integer,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    QLINEAR_CONV = FnLowering {
        domain: "",
        op: "QLinearConv",
        opsets: 10..=i32::MAX,
        claim: claim_qlinear_conv,
        lower: lower_qlinear_conv,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn range(t: DType) -> Values {
        match t {
            DType::I8 => Values::Uniform { lo: -128.0, hi: 128.0 },
            _ => Values::Uniform { lo: 0.0, hi: 256.0 },
        }
    }

    /// (x shape, w shape, y shape, group, kernel, stride, pad).
    type Geometry = (Vec<i64>, Vec<i64>, Vec<i64>, i64, i64, i64, i64);

    fn geometry() -> BoxedStrategy<Geometry> {
        (1..=2i64, prop_oneof![1..=4i64, 30..=40i64], 1..=2i64, 1..=3i64, 3..=6i64, 1..=3i64, 1..=2i64, 0..=1i64)
            .prop_map(|(n, cin, group, mpg, hw, k, stride, pad)| {
                let cin = cin * group;
                let m = mpg * group;
                let out = (hw + 2 * pad - k) / stride + 1;
                (vec![n, cin, hw, hw], vec![m, cin / group, k, k], vec![n, m, out, out], group, k, stride, pad)
            })
            .boxed()
    }

    fn attrs(case: Case, group: i64, k: i64, stride: i64, pad: i64) -> Case {
        case.attr_int("group", group)
            .attr_ints("kernel_shape", &[k, k])
            .attr_ints("strides", &[stride, stride])
            .attr_ints("pads", &[pad; 4])
    }

    register_spec!(super::CONV_INTEGER, || {
        (dtype_of(&[DType::U8, DType::I8]), geometry(), any::<bool>(), seed())
            .prop_map(|(t, (x, w, y, group, k, stride, pad), zp, seed)| {
                // ORT's ConvInteger takes uint8 input with int8 or uint8 weights.
                let mut case = Case::op("ConvInteger", 10).input_with("x", DType::U8, &x, range(DType::U8)).input_with(
                    "w",
                    t,
                    &w,
                    Values::int8_weights(t),
                );
                if zp {
                    case =
                        case.input_with("x_zp", DType::U8, &[], range(DType::U8)).input_with("w_zp", t, &[], range(t));
                }
                attrs(case, group, k, stride, pad).output("y", DType::I32, &y).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::QLINEAR_CONV, || {
        (dtype_of(&[DType::U8, DType::I8]), geometry(), any::<(bool, bool)>(), seed())
            .prop_map(|(t, (x, w, y, group, k, stride, pad), (per_channel, bias), seed)| {
                let m = w[0];
                let scale = |hi: f64| Values::Uniform { lo: hi / 4.0, hi };
                let ws: Vec<i64> = if per_channel { vec![m] } else { vec![] };
                let mut case = Case::op("QLinearConv", 10)
                    .input_with("x", t, &x, range(t))
                    .input_with("x_scale", DType::F32, &[], scale(0.05))
                    .input_with("x_zp", t, &[], range(t))
                    .input_with("w", t, &w, Values::int8_weights(t))
                    .input_with("w_scale", DType::F32, &ws, scale(0.05))
                    .input_with(
                        "w_zp",
                        t,
                        &ws,
                        Values::Data(vec![
                            if t == DType::I8 { 0.0 } else { 128.0 };
                            ws.iter().product::<i64>() as usize
                        ]),
                    )
                    .input_with("y_scale", DType::F32, &[], scale(10.0))
                    .input_with("y_zp", t, &[], range(t));
                if bias {
                    case = case.input_with("b", DType::I32, &[m], Values::Uniform { lo: -2000.0, hi: 2000.0 });
                }
                attrs(case, group, k, stride, pad).output("y", t, &y).with_seed(seed)
            })
            .boxed()
    });
}
