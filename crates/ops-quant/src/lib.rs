//! Quantized ops: `com.microsoft` MatMulNBits (block-quantized weights, repacked once into
//! MLX's quantized layout) and GatherBlockQuantized (quantized embedding tables); ONNX
//! DequantizeLinear, QuantizeLinear, DynamicQuantizeLinear, MatMulInteger and QLinearMatMul.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`], end it with
//! `ep_core::register_lowering!(NAME = Value);`, and add its `mod` line here. List it in
//! `crates/plugin/registered-ops.txt` and register its conformance spec next to it
//! (`conformance_spec::register_spec!`, behind the `conformance` feature).
#![forbid(unsafe_code)]

mod affine_weight;
mod gather_block_quantized;
mod integer_matmul;
mod matmul_bnb4;
mod matmul_integer16;
mod matmul_nbits;
mod matmul_to_float;
mod qdq;
mod qgemm;
mod qlinear_activation;
mod qlinear_binary;
mod qlinear_concat;
mod qlinear_softmax;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "quant" }
}
