//! Integer arithmetic several op families share, as ORT's CPU EP defines it: the dynamic
//! uint8 quantization of a float operand and exact products of 8-bit integers.

use crate::mlx::{Array, Dtype, Stream, ops};
use crate::{Result, bail};

fn f32(a: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::astype(a, Dtype::F32, s)?)
}

/// `a`'s values as float32 on the host, for a lowering that reads a constant's scales or zero
/// points while it builds: from its host bytes where it has them ([`Array::host_f32`]: no
/// device round trip, which on a GPU cost about a millisecond per weight), else converted and
/// read on the CPU stream.
pub fn host_f32(a: &Array) -> Result<Vec<f32>> {
    if let Some(v) = a.host_f32() {
        return Ok(v);
    }
    let cpu = Stream::cpu()?;
    Ok(ops::astype(a, Dtype::F32, &cpu)?.to_vec::<f32>(&cpu)?)
}

/// `x` (float32) quantized to uint8 as ORT's CPU EP quantizes an operand dynamically
/// (DynamicQuantizeLinear, the dynamic integer products, DynamicQuantizeLSTM): scale `(max(0,
/// max x) - min(0, min x)) / 255` (1 when that range is 0), zero point `saturate(round(-min /
/// scale))`, each value `saturate(round(x / scale) + zero point)`, rounding half to even; NaN
/// elements take no part in the range and quantize to 0, and an undefined zero point (an
/// infinite range) is 255. The uint8 values, the scale and the zero point.
pub fn dynamic_uint8(x: &Array, s: &Stream) -> Result<(Array, Array, Array)> {
    let all: Vec<i32> = (0..x.ndim() as i32).collect();
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let (hi, lo) = if x.size() == 0 {
        (zero.clone(), zero.clone())
    } else {
        // With 0 in the range anyway, a NaN counts as a 0.
        let finite = ops::where_(&ops::isnan(x, s)?, &zero, x, s)?;
        (
            ops::maximum(&ops::max_axes(&finite, &all, false, s)?, &zero, s)?,
            ops::minimum(&ops::min_axes(&finite, &all, false, s)?, &zero, s)?,
        )
    };
    let scale = ops::divide(&ops::subtract(&hi, &lo, s)?, &ops::scalar(255.0, Dtype::F32, s)?, s)?;
    let scale = ops::where_(&ops::equal(&hi, &lo, s)?, &ops::scalar(1.0, Dtype::F32, s)?, &scale, s)?;
    let top = ops::scalar(255.0, Dtype::F32, s)?;
    let zp = ops::divide(&ops::negative(&lo, s)?, &scale, s)?;
    let zp = ops::round(&ops::clip(&ops::where_(&ops::isnan(&zp, s)?, &top, &zp, s)?, Some(&zero), Some(&top), s)?, s)?;
    // A NaN (a NaN input, or an infinite one over an infinite scale) quantizes to 0.
    let q = ops::add(&ops::round(&ops::divide(x, &scale, s)?, s)?, &zp, s)?;
    let q = ops::where_(&ops::isnan(&q, s)?, &zero, &ops::clip(&q, Some(&zero), Some(&top), s)?, s)?;
    Ok((ops::astype(&q, Dtype::U8, s)?, scale, ops::astype(&zp, Dtype::U8, s)?))
}

/// `(a - a_zp) @ (b - b_zp)` in int32, exactly: `a` `[.., M, K]`, `b` `[.., K, N]` of 8-bit
/// integers; zero points scalars or per row of `a` / per column of `b`.
pub fn integer_matmul(a: &Array, b: &Array, a_zp: Option<&Array>, b_zp: Option<&Array>, s: &Stream) -> Result<Array> {
    let (sa, sb) = (a.shape(), b.shape());
    if sa.len() < 2 || sb.len() < 2 || sa[sa.len() - 1] != sb[sb.len() - 2] {
        bail!("cannot multiply {sa:?} by {sb:?}");
    }
    let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
    let mut a = f32(a, s)?;
    let mut b = f32(b, s)?;
    if let Some(z) = a_zp {
        let z = f32(z, s)?;
        let z = if z.size() > 1 { ops::reshape(&z, &[m, 1], s)? } else { ops::reshape(&z, &[], s)? };
        a = ops::subtract(&a, &z, s)?;
    }
    if let Some(z) = b_zp {
        let z = f32(z, s)?;
        let z = if z.size() > 1 { ops::reshape(&z, &[1, n], s)? } else { ops::reshape(&z, &[], s)? };
        b = ops::subtract(&b, &z, s)?;
    }
    const CHUNK: i64 = 256;
    if k <= CHUNK {
        return Ok(ops::astype(&ops::matmul(&a, &b, s)?, Dtype::I32, s)?);
    }
    let chunks = (k + CHUNK - 1) / CHUNK;
    let pad = chunks * CHUNK - k;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let (ra, rb) = (sa.len(), sb.len());
    let mut hi_a = vec![0; ra];
    hi_a[ra - 1] = pad;
    let mut hi_b = vec![0; rb];
    hi_b[rb - 2] = pad;
    let a = ops::pad(&a, &vec![0; ra], &hi_a, &zero, "constant", s)?;
    let b = ops::pad(&b, &vec![0; rb], &hi_b, &zero, "constant", s)?;
    // a: [.., M, C, 256] -> [.., C, M, 256]; b: [.., C, 256, N].
    let mut a_shape = sa[..ra - 1].to_vec();
    a_shape.extend([chunks, CHUNK]);
    let a = ops::reshape(&a, &a_shape, s)?;
    let mut perm: Vec<i32> = (0..ra as i32 - 2).collect();
    perm.extend([ra as i32 - 1, ra as i32 - 2, ra as i32]);
    let a = ops::transpose_axes(&a, &perm, s)?;
    let mut b_shape = sb[..rb - 2].to_vec();
    b_shape.extend([chunks, CHUNK, n]);
    let b = ops::reshape(&b, &b_shape, s)?;
    let partial = ops::astype(&ops::matmul(&a, &b, s)?, Dtype::I32, s)?;
    Ok(ops::sum_axes(&partial, &[-3], false, s)?)
}
