//! The few CUDA driver calls the EP's byte copies need, from the `libcuda.so.1` MLX's CUDA
//! backend loads: copies between host memory and MLX's (managed or device) memory queued on
//! one stream of the EP's own, and one kernel that does many small device-side copies at once.
//!
//! A decode step writes two rows per layer into each KV buffer (one per key/value head): a
//! hundred copies of a hundred bytes. Queued one `cuMemcpyAsync` each they cost about 0.46 ms
//! a step on an H100 (measured with the trace's spans), a tenth of the step; one launch of
//! [`ROWS_PTX`] does them all.

use super::{MlxError, Result};
use std::ffi::{CStr, c_char, c_void};
use std::sync::{Mutex, OnceLock};

type CuResult = i32;

struct Driver {
    _lib: libloading::Library,
    memcpy_async: unsafe extern "C" fn(u64, u64, usize, *mut c_void) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut *mut c_void, u32) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CuResult,
    ctx_get_current: unsafe extern "C" fn(*mut *mut c_void) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, i32) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, i32, u64) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult,
    launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    memset_async: unsafe extern "C" fn(u64, u8, usize, *mut c_void) -> CuResult,
}

/// `CU_STREAM_NON_BLOCKING`: the copies' stream does not wait on the legacy default stream
/// (nor it on them).
const STREAM_NON_BLOCKING: u32 = 1;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` and `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
const ATTRIBUTE_MEMORY_TYPE: i32 = 2;
const ATTRIBUTE_IS_MANAGED: i32 = 8;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORY_TYPE_DEVICE: u32 = 2;
/// Copies up to this size between device-resident ranges go through the kernel; larger ones
/// to the copy engine.
const KERNEL_COPY_MAX: usize = 1 << 20;
/// Threads per block of the kernel, and the most copies one launch takes (a grid's height).
const KERNEL_THREADS: u32 = 256;
const GRID_Y_MAX: usize = 65_535;

/// Block row `y` copies the `(dst, src, n)` entry `y` of the table (three u64 each), its blocks'
/// threads striding over the bytes. Generic addressing: the table is pinned host memory, the ranges managed or
/// device memory. PTX for a low target, so the driver compiles it for any newer GPU.
const ROWS_PTX: &CStr = c"
.version 7.0
.target sm_52
.address_size 64

.visible .entry mlx_ep_copy_rows(
    .param .u64 table,
    .param .u32 count
)
{
    .reg .pred %p<3>;
    .reg .b16 %rs<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [table];
    ld.param.u32 %r1, [count];
    mov.u32 %r2, %ctaid.y;
    setp.ge.u32 %p1, %r2, %r1;
    @%p1 bra $L_done;
    mul.wide.u32 %rd2, %r2, 24;
    add.s64 %rd3, %rd1, %rd2;
    ld.u64 %rd4, [%rd3];
    ld.u64 %rd5, [%rd3+8];
    ld.u64 %rd6, [%rd3+16];
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %ctaid.x;
    mov.u32 %r6, %nctaid.x;
    cvt.u64.u32 %rd11, %r3;
    mad.wide.u32 %rd7, %r5, %r4, %rd11;
    mul.wide.u32 %rd8, %r6, %r4;
$L_loop:
    setp.ge.u64 %p2, %rd7, %rd6;
    @%p2 bra $L_done;
    add.s64 %rd9, %rd5, %rd7;
    ld.u8 %rs1, [%rd9];
    add.s64 %rd10, %rd4, %rd7;
    st.u8 [%rd10], %rs1;
    add.s64 %rd7, %rd7, %rd8;
    bra.uni $L_loop;
$L_done:
    ret;
}
";

fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: loading the CUDA driver MLX already loaded runs no new initialisers; the
            // symbols are the driver API's, with these C signatures.
            unsafe {
                let lib = libloading::Library::new("libcuda.so.1").map_err(|e| e.to_string())?;
                macro_rules! sym {
                    ($name:literal) => {
                        *lib.get(concat!($name, "\0").as_bytes()).map_err(|e| e.to_string())?
                    };
                }
                Ok(Driver {
                    memcpy_async: sym!("cuMemcpyAsync"),
                    stream_create: sym!("cuStreamCreate"),
                    stream_synchronize: sym!("cuStreamSynchronize"),
                    ctx_get_current: sym!("cuCtxGetCurrent"),
                    ctx_set_current: sym!("cuCtxSetCurrent"),
                    primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
                    pointer_get_attribute: sym!("cuPointerGetAttribute"),
                    module_load_data: sym!("cuModuleLoadData"),
                    module_get_function: sym!("cuModuleGetFunction"),
                    launch_kernel: sym!("cuLaunchKernel"),
                    mem_alloc_host: sym!("cuMemAllocHost_v2"),
                    mem_free_host: sym!("cuMemFreeHost"),
                    memset_async: sym!("cuMemsetD8Async"),
                    _lib: lib,
                })
            }
        })
        .as_ref()
        .map_err(|e| MlxError(format!("the CUDA driver could not be loaded: {e}")))
}

/// Makes the primary context of device 0 (the one MLX's runtime uses) current on this thread.
fn make_current(d: &Driver) -> Result<()> {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: driver calls with valid out-pointers.
    unsafe {
        if (d.ctx_get_current)(&mut ctx) != 0 || ctx.is_null() {
            let rc = (d.primary_ctx_retain)(&mut ctx, 0);
            if rc != 0 || (d.ctx_set_current)(ctx) != 0 {
                return Err(MlxError(format!("no CUDA context for a copy (error {rc})")));
            }
        }
    }
    Ok(())
}

/// Sets `n` bytes at `dst` to zero on the EP's stream and returns when done.
///
/// # Safety
/// As for [`super::device::zero_bytes`].
pub(super) unsafe fn zero(dst: *mut u8, n: usize) -> Result<()> {
    let d = driver()?;
    make_current(d)?;
    let stream = copy_stream(d)?;
    // SAFETY: the range is valid per the caller; the wait makes the memset done on return.
    unsafe {
        let queued = (d.memset_async)(dst as u64, 0, n, stream);
        let rc = (d.stream_synchronize)(stream);
        if queued != 0 || rc != 0 {
            return Err(MlxError(format!("zeroing {n} bytes failed with CUDA error {queued}/{rc}")));
        }
    }
    Ok(())
}

/// How copies between host memory ORT allocated (pageable, unknown to the driver) and MLX's
/// memory run (`ONNXRUNTIME_EP_MLX_HOST_COPY`, for measuring): `direct`, one `cuMemcpyAsync`
/// each; `staged`, through a pinned host buffer with the copy engine; `kernel`, through the
/// pinned buffer with the copy kernel.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum HostCopy {
    Direct,
    Staged,
    Kernel,
}

fn host_copy() -> HostCopy {
    static MODE: OnceLock<HostCopy> = OnceLock::new();
    *MODE.get_or_init(|| match crate::options::HOST_COPY.env_choice().as_deref() {
        Some("direct") => HostCopy::Direct,
        Some("kernel") => HostCopy::Kernel,
        _ => HostCopy::Staged,
    })
}

/// Copies of at least this size between host memory and MLX's go through the pinned buffer.
const STAGED_MIN: usize = 16 << 10;
/// The pinned buffer grows to at most this; a larger copy goes directly.
const STAGING_MAX: usize = 64 << 20;

/// What the EP's copies share: the kernel's table and the pinned staging buffer, locked for a
/// whole batch (both are read by the device until the batch's wait).
struct Pinned {
    table: usize,
    table_cap: usize,
    staging: usize,
    staging_cap: usize,
}

static PINNED: Mutex<Pinned> = Mutex::new(Pinned { table: 0, table_cap: 0, staging: 0, staging_cap: 0 });

/// Copies each `(dst, src, n)` and returns when all are done.
///
/// # Safety
/// As for [`super::device::copy_bytes_many`].
pub(super) unsafe fn copy(copies: &[(*mut u8, *const u8, usize)]) -> Result<()> {
    let d = driver()?;
    make_current(d)?;
    let stream = copy_stream(d)?;
    let mode = host_copy();
    let kernel = rows_kernel(d).is_some();
    let mut pinned = PINNED.lock().unwrap_or_else(|p| p.into_inner());
    // Device-side copies for the kernel, host-side copies into and out of the staging buffer
    // (done before and after the device work), and copies the copy engine does directly.
    let mut on_gpu: Vec<[u64; 3]> = Vec::new();
    let mut direct: Vec<(u64, u64, usize)> = Vec::new();
    let mut ups: Vec<(*mut u8, *const u8, usize)> = Vec::new();
    let mut downs: Vec<(*mut u8, *const u8, usize)> = Vec::new();
    let mut staged = 0usize;
    let mut planned: Vec<(*mut u8, *const u8, usize, bool, bool)> = Vec::with_capacity(copies.len());
    // Memory is of one kind per 4 KiB page (host, managed, device and pinned memory are all
    // mapped by whole pages): one driver query per page and batch.
    let mut kinds: std::collections::HashMap<usize, bool> = std::collections::HashMap::new();
    let mut device_side = |p: *mut u8| *kinds.entry(p as usize >> 12).or_insert_with(|| on_device(d, p));
    for &(dst, src, n) in copies {
        if n == 0 {
            continue;
        }
        let (dd, sd) = (device_side(dst), device_side(src.cast_mut()));
        planned.push((dst, src, n, dd, sd));
        if dd != sd && (STAGED_MIN..=STAGING_MAX).contains(&n) && mode != HostCopy::Direct {
            staged += n.next_multiple_of(256);
        }
    }
    // SAFETY: valid out-pointers; a grown buffer replaces one nothing reads (every batch waits
    // before unlocking).
    let staging_ok = staged == 0 || unsafe { grow_staging(d, &mut pinned, staged.min(STAGING_MAX)) }.is_ok();
    let mut at = 0usize;
    for (dst, src, n, dd, sd) in planned {
        let fits = staging_ok && at + n.next_multiple_of(256) <= pinned.staging_cap;
        if dd && sd && n <= KERNEL_COPY_MAX && kernel {
            on_gpu.push([dst as u64, src as u64, n as u64]);
        } else if dd != sd && n >= STAGED_MIN && mode != HostCopy::Direct && fits {
            let slot = pinned.staging + at;
            at += n.next_multiple_of(256);
            let through_kernel = mode == HostCopy::Kernel && kernel;
            let (from, to) = if sd { (src as u64, slot as u64) } else { (slot as u64, dst as u64) };
            if sd {
                downs.push((dst, slot as *const u8, n));
            } else {
                ups.push((slot as *mut u8, src, n));
            }
            if through_kernel {
                on_gpu.push([to, from, n as u64]);
            } else {
                direct.push((to, from, n));
            }
        } else {
            direct.push((dst as u64, src as u64, n));
        }
    }
    // SAFETY: `src` holds `n` bytes per the caller; the slots are disjoint in the staging buffer.
    unsafe { super::host_copy::copy(&ups) };
    let mut queued: Result<()>;
    // SAFETY: driver calls on the current (MLX's) context; the ranges are valid per the caller
    // or lie in the staging buffer.
    unsafe {
        let engine = |copies: &mut dyn Iterator<Item = (u64, u64, usize)>| -> Result<()> {
            for (to, from, n) in copies {
                let rc = (d.memcpy_async)(to, from, n, stream);
                if rc != 0 {
                    return Err(MlxError(format!("cuMemcpyAsync of {n} bytes failed with CUDA error {rc}")));
                }
            }
            Ok(())
        };
        queued = engine(&mut direct.iter().copied());
        if queued.is_ok() && !on_gpu.is_empty() && launch_rows(d, &mut pinned, &on_gpu, stream).is_err() {
            // (A launch the driver refused runs nothing: the copy engine does them instead.)
            queued = engine(&mut on_gpu.iter().map(|&[to, from, n]| (to, from, n as usize)));
        }
        // Waited for even after a failed queueing: no copy may still run when this returns.
        let rc = (d.stream_synchronize)(stream);
        queued?;
        if rc != 0 {
            return Err(MlxError(format!("cuStreamSynchronize failed with CUDA error {rc}")));
        }
    }
    // SAFETY: `dst` holds `n` bytes per the caller; the slots were filled by the wait above.
    unsafe { super::host_copy::copy(&downs) };
    Ok(())
}

/// Makes the staging buffer at least `need` bytes.
///
/// # Safety
/// Nothing may be reading the current buffer.
unsafe fn grow_staging(d: &Driver, pinned: &mut Pinned, need: usize) -> Result<()> {
    if pinned.staging_cap >= need {
        return Ok(());
    }
    let cap = need.next_power_of_two().max(1 << 20);
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the old buffer is freed only once replaced.
    unsafe {
        let rc = (d.mem_alloc_host)(&mut p, cap);
        if rc != 0 || p.is_null() {
            return Err(MlxError(format!("cuMemAllocHost of {cap} bytes failed with CUDA error {rc}")));
        }
        if pinned.staging != 0 {
            (d.mem_free_host)(pinned.staging as *mut c_void);
        }
    }
    pinned.staging = p as usize;
    pinned.staging_cap = cap;
    Ok(())
}

/// Whether a kernel can read and write `p` where it is: managed or device memory (pageable
/// host memory, which the driver does not know, is not). Only pointers the driver vouches for
/// reach the copy kernel: a bad address there would leave the context (MLX's too) in a sticky
/// error, where a driver copy returns one.
fn on_device(d: &Driver, p: *mut u8) -> bool {
    let mut managed: u32 = 0;
    let mut kind: u32 = 0;
    // SAFETY: attribute queries with out-pointers of the attributes' sizes (both 32-bit).
    unsafe {
        if (d.pointer_get_attribute)((&raw mut managed).cast(), ATTRIBUTE_IS_MANAGED, p as u64) == 0 && managed != 0 {
            return true;
        }
        (d.pointer_get_attribute)((&raw mut kind).cast(), ATTRIBUTE_MEMORY_TYPE, p as u64) == 0
            && kind == MEMORY_TYPE_DEVICE
    }
}

/// The copy kernel, loaded once per process; `None` when the driver refused it (the copies
/// then all go to the copy engine).
fn rows_kernel(d: &Driver) -> Option<usize> {
    static KERNEL: OnceLock<Option<usize>> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        let mut module: *mut c_void = std::ptr::null_mut();
        let mut function: *mut c_void = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image and valid out-pointers, in the current context.
        let ok = unsafe {
            (d.module_load_data)(&mut module, ROWS_PTX.as_ptr().cast()) == 0
                && (d.module_get_function)(&mut function, module, c"mlx_ep_copy_rows".as_ptr()) == 0
        };
        if !ok {
            eprintln!("[{}] the row-copy kernel did not load; small device copies use cuMemcpyAsync", crate::EP_NAME);
        }
        ok.then_some(function as usize)
    })
}

/// Writes `copies` into the pinned table (grown as needed) and launches the kernel on `stream`.
///
/// # Safety
/// Every range valid per [`copy`]'s caller; the table locked until the stream is waited for.
unsafe fn launch_rows(d: &Driver, table: &mut Pinned, copies: &[[u64; 3]], stream: *mut c_void) -> Result<()> {
    let function = rows_kernel(d).ok_or_else(|| MlxError("the row-copy kernel is not loaded".into()))?;
    if table.table_cap < copies.len() {
        let cap = copies.len().next_power_of_two().max(256);
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the old table (if any) is no longer read (every launch
        // is waited for before the lock is released) and is kept allocated (a few kilobytes,
        // grown a few times per process at most).
        let rc = unsafe { (d.mem_alloc_host)(&mut p, cap * 24) };
        if rc != 0 || p.is_null() {
            return Err(MlxError(format!("cuMemAllocHost of the copy table failed with CUDA error {rc}")));
        }
        (table.table, table.table_cap) = (p as usize, cap);
    }
    // SAFETY: the table holds `cap >= copies.len()` entries of three u64, nothing reads it now.
    unsafe { std::ptr::copy_nonoverlapping(copies.as_ptr(), table.table as *mut [u64; 3], copies.len()) };
    // Blocks per copy: enough for the longest to stride a few bytes per thread.
    let longest = copies.iter().map(|c| c[2]).max().unwrap_or(0);
    let per_block = u64::from(KERNEL_THREADS) * 8;
    let blocks = u32::try_from(longest.div_ceil(per_block).clamp(1, 1024)).unwrap_or(1024);
    for (k, chunk) in copies.chunks(GRID_Y_MAX).enumerate() {
        let mut table_ptr = (table.table + k * GRID_Y_MAX * 24) as u64;
        let mut count = chunk.len() as u32;
        let mut params: [*mut c_void; 2] = [(&raw mut table_ptr).cast(), (&raw mut count).cast()];
        // SAFETY: the loaded kernel with its two parameters (u64 table, u32 count), a row of
        // blocks per entry of this chunk, on the EP's stream.
        let rc = unsafe {
            (d.launch_kernel)(
                function as *mut c_void,
                blocks,
                count,
                1,
                KERNEL_THREADS,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(MlxError(format!("launching the copy kernel failed with CUDA error {rc}")));
        }
    }
    Ok(())
}

/// The stream the EP's copies run on, created once in the current (primary) context.
fn copy_stream(d: &Driver) -> Result<*mut c_void> {
    static STREAM: OnceLock<std::result::Result<usize, i32>> = OnceLock::new();
    let made = STREAM.get_or_init(|| {
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the caller made the primary context current.
        let rc = unsafe { (d.stream_create)(&mut s, STREAM_NON_BLOCKING) };
        if rc == 0 { Ok(s as usize) } else { Err(rc) }
    });
    match made {
        Ok(s) => Ok(*s as *mut c_void),
        Err(rc) => Err(MlxError(format!("cuStreamCreate failed with CUDA error {rc}"))),
    }
}
