//! A DequantizeLinear of a constant matrix weight `[K, N]` (8 or 4 bits, per tensor, per
//! column, or in blocks along K; or `[N, K]` read by a Gemm with transB) publishes MLX's affine
//! form of it
//! ([`ep_core::lowering::AffineWeight`]): a MatMul reading its output then runs MLX's quantized
//! matmul on the stored integers instead of multiplying by the dequantized float weight (the
//! QDQ form of a weight-quantized model reads a quarter or an eighth of the bytes per run). On
//! GPUs (and in the GPU's forms on the CPU, `ONNXRUNTIME_EP_MLX_TEST_GPU_FORMS`, for testing).
//!
//! The integers are not requantized: `q` is shifted to MLX's unsigned range
//! (`u = q + 2^(bits-1)` for signed types) and packed along K; each group of `group` values
//! along K shares the column's (or the block's) scale, and `bias = -scale * (zero_point +
//! shift)`, so `scale * u + bias` equals ONNX's `(q - zero_point) * scale` up to the rounding of
//! the product and of the bias (float32: a few ulps of the group's largest weight). A
//! half-type weight is multiplied in float32, except on a GPU where its scales are of that
//! type and every bias is exact in it (always so without a zero point). Published only where
//! a MatMul reads the output as its weight.

use ep_core::graph::ElemType;
use ep_core::lowering::AffineWeight;
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::host_f32;
use ep_core::{LowerCtx, NodeInfo, Result, bail};

/// Group sizes MLX's quantized kernels support, largest first.
const GROUPS: [i64; 3] = [128, 64, 32];

/// How the weight is quantized: its size, bits, the shift to unsigned, the layout of its
/// scale (`block` 0: per tensor or per column), and whether the matmul's weight is the
/// output's transpose (`[N, K]`: Gemm's transB).
struct Form {
    k: i64,
    n: i64,
    bits: i64,
    shift: i64,
    per_column: bool,
    block: i64,
    group: i64,
    transposed: bool,
}

/// The form of this DequantizeLinear's weight (`transposed`: of its transpose), when MLX's
/// quantized matmul can take it.
fn form(ctx: &LowerCtx<'_>, node: &NodeInfo, axis: usize, block: i64, transposed: bool) -> Result<Option<Form>> {
    let x = ctx.input(0)?;
    let constant = ctx.is_constant(0) && ctx.is_constant(1) && (ctx.optional_input(2).is_none() || ctx.is_constant(2));
    let &[rows, cols] = &x.shape()[..] else { return Ok(None) };
    // K runs along axis 0 of the weight, or along axis 1 of its transpose.
    let (k, n, k_axis) = if transposed { (cols, rows, 1) } else { (rows, cols, 0) };
    let (bits, shift) = match node.input(0).and_then(|v| v.elem_type) {
        Some(ElemType::I8) => (8, 128),
        Some(ElemType::U8) => (8, 0),
        Some(ElemType::INT4) => (4, 8),
        Some(ElemType::UINT4) => (4, 0),
        _ => return Ok(None),
    };
    if !constant || k <= 0 || n <= 0 {
        return Ok(None);
    }
    let scale = ctx.input(1)?.size() as i64;
    let (per_column, group) = if block > 0 {
        // Blocks along K of a size MLX groups by, K a whole number of them.
        if axis != k_axis || !GROUPS.contains(&block) || k % block != 0 {
            return Ok(None);
        }
        (false, block)
    } else {
        let per_column = scale > 1;
        if per_column && (axis == k_axis || scale != n) {
            return Ok(None);
        }
        let Some(&g) = GROUPS.iter().find(|&&g| k % g == 0) else { return Ok(None) };
        (per_column, g)
    };
    Ok(Some(Form { k, n, bits, shift, per_column, block, group, transposed }))
}

/// Publishes the affine form of output 0 when the weight allows one (see the module's doc):
/// for a MatMul or Gemm reading it as `B`, and for a Gemm its transpose (transB); a weight it
/// does not fit is left as it is.
pub(crate) fn publish(ctx: &mut LowerCtx<'_>, node: &NodeInfo, axis: usize, block: i64, out: Dtype) -> Result<()> {
    // GPUs only: MLX's CPU backend multiplies a quantized weight slower than it dequantizes
    // and multiplies densely (a 1024x1024 int8 weight: 1.5 against 0.6 ms for one row).
    if !ep_core::mlx::gpu_forms() {
        return Ok(());
    }
    // The orientations the readers want: a MatMul's or a Gemm's B as it is, a Gemm with
    // transB its transpose.
    let (mut plain, mut transposed) = (false, false);
    for (reader, input) in ctx.output_readers(0) {
        match (reader.qualified_op().as_str(), *input) {
            ("MatMul", 1) => plain = true,
            ("Gemm", 1) => match reader.attr_int("transB", 0) {
                Ok(1) => transposed = true,
                _ => plain = true,
            },
            _ => {}
        }
    }
    if plain {
        publish_form(ctx, node, axis, block, out, false)?;
    }
    if transposed {
        publish_form(ctx, node, axis, block, out, true)?;
    }
    Ok(())
}

fn publish_form(
    ctx: &mut LowerCtx<'_>,
    node: &NodeInfo,
    axis: usize,
    block: i64,
    out: Dtype,
    transposed: bool,
) -> Result<()> {
    let Some(f) = form(ctx, node, axis, block, transposed)? else { return Ok(()) };
    let mut weights = vec![0, 1];
    if ctx.optional_input(2).is_some() {
        weights.push(2);
    }
    // A half type computes in float32 (as ORT's CPU EP does) but on a GPU, where MLX's kernels
    // widen each product themselves, so an exact half-type form is the same weight. (Not on
    // MLX's CPU backend in the GPU's forms: its half-type kernel accumulates in the half type.)
    let same_type = ctx.input(1)?.dtype() == out;
    let compute = if out == Dtype::F32 || !same_type || !ep_core::mlx::default_device_is_gpu() {
        Dtype::F32
    } else {
        let tag =
            format!("QDQ affine exact bias bits={} group={} transposed={} {out:?}", f.bits, f.group, f.transposed);
        let flag = ctx.derived_many(&weights, &tag, |args, _| {
            let (_, biases) = scales_and_biases(&f, args)?;
            // Rounded to the half type and back on the host (to nearest, ties to even, as
            // MLX's conversion).
            let exact = biases.iter().all(|&b| {
                let back = match out {
                    Dtype::BF16 => half::bf16::from_f32(b).to_f32(),
                    _ => half::f16::from_f32(b).to_f32(),
                };
                back.to_bits() == b.to_bits()
            });
            Ok(vec![Array::from_slice(&[u8::from(exact)], &[1])?])
        })?;
        if flag[0].host_bytes().is_some_and(|b| b == [1]) { out } else { Dtype::F32 }
    };
    let tag = format!(
        "QDQ affine bits={} group={} per_column={} block={} transposed={} {compute:?}",
        f.bits, f.group, f.per_column, f.block, f.transposed
    );
    let w = ctx.derived_many(&weights, &tag, |args, s| repack(&f, args, compute, s))?;
    let [packed, scales, biases] = &w[..] else { bail!("the affine form has {} parts", w.len()) };
    let weight = AffineWeight {
        packed: packed.clone(),
        scales: scales.clone(),
        biases: biases.clone(),
        group: f.group as i32,
        bits: f.bits as i32,
        k: f.k,
        n: f.n,
    };
    ctx.publish(0, transposed, &weight)
}

/// Per (column, group) the scale and the bias, `[N, K / group]` row-major, in float32.
fn scales_and_biases(f: &Form, args: &[&Array]) -> Result<(Vec<f32>, Vec<f32>)> {
    let scale = host_f32(args[1])?;
    let zp = match args.get(2) {
        Some(z) => host_f32(z)?,
        None => vec![0.0; scale.len()],
    };
    if zp.len() != scale.len() {
        bail!("the zero point has {} values, the scale {}", zp.len(), scale.len());
    }
    let (n, groups) = (f.n as usize, (f.k / f.group) as usize);
    let mut scales = Vec::with_capacity(n * groups);
    let mut biases = Vec::with_capacity(n * groups);
    for col in 0..n {
        for g in 0..groups {
            let i = if f.block > 0 {
                // [K / block, N], or [N, K / block] for the transpose.
                if f.transposed { col * groups + g } else { g * n + col }
            } else if f.per_column {
                col
            } else {
                0
            };
            let (sc, z) = (*scale.get(i).ok_or_else(|| ep_core::Error::new("the scale is too short"))?, zp[i]);
            scales.push(sc);
            biases.push(-sc * (z + f.shift as f32));
        }
    }
    Ok((scales, biases))
}

/// The packed weight `[N, K * bits / 32]` and its scales and biases in `compute`.
fn repack(f: &Form, args: &[&Array], compute: Dtype, s: &Stream) -> Result<Vec<Array>> {
    // One byte per element (int4 and uint4 too, held unpacked): signed types' bytes are the
    // values' two's complement, which the shift and the mask turn into MLX's unsigned range.
    let q = args[0].host_bytes().ok_or_else(|| ep_core::Error::new("the weight is not readable on the host"))?;
    let (k, n, bits) = (f.k as usize, f.n as usize, f.bits as usize);
    if q.len() != k * n {
        bail!("the weight holds {} bytes, not {k} x {n}", q.len());
    }
    let per_word = 32 / bits;
    let words = k / per_word;
    let mask = (1u32 << bits) - 1;
    let signed = f.shift > 0;
    let mut packed = vec![0u32; n * words];
    // `q` is `[K, N]`, or `[N, K]` for the transpose; element (k, n) goes to row n, word
    // k / per_word, at bit (k % per_word) * bits.
    let line = if f.transposed { k } else { n };
    for (r, values) in q.chunks_exact(line).enumerate() {
        for (c, &b) in values.iter().enumerate() {
            let (kk, nn) = if f.transposed { (c, r) } else { (r, c) };
            let v = if signed { i64::from(b as i8) } else { i64::from(b) };
            let u = ((v + f.shift) as u32) & mask;
            packed[nn * words + kk / per_word] |= u << ((kk % per_word) * bits);
        }
    }
    let (scales, biases) = scales_and_biases(f, args)?;
    let shape = [f.n, f.k / f.group];
    Ok(vec![
        Array::from_slice(&packed, &[f.n, words as i64])?,
        ops::astype(&Array::from_slice(&scales, &shape)?, compute, s)?,
        ops::astype(&Array::from_slice(&biases, &shape)?, compute, s)?,
    ])
}
