//! Elementwise activations that ops name as attributes rather than nodes (the recurrent ops'
//! `activations`, ORT's fused Gemm/Conv `activation`): one value per function with its
//! parameters, applied in the input's type. Each op crate parses its own attribute spelling and
//! defaults into an [`Activation`].

use crate::Result;
use crate::mlx::{Array, Stream, ops};

/// One activation with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `x`.
    Identity,
    Relu,
    Tanh,
    Sigmoid,
    /// `x * sigmoid(x)`.
    Silu,
    /// `alpha * x + beta`.
    Affine(f64, f64),
    /// `x` where `x >= 0`, else `alpha * x`.
    LeakyRelu(f64),
    /// `x` where `x > alpha`, else 0.
    ThresholdedRelu(f64),
    /// `alpha * tanh(beta * x)`.
    ScaledTanh(f64, f64),
    /// `min(max(alpha * x + beta, 0), 1)`.
    HardSigmoid(f64, f64),
    /// `x` where `x >= 0`, else `alpha * (e^x - 1)`.
    Elu(f64),
    /// `x / (1 + |x|)`.
    Softsign,
    /// `log(1 + e^x)`.
    Softplus,
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    Gelu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
    /// `min(max(x, lo), hi)`; a NaN bound bounds nothing (as ORT's CPU EP's vector min and max
    /// leave it).
    Clip(f64, f64),
}

impl Activation {
    pub fn apply(self, x: &Array, s: &Stream) -> Result<Array> {
        let dt = x.dtype();
        let k = |v: f64| ops::scalar(v, dt, s);
        let zero = k(0.0)?;
        Ok(match self {
            Activation::Identity => x.clone(),
            Activation::Relu => ops::maximum(x, &zero, s)?,
            Activation::Tanh => ops::tanh(x, s)?,
            Activation::Sigmoid => ops::sigmoid(x, s)?,
            Activation::Silu => ops::multiply(x, &ops::sigmoid(x, s)?, s)?,
            Activation::Affine(a, b) => ops::add(&ops::multiply(x, &k(a)?, s)?, &k(b)?, s)?,
            Activation::LeakyRelu(a) => {
                ops::where_(&ops::greater_equal(x, &zero, s)?, x, &ops::multiply(x, &k(a)?, s)?, s)?
            }
            Activation::ThresholdedRelu(a) => ops::where_(&ops::greater(x, &k(a)?, s)?, x, &zero, s)?,
            Activation::ScaledTanh(a, b) => ops::multiply(&ops::tanh(&ops::multiply(x, &k(b)?, s)?, s)?, &k(a)?, s)?,
            Activation::HardSigmoid(a, b) => {
                let y = ops::add(&ops::multiply(x, &k(a)?, s)?, &k(b)?, s)?;
                ops::clip(&y, Some(&zero), Some(&k(1.0)?), s)?
            }
            Activation::Elu(a) => {
                let neg = ops::multiply(&ops::expm1(x, s)?, &k(a)?, s)?;
                ops::where_(&ops::greater_equal(x, &zero, s)?, x, &neg, s)?
            }
            Activation::Softsign => ops::divide(x, &ops::add(&ops::abs(x, s)?, &k(1.0)?, s)?, s)?,
            Activation::Softplus => ops::logaddexp(x, &zero, s)?,
            Activation::Gelu => {
                let inner = ops::erf(&ops::multiply(x, &k(std::f64::consts::FRAC_1_SQRT_2)?, s)?, s)?;
                ops::multiply(&ops::multiply(x, &k(0.5)?, s)?, &ops::add(&inner, &k(1.0)?, s)?, s)?
            }
            Activation::GeluTanh => {
                let cube = ops::multiply(&ops::multiply(x, x, s)?, x, s)?;
                let inner = ops::add(x, &ops::multiply(&cube, &k(0.044715)?, s)?, s)?;
                let t = ops::tanh(&ops::multiply(&inner, &k((2.0 / std::f64::consts::PI).sqrt())?, s)?, s)?;
                ops::multiply(&ops::multiply(x, &k(0.5)?, s)?, &ops::add(&t, &k(1.0)?, s)?, s)?
            }
            Activation::Clip(lo, hi) => {
                let y = if lo.is_nan() { x.clone() } else { ops::maximum(x, &k(lo)?, s)? };
                if hi.is_nan() { y } else { ops::minimum(&y, &k(hi)?, s)? }
            }
        })
    }
}
