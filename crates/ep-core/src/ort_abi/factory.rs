//! `CreateEpFactories` / `ReleaseEpFactory` and the `OrtEpFactory` table.

use super::boundary::{guard, guard_value, non_null};
use super::device::{Allocator, DataTransfer, DeviceMemory};
use super::ep::Ep;
use super::ep_api;
use super::tables::{OrtDataTransferImpl, OrtEp, OrtEpFactory, OrtMemoryDevice, OrtSyncStreamImpl, TABLE_VERSION};
use crate::{EP_NAME, Error, MIN_ORT_API_VERSION, Result};
use ort_sys::{
    OrtAllocator, OrtApiBase, OrtCompiledModelCompatibility, OrtEpDevice, OrtErrorCode, OrtHardwareDevice,
    OrtHardwareDeviceType, OrtKeyValuePairs, OrtLogger, OrtMemoryInfo, OrtSessionOptions, OrtStatusPtr,
};
use std::ffi::{CStr, CString, c_char};

const VENDOR: &CStr = c"onnxruntime-mlx";

/// The factory ORT holds; `table` must stay the first field (ORT sees a pointer to it).
#[repr(C)]
pub struct Factory {
    table: OrtEpFactory,
    version: CString,
}

fn version_string() -> CString {
    CString::new(env!("CARGO_PKG_VERSION")).expect("no NUL in a version")
}

/// The body of the plugin's exported `CreateEpFactories`.
///
/// # Safety
/// Called by ORT with the arguments of `CreateEpApiFactoriesFn`.
pub unsafe fn create_ep_factories(
    _registered_name: *const c_char,
    ort_api_base: *const OrtApiBase,
    _default_logger: *const OrtLogger,
    factories: *mut *mut OrtEpFactory,
    max_factories: usize,
    num_factories: *mut usize,
) -> OrtStatusPtr {
    if ort_api_base.is_null() || factories.is_null() || num_factories.is_null() {
        return OrtStatusPtr(std::ptr::null_mut());
    }
    // SAFETY: ORT passes valid pointers.
    unsafe { *num_factories = 0 };
    // SAFETY: `ort_api_base` is ORT's static table.
    let base = unsafe { &*ort_api_base };
    // SAFETY: GetApi returns null for versions this ORT does not provide.
    let api = unsafe { (base.GetApi)(MIN_ORT_API_VERSION) };
    if api.is_null() {
        return refuse_old_ort(base);
    }
    guard("CreateEpFactories", || {
        // SAFETY: `api` is ORT's API table for version 31, valid for the process.
        unsafe { super::set_api(api)? };
        crate::mlx::init();
        crate::registry::global()?;
        if max_factories < 1 {
            return Err(Error::new("ORT offered no room for a factory"));
        }
        let factory = Box::new(Factory { table: factory_table(), version: version_string() });
        // SAFETY: `factories` has room for `max_factories` >= 1 entries.
        unsafe {
            *factories = Box::into_raw(factory).cast::<OrtEpFactory>();
            *num_factories = 1;
        }
        Ok(())
    })
}

/// An ORT older than API 31: say so with whatever API table it has.
fn refuse_old_ort(base: &OrtApiBase) -> OrtStatusPtr {
    // SAFETY: GetVersionString returns a static string.
    let version = super::c_str(unsafe { (base.GetVersionString)() });
    let msg = CString::new(format!(
        "{EP_NAME} needs ONNX Runtime 1.31 or newer (C API version {MIN_ORT_API_VERSION}); this ONNX Runtime is {version}"
    ))
    .unwrap_or_default();
    for v in (1..MIN_ORT_API_VERSION).rev() {
        // SAFETY: as above.
        let api = unsafe { (base.GetApi)(v) };
        if !api.is_null() {
            // SAFETY: CreateStatus exists in every API version and copies the message.
            return unsafe { ((*api).CreateStatus)(OrtErrorCode::ORT_NOT_IMPLEMENTED, msg.as_ptr()) };
        }
    }
    OrtStatusPtr(std::ptr::null_mut())
}

/// The body of the plugin's exported `ReleaseEpFactory`.
///
/// # Safety
/// `factory` must come from [`create_ep_factories`] and be released once.
pub unsafe fn release_ep_factory(factory: *mut OrtEpFactory) -> OrtStatusPtr {
    guard("ReleaseEpFactory", || {
        if !factory.is_null() {
            // SAFETY: created by `Box::into_raw` in `create_ep_factories`.
            drop(unsafe { Box::from_raw(factory.cast::<Factory>()) });
        }
        Ok(())
    })
}

fn factory_table() -> OrtEpFactory {
    OrtEpFactory {
        ort_version_supported: TABLE_VERSION,
        GetName: Some(get_name),
        GetVendor: Some(get_vendor),
        GetSupportedDevices: Some(get_supported_devices),
        CreateEp: Some(create_ep),
        ReleaseEp: Some(release_ep),
        GetVendorId: Some(get_vendor_id),
        GetVersion: Some(get_version),
        ValidateCompiledModelCompatibilityInfo: Some(validate_compatibility),
        CreateAllocator: Some(create_allocator),
        ReleaseAllocator: Some(release_allocator),
        CreateDataTransfer: Some(create_data_transfer),
        IsStreamAware: Some(is_stream_aware),
        CreateSyncStreamForDevice: Some(create_sync_stream),
        GetHardwareDeviceIncompatibilityDetails: None,
        CreateExternalResourceImporterForDevice: None,
        GetNumCustomOpDomains: None,
        GetCustomOpDomains: None,
    }
}

unsafe extern "system" fn get_name(_this: *const OrtEpFactory) -> *const c_char {
    super::EP_NAME_C.as_ptr()
}

unsafe extern "system" fn get_vendor(_this: *const OrtEpFactory) -> *const c_char {
    VENDOR.as_ptr()
}

unsafe extern "system" fn get_vendor_id(_this: *const OrtEpFactory) -> u32 {
    0
}

unsafe extern "system" fn get_version(this: *const OrtEpFactory) -> *const c_char {
    // SAFETY: `this` is our factory.
    guard_value(c"0.0.0".as_ptr(), || unsafe { (*this.cast::<Factory>()).version.as_ptr() })
}

unsafe extern "system" fn get_supported_devices(
    this: *mut OrtEpFactory,
    devices: *const *const OrtHardwareDevice,
    num_devices: usize,
    ep_devices: *mut *mut OrtEpDevice,
    max_ep_devices: usize,
    num_ep_devices: *mut usize,
) -> OrtStatusPtr {
    guard("GetSupportedDevices", || {
        non_null(num_ep_devices, "num_ep_devices")?;
        // SAFETY: ORT passes valid out-pointers and `num_devices` device pointers.
        unsafe { *num_ep_devices = 0 };
        if devices.is_null() || ep_devices.is_null() || max_ep_devices == 0 {
            return Ok(());
        }
        // SAFETY: ORT passes `num_devices` valid hardware-device pointers.
        let devices = unsafe { std::slice::from_raw_parts(devices, num_devices) };
        let Some((device, vendor)) = pick_device(devices) else { return Ok(()) };
        let gpu = crate::mlx::default_device_is_gpu();
        let device_memory = gpu || crate::options::DEVICE_MEMORY.env_on();
        let metadata = Metadata::new(&[
            ("mlx.backend", backend_name()),
            ("mlx.version", &crate::mlx::version().unwrap_or_default()),
            ("mlx.memory", if device_memory { "device" } else { "host" }),
        ])?;
        let mut ep_device: *mut OrtEpDevice = std::ptr::null_mut();
        // SAFETY: `this` is our factory; ORT copies the metadata and takes ownership of the
        // created device.
        let status = unsafe { (ep_api().CreateEpDevice)(this, device, metadata.0, std::ptr::null(), &mut ep_device) };
        super::check_status(status, "CreateEpDevice")?;
        if device_memory {
            let memory = DeviceMemory::get_or_create(vendor)?;
            // SAFETY: a device just created and the EP's memory info, which ORT copies.
            let status = unsafe { (ep_api().EpDevice_AddAllocatorInfo)(ep_device, memory.info()) };
            if let Err(e) = super::check_status(status, "EpDevice_AddAllocatorInfo") {
                // SAFETY: the device was not handed to ORT yet.
                unsafe { (ep_api().ReleaseEpDevice)(ep_device) };
                return Err(e);
            }
        }
        // SAFETY: `ep_devices` holds room for `max_ep_devices` (at least 1) entries; both are ORT's.
        unsafe {
            *ep_devices = ep_device;
            *num_ep_devices = 1;
        }
        Ok(())
    })
}

/// The hardware device the EP runs on, and the vendor id of its memory: on a GPU backend ORT's
/// GPU device (the CPU's where ORT lists none), else the CPU.
fn pick_device(devices: &[*const OrtHardwareDevice]) -> Option<(*const OrtHardwareDevice, u32)> {
    let api = super::api();
    // SAFETY: valid hardware devices from ORT.
    let of_type = |ty| devices.iter().copied().find(|&d| unsafe { (api.HardwareDevice_Type)(d) } == ty);
    let cpu = of_type(OrtHardwareDeviceType::OrtHardwareDeviceType_CPU);
    if crate::mlx::default_device_is_gpu()
        && let Some(gpu) = of_type(OrtHardwareDeviceType::OrtHardwareDeviceType_GPU)
    {
        // SAFETY: as above.
        return Some((gpu, unsafe { (api.HardwareDevice_VendorId)(gpu) }));
    }
    cpu.map(|d| (d, super::device::CPU_BACKEND_VENDOR))
}

fn backend_name() -> &'static str {
    if !crate::mlx::default_device_is_gpu() {
        "cpu"
    } else if crate::mlx::device::is_cuda() {
        "cuda"
    } else {
        "metal"
    }
}

/// ORT key-value pairs, released on drop.
struct Metadata(*mut OrtKeyValuePairs);

impl Metadata {
    fn new(pairs: &[(&str, &str)]) -> Result<Metadata> {
        let api = super::api();
        let mut kvps: *mut OrtKeyValuePairs = std::ptr::null_mut();
        // SAFETY: ORT creates the set; keys and values are copied by AddKeyValuePair.
        unsafe { (api.CreateKeyValuePairs)(&mut kvps) };
        if kvps.is_null() {
            return Err(Error::new("ORT could not create key-value pairs"));
        }
        let out = Metadata(kvps);
        for (k, v) in pairs {
            let (k, v) = (CString::new(*k).unwrap_or_default(), CString::new(*v).unwrap_or_default());
            // SAFETY: a valid set and NUL-terminated strings.
            unsafe { (api.AddKeyValuePair)(out.0, k.as_ptr(), v.as_ptr()) };
        }
        Ok(out)
    }
}

impl Drop for Metadata {
    fn drop(&mut self) {
        // SAFETY: created by CreateKeyValuePairs, released once.
        unsafe { (super::api().ReleaseKeyValuePairs)(self.0) };
    }
}

unsafe extern "system" fn create_ep(
    _this: *mut OrtEpFactory,
    _devices: *const *const OrtHardwareDevice,
    _ep_metadata: *const *const OrtKeyValuePairs,
    _num_devices: usize,
    session_options: *const OrtSessionOptions,
    _logger: *const OrtLogger,
    ep: *mut *mut OrtEp,
) -> OrtStatusPtr {
    guard("CreateEp", || {
        non_null(ep, "ep")?;
        let ep_box = Ep::new(session_options)?;
        // SAFETY: `ep` is a valid out-pointer; ORT releases it through `release_ep`.
        unsafe { *ep = Box::into_raw(ep_box).cast::<OrtEp>() };
        Ok(())
    })
}

unsafe extern "system" fn release_ep(_this: *mut OrtEpFactory, ep: *mut OrtEp) {
    guard_value((), || {
        if !ep.is_null() {
            // SAFETY: created by `create_ep`.
            drop(unsafe { Box::from_raw(ep.cast::<Ep>()) });
        }
    })
}

unsafe extern "system" fn validate_compatibility(
    _this: *mut OrtEpFactory,
    _devices: *const *const OrtHardwareDevice,
    _num_devices: usize,
    _info: *const c_char,
    out: *mut OrtCompiledModelCompatibility,
) -> OrtStatusPtr {
    guard("ValidateCompiledModelCompatibilityInfo", || {
        non_null(out, "model_compatibility")?;
        // The EP produces no pre-compiled models.
        // SAFETY: `out` was checked non-null; ORT passes a writable pointer.
        unsafe { *out = OrtCompiledModelCompatibility::EP_NOT_APPLICABLE };
        Ok(())
    })
}

unsafe extern "system" fn create_allocator(
    _this: *mut OrtEpFactory,
    memory_info: *const OrtMemoryInfo,
    _options: *const OrtKeyValuePairs,
    allocator: *mut *mut OrtAllocator,
) -> OrtStatusPtr {
    guard("CreateAllocator", || {
        non_null(allocator, "allocator")?;
        let ours = DeviceMemory::get().filter(|m| std::ptr::eq(m.info(), memory_info));
        // The EP's memory gets the EP's allocator; host memory is ORT's own.
        let out = ours.map_or(std::ptr::null_mut(), |m| Box::into_raw(Allocator::new(m)).cast::<OrtAllocator>());
        // SAFETY: `allocator` was checked non-null; ORT passes a writable pointer.
        unsafe { *allocator = out };
        Ok(())
    })
}

unsafe extern "system" fn release_allocator(_this: *mut OrtEpFactory, allocator: *mut OrtAllocator) {
    guard_value((), || {
        if !allocator.is_null() {
            // SAFETY: created by `create_allocator` with `Box::into_raw`.
            drop(unsafe { Box::from_raw(allocator.cast::<Allocator>()) });
        }
    })
}

unsafe extern "system" fn create_data_transfer(
    _this: *mut OrtEpFactory,
    out: *mut *mut OrtDataTransferImpl,
) -> OrtStatusPtr {
    guard("CreateDataTransfer", || {
        non_null(out, "data_transfer")?;
        let transfer = match DeviceMemory::get() {
            Some(_) => Box::into_raw(DataTransfer::new()).cast::<OrtDataTransferImpl>(),
            None => std::ptr::null_mut(),
        };
        // SAFETY: `out` was checked non-null; ORT passes a writable pointer.
        unsafe { *out = transfer };
        Ok(())
    })
}

unsafe extern "system" fn is_stream_aware(_this: *const OrtEpFactory) -> bool {
    false
}

unsafe extern "system" fn create_sync_stream(
    _this: *mut OrtEpFactory,
    _device: *const OrtMemoryDevice,
    _options: *const OrtKeyValuePairs,
    stream: *mut *mut OrtSyncStreamImpl,
) -> OrtStatusPtr {
    guard("CreateSyncStreamForDevice", || {
        non_null(stream, "stream")?;
        // SAFETY: `stream` was checked non-null; ORT passes a writable pointer.
        unsafe { *stream = std::ptr::null_mut() };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "system" fn no_api(_version: u32) -> *const ort_sys::OrtApi {
        std::ptr::null()
    }

    unsafe extern "system" fn old_version() -> *const c_char {
        c"1.20.0".as_ptr()
    }

    #[test]
    fn an_ort_without_api_31_gets_no_factory_and_no_crash() {
        let base = OrtApiBase { GetApi: no_api, GetVersionString: old_version };
        let mut factories = [std::ptr::null_mut::<OrtEpFactory>(); 4];
        let mut count = 99usize;
        // SAFETY: valid pointers to locals; the fake ORT offers no API table at all.
        let status = unsafe {
            create_ep_factories(
                c"MLX".as_ptr(),
                &base,
                std::ptr::null(),
                factories.as_mut_ptr(),
                factories.len(),
                &mut count,
            )
        };
        assert!(status.0.is_null(), "without any API table there is no way to build a status");
        assert_eq!(count, 0);
        assert!(factories.iter().all(|f| f.is_null()));
    }
}
