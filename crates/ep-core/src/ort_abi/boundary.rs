//! The one panic boundary every ORT-facing entry point uses.

use super::make_status;
use crate::{Error, Result};
use ort_sys::{OrtErrorCode, OrtStatusPtr};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f`, turning an error or a panic into an `OrtStatus` (null on success).
pub fn guard(entry: &str, f: impl FnOnce() -> Result<()>) -> OrtStatusPtr {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => OrtStatusPtr(std::ptr::null_mut()),
        Ok(Err(e)) => make_status(OrtErrorCode::ORT_EP_FAIL, &format!("{} ({entry}): {e}", crate::EP_NAME)),
        Err(panic) => make_status(
            OrtErrorCode::ORT_EP_FAIL,
            &format!("{} ({entry}): internal error: {}", crate::EP_NAME, panic_message(&panic)),
        ),
    }
}

/// Runs `f` for an entry point that returns a value instead of a status; `fallback` on panic.
pub fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_owned()
    }
}

/// Fails with a clear message when ORT passes a null pointer where one is required.
pub fn non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() { Err(Error::new(format!("{what} is null"))) } else { Ok(()) }
}
