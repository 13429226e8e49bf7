//! Custom CUDA kernels as MLX primitives (`mlx_fast_cuda_kernel`): a lowering hands MLX the
//! body of a `__global__` function and MLX declares its parameters (each input `const T*
//! name`, with `name_shape` / `name_strides` when the body reads them, then each output
//! `T* name`), JIT-compiles it with NVRTC once per name (kept in MLX's kernel cache) and
//! launches it inside the graph like any other primitive, compiled closures included.
//!
//! Only MLX's CUDA backend runs them ([`super::device::is_cuda`]); elsewhere a lowering keeps
//! its portable form.

use super::{Array, Dtype, MlxError, Result, Stream, VectorArray, check, init};
use std::ffi::CString;

/// A compile-time constant of a kernel's body: a type (`using NAME = T;`), an `int` or a `bool`
/// (`constexpr`). Each value is part of the kernel's name, so each gets its own module.
#[derive(Clone, Copy, Debug)]
pub enum TemplateArg {
    Dtype(Dtype),
    Int(i32),
    Bool(bool),
}

/// One launch of a [`CudaKernel`]: the outputs' shapes and types, the grid in threads (MLX
/// divides it by the block), the block, and the body's constants.
pub struct Launch<'a> {
    pub outputs: &'a [(&'a [i64], Dtype)],
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub constants: &'a [(&'a str, TemplateArg)],
}

/// A kernel MLX can launch: its name (with the constants' values, the key of MLX's module
/// cache: a changed body needs a new name), parameter names and body.
pub struct CudaKernel(mlx_sys::mlx_fast_cuda_kernel);

// SAFETY: the handle wraps an immutable function object; MLX work is serialised by the
// caller's `mlx::lock` like every other graph construction.
unsafe impl Send for CudaKernel {}
// SAFETY: as above.
unsafe impl Sync for CudaKernel {}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|e| MlxError(format!("{s:?}: {e}")))
}

/// An mlx-c vector of `names` (to free with `mlx_vector_string_free`).
fn strings(names: &[CString]) -> mlx_sys::mlx_vector_string {
    let ptrs: Vec<*const std::ffi::c_char> = names.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: `ptrs` holds `ptrs.len()` NUL-terminated strings alive for the call; mlx-c copies them.
    unsafe { mlx_sys::mlx_vector_string_new_data(ptrs.as_ptr().cast_mut(), ptrs.len()) }
}

impl CudaKernel {
    /// A kernel named `name` over `inputs` and `outputs` with this `body`; `contiguous` asks
    /// MLX to copy inputs that are not row-contiguous first (without it the body reads
    /// `name_strides`).
    pub fn new(name: &str, inputs: &[&str], outputs: &[&str], body: &str, contiguous: bool) -> Result<CudaKernel> {
        init();
        // (Every string made before any mlx-c object: an error leaves nothing to free.)
        let names = |v: &[&str]| v.iter().map(|n| c_string(n)).collect::<Result<Vec<_>>>();
        let (inputs, outputs) = (names(inputs)?, names(outputs)?);
        let (name, body, header) = (c_string(name)?, c_string(body)?, c_string("")?);
        let (ins, outs) = (strings(&inputs), strings(&outputs));
        // SAFETY: every argument is a valid handle or NUL-terminated string for the call; the
        // vectors are freed below, the kernel handle by `Drop`.
        let k = unsafe {
            let k = mlx_sys::mlx_fast_cuda_kernel_new(
                name.as_ptr(),
                ins,
                outs,
                body.as_ptr(),
                header.as_ptr(),
                contiguous,
                0,
            );
            mlx_sys::mlx_vector_string_free(ins);
            mlx_sys::mlx_vector_string_free(outs);
            k
        };
        if k.ctx.is_null() {
            check(1)?;
        }
        Ok(CudaKernel(k))
    }

    /// The kernel's outputs for `inputs`, launched as `launch` says, on `s`.
    pub fn apply(&self, inputs: &[&Array], launch: &Launch<'_>, s: &Stream) -> Result<Vec<Array>> {
        let ins = VectorArray::from_arrays(inputs.iter().copied())?;
        let mut out = VectorArray::new();
        // SAFETY: the config is created and freed here; shapes, names and handles outlive the
        // calls that read them (mlx-c copies them).
        unsafe {
            let cfg = mlx_sys::mlx_fast_cuda_kernel_config_new();
            let filled = (|out: &mut VectorArray| -> Result<()> {
                for (shape, dtype) in launch.outputs {
                    let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
                    check(mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                        cfg,
                        dims.as_ptr(),
                        dims.len(),
                        dtype.to_raw(),
                    ))?;
                }
                let [gx, gy, gz] = launch.grid;
                check(mlx_sys::mlx_fast_cuda_kernel_config_set_grid(cfg, gx, gy, gz))?;
                let [bx, by, bz] = launch.block;
                check(mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(cfg, bx, by, bz))?;
                for (name, arg) in launch.constants {
                    let name = c_string(name)?;
                    check(match *arg {
                        TemplateArg::Dtype(d) => {
                            mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(cfg, name.as_ptr(), d.to_raw())
                        }
                        TemplateArg::Int(v) => {
                            mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(cfg, name.as_ptr(), v)
                        }
                        TemplateArg::Bool(v) => {
                            mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_bool(cfg, name.as_ptr(), v)
                        }
                    })?;
                }
                check(mlx_sys::mlx_fast_cuda_kernel_apply(&mut out.0, self.0, ins.0, cfg, s.0))
            })(&mut out);
            mlx_sys::mlx_fast_cuda_kernel_config_free(cfg);
            filled?;
        }
        out.to_vec()
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        // SAFETY: the handle came from `mlx_fast_cuda_kernel_new` and is freed once.
        unsafe { mlx_sys::mlx_fast_cuda_kernel_free(self.0) };
    }
}
