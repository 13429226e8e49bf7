//! The host's only raw calls into ORT's C API: the graph-assignment record, which the `ort`
//! crate does not wrap. Everything else goes through `ort`'s safe API.

use crate::{AssignedNode, Assignment, Result};
use ort::AsPointer;
use ort::session::Session;
use std::ffi::{CStr, c_char};

/// A C string ORT owns, copied (empty for null).
fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ORT returns NUL-terminated strings that live as long as the session.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `Ok` for a null status, else its message (the status is released).
fn check(status: ort_sys::OrtStatusPtr, what: &str) -> Result<()> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status from ORT, read and released once.
    let msg = unsafe {
        let m = CStr::from_ptr((api.GetErrorMessage)(status.0)).to_string_lossy().into_owned();
        (api.ReleaseStatus)(status.0);
        m
    };
    Err(format!("{what}: {msg}").into())
}

/// ORT's record of which EP runs each node (`Session_GetEpGraphAssignmentInfo`).
pub fn assignment(session: &Session) -> Result<Vec<Assignment>> {
    let api = ort::api();
    let mut subgraphs = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: the session is alive; ORT owns the returned arrays for the session's lifetime.
    check(
        // SAFETY: the session is alive; ORT owns the returned arrays for the session's lifetime.
        unsafe { (api.Session_GetEpGraphAssignmentInfo)(session.ptr(), &mut subgraphs, &mut count) },
        "Session_GetEpGraphAssignmentInfo",
    )?;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: ORT returned `count` subgraph pointers.
        let sg = unsafe { *subgraphs.add(i) };
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `sg` is a live subgraph of the session; `p` receives an ORT-owned string.
        check(unsafe { (api.EpAssignedSubgraph_GetEpName)(sg, &mut p) }, "EpAssignedSubgraph_GetEpName")?;
        let ep = text(p);
        let mut nodes_ptr = std::ptr::null();
        let mut n = 0usize;
        // SAFETY: as above; ORT owns the node array.
        check(unsafe { (api.EpAssignedSubgraph_GetNodes)(sg, &mut nodes_ptr, &mut n) }, "EpAssignedSubgraph_GetNodes")?;
        let mut nodes = Vec::with_capacity(n);
        for j in 0..n {
            // SAFETY: ORT returned `n` node pointers.
            let node = unsafe { *nodes_ptr.add(j) };
            // SAFETY (the three calls below): `node` is live; each writes an ORT-owned string.
            // SAFETY: `node` is live; the call writes an ORT-owned string into `p`.
            check(unsafe { (api.EpAssignedNode_GetName)(node, &mut p) }, "EpAssignedNode_GetName")?;
            let name = text(p);
            // SAFETY: as above.
            check(unsafe { (api.EpAssignedNode_GetDomain)(node, &mut p) }, "EpAssignedNode_GetDomain")?;
            let domain = text(p);
            // SAFETY: as above.
            check(unsafe { (api.EpAssignedNode_GetOperatorType)(node, &mut p) }, "EpAssignedNode_GetOperatorType")?;
            nodes.push(AssignedNode { name, domain, op_type: text(p) });
        }
        out.push(Assignment { ep, nodes });
    }
    Ok(out)
}

/// A zero-filled tensor in the memory of the EP `device` (its `DEFAULT` memory), from the
/// environment's shared allocator for that memory. Raw because the `ort` crate's `MemoryInfo`
/// clone drops the vendor id that names a plugin EP's memory.
pub fn device_tensor(
    env: &ort::environment::Environment,
    device: &ort::device::Device<'_>,
    ty: ort::value::TensorElementType,
    shape: &[i64],
) -> Result<ort::value::DynValue> {
    let api = ort::api();
    // SAFETY: a live EP device of `env`; ORT owns the returned memory info.
    let info =
        unsafe { (api.EpDevice_MemoryInfo)(device.ptr(), ort_sys::OrtDeviceMemoryType::OrtDeviceMemoryType_DEFAULT) };
    if info.is_null() {
        return Err(format!("EP device '{}' has no memory of its own", device.ep().unwrap_or("?")).into());
    }
    let mut allocator = std::ptr::null_mut();
    // SAFETY: `env` and `info` are live; the shared allocator lives as long as the environment.
    check(unsafe { (api.GetSharedAllocator)(env.ptr().cast_mut(), info, &mut allocator) }, "GetSharedAllocator")?;
    if allocator.is_null() {
        return Err("ORT has no shared allocator for the EP's memory".into());
    }
    let mut value = std::ptr::null_mut();
    check(
        // SAFETY: a valid allocator and shape; ORT writes a new value owned by the caller.
        unsafe { (api.CreateTensorAsOrtValue)(allocator, shape.as_ptr(), shape.len(), ty.into(), &mut value) },
        "CreateTensorAsOrtValue",
    )?;
    let value = std::ptr::NonNull::new(value).ok_or("CreateTensorAsOrtValue gave no value")?;
    // SAFETY: a tensor just created; the value frees its buffer through the allocator ORT
    // recorded in it (the environment's), the default handle only satisfies `ort`'s bookkeeping.
    Ok(unsafe { ort::value::DynValue::from_ptr(value, Some(&ort::memory::Allocator::default())) })
}

/// Copies each `src` tensor into the `dst` tensor of the same shape and type (ORT's
/// `CopyTensors`, through the EPs' data transfers: host to device memory or back).
pub fn copy_tensors(
    env: &ort::environment::Environment,
    src: &[&ort::value::DynValue],
    dst: &[&ort::value::DynValue],
) -> Result<()> {
    if src.len() != dst.len() {
        return Err(format!("{} tensors to copy into {}", src.len(), dst.len()).into());
    }
    let api = ort::api();
    let from: Vec<*const ort_sys::OrtValue> = src.iter().map(|v| v.ptr()).collect();
    let mut to: Vec<*const ort_sys::OrtValue> = dst.iter().map(|v| v.ptr()).collect();
    check(
        // SAFETY: live values of equal count; ORT checks shapes and types and copies in order.
        unsafe {
            (api.CopyTensors)(env.ptr().cast_mut(), from.as_ptr(), to.as_mut_ptr(), std::ptr::null_mut(), from.len())
        },
        "CopyTensors",
    )
}
