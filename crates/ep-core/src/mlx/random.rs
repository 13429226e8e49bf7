//! MLX's random generators. Each takes an optional key: `None` draws from MLX's global key
//! sequence (new values on every call), a key from [`key`] draws the same values every time.
//! A traced (compiled) graph would hold the key it drew while tracing, so lowerings that use
//! these run eagerly.

use super::ops::dims;
use super::{Array, Dtype, Result, Stream, check};

fn key_or_null(key: Option<&Array>) -> mlx_sys::mlx_array {
    key.map_or(mlx_sys::mlx_array { ctx: std::ptr::null_mut() }, |k| k.0)
}

/// The key of `seed`.
pub fn key(seed: u64) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: `out` is an array handle this function owns.
    check(unsafe { mlx_sys::mlx_random_key(&mut out.0, seed) })?;
    Ok(out)
}

/// Uniform in `[low, high)` (broadcast to `shape`).
pub fn uniform(
    low: &Array,
    high: &Array,
    shape: &[i64],
    dtype: Dtype,
    key: Option<&Array>,
    s: &Stream,
) -> Result<Array> {
    let shape = dims(shape)?;
    let mut out = Array::empty();
    // SAFETY: valid handles; `shape` outlives the call; a null key is allowed.
    check(unsafe {
        mlx_sys::mlx_random_uniform(
            &mut out.0,
            low.0,
            high.0,
            shape.as_ptr(),
            shape.len(),
            dtype.to_raw(),
            key_or_null(key),
            s.0,
        )
    })?;
    Ok(out)
}

/// Normal with mean `loc` and standard deviation `scale`.
pub fn normal(shape: &[i64], dtype: Dtype, loc: f32, scale: f32, key: Option<&Array>, s: &Stream) -> Result<Array> {
    let shape = dims(shape)?;
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe {
        mlx_sys::mlx_random_normal(
            &mut out.0,
            shape.as_ptr(),
            shape.len(),
            dtype.to_raw(),
            loc,
            scale,
            key_or_null(key),
            s.0,
        )
    })?;
    Ok(out)
}

/// `true` with probability `p` (broadcast to `shape`), as bool.
pub fn bernoulli(p: &Array, shape: &[i64], key: Option<&Array>, s: &Stream) -> Result<Array> {
    let shape = dims(shape)?;
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe {
        mlx_sys::mlx_random_bernoulli(&mut out.0, p.0, shape.as_ptr(), shape.len(), key_or_null(key), s.0)
    })?;
    Ok(out)
}

/// `samples` draws per row of the categorical distribution `logits` (unnormalized log
/// probabilities along `axis`), as uint32 indices.
pub fn categorical(logits: &Array, axis: i32, samples: i32, key: Option<&Array>, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe {
        mlx_sys::mlx_random_categorical_num_samples(&mut out.0, logits.0, axis, samples, key_or_null(key), s.0)
    })?;
    Ok(out)
}
