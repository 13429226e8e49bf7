//! `libonnxruntime_mlx_ep`: the ONNX Runtime plugin library of the MLX execution provider.
//!
//! ORT loads it with `RegisterExecutionProviderLibrary` and calls the two functions
//! [`ep_core::export_plugin!`] defines. Each op family is a cargo feature (all on by default);
//! a trimmed build leaves the nodes of a missing family to ORT's CPU EP.

/// The op families compiled into this build: the one list of them, which the conformance
/// crate links through this crate too.
pub fn families() -> Vec<ep_core::registry::Family> {
    vec![
        #[cfg(feature = "elementwise")]
        ops_elementwise::link(),
        #[cfg(feature = "nn")]
        ops_nn::link(),
        #[cfg(feature = "tensor")]
        ops_tensor::link(),
        #[cfg(feature = "attention")]
        ops_attention::link(),
        #[cfg(feature = "quant")]
        ops_quant::link(),
        #[cfg(feature = "controlflow")]
        ops_controlflow::link(),
        #[cfg(feature = "ml")]
        ops_ml::link(),
        #[cfg(feature = "recurrent")]
        ops_recurrent::link(),
        #[cfg(feature = "signal")]
        ops_signal::link(),
    ]
}

ep_core::export_plugin!(families());
