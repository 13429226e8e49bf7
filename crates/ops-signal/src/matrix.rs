//! DFT matrices: the real matrix that maps a signal's samples (real, or complex as interleaved
//! real and imaginary parts) to its spectrum's bins (interleaved likewise), or a one-sided
//! spectrum back to a real signal.

use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{Error, Result};

/// The most points a transform may have (its matrix has up to `(2 * MAX_POINTS)^2` entries).
pub(crate) const MAX_POINTS: i64 = 4096;

/// What a transform computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transform {
    /// Points of the DFT.
    pub n: usize,
    /// Samples read along the axis (at most `n`; the rest count as zeros).
    pub rows: usize,
    /// Components per input sample: 1 (real) or 2 (complex).
    pub components: usize,
    /// Bins written: `n`, or `n / 2 + 1` for a one-sided spectrum.
    pub bins: usize,
    pub inverse: bool,
    /// An inverse of a one-sided spectrum: `rows` bins in, `n` real samples out.
    pub real_out: bool,
}

impl Transform {
    /// Columns of the matrix: two per bin, or one per real output sample.
    pub fn columns(&self) -> usize {
        if self.real_out { self.n } else { 2 * self.bins }
    }

    /// The matrix, `[rows * components, columns]`, in `dtype` (rounded through float32).
    pub fn matrix(&self, dtype: Dtype, s: &Stream) -> Result<Array> {
        let (n, rows, c, cols) = (self.n, self.rows, self.components, self.columns());
        if n as i64 > MAX_POINTS {
            return Err(Error::new(format!("a DFT of {n} points; the MLX EP computes at most {MAX_POINTS}")));
        }
        // The angle 2 pi (j k mod n) / n, exact in its reduction, so sin(pi) is as small as f64
        // makes it and the bins a symmetric signal leaves at zero stay at zero.
        let angle = |j: usize, k: usize| 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
        let mut m = vec![0.0f64; rows * c * cols];
        if self.real_out {
            // x[t] = 1/n sum_k w_k (Re X[k] cos - Im X[k] sin), w_k = 2 but for DC and Nyquist.
            for k in 0..rows {
                let w = if k == 0 || (n % 2 == 0 && k == n / 2) { 1.0 } else { 2.0 } / n as f64;
                for t in 0..n {
                    let a = angle(k, t);
                    m[(k * c) * cols + t] = w * a.cos();
                    if c == 2 {
                        m[(k * c + 1) * cols + t] = -w * a.sin();
                    }
                }
            }
        } else {
            let (sign, scale) = if self.inverse { (1.0, 1.0 / n as f64) } else { (-1.0, 1.0) };
            for j in 0..rows {
                for k in 0..self.bins {
                    let a = angle(j, k);
                    let (cos, sin) = (a.cos() * scale, sign * a.sin() * scale);
                    m[(j * c) * cols + 2 * k] = cos;
                    m[(j * c) * cols + 2 * k + 1] = sin;
                    if c == 2 {
                        m[(j * c + 1) * cols + 2 * k] = -sin;
                        m[(j * c + 1) * cols + 2 * k + 1] = cos;
                    }
                }
            }
        }
        // Rounded once, on the host (GPUs have no float64).
        let rounded: Vec<f32> = m.iter().map(|&v| v as f32).collect();
        let matrix = Array::from_slice(&rounded, &[(rows * c) as i64, cols as i64])?;
        Ok(ops::astype(&matrix, dtype, s)?)
    }
}
