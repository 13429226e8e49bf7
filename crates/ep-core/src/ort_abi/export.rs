//! [`export_plugin!`]: defines the two C functions ORT looks up in a plugin library, and the
//! plugin's own diagnostics entry (`OrtMlxEp_GetMemoryStats`).

/// Defines `CreateEpFactories`, `ReleaseEpFactory` and `OrtMlxEp_GetMemoryStats` in the
/// calling `cdylib` crate.
///
/// Each argument is an expression evaluated on every `CreateEpFactories` call before the
/// factory is created: an [`crate::registry::Family`] (an op crate's `link()`) or a `Vec` of
/// them. Recording them keeps the crates' registrations from being dropped by the linker.
///
/// ```ignore
/// ep_core::export_plugin!(ops_elementwise::link(), my_ops::link());
/// ```
///
/// Invoke it once per library, in the `cdylib` crate itself (never in a crate others link).
#[macro_export]
macro_rules! export_plugin {
    ($($link:expr),* $(,)?) => {
        /// Creates the MLX EP factory. Called by ONNX Runtime when the library is registered.
        ///
        /// # Safety
        /// Called by ONNX Runtime with the arguments of `CreateEpApiFactoriesFn`.
        #[unsafe(no_mangle)]
        pub unsafe extern "system" fn CreateEpFactories(
            registered_name: *const ::std::ffi::c_char,
            ort_api_base: *const $crate::ort_sys::OrtApiBase,
            default_logger: *const $crate::ort_sys::OrtLogger,
            factories: *mut *mut $crate::ort_abi::tables::OrtEpFactory,
            max_factories: usize,
            num_factories: *mut usize,
        ) -> $crate::ort_sys::OrtStatusPtr {
            $( $crate::registry::keep_families($link); )*
            // SAFETY: forwarded unchanged from ONNX Runtime.
            unsafe {
                $crate::ort_abi::factory::create_ep_factories(
                    registered_name, ort_api_base, default_logger, factories, max_factories, num_factories,
                )
            }
        }

        /// Releases a factory created by `CreateEpFactories`.
        ///
        /// # Safety
        /// `factory` must come from `CreateEpFactories`.
        #[unsafe(no_mangle)]
        pub unsafe extern "system" fn ReleaseEpFactory(
            factory: *mut $crate::ort_abi::tables::OrtEpFactory,
        ) -> $crate::ort_sys::OrtStatusPtr {
            // SAFETY: forwarded unchanged from ONNX Runtime.
            unsafe { $crate::ort_abi::factory::release_ep_factory(factory) }
        }

        /// MLX's memory figures, for monitoring (the soak test reads them through `ctypes`):
        /// writes up to `capacity` of [bytes in live arrays, bytes in MLX's buffer cache, peak
        /// of the first] to `values` and returns how many it wrote (0 on failure).
        ///
        /// # Safety
        /// `values` must point to `capacity` writable `u64`s (or be null with `capacity` 0).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn OrtMlxEp_GetMemoryStats(values: *mut u64, capacity: usize) -> usize {
            // SAFETY: forwarded unchanged from the caller.
            unsafe { $crate::ort_abi::device::memory_stats(values, capacity) }
        }
    };
}
