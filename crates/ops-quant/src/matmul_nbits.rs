//! `com.microsoft` MatMulNBits: `A @ dequantize(B)^T (+ bias)` with B block-quantized to 4 or
//! 8 bits along K (`B` uint8 `[N, k_blocks, block_size * bits / 8]`, `scales` `[N * k_blocks]`,
//! optional `zero_points` packed uint8 or of A's type; `w = (q - zero_point) * scale`, the zero
//! point `2^(bits-1)` when absent).
//!
//! The weight is repacked once, without requantizing, into MLX's affine layout: ONNX packs the
//! element of even index in the low bits of each byte, which read as little-endian `uint32`
//! words is MLX's packing, so `q` is the same bits; `scales` stay; MLX's per-group `biases` are
//! `-scale * zero_point`. The dequantized weight `scale * q + bias` therefore equals ORT's
//! `(q - zero_point) * scale` up to one rounding of the product (float32: within 1 ulp of the
//! weight). Block sizes MLX's kernels take (32, 64, 128) run as `quantized_matmul`; others (16,
//! 256, ...) are dequantized once into a plain weight, exactly as ORT's formula.
//!
//! `accuracy_level` lets ORT's CPU EP quantize A to int8 (level 4) or compute in lower
//! precision; the MLX EP never quantizes A: every level computes in A's type with MLX's
//! accumulation, the closest to level 0 (exact float32 reference).

use ep_core::graph::ElemType;
use ep_core::lowering::{FLOATS, FnLowering, require_constant, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::host_f32;
use ep_core::{CompileSafety, Decline, Error, LowerCtx, NodeInfo, Result, bail};

/// Group sizes MLX's quantized kernels support.
const MLX_GROUP_SIZES: [i64; 3] = [32, 64, 128];

struct Params {
    k: i64,
    n: i64,
    bits: i64,
    block: i64,
}

impl Params {
    fn of(node: &NodeInfo) -> std::result::Result<Params, String> {
        let p = Params {
            k: node.attr_int("K", 0)?,
            n: node.attr_int("N", 0)?,
            bits: node.attr_int("bits", 4)?,
            block: node.attr_int("block_size", 0)?,
        };
        if p.k <= 0 || p.n <= 0 {
            return Err(format!("K={} and N={} must be positive", p.k, p.n));
        }
        if !matches!(p.bits, 4 | 8) {
            return Err(format!("bits={} (4 and 8 are supported)", p.bits));
        }
        if p.block < 16 || p.block & (p.block - 1) != 0 {
            return Err(format!("block_size={} must be a power of two >= 16", p.block));
        }
        Ok(p)
    }

    fn k_blocks(&self) -> i64 {
        (self.k + self.block - 1) / self.block
    }

    fn blob(&self) -> i64 {
        self.block * self.bits / 8
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 6)?;
    let p = Params::of(node)?;
    require_input_type(node, 0, FLOATS)?;
    require_input_type(node, 1, &[ElemType::U8])?;
    let t = node.input(0).and_then(|v| v.elem_type);
    for i in [2, 5] {
        if let Some(v) = node.input(i)
            && v.elem_type != t
        {
            return Err(Decline(format!("input {i} has type {:?}; A has {t:?}", v.elem_type)));
        }
    }
    if node.input(4).is_some() {
        return Err(Decline::new("g_idx (act-order) is not supported"));
    }
    require_constant(node, 1, "B")?;
    require_constant(node, 2, "scales")?;
    if let Some(zp) = node.input(3) {
        require_constant(node, 3, "zero_points")?;
        if zp.elem_type != Some(ElemType::U8) && zp.elem_type != t {
            return Err(Decline(format!("zero_points has type {:?}", zp.elem_type)));
        }
    }
    if let Some(shape) = node.input(1).and_then(|v| v.shape.as_ref())
        && shape.iter().map(|d| d.unwrap_or(-1)).collect::<Vec<_>>() != [p.n, p.k_blocks(), p.blob()]
    {
        return Err(Decline(format!("B has shape {shape:?}; expected [{}, {}, {}]", p.n, p.k_blocks(), p.blob())));
    }
    Ok(())
}

/// The zero point of each (row, block), `[N, k_blocks]`, as f32.
fn zero_points(p: &Params, zp: Option<&Array>) -> Result<Vec<f32>> {
    let (n, kb) = (p.n as usize, p.k_blocks() as usize);
    let Some(zp) = zp else {
        return Ok(vec![(1u32 << (p.bits - 1)) as f32; n * kb]);
    };
    if zp.dtype() != Dtype::U8 {
        let v = host_f32(zp)?;
        if v.len() != n * kb {
            bail!("zero_points has {} values; expected {}", v.len(), n * kb);
        }
        return Ok(v);
    }
    let bytes = match zp.host_bytes() {
        Some(b) => b.to_vec(),
        None => zp.to_vec::<u8>(&Stream::cpu()?)?,
    };
    let per_row = (kb * p.bits as usize).div_ceil(8);
    if bytes.len() != n * per_row {
        bail!("packed zero_points has {} bytes; expected {}", bytes.len(), n * per_row);
    }
    // Each row is packed (and padded) on its own.
    let mut out = Vec::with_capacity(n * kb);
    for row in bytes.chunks_exact(per_row) {
        let values = if p.bits == 8 { row[..kb].to_vec() } else { ep_core::graph::unpack_bits(row, kb, 4, false) };
        out.extend(values.into_iter().map(f32::from));
    }
    Ok(out)
}

/// MLX's affine form of the weight: (packed uint32 `[N, Kp * bits / 32]`, scales `[N, k_blocks]`,
/// biases `[N, k_blocks]`), in A's type.
fn repack(p: &Params, args: &[&Array], dtype: Dtype, s: &Stream) -> Result<Vec<Array>> {
    let (b, scales) = (args[0], args[1]);
    let bytes = b.host_bytes().ok_or_else(|| Error::new("B is not readable on the host"))?;
    let words = p.k_blocks() * p.blob() / 4;
    let q = Array::from_bytes(bytes, &[p.n, words], Dtype::U32)?;
    let scale_f32 = host_f32(scales)?;
    let count = (p.n * p.k_blocks()) as usize;
    if scale_f32.len() != count {
        bail!("scales has {} values; expected {count}", scale_f32.len());
    }
    let zp = zero_points(p, args.get(2).copied())?;
    let biases: Vec<f32> = scale_f32.iter().zip(&zp).map(|(s, z)| -s * z).collect();
    let shape = [p.n, p.k_blocks()];
    let scales = ops::astype(&ops::reshape(scales, &shape, s)?, dtype, s)?;
    let biases = ops::astype(&Array::from_slice(&biases, &shape)?, dtype, s)?;
    Ok(vec![q, scales, biases])
}

/// The dequantized weight `[N, Kp]` in A's type, computed as ORT does: `(q - zp) * scale`.
fn dequantize(p: &Params, args: &[&Array], dtype: Dtype, s: &Stream) -> Result<Vec<Array>> {
    let bytes = args[0].host_bytes().ok_or_else(|| Error::new("B is not readable on the host"))?;
    let scales = host_f32(args[1])?;
    let zp = zero_points(p, args.get(2).copied())?;
    let (kb, kp) = (p.k_blocks() as usize, (p.k_blocks() * p.block) as usize);
    let count = p.n as usize * kp;
    let q = if p.bits == 8 { bytes[..count].to_vec() } else { ep_core::graph::unpack_bits(bytes, count, 4, false) };
    let w: Vec<f32> = q
        .iter()
        .enumerate()
        .map(|(i, &q)| {
            let g = (i / kp) * kb + (i % kp) / p.block as usize;
            (f32::from(q) - zp[g]) * scales[g]
        })
        .collect();
    Ok(vec![ops::astype(&Array::from_slice(&w, &[p.n, kp as i64])?, dtype, s)?])
}

/// Whether `-scale * zero_point` is exact in `dtype` for every block: then MLX's affine form
/// in that half type is the same weight as in float32, and MLX's kernels (which accumulate
/// in float32) compute the product without widening A.
fn biases_exact(p: &Params, args: &[&Array], dtype: Dtype) -> Result<Vec<Array>> {
    let scales = host_f32(args[1])?;
    let zp = zero_points(p, args.get(2).copied())?;
    let biases: Vec<f32> = scales.iter().zip(&zp).map(|(s, z)| -s * z).collect();
    // Rounded to the half type and back on the host (to nearest, ties to even, as MLX's
    // conversion).
    let exact = scales.len() == zp.len()
        && biases.iter().all(|&b| {
            let back = match dtype {
                Dtype::BF16 => half::bf16::from_f32(b).to_f32(),
                _ => half::f16::from_f32(b).to_f32(),
            };
            back.to_bits() == b.to_bits()
        });
    Ok(vec![Array::from_slice(&[exact as u8], &[1])?])
}

use ep_core::lowering::AffineWeight;

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let p = Params::of(node).map_err(Error::new)?;
    let dtype = ctx.input(0)?.dtype();
    let mut weights = vec![1, 2];
    if ctx.optional_input(3).is_some() {
        weights.push(3);
    }
    let kp = p.k_blocks() * p.block;
    let shape = ctx.input(0)?.shape();
    if shape.last() != Some(&p.k) {
        bail!("A has shape {shape:?}; its last dimension must be K={}", p.k);
    }
    let gpu = ep_core::mlx::gpu_forms();
    let affine = MLX_GROUP_SIZES.contains(&p.block);
    // Half types compute in float32 (as ORT's CPU kernel does), except on a GPU where the
    // affine bias `-scale * zero_point` is exact in the half type (always so for the default
    // zero point): MLX's GPU kernels widen each product to float32 themselves, so the result
    // is the same and A is read as it is. (An inexact bias rounded to float16 would be off by
    // up to half a unit of 12.)
    let half = matches!(dtype, Dtype::F16 | Dtype::BF16) && gpu && affine && ctx.optional_input(5).is_none() && {
        let tag = format!("MatMulNBits exact bias bits={} block={} {dtype:?}", p.bits, p.block);
        let flag = ctx.derived_many(&weights, &tag, |args, _| biases_exact(&p, args, dtype))?;
        flag[0].host_bytes().is_some_and(|b| b == [1])
    };
    let compute = if half { dtype } else { Dtype::F32 };
    let a = ops::astype(ctx.input(0)?, compute, s)?;
    let x = if kp > p.k {
        // The padding of B's last block multiplies zeros.
        let mut hi = vec![0; shape.len()];
        hi[shape.len() - 1] = kp - p.k;
        ops::pad(&a, &vec![0; shape.len()], &hi, &ops::scalar(0.0, compute, s)?, "constant", s)?
    } else {
        a
    };
    // MLX's CPU kernel divides by the row count: never on zero rows.
    let mut out_shape = shape[..shape.len() - 1].to_vec();
    out_shape.push(p.n);
    let rows: i64 = shape[..shape.len() - 1].iter().product();
    if rows == 0 {
        return Ok(vec![ops::full(&out_shape, &ops::scalar(0.0, dtype, s)?, dtype, s)?]);
    }
    // (A batched A goes in as it is; a vector as one row.)
    let x = if shape.len() < 2 { ops::reshape(&x, &[rows, kp], s)? } else { x };
    let y = if affine {
        let tag = format!("MatMulNBits affine bits={} block={} {compute:?}", p.bits, p.block);
        let w = ctx.derived_many(&weights, &tag, |args, s| repack(&p, args, compute, s))?;
        let [packed, scales, biases] = &w[..] else { bail!("the affine form has {} parts", w.len()) };
        // (The quantized kernel for few rows, a dense product for more on a GPU.)
        let weight = AffineWeight {
            packed: packed.clone(),
            scales: scales.clone(),
            biases: biases.clone(),
            group: p.block as i32,
            bits: p.bits as i32,
            k: kp,
            n: p.n,
        };
        weight.matmul(&x, s)?
    } else {
        let tag = format!("MatMulNBits dequantized bits={} block={}", p.bits, p.block);
        let w = ctx.derived_many(&weights, &tag, |args, s| dequantize(&p, args, Dtype::F32, s))?;
        ops::matmul(&x, &ops::transpose(&w[0], s)?, s)?
    };
    let mut y = if shape.len() < 2 { ops::reshape(&y, &out_shape, s)? } else { y };
    if let Some(bias) = ctx.optional_input(5) {
        y = ops::add(&y, &ops::astype(bias, Dtype::F32, s)?, s)?;
    }
    Ok(vec![if y.dtype() == dtype { y } else { ops::astype(&y, dtype, s)? }])
}

ep_core::register_lowering!(
    MATMUL_NBITS = FnLowering {
        domain: "com.microsoft",
        op: "MatMulNBits",
        opsets: 1..=i32::MAX,
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

    register_spec!(super::MATMUL_NBITS, || {
        let shapes = (shape(0..=2), 1..=96i64, 1..=8i64);
        let layout = (prop_oneof![Just(4i64), Just(8i64)], prop_oneof![Just(16i64), Just(32), Just(64), Just(128)]);
        (dtype_of(&[DType::F32, DType::F16]), shapes, layout, 0..3u8, any::<bool>(), seed())
            .prop_map(|(t, (lead, k, n), (bits, block), zp, bias, seed)| {
                let kb = (k + block - 1) / block;
                let mut a_shape = lead.clone();
                a_shape.push(k);
                let mut y_shape = lead;
                y_shape.push(n);
                // ORT's CPU kernel takes float zero points with 2 and 4 bits only.
                let zp = if bits == 8 && zp == 2 { 1 } else { zp };
                let mut case = Case::domain_op("com.microsoft", "MatMulNBits", 1)
                    .input("a", t, &a_shape)
                    .constant("b", DType::U8, &[n, kb, block * bits / 8], Values::Uniform { lo: 0.0, hi: 256.0 })
                    .constant("scales", t, &[n, kb], Values::Uniform { lo: -0.05, hi: 0.05 });
                case = match zp {
                    0 => case,
                    1 => case.constant(
                        "zero_points",
                        DType::U8,
                        &[n, (kb * bits + 7) / 8],
                        Values::Uniform { lo: 0.0, hi: 256.0 },
                    ),
                    _ => case.constant("zero_points", t, &[n, kb], Values::Uniform { lo: 0.0, hi: 15.0 }),
                };
                if bias {
                    if zp == 0 {
                        case = case.absent();
                    }
                    // A constant: ORT's shape inference needs the bias length known.
                    case = case.absent().constant("bias", t, &[n], Values::Uniform { lo: -1.0, hi: 1.0 });
                }
                case.attr_int("K", k)
                    .attr_int("N", n)
                    .attr_int("bits", bits)
                    .attr_int("block_size", block)
                    .attr_int("accuracy_level", 0)
                    .output("y", t, &y_shape)
                    .with_seed(seed)
            })
            .boxed()
    });
}
