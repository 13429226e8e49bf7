//! Neural-network lowerings: matrix products, convolutions, pooling, softmax forms, reductions,
//! losses, small linear algebra (Det, Inverse), ORT's fused Gemm/Conv and embedding forms,
//! normalizations.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`] and end it with
//! `ep_core::register_lowering!(NAME = Value);`, then add its `mod` line below. List it in
//! `crates/plugin/registered-ops.txt` and register its conformance spec next to it
//! (`conformance_spec::register_spec!`, behind the `conformance` feature).
#![forbid(unsafe_code)]

mod batch_norm;
mod cdist;
mod col2im;
mod conv;
mod conv_integer;
mod crop_and_resize;
mod deform_conv;
mod diffusion;
mod dropout;
mod einsum;
mod embed_layer_norm;
mod fused;
mod gated_norm;
mod hyper_connection;
mod image;
mod linalg;
mod loss;
mod lrn;
mod matmul;
mod moe;
mod nms;
mod norm;
mod norm_shapes;
mod pool;
mod qlinear_pool;
mod reduce;
mod roi;
mod softmax;
mod unpool;
mod window;
mod word_conv_embedding;

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "nn" }
}
