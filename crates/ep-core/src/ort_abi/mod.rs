//! The ONNX Runtime plugin C ABI: the factory and EP tables ORT calls, the compute callbacks,
//! the entry points a plugin library exports (`export_plugin!`), and reading ORT's graph into
//! [`crate::graph`]. With `crate::mlx`, the only home of `unsafe`.
//!
//! # Invariants
//! - Every `extern "system"` function ORT calls runs its body inside `boundary::guard`: a
//!   panic or an error becomes an `OrtStatus`; nothing unwinds into ORT.
//! - Every `OrtApi` call goes through `ort_call!`, which turns a status into a `Result` and
//!   releases it.
//! - ORT's graph objects are read during the call that hands them over and never kept.

pub(crate) mod boundary;
pub(crate) mod compute;
mod copy_in;
mod copy_out;
pub mod device;
pub(crate) mod ep;
mod export;
pub mod factory;
pub(crate) mod graph_reader;
pub mod tables;

use crate::{Error, Result};
use ort_sys::{OrtApi, OrtErrorCode, OrtStatusPtr};
use std::ffi::{CStr, CString, c_char};

/// [`crate::EP_NAME`] as the C string ORT reads.
pub(crate) const EP_NAME_C: &CStr = c"MLXExecutionProvider";
use std::sync::OnceLock;

struct Apis {
    ort: &'static OrtApi,
    ep: &'static tables::OrtEpApi,
}

// SAFETY: the API tables are immutable static data owned by ORT for the life of the process.
unsafe impl Send for Apis {}
// SAFETY: as for `Send`: the tables are immutable and live as long as the process.
unsafe impl Sync for Apis {}

static APIS: OnceLock<Apis> = OnceLock::new();

/// Records ORT's API tables (the first factory creation does this).
///
/// # Safety
/// `ort` must be a valid `OrtApi` of API version >= 31 that lives for the rest of the process.
pub(crate) unsafe fn set_api(ort: *const OrtApi) -> Result<()> {
    // SAFETY: caller guarantees validity.
    let ort: &'static OrtApi = unsafe { &*ort };
    // SAFETY: `GetEpApi` returns ORT's static EP table.
    let ep = unsafe { (ort.GetEpApi)() };
    if ep.is_null() {
        return Err(Error::new("this ONNX Runtime has no plugin EP API"));
    }
    // SAFETY: the declared prefix of `OrtEpApi` matches ORT's layout.
    let ep: &'static tables::OrtEpApi = unsafe { &*ep.cast::<tables::OrtEpApi>() };
    let _ = APIS.set(Apis { ort, ep });
    Ok(())
}

pub(crate) fn api() -> &'static OrtApi {
    APIS.get().expect("ORT API used before CreateEpFactories").ort
}

pub(crate) fn ep_api() -> &'static tables::OrtEpApi {
    APIS.get().expect("ORT EP API used before CreateEpFactories").ep
}

/// Turns a returned status into a `Result`, releasing it.
pub(crate) fn check_status(status: OrtStatusPtr, what: &str) -> Result<()> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = api();
    // SAFETY: a non-null status from ORT; read then released exactly once.
    let msg = unsafe {
        let m = (api.GetErrorMessage)(status.0);
        let msg =
            if m.is_null() { String::from("(no message)") } else { CStr::from_ptr(m).to_string_lossy().into_owned() };
        (api.ReleaseStatus)(status.0);
        msg
    };
    Err(Error::new(format!("{what}: {msg}")))
}

/// A new ORT status carrying `msg`, for returning to ORT.
pub(crate) fn make_status(code: OrtErrorCode, msg: &str) -> OrtStatusPtr {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    match APIS.get() {
        // SAFETY: ORT copies the message.
        Some(a) => unsafe { (a.ort.CreateStatus)(code, c.as_ptr()) },
        None => OrtStatusPtr(std::ptr::null_mut()),
    }
}

/// Calls an `OrtApi` function, mapping its status to `Result`:
/// `ort_call!(Node_GetName(node, &mut name))?`.
macro_rules! ort_call {
    ($f:ident($($arg:expr),* $(,)?)) => {{
        let api = $crate::ort_abi::api();
        #[allow(unused_unsafe)]
        // SAFETY: arguments are valid ORT handles and out-pointers, per the call site.
        let status = unsafe { (api.$f)($($arg),*) };
        $crate::ort_abi::check_status(status, stringify!($f))
    }};
}
pub(crate) use ort_call;

/// Copies a C string owned by ORT.
pub(crate) fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: ORT returns NUL-terminated strings valid during the call.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_c_name_is_the_ep_name() {
        assert_eq!(super::EP_NAME_C.to_str(), Ok(crate::EP_NAME));
    }
}
