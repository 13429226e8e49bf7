//! [`Array`]: an owned mlx-c array handle (freed on drop), built from host data or borrowed
//! for one run, with shape, dtype and host access.

use super::{Dtype, MlxError, Result, Stream, check, init};
use std::ffi::{CStr, c_int};

/// A reference-counted MLX array. Cloning shares the buffer; dropping releases this reference.
pub struct Array(pub(crate) mlx_sys::mlx_array);

// SAFETY: MLX arrays are reference counted with atomic counts; all graph building and
// evaluation is serialised by `mlx::lock()`, so a shared handle is never used concurrently.
unsafe impl Send for Array {}
// SAFETY: as for `Send`: every use of a handle happens under `mlx::lock()`.
unsafe impl Sync for Array {}

impl Array {
    /// An empty handle for an mlx-c call to fill.
    pub(crate) fn empty() -> Array {
        init();
        // SAFETY: creates an empty handle owned by the returned value.
        Array(unsafe { mlx_sys::mlx_array_new() })
    }

    /// A new array holding a copy of `data` (row-major, `dtype` elements).
    pub fn from_bytes(data: &[u8], shape: &[i64], dtype: Dtype) -> Result<Array> {
        init();
        let dims = to_mlx_shape(shape)?;
        let count: usize = dims.iter().map(|&d| d as usize).product();
        let expected = count * dtype.size_in_bytes();
        if data.len() != expected {
            return Err(MlxError(format!(
                "buffer of {} bytes does not match shape {shape:?} of {dtype:?} ({expected} bytes)",
                data.len()
            )));
        }
        // MLX reads `count` elements; an empty tensor still needs a valid pointer.
        static EMPTY: [u8; 8] = [0; 8];
        let ptr = if data.is_empty() { EMPTY.as_ptr() } else { data.as_ptr() };
        // SAFETY: `ptr` holds `expected` readable bytes; mlx-c copies them before returning.
        let raw =
            unsafe { mlx_sys::mlx_array_new_data(ptr.cast(), dims.as_ptr(), dims.len() as c_int, dtype.to_raw()) };
        if raw.ctx.is_null() {
            return Err(MlxError("could not create an array".into()));
        }
        Ok(Array(raw))
    }

    /// An array over `data` without copying it, for the duration of one partition run.
    ///
    /// # Safety
    /// `data` must stay valid and unchanged until every array derived from the returned one
    /// has been evaluated and dropped, and the caller must hold another reference to the
    /// returned array until then (so MLX never donates the buffer to an output and writes into
    /// it). Only for the CPU device (a GPU cannot read host memory in place).
    pub(crate) unsafe fn borrowed(data: &[u8], shape: &[i64], dtype: Dtype) -> Result<Array> {
        init();
        let dims = to_mlx_shape(shape)?;
        let count: usize = dims.iter().map(|&d| d as usize).product();
        if data.len() != count * dtype.size_in_bytes() || data.is_empty() {
            return Err(MlxError(format!(
                "buffer of {} bytes does not match shape {shape:?} of {dtype:?}",
                data.len()
            )));
        }
        unsafe extern "C" fn keep(_: *mut std::ffi::c_void) {}
        // SAFETY: per the caller, `data` outlives the array; the no-op deleter leaves it to ORT.
        let raw = unsafe {
            mlx_sys::mlx_array_new_data_managed(
                data.as_ptr().cast_mut().cast(),
                dims.as_ptr(),
                dims.len() as c_int,
                dtype.to_raw(),
                Some(keep),
            )
        };
        if raw.ctx.is_null() {
            return Err(MlxError("could not create an array".into()));
        }
        Ok(Array(raw))
    }

    /// A new array from typed host data.
    pub fn from_slice<T: Element>(data: &[T], shape: &[i64]) -> Result<Array> {
        // SAFETY: `Element` types are plain old data without padding.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        Array::from_bytes(bytes, shape, T::DTYPE)
    }

    /// A float32 scalar.
    pub fn scalar_f32(v: f32) -> Array {
        init();
        // SAFETY: creates a new handle owned by the returned value.
        Array(unsafe { mlx_sys::mlx_array_new_float(v) })
    }

    pub fn shape(&self) -> Vec<i64> {
        // SAFETY: the shape pointer is valid for `ndim` ints while `self` lives.
        unsafe {
            let n = mlx_sys::mlx_array_ndim(self.0);
            let p = mlx_sys::mlx_array_shape(self.0);
            if n == 0 || p.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts(p, n).iter().map(|&d| d as i64).collect()
        }
    }

    pub fn ndim(&self) -> usize {
        // SAFETY: reads metadata of a valid handle.
        unsafe { mlx_sys::mlx_array_ndim(self.0) }
    }

    pub fn size(&self) -> usize {
        // SAFETY: reads metadata of a valid handle.
        unsafe { mlx_sys::mlx_array_size(self.0) }
    }

    pub fn dtype(&self) -> Dtype {
        // SAFETY: reads metadata of a valid handle.
        let raw = unsafe { mlx_sys::mlx_array_dtype(self.0) };
        Dtype::from_raw(raw).expect("complex arrays are never created by this project")
    }

    /// Evaluates this array (and what it depends on).
    pub fn eval(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { mlx_sys::mlx_array_eval(self.0) })
    }

    /// Evaluates the array if needed and copies its elements, row-major, into `out`.
    pub fn copy_to(&self, out: &mut [u8], stream: &Stream) -> Result<()> {
        // Already evaluated and row-contiguous (a partition's outputs are): copy directly, with
        // no further graph node or evaluation.
        if let Some(bytes) = self.host_bytes() {
            if std::ptr::eq(out.as_ptr(), bytes.as_ptr()) {
                // The output is the buffer this array was borrowed from: already in place.
                return Ok(());
            }
            if out.len() != bytes.len() {
                return Err(MlxError(format!(
                    "output buffer of {} bytes for an array of {} bytes",
                    out.len(),
                    bytes.len()
                )));
            }
            out.copy_from_slice(bytes);
            return Ok(());
        }
        let dense = super::ops::contiguous(self, stream)?;
        dense.eval()?;
        let n = dense.size() * dense.dtype().size_in_bytes();
        if out.len() != n {
            return Err(MlxError(format!("output buffer of {} bytes for an array of {n} bytes", out.len())));
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `dense` is evaluated and row-contiguous, so its data pointer covers `n` bytes.
        unsafe {
            let p = mlx_sys::mlx_array_data_uint8(dense.0);
            if p.is_null() {
                return Err(MlxError("evaluated array has no data".into()));
            }
            std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n);
        }
        Ok(())
    }

    /// The array's bytes when it already holds row-contiguous data in host-visible memory
    /// (e.g. created from host data); `None` when it would need an evaluation or a copy.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        // SAFETY: reads flags of a valid handle; the data pointer of an available, row-contiguous
        // array covers `size * itemsize` bytes for as long as `self` holds its reference.
        unsafe {
            let mut available = false;
            if mlx_sys::_mlx_array_is_available(&mut available, self.0) != 0 || !available {
                return None;
            }
            let mut contiguous = false;
            if mlx_sys::_mlx_array_is_row_contiguous(&mut contiguous, self.0) != 0 || !contiguous {
                return None;
            }
            let n = self.size() * self.dtype().size_in_bytes();
            if n == 0 {
                return Some(&[]);
            }
            let p = mlx_sys::mlx_array_data_uint8(self.0);
            if p.is_null() { None } else { Some(std::slice::from_raw_parts(p, n)) }
        }
    }

    /// The values as float32, read from [`Self::host_bytes`] with no evaluation and no device
    /// round trip (a constant's scales or zero points while a lowering builds): float32,
    /// float16, bfloat16 and 8-bit integers; `None` for another type or data not on the host.
    pub fn host_f32(&self) -> Option<Vec<f32>> {
        let b = self.host_bytes()?;
        Some(match self.dtype() {
            Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::U8 => b.iter().map(|&v| f32::from(v)).collect(),
            Dtype::I8 => b.iter().map(|&v| f32::from(v as i8)).collect(),
            _ => return None,
        })
    }

    /// Copies the array into a new vector of `T` (which must match the dtype).
    pub fn to_vec<T: Element>(&self, stream: &Stream) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(MlxError(format!("to_vec of {:?} as {:?}", self.dtype(), T::DTYPE)));
        }
        let mut out = vec![T::default(); self.size()];
        // SAFETY: `Element` types are plain old data; the byte view covers exactly `out`.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(&out[..])) };
        self.copy_to(bytes, stream)?;
        Ok(out)
    }
}

impl Clone for Array {
    fn clone(&self) -> Array {
        let mut out = Array::empty();
        // SAFETY: `mlx_array_set` makes `out` another reference to the same array.
        check(unsafe { mlx_sys::mlx_array_set(&mut out.0, self.0) })
            .expect("mlx_array_set cannot fail on valid handles");
        out
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: we own this reference.
        unsafe { mlx_sys::mlx_array_free(self.0) };
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Array({:?}, {:?})", self.dtype(), self.shape())
    }
}

impl std::fmt::Display for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: the string handle is created, filled, copied and freed here.
        unsafe {
            let mut s = mlx_sys::mlx_string_new();
            let rc = mlx_sys::mlx_array_tostring(&mut s, self.0);
            let text = if check(rc).is_ok() {
                CStr::from_ptr(mlx_sys::mlx_string_data(s)).to_string_lossy().into_owned()
            } else {
                format!("{self:?}")
            };
            mlx_sys::mlx_string_free(s);
            f.write_str(&text)
        }
    }
}

fn to_mlx_shape(shape: &[i64]) -> Result<Vec<c_int>> {
    shape
        .iter()
        .map(|&d| {
            c_int::try_from(d)
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| MlxError(format!("dimension {d} is out of MLX's range")))
        })
        .collect()
}

/// Host element types that map one-to-one onto an MLX dtype.
pub trait Element: Copy + Default + 'static {
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(bool => Bool, u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8, i16 => I16, i32 => I32,
    i64 => I64, half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64);

/// An owned mlx-c vector of arrays.
pub struct VectorArray(pub(crate) mlx_sys::mlx_vector_array);

impl VectorArray {
    pub fn new() -> VectorArray {
        init();
        // SAFETY: creates an empty vector owned by the returned value.
        VectorArray(unsafe { mlx_sys::mlx_vector_array_new() })
    }

    pub fn from_arrays<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<VectorArray> {
        let v = VectorArray::new();
        for a in arrays {
            v.push(a)?;
        }
        Ok(v)
    }

    pub fn push(&self, a: &Array) -> Result<()> {
        // SAFETY: the vector takes its own reference to `a`.
        check(unsafe { mlx_sys::mlx_vector_array_append_value(self.0, a.0) })
    }

    pub fn len(&self) -> usize {
        // SAFETY: valid handle.
        unsafe { mlx_sys::mlx_vector_array_size(self.0) }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Result<Array> {
        let mut out = Array::empty();
        // SAFETY: `out` receives a new reference; mlx-c bounds-checks `i`.
        check(unsafe { mlx_sys::mlx_vector_array_get(&mut out.0, self.0, i) })?;
        Ok(out)
    }

    pub fn to_vec(&self) -> Result<Vec<Array>> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }

    /// The unevaluated graph behind the arrays as MLX's Graphviz text (`export_to_dot`):
    /// one line per primitive and per input, one per edge. For diagnostics.
    pub fn graph_dot(&self) -> Result<String> {
        unsafe extern "C" {
            fn fopen(path: *const std::ffi::c_char, mode: *const std::ffi::c_char) -> *mut mlx_sys::FILE;
            fn fclose(f: *mut mlx_sys::FILE) -> c_int;
        }
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("mlx-ep-graph-{}-{n}.dot", std::process::id()));
        let c_path = std::ffi::CString::new(path.to_string_lossy().as_bytes())
            .map_err(|e| MlxError(format!("graph file path: {e}")))?;
        // SAFETY: both arguments are NUL-terminated strings that outlive the call.
        let f = unsafe { fopen(c_path.as_ptr(), c"w".as_ptr()) };
        if f.is_null() {
            return Err(MlxError(format!("cannot write the graph to {}", path.display())));
        }
        // SAFETY: creates a namer owned here and freed below.
        let namer = unsafe { mlx_sys::mlx_node_namer_new() };
        // SAFETY: valid file, namer and vector handles.
        let written = check(unsafe { mlx_sys::mlx_export_to_dot(f, namer, self.0) });
        // SAFETY: `namer` and `f` were created above and are released once.
        unsafe {
            mlx_sys::mlx_node_namer_free(namer);
            fclose(f);
        }
        let text = written.and_then(|()| std::fs::read_to_string(&path).map_err(|e| MlxError(e.to_string())));
        let _ = std::fs::remove_file(&path);
        text
    }

    /// Evaluates every array in the vector in one MLX evaluation.
    pub fn eval(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { mlx_sys::mlx_eval(self.0) })
    }
}

impl Default for VectorArray {
    fn default() -> Self {
        VectorArray::new()
    }
}

impl Drop for VectorArray {
    fn drop(&mut self) {
        // SAFETY: we own the vector.
        unsafe { mlx_sys::mlx_vector_array_free(self.0) };
    }
}
