//! `libonnxruntime_mlx_ep`: the ONNX Runtime plugin library of the MLX execution provider.
//!
//! ORT loads it with `RegisterExecutionProviderLibrary` and calls the two exported functions.
//! Each op family is a cargo feature (all on by default); a trimmed build leaves the nodes of a
//! missing family to ORT's CPU EP.

use ep_core::ort_abi::factory;
use ep_core::ort_abi::tables::OrtEpFactory;
use ort_sys::{OrtApiBase, OrtLogger, OrtStatusPtr};
use std::ffi::c_char;

/// References every enabled op crate, so the linker keeps their registrations.
pub fn link_op_families() {
    #[cfg(feature = "elementwise")]
    ops_elementwise::link();
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
    #[cfg(feature = "attention")]
    "attention",
    #[cfg(feature = "quant")]
    "quant",
    #[cfg(feature = "controlflow")]
    "controlflow",
];

/// Creates the MLX EP factory. Called by ORT when the library is registered.
///
/// # Safety
/// Called by ORT with the arguments of `CreateEpApiFactoriesFn`.
#[unsafe(no_mangle)]
pub unsafe extern "system" fn CreateEpFactories(
    registered_name: *const c_char,
    ort_api_base: *const OrtApiBase,
    default_logger: *const OrtLogger,
    factories: *mut *mut OrtEpFactory,
    max_factories: usize,
    num_factories: *mut usize,
) -> OrtStatusPtr {
    link_op_families();
    // SAFETY: forwarded unchanged from ORT.
    unsafe {
        factory::create_ep_factories(
            registered_name,
            ort_api_base,
            default_logger,
            factories,
            max_factories,
            num_factories,
        )
    }
}

/// Releases a factory created by [`CreateEpFactories`].
///
/// # Safety
/// `factory` must come from [`CreateEpFactories`].
#[unsafe(no_mangle)]
pub unsafe extern "system" fn ReleaseEpFactory(factory: *mut OrtEpFactory) -> OrtStatusPtr {
    // SAFETY: forwarded unchanged from ORT.
    unsafe { factory::release_ep_factory(factory) }
}
