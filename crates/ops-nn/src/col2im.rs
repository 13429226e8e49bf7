//! Col2Im (opset 18): the inverse of an image-to-columns unfold. `input` `[N, C * prod(block),
//! L]` holds, per channel and block offset, a value for each of the L block positions; each is
//! added into the image (`[N, C, *image_shape]`) at `position * stride - pad_begin + offset *
//! dilation`, positions in the padding dropped, overlaps summed. The index map is built on the
//! host from `image_shape` and `block_shape` and the sums are one scatter-add. (ORT 1.31's CPU
//! EP answers dilated blocks of one or three spatial axes wrongly past the first channel; this
//! follows ONNX's definition, as its reference implementation does.)

use crate::conv::spatial_attr;
use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::ops::ScatterReduce;
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::I64])?;
    require_input_type(node, 2, &[ElemType::I64])?;
    require_input_rank(node, 0, 3..=3)?;
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let image = ctx.host_i64(1)?;
    let block = ctx.host_i64(2)?;
    let k = image.len();
    if k == 0 || block.len() != k {
        bail!("image_shape {image:?} and block_shape {block:?} must have one positive size per spatial axis");
    }
    let dil = spatial_attr(node, "dilations", k, 1)?;
    let strides = spatial_attr(node, "strides", k, 1)?;
    let pads = spatial_attr(node, "pads", 2 * k, 0)?;
    if image.iter().chain(&block).chain(&dil).chain(&strides).any(|&v| v < 1) || pads.iter().any(|&p| p < 0) {
        bail!("sizes, dilations and strides must be positive and pads non-negative");
    }
    let x = ctx.input(0)?.clone();
    let xs = x.shape();
    let kk: i64 = block.iter().product();
    if xs[1] == 0 || xs[1] % kk != 0 {
        bail!("the input's second dim {} must be a positive multiple of the block's {kk} elements", xs[1]);
    }
    for d in 0..k {
        if image[d] + pads[d] + pads[d + k] < dil[d] * (block[d] - 1) + 1 {
            bail!("the padded image is smaller than the dilated block along spatial axis {d}");
        }
    }
    let (n, c) = (xs[0], xs[1] / kk);
    // Block positions per axis.
    let counts: Vec<i64> =
        (0..k).map(|d| (image[d] + pads[d] + pads[d + k] - dil[d] * (block[d] - 1) - 1) / strides[d] + 1).collect();
    let l: i64 = counts.iter().map(|&v| v.max(0)).product();
    if xs[2] != l {
        bail!("the input holds {} block positions; image_shape and block_shape give {l}", xs[2]);
    }
    let pixels: i64 = image.iter().product();
    let mut out = vec![n, c];
    out.extend_from_slice(&image);
    ep_core::lowering::check_shape(&out, Dtype::F32)?;
    let s = ctx.stream();
    if x.size() == 0 || pixels == 0 {
        return Ok(vec![ops::full(&out, &ops::scalar(0.0, Dtype::F32, s)?, Dtype::F32, s)?]);
    }
    // For each (offset, position) in the input's order, its pixel, or none in the padding.
    let (mut from, mut to) = (Vec::new(), Vec::new());
    let unravel = |mut i: i64, dims: &[i64]| -> Vec<i64> {
        let mut at = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            at[d] = i % dims[d];
            i /= dims[d];
        }
        at
    };
    for o in 0..kk {
        let off = unravel(o, &block);
        for p in 0..l {
            let pos = unravel(p, &counts);
            let mut flat = 0i64;
            let mut inside = true;
            for d in 0..k {
                let v = pos[d] * strides[d] - pads[d] + off[d] * dil[d];
                inside &= (0..image[d]).contains(&v);
                flat = flat * image[d] + v;
            }
            if inside {
                from.push((o * l + p) as i32);
                to.push(flat as i32);
            }
        }
    }
    let zeros = ops::full(&[pixels, n, c], &ops::scalar(0.0, Dtype::F32, s)?, Dtype::F32, s)?;
    if from.is_empty() {
        return Ok(vec![ops::reshape(&ops::transpose_axes(&zeros, &[1, 2, 0], s)?, &out, s)?]);
    }
    let v = from.len() as i64;
    // [N, C * K, L] -> [K * L, N, C], the kept entries -> [V, 1, N, C].
    let cols = ops::transpose_axes(&ops::reshape(&x, &[n, c, kk * l], s)?, &[2, 0, 1], s)?;
    let kept = ops::take(&cols, &Array::from_slice(&from, &[v])?, 0, s)?;
    let updates = ops::reshape(&kept, &[v, 1, n, c], s)?;
    let summed = ops::scatter(&zeros, &[Array::from_slice(&to, &[v])?], &updates, &[0], ScatterReduce::Add, s)?;
    Ok(vec![ops::reshape(&ops::transpose_axes(&summed, &[1, 2, 0], s)?, &out, s)?])
}

ep_core::register_lowering!(
    COL2IM = FnLowering {
        domain: "",
        op: "Col2Im",
        opsets: 18..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, register_spec};

    // (Two spatial axes, and one undilated: ORT's CPU EP's N-d path, which it takes for one or
    // three axes, places dilated blocks of every channel past the first wrongly; ONNX's
    // reference and the MLX EP agree.)
    register_spec!(super::COL2IM, || {
        (
            (1..=2i64, 1..=2i64, any::<bool>()),
            collection::vec((2..=6i64, 1..=3i64, 1..=2i64, 1..=2i64, 0..=1i64, 0..=1i64), 2),
            seed(),
        )
            .prop_map(|((n, c, one_axis), axes, seed)| {
                let axes = if one_axis { &axes[..1] } else { &axes[..] };
                let k = axes.len();
                let image: Vec<i64> = axes.iter().map(|a| a.0).collect();
                let strides: Vec<i64> = axes.iter().map(|a| a.2).collect();
                let dil: Vec<i64> = axes.iter().map(|a| if k == 1 { 1 } else { a.3 }).collect();
                let pads: Vec<i64> = axes.iter().map(|a| a.4).chain(axes.iter().map(|a| a.5)).collect();
                // The dilated block fits the padded image.
                let block: Vec<i64> =
                    (0..k).map(|d| axes[d].1.min((image[d] + pads[d] + pads[d + k] - 1) / dil[d] + 1)).collect();
                let l: i64 = (0..k)
                    .map(|d| ((image[d] + pads[d] + pads[d + k] - dil[d] * (block[d] - 1) - 1) / strides[d] + 1).max(0))
                    .product();
                let kk: i64 = block.iter().product();
                let out = [vec![n, c], image.clone()].concat();
                Case::op("Col2Im", 18)
                    .input("x", DType::F32, &[n, c * kk, l])
                    .constant_i64("image_shape", &image)
                    .constant_i64("block_shape", &block)
                    .attr_ints("strides", &strides)
                    .attr_ints("dilations", &dil)
                    .attr_ints("pads", &pads)
                    .output("y", DType::F32, &out)
                    .with_seed(seed)
            })
            .boxed()
    });
}
