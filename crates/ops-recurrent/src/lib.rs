//! Recurrent lowerings: RNN, GRU, LSTM and `com.microsoft` DynamicQuantizeLSTM, every
//! direction, activation, `clip`, `sequence_lens`, initial states, peepholes and both layouts.
//!
//! Each node becomes one piece of the partition's graph: the input projection of every time
//! step is one matrix product over the whole sequence, then the time loop is unrolled, one
//! recurrent matrix product and a few fused elementwise operations per step
//! ([`sequence::run`]; DynamicQuantizeLSTM's products are exact integer ones of operands
//! quantized as ORT quantizes them). The weights' transposes are derived constants, made once
//! per session.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`] and end it with
//! `ep_core::register_lowering!(NAME = Value);`, then add its `mod` line below. List it in
//! `crates/plugin/registered-ops.txt` and register its conformance spec next to it
//! (`conformance_spec::register_spec!`, behind the `conformance` feature).
#![forbid(unsafe_code)]

mod activation;
mod dynamic_quantize_lstm;
mod gru;
mod lstm;
mod rnn;
mod sequence;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "recurrent" }
}
