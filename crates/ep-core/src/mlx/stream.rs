//! [`Stream`]: an mlx-c stream handle (the default device's, or the CPU's).

use super::{MlxError, Result, check, init};

/// An MLX stream (a queue on a device). Freed on drop.
pub struct Stream(pub(crate) mlx_sys::mlx_stream);

// SAFETY: an mlx_stream is a small value handle (device + index); MLX work is serialised by
// `mlx::lock()`.
unsafe impl Send for Stream {}
// SAFETY: as for `Send`: streams are used only under `mlx::lock()`.
unsafe impl Sync for Stream {}

impl Stream {
    /// The default stream of MLX's default device (the GPU where the backend has one).
    pub fn default_device() -> Result<Stream> {
        init();
        // SAFETY: out-handles are created by mlx-c and freed on every path.
        unsafe {
            let mut dev = mlx_sys::mlx_device_new();
            let rc = mlx_sys::mlx_get_default_device(&mut dev);
            if let Err(e) = check(rc) {
                mlx_sys::mlx_device_free(dev);
                return Err(e);
            }
            let mut s = mlx_sys::mlx_stream_new();
            let rc = mlx_sys::mlx_get_default_stream(&mut s, dev);
            mlx_sys::mlx_device_free(dev);
            check(rc).map(|_| Stream(s)).inspect_err(|_| {
                mlx_sys::mlx_stream_free(s);
            })
        }
    }

    /// The default CPU stream (shape arithmetic, float64).
    pub fn cpu() -> Result<Stream> {
        init();
        // SAFETY: creates a fresh handle owned by the returned value.
        let s = unsafe { mlx_sys::mlx_default_cpu_stream_new() };
        if s.ctx.is_null() { Err(MlxError("could not create the CPU stream".into())) } else { Ok(Stream(s)) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { mlx_sys::mlx_stream_free(self.0) };
    }
}
