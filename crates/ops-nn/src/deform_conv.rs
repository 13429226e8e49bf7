//! DeformConv (opset 19, 22): a 2-D convolution whose every kernel tap samples the input at its
//! regular place moved by a learned offset, bilinearly (a sample at or past one pixel outside
//! the image reads zero, and so does each corner outside it), optionally scaled by a mask,
//! then multiplied with the weights per group, as ORT's CPU EP does. Built as a deformable
//! image-to-columns: the sample positions and bilinear weights from the offsets, four gathers
//! (one per corner), and one grouped matrix product, all on the device.
//!
//! `X [N, C, H, W]`, `W [M, C / group, kH, kW]`, `offset [N, offset_group * kH * kW * 2, oH,
//! oW]` (a `(dh, dw)` pair per kernel tap), `B [M]`, `mask [N, offset_group * kH * kW, oH, oW]`.

use crate::conv::spatial_attr;
use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 5)?;
    for i in 0..5 {
        if node.input(i).is_some() {
            require_input_type(node, i, &[ElemType::F32])?;
        }
    }
    require_input_rank(node, 0, 4..=4)?;
    require_input_rank(node, 1, 4..=4)?;
    Ok(())
}

/// The node's geometry, checked against its inputs' shapes.
struct Geometry {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    m: i64,
    group: i64,
    offset_group: i64,
    kernel: [i64; 2],
    out: [i64; 2],
    strides: [i64; 2],
    /// Top, left, bottom, right.
    pads: [i64; 4],
    dilations: [i64; 2],
}

fn geometry(ctx: &LowerCtx<'_>, node: &NodeInfo) -> Result<Geometry> {
    let (xs, ws, os) = (ctx.input(0)?.shape(), ctx.input(1)?.shape(), ctx.input(2)?.shape());
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (m, cpg) = (ws[0], ws[1]);
    let kernel = spatial_attr(node, "kernel_shape", 2, 0)?;
    let kernel = if node.attr_ints("kernel_shape")?.is_some() { [kernel[0], kernel[1]] } else { [ws[2], ws[3]] };
    if kernel != [ws[2], ws[3]] {
        bail!("kernel_shape {kernel:?} differs from the weight's {:?}", &ws[2..]);
    }
    let strides = spatial_attr(node, "strides", 2, 1)?;
    let dil = spatial_attr(node, "dilations", 2, 1)?;
    let pads = spatial_attr(node, "pads", 4, 0)?;
    let group = node.attr_int("group", 1)?;
    let offset_group = node.attr_int("offset_group", 1)?;
    if strides.iter().chain(&dil).any(|&v| v < 1) || pads.iter().any(|&p| p < 0) || kernel.iter().any(|&k| k < 1) {
        bail!("strides, dilations and the kernel must be positive and pads non-negative");
    }
    if c < 1 || m < 1 || cpg < 1 {
        bail!(
            "the input's channels ({c}), the weight's output channels ({m}) and in-channels ({cpg}) must be positive"
        );
    }
    if group < 1 || c % group != 0 || m % group != 0 || cpg * group != c {
        bail!("group {group}: the input's {c} channels and the weight's {m} x {cpg} do not divide into it");
    }
    if offset_group < 1 || c % offset_group != 0 {
        bail!("offset_group {offset_group} does not divide the input's {c} channels");
    }
    let out = [0, 1].map(|d| (xs[2 + d] + pads[d] + pads[d + 2] - (dil[d] * (kernel[d] - 1) + 1)) / strides[d] + 1);
    if out.iter().any(|&o| o < 0) {
        bail!("the dilated kernel {kernel:?} does not fit the padded {h} x {w} input");
    }
    let taps = kernel[0] * kernel[1];
    let want = [n, offset_group * taps * 2, out[0], out[1]];
    if os != want {
        bail!("the offset has shape {os:?}; {want:?} expected");
    }
    crate::conv::check_bias(ctx.optional_input(3), m)?;
    if let Some(mask) = ctx.optional_input(4)
        && mask.shape() != [n, offset_group * taps, out[0], out[1]]
    {
        bail!("the mask has shape {:?}; {:?} expected", mask.shape(), [n, offset_group * taps, out[0], out[1]]);
    }
    if h * w > i64::from(i32::MAX) {
        bail!("a {h} x {w} image has more pixels than a 32-bit index reaches");
    }
    Ok(Geometry {
        n,
        c,
        h,
        w,
        m,
        group,
        offset_group,
        kernel,
        out,
        strides: [strides[0], strides[1]],
        pads: [pads[0], pads[1], pads[2], pads[3]],
        dilations: [dil[0], dil[1]],
    })
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let g = geometry(ctx, node)?;
    let (strides, pads, dil) = (g.strides, g.pads, g.dilations);
    let s = ctx.stream();
    let (taps, spots) = (g.kernel[0] * g.kernel[1], g.out[0] * g.out[1]);
    let y_shape = [g.n, g.m, g.out[0], g.out[1]];
    if g.n == 0 || spots == 0 {
        return Ok(vec![ops::full(&y_shape, &ops::scalar(0.0, Dtype::F32, s)?, Dtype::F32, s)?]);
    }
    // Each tap's regular sample position per output position, `[1, 1, taps, spots]`: exact
    // integers, as ORT's `out * stride - pad + tap * dilation`.
    let base = |axis: usize| -> Result<Array> {
        let mut v = Vec::with_capacity((taps * spots) as usize);
        for k in 0..taps {
            let tap = [k / g.kernel[1], k % g.kernel[1]][axis];
            for p in 0..spots {
                let at = [p / g.out[1], p % g.out[1]][axis];
                v.push((at * strides[axis] - pads[axis] + tap * dil[axis]) as f32);
            }
        }
        Ok(Array::from_slice(&v, &[1, 1, taps, spots])?)
    };
    let og = g.offset_group;
    let offsets = ops::reshape(ctx.input(2)?, &[g.n, og, taps, 2, spots], s)?;
    let along = |pair: i64| -> Result<Array> {
        let part = ops::slice(&offsets, &[0, 0, 0, pair, 0], &[g.n, og, taps, pair + 1, spots], s)?;
        Ok(ops::reshape(&part, &[g.n, og, taps, spots], s)?)
    };
    let hy = ops::add(&base(0)?, &along(0)?, s)?;
    let wx = ops::add(&base(1)?, &along(1)?, s)?;
    let f = |v: f64| ops::scalar(v, Dtype::F32, s);
    // A sample at or past one pixel outside the image reads zero, and so does one at a NaN
    // position (ORT's kernel casts it to an integer, undefined behaviour; on x86 it reads 0).
    let within = |a: &Array, hi: i64| -> Result<Array> {
        Ok(ops::logical_and(&ops::greater(a, &f(-1.0)?, s)?, &ops::less(a, &f(hi as f64)?, s)?, s)?)
    };
    let inside = ops::logical_and(&within(&hy, g.h)?, &within(&wx, g.w)?, s)?;
    let (h0, w0) = (ops::floor(&hy, s)?, ops::floor(&wx, s)?);
    let (lh, lw) = (ops::subtract(&hy, &h0, s)?, ops::subtract(&wx, &w0, s)?);
    let (hh, hw) = (ops::subtract(&f(1.0)?, &lh, s)?, ops::subtract(&f(1.0)?, &lw, s)?);
    // Corner rows and columns as integers (clamped first, so no cast leaves their range; an
    // invalid corner weighs zero and reads pixel 0, as ORT's kernel does).
    let int = |a: &Array, hi: i64| -> Result<Array> {
        let clamped = ops::clip(a, Some(&f(-2.0)?), Some(&f(hi as f64 + 1.0)?), s)?;
        Ok(ops::astype(&clamped, Dtype::I32, s)?)
    };
    let (r0, c0) = (int(&h0, g.h)?, int(&w0, g.w)?);
    let one = ops::scalar(1.0, Dtype::I32, s)?;
    let (r1, c1) = (ops::add(&r0, &one, s)?, ops::add(&c0, &one, s)?);
    let i32s = |v: i64| ops::scalar(v as f64, Dtype::I32, s);
    let zero = i32s(0)?;
    let row_ok = |r: &Array| -> Result<Array> {
        Ok(ops::logical_and(&ops::greater_equal(r, &zero, s)?, &ops::less(r, &i32s(g.h)?, s)?, s)?)
    };
    let col_ok = |c: &Array| -> Result<Array> {
        Ok(ops::logical_and(&ops::greater_equal(c, &zero, s)?, &ops::less(c, &i32s(g.w)?, s)?, s)?)
    };
    let cg = g.c / og;
    let image = ops::reshape(ctx.input(0)?, &[g.n, og, cg, g.h * g.w], s)?;
    let gathered = [(&r0, &c0, &hh, &hw), (&r0, &c1, &hh, &lw), (&r1, &c0, &lh, &hw), (&r1, &c1, &lh, &lw)];
    let mut sampled: Option<Array> = None;
    for (r, c, a, b) in gathered {
        let valid = ops::logical_and(&inside, &ops::logical_and(&row_ok(r)?, &col_ok(c)?, s)?, s)?;
        let flat = ops::add(&ops::multiply(r, &i32s(g.w)?, s)?, c, s)?;
        let index = ops::where_(&valid, &flat, &zero, s)?;
        let weight = ops::where_(&valid, &ops::multiply(a, b, s)?, &f(0.0)?, s)?;
        let index = ops::reshape(&index, &[g.n, og, 1, taps * spots], s)?;
        let index = ops::broadcast_to(&index, &[g.n, og, cg, taps * spots], s)?;
        let picked = ops::take_along_axis(&image, &index, 3, s)?;
        let term = ops::multiply(&ops::reshape(&weight, &[g.n, og, 1, taps * spots], s)?, &picked, s)?;
        sampled = Some(match sampled {
            None => term,
            Some(acc) => ops::add(&acc, &term, s)?,
        });
    }
    let mut sampled = sampled.expect("four corners");
    if let Some(mask) = ctx.optional_input(4) {
        sampled = ops::multiply(&sampled, &ops::reshape(mask, &[g.n, og, 1, taps * spots], s)?, s)?;
    }
    Ok(vec![columns_times_weights(ctx, &g, &sampled, s)?])
}

/// The sampled columns (`[N, offset_group, C / offset_group, taps * spots]`, channel-major as
/// an image-to-columns lays them out) times the weights, per group, plus the bias.
fn columns_times_weights(ctx: &LowerCtx<'_>, g: &Geometry, sampled: &Array, s: &Stream) -> Result<Array> {
    let (taps, spots) = (g.kernel[0] * g.kernel[1], g.out[0] * g.out[1]);
    let per_group = g.c / g.group * taps;
    let cols = ops::reshape(sampled, &[g.n, g.group, per_group, spots], s)?;
    let weights = ops::reshape(ctx.input(1)?, &[1, g.group, g.m / g.group, per_group], s)?;
    let y = ops::reshape(&ops::matmul(&weights, &cols, s)?, &[g.n, g.m, g.out[0], g.out[1]], s)?;
    match ctx.optional_input(3) {
        Some(b) => crate::conv::add_bias(&y, b, s),
        None => Ok(y),
    }
}

ep_core::register_lowering!(
    DEFORM_CONV = FnLowering {
        domain: "",
        op: "DeformConv",
        opsets: 19..=i32::MAX,
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

    register_spec!(super::DEFORM_CONV, || {
        (
            (1..=2i64, 1..=2i64, 1..=2i64, 1..=2i64, 1..=3i64),
            (3..=7i64, 3..=7i64, 1..=3i64, 1..=3i64),
            (1..=2i64, 1..=2i64, 1..=2i64, 1..=2i64, collection::vec(0..=2i64, 4)),
            (any::<bool>(), any::<bool>(), prop_oneof![Just(19u32), Just(22u32)], seed()),
        )
            .prop_map(
                |((n, group, og, cpg, mpg), (h, w, kh, kw), (sh, sw, dh, dw, pads), (bias, mask, opset, seed))| {
                    // Channels divide into both groupings.
                    let c = group * og * cpg;
                    let m = group * mpg;
                    let out = |size: i64, pad: i64, k: i64, d: i64, st: i64| (size + pad - (d * (k - 1) + 1)) / st + 1;
                    // The dilated kernel fits the padded input.
                    let (dh, dw) = (
                        if h + pads[0] + pads[2] > dh * (kh - 1) { dh } else { 1 },
                        if w + pads[1] + pads[3] > dw * (kw - 1) { dw } else { 1 },
                    );
                    let (oh, ow) = (out(h, pads[0] + pads[2], kh, dh, sh), out(w, pads[1] + pads[3], kw, dw, sw));
                    let taps = kh * kw;
                    let mut case = Case::op("DeformConv", opset)
                        .input("x", DType::F32, &[n, c, h, w])
                        .input("w", DType::F32, &[m, c / group, kh, kw])
                        // Offsets of a few pixels either way: samples inside, on the border and
                        // past it.
                        .input_with(
                            "offset",
                            DType::F32,
                            &[n, og * taps * 2, oh, ow],
                            Values::Uniform { lo: -2.5, hi: 2.5 },
                        );
                    case = if bias { case.input("b", DType::F32, &[m]) } else { case.absent() };
                    if mask {
                        case = case.input_with(
                            "mask",
                            DType::F32,
                            &[n, og * taps, oh, ow],
                            Values::Uniform { lo: 0.0, hi: 1.0 },
                        );
                    }
                    case.attr_ints("kernel_shape", &[kh, kw])
                        .attr_ints("strides", &[sh, sw])
                        .attr_ints("dilations", &[dh, dw])
                        .attr_ints("pads", &pads)
                        .attr_int("group", group)
                        .attr_int("offset_group", og)
                        .output("y", DType::F32, &[n, m, oh, ow])
                        .with_seed(seed)
                },
            )
            .boxed()
    });
}
