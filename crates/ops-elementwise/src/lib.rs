//! Elementwise lowerings: arithmetic on floats and integers, comparisons and logic, casts,
//! selection, activations (including `com.microsoft` fused ones), transcendental functions.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`] and end it with
//! `ep_core::register_lowering!(NAME = Value);`, then add its `mod` line below. List it in
//! `crates/plugin/registered-ops.txt` and register its conformance spec next to it
//! (`conformance_spec::register_spec!`, behind the `conformance` feature).
#![forbid(unsafe_code)]

mod activation;
mod binary;
mod cast;
mod gated;
mod hash;
mod select;
mod shrink;
mod unary;
mod variadic;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "elementwise" }
}
