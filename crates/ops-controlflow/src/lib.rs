//! Control-flow lowerings: If, Loop, Scan (opsets 8 and 9 on).
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`], end it with
//! `ep_core::register_lowering!(NAME = Value);`, and add its `mod` line here. List it in
//! `crates/plugin/registered-ops.txt` and give it a case in `crates/conformance/tests/ops.rs`
//! (or, for ops with subgraphs, which ORT's model editor cannot build, in `python/check_control_flow.py`).
#![forbid(unsafe_code)]

mod body;
mod if_op;
mod loop_op;
mod scan;
mod scan8;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "controlflow" }
}
