//! The safe RAII layer over mlx-c. Together with `crate::ort_abi`, the only place in the project
//! that calls `unsafe` FFI.
//!
//! # Invariants
//! - Every mlx-c call goes through `check`, which turns a non-zero return into an [`MlxError`]
//!   carrying the message MLX reported.
//! - The process-global mlx-c error handler is ours ([`init`], installed when the plugin loads):
//!   mlx-c's default handler prints and *exits the process*, which a library loaded into someone
//!   else's process must never do. Ours records the message for the calling thread instead.
//! - Every handle type frees its mlx-c object on drop; no handle escapes this module raw.

mod array;
mod closure;
mod cuda;
pub mod device;
mod dtype;
mod fast;
mod host_copy;
pub mod kernel;
pub mod ops;
pub mod random;
mod slicing;
mod stream;
#[cfg(test)]
mod tests;

pub use array::{Array, VectorArray};
pub use closure::Closure;
pub use device::{default_device_is_gpu, gpu_forms};
pub use dtype::Dtype;
pub use stream::Stream;

use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard, Once};

/// An error reported by MLX (a failed op, a bad shape, an out-of-memory, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlxError(pub String);

impl std::fmt::Display for MlxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MLX error: {}", self.0)
    }
}

impl std::error::Error for MlxError {}

pub type Result<T> = std::result::Result<T, MlxError>;

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

unsafe extern "C" fn record_error(msg: *const c_char, _data: *mut c_void) {
    let text = if msg.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: mlx-c passes a NUL-terminated message valid for the duration of the call.
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    };
    set_last_error(text);
}

pub(crate) fn set_last_error(msg: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(msg));
}

/// Installs the project's MLX error handler (idempotent). Called when the plugin loads and by
/// every constructor in this module, so no mlx-c call can reach the exiting default handler.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handler is a plain function with no state; no destructor is needed.
        unsafe { mlx_sys::mlx_set_error_handler(Some(record_error), std::ptr::null_mut(), None) };
    });
}

/// Converts an mlx-c return code into a `Result`, taking the message the handler recorded.
pub(crate) fn check(rc: c_int) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let msg = LAST_ERROR.with(|e| e.borrow_mut().take()).unwrap_or_else(|| format!("mlx-c call failed with code {rc}"));
    Err(MlxError(msg))
}

thread_local! {
    /// How many [`MlxGuard`]s this thread holds.
    static LOCK_DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Serialises MLX graph construction and evaluation across threads. MLX's scheduler and
/// default streams are process-global; partitions from several sessions may run concurrently.
///
/// Re-entrant on one thread: a partition run holds it while ORT allocates the run's outputs
/// through the EP's allocator, which takes it again.
pub fn lock() -> MlxGuard {
    static LOCK: Mutex<()> = Mutex::new(());
    let depth = LOCK_DEPTH.with(|d| d.get());
    let guard = (depth == 0).then(|| LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    LOCK_DEPTH.with(|d| d.set(depth + 1));
    MlxGuard { _guard: guard }
}

/// Held while MLX work runs; see [`lock`]. Not `Send`: it is released on the thread that took it.
pub struct MlxGuard {
    _guard: Option<MutexGuard<'static, ()>>,
}

impl Drop for MlxGuard {
    fn drop(&mut self) {
        LOCK_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Bytes of memory held by live MLX arrays (excluding MLX's buffer cache).
pub fn active_memory() -> Result<usize> {
    init();
    let mut n = 0usize;
    // SAFETY: writes one usize.
    check(unsafe { mlx_sys::mlx_get_active_memory(&mut n) })?;
    Ok(n)
}

/// MLX's memory limit in bytes: the most its allocator hands out before it refuses (on GPUs
/// a share of the device's memory; 0 where the backend sets none).
pub fn memory_limit() -> Result<usize> {
    init();
    let mut n = 0usize;
    // SAFETY: writes one usize.
    check(unsafe { mlx_sys::mlx_get_memory_limit(&mut n) })?;
    Ok(n)
}

/// The MLX version string of the loaded libmlx.
pub fn version() -> Result<String> {
    init();
    // SAFETY: the string handle is created, filled by mlx-c, copied out, then freed.
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let rc = mlx_sys::mlx_version(&mut s);
        let out = check(rc).map(|_| CStr::from_ptr(mlx_sys::mlx_string_data(s)).to_string_lossy().into_owned());
        mlx_sys::mlx_string_free(s);
        out
    }
}
