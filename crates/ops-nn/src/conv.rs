//! Conv and ConvTranspose (1-D, 2-D, 3-D; groups, dilations, explicit pads and `auto_pad`;
//! ConvTranspose's `output_padding` and `output_shape`) on MLX's
//! channels-last convolution: the input is transposed to channels-last and back, the weight
//! once per session when it is a constant.

use crate::window::{Window, empty_conv, windows};
use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

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

pub(crate) fn claim_conv_forward(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_conv(node)?;
    crate::window::claim_same_pad_dilation(node)
}

/// The end of every convolution: channels-last back to channels-first, plus the bias.
fn finish(y: &Array, r: usize, bias: Option<&Array>, s: &ep_core::mlx::Stream) -> Result<Array> {
    let back: Vec<i32> = std::iter::once(0).chain(std::iter::once(r as i32 - 1)).chain(1..r as i32 - 1).collect();
    let y = ops::transpose_axes(y, &back, s)?;
    Ok(match bias {
        Some(b) => add_bias(&y, b, s)?,
        None => y,
    })
}

/// `y + b` with `b` per channel (axis 1).
pub(crate) fn add_bias(y: &Array, b: &Array, s: &ep_core::mlx::Stream) -> Result<Array> {
    check_bias(Some(b), y.shape()[1])?;
    let mut shape = vec![1i64; y.ndim()];
    shape[1] = b.size() as i64;
    Ok(ops::add(y, &ops::reshape(b, &shape, s)?, s)?)
}

/// A list attribute of `k` values (one per spatial axis, or two for pads), `default` each when
/// absent; another length is an error naming it.
pub(crate) fn spatial_attr(node: &NodeInfo, name: &str, k: usize, default: i64) -> Result<Vec<i64>> {
    match node.attr_ints(name)? {
        Some(v) if v.len() == k => Ok(v.to_vec()),
        Some(v) => bail!("{name} has {} values; {k} expected", v.len()),
        None => Ok(vec![default; k]),
    }
}

/// The bias, when given, must be a 1-D tensor of the `m` output channels (as ORT's CPU EP
/// requires; broadcasting any other shape would answer what it refuses).
pub(crate) fn check_bias(b: Option<&Array>, m: i64) -> Result<()> {
    if let Some(b) = b
        && (b.ndim() != 1 || b.size() as i64 != m)
    {
        bail!("the bias {:?} must be a 1-D tensor of the {m} output channels", b.shape());
    }
    Ok(())
}

/// `conv(input, weight)` as ORT's CPU EP sums it when `weight` may hold NaN or infinities:
/// the finite part convolved as usual, and where a non-finite weight meets an input (counted
/// by convolving 0/1 indicators, which the inserted zeros leave alone), the product's
/// infinity, or NaN for `inf * 0`, a NaN weight, or infinities of both signs.
fn nonfinite_weights(
    input: &Array,
    weight: &Array,
    conv: &dyn Fn(&Array, &Array) -> Result<Array>,
    s: &ep_core::mlx::Stream,
) -> Result<Array> {
    let dt = input.dtype();
    let scalar = |v: f64| ops::scalar(v, dt, s);
    let zero = scalar(0.0)?;
    let is = |c: Array| -> Result<Array> { Ok(ops::astype(&c, dt, s)?) };
    let bad = ops::logical_or(&ops::isnan(weight, s)?, &ops::isinf(weight, s)?, s)?;
    let wf = ops::where_(&bad, &zero, weight, s)?;
    let y = conv(input, &wf)?;
    let (inf, ninf) = (scalar(f64::INFINITY)?, scalar(f64::NEG_INFINITY)?);
    let (wp, wn) = (is(ops::equal(weight, &inf, s)?)?, is(ops::equal(weight, &ninf, s)?)?);
    let wq = is(ops::isnan(weight, s)?)?;
    let (xp, xn) = (is(ops::greater(input, &zero, s)?)?, is(ops::less(input, &zero, s)?)?);
    let xz = is(ops::equal(input, &zero, s)?)?;
    let ones = ops::full(&input.shape(), &scalar(1.0)?, dt, s)?;
    let half = scalar(0.5)?;
    let meets = |a: &Array, b: &Array| -> Result<Array> { Ok(ops::greater(&conv(a, b)?, &half, s)?) };
    let pos = ops::logical_or(&meets(&xp, &wp)?, &meets(&xn, &wn)?, s)?;
    let neg = ops::logical_or(&meets(&xn, &wp)?, &meets(&xp, &wn)?, s)?;
    let nan = [meets(&xz, &ops::add(&wp, &wn, s)?)?, meets(&ones, &wq)?, ops::logical_and(&pos, &neg, s)?]
        .into_iter()
        .try_fold(ops::isnan(&y, s)?, |acc, b| ops::logical_or(&acc, &b, s))?;
    let y = ops::where_(&neg, &ninf, &y, s)?;
    let y = ops::where_(&pos, &inf, &y, s)?;
    Ok(ops::where_(&nan, &scalar(f64::NAN)?, &y, s)?)
}

/// `a` cut into `groups` equal parts along `axis`, each convolved apart (MLX 0.32.2's grouped
/// convolution is not used: on the CPU it wrote past its output for kernels wider than a
/// padded input; on CUDA it refuses three spatial axes and, for ConvTranspose, answered -inf
/// where ORT answers -0.23, checked on an H100). In the GPU's forms each part is gathered
/// into a buffer of its own: a slice is a view at an offset into one buffer, which cuDNN
/// refused for a float16 weight as misaligned (`CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER`).
/// One group is `a` itself. A constant weight's parts are derived once (see `lower_conv`).
fn group_parts(a: &Array, groups: i64, axis: i32, s: &ep_core::mlx::Stream) -> Result<Vec<Array>> {
    if groups == 1 {
        return Ok(vec![a.clone()]);
    }
    let per = a.shape()[axis as usize] / groups;
    (0..groups)
        .map(|g| {
            Ok(if ep_core::mlx::gpu_forms() {
                let at = ops::arange((g * per) as f64, ((g + 1) * per) as f64, 1.0, Dtype::I32, s)?;
                ops::take(a, &at, axis, s)?
            } else {
                ops::take_range(a, g * per, per, axis, s)?
            })
        })
        .collect()
}

/// `conv` of each group's part of `input` (channels-last) by its weight part, concatenated
/// along the channels.
fn per_group(
    input: &Array,
    weights: &[Array],
    conv: &dyn Fn(&Array, &Array) -> std::result::Result<Array, ep_core::mlx::MlxError>,
    s: &ep_core::mlx::Stream,
) -> Result<Array> {
    let axis = input.ndim() as i32 - 1;
    let parts = group_parts(input, weights.len() as i64, axis, s)?;
    let mut ys = parts.iter().zip(weights).map(|(x, w)| conv(x, w)).collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(if ys.len() == 1 { ys.remove(0) } else { ops::concatenate(&ys, axis, s)? })
}

/// `[0, 2, 3, ..., 1]`: channels-first to channels-last.
fn to_channels_last(r: usize) -> Vec<i32> {
    std::iter::once(0).chain(2..r as i32).chain(std::iter::once(1)).collect()
}

pub(crate) fn lower_conv(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let last = |groups: i64| {
        ctx.derived_many(&[1], &format!("conv-weight-channels-last/{groups}"), |w, s| {
            group_parts(&ops::transpose_axes(w[0], &to_channels_last(w[0].ndim()), s)?, groups, 0, s)
        })
    };
    let (x, w, bias) = (ctx.input(0)?, ctx.input(1)?, ctx.optional_input(2));
    Ok(vec![convolve(node, x, w, &last, bias, ctx.stream())?])
}

/// The convolution of `x` (channels first) by `w` (`[M, C / group, *kernel]`), `weight_last`
/// giving the same weight channels-last (`[M, *kernel, C / group]`, MLX's layout) cut into
/// the given number of groups, plus the bias; channels first out.
fn convolve(
    node: &NodeInfo,
    x: &Array,
    w: &Array,
    weight_last: &dyn Fn(i64) -> Result<Vec<Array>>,
    bias: Option<&Array>,
    s: &ep_core::mlx::Stream,
) -> Result<Array> {
    let xs = x.shape();
    let r = xs.len();
    let ws = w.shape();
    let groups = node.attr_int("group", 1)?;
    if groups < 1 || r != ws.len() || xs[1] != ws[1] * groups || ws[0] % groups != 0 {
        bail!("input {xs:?} and weight {ws:?} do not fit group {groups}");
    }
    let kernel = ws[2..].to_vec();
    if let Some(k) = node.attr_ints("kernel_shape")?
        && k != kernel.as_slice()
    {
        bail!("kernel_shape {k:?} differs from the weight's {kernel:?}");
    }
    let win = Window::of(node, &xs[2..], kernel.clone(), false)?;
    check_bias(bias, ws[0])?;
    if let Some(shape) = empty_conv(&xs, &ws, &win)? {
        let zeros = ops::full(&shape, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?;
        return Ok(match bias {
            Some(b) => {
                let mut bshape = vec![1, ws[0]];
                bshape.resize(shape.len(), 1);
                ops::add(&zeros, &ops::reshape(&ops::astype(b, x.dtype(), s)?, &bshape, s)?, s)?
            }
            None => zeros,
        });
    }
    let (cpg, mpg) = (xs[1] / groups, ws[0] / groups);
    if groups > 1 && cpg == 1 && mpg == 1 {
        // Depthwise: every channel's windows times its own kernel (MLX 0.32.2's grouped CPU
        // convolution wrote past its output for kernels wider than a padded input).
        let windowed = windows(x, &win, 0.0, s)?;
        let k = r - 2;
        let mut wshape = vec![1i64, xs[1]];
        for &kk in &kernel {
            wshape.extend([1, kk]);
        }
        let kern = ops::reshape(w, &wshape, s)?;
        let axes: Vec<i32> = (0..k as i32).map(|i| 3 + 2 * i).collect();
        // Half types multiply and sum in float32, as ORT's CPU EP and MLX's convolutions do.
        let half = matches!(x.dtype(), Dtype::F16 | Dtype::BF16);
        let (windowed, kern) = if half {
            (ops::astype(&windowed, Dtype::F32, s)?, ops::astype(&kern, Dtype::F32, s)?)
        } else {
            (windowed, kern)
        };
        let y = ops::sum_axes(&ops::multiply(&windowed, &kern, s)?, &axes, false, s)?;
        let y = if half { ops::astype(&y, x.dtype(), s)? } else { y };
        return Ok(match bias {
            Some(b) => add_bias(&y, b, s)?,
            None => y,
        });
    }
    let input = ops::transpose_axes(x, &to_channels_last(r), s)?;
    let ones = vec![1; r - 2];
    let conv = |x: &Array, k: &Array| {
        ops::conv_general(x, k, &win.strides, &win.pad_lo, &win.pad_hi, &win.dilations, &ones, 1, false, s)
    };
    let y = per_group(&input, &weight_last(groups)?, &conv, s)?;
    finish(&y, r, bias, s)
}

ep_core::register_lowering!(
    CONV = FnLowering {
        domain: "",
        op: "Conv",
        opsets: 1..=i32::MAX,
        claim: claim_conv_forward,
        lower: lower_conv,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

/// `com.microsoft` NhwcConv (ORT runs it on CUDA only): Conv's attributes over channels-last
/// input `[N, *spatial, C]` and weight `[M, *kernel, C / group]` (MLX's own layouts), output
/// `[N, *spatial, M]`.
fn lower_nhwc_conv(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, w, s) = (ctx.input(0)?, ctx.input(1)?, ctx.stream());
    let r = x.ndim() as i32;
    if w.ndim() as i32 != r {
        bail!("input {:?} and weight {:?} differ in rank", x.shape(), w.shape());
    }
    let first: Vec<i32> = [0, r - 1].into_iter().chain(1..r - 1).collect();
    let last = |groups: i64| group_parts(w, groups, 0, s);
    let y = convolve(
        node,
        &ops::transpose_axes(x, &first, s)?,
        &ops::transpose_axes(w, &first, s)?,
        &last,
        ctx.optional_input(2),
        s,
    )?;
    Ok(vec![ops::transpose_axes(&y, &to_channels_last(r as usize), s)?])
}

ep_core::register_lowering!(
    NHWC_CONV = FnLowering {
        domain: "com.microsoft",
        op: "NhwcConv",
        opsets: 1..=i32::MAX,
        claim: claim_conv_forward,
        lower: lower_nhwc_conv,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_conv_transpose(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_conv(node)
}

/// `com.microsoft` ConvTransposeWithDynamicPads: X, W, Pads (int64, `[begins, ends]`, in place
/// of the attribute), B.
fn claim_dynamic_pads(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 4)?;
    for i in [0, 1, 3] {
        require_input_type(node, i, FLOATS)?;
    }
    require_input_type(node, 2, &[ElemType::I64])?;
    if node.input(2).is_none() {
        return Err(Decline::new("the pads input (input 2) is missing: ORT's kernel requires it"));
    }
    match ep_core::lowering::input_rank(node, 0) {
        Some(3..=5) => Ok(()),
        r => Err(Decline(format!("input rank {r:?}: 1-D, 2-D and 3-D convolutions are supported"))),
    }
}

fn lower_dynamic_pads(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let pads = ctx.host_i64(2)?;
    if let Some(p) = pads.iter().find(|&&p| p < 0) {
        bail!("pads {pads:?} must not be negative ({p})");
    }
    transpose_conv(ctx, node, Some(pads), 3)
}

fn lower_conv_transpose(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let pads = node.attr_ints("pads")?.map(<[i64]>::to_vec);
    transpose_conv(ctx, node, pads, 2)
}

/// ConvTranspose as a convolution of the stride-dilated input with the flipped kernel, fully
/// padded (`dilation * (kernel - 1)` each side, plus `output_padding` at the end), then cropped
/// by the pads (`pads`: the explicit ones, from the attribute or an input); the bias is input
/// `bias`.
fn transpose_conv(ctx: &mut LowerCtx<'_>, node: &NodeInfo, pads: Option<Vec<i64>>, bias: usize) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let xs = x.shape();
    let r = xs.len();
    let k = r - 2;
    let ws = ctx.input(1)?.shape();
    let groups = node.attr_int("group", 1)?;
    if groups < 1 || xs[1] != ws[0] || ws[0] % groups != 0 {
        bail!("input {xs:?} and weight {ws:?} do not fit group {groups}");
    }
    let kernel = ws[2..].to_vec();
    if let Some(given) = node.attr_ints("kernel_shape")?
        && given != kernel.as_slice()
    {
        bail!("kernel_shape {given:?} differs from the weight's {kernel:?}");
    }
    let ints = |name: &str, default: i64| -> Result<Vec<i64>> {
        // An empty list is the default, as on the CPU EP.
        Ok(node.attr_ints(name)?.filter(|v| !v.is_empty()).map(<[i64]>::to_vec).unwrap_or_else(|| vec![default; k]))
    };
    let (strides, mut dilations, out_pad) = (ints("strides", 1)?, ints("dilations", 1)?, ints("output_padding", 0)?);
    if [&strides, &dilations, &out_pad].iter().any(|v| v.len() != k)
        || strides.iter().chain(&dilations).chain(&kernel).any(|&v| v < 1)
    {
        bail!(
            "kernel {kernel:?}, strides {strides:?}, dilations {dilations:?}, output_padding {out_pad:?}: not positive or not {k} values"
        );
    }
    // A kernel of one tap along an axis has no use for its dilation (which MLX's 32-bit sizes
    // may not hold while ORT's CPU EP takes it).
    for (d, &kk) in dilations.iter_mut().zip(&kernel) {
        if kk == 1 {
            *d = 1;
        }
    }
    let full: Vec<i64> =
        (0..k).map(|i| (xs[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 + out_pad[i]).collect();
    let auto = match node.attr("auto_pad") {
        Some(ep_core::AttrValue::String(a)) if !a.is_empty() => a.clone(),
        _ => "NOTSET".into(),
    };
    let (mut lo, mut hi) = (vec![0i64; k], vec![0i64; k]);
    let target: Option<Vec<i64>> = match node.attr_ints("output_shape")? {
        Some(o) => Some(o[o.len().saturating_sub(k)..].to_vec()),
        None if auto == "SAME_UPPER" || auto == "SAME_LOWER" => Some((0..k).map(|i| xs[2 + i] * strides[i]).collect()),
        None => None,
    };
    let from_target = target.is_some();
    match target {
        Some(t) => {
            for i in 0..k {
                // Floor halves, as ONNX writes it; a negative total extends the output at the end.
                let total = full[i] - t[i];
                let half = total.div_euclid(2);
                (lo[i], hi[i]) = if auto == "SAME_UPPER" { (half, total - half) } else { (total - half, half) };
            }
        }
        None if auto == "VALID" || auto == "NOTSET" => {
            if let Some(p) = &pads {
                if p.len() != 2 * k {
                    bail!("pads {p:?} do not hold {} values", 2 * k);
                }
                lo.copy_from_slice(&p[..k]);
                hi.copy_from_slice(&p[k..2 * k]);
            }
        }
        None => bail!("auto_pad '{auto}' is not supported"),
    }
    // As ORT's CPU EP: output_padding in [0, max(stride, dilation)), and the input size the
    // output implies (a convolution of it, pads from an output shape at least 0) is the input's.
    let mut out = vec![0i64; k];
    for i in 0..k {
        if out_pad[i] < 0 || out_pad[i] >= strides[i].max(dilations[i]) {
            bail!("output_padding {out_pad:?} must be in [0, max(stride, dilation)) on every axis");
        }
        let total = lo[i] + hi[i];
        out[i] = full[i] - total;
        if out[i] < 1 {
            bail!("the output size {} of spatial axis {i} is not positive", out[i]);
        }
        let eff = (kernel[i] - 1) * dilations[i] + 1;
        let implied = (out[i] + if from_target { total.max(0) } else { total } - eff) / strides[i] + 1;
        if implied != xs[2 + i] {
            bail!("the output size {} of spatial axis {i} implies an input of {implied}, not {}", out[i], xs[2 + i]);
        }
    }
    check_bias(ctx.optional_input(bias), ws[1] * groups)?;
    if xs.contains(&0) || ws.contains(&0) {
        // Nothing to convolve: the bias alone (zeros without one), as on the CPU EP.
        let shape = [vec![xs[0], ws[1] * groups], out].concat();
        let y = ops::full(&shape, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?;
        return Ok(vec![match ctx.optional_input(bias) {
            Some(b) if y.size() > 0 => add_bias(&y, b, s)?,
            _ => y,
        }]);
    }
    // [C, M/g, *k] to [M, *k, C/g].
    let merged = |w: &Array, s: &ep_core::mlx::Stream| -> Result<Array> {
        let sh = w.shape();
        let (c, mg) = (sh[0], sh[1]);
        let cg = c / groups;
        let mut split = vec![groups, cg, mg];
        split.extend(&sh[2..]);
        let t = ops::reshape(w, &split, s)?;
        // [g, C/g, M/g, *k] -> [g, M/g, *k, C/g]
        let mut perm = vec![0, 2];
        perm.extend(3..3 + k as i32);
        perm.push(1);
        let t = ops::transpose_axes(&t, &perm, s)?;
        let mut merged = vec![groups * mg];
        merged.extend(&sh[2..]);
        merged.push(cg);
        Ok(ops::reshape(&t, &merged, s)?)
    };
    let input = ops::transpose_axes(x, &to_channels_last(r), s)?;
    let pad_lo: Vec<i64> = (0..k).map(|i| (kernel[i] - 1) * dilations[i]).collect();
    let pad_hi: Vec<i64> = (0..k).map(|i| (kernel[i] - 1) * dilations[i] + out_pad[i]).collect();
    let ones = vec![1; k];
    let deconv =
        |x: &Array, w: &Array| ops::conv_general(x, w, &ones, &pad_lo, &pad_hi, &dilations, &strides, 1, true, s);
    // MLX convolves over the zeros it inserts between and around the inputs, where ORT's CPU EP
    // only adds each input's products into the outputs it reaches: the same sums while the
    // weight is finite, but a NaN or infinite weight times an inserted zero would be NaN. A
    // constant weight is checked once; otherwise the non-finite products are counted apart.
    let finite = ctx.is_constant(1) && {
        let flag = ctx.derived(1, "conv-transpose-weight finite", |w, s| {
            let all = ops::astype(w, Dtype::F32, s)?.to_vec::<f32>(s)?.iter().all(|v| v.is_finite());
            Ok(Array::from_slice(&[all as u8], &[1])?)
        })?;
        flag.host_bytes().is_some_and(|b| b == [1])
    };
    let y = if finite {
        let weights = ctx.derived_many(&[1], &format!("conv-transpose-weight/{groups}"), |w, s| {
            group_parts(&merged(w[0], s)?, groups, 0, s)
        })?;
        per_group(&input, &weights, &deconv, s)?
    } else {
        let weight = merged(ctx.input(1)?, s)?;
        let conv = |x: &Array, w: &Array| per_group(x, &group_parts(w, groups, 0, s)?, &deconv, s);
        nonfinite_weights(&input, &weight, &conv, s)?
    };
    // Crop the pads: [lo, full - hi) on every spatial axis (channels-last); negative pads add
    // zeros (outputs no input reaches).
    let ys = y.shape();
    let (mut grow_lo, mut grow_hi) = (vec![0i64; r], vec![0i64; r]);
    for i in 0..k {
        grow_lo[1 + i] = (-lo[i]).max(0);
        grow_hi[1 + i] = (-hi[i]).max(0);
    }
    let y = if grow_lo.iter().chain(&grow_hi).any(|&g| g > 0) {
        ops::pad(&y, &grow_lo, &grow_hi, &ops::scalar(0.0, y.dtype(), s)?, "constant", s)?
    } else {
        y
    };
    let mut start = vec![0i64; r];
    let mut stop = y.shape();
    for i in 0..k {
        start[1 + i] = lo[i].max(0);
        stop[1 + i] = ys[1 + i] + grow_lo[1 + i] + grow_hi[1 + i] - hi[i].max(0);
        if stop[1 + i] < start[1 + i] {
            bail!("pads leave no output on spatial axis {i}");
        }
    }
    let y = ops::slice(&y, &start, &stop, s)?;
    Ok(vec![finish(&y, r, ctx.optional_input(bias), s)?])
}

ep_core::register_lowering!(
    CONV_TRANSPOSE_WITH_DYNAMIC_PADS = FnLowering {
        domain: "com.microsoft",
        op: "ConvTransposeWithDynamicPads",
        opsets: 1..=i32::MAX,
        claim: claim_dynamic_pads,
        lower: lower_dynamic_pads,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    CONV_TRANSPOSE = FnLowering {
        domain: "",
        op: "ConvTranspose",
        opsets: 1..=i32::MAX,
        claim: claim_conv_transpose,
        lower: lower_conv_transpose,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    register_spec!(super::CONV_TRANSPOSE, || transpose_case(false));
    register_spec!(super::CONV_TRANSPOSE_WITH_DYNAMIC_PADS, || transpose_case(true));

    /// ConvTranspose, or (`dynamic`) ConvTransposeWithDynamicPads with its pads as an input.
    fn transpose_case(dynamic: bool) -> BoxedStrategy<Case> {
        let geometry = (1..=2usize, 1..=2i64, 1..=2i64, 1..=2i64, 1..=2i64, 1..=2i64, 0..=1i64, 0..=1i64);
        (select(&[DType::F32, DType::F32, DType::F16][..]), geometry, 1..=2i64, any::<bool>(), opset(11..=22), seed())
            .prop_map(move |(t, (dims, n, g, cpg, stride, dil, pad, opad), m_per_g, bias, v, seed)| {
                let c = g * cpg;
                let m = g * m_per_g;
                let spatial: Vec<i64> = (0..dims).map(|i| 3 + i as i64).collect();
                let kernel: Vec<i64> = (0..dims).map(|i| 1 + (i as i64 + seed as i64) % 3).collect();
                // ORT's CPU ConvTranspose takes output_padding below the stride only.
                let opad = if opad < stride { opad } else { 0 };
                let x = [vec![n, c], spatial.clone()].concat();
                let wshape = [vec![c, m_per_g], kernel.clone()].concat();
                let unit = Values::Uniform { lo: -1.0, hi: 1.0 };
                let base = if dynamic {
                    Case::domain_op("com.microsoft", "ConvTransposeWithDynamicPads", 1)
                } else {
                    Case::op("ConvTranspose", v)
                };
                let mut case = base.input_with("x", t, &x, unit.clone()).input_with("w", t, &wshape, unit.clone());
                let mut out = vec![n, m];
                for i in 0..dims {
                    let pad = pad.min((kernel[i] - 1) * dil);
                    out.push((spatial[i] - 1) * stride + (kernel[i] - 1) * dil + 1 + opad - 2 * pad);
                }
                let pads: Vec<i64> = (0..2 * dims).map(|i| pad.min((kernel[i % dims] - 1) * dil)).collect();
                if dynamic {
                    case = case.constant_i64("pads", &pads);
                }
                if bias {
                    case = case.input_with("b", t, &[m], unit);
                }
                if !dynamic {
                    case = case.attr_ints("pads", &pads);
                }
                case.attr_int("group", g)
                    .attr_ints("strides", &vec![stride; dims])
                    .attr_ints("dilations", &vec![dil; dims])
                    .attr_ints("output_padding", &vec![opad; dims])
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    }

    // Depthwise convolutions (one channel per group), kernels wider than the padded input
    // included: the form MobileNet-style networks use.
    register_spec!(super::CONV, || { prop_oneof![3 => grouped_conv(), 1 => depthwise_conv()].boxed() });

    // ORT's CPU EP has no NhwcConv kernel: a Conv case laid out channels-last, its reference
    // the Conv itself between transposes.
    register_spec!(super::NHWC_CONV, || {
        prop_oneof![3 => grouped_conv(), 1 => depthwise_conv()].prop_map(|conv| nhwc_of(&conv)).boxed()
    });

    fn nhwc_of(conv: &Case) -> Case {
        let r = conv.inputs[0].shape.len();
        let last = |d: &[i64]| -> Vec<i64> { [&d[..1], &d[2..], &d[1..2]].concat() };
        let to_first: Vec<i64> = [0, r as i64 - 1].into_iter().chain(1..r as i64 - 1).collect();
        let to_last: Vec<i64> = [0].into_iter().chain(2..r as i64).chain([1]).collect();
        let node = &conv.nodes[0];
        let mut case = Case::domain_op("com.microsoft", "NhwcConv", 1);
        for t in &conv.inputs {
            let shape = if t.shape.len() == r { last(&t.shape) } else { t.shape.clone() };
            case = case.input_with(&t.name, t.dtype, &shape, t.values.clone());
        }
        for (name, value) in &node.attributes {
            case = case.attr(name, value.clone());
        }
        let (y, t, out) = &conv.outputs[0];
        let perm = |p: &[i64]| vec![("perm", Attr::Ints(p.to_vec()))];
        let conv_inputs: Vec<&str> = ["x_first", "w_first", "b"][..node.inputs.len()].to_vec();
        let attributes: Vec<(&str, Attr)> = node.attributes.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        case.output(y, *t, &last(out))
            .with_seed(conv.seed)
            .reference("Transpose", &["x"], &["x_first"], perm(&to_first))
            .reference("Transpose", &["w"], &["w_first"], perm(&to_first))
            .reference("Conv", &conv_inputs, &["y_first"], attributes)
            .reference("Transpose", &["y_first"], &[y.as_str()], perm(&to_last))
    }

    fn depthwise_conv() -> BoxedStrategy<Case> {
        (
            float_dtype(),
            1..=6i64,
            collection::vec(1..=4i64, 2),
            prop_oneof![Just(3i64), Just(5i64)],
            1..=2i64,
            any::<bool>(),
            seed(),
        )
            .prop_map(|(t, c, spatial, k, stride, bias, seed)| {
                let pad = k / 2;
                let x = [vec![1, c], spatial.clone()].concat();
                let unit = Values::Uniform { lo: -1.0, hi: 1.0 };
                let mut case = Case::op("Conv", 13).input_with("x", t, &x, unit.clone()).input_with(
                    "w",
                    t,
                    &[c, 1, k, k],
                    unit.clone(),
                );
                if bias {
                    case = case.input_with("b", t, &[c], unit);
                }
                let out: Vec<i64> = spatial.iter().map(|&i| (i + 2 * pad - k) / stride + 1).collect();
                case.attr_int("group", c)
                    .attr_ints("kernel_shape", &[k, k])
                    .attr_ints("pads", &[pad; 4])
                    .attr_ints("strides", &[stride, 1])
                    .output("y", t, &[vec![1, c], out].concat())
                    .with_seed(seed)
            })
            .boxed()
    }

    fn grouped_conv() -> BoxedStrategy<Case> {
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
    }
}
