//! The EP's memory as an ORT device: the `OrtMemoryInfo` its `OrtEpDevice` registers, the
//! `OrtAllocator` that hands out MLX memory for ORT's tensors, the `OrtDataTransferImpl` that
//! copies between that memory and the host, and [`Blocks`], the live allocations, which a
//! partition run looks its inputs and outputs up in (an input in the EP's memory is read in
//! place, an output is written there by a device copy).
//!
//! Device memory is offered where MLX's default device is a GPU, and on MLX's CPU backend when
//! `ONNXRUNTIME_EP_MLX_DEVICE_MEMORY=1` (so CI exercises the same path).

use super::boundary::{guard, guard_value};
use super::tables::{OrtDataTransferImpl, OrtMemoryDevice, OrtSyncStream};
use super::{ep_api, ort_call};
use crate::mlx::device::{DeviceBuffer, copy_bytes_many};
use crate::mlx::{self, Array, Dtype, Stream};
use crate::{Error, Result};
use ort_sys::{
    OrtAllocator, OrtAllocatorType, OrtDeviceMemoryType, OrtMemoryInfo, OrtMemoryInfoDeviceType, OrtStatusPtr, OrtValue,
};
use std::collections::BTreeMap;
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The name of the EP's memory in ORT (`OrtMemoryInfo` name).
const MEMORY_NAME: &CStr = c"MLX";

/// The vendor id of the EP's memory on MLX's CPU backend (no PCI vendor to borrow): "ML".
pub(crate) const CPU_BACKEND_VENDOR: u32 = 0x4D4C;

/// The EP's memory, created once per process.
pub(crate) struct DeviceMemory {
    info: *mut OrtMemoryInfo,
    device: *const OrtMemoryDevice,
}

// SAFETY: ORT's memory info and memory device are immutable once created and live for the
// process (the info is never released; the device belongs to the info).
unsafe impl Send for DeviceMemory {}
// SAFETY: as for `Send`.
unsafe impl Sync for DeviceMemory {}

static MEMORY: OnceLock<DeviceMemory> = OnceLock::new();

impl DeviceMemory {
    /// The EP's memory on the device with ORT's vendor id `vendor` (created on first use; the
    /// first vendor wins).
    pub(crate) fn get_or_create(vendor: u32) -> Result<&'static DeviceMemory> {
        if let Some(m) = MEMORY.get() {
            return Ok(m);
        }
        let mut info: *mut OrtMemoryInfo = std::ptr::null_mut();
        ort_call!(CreateMemoryInfo_V2(
            MEMORY_NAME.as_ptr(),
            OrtMemoryInfoDeviceType::OrtMemoryInfoDeviceType_GPU,
            vendor,
            0,
            OrtDeviceMemoryType::OrtDeviceMemoryType_DEFAULT,
            0,
            OrtAllocatorType::OrtDeviceAllocator,
            &mut info,
        ))?;
        // SAFETY: a valid memory info just created.
        let device = unsafe { (ep_api().MemoryInfo_GetMemoryDevice)(info) };
        if device.is_null() {
            return Err(Error::new("ORT gave no memory device for the EP's memory"));
        }
        let _ = MEMORY.set(DeviceMemory { info, device });
        Ok(MEMORY.get().expect("set above"))
    }

    pub(crate) fn get() -> Option<&'static DeviceMemory> {
        MEMORY.get()
    }

    pub(crate) fn info(&self) -> *const OrtMemoryInfo {
        self.info
    }

    fn is(&self, device: *const OrtMemoryDevice) -> bool {
        // SAFETY: both are valid memory devices from ORT.
        !device.is_null() && unsafe { (ep_api().MemoryDevice_AreEqual)(self.device, device) }
    }
}

/// Whether ORT's memory device is host memory (the CPU's, or memory the host can read).
fn is_host(device: *const OrtMemoryDevice) -> bool {
    if device.is_null() {
        return false;
    }
    // SAFETY: a valid memory device from ORT.
    unsafe {
        (ep_api().MemoryDevice_GetDeviceType)(device) == OrtMemoryInfoDeviceType::OrtMemoryInfoDeviceType_CPU
            || (ep_api().MemoryDevice_GetMemoryType)(device) == OrtDeviceMemoryType::OrtDeviceMemoryType_HOST_ACCESSIBLE
    }
}

/// The live allocations of the EP's memory, by start address, and the freed ones kept for
/// reuse (newest last).
pub(crate) struct Blocks(Mutex<BTreeMap<usize, DeviceBuffer>>, Mutex<Vec<DeviceBuffer>>);

/// Freed blocks kept for reuse: at most this many, of at most [`KEPT_BYTES`] in all. ORT
/// allocates a run's device copies of host inputs and outputs anew every run; a fresh block
/// costs an MLX evaluation and, on CUDA, a managed allocation and a copy (see
/// [`DeviceBuffer::new`]), a kept one a device memset.
const KEPT_BLOCKS: usize = 16;
const KEPT_BYTES: usize = 512 << 20;

/// Allocations served fresh and from the kept blocks, and the time spent in both (for the
/// verbose summary).
static FRESH: AtomicU64 = AtomicU64::new(0);
static REUSED: AtomicU64 = AtomicU64::new(0);
static ALLOC_NS: AtomicU64 = AtomicU64::new(0);

/// ORT's `CopyTensors` calls (its copies of host inputs into the EP's memory and of outputs
/// back, outside the partitions' runs): calls, tensors, bytes and time, for the verbose summary.
static TRANSFER_CALLS: AtomicU64 = AtomicU64::new(0);
static TRANSFER_TENSORS: AtomicU64 = AtomicU64::new(0);
static TRANSFER_BYTES: AtomicU64 = AtomicU64::new(0);
static TRANSFER_NS: AtomicU64 = AtomicU64::new(0);

/// The process's allocations of the EP's memory and ORT's copies through the EP so far, for
/// the verbose summary.
pub(crate) fn allocation_summary() -> Option<String> {
    let (fresh, reused) = (FRESH.load(Ordering::Relaxed), REUSED.load(Ordering::Relaxed));
    (fresh + reused > 0).then(|| {
        let ms = ALLOC_NS.load(Ordering::Relaxed) as f64 / 1e6;
        let calls = TRANSFER_CALLS.load(Ordering::Relaxed);
        let (tensors, bytes) = (TRANSFER_TENSORS.load(Ordering::Relaxed), TRANSFER_BYTES.load(Ordering::Relaxed));
        let copy_ms = TRANSFER_NS.load(Ordering::Relaxed) as f64 / 1e6;
        format!(
            "the EP's memory (process-wide): {fresh} blocks allocated, {reused} reused, {ms:.3} ms in all; \
             ORT's copies through the EP: {calls} calls, {tensors} tensors, {bytes} bytes, {copy_ms:.3} ms in all"
        )
    })
}

impl Blocks {
    pub(crate) fn global() -> &'static Blocks {
        static BLOCKS: Blocks = Blocks(Mutex::new(BTreeMap::new()), Mutex::new(Vec::new()));
        &BLOCKS
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, DeviceBuffer>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<DeviceBuffer>> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn alloc(&self, size: usize) -> Result<*mut u8> {
        let started = std::time::Instant::now();
        let _mlx = mlx::lock();
        let len = size.max(1);
        let kept = {
            let mut kept = self.kept();
            kept.iter().rposition(|b| b.len() == len).map(|i| kept.remove(i))
        };
        let block = match kept {
            Some(block) => {
                // Zeroed as a fresh block is.
                // SAFETY: the block's own `len` bytes, no longer ORT's nor read by MLX work.
                unsafe { mlx::device::zero_bytes(block.ptr(), block.len()) }?;
                REUSED.fetch_add(1, Ordering::Relaxed);
                block
            }
            None => {
                FRESH.fetch_add(1, Ordering::Relaxed);
                DeviceBuffer::new(size, &Stream::default_device()?)?
            }
        };
        let ptr = block.ptr();
        self.map().insert(ptr as usize, block);
        ALLOC_NS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(ptr)
    }

    fn free(&self, ptr: *mut u8) {
        let _mlx = mlx::lock();
        let Some(block) = self.map().remove(&(ptr as usize)) else { return };
        let mut kept = self.kept();
        kept.push(block);
        while kept.len() > KEPT_BLOCKS || kept.iter().map(DeviceBuffer::len).sum::<usize>() > KEPT_BYTES {
            kept.remove(0);
        }
    }

    /// The `bytes` at `ptr` (inside a live allocation) as an array of `shape` and `dtype`
    /// sharing the EP's memory; `None` when `ptr` is not the EP's. The caller holds the MLX
    /// lock.
    pub(crate) fn view(&self, ptr: *const u8, shape: &[i64], dtype: Dtype, stream: &Stream) -> Result<Option<Array>> {
        let p = ptr as usize;
        let map = self.map();
        let Some((&start, block)) = map.range(..=p).next_back().filter(|(s, b)| p < **s + b.len()) else {
            return Ok(None);
        };
        Ok(Some(block.view(p - start, shape, dtype, stream)?))
    }
}

/// The EP's allocator (one for the process; ORT may ask for it several times).
#[repr(C)]
pub(crate) struct Allocator {
    table: OrtAllocator,
    info: *const OrtMemoryInfo,
}

/// ORT reads the allocator's table no further than this version's fields (no streams, no
/// statistics).
const ALLOCATOR_VERSION: u32 = 23;

impl Allocator {
    pub(crate) fn new(memory: &DeviceMemory) -> Box<Allocator> {
        Box::new(Allocator {
            table: OrtAllocator {
                version: ALLOCATOR_VERSION,
                Alloc: Some(alloc),
                Free: Some(free),
                Info: Some(info),
                Reserve: Some(reserve),
                GetStats: None,
                AllocOnStream: None,
                Shrink: None,
            },
            info: memory.info(),
        })
    }
}

unsafe extern "system" fn alloc(_this: *mut OrtAllocator, size: usize) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || match Blocks::global().alloc(size) {
        Ok(p) => p.cast(),
        Err(e) => {
            eprintln!("[{}] could not allocate {size} bytes of MLX memory: {e}", crate::EP_NAME);
            std::ptr::null_mut()
        }
    })
}

unsafe extern "system" fn reserve(_this: *const OrtAllocator, size: usize) -> *mut c_void {
    // SAFETY: `alloc` does not use its first argument.
    unsafe { alloc(std::ptr::null_mut(), size) }
}

unsafe extern "system" fn free(_this: *mut OrtAllocator, p: *mut c_void) {
    guard_value((), || {
        if !p.is_null() {
            Blocks::global().free(p.cast());
        }
    })
}

unsafe extern "system" fn info(this: *const OrtAllocator) -> *const OrtMemoryInfo {
    // SAFETY: `this` is an `Allocator` (its table is the first field).
    guard_value(std::ptr::null(), || unsafe { (*this.cast::<Allocator>()).info })
}

/// The EP's data transfer: host <-> EP memory, and EP memory <-> EP memory.
#[repr(C)]
pub(crate) struct DataTransfer {
    table: OrtDataTransferImpl,
}

impl DataTransfer {
    pub(crate) fn new() -> Box<DataTransfer> {
        Box::new(DataTransfer {
            table: OrtDataTransferImpl {
                ort_version_supported: super::tables::TABLE_VERSION,
                Release: Some(release_transfer),
                CanCopy: Some(can_copy),
                CopyTensors: Some(copy_tensors),
            },
        })
    }
}

unsafe extern "system" fn release_transfer(this: *mut OrtDataTransferImpl) {
    guard_value((), || {
        if !this.is_null() {
            // SAFETY: created by `DataTransfer::new` and handed to ORT with `Box::into_raw`.
            drop(unsafe { Box::from_raw(this.cast::<DataTransfer>()) });
        }
    })
}

unsafe extern "system" fn can_copy(
    _this: *const OrtDataTransferImpl,
    src: *const OrtMemoryDevice,
    dst: *const OrtMemoryDevice,
) -> bool {
    guard_value(false, || {
        let Some(m) = DeviceMemory::get() else { return false };
        (m.is(src) && (m.is(dst) || is_host(dst))) || (m.is(dst) && is_host(src))
    })
}

unsafe extern "system" fn copy_tensors(
    _this: *mut OrtDataTransferImpl,
    src: *const *const OrtValue,
    dst: *const *mut OrtValue,
    _streams: *const *mut OrtSyncStream,
    count: usize,
) -> OrtStatusPtr {
    guard("CopyTensors", || {
        if count == 0 {
            return Ok(());
        }
        if src.is_null() || dst.is_null() {
            return Err(Error::new("CopyTensors got no tensors"));
        }
        // SAFETY: ORT passes `count` source and destination values.
        let (src, dst) = unsafe { (std::slice::from_raw_parts(src, count), std::slice::from_raw_parts(dst, count)) };
        let mut copies = Vec::with_capacity(count);
        for (&s, &d) in src.iter().zip(dst) {
            let (sp, sn) = tensor_bytes(s)?;
            let (dp, dn) = tensor_bytes(d)?;
            if sn != dn {
                return Err(Error::new(format!("CopyTensors: a {sn}-byte tensor into a {dn}-byte one")));
            }
            copies.push((dp, sp.cast_const(), sn));
        }
        let started = std::time::Instant::now();
        // SAFETY: each pair is two live tensors of `n` bytes that ORT owns for this call.
        let copied = unsafe { copy_many(&copies) };
        TRANSFER_NS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        TRANSFER_CALLS.fetch_add(1, Ordering::Relaxed);
        TRANSFER_TENSORS.fetch_add(count as u64, Ordering::Relaxed);
        TRANSFER_BYTES.fetch_add(copies.iter().map(|c| c.2 as u64).sum(), Ordering::Relaxed);
        copied
    })
}

/// Copies each `(dst, src, n)`; both sides may be the EP's memory or host memory.
///
/// # Safety
/// As for [`copy_bytes_many`].
pub(crate) unsafe fn copy_many(copies: &[(*mut u8, *const u8, usize)]) -> Result<()> {
    // SAFETY: per the caller.
    Ok(unsafe { copy_bytes_many(copies) }?)
}

/// A tensor's data pointer and size in bytes.
pub(crate) fn tensor_bytes(value: *const OrtValue) -> Result<(*mut u8, usize)> {
    let mut size = 0usize;
    ort_call!(GetTensorSizeInBytes(value, &mut size))?;
    let mut data: *mut c_void = std::ptr::null_mut();
    ort_call!(GetTensorMutableData(value.cast_mut(), &mut data))?;
    if data.is_null() && size > 0 {
        return Err(Error::new("a tensor has no data"));
    }
    Ok((data.cast(), size))
}

/// `OrtMlxEp_GetMemoryStats`: MLX's active, cache and peak bytes into `values`.
///
/// # Safety
/// `values` must point to `capacity` writable `u64`s.
pub unsafe fn memory_stats(values: *mut u64, capacity: usize) -> usize {
    guard_value(0, || {
        let Ok(s) = crate::mlx::device::memory_stats() else { return 0 };
        if values.is_null() {
            return 0;
        }
        let figures = [s.active, s.cache, s.peak];
        let n = capacity.min(figures.len());
        for (i, v) in figures.iter().take(n).enumerate() {
            // SAFETY: i < capacity, which the caller vouches for.
            unsafe { *values.add(i) = *v as u64 };
        }
        n
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A freed block is kept and handed out again for the same size, zeroed as a fresh one is.
    #[test]
    fn a_freed_block_is_reused_for_the_same_size_and_comes_back_zeroed() {
        let blocks = Blocks::global();
        let size = 12_345;
        let first = blocks.alloc(size).unwrap();
        // SAFETY: the block holds `size` bytes and nothing else uses it.
        unsafe { std::ptr::write_bytes(first, 0xAB, size) };
        blocks.free(first);
        let again = blocks.alloc(size).unwrap();
        assert_eq!(again, first, "the kept block serves the same size");
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(again, size) };
        assert!(bytes.iter().all(|&b| b == 0), "a reused block comes back zeroed");
        let other = blocks.alloc(size + 1).unwrap();
        assert_ne!(other, again, "another size is a block of its own");
        blocks.free(other);
        blocks.free(again);
        assert!(REUSED.load(Ordering::Relaxed) >= 1 && allocation_summary().is_some());
    }
}
