//! Safe wrappers over the mlx-c operations the lowerings use. Each returns a new lazy array;
//! nothing is computed until an evaluation.

use super::{Array, Dtype, Result, Stream, check};
use std::ffi::c_int;

pub use super::fast::{
    dequantize, gather_mm, quantize, quantized_matmul, rms_norm, rope, scaled_dot_product_attention,
};
pub use super::slicing::*;

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
    isnan => mlx_isnan;
    isinf => mlx_isinf;
    isposinf => mlx_isposinf;
    isneginf => mlx_isneginf;
    logical_not => mlx_logical_not;
    bitwise_invert => mlx_bitwise_invert;
    square => mlx_square;
    rsqrt => mlx_rsqrt;
    log1p => mlx_log1p;
    expm1 => mlx_expm1;
    trunc => mlx_trunc;
    /// A copy (a new node in the graph).
    copy => mlx_copy;
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
    power => mlx_power;
    /// Remainder with the sign of the divisor (Python's `%`).
    remainder => mlx_remainder;
    floor_divide => mlx_floor_divide;
    equal => mlx_equal;
    not_equal => mlx_not_equal;
    less => mlx_less;
    less_equal => mlx_less_equal;
    greater => mlx_greater;
    greater_equal => mlx_greater_equal;
    logical_and => mlx_logical_and;
    logical_or => mlx_logical_or;
    bitwise_and => mlx_bitwise_and;
    bitwise_or => mlx_bitwise_or;
    bitwise_xor => mlx_bitwise_xor;
    left_shift => mlx_left_shift;
    right_shift => mlx_right_shift;
    logaddexp => mlx_logaddexp;
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

/// The same bytes read as `dtype` (of the same size: the shape is kept).
pub fn view(a: &Array, dtype: Dtype, s: &Stream) -> Result<Array> {
    if a.dtype() == dtype {
        return Ok(a.clone());
    }
    let mut out = Array::empty();
    // SAFETY: `out` is a fresh handle that mlx-c fills; inputs are valid handles.
    check(unsafe { mlx_sys::mlx_view(&mut out.0, a.0, dtype.to_raw(), s.0) })?;
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
    let f = scalar(f64::from(factor), a.dtype(), s)?;
    multiply(a, &f, s)
}

macro_rules! with_shape {
    ($($(#[$doc:meta])* $name:ident => $raw:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(a: &Array, shape: &[i64], s: &Stream) -> Result<Array> {
            let shape = dims(shape)?;
            let mut out = Array::empty();
            // SAFETY: `shape` outlives the call.
            check(unsafe { mlx_sys::$raw(&mut out.0, a.0, shape.as_ptr(), shape.len(), s.0) })?;
            Ok(out)
        }
    )*};
}

with_shape! {
    reshape => mlx_reshape;
    broadcast_to => mlx_broadcast_to;
    /// Repeats `a` `shape[i]` times along each axis.
    tile => mlx_tile;
}

/// Sizes, positions or widths for MLX, which holds them as 32-bit integers: a value outside
/// that range is an error, never a silently truncated (wrapped) value.
pub(super) fn dims(v: &[i64]) -> Result<Vec<c_int>> {
    v.iter()
        .map(|&d| {
            c_int::try_from(d).map_err(|_| {
                super::MlxError(format!("{d} in {v:?} is outside MLX's 32-bit range of sizes and positions"))
            })
        })
        .collect()
}

/// `cond ? x : y`, broadcasting.
pub fn where_(cond: &Array, x: &Array, y: &Array, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_where(&mut out.0, cond.0, x.0, y.0, s.0) })?;
    Ok(out)
}

/// `min(max(a, lo), hi)`; either bound may be absent.
pub fn clip(a: &Array, lo: Option<&Array>, hi: Option<&Array>, s: &Stream) -> Result<Array> {
    let null = mlx_sys::mlx_array { ctx: std::ptr::null_mut() };
    let mut out = Array::empty();
    // SAFETY: mlx-c accepts null bounds.
    check(unsafe { mlx_sys::mlx_clip(&mut out.0, a.0, lo.map_or(null, |x| x.0), hi.map_or(null, |x| x.0), s.0) })?;
    Ok(out)
}

/// The axes of `axes` (negative count from the end) whose size is not 1, and the shape the
/// result has without `keepdims`.
fn reducible(a: &Array, axes: &[i32]) -> (Vec<c_int>, Vec<i64>) {
    let shape = a.shape();
    let r = shape.len() as i32;
    let norm: Vec<i32> = axes.iter().map(|&d| if d < 0 { d + r } else { d }).collect();
    let kept: Vec<c_int> =
        norm.iter().copied().filter(|&d| d >= 0 && d < r && shape[d as usize] != 1).map(|d| d as c_int).collect();
    let dropped: Vec<i64> =
        shape.iter().enumerate().filter(|(i, _)| !norm.contains(&(*i as i32))).map(|(_, &d)| d).collect();
    (kept, dropped)
}

macro_rules! reduce_axes {
    ($($(#[$doc:meta])* $name:ident => $raw:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// Size-1 axes are not handed to MLX (0.32.2's CPU reduction crashed on them): reducing
        /// one leaves each element as it is.
        pub fn $name(a: &Array, axes: &[i32], keepdims: bool, s: &Stream) -> Result<Array> {
            let (axes, dropped) = reducible(a, axes);
            let mut out = if axes.is_empty() {
                a.clone()
            } else {
                let mut out = Array::empty();
                // SAFETY: `axes` outlives the call.
                check(unsafe { mlx_sys::$raw(&mut out.0, a.0, axes.as_ptr(), axes.len(), true, s.0) })?;
                out
            };
            if !keepdims {
                out = reshape(&out, &dropped, s)?;
            }
            Ok(out)
        }
    )*};
}

reduce_axes! {
    sum_axes => mlx_sum_axes;
    mean_axes => mlx_mean_axes;
    max_axes => mlx_max_axes;
    min_axes => mlx_min_axes;
    prod_axes => mlx_prod_axes;
    logsumexp_axes => mlx_logsumexp_axes;
    all_axes => mlx_all_axes;
    any_axes => mlx_any_axes;
}

macro_rules! arg_reduce {
    ($($name:ident => $raw:ident;)*) => {$(
        pub fn $name(a: &Array, axis: i32, keepdims: bool, s: &Stream) -> Result<Array> {
            let mut out = Array::empty();
            // SAFETY: as above.
            check(unsafe { mlx_sys::$raw(&mut out.0, a.0, axis as c_int, keepdims, s.0) })?;
            Ok(out)
        }
    )*};
}

arg_reduce! {
    argmax_axis => mlx_argmax_axis;
    argmin_axis => mlx_argmin_axis;
}

macro_rules! with_axis {
    ($($(#[$doc:meta])* $name:ident => $raw:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(a: &Array, axis: i32, s: &Stream) -> Result<Array> {
            let mut out = Array::empty();
            // SAFETY: as above.
            check(unsafe { mlx_sys::$raw(&mut out.0, a.0, axis as c_int, s.0) })?;
            Ok(out)
        }
    )*};
}

with_axis! {
    sort_axis => mlx_sort_axis;
    /// Indices that sort along `axis` (stable).
    argsort_axis => mlx_argsort_axis;
    expand_dims => mlx_expand_dims;
}

/// Lower (`tril`) or upper (`triu`) triangle of the last two dims, from diagonal `k`.
pub fn tril(a: &Array, k: i32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_tril(&mut out.0, a.0, k as c_int, s.0) })?;
    Ok(out)
}

pub fn triu(a: &Array, k: i32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_triu(&mut out.0, a.0, k as c_int, s.0) })?;
    Ok(out)
}

/// `a.take(indices, axis)`: gathers whole slices along `axis` (indices must be in range).
pub fn take(a: &Array, indices: &Array, axis: i32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_take_axis(&mut out.0, a.0, indices.0, axis as c_int, s.0) })?;
    Ok(out)
}

/// Gathers elements along `axis` at `indices` (same rank as `a`).
pub fn take_along_axis(a: &Array, indices: &Array, axis: i32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_take_along_axis(&mut out.0, a.0, indices.0, axis as c_int, s.0) })?;
    Ok(out)
}

/// `a` with `values` written along `axis` at `indices`.
pub fn put_along_axis(a: &Array, indices: &Array, values: &Array, axis: i32, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_put_along_axis(&mut out.0, a.0, indices.0, values.0, axis as c_int, s.0) })?;
    Ok(out)
}

pub fn concatenate(arrays: &[Array], axis: i32, s: &Stream) -> Result<Array> {
    let v = super::VectorArray::from_arrays(arrays)?;
    let mut out = Array::empty();
    // SAFETY: `v` outlives the call.
    check(unsafe { mlx_sys::mlx_concatenate_axis(&mut out.0, v.0, axis as c_int, s.0) })?;
    Ok(out)
}

pub fn stack(arrays: &[Array], axis: i32, s: &Stream) -> Result<Array> {
    let v = super::VectorArray::from_arrays(arrays)?;
    let mut out = Array::empty();
    // SAFETY: `v` outlives the call.
    check(unsafe { mlx_sys::mlx_stack_axis(&mut out.0, v.0, axis as c_int, s.0) })?;
    Ok(out)
}

/// Splits along `axis` at the given boundaries.
pub fn split_at(a: &Array, boundaries: &[i64], axis: i32, s: &Stream) -> Result<Vec<Array>> {
    let b = dims(boundaries)?;
    let mut out = super::VectorArray::new();
    // SAFETY: `b` outlives the call; `out` is a valid vector handle.
    check(unsafe { mlx_sys::mlx_split_sections(&mut out.0, a.0, b.as_ptr(), b.len(), axis as c_int, s.0) })?;
    out.to_vec()
}

/// Pads every axis by `(low, high)` with `value` (mode `"constant"`, `"edge"` or `"reflect"`).
pub fn pad(a: &Array, low: &[i64], high: &[i64], value: &Array, mode: &str, s: &Stream) -> Result<Array> {
    let axes: Vec<c_int> = (0..low.len() as c_int).collect();
    let (lo, hi) = (dims(low)?, dims(high)?);
    let mode = std::ffi::CString::new(mode).map_err(|_| super::MlxError("pad mode has a NUL".into()))?;
    let mut out = Array::empty();
    // SAFETY: every buffer outlives the call.
    check(unsafe {
        mlx_sys::mlx_pad(
            &mut out.0,
            a.0,
            axes.as_ptr(),
            axes.len(),
            lo.as_ptr(),
            lo.len(),
            hi.as_ptr(),
            hi.len(),
            value.0,
            mode.as_ptr(),
            s.0,
        )
    })?;
    Ok(out)
}

/// Cumulative sum (`product: false`) or product along `axis`, in `a`'s dtype. An empty `a`
/// is its own answer (MLX 0.32.2's CPU scan divides by the empty axis: SIGFPE).
pub fn cumulative(a: &Array, axis: i32, product: bool, reverse: bool, inclusive: bool, s: &Stream) -> Result<Array> {
    if a.size() == 0 {
        return Ok(a.clone());
    }
    let f = if product { mlx_sys::mlx_cumprod_axis } else { mlx_sys::mlx_cumsum_axis };
    let keep = mlx_sys::mlx_optional_dtype { value: a.dtype().to_raw(), has_value: false };
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { f(&mut out.0, a.0, axis as c_int, reverse, inclusive, keep, s.0) })?;
    Ok(out)
}

/// `[start, stop)` by `step`, of `dtype`.
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype, s: &Stream) -> Result<Array> {
    let mut out = Array::empty();
    // SAFETY: as above.
    check(unsafe { mlx_sys::mlx_arange(&mut out.0, start, stop, step, dtype.to_raw(), s.0) })?;
    Ok(out)
}

/// An array of `shape` filled with the scalar `value`, as `dtype`.
pub fn full(shape: &[i64], value: &Array, dtype: Dtype, s: &Stream) -> Result<Array> {
    let shape = dims(shape)?;
    let mut out = Array::empty();
    // SAFETY: `shape` outlives the call.
    check(unsafe { mlx_sys::mlx_full(&mut out.0, shape.as_ptr(), shape.len(), value.0, dtype.to_raw(), s.0) })?;
    Ok(out)
}

/// N-d convolution of `input` `[N, *spatial, C_in]` with `weight` `[C_out, *kernel, C_in/groups]`
/// (`flip`: the kernel reversed along its spatial axes, a true convolution).
#[allow(clippy::too_many_arguments)]
pub fn conv_general(
    input: &Array,
    weight: &Array,
    stride: &[i64],
    pad_lo: &[i64],
    pad_hi: &[i64],
    kernel_dilation: &[i64],
    input_dilation: &[i64],
    groups: i64,
    flip: bool,
    s: &Stream,
) -> Result<Array> {
    let (st, lo, hi, kd, id) =
        (dims(stride)?, dims(pad_lo)?, dims(pad_hi)?, dims(kernel_dilation)?, dims(input_dilation)?);
    let mut out = Array::empty();
    // SAFETY: every buffer outlives the call.
    check(unsafe {
        mlx_sys::mlx_conv_general(
            &mut out.0,
            input.0,
            weight.0,
            st.as_ptr(),
            st.len(),
            lo.as_ptr(),
            lo.len(),
            hi.as_ptr(),
            hi.len(),
            kd.as_ptr(),
            kd.len(),
            id.as_ptr(),
            id.len(),
            groups as c_int,
            flip,
            s.0,
        )
    })?;
    Ok(out)
}

/// How [`scatter`] combines an update with the value already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterReduce {
    /// The update replaces the value.
    None,
    Add,
    Mul,
    Max,
    Min,
}

/// Scatter along `axes`: `indices` (one array per axis, broadcast together to the index
/// shape) select where each slice of `updates` (index shape, then the slice shape, 1 on every
/// scattered axis) goes.
pub fn scatter(
    a: &Array,
    indices: &[Array],
    updates: &Array,
    axes: &[i32],
    reduce: ScatterReduce,
    s: &Stream,
) -> Result<Array> {
    let v = super::VectorArray::from_arrays(indices)?;
    let axes: Vec<c_int> = axes.iter().map(|&d| d as c_int).collect();
    let mut out = Array::empty();
    let f = match reduce {
        ScatterReduce::None => mlx_sys::mlx_scatter,
        ScatterReduce::Add => mlx_sys::mlx_scatter_add,
        ScatterReduce::Mul => mlx_sys::mlx_scatter_prod,
        ScatterReduce::Max => mlx_sys::mlx_scatter_max,
        ScatterReduce::Min => mlx_sys::mlx_scatter_min,
    };
    // SAFETY: `v` and `axes` outlive the call.
    check(unsafe { f(&mut out.0, a.0, v.0, updates.0, axes.as_ptr(), axes.len(), s.0) })?;
    Ok(out)
}

/// A scalar of `dtype` holding `v` (integers exactly, up to 2^53; floats rounded to `dtype`
/// and kept exact inside compiled kernels, see [`exact_float`]).
pub fn scalar(v: f64, dtype: Dtype, s: &Stream) -> Result<Array> {
    // An integer that the type holds is made in that type: a cast would be one more operation
    // in every graph that uses the constant (and in the chains MLX fuses).
    macro_rules! exact { ($($d:ident => $t:ty),*) => { match dtype {
        $(Dtype::$d if v.fract() == 0.0 && v >= <$t>::MIN as f64 && v <= <$t>::MAX as f64 => {
            return Array::from_slice(&[v as $t], &[]);
        })*
        _ => {}
    } } }
    exact!(I8 => i8, I16 => i16, I32 => i32, U8 => u8, U16 => u16, U32 => u32);
    let a = if dtype == Dtype::F64 {
        exact_float(v, Dtype::F64, &[], s)?
    } else if dtype.is_float() {
        exact_float(f64::from(v as f32), Dtype::F32, &[], s)?
    } else if dtype == Dtype::U64 {
        Array::from_slice(&[v as u64], &[])?
    } else {
        Array::from_slice(&[v as i64], &[])?
    };
    astype(&a, dtype, s)
}

/// Whether a float constant survives MLX's compiled kernels, which write each scalar constant
/// into the generated source with `digits10 + 1` significant digits (7 for float32, 16 for
/// float64; MLX 0.32.2) and so read back a neighbouring value for many constants (ln 16 came
/// back one ulp low): `v`, printed that way and parsed as the kernel's compiler parses it.
pub fn survives_kernel_source(v: f64, dtype: Dtype) -> bool {
    if !v.is_finite() {
        return true; // written as INFINITY / NAN
    }
    match dtype {
        Dtype::F64 => format!("{v:.15e}").parse::<f64>().is_ok_and(|p| p == v),
        _ => format!("{:.6e}", v as f32).parse::<f64>().is_ok_and(|p| p as f32 == v as f32),
    }
}

/// A float32 or float64 array of `shape` (one element) holding `v` exactly, also inside a
/// compiled kernel: a value that would not survive the kernel's source text (see
/// [`survives_kernel_source`]) is built as `m * 2^e` from integer constants, which the source
/// holds exactly, in a few fused elementwise operations.
pub fn exact_float(v: f64, dtype: Dtype, shape: &[i64], s: &Stream) -> Result<Array> {
    if dtype == Dtype::F64 {
        if survives_kernel_source(v, dtype) {
            return Array::from_slice(&[v], shape);
        }
    } else {
        let v = v as f32;
        if survives_kernel_source(f64::from(v), Dtype::F32) {
            return Array::from_slice(&[v], shape);
        }
    }
    // v = m * 2^e with an odd integer m of at most 53 bits.
    let bits = v.to_bits();
    let (negative, exponent, fraction) = (bits >> 63 == 1, ((bits >> 52) & 0x7ff) as i32, bits & ((1 << 52) - 1));
    let (mut m, mut e) =
        if exponent == 0 { (fraction as i64, -1074) } else { ((fraction | 1 << 52) as i64, exponent - 1075) };
    let zeros = m.trailing_zeros().min(63) as i32;
    m >>= zeros;
    e += zeros;
    let m = if negative { -m } else { m };
    // float32 needs 24 bits: an int32 constant, which every backend computes with.
    let m = match i32::try_from(m) {
        Ok(m) if dtype == Dtype::F32 => Array::from_slice(&[m], shape)?,
        _ => Array::from_slice(&[m], shape)?,
    };
    let mut a = astype(&m, dtype, s)?;
    // Powers of two scale exactly; steps of at most 2^30 keep each factor an exact int32.
    while e != 0 {
        let k = e.abs().min(30);
        let factor = astype(&Array::from_slice(&[1i32 << k], shape)?, dtype, s)?;
        a = if e > 0 { multiply(&a, &factor, s)? } else { divide(&a, &factor, s)? };
        e -= k * e.signum();
    }
    Ok(a)
}

/// The array's shape as a 1-D int64 array (a constant: not a tracer inside a compiled trace).
pub fn shape_of(a: &Array) -> Result<Array> {
    let shape = a.shape();
    Array::from_slice(&shape, &[shape.len() as i64])
}

/// Einstein summation over `operands` (NumPy subscripts, `->` optional).
pub fn einsum(subscripts: &str, operands: &[Array], s: &Stream) -> Result<Array> {
    let spec =
        std::ffi::CString::new(subscripts).map_err(|_| super::MlxError("einsum subscripts have a NUL".into()))?;
    let v = super::VectorArray::from_arrays(operands)?;
    let mut out = Array::empty();
    // SAFETY: `spec` and `v` outlive the call.
    check(unsafe { mlx_sys::mlx_einsum(&mut out.0, spec.as_ptr(), v.0, s.0) })?;
    Ok(out)
}
