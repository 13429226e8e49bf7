//! Safe wrappers over MLX's fused ("fast") kernels and its affine quantization: RMS norm,
//! rotary embedding, attention, quantize/dequantize and the quantized matmul, and the gathered
//! matmul of mixtures of experts. Re-exported through [`super::ops`] with the other operations.

use super::{Array, Dtype, Result, Stream, check};
use std::ffi::c_int;

fn optional_int(v: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int { value: v as c_int, has_value: true }
}

/// The packed form of `w` (`[.., K]`, K a multiple of `group_size`) in MLX's affine quantized
/// layout: `(packed uint32 [.., K * bits / 32], scales [.., K / group_size], biases)`, with
/// `w ≈ scales * q + biases` per group.
pub fn quantize(w: &Array, group_size: i32, bits: i32, s: &Stream) -> Result<(Array, Array, Array)> {
    let mut out = super::VectorArray::new();
    let mode = c"affine";
    let none = Array::empty();
    // SAFETY: `out` is a vector this function owns (mlx-c replaces its contents); inputs are
    // valid handles and `mode` is a static C string.
    check(unsafe {
        mlx_sys::mlx_quantize(&mut out.0, w.0, optional_int(group_size), optional_int(bits), mode.as_ptr(), none.0, s.0)
    })?;
    let parts = out.to_vec()?;
    match <[Array; 3]>::try_from(parts) {
        Ok([q, scales, biases]) => Ok((q, scales, biases)),
        Err(p) => Err(super::MlxError(format!("quantize returned {} arrays", p.len()))),
    }
}

/// `x @ dequantize(w).T` (`transpose`) or `x @ dequantize(w)`, for `w` in MLX's affine layout
/// (see [`quantize`]), without materialising the dequantized weight.
#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    transpose: bool,
    group_size: i32,
    bits: i32,
    s: &Stream,
) -> Result<Array> {
    let mut out = Array::empty();
    let mode = c"affine";
    // SAFETY: as above; `mode` is a static C string.
    check(unsafe {
        mlx_sys::mlx_quantized_matmul(
            &mut out.0,
            x.0,
            w.0,
            scales.0,
            biases.0,
            transpose,
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            s.0,
        )
    })?;
    Ok(out)
}

/// The weight `scales * q + biases` of an affine-quantized `w`, as `dtype`.
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    dtype: Dtype,
    s: &Stream,
) -> Result<Array> {
    let mut out = Array::empty();
    let mode = c"affine";
    let none = Array::empty();
    let dt = mlx_sys::mlx_optional_dtype { value: dtype.to_raw(), has_value: true };
    // SAFETY: as above.
    check(unsafe {
        mlx_sys::mlx_dequantize(
            &mut out.0,
            w.0,
            scales.0,
            biases.0,
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            none.0,
            dt,
            s.0,
        )
    })?;
    Ok(out)
}

/// MLX's fused rotary embedding over the last axis of `x` (`[.., S, D]`, positions counted
/// along the second-to-last axis from `offset`): the first `dims` features are rotated by
/// `freqs` (`[dims / 2]` inverse frequencies), the rest pass through. `traditional` rotates
/// adjacent pairs (interleaved), otherwise the two halves.
pub fn rope(x: &Array, dims: i32, traditional: bool, freqs: &Array, offset: i32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    let base = mlx_sys::mlx_optional_float { value: 0.0, has_value: false };
    // SAFETY: as above.
    check(unsafe {
        mlx_sys::mlx_fast_rope(&mut out.0, x.0, dims as c_int, traditional, base, 1.0, offset, freqs.0, s.0)
    })?;
    Ok(out)
}

/// MLX's fused attention `softmax(q k^T * scale + mask) v` over `[B, heads, S, D]` inputs
/// (grouped key/value heads allowed). `mask` is an additive or boolean array broadcastable to
/// the scores, or `None`; `causal` asks for MLX's own lower-right causal mask instead.
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<&Array>,
    causal: bool,
    s: &Stream,
) -> Result<Array> {
    let mut out = Array::empty();
    let none = Array::empty();
    let (mode, mask) = match (mask, causal) {
        (Some(m), _) => (c"array", m),
        (None, true) => (c"causal", &none),
        (None, false) => (c"", &none),
    };
    // SAFETY: as above.
    check(unsafe {
        mlx_sys::mlx_fast_scaled_dot_product_attention(
            &mut out.0,
            q.0,
            k.0,
            v.0,
            scale,
            mode.as_ptr(),
            mask.0,
            none.0,
            false,
            s.0,
        )
    })?;
    Ok(out)
}

/// MLX's fused RMS normalisation over the last axis: `x / sqrt(mean(x^2) + eps) * weight`.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_fast_rms_norm(&mut out.0, x.0, weight.0, eps, s.0) })?;
    Ok(out)
}

/// `a[lhs] @ b[rhs]` over the batch dimensions: `a` `[.., M, K]`, `b` `[.., K, N]`, each index
/// array (same shape, or broadcast) picking a matrix of its operand's flattened batch; `None`
/// takes the operand's batch as it is. Each product reads its own matrix only (a mixture of
/// experts' token-to-expert products without gathering the weights).
pub fn gather_mm(a: &Array, b: &Array, lhs: Option<&Array>, rhs: Option<&Array>, s: &Stream) -> Result<Array> {
    let null = mlx_sys::mlx_array { ctx: std::ptr::null_mut() };
    let mut out = Array::empty();
    // SAFETY: valid handles; mlx-c accepts null index arrays.
    check(unsafe {
        mlx_sys::mlx_gather_mm(&mut out.0, a.0, b.0, lhs.map_or(null, |x| x.0), rhs.map_or(null, |x| x.0), false, s.0)
    })?;
    Ok(out)
}
