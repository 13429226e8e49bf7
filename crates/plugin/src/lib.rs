//! `libonnxruntime_mlx_ep`: the ONNX Runtime plugin library of the MLX execution provider.
//!
//! ORT loads it with `RegisterExecutionProviderLibrary` and calls the two functions
//! [`ep_core::export_plugin!`] defines. Each op family is a cargo feature (all on by default);
//! a trimmed build leaves the nodes of a missing family to ORT's CPU EP.

/// References every enabled op crate, so the linker keeps their registrations.
pub fn link_op_families() {
    #[cfg(feature = "elementwise")]
    ops_elementwise::link();
    #[cfg(feature = "nn")]
    ops_nn::link();
    #[cfg(feature = "tensor")]
    ops_tensor::link();
    #[cfg(feature = "attention")]
    ops_attention::link();
    #[cfg(feature = "quant")]
    ops_quant::link();
    #[cfg(feature = "controlflow")]
    ops_controlflow::link();
}

/// The op families compiled into this build.
pub const FAMILIES: &[&str] = &[
    #[cfg(feature = "elementwise")]
    "elementwise",
    #[cfg(feature = "nn")]
    "nn",
    #[cfg(feature = "tensor")]
    "tensor",
    #[cfg(feature = "attention")]
    "attention",
    #[cfg(feature = "quant")]
    "quant",
    #[cfg(feature = "controlflow")]
    "controlflow",
];

ep_core::export_plugin!(link_op_families());
