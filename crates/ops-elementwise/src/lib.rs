//! Elementwise, matrix-product and softmax lowerings.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`] and end it with
//! `ep_core::register_lowering!(NAME = Value);`, then add its `mod` line below. The op is
//! claimed, partitioned and run from then on; list it in `crates/plugin/registered-ops.txt`.
#![forbid(unsafe_code)]

mod binary;
mod matmul;
mod softmax;
mod unary;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() {}
