//! Copy-out: a run's evaluated outputs into the buffers ORT allocates for them: whole, packed
//! two int4 values per byte, or (an output ORT bound to the buffer of the input it updates)
//! only the rows that changed.

use super::ort_call;
use crate::exec::{Plan, RunOutputs, WriteBack};
use crate::{Error, Result, mlx};
use ort_sys::{OrtKernelContext, OrtValue};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

/// Writes every output of `run` into ORT's output buffers; `values` are the run's ORT inputs
/// (an output sharing an input's buffer is written in place).
pub(super) fn write_outputs(
    plan: &Plan,
    run: &RunOutputs,
    values: &[*const OrtValue],
    ctx: *mut OrtKernelContext,
) -> Result<()> {
    for (i, (array, out)) in run.outputs.iter().zip(plan.outputs()).enumerate() {
        let shape = array.shape();
        let mut value: *mut OrtValue = null_mut();
        ort_call!(KernelContext_GetOutput(ctx, i, shape.as_ptr(), shape.len(), &mut value))?;
        if value.is_null() {
            return Err(Error::new(format!("ORT gave no buffer for output '{}'", out.name)));
        }
        let (data, size) = tensor_buffer(value)?;
        // An output ORT bound to the buffer of the input it updates: copy the changed rows only.
        if let Some(wb) = run.write_backs.iter().find(|wb| wb.output == out.name)
            && tensor_buffer(values[wb.input] as *mut OrtValue)?.0 == data
        {
            let written = copy_rows(wb, data, size)?;
            plan.stats().written_back_bytes.fetch_add(written as u64, Ordering::Relaxed);
            plan.stats().aliased_bytes_not_copied.fetch_add((size - written) as u64, Ordering::Relaxed);
            continue;
        }
        let buf: &mut [u8] = if size == 0 {
            &mut []
        } else {
            // SAFETY: ORT allocated `size` bytes for this output.
            unsafe { std::slice::from_raw_parts_mut(data, size) }
        };
        if out.elem_type.unpacked_4bit().is_some() {
            // Held one element per byte: packed two per byte into ORT's buffer.
            let dense = match array.host_bytes() {
                Some(_) => array.clone(),
                None => {
                    let d = mlx::ops::contiguous(array, plan.stream())?;
                    d.eval()?;
                    plan.stats().evaluations.fetch_add(1, Ordering::Relaxed);
                    d
                }
            };
            let values = dense.host_bytes().ok_or_else(|| Error::new("an int4 output was not evaluated"))?;
            crate::graph::pack_4bit(values, buf).map_err(|e| Error::new(format!("output '{}': {e}", out.name)))?;
            plan.stats().copied_out_bytes.fetch_add(size as u64, Ordering::Relaxed);
            continue;
        }
        if array.host_bytes().is_none() {
            // A view (or an array MLX left unevaluated): making it contiguous is one more
            // evaluation, counted as such.
            plan.stats().evaluations.fetch_add(1, Ordering::Relaxed);
        }
        array.copy_to(buf, plan.stream()).map_err(|e| Error::new(format!("output '{}': {e}", out.name)))?;
        plan.stats().copied_out_bytes.fetch_add(size as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// A tensor's data pointer and size in bytes.
fn tensor_buffer(value: *mut OrtValue) -> Result<(*mut u8, usize)> {
    let mut size = 0usize;
    ort_call!(GetTensorSizeInBytes(value, &mut size))?;
    let mut data: *mut c_void = null_mut();
    ort_call!(GetTensorMutableData(value, &mut data))?;
    if data.is_null() && size > 0 {
        return Err(Error::new("a tensor has no data"));
    }
    Ok((data.cast::<u8>(), size))
}

/// Copies the changed rows of a write-back into `dst` (`size` bytes); returns the bytes copied.
fn copy_rows(wb: &WriteBack, dst: *mut u8, size: usize) -> Result<usize> {
    let src = wb.array.host_bytes().ok_or_else(|| Error::new("an in-place update was not evaluated"))?;
    let mut copied = 0;
    for (from, to) in &wb.chunks {
        if from.end > src.len() || to + from.len() > size {
            return Err(Error::new(format!(
                "rows {from:?} -> {to} exceed the {}-byte update or the {size}-byte buffer",
                src.len()
            )));
        }
        // SAFETY: both ranges lie within their buffers (checked above); the source is MLX
        // memory, the destination ORT's buffer, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(from.start), dst.add(*to), from.len()) };
        copied += from.len();
    }
    Ok(copied)
}
