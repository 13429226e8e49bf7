//! Attention and KV-cache lowerings: Attention (ONNX 23/24), TensorScatter (the ONNX KV-cache
//! update), `com.microsoft` MultiHeadAttention, DecoderMaskedMultiHeadAttention, GroupQueryAttention,
//! SparseAttention, and their kin (rotary embeddings, packed and quantized attention).
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`], end it with
//! `ep_core::register_lowering!(NAME = Value);`, and add its `mod` line here. List it in
//! `crates/plugin/registered-ops.txt` and register its conformance spec next to it
//! (`conformance_spec::register_spec!`, behind the `conformance` feature).
#![forbid(unsafe_code)]

mod additive;
mod attention;
mod decoder_masked;
mod group_query_attention;
mod heads;
mod key_mask;
mod kv_quant;
mod lone;
mod mrotary_embedding;
mod multi_head_attention;
mod one_query;
mod packed_attention;
mod rotary;
mod rotary_embedding;
mod sparse_attention;
mod tensor_scatter;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "attention" }
}
