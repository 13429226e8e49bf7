//! Safe wrappers over the mlx-c operations the lowerings use. Each returns a new lazy array;
//! nothing is computed until an evaluation.

use super::{Array, Dtype, Result, Stream, check};
use std::ffi::c_int;

macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident => $raw:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(a: &Array, s: &Stream) -> Result<Array> {
            let mut out = Array::empty();
            // SAFETY: `out` is a fresh handle that mlx-c fills; inputs are valid handles.
            check(unsafe { mlx_sys::$raw(&mut out.0, a.0, s.0) })?;
            Ok(out)
        }
    )*};
}

macro_rules! binary {
    ($($(#[$doc:meta])* $name:ident => $raw:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(a: &Array, b: &Array, s: &Stream) -> Result<Array> {
            let mut out = Array::empty();
            // SAFETY: `out` is a fresh handle that mlx-c fills; inputs are valid handles.
            check(unsafe { mlx_sys::$raw(&mut out.0, a.0, b.0, s.0) })?;
            Ok(out)
        }
    )*};
}

unary! {
    exp => mlx_exp;
    tanh => mlx_tanh;
    sigmoid => mlx_sigmoid;
    negative => mlx_negative;
    abs => mlx_abs;
    sqrt => mlx_sqrt;
    log => mlx_log;
    sin => mlx_sin;
    cos => mlx_cos;
    tan => mlx_tan;
    arcsin => mlx_arcsin;
    arccos => mlx_arccos;
    arctan => mlx_arctan;
    sinh => mlx_sinh;
    cosh => mlx_cosh;
    arcsinh => mlx_arcsinh;
    arccosh => mlx_arccosh;
    arctanh => mlx_arctanh;
    erf => mlx_erf;
    floor => mlx_floor;
    ceil => mlx_ceil;
    reciprocal => mlx_reciprocal;
    sign => mlx_sign;
    /// Reverses all axes.
    transpose => mlx_transpose;
}

binary! {
    /// Broadcasting addition.
    add => mlx_add;
    subtract => mlx_subtract;
    multiply => mlx_multiply;
    divide => mlx_divide;
    maximum => mlx_maximum;
    minimum => mlx_minimum;
    /// Batched matrix product with NumPy semantics.
    matmul => mlx_matmul;
}

/// Rounds to the nearest integer, halves to even.
pub fn round(a: &Array, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_round(&mut out.0, a.0, 0, s.0) })?;
    Ok(out)
}

/// `alpha * (a @ b) + beta * c`. Not safe in a shapeless-compiled graph (MLX 0.32.2 keeps the
/// traced shape of `c`).
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_addmm(&mut out.0, c.0, a.0, b.0, alpha, beta, s.0) })?;
    Ok(out)
}

/// Softmax along one axis (negative axes count from the end).
pub fn softmax(a: &Array, axis: i32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_softmax_axis(&mut out.0, a.0, axis as c_int, true, s.0) })?;
    Ok(out)
}

pub fn astype(a: &Array, dtype: Dtype, s: &Stream) -> Result<Array> {
    if a.dtype() == dtype {
        return Ok(a.clone());
    }
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_astype(&mut out.0, a.0, dtype.to_raw(), s.0) })?;
    Ok(out)
}

pub fn reshape(a: &Array, shape: &[i64], s: &Stream) -> Result<Array> {
    let shape = dims(shape);
    let mut out = Array::empty();
    // SAFETY: `shape` outlives the call.
    check(unsafe { mlx_sys::mlx_reshape(&mut out.0, a.0, shape.as_ptr(), shape.len(), s.0) })?;
    Ok(out)
}

/// Permutes axes.
pub fn transpose_axes(a: &Array, axes: &[i32], s: &Stream) -> Result<Array> {
    let axes: Vec<c_int> = axes.iter().map(|&d| d as c_int).collect();
    let mut out = Array::empty();
    // SAFETY: `axes` outlives the call.
    check(unsafe { mlx_sys::mlx_transpose_axes(&mut out.0, a.0, axes.as_ptr(), axes.len(), s.0) })?;
    Ok(out)
}

/// A row-major contiguous version of `a` (a no-op when it already is).
pub fn contiguous(a: &Array, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_contiguous(&mut out.0, a.0, false, s.0) })?;
    Ok(out)
}

/// `a` scaled by a float constant, keeping `a`'s dtype.
pub fn scale(a: &Array, factor: f32, s: &Stream) -> Result<Array> {
    let f = astype(&Array::scalar_f32(factor), a.dtype(), s)?;
    multiply(a, &f, s)
}

fn dims(v: &[i64]) -> Vec<c_int> {
    v.iter().map(|&d| d as c_int).collect()
}

/// `a[start:stop]` along every axis (unit strides).
pub fn slice(a: &Array, start: &[i64], stop: &[i64], s: &Stream) -> Result<Array> {
    let (start, stop) = (dims(start), dims(stop));
    let strides = vec![1 as c_int; start.len()];
    let mut out = Array::empty();
    // SAFETY: the index vectors outlive the call.
    check(unsafe {
        mlx_sys::mlx_slice(
            &mut out.0,
            a.0,
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s.0,
        )
    })?;
    Ok(out)
}

/// `src` with `src[start:stop] = update` (unit strides); `src` itself is unchanged.
pub fn slice_update(src: &Array, update: &Array, start: &[i64], stop: &[i64], s: &Stream) -> Result<Array> {
    let (start, stop) = (dims(start), dims(stop));
    let strides = vec![1 as c_int; start.len()];
    let mut out = Array::empty();
    // SAFETY: the index vectors outlive the call.
    check(unsafe {
        mlx_sys::mlx_slice_update(
            &mut out.0,
            src.0,
            update.0,
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s.0,
        )
    })?;
    Ok(out)
}
