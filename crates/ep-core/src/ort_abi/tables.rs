//! The EP-side tables of ONNX Runtime's plugin ABI (`onnxruntime_ep_c_api.h`), declared field
//! for field. `ort-sys` declares these types opaque or not at all.
//!
//! ORT only ever appends to these structs and reads no further than `ort_version_supported`
//! says, so the tables we fill stop at the version whose layout is declared here
//! ([`TABLE_VERSION`]), while the `OrtApi` we call is that of API 31 (ONNX Runtime 1.31).
#![allow(non_snake_case, non_camel_case_types)]

use ort_sys::{
    OrtAllocator, OrtCompiledModelCompatibility, OrtDeviceMemoryType, OrtEpDevice, OrtGraph, OrtHardwareDevice,
    OrtKernelContext, OrtKeyValuePairs, OrtLogger, OrtMemoryInfo, OrtMemoryInfoDeviceType, OrtNode, OrtRunOptions,
    OrtSessionOptions, OrtStatusPtr, OrtValue,
};
use std::ffi::{c_char, c_int, c_void};

/// The API version whose table layouts are declared below (ONNX Runtime 1.24's).
pub const TABLE_VERSION: u32 = 24;

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    OrtEpGraphSupportInfo,
    OrtNodeComputeContext,
    OrtMemoryDevice,
    OrtSyncStreamImpl,
    OrtSyncStream,
    OrtKernelRegistry
);

/// `OrtDataTransferImpl`: copies between the EP's memory and the host.
#[repr(C)]
pub struct OrtDataTransferImpl {
    pub ort_version_supported: u32,
    pub Release: Option<unsafe extern "system" fn(this_ptr: *mut OrtDataTransferImpl)>,
    pub CanCopy: Option<
        unsafe extern "system" fn(
            this_ptr: *const OrtDataTransferImpl,
            src: *const OrtMemoryDevice,
            dst: *const OrtMemoryDevice,
        ) -> bool,
    >,
    pub CopyTensors: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtDataTransferImpl,
            src_tensors: *const *const OrtValue,
            dst_tensors: *const *mut OrtValue,
            streams: *const *mut OrtSyncStream,
            num_tensors: usize,
        ) -> OrtStatusPtr,
    >,
}

/// `OrtEpDataLayout`.
pub type OrtEpDataLayout = c_int;

/// The first entries of `OrtEpApi` (the ones the EP calls); the table continues in ORT.
#[repr(C)]
pub struct OrtEpApi {
    pub CreateEpDevice: unsafe extern "system" fn(
        ep_factory: *mut OrtEpFactory,
        hardware_device: *const OrtHardwareDevice,
        ep_metadata: *const OrtKeyValuePairs,
        ep_options: *const OrtKeyValuePairs,
        ep_device: *mut *mut OrtEpDevice,
    ) -> OrtStatusPtr,
    pub ReleaseEpDevice: unsafe extern "system" fn(device: *mut OrtEpDevice),
    pub EpGraphSupportInfo_AddNodesToFuse: unsafe extern "system" fn(
        graph_support_info: *mut OrtEpGraphSupportInfo,
        nodes: *const *const OrtNode,
        num_nodes: usize,
        node_fusion_options: *const OrtNodeFusionOptions,
    ) -> OrtStatusPtr,
    pub EpGraphSupportInfo_AddSingleNode:
        unsafe extern "system" fn(graph_support_info: *mut OrtEpGraphSupportInfo, node: *const OrtNode) -> OrtStatusPtr,
    pub NodeComputeContext_NodeName: unsafe extern "system" fn(context: *const OrtNodeComputeContext) -> *const c_char,
    pub EpDevice_AddAllocatorInfo: unsafe extern "system" fn(
        ep_device: *mut OrtEpDevice,
        allocator_memory_info: *const OrtMemoryInfo,
    ) -> OrtStatusPtr,
    pub MemoryInfo_GetMemoryDevice:
        unsafe extern "system" fn(memory_info: *const OrtMemoryInfo) -> *const OrtMemoryDevice,
    pub Value_GetMemoryDevice: unsafe extern "system" fn(value: *const OrtValue) -> *const OrtMemoryDevice,
    pub MemoryDevice_AreEqual: unsafe extern "system" fn(a: *const OrtMemoryDevice, b: *const OrtMemoryDevice) -> bool,
    pub MemoryDevice_GetDeviceType:
        unsafe extern "system" fn(memory_device: *const OrtMemoryDevice) -> OrtMemoryInfoDeviceType,
    pub MemoryDevice_GetMemoryType:
        unsafe extern "system" fn(memory_device: *const OrtMemoryDevice) -> OrtDeviceMemoryType,
}

#[repr(C)]
pub struct OrtNodeFusionOptions {
    pub ort_version_supported: u32,
    pub drop_constant_initializers: bool,
}

#[repr(C)]
pub struct OrtNodeComputeInfo {
    pub ort_version_supported: u32,
    pub CreateState: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtNodeComputeInfo,
            compute_context: *mut OrtNodeComputeContext,
            compute_state: *mut *mut c_void,
        ) -> OrtStatusPtr,
    >,
    pub Compute: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtNodeComputeInfo,
            compute_state: *mut c_void,
            kernel_context: *mut OrtKernelContext,
        ) -> OrtStatusPtr,
    >,
    pub ReleaseState: Option<unsafe extern "system" fn(this_ptr: *mut OrtNodeComputeInfo, compute_state: *mut c_void)>,
}

#[repr(C)]
pub struct OrtEp {
    pub ort_version_supported: u32,
    pub GetName: Option<unsafe extern "system" fn(this_ptr: *const OrtEp) -> *const c_char>,
    pub GetCapability: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEp,
            graph: *const OrtGraph,
            graph_support_info: *mut OrtEpGraphSupportInfo,
        ) -> OrtStatusPtr,
    >,
    pub Compile: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEp,
            graphs: *const *const OrtGraph,
            fused_nodes: *const *const OrtNode,
            count: usize,
            node_compute_infos: *mut *mut OrtNodeComputeInfo,
            ep_context_nodes: *mut *mut OrtNode,
        ) -> OrtStatusPtr,
    >,
    pub ReleaseNodeComputeInfos: Option<
        unsafe extern "system" fn(this_ptr: *mut OrtEp, node_compute_infos: *mut *mut OrtNodeComputeInfo, count: usize),
    >,
    pub GetPreferredDataLayout: Option<
        unsafe extern "system" fn(this_ptr: *mut OrtEp, preferred_data_layout: *mut OrtEpDataLayout) -> OrtStatusPtr,
    >,
    pub ShouldConvertDataLayoutForOp: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEp,
            domain: *const c_char,
            op_type: *const c_char,
            target_data_layout: OrtEpDataLayout,
            should_convert: *mut c_int,
        ) -> OrtStatusPtr,
    >,
    pub SetDynamicOptions: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEp,
            option_keys: *const *const c_char,
            option_values: *const *const c_char,
            num_options: usize,
        ) -> OrtStatusPtr,
    >,
    pub OnRunStart:
        Option<unsafe extern "system" fn(this_ptr: *mut OrtEp, run_options: *const OrtRunOptions) -> OrtStatusPtr>,
    pub OnRunEnd: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEp,
            run_options: *const OrtRunOptions,
            sync_stream: bool,
        ) -> OrtStatusPtr,
    >,
    pub CreateAllocator: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEp,
            memory_info: *const OrtMemoryInfo,
            allocator: *mut *mut OrtAllocator,
        ) -> OrtStatusPtr,
    >,
    pub CreateSyncStreamForDevice: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEp,
            memory_device: *const OrtMemoryDevice,
            stream: *mut *mut OrtSyncStreamImpl,
        ) -> OrtStatusPtr,
    >,
    pub GetCompiledModelCompatibilityInfo:
        Option<unsafe extern "system" fn(this_ptr: *mut OrtEp, graph: *const OrtGraph) -> *const c_char>,
    pub GetKernelRegistry: Option<
        unsafe extern "system" fn(this_ptr: *mut OrtEp, kernel_registry: *mut *const OrtKernelRegistry) -> OrtStatusPtr,
    >,
    pub IsConcurrentRunSupported:
        Option<unsafe extern "system" fn(this_ptr: *mut OrtEp, is_supported: *mut bool) -> OrtStatusPtr>,
}

#[repr(C)]
pub struct OrtEpFactory {
    pub ort_version_supported: u32,
    pub GetName: Option<unsafe extern "system" fn(this_ptr: *const OrtEpFactory) -> *const c_char>,
    pub GetVendor: Option<unsafe extern "system" fn(this_ptr: *const OrtEpFactory) -> *const c_char>,
    pub GetSupportedDevices: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            devices: *const *const OrtHardwareDevice,
            num_devices: usize,
            ep_devices: *mut *mut OrtEpDevice,
            max_ep_devices: usize,
            num_ep_devices: *mut usize,
        ) -> OrtStatusPtr,
    >,
    pub CreateEp: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            devices: *const *const OrtHardwareDevice,
            ep_metadata_pairs: *const *const OrtKeyValuePairs,
            num_devices: usize,
            session_options: *const OrtSessionOptions,
            logger: *const OrtLogger,
            ep: *mut *mut OrtEp,
        ) -> OrtStatusPtr,
    >,
    pub ReleaseEp: Option<unsafe extern "system" fn(this_ptr: *mut OrtEpFactory, ep: *mut OrtEp)>,
    pub GetVendorId: Option<unsafe extern "system" fn(this_ptr: *const OrtEpFactory) -> u32>,
    pub GetVersion: Option<unsafe extern "system" fn(this_ptr: *const OrtEpFactory) -> *const c_char>,
    pub ValidateCompiledModelCompatibilityInfo: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            devices: *const *const OrtHardwareDevice,
            num_devices: usize,
            compatibility_info: *const c_char,
            model_compatibility: *mut OrtCompiledModelCompatibility,
        ) -> OrtStatusPtr,
    >,
    pub CreateAllocator: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            memory_info: *const OrtMemoryInfo,
            allocator_options: *const OrtKeyValuePairs,
            allocator: *mut *mut OrtAllocator,
        ) -> OrtStatusPtr,
    >,
    pub ReleaseAllocator: Option<unsafe extern "system" fn(this_ptr: *mut OrtEpFactory, allocator: *mut OrtAllocator)>,
    pub CreateDataTransfer: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            data_transfer: *mut *mut OrtDataTransferImpl,
        ) -> OrtStatusPtr,
    >,
    pub IsStreamAware: Option<unsafe extern "system" fn(this_ptr: *const OrtEpFactory) -> bool>,
    pub CreateSyncStreamForDevice: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            memory_device: *const OrtMemoryDevice,
            stream_options: *const OrtKeyValuePairs,
            stream: *mut *mut OrtSyncStreamImpl,
        ) -> OrtStatusPtr,
    >,
    pub GetHardwareDeviceIncompatibilityDetails: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            hw: *const OrtHardwareDevice,
            details: *mut c_void,
        ) -> OrtStatusPtr,
    >,
    pub CreateExternalResourceImporterForDevice: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            ep_device: *const OrtEpDevice,
            out_importer: *mut *mut c_void,
        ) -> OrtStatusPtr,
    >,
    pub GetNumCustomOpDomains:
        Option<unsafe extern "system" fn(this_ptr: *mut OrtEpFactory, num_domains: *mut usize) -> OrtStatusPtr>,
    pub GetCustomOpDomains: Option<
        unsafe extern "system" fn(
            this_ptr: *mut OrtEpFactory,
            domains: *mut *mut c_void,
            num_domains: usize,
        ) -> OrtStatusPtr,
    >,
}
