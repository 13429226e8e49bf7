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
