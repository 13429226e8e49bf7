//! Slices, slice updates and the shape-agnostic forms a shapeless-compiled graph needs (a
//! gather of consecutive entries, a flattening, an element count computed when evaluated, a
//! fusion barrier); re-exported by [`super::ops`].

use super::ops::{dims, take};
use super::{Array, Dtype, Result, Stream, check};
use std::ffi::c_int;

/// `a` as one dimension (a view where it is contiguous); shape-agnostic in a shapeless trace.
pub fn flatten(a: &Array, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_flatten(&mut out.0, a.0, 0, -1, s.0) })?;
    Ok(out)
}

/// `a[start:stop]` along every axis (unit strides).
pub fn slice(a: &Array, start: &[i64], stop: &[i64], s: &Stream) -> Result<Array> {
    slice_strided(a, start, stop, &vec![1; start.len()], s)
}

/// `a[start:stop:strides]` along every axis, as numpy reads it (a negative stride walks
/// down from `start`; a negative bound counts from the end): a view.
pub fn slice_strided(a: &Array, start: &[i64], stop: &[i64], strides: &[i64], s: &Stream) -> Result<Array> {
    let (start, stop, strides) = (dims(start)?, dims(stop)?, dims(strides)?);
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

pub fn slice_update(src: &Array, update: &Array, start: &[i64], stop: &[i64], s: &Stream) -> Result<Array> {
    let (start, stop) = (dims(start)?, dims(stop)?);
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

/// `len` consecutive entries of `a` from `start` along `axis`, as a gather with constant
/// indices: unlike a slice, it replays in a shapeless-compiled graph while other dimensions
/// of `a` change (a slice bakes the traced shape of every axis).
pub fn take_range(a: &Array, start: i64, len: i64, axis: i32, s: &Stream) -> Result<Array> {
    let size = a.shape();
    let dim = usize::try_from(axis).ok().and_then(|d| size.get(d)).copied();
    if dim.is_none_or(|d| start < 0 || len < 0 || start + len > d) {
        return Err(super::MlxError(format!("entries [{start}, {}) of axis {axis} of {size:?}", start + len)));
    }
    let idx: Vec<i32> = (start..start + len).map(|i| i as i32).collect();
    take(a, &Array::from_slice(&idx, &[len])?, axis, s)
}

/// The number of elements of `a` over `axes` (the product of those dimensions), as a scalar
/// array of `dtype` computed when evaluated: unlike a shape read while building, a
/// shapeless-compiled graph replays it right when the dimensions change.
pub fn number_of_elements(a: &Array, axes: &[i32], dtype: Dtype, s: &Stream) -> Result<Array> {
    let axes: Vec<c_int> = axes.iter().map(|&d| d as c_int).collect();
    let mut out = Array::empty();
    // SAFETY: `axes` outlives the call.
    check(unsafe {
        mlx_sys::mlx_number_of_elements(&mut out.0, a.0, axes.as_ptr(), axes.len(), false, dtype.to_raw(), s.0)
    })?;
    Ok(out)
}

/// `a` unchanged, as an array no chain of elementwise operations crosses: MLX's compiler fuses
/// elementwise operations and broadcasts only, so an added unit axis taken away again ends a
/// chain (shape-agnostic, so a shapeless trace replays it). On CUDA each fused chain is a
/// kernel NVRTC compiles on a process's first meeting with it (seconds, with an empty kernel
/// cache), where a lone operation runs one of MLX's precompiled kernels.
pub fn unfused(a: &Array, s: &Stream) -> Result<Array> {
    let wide = super::ops::expand_dims(a, 0, s)?;
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_squeeze_axis(&mut out.0, wide.0, 0, s.0) })?;
    Ok(out)
}
