//! Copy-in: each ORT input of a partition run as an MLX array: a view where it lives in the
//! EP's memory, read in place where it can be (host memory on the CPU device), else copied,
//! reusing the previous run's copy of an unchanged input.

use super::device::Blocks;
use super::graph_reader::{TensorRef, reads_in_place, tensor_ref, tensor_to_array};
use super::ort_call;
use crate::exec::Plan;
use crate::{Error, Result, mlx};
use ort_sys::{OrtKernelContext, OrtValue};
use std::ptr::null;
use std::sync::atomic::Ordering;

/// The last copy of one runtime input that is copied rather than read in place (GPU devices):
/// when the next run passes the same buffer, shape and type with the same bytes (an
/// encoder's output or cross-attention K/V during a generation), the device copy is reused
/// instead of uploaded again. The bytes are compared against a host shadow, so a buffer
/// changed in place is always seen. An input that changes on two runs in a row (a KV cache)
/// stops being remembered.
#[derive(Default)]
pub(super) struct InputMemo {
    key: Option<(usize, Vec<i64>, crate::graph::ElemType)>,
    shadow: Vec<u8>,
    array: Option<mlx::Array>,
    misses: u8,
    off: bool,
}

/// Inputs larger than this are never remembered (their shadow would cost too much memory).
const MEMO_LIMIT: usize = 256 << 20;

impl InputMemo {
    fn key_of(t: &TensorRef<'_>) -> (usize, Vec<i64>, crate::graph::ElemType) {
        (t.bytes.as_ptr() as usize, t.shape.clone(), t.elem_type)
    }

    fn lookup(&mut self, t: &TensorRef<'_>) -> Option<mlx::Array> {
        if self.off || self.key.as_ref() != Some(&Self::key_of(t)) || self.shadow != t.bytes {
            return None;
        }
        self.misses = 0;
        self.array.clone()
    }

    fn store(&mut self, t: &TensorRef<'_>, array: &mlx::Array) {
        if self.off {
            return;
        }
        self.misses = self.misses.saturating_add(1);
        if self.misses >= 2 || t.bytes.len() > MEMO_LIMIT {
            *self = InputMemo { off: true, ..InputMemo::default() };
            return;
        }
        self.key = Some(Self::key_of(t));
        self.shadow.clear();
        self.shadow.extend_from_slice(t.bytes);
        self.array = Some(array.clone());
    }
}

/// The partition's inputs as MLX arrays, and ORT's values they come from (in order).
///
/// The caller holds [`mlx::lock`] and must keep every returned array referenced until the run's
/// outputs are copied: a borrowed input must not outlive the call, and a second reference
/// keeps MLX from donating its buffer to an output.
pub(super) fn bind_inputs(
    plan: &Plan,
    memo: &std::sync::Mutex<Vec<InputMemo>>,
    zero_copy: bool,
    ctx: *mut OrtKernelContext,
    count: usize,
) -> Result<(Vec<mlx::Array>, Vec<*const OrtValue>)> {
    let mut values = Vec::with_capacity(count);
    let mut inputs = Vec::with_capacity(count);
    let mut memo = memo.lock().unwrap_or_else(|p| p.into_inner());
    memo.resize_with(count, InputMemo::default);
    for (i, name) in plan.inputs().iter().enumerate() {
        let mut value: *const OrtValue = null();
        ort_call!(KernelContext_GetInput(ctx, i, &mut value))?;
        if value.is_null() {
            return Err(Error::new(format!("input '{name}' is missing")));
        }
        // SAFETY: ORT keeps input values alive during Compute.
        let t = unsafe { tensor_ref(value)? };
        // A tensor in the EP's memory (a GPU's, or bound there by the caller) is read where
        // it is.
        if let Some(array) = device_view(plan, &t)? {
            plan.stats().device_in_bytes.fetch_add(t.bytes.len() as u64, Ordering::Relaxed);
            inputs.push(array);
            values.push(value);
            continue;
        }
        let in_place = reads_in_place(&t, zero_copy);
        if !in_place && let Some(array) = memo[i].lookup(&t) {
            plan.stats().reused_in_bytes.fetch_add(t.bytes.len() as u64, Ordering::Relaxed);
            inputs.push(array);
            values.push(value);
            continue;
        }
        // SAFETY: as above; the caller holds a borrowed array until the outputs are copied and
        // drops it before Compute returns.
        let array = unsafe { tensor_to_array(&t, in_place) }.map_err(|e| Error::new(format!("input '{name}': {e}")))?;
        let bytes = (array.size() * array.dtype().size_in_bytes()) as u64;
        let counter = if in_place { &plan.stats().borrowed_in_bytes } else { &plan.stats().copied_in_bytes };
        counter.fetch_add(bytes, Ordering::Relaxed);
        if !in_place {
            memo[i].store(&t, &array);
        }
        inputs.push(array);
        values.push(value);
    }
    drop(memo);
    Ok((inputs, values))
}

/// The tensor as a view of the EP's memory, when it lives there.
fn device_view(plan: &Plan, t: &TensorRef<'_>) -> Result<Option<mlx::Array>> {
    if t.bytes.is_empty() || t.elem_type.unpacked_sub_byte().is_some() {
        return Ok(None);
    }
    let Some(dtype) = t.elem_type.held_as() else { return Ok(None) };
    Blocks::global().view(t.bytes.as_ptr(), &t.shape, dtype, plan.stream())
}
