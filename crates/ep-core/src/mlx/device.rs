//! MLX's device as ORT sees it: the process-wide choices (device, TF32, memory and cache
//! limits), buffers in MLX's memory that ORT tensors live in ([`DeviceBuffer`]), and byte
//! copies into and out of them ([`copy_bytes`]).
//!
//! How MLX's memory behaves, by backend:
//! - CPU and Metal: MLX buffers are host memory (Metal's are shared with the GPU), so a copy is
//!   a `memcpy`.
//! - CUDA: MLX allocates from CUDA memory pools, and moves a buffer to managed (unified) memory
//!   the first time its host address is taken. A [`DeviceBuffer`] therefore lives in managed
//!   memory: kernels read it where it is, and copies go through the CUDA driver's `cuMemcpy`,
//!   which moves bytes on the device when both sides are device-resident.

use super::{Array, Dtype, MlxError, Result, Stream, check, init};
use crate::options::Device;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// What the process has settled: set by the first session that asks, then fixed.
struct Settled {
    device: Option<Device>,
    tf32: Option<bool>,
}

/// Which compiled graphs get fused kernels (`mlx_compile` fusing chains of elementwise ops
/// into generated kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fusion {
    /// Every compiled graph (the CPU and Metal default, `fuse=1`).
    All,
    /// None (`fuse=0`).
    Off,
    /// Only the fixed-shape graphs a decode step replays, once per generated token (the split
    /// decode slot; the CUDA default): on CUDA every fused kernel is compiled with NVRTC the
    /// first time it runs, which a graph run once or a few times (a prompt, a CNN) does not win
    /// back, and a decode step does many times over (2.5x faster steps on an H100). A shapeless
    /// decode graph (a growing cache) is not fused: fusing it bought nothing measurable (12.6
    /// against 12.8 ms per fp16 step on an H100) for 44 s more of first run; nor is the split
    /// step's prologue (a few small integer operations: three kernels of 3-6 s each).
    DecodeSteps,
}

static SETTLED: Mutex<Settled> = Mutex::new(Settled { device: None, tf32: None });

/// The environment variable MLX's CUDA backend reads (once, at its first matmul) for TF32.
const MLX_TF32_VARIABLE: &str = "MLX_ENABLE_TF32";

/// 0: not read yet, 1: CPU, 2: GPU.
static DEFAULT_IS_GPU: AtomicU8 = AtomicU8::new(0);

/// Whether MLX's default device is a GPU (Metal or CUDA), where float64 does not run.
pub fn default_device_is_gpu() -> bool {
    match DEFAULT_IS_GPU.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let gpu = read_default_device_is_gpu();
            DEFAULT_IS_GPU.store(if gpu { 2 } else { 1 }, Ordering::Relaxed);
            gpu
        }
    }
}

/// Whether lowerings build their GPU forms: on a GPU, or on the CPU where
/// `ONNXRUNTIME_EP_MLX_TEST_GPU_FORMS` asks for them (tests, and counting a GPU graph's
/// primitives where no GPU is at hand). The forms compute the same results on either backend.
pub fn gpu_forms() -> bool {
    static TEST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    default_device_is_gpu() || *TEST.get_or_init(|| crate::options::TEST_GPU_FORMS.env_on())
}

fn read_default_device_is_gpu() -> bool {
    init();
    // SAFETY: out-handles are created by mlx-c and freed on every path.
    unsafe {
        let mut dev = mlx_sys::mlx_device_new();
        let mut kind = mlx_sys::mlx_device_type::MLX_CPU;
        let ok = mlx_sys::mlx_get_default_device(&mut dev) == 0 && mlx_sys::mlx_device_get_type(&mut kind, dev) == 0;
        mlx_sys::mlx_device_free(dev);
        ok && kind == mlx_sys::mlx_device_type::MLX_GPU
    }
}

/// Whether this MLX backend has a GPU at all.
pub fn has_gpu() -> bool {
    init();
    // SAFETY: the device handle is created and freed here.
    unsafe {
        let dev = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type::MLX_GPU, 0);
        let mut available = false;
        let ok = mlx_sys::mlx_device_is_available(&mut available, dev) == 0;
        mlx_sys::mlx_device_free(dev);
        ok && available
    }
}

/// Whether the backend is CUDA (a GPU that is not Apple's).
pub fn is_cuda() -> bool {
    !cfg!(target_os = "macos") && has_gpu()
}

/// Applies a session's process-wide requests: the device (`Auto` asks nothing) and TF32
/// (`None` asks nothing; the first session that runs settles it off unless asked). A request
/// that contradicts what an earlier session settled is an error, since MLX holds one device
/// and one TF32 mode per process.
pub fn settle(device: Device, tf32: Option<bool>) -> Result<()> {
    init();
    let mut settled = SETTLED.lock().unwrap_or_else(|p| p.into_inner());
    if device == Device::Auto && settled.device.is_none() {
        // The first session's `auto` settles what MLX's default is, so a later session asking
        // for the other device is refused like any conflict.
        settled.device = Some(if default_device_is_gpu() { Device::Gpu } else { Device::Cpu });
    }
    if device != Device::Auto {
        match settled.device {
            Some(d) if d != device => {
                return Err(MlxError(format!(
                    "option device={} conflicts with device={} chosen by an earlier session: MLX has one device per process",
                    name(device),
                    name(d)
                )));
            }
            Some(_) => {}
            None => {
                if device == Device::Gpu && !has_gpu() {
                    return Err(MlxError("option device=gpu: this MLX backend has no GPU".into()));
                }
                let kind = if device == Device::Gpu {
                    mlx_sys::mlx_device_type::MLX_GPU
                } else {
                    mlx_sys::mlx_device_type::MLX_CPU
                };
                // SAFETY: the device handle is created and freed here.
                unsafe {
                    let dev = mlx_sys::mlx_device_new_type(kind, 0);
                    let rc = mlx_sys::mlx_set_default_device(dev);
                    mlx_sys::mlx_device_free(dev);
                    check(rc)?;
                }
                DEFAULT_IS_GPU.store(0, Ordering::Relaxed);
                settled.device = Some(device);
            }
        }
    }
    let user_set = std::env::var(MLX_TF32_VARIABLE).ok().filter(|v| !v.is_empty()).map(|v| v != "0");
    match (settled.tf32, tf32) {
        (Some(current), Some(asked)) if current != asked => Err(MlxError(format!(
            "option tf32={} conflicts with tf32={} settled by an earlier session: MLX reads it once per process",
            u8::from(asked),
            u8::from(current)
        ))),
        (Some(_), _) => Ok(()),
        (None, asked) => {
            let on = match (user_set, asked) {
                (Some(env), Some(asked)) if env != asked => {
                    return Err(MlxError(format!(
                        "option tf32={} conflicts with {MLX_TF32_VARIABLE}={} in the environment",
                        u8::from(asked),
                        u8::from(env)
                    )));
                }
                (Some(env), _) => env,
                (None, asked) => {
                    let on = asked.unwrap_or(false);
                    // SAFETY: set once, under SETTLED's lock, before any session of this
                    // plugin has run MLX work; MLX reads the variable at its first matmul.
                    unsafe { std::env::set_var(MLX_TF32_VARIABLE, if on { "1" } else { "0" }) };
                    on
                }
            };
            settled.tf32 = Some(on);
            Ok(())
        }
    }
}

/// The fusion a session asks for: `Some(true)` every graph, `Some(false)` none, `None` the
/// backend's default ([`Fusion::DecodeSteps`] on CUDA, [`Fusion::All`] elsewhere). Each
/// closure is traced in its session's mode ([`traced_with_fusion`]), so sessions of one
/// process may ask differently.
pub fn fusion_for(fuse: Option<bool>) -> Fusion {
    match fuse {
        Some(true) => Fusion::All,
        Some(false) => Fusion::Off,
        None if is_cuda() => Fusion::DecodeSteps,
        None => Fusion::All,
    }
}

/// Runs `trace` (the first application of a compiled closure, where MLX traces it and
/// decides on fusion) with fused kernels on or off as asked, then restores MLX's default
/// mode (fused). The caller holds [`super::lock`], so no other trace runs meanwhile.
pub fn traced_with_fusion<T>(fused: bool, trace: impl FnOnce() -> T) -> Result<T> {
    if fused {
        return Ok(trace());
    }
    set_mode(false)?;
    let out = trace();
    set_mode(true)?;
    Ok(out)
}

/// Says once per process, on stderr, that the decode step's fused kernels are being compiled
/// (on CUDA with an empty kernel cache this takes a minute or more, once per machine), where
/// they are kept, and how to skip them.
pub fn note_fused_compile() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        let dir = std::env::var_os(MLX_KERNEL_CACHE_VARIABLE).map(std::path::PathBuf::from);
        let cold = dir.as_ref().is_none_or(|d| std::fs::read_dir(d).map_or(true, |mut e| e.next().is_none()));
        if is_cuda() && cold {
            eprintln!(
                "[{}] compiling the decode step's fused CUDA kernels (the first time on this machine: \
                 a minute or more; kept in {}; option fuse=0 skips them for slower steps)",
                crate::EP_NAME,
                dir.map_or_else(|| "MLX's default cache".to_owned(), |d| d.display().to_string())
            );
        }
    });
}

fn set_mode(fused: bool) -> Result<()> {
    let mode = if fused {
        mlx_sys::mlx_compile_mode::MLX_COMPILE_MODE_ENABLED
    } else {
        mlx_sys::mlx_compile_mode::MLX_COMPILE_MODE_NO_FUSE
    };
    // SAFETY: a process-wide setting with no handles.
    check(unsafe { mlx_sys::mlx_set_compile_mode(mode) })
}

fn name(d: Device) -> &'static str {
    match d {
        Device::Auto => "auto",
        Device::Gpu => "gpu",
        Device::Cpu => "cpu",
    }
}

/// The variable MLX's CUDA backend reads (at its first JIT compilation) for its kernel cache.
const MLX_KERNEL_CACHE_VARIABLE: &str = "MLX_PTX_CACHE_DIR";

/// Points MLX's CUDA kernel cache at `dir` (or the user's cache directory) unless the
/// environment already names one. The first call decides; a later call asking for another
/// directory is an error, since MLX reads it once per process.
pub fn settle_kernel_cache(dir: Option<&std::path::Path>) -> Result<()> {
    static CHOSEN: Mutex<Option<std::path::PathBuf>> = Mutex::new(None);
    let mut chosen = CHOSEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(current) = chosen.as_ref() {
        return match dir {
            Some(d) if d != current => Err(MlxError(format!(
                "option kernel_cache={} conflicts with {} chosen by an earlier session: MLX reads it once per process",
                d.display(),
                current.display()
            ))),
            _ => Ok(()),
        };
    }
    let from_env = std::env::var_os(MLX_KERNEL_CACHE_VARIABLE).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    let dir = match (from_env, dir) {
        (Some(env), _) => env,
        (None, Some(d)) => d.to_path_buf(),
        (None, None) => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")));
            match base {
                Some(b) => b.join("onnxruntime-mlx-ep").join("kernels"),
                // No home: MLX's own default (the temporary directory) stays.
                None => return Ok(()),
            }
        }
    };
    if std::env::var_os(MLX_KERNEL_CACHE_VARIABLE).is_none() {
        // SAFETY: set once, under CHOSEN's lock, before this plugin has run MLX work; MLX
        // reads the variable at its first kernel compilation.
        unsafe { std::env::set_var(MLX_KERNEL_CACHE_VARIABLE, &dir) };
    }
    *chosen = Some(dir);
    Ok(())
}

/// Sets MLX's memory limit (bytes); returns the previous one.
pub fn set_memory_limit(bytes: usize) -> Result<usize> {
    init();
    let mut previous = 0usize;
    // SAFETY: writes one usize.
    check(unsafe { mlx_sys::mlx_set_memory_limit(&mut previous, bytes) })?;
    Ok(previous)
}

/// Sets the most memory MLX's buffer cache keeps (bytes); returns the previous limit.
pub fn set_cache_limit(bytes: usize) -> Result<usize> {
    init();
    let mut previous = 0usize;
    // SAFETY: writes one usize.
    check(unsafe { mlx_sys::mlx_set_cache_limit(&mut previous, bytes) })?;
    Ok(previous)
}

/// Bytes MLX's buffer cache holds for reuse.
pub fn cache_memory() -> Result<usize> {
    init();
    let mut n = 0usize;
    // SAFETY: writes one usize.
    check(unsafe { mlx_sys::mlx_get_cache_memory(&mut n) })?;
    Ok(n)
}

/// MLX's memory figures: bytes held by live arrays, by the buffer cache, and the peak of the
/// first since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub active: usize,
    pub cache: usize,
    pub peak: usize,
}

pub fn memory_stats() -> Result<MemoryStats> {
    init();
    let (mut active, mut peak) = (0usize, 0usize);
    // SAFETY: writes one usize.
    check(unsafe { mlx_sys::mlx_get_active_memory(&mut active) })?;
    // SAFETY: writes one usize.
    check(unsafe { mlx_sys::mlx_get_peak_memory(&mut peak) })?;
    Ok(MemoryStats { active, cache: cache_memory()?, peak })
}

/// A block of MLX memory that ORT places tensors in: one evaluated `uint8` array, kept alive
/// as long as the block, so its address is stable.
pub struct DeviceBuffer {
    array: Array,
    ptr: *mut u8,
    len: usize,
    /// Evaluated views handed out before, by offset, shape and dtype: a tensor ORT keeps in
    /// the block (a KV cache bound run after run) is the same array every run, with nothing
    /// to evaluate, instead of a slice, a view and a reshape each run.
    views: std::sync::Mutex<Vec<KeptView>>,
}

/// A view of a [`DeviceBuffer`]: offset, shape, dtype and the evaluated array.
type KeptView = (usize, Vec<i64>, Dtype, Array);

/// Views kept per block (a block holds one tensor, seen in few shapes).
const KEPT_VIEWS: usize = 8;

// SAFETY: the buffer is plain memory owned by an MLX array; its handle is only used under
// `mlx::lock()`, and the address is only dereferenced by callers that own the tensor.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as for `Send`.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// A zero-filled block of `len` bytes (at least one). The caller holds [`super::lock`].
    pub fn new(len: usize, stream: &Stream) -> Result<DeviceBuffer> {
        let n = len.max(1);
        let dim = i64::try_from(n).ok().filter(|&d| d <= i64::from(i32::MAX)).ok_or_else(|| {
            MlxError(format!("a device allocation of {len} bytes is larger than MLX's 2 GiB per array"))
        })?;
        let array = super::ops::full(&[dim], &Array::scalar_f32(0.0), Dtype::U8, stream)?;
        array.eval()?;
        // SAFETY: an evaluated, row-contiguous array: its data pointer covers `n` bytes while
        // `array` lives (on CUDA, taking it moves the buffer to managed memory once).
        let ptr = unsafe { mlx_sys::mlx_array_data_uint8(array.0) }.cast_mut();
        if ptr.is_null() {
            return Err(MlxError(format!("MLX gave no memory for {len} bytes")));
        }
        Ok(DeviceBuffer { array, ptr, len: n, views: std::sync::Mutex::new(Vec::new()) })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes `[offset, offset + shape·dtype)` of the block as an array of `shape` and
    /// `dtype`, sharing the block's memory. The caller holds [`super::lock`] and keeps `self`
    /// alive while the view is used.
    pub fn view(&self, offset: usize, shape: &[i64], dtype: Dtype, stream: &Stream) -> Result<Array> {
        let mut kept = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((.., a)) = kept.iter().find(|(o, s, d, _)| *o == offset && s == shape && *d == dtype) {
            return Ok(a.clone());
        }
        let view = self.new_view(offset, shape, dtype, stream)?;
        // Evaluated once: the view shares the block's memory, so later runs read what is
        // there then (MLX never writes into it: the block's own array keeps it shared).
        view.eval()?;
        if kept.len() == KEPT_VIEWS {
            kept.remove(0);
        }
        kept.push((offset, shape.to_vec(), dtype, view.clone()));
        Ok(view)
    }

    fn new_view(&self, offset: usize, shape: &[i64], dtype: Dtype, stream: &Stream) -> Result<Array> {
        let count: i64 = shape.iter().product();
        let size = dtype.size_in_bytes();
        let bytes = usize::try_from(count).unwrap_or(usize::MAX).saturating_mul(size);
        if offset.checked_add(bytes).is_none_or(|end| end > self.len) || !offset.is_multiple_of(size) {
            return Err(MlxError(format!(
                "a view of {bytes} bytes at offset {offset} does not fit a {}-byte block",
                self.len
            )));
        }
        let raw = super::ops::slice(&self.array, &[offset as i64], &[(offset + bytes) as i64], stream)?;
        let typed = if dtype == Dtype::U8 {
            raw
        } else {
            let mut out = Array::empty();
            // SAFETY: valid handles; `out` receives a new array.
            check(unsafe { mlx_sys::mlx_view(&mut out.0, raw.0, dtype.to_raw(), stream.0) })?;
            out
        };
        super::ops::reshape(&typed, shape, stream)
    }
}

/// Copies each `(dst, src, n)`: `n` bytes from `src` to `dst`, either of which may be MLX
/// memory or host memory. On CUDA the copies run on the device where both sides are there,
/// and the call returns when all are done. The copies of one call run in no particular order
/// (some on the device, some through a pinned buffer on the host).
///
/// # Safety
/// Every range must be valid for its `n` bytes, no destination may overlap another range
/// (source or destination), and no MLX work may be writing any of them while the copies run.
pub unsafe fn copy_bytes_many(copies: &[(*mut u8, *const u8, usize)]) -> Result<()> {
    if is_cuda() {
        // SAFETY: per the caller.
        return unsafe { super::cuda::copy(copies) };
    }
    for &(dst, src, n) in copies {
        if n > 0 {
            // SAFETY: per the caller.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        }
    }
    Ok(())
}

/// Sets `n` bytes of MLX memory at `dst` (a [`DeviceBuffer`]'s) to zero; returns when done.
///
/// # Safety
/// The range must be MLX memory valid for `n` bytes, and no MLX work may be using it.
pub unsafe fn zero_bytes(dst: *mut u8, n: usize) -> Result<()> {
    if is_cuda() {
        // SAFETY: per the caller.
        return unsafe { super::cuda::zero(dst, n) };
    }
    // SAFETY: per the caller.
    unsafe { std::ptr::write_bytes(dst, 0, n) };
    Ok(())
}
