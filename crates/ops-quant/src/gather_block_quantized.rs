//! `com.microsoft` GatherBlockQuantized for uint8 data (the tied int4/int8 embeddings of
//! genai's decoders): rows gathered along axis 0 and dequantized along the last axis in blocks,
//! `out = (q - zero_point) * scale`, in the type of `scales`. With `bits = 4` each byte holds two
//! elements, the even one in the low nibble; the zero point defaults to `2^(bits-1)`. Negative
//! indices count from the end; indices out of range give zero rows, as ORT's CPU kernel does.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 4)?;
    require_input_type(node, 0, &[ElemType::U8])?;
    require_input_type(node, 1, &[ElemType::I32, ElemType::I64])?;
    require_input_type(node, 2, &[ElemType::F32, ElemType::F16])?;
    require_input_type(node, 3, &[ElemType::U8])?;
    let bits = node.attr_int("bits", 4)?;
    if !matches!(bits, 4 | 8) {
        return Err(Decline(format!("bits={bits} (4 and 8 are supported)")));
    }
    let block = node.attr_int("block_size", 128)?;
    if block < 16 || block & (block - 1) != 0 {
        return Err(Decline(format!("block_size={block} must be a power of two >= 16")));
    }
    let rank = ep_core::lowering::require_input_rank(node, 0, 2..=2)?;
    if node.attr_int("gather_axis", 0)? != 0 || !matches!(node.attr_int("quantize_axis", 1)?, 1 | -1) {
        return Err(Decline(format!("uint8 data of rank {rank} is gathered on axis 0 and quantized on axis 1 only")));
    }
    Ok(())
}

/// The `bits`-wide elements of each byte of `bytes` (`[.., n]` uint8) as `[.., n * 8 / bits]`.
fn unpack(bytes: &Array, bits: i64, s: &Stream) -> Result<Array> {
    if bits == 8 {
        return Ok(bytes.clone());
    }
    let shape = bytes.shape();
    let low = ops::bitwise_and(bytes, &ops::scalar(15.0, Dtype::U8, s)?, s)?;
    let high = ops::right_shift(bytes, &ops::scalar(4.0, Dtype::U8, s)?, s)?;
    let mut out_shape = shape[..shape.len() - 1].to_vec();
    out_shape.push(shape[shape.len() - 1] * 2);
    Ok(ops::reshape(&ops::stack(&[low, high], -1, s)?, &out_shape, s)?)
}

/// `[.., blocks]` repeated `block` times each along the last axis, cut to `len`.
fn per_element(x: &Array, block: i64, len: i64, s: &Stream) -> Result<Array> {
    let shape = x.shape();
    let lead = &shape[..shape.len() - 1];
    let blocks = shape[shape.len() - 1];
    let mut wide = lead.to_vec();
    wide.extend([blocks, block]);
    let t = ops::broadcast_to(&ops::expand_dims(x, -1, s)?, &wide, s)?;
    let mut flat = lead.to_vec();
    flat.push(blocks * block);
    let t = ops::reshape(&t, &flat, s)?;
    if blocks * block == len {
        return Ok(t);
    }
    let start = vec![0; flat.len()];
    let mut stop = flat.clone();
    *stop.last_mut().expect("rank >= 1") = len;
    Ok(ops::slice(&t, &start, &stop, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (bits, block) = (node.attr_int("bits", 4)?, node.attr_int("block_size", 128)?);
    let (data, indices, scales) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.input(2)?.clone());
    let (data, scales) = (&data, &scales);
    let rows = data.shape()[0];
    let out_type = scales.dtype();
    let zp_rows = ctx.optional_input(3).map(|z| z.shape().first().copied().unwrap_or(0));
    if scales.shape().first() != Some(&rows) || zp_rows.is_some_and(|z| z != rows) {
        bail!("the table has {rows} rows but its scales {:?} and zero points {zp_rows:?} rows", scales.shape().first());
    }
    if rows == 0 && indices.size() > 0 {
        bail!("indices into a table with no rows");
    }
    // An index outside the table fails the run, as on ORT's CPU EP.
    let reason = format!(
        "indices out of range: each must lie within the inclusive range [{}, {}] (the table has {rows} rows)",
        -rows,
        rows - 1
    );
    let safe = ctx.checked_index(&indices, rows.max(1), &reason, s)?;
    let q = unpack(&ops::take(data, &safe, 0, s)?, bits, s)?;
    let width = *q.shape().last().ok_or_else(|| Error::new("data has no columns"))?;
    let q = ops::astype(&q, Dtype::F32, s)?;
    let scale = ops::astype(&ops::take(scales, &safe, 0, s)?, Dtype::F32, s)?;
    let blocks = *scale.shape().last().ok_or_else(|| Error::new("scales has no columns"))?;
    if blocks * block < width {
        bail!("{blocks} blocks of {block} do not cover {width} columns");
    }
    let zp = match ctx.optional_input(3) {
        Some(z) => {
            let z = unpack(&ops::take(z, &safe, 0, s)?, bits, s)?;
            let zs = z.shape();
            let start = vec![0; zs.len()];
            let mut stop = zs.clone();
            *stop.last_mut().expect("rank >= 1") = blocks;
            ops::astype(&ops::slice(&z, &start, &stop, s)?, Dtype::F32, s)?
        }
        None => ops::full(&scale.shape(), &ops::scalar((1u32 << (bits - 1)) as f64, Dtype::F32, s)?, Dtype::F32, s)?,
    };
    let w = ops::multiply(
        &ops::subtract(&q, &per_element(&zp, block, width, s)?, s)?,
        &per_element(&scale, block, width, s)?,
        s,
    )?;
    Ok(vec![ops::astype(&w, out_type, s)?])
}

ep_core::register_lowering!(
    GATHER_BLOCK_QUANTIZED = FnLowering {
        domain: "com.microsoft",
        op: "GatherBlockQuantized",
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

    register_spec!(super::GATHER_BLOCK_QUANTIZED, || {
        let layout = (prop_oneof![Just(4i64), Just(8)], prop_oneof![Just(16i64), Just(32), Just(64)]);
        (dtype_of(&[DType::F32, DType::F16]), (1..=6i64, 1..=3i64), layout, shape(0..=2), any::<bool>(), seed())
            .prop_map(|(t, (rows, blocks), (bits, block), idx_shape, zp, seed)| {
                let cols = blocks * block;
                let bytes = cols * bits / 8;
                let mut out_shape = idx_shape.clone();
                out_shape.push(cols);
                let mut case = Case::domain_op("com.microsoft", "GatherBlockQuantized", 1)
                    .constant("data", DType::U8, &[rows, bytes], Values::Uniform { lo: 0.0, hi: 256.0 })
                    .input_with(
                        "indices",
                        DType::I64,
                        &idx_shape,
                        Values::Uniform { lo: -(rows as f64), hi: rows as f64 },
                    )
                    .constant("scales", t, &[rows, blocks], Values::Uniform { lo: -0.1, hi: 0.1 });
                if zp {
                    case = case.constant(
                        "zero_points",
                        DType::U8,
                        &[rows, (blocks * bits + 7) / 8],
                        Values::Uniform { lo: 0.0, hi: 256.0 },
                    );
                }
                case.attr_int("bits", bits)
                    .attr_int("block_size", block)
                    .attr_int("gather_axis", 0)
                    .attr_int("quantize_axis", 1)
                    .output("y", t, &out_shape)
                    .with_seed(seed)
            })
            .boxed()
    });
}
