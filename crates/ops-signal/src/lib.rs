//! Signal lowerings: DFT and STFT (real and complex input, one-sided, inverse, any axis,
//! `dft_length`), HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix.
//!
//! A transform is one matrix product against its DFT matrix, made on the host in float64 with
//! exact angle reduction and rounded once to the input's type: the same graph runs on every
//! MLX backend, and a transform of a few thousand points is one matrix product a GPU does
//! well. Windows and mel filter banks
//! are tensors made from their scalar inputs on the host.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`] and end it with
//! `ep_core::register_lowering!(NAME = Value);`, then add its `mod` line below. List it in
//! `crates/plugin/registered-ops.txt` and register its conformance spec next to it
//! (`conformance_spec::register_spec!`, behind the `conformance` feature).
#![forbid(unsafe_code)]

mod dft;
mod large;
mod matrix;
mod stft;
mod window;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "signal" }
}
