//! [`Closure`]: a Rust function as an mlx-c closure, compiled (`mlx_compile`) and applied.

use super::{Array, MlxError, Result, VectorArray, check, init};
use std::ffi::{c_int, c_void};

type BoxedFn = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>> + Send>;

/// An MLX closure wrapping a Rust function from arrays to arrays (what `mlx_compile` traces).
pub struct Closure(pub(crate) mlx_sys::mlx_closure);

// SAFETY: the wrapped function is `Send`; MLX work (tracing and applying included) is
// serialised by `mlx::lock()`, so a shared closure is never applied concurrently.
unsafe impl Send for Closure {}
// SAFETY: as for `Send`: a closure is applied only under `mlx::lock()`.
unsafe impl Sync for Closure {}

unsafe extern "C" fn trampoline(
    out: *mut mlx_sys::mlx_vector_array,
    input: mlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> c_int {
    // SAFETY: `payload` is the `BoxedFn` installed by `Closure::new`, alive until the destructor.
    let f = unsafe { &mut *payload.cast::<BoxedFn>() };
    let run = || -> Result<()> {
        // SAFETY: `input` is the valid vector handle mlx-c passes to the callback.
        let n = unsafe { mlx_sys::mlx_vector_array_size(input) };
        let mut args = Vec::with_capacity(n);
        for i in 0..n {
            let mut a = Array::empty();
            // SAFETY: `i < n`, the vector's size; `a` is a fresh handle mlx-c fills.
            check(unsafe { mlx_sys::mlx_vector_array_get(&mut a.0, input, i) })?;
            args.push(a);
        }
        let results = f(&args)?;
        let v = VectorArray::from_arrays(results.iter())?;
        // SAFETY: `out` is a vector handle owned by mlx-c; set copies the contents.
        check(unsafe { mlx_sys::mlx_vector_array_set(out, v.0) })
    };
    // A panic must not unwind into C++.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            report(&e.0);
            1
        }
        Err(_) => {
            report("panic inside an MLX closure");
            1
        }
    }
}

thread_local! {
    /// The closure's own error: mlx-c replaces it with a generic message on the way out.
    static CLOSURE_ERROR: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

fn report(msg: &str) {
    CLOSURE_ERROR.with(|e| *e.borrow_mut() = Some(msg.to_owned()));
}

unsafe extern "C" fn drop_payload(payload: *mut c_void) {
    // SAFETY: called once by mlx-c when the closure's last reference goes away.
    drop(unsafe { Box::from_raw(payload.cast::<BoxedFn>()) });
}

impl Closure {
    pub fn new(f: impl FnMut(&[Array]) -> Result<Vec<Array>> + Send + 'static) -> Closure {
        init();
        let payload: *mut BoxedFn = Box::into_raw(Box::new(Box::new(f)));
        // SAFETY: mlx-c owns `payload` from here and frees it through `drop_payload`.
        Closure(unsafe { mlx_sys::mlx_closure_new_func_payload(Some(trampoline), payload.cast(), Some(drop_payload)) })
    }

    /// An `mlx_compile`d version of this closure. The first application of the result traces
    /// this closure; later applications with inputs of the same shapes (any shapes when
    /// `shapeless`) replay the compiled graph without calling it.
    pub fn compile(&self, shapeless: bool) -> Result<Closure> {
        // SAFETY: creates a new empty closure handle owned by the returned value.
        let mut out = Closure(unsafe { mlx_sys::mlx_closure_new() });
        // SAFETY: `out` owns its handle; mlx-c replaces its contents, and drop frees it.
        check(unsafe { mlx_sys::mlx_compile(&mut out.0, self.0, shapeless) })?;
        Ok(out)
    }

    pub fn apply(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let input = VectorArray::from_arrays(inputs.iter())?;
        let mut out = VectorArray::new();
        // SAFETY: `out` owns its handle; mlx-c replaces its contents, and drop frees it.
        let rc = unsafe { mlx_sys::mlx_closure_apply(&mut out.0, self.0, input.0) };
        let own = CLOSURE_ERROR.with(|e| e.borrow_mut().take());
        check(rc).map_err(|e| match own {
            Some(msg) => MlxError(msg),
            None => e,
        })?;
        out.to_vec().map_err(|e| MlxError(format!("closure result: {}", e.0)))
    }
}

impl Drop for Closure {
    fn drop(&mut self) {
        // SAFETY: we own this reference.
        unsafe { mlx_sys::mlx_closure_free(self.0) };
    }
}
