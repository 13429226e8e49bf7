//! `com.microsoft` MurmurHash3: the 32-bit x86 MurmurHash3 of each element's little-endian
//! bytes (4 for int32, uint32 and float; 8, as two blocks, for int64 and uint64) with the
//! `seed` attribute, as uint32 (`positive`, the default) or the same bits as int32. Wrapping
//! 32-bit multiplies, shifts and xors on the device. Strings stay on the CPU; double is left
//! there too (MLX's GPUs hold no float64).

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

const KEYS: &[ElemType] = &[ElemType::I32, ElemType::U32, ElemType::F32, ElemType::I64, ElemType::U64];

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, KEYS)
}

fn word(v: u32) -> Result<Array> {
    Ok(Array::from_slice(&[v], &[])?)
}

/// `x` rotated left by `r` bits.
fn rotl(x: &Array, r: u32, s: &Stream) -> Result<Array> {
    Ok(ops::bitwise_or(&ops::left_shift(x, &word(r)?, s)?, &ops::right_shift(x, &word(32 - r)?, s)?, s)?)
}

/// One 4-byte block `k` mixed into the running hash `h`.
fn mix(h: &Array, k: &Array, s: &Stream) -> Result<Array> {
    let k = ops::multiply(k, &word(0xcc9e_2d51)?, s)?;
    let k = ops::multiply(&rotl(&k, 15, s)?, &word(0x1b87_3593)?, s)?;
    let h = rotl(&ops::bitwise_xor(h, &k, s)?, 13, s)?;
    Ok(ops::add(&ops::multiply(&h, &word(5)?, s)?, &word(0xe654_6b64)?, s)?)
}

/// The finalization: the key length folded in, then the avalanche.
fn finish(h: &Array, len: u32, s: &Stream) -> Result<Array> {
    let shift_xor =
        |h: &Array, r: u32| -> Result<Array> { Ok(ops::bitwise_xor(h, &ops::right_shift(h, &word(r)?, s)?, s)?) };
    let h = ops::bitwise_xor(h, &word(len)?, s)?;
    let h = ops::multiply(&shift_xor(&h, 16)?, &word(0x85eb_ca6b)?, s)?;
    let h = ops::multiply(&shift_xor(&h, 13)?, &word(0xc2b2_ae35)?, s)?;
    shift_xor(&h, 16)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let seed = node.attr_int("seed", 0)? as u32;
    let positive = node.attr_int("positive", 1)? != 0;
    let shape = x.shape();
    let wide = matches!(x.dtype(), Dtype::I64 | Dtype::U64);
    let h = ops::full(&shape, &word(seed)?, Dtype::U32, s)?;
    let h = if wide {
        // Each element as two little-endian words, low first.
        // (A trailing axis of 1 first: MLX views no scalar as a type of another size.)
        let mut one = shape.clone();
        one.push(1);
        let words = ops::view(&ops::reshape(x, &one, s)?, Dtype::U32, s)?;
        let last = shape.len() as i32;
        let (lo, hi) = (ops::take(&words, &word(0)?, last, s)?, ops::take(&words, &word(1)?, last, s)?);
        finish(&mix(&mix(&h, &lo, s)?, &hi, s)?, 8, s)?
    } else {
        finish(&mix(&h, &ops::view(x, Dtype::U32, s)?, s)?, 4, s)?
    };
    Ok(vec![if positive { h } else { ops::view(&h, Dtype::I32, s)? }])
}

ep_core::register_lowering!(
    MURMUR_HASH3 = FnLowering {
        domain: "com.microsoft",
        op: "MurmurHash3",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::MURMUR_HASH3, || {
        let types = &[DType::I32, DType::U32, DType::F32, DType::I64, DType::U64][..];
        (dtype_of(types), shape(0..=3), any::<bool>(), prop_oneof![Just(0i64), Just(42), Just(-7)], seed())
            .prop_map(|(t, shape, positive, hash_seed, seed)| {
                let values = match t {
                    DType::F32 => Values::Special,
                    DType::U32 | DType::U64 => Values::Uniform { lo: 0.0, hi: 4e9 },
                    _ => Values::Uniform { lo: -2e9, hi: 2e9 },
                };
                let out = if positive { DType::U32 } else { DType::I32 };
                Case::domain_op("com.microsoft", "MurmurHash3", 1)
                    .input_with("x", t, &shape, values)
                    .attr_int("seed", hash_seed)
                    .attr_int("positive", positive as i64)
                    .output("y", out, &shape)
                    .with_seed(seed)
            })
            .boxed()
    });
}
