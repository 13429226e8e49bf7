//! ONNX's 8-bit float types (opset 19): E4M3FN, E4M3FNUZ, E5M2 and E5M2FNUZ. MLX has no such
//! type, so the EP holds their values as they are laid out, one byte per element in a uint8
//! array, and converts with MLX operations: decoding is a lookup in the 256 values of the
//! format, encoding rounds float32 to nearest even on the float32 bits.
//!
//! Encoding follows the ONNX specification (the `saturate` attribute of Cast and
//! QuantizeLinear). ORT 1.31's CPU EP departs from it in two ranges when `saturate` is 0:
//! E4M3FN values in [480, 496) become 448 there (the specification's rounding reaches 480,
//! beyond the largest finite value, so NaN), and E5M2 values in [61440, 65536) become NaN (the
//! specification's infinity). The EP gives the specification's answers.

use crate::ElemType;
use crate::mlx::{Array, Dtype, Stream, ops};

/// One of the four 8-bit float formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Float8 {
    /// 4 exponent bits (bias 7), 3 mantissa bits; NaN is `S.1111.111`, no infinity; 448 at most.
    E4M3FN,
    /// 4 exponent bits (bias 8), 3 mantissa bits; NaN is `1.0000.000` (no negative zero), no
    /// infinity; 240 at most.
    E4M3FNUZ,
    /// 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: infinities and NaNs; 57344 at most.
    E5M2,
    /// 5 exponent bits (bias 16), 2 mantissa bits; NaN is `1.00000.00`, no infinity; 57344 at
    /// most.
    E5M2FNUZ,
}

impl Float8 {
    /// The format of an ONNX element type, if it is one of the four.
    pub fn of(t: ElemType) -> Option<Float8> {
        match t {
            ElemType::Other(17) => Some(Float8::E4M3FN),
            ElemType::Other(18) => Some(Float8::E4M3FNUZ),
            ElemType::Other(19) => Some(Float8::E5M2),
            ElemType::Other(20) => Some(Float8::E5M2FNUZ),
            _ => None,
        }
    }

    pub fn elem_type(self) -> ElemType {
        ElemType::Other(match self {
            Float8::E4M3FN => 17,
            Float8::E4M3FNUZ => 18,
            Float8::E5M2 => 19,
            Float8::E5M2FNUZ => 20,
        })
    }

    fn mantissa_bits(self) -> u32 {
        match self {
            Float8::E4M3FN | Float8::E4M3FNUZ => 3,
            Float8::E5M2 | Float8::E5M2FNUZ => 2,
        }
    }

    fn bias(self) -> i32 {
        match self {
            Float8::E4M3FN => 7,
            Float8::E4M3FNUZ => 8,
            Float8::E5M2 => 15,
            Float8::E5M2FNUZ => 16,
        }
    }

    /// The FNUZ formats: one zero (unsigned), NaN where negative zero would be.
    fn unsigned_zero(self) -> bool {
        matches!(self, Float8::E4M3FNUZ | Float8::E5M2FNUZ)
    }

    /// The code of the largest finite value (sign bit clear).
    fn max_code(self) -> i32 {
        match self {
            Float8::E4M3FN => 0x7e,
            Float8::E5M2 => 0x7b,
            Float8::E4M3FNUZ | Float8::E5M2FNUZ => 0x7f,
        }
    }

    /// The NaN code the encoder writes (sign bit clear for the formats that sign it).
    fn nan_code(self) -> i32 {
        if self.unsigned_zero() { 0x80 } else { 0x7f }
    }

    /// The largest finite value.
    pub fn max(self) -> f32 {
        self.value(self.max_code() as u8)
    }

    /// The value of one code.
    pub fn value(self, code: u8) -> f32 {
        let negative = code & 0x80 != 0;
        let magnitude = code & 0x7f;
        let nan = match self {
            Float8::E4M3FNUZ | Float8::E5M2FNUZ => code == 0x80,
            Float8::E4M3FN => magnitude == 0x7f,
            Float8::E5M2 => magnitude > 0x7c,
        };
        if nan {
            return f32::NAN;
        }
        let m_bits = self.mantissa_bits();
        let e = i32::from(magnitude >> m_bits);
        let m = f32::from(magnitude & ((1 << m_bits) - 1));
        let unit = (1u32 << m_bits) as f32;
        let v = if self == Float8::E5M2 && magnitude == 0x7c {
            f32::INFINITY
        } else if e == 0 {
            m / unit * 2f32.powi(1 - self.bias())
        } else {
            (1.0 + m / unit) * 2f32.powi(e - self.bias())
        };
        if negative { -v } else { v }
    }
}

/// Float8 codes (a uint8 array) as the float32 values they stand for.
pub fn decode(codes: &Array, format: Float8, s: &Stream) -> crate::Result<Array> {
    let table: Vec<f32> = (0..=255u8).map(|c| format.value(c)).collect();
    let table = Array::from_slice(&table, &[256])?;
    let index = ops::astype(codes, Dtype::I32, s)?;
    Ok(ops::take(&table, &index, 0, s)?)
}

/// Float values (any float type) as float8 codes (uint8), rounded to nearest even. Beyond the
/// largest finite value: with `saturate`, that value (infinities too); without, infinity for
/// E5M2 and NaN for the others. NaN stays NaN; FNUZ formats have no negative zero.
pub fn encode(x: &Array, format: Float8, saturate: bool, s: &Stream) -> crate::Result<Array> {
    let int = |v: i64| ops::scalar(v as f64, Dtype::I32, s);
    let x = ops::astype(x, Dtype::F32, s)?;
    let a = ops::abs(&x, s)?;
    let bits = ops::view(&a, Dtype::I32, s)?; // non-negative: the sign bit is clear
    let m = format.mantissa_bits();
    let bias = format.bias();
    // Normal results: round the float32 mantissa to `m` bits (to nearest, ties to even) with
    // integer arithmetic on the bits, then move the exponent from float32's bias to the format's.
    let shift = i64::from(23 - m);
    let odd = ops::bitwise_and(&ops::right_shift(&bits, &int(shift)?, s)?, &int(1)?, s)?;
    let nudged = ops::add(&ops::add(&bits, &int((1 << (shift - 1)) - 1)?, s)?, &odd, s)?;
    let normal = ops::subtract(&ops::right_shift(&nudged, &int(shift)?, s)?, &int(i64::from(127 - bias) << m)?, s)?;
    // Subnormal results: the value in units of the smallest subnormal, rounded half to even
    // (a power-of-two scaling, exact); 2^m there is the smallest normal's code.
    let units = ops::multiply(&a, &ops::scalar(2f64.powi(bias - 1 + m as i32), Dtype::F32, s)?, s)?;
    let sub = ops::astype(&ops::round(&units, s)?, Dtype::I32, s)?;
    let tiny = ops::less(&a, &ops::scalar(2f64.powi(1 - bias), Dtype::F32, s)?, s)?;
    let code = ops::where_(&tiny, &sub, &normal, s)?;
    let beyond = if saturate {
        format.max_code()
    } else if format == Float8::E5M2 {
        0x7c
    } else {
        format.nan_code()
    };
    let over = ops::greater(&code, &int(i64::from(format.max_code()))?, s)?;
    let code = ops::where_(&over, &int(i64::from(beyond))?, &code, s)?;
    let nan = ops::isnan(&x, s)?;
    let code = ops::where_(&nan, &int(i64::from(format.nan_code()))?, &code, s)?;
    // The sign bit: from x's own (negative zero included), except FNUZ's zero, which is
    // unsigned, and its NaN, which is the sign bit alone already.
    let negative = ops::less(&ops::view(&x, Dtype::I32, s)?, &int(0)?, s)?;
    let negative = if format.unsigned_zero() {
        ops::logical_and(&negative, &ops::not_equal(&code, &int(0)?, s)?, s)?
    } else {
        negative
    };
    let sign = ops::where_(&negative, &int(0x80)?, &int(0)?, s)?;
    Ok(ops::astype(&ops::bitwise_or(&code, &sign, s)?, Dtype::U8, s)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Float8; 4] = [Float8::E4M3FN, Float8::E4M3FNUZ, Float8::E5M2, Float8::E5M2FNUZ];

    fn encoded(values: &[f32], format: Float8, saturate: bool) -> Vec<u8> {
        let s = Stream::cpu().unwrap();
        let x = Array::from_slice(values, &[values.len() as i64]).unwrap();
        encode(&x, format, saturate, &s).unwrap().to_vec::<u8>(&s).unwrap()
    }

    /// The code nearest to `v` by exhaustive search over the format's finite codes (ties to
    /// the even code), saturating: what `encode` must compute by its bit arithmetic.
    fn nearest(v: f32, format: Float8) -> u8 {
        let mut best: Option<(f64, u8)> = None;
        for c in 0..=255u8 {
            let w = format.value(c);
            if !w.is_finite() {
                continue;
            }
            let d = (f64::from(v) - f64::from(w)).abs();
            let better = match best {
                None => true,
                Some((bd, bc)) => d < bd || (d == bd && c & 1 == 0 && bc & 1 == 1),
            };
            if better {
                best = Some((d, c));
            }
        }
        best.expect("a finite code").1
    }

    #[test]
    fn the_formats_hold_their_documented_extremes() {
        assert_eq!(Float8::E4M3FN.max(), 448.0);
        assert_eq!(Float8::E4M3FNUZ.max(), 240.0);
        assert_eq!(Float8::E5M2.max(), 57344.0);
        assert_eq!(Float8::E5M2FNUZ.max(), 57344.0);
        assert_eq!(Float8::E4M3FN.value(0x01), 2f32.powi(-9));
        assert_eq!(Float8::E4M3FNUZ.value(0x01), 2f32.powi(-10));
        assert_eq!(Float8::E5M2.value(0x01), 2f32.powi(-16));
        assert_eq!(Float8::E5M2FNUZ.value(0x01), 2f32.powi(-17));
        assert_eq!(Float8::E5M2.value(0xfc), f32::NEG_INFINITY);
        assert!(Float8::E4M3FN.value(0xff).is_nan() && Float8::E4M3FNUZ.value(0x80).is_nan());
        assert!(Float8::E4M3FN.value(0x80).is_sign_negative() && Float8::E4M3FN.value(0x80) == 0.0);
        for f in ALL {
            assert_eq!(Float8::of(f.elem_type()), Some(f));
        }
    }

    #[test]
    fn every_finite_code_round_trips() {
        for f in ALL {
            let codes: Vec<u8> = (0..=255u8).filter(|&c| f.value(c).is_finite()).collect();
            let values: Vec<f32> = codes.iter().map(|&c| f.value(c)).collect();
            let back = encoded(&values, f, true);
            for ((c, v), b) in codes.iter().zip(&values).zip(&back) {
                // (FNUZ has no negative zero; E4M3FN's and E5M2's -0 is its own code.)
                assert_eq!(c, b, "{f:?}: {v} encoded as {b:#x}, not {c:#x}");
            }
        }
    }

    #[test]
    fn encoding_rounds_to_the_nearest_code_ties_to_even() {
        for f in ALL {
            // Every midpoint between neighbouring codes, a little either side of it, and values
            // spread over the whole range, positive and negative.
            let mut values = Vec::new();
            let finite: Vec<f32> = (0..0x80u8).map(|c| f.value(c)).filter(|v| v.is_finite()).collect::<Vec<_>>();
            for w in finite.windows(2) {
                let mid = (w[0] + w[1]) / 2.0;
                values.extend([mid, mid * (1.0 + 1e-6), mid * (1.0 - 1e-6), -mid]);
            }
            values.extend((0..2000).map(|i| (i as f32 - 1000.0) * f.max() / 997.0));
            values.extend([1e-30, -1e-30, 1e-12]);
            let got = encoded(&values, f, true);
            for (v, g) in values.iter().zip(&got) {
                let want = nearest(*v, f);
                let same = *g == want || (f.value(*g) == 0.0 && f.value(want) == 0.0);
                assert!(same, "{f:?}: {v} encoded as {g:#x} ({}), the nearest is {want:#x}", f.value(*g));
            }
        }
    }

    #[test]
    fn out_of_range_values_saturate_or_not() {
        let big = [1e6, -1e6, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for f in ALL {
            let sat = encoded(&big, f, true);
            assert_eq!(f.value(sat[0]), f.max(), "{f:?}");
            assert_eq!(f.value(sat[1]), -f.max(), "{f:?}");
            assert_eq!(f.value(sat[2]), f.max(), "{f:?}");
            assert_eq!(f.value(sat[3]), -f.max(), "{f:?}");
            assert!(f.value(sat[4]).is_nan(), "{f:?}");
            let raw = encoded(&big, f, false);
            for (v, c) in big.iter().zip(&raw) {
                let got = f.value(*c);
                if f == Float8::E5M2 && !v.is_nan() {
                    assert_eq!(got, if *v > 0.0 { f32::INFINITY } else { f32::NEG_INFINITY });
                } else {
                    assert!(got.is_nan(), "{f:?}: {v} -> {got}");
                }
            }
        }
        // The specification's rounding past the largest value: E4M3FN's 490 is nearer 480
        // (not a value of the format) than 448.
        assert!(Float8::E4M3FN.value(encoded(&[490.0], Float8::E4M3FN, false)[0]).is_nan());
        assert_eq!(encoded(&[470.0, 490.0], Float8::E4M3FN, true), [0x7e, 0x7e]);
        assert_eq!(Float8::E5M2.value(encoded(&[61440.0], Float8::E5M2, false)[0]), f32::INFINITY);
    }

    #[test]
    fn fnuz_formats_have_no_negative_zero() {
        for f in [Float8::E4M3FNUZ, Float8::E5M2FNUZ] {
            assert_eq!(encoded(&[-0.0, -1e-30], f, true), [0, 0]);
        }
        assert_eq!(encoded(&[-0.0], Float8::E4M3FN, true), [0x80]);
    }

    #[test]
    fn decoding_reads_the_table() {
        let s = Stream::cpu().unwrap();
        for f in ALL {
            let codes: Vec<u8> = (0..=255).collect();
            let x = Array::from_slice(&codes, &[256]).unwrap();
            let got = decode(&x, f, &s).unwrap().to_vec::<f32>(&s).unwrap();
            for (c, g) in codes.iter().zip(&got) {
                let want = f.value(*c);
                assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{f:?} {c:#x}");
            }
        }
    }
}
