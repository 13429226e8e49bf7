//! Copy-out: a run's evaluated outputs into the buffers ORT allocates for them (host memory or
//! the EP's, by a device copy where it can): whole, packed
//! (int4 two values per byte, int2 four), or (an output ORT bound to the buffer of the input it updates)
//! only the rows that changed.

use super::device::{copy_many, tensor_bytes};
use super::ort_call;
use crate::exec::{Plan, RunOutputs, WriteBack};
use crate::{Error, Result, mlx};
use ort_sys::{OrtKernelContext, OrtValue};
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
    // Every copy of the run is queued and done at once at the end (one wait on a GPU); the
    // arrays copied from are held until then.
    let mut copies: Vec<(*mut u8, *const u8, usize)> = Vec::new();
    let mut row_copies: Vec<(*mut u8, *const u8, usize)> = Vec::new();
    let mut held: Vec<mlx::Array> = Vec::new();
    for (i, (array, out)) in run.outputs.iter().zip(plan.outputs()).enumerate() {
        let shape = array.shape();
        let mut value: *mut OrtValue = null_mut();
        ort_call!(KernelContext_GetOutput(ctx, i, shape.as_ptr(), shape.len(), &mut value))?;
        if value.is_null() {
            return Err(Error::new(format!("ORT gave no buffer for output '{}'", out.name)));
        }
        let (data, size) = tensor_bytes(value)?;
        // An output ORT bound to the buffer of the input it updates: copy the changed rows only.
        if let Some(wb) = run.write_backs.iter().find(|wb| wb.output == out.name)
            && tensor_bytes(values[wb.input])?.0 == data
        {
            let written = {
                let _span = plan.stats().span("to-host");
                copy_rows(wb, data, size, &mut row_copies)?
            };
            plan.stats().written_back_bytes.fetch_add(written as u64, Ordering::Relaxed);
            plan.stats().aliased_bytes_not_copied.fetch_add((size - written) as u64, Ordering::Relaxed);
            plan.note_in_place(i, true);
            continue;
        }
        // (Evaluated here if the run left it out, guessing it would be written in place.)
        plan.note_in_place(i, false);
        let buf: &mut [u8] = if size == 0 {
            &mut []
        } else {
            // SAFETY: ORT allocated `size` bytes for this output.
            unsafe { std::slice::from_raw_parts_mut(data, size) }
        };
        if let Some((bits, _)) = out.elem_type.sub_byte_bits() {
            // Held one element per byte: packed into ORT's buffer.
            let dense = match array.host_bytes() {
                Some(_) => array.clone(),
                None => {
                    let d = mlx::ops::contiguous(array, plan.stream())?;
                    d.eval()?;
                    plan.stats().evaluations.fetch_add(1, Ordering::Relaxed);
                    d
                }
            };
            let values = dense.host_bytes().ok_or_else(|| Error::new("a sub-byte output was not evaluated"))?;
            crate::graph::pack_bits(values, bits, buf)
                .map_err(|e| Error::new(format!("output '{}': {e}", out.name)))?;
            plan.stats().copied_out_bytes.fetch_add(size as u64, Ordering::Relaxed);
            continue;
        }
        let _span = plan.stats().span("to-host");
        let dense = match array.host_bytes() {
            Some(_) => array.clone(),
            None => {
                // A view (or an array MLX left unevaluated): making it contiguous is one more
                // evaluation, counted as such.
                plan.stats().evaluations.fetch_add(1, Ordering::Relaxed);
                let d = mlx::ops::contiguous(array, plan.stream())?;
                d.eval()?;
                d
            }
        };
        let src = dense.host_bytes().ok_or_else(|| Error::new(format!("output '{}' was not evaluated", out.name)))?;
        if src.len() != size {
            return Err(Error::new(format!(
                "output '{}': ORT's buffer holds {size} bytes, the result {}",
                out.name,
                src.len()
            )));
        }
        // The output is the buffer its input was read from in place: already there.
        if !std::ptr::eq(src.as_ptr(), data) {
            copies.push((data, src.as_ptr(), size));
            held.push(dense);
        }
        plan.stats().copied_out_bytes.fetch_add(size as u64, Ordering::Relaxed);
    }
    let rows = row_copies.len();
    row_copies.extend(copies);
    let copies = row_copies;
    // Traced, the rows written in place and the other outputs are copied apart, each batch
    // timed (one more wait).
    let batches = match plan.stats().tracer() {
        Some(_) => vec![("copies-rows", &copies[..rows]), ("copies-out", &copies[rows..])],
        None => vec![("copies", &copies[..])],
    };
    for (name, batch) in batches {
        let _span = plan.stats().span(name);
        // SAFETY: each destination is an output buffer ORT allocated with the bytes copied
        // (checked above), each source an evaluated result's memory (held, distinct from the
        // outputs) or rows of an in-place update within their packed array; no two
        // destinations overlap (each is its own output, or distinct rows of one).
        unsafe { copy_many(batch) }.map_err(|e| Error::new(format!("copying the outputs: {e}")))?;
    }
    drop(held);
    Ok(())
}

/// Queues the copies of the changed rows of a write-back into `dst` (`size` bytes); returns
/// the bytes copied. (`wb.array` is held by the run until the copies are done.)
fn copy_rows(
    wb: &WriteBack,
    dst: *mut u8,
    size: usize,
    copies: &mut Vec<(*mut u8, *const u8, usize)>,
) -> Result<usize> {
    let src = wb.array.host_bytes().ok_or_else(|| Error::new("an in-place update was not evaluated"))?;
    let mut copied = 0;
    for (from, to) in &wb.chunks {
        if from.end > src.len() || to + from.len() > size {
            return Err(Error::new(format!(
                "rows {from:?} -> {to} exceed the {}-byte update or the {size}-byte buffer",
                src.len()
            )));
        }
        // SAFETY: both ranges lie within their buffers (checked above).
        copies.push((unsafe { dst.add(*to) }, unsafe { src.as_ptr().add(from.start) }, from.len()));
        copied += from.len();
    }
    Ok(copied)
}
