//! DFTs longer than [`MAX_POINTS`]: two passes of DFT matrices (Cooley-Tukey over
//! `n = n1 * n2`, both at most [`MAX_POINTS`]). With `j = j1 * n2 + j2` and
//! `k = k1 + n1 * k2`,
//! `X[k] = sum_j2 W_n2^(j2 k2) * (W_n^(j2 k1) * sum_j1 x[j] W_n1^(j1 k1))`: an `n1`-point
//! transform along `j1`, a twiddle factor per `(j2, k1)`, an `n2`-point transform along `j2`.
//! Each pass is one matmul with a matrix of [`Transform::matrix`]; the twiddles are computed
//! in float64 on the host and rounded once, as the matrices are.

use crate::matrix::{MAX_POINTS, Transform};
use ep_core::mlx::{Array, Stream, ops};
use ep_core::{Error, Result};

/// The factors `(n1, n2)` of `n` the two passes take, both at most [`MAX_POINTS`] and as close
/// to each other as `n`'s divisors allow; `None` when there are none (a prime factor over
/// [`MAX_POINTS`], or `n` over its square).
pub(crate) fn split(n: usize) -> Option<(usize, usize)> {
    let max = MAX_POINTS as usize;
    let root = (n as f64).sqrt() as usize;
    (1..=root.min(max)).rev().find(|&d| n.is_multiple_of(d) && n / d <= max).map(|d| (d, n / d))
}

/// The complex transform of `x` (`[..., n, 2]`, real and imaginary parts) along its
/// second-to-last axis: `[..., n, 2]`; the inverse is scaled by `1 / n`.
pub(crate) fn transform(x: &Array, n: usize, inverse: bool, s: &Stream) -> Result<Array> {
    let (n1, n2) = split(n).ok_or_else(|| {
        Error::new(format!("a DFT of {n} points, which does not split into two of at most {MAX_POINTS}"))
    })?;
    let shape = x.shape();
    if shape.len() < 2 || shape[shape.len() - 2] != n as i64 || shape[shape.len() - 1] != 2 {
        return Err(Error::new(format!("a {n}-point transform of {shape:?}")));
    }
    let lead: Vec<i64> = shape[..shape.len() - 2].to_vec();
    let r = lead.len() as i32;
    let dims = |tail: &[i64]| -> Vec<i64> { lead.iter().chain(tail).copied().collect() };
    // Swaps the two axes before the parts' axis.
    let swap: Vec<i32> = (0..r).chain([r + 1, r, r + 2]).collect();
    let pass = |a: &Array, points: usize| -> Result<Array> {
        let t = Transform { n: points, rows: points, components: 2, bins: points, inverse, real_out: false };
        Ok(ops::matmul(a, &t.matrix(x.dtype(), s)?, s)?)
    };
    // [.., j1, j2, 2] -> [.., j2, j1, 2]: the n1-point pass along j1.
    let a = ops::transpose_axes(&ops::reshape(x, &dims(&[n1 as i64, n2 as i64, 2]), s)?, &swap, s)?;
    let a = pass(&ops::reshape(&a, &dims(&[n2 as i64, 2 * n1 as i64]), s)?, n1)?;
    let a = ops::reshape(&a, &dims(&[n2 as i64, n1 as i64, 2]), s)?;
    // The twiddles W_n^(j2 k1), [n2, n1] each, the angle reduced exactly.
    let sign = if inverse { 1.0 } else { -1.0 };
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for j2 in 0..n2 {
        for k1 in 0..n1 {
            let angle = 2.0 * std::f64::consts::PI * ((j2 * k1) % n) as f64 / n as f64;
            cos.push(angle.cos() as f32);
            sin.push((sign * angle.sin()) as f32);
        }
    }
    let table = |v: &[f32]| -> Result<Array> {
        Ok(ops::astype(&Array::from_slice(v, &[n2 as i64, n1 as i64])?, x.dtype(), s)?)
    };
    let (cos, sin) = (table(&cos)?, table(&sin)?);
    let parts = ops::split_at(&a, &[1], r + 2, s)?;
    let plane = dims(&[n2 as i64, n1 as i64]);
    let (re, im) = (ops::reshape(&parts[0], &plane, s)?, ops::reshape(&parts[1], &plane, s)?);
    let turned_re = ops::subtract(&ops::multiply(&re, &cos, s)?, &ops::multiply(&im, &sin, s)?, s)?;
    let turned_im = ops::add(&ops::multiply(&re, &sin, s)?, &ops::multiply(&im, &cos, s)?, s)?;
    let a = ops::stack(&[turned_re, turned_im], r + 2, s)?;
    // [.., j2, k1, 2] -> [.., k1, j2, 2]: the n2-point pass along j2.
    let a = ops::transpose_axes(&a, &swap, s)?;
    let a = pass(&ops::reshape(&a, &dims(&[n1 as i64, 2 * n2 as i64]), s)?, n2)?;
    // [.., k1, k2, 2] -> [.., k2, k1, 2]: bin k = k1 + n1 * k2.
    let a = ops::transpose_axes(&ops::reshape(&a, &dims(&[n1 as i64, n2 as i64, 2]), s)?, &swap, s)?;
    Ok(ops::reshape(&a, &dims(&[n as i64, 2]), s)?)
}

/// The full spectrum of a real signal's `n`-point one-sided one (`[..., bins, 2]`, `bins =
/// n / 2 + 1`): bin `k` past the half is the conjugate of bin `n - k`.
pub(crate) fn hermitian(half: &Array, n: usize, s: &Stream) -> Result<Array> {
    let shape = half.shape();
    let r = shape.len();
    let axis = r as i32 - 2;
    let bins = n / 2 + 1;
    if n <= bins {
        return Ok(half.clone());
    }
    // Bins n/2+1 .. n-1 mirror bins n - k: (n+1)/2 - 1 down to 1.
    let mirrored: Vec<i32> = (bins..n).map(|k| (n - k) as i32).collect();
    let index = Array::from_slice(&mirrored, &[mirrored.len() as i64])?;
    let tail = ops::take(half, &index, axis, s)?;
    let conj = Array::from_slice(&[1.0f32, -1.0], &[2])?;
    let tail = ops::multiply(&tail, &ops::astype(&conj, half.dtype(), s)?, s)?;
    Ok(ops::concatenate(&[half.clone(), tail], axis, s)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_split_into_two_passes_of_at_most_the_matrix_size() {
        assert_eq!(split(8192), Some((64, 128)));
        assert_eq!(split(4100), Some((50, 82)));
        let (a, b) = split(4096 * 4096).unwrap();
        assert_eq!((a, b), (4096, 4096));
        assert_eq!(split(4099), None); // prime
        assert_eq!(split(4096 * 4097), None);
    }

    #[test]
    fn two_passes_equal_the_direct_sum() {
        let s = Stream::cpu().unwrap();
        let n = 4100usize;
        let x: Vec<f32> = (0..2 * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let a = Array::from_slice(&x, &[1, n as i64, 2]).unwrap();
        for inverse in [false, true] {
            let got = transform(&a, n, inverse, &s).unwrap().to_vec::<f32>(&s).unwrap();
            let sign = if inverse { 1.0 } else { -1.0 };
            for k in [0usize, 1, 7, 2049, 4099] {
                let (mut re, mut im) = (0.0f64, 0.0f64);
                for j in 0..n {
                    let t = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                    let (xr, xi) = (f64::from(x[2 * j]), f64::from(x[2 * j + 1]));
                    re += xr * t.cos() - xi * t.sin();
                    im += xr * t.sin() + xi * t.cos();
                }
                let scale = if inverse { n as f64 } else { 1.0 };
                let (re, im) = (re / scale, im / scale);
                let tol = 1e-4 * (1.0 + re.abs().max(im.abs()));
                assert!((f64::from(got[2 * k]) - re).abs() < tol, "bin {k} re {} vs {re}", got[2 * k]);
                assert!((f64::from(got[2 * k + 1]) - im).abs() < tol, "bin {k} im {} vs {im}", got[2 * k + 1]);
            }
        }
    }
}
