//! Tensor lowerings: data movement and shape manipulation (gathers and scatters included), on
//! every element type MLX holds.
//!
//! Shapes, axes, pads and other integer operands are read on the host: from the constant when
//! the operand is an initializer, or by evaluating it when it is computed from shapes (which
//! works inside a shape-keyed trace); an operand that depends on runtime data sends the
//! partition to the eager path.
//!
//! # Adding a lowering
//! Write one file (or add to the file of its group) with a type implementing
//! [`ep_core::Lowering`] (or an [`ep_core::lowering::FnLowering`]) and end it with
//! `ep_core::register_lowering!(NAME = Value);`; add its `mod` line below, list it in
//! `crates/plugin/registered-ops.txt`, and register its conformance spec next to it.
#![forbid(unsafe_code)]

mod antialias;
mod arrange;
mod gather;
mod generate;
mod grid_sample;
mod join;
mod pad;
mod random;
mod resize;
mod reverse_sequence;
mod scatter;
mod select;
mod shape;
mod slice;
#[cfg(feature = "conformance")]
mod spec_util;
mod unfold;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "tensor" }
}
