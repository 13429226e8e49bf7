//! ONNX's 4-bit float type float4e2m1 (opset 23): a sign bit, two exponent bits (bias 1) and
//! one mantissa bit, so the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4 and 6; no infinity or NaN. The
//! EP holds its values as their codes, one per byte in a uint8 array (unpacked from ORT's two
//! per byte as uint4 is), and converts with MLX operations, as it does the float8 types.
//!
//! Encoding follows the `onnx` package's reference (the `ml_dtypes` conversion): to the
//! nearest value, ties to the even code, saturating at 6 (infinities too); a NaN becomes a
//! zero whose sign bit is the opposite of the NaN's (so the reference writes it).

use crate::mlx::{Array, Dtype, Stream, ops};

/// The magnitudes of codes 0 to 7 (codes 8 to 15 are their negatives).
const MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The value of one code (its low four bits).
pub fn value(code: u8) -> f32 {
    let m = MAGNITUDES[usize::from(code & 7)];
    if code & 8 != 0 { -m } else { m }
}

/// Float4e2m1 codes (a uint8 array) as the float32 values they stand for.
pub fn decode(codes: &Array, s: &Stream) -> crate::Result<Array> {
    let table: Vec<f32> = (0..16u8).map(value).collect();
    let table = Array::from_slice(&table, &[16])?;
    let index = ops::astype(&ops::bitwise_and(codes, &ops::scalar(15.0, codes.dtype(), s)?, s)?, Dtype::I32, s)?;
    Ok(ops::take(&table, &index, 0, s)?)
}

/// Float values (any float type) as float4e2m1 codes (uint8).
pub fn encode(x: &Array, s: &Stream) -> crate::Result<Array> {
    let x = ops::astype(x, Dtype::F32, s)?;
    let a = ops::abs(&x, s)?;
    // The magnitude's code counts the midpoints between neighbouring values that `a` passes;
    // at a midpoint it goes up only to an even code (midpoints 1, 3 and 5). NaN passes none.
    let mut code = ops::scalar(0.0, Dtype::I32, s)?;
    for (i, pair) in MAGNITUDES.windows(2).enumerate() {
        let mid = ops::scalar(f64::from((pair[0] + pair[1]) / 2.0), Dtype::F32, s)?;
        let passed = if i % 2 == 1 { ops::greater_equal(&a, &mid, s)? } else { ops::greater(&a, &mid, s)? };
        code = ops::add(&code, &ops::astype(&passed, Dtype::I32, s)?, s)?;
    }
    let negative = ops::less(&ops::view(&x, Dtype::I32, s)?, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
    let negative = ops::not_equal(&negative, &ops::isnan(&x, s)?, s)?;
    let sign = ops::where_(&negative, &ops::scalar(8.0, Dtype::I32, s)?, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
    Ok(ops::astype(&ops::bitwise_or(&code, &sign, s)?, Dtype::U8, s)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(values: &[f32]) -> Vec<u8> {
        let s = Stream::cpu().unwrap();
        let x = Array::from_slice(values, &[values.len() as i64]).unwrap();
        encode(&x, &s).unwrap().to_vec::<u8>(&s).unwrap()
    }

    #[test]
    fn every_code_round_trips() {
        let values: Vec<f32> = (0..16u8).map(value).collect();
        assert_eq!(encoded(&values), (0..16u8).collect::<Vec<_>>());
        let s = Stream::cpu().unwrap();
        let codes = Array::from_slice(&(0..16u8).collect::<Vec<_>>(), &[16]).unwrap();
        assert_eq!(decode(&codes, &s).unwrap().to_vec::<f32>(&s).unwrap(), values);
    }

    #[test]
    fn encoding_rounds_to_nearest_ties_to_even_and_saturates() {
        // The `onnx` reference's codes (ml_dtypes) for these values.
        let x = [0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, 1e30, f32::INFINITY, -0.25, -5.0, 1e-30];
        assert_eq!(encoded(&x), [0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 7, 8, 14, 0]);
        assert_eq!(encoded(&[f32::NEG_INFINITY, -0.0, 0.0]), [15, 8, 0]);
        assert_eq!(encoded(&[f32::from_bits(0x7fc0_0000), f32::from_bits(0xffc0_0000)]), [8, 0]);
    }
}
