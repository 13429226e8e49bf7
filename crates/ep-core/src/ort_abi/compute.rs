//! The `OrtNodeComputeInfo` of a compiled partition: binds ORT's inputs, runs the plan, writes
//! ORT's outputs.

use super::boundary::{guard, non_null};
use super::graph_reader::{TensorRef, reads_in_place, tensor_ref, tensor_to_array};
use super::ort_call;
use super::tables::{OrtNodeComputeContext, OrtNodeComputeInfo, TABLE_VERSION};
use crate::exec::{Plan, WriteBack};
use crate::stats::Phase;
use crate::{Error, Result, mlx};
use ort_sys::{OrtKernelContext, OrtStatusPtr, OrtValue};
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// `table` must stay the first field: ORT sees a pointer to it.
#[repr(C)]
pub struct ComputeInfo {
    table: OrtNodeComputeInfo,
    plan: Plan,
    memo: std::sync::Mutex<Vec<InputMemo>>,
}

/// The last copy of one runtime input that is copied rather than read in place (GPU devices):
/// when the next run passes the same buffer, shape and type with the same bytes (an
/// encoder's output or cross-attention K/V during a generation), the device copy is reused
/// instead of uploaded again. The bytes are compared against a host shadow, so a buffer
/// changed in place is always seen. An input that changes on two runs in a row (a KV cache)
/// stops being remembered.
#[derive(Default)]
struct InputMemo {
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

impl ComputeInfo {
    pub fn new(plan: Plan) -> Box<ComputeInfo> {
        Box::new(ComputeInfo {
            table: OrtNodeComputeInfo {
                ort_version_supported: TABLE_VERSION,
                CreateState: Some(create_state),
                Compute: Some(compute),
                ReleaseState: Some(release_state),
            },
            plan,
            memo: std::sync::Mutex::new(Vec::new()),
        })
    }
}

unsafe extern "system" fn create_state(
    this: *mut OrtNodeComputeInfo,
    _ctx: *mut OrtNodeComputeContext,
    state: *mut *mut c_void,
) -> OrtStatusPtr {
    guard("CreateState", || {
        non_null(state, "compute_state")?;
        // The plan itself is the state: nothing per-state to allocate.
        // SAFETY: `state` was checked non-null; ORT passes a writable pointer.
        unsafe { *state = this.cast() };
        Ok(())
    })
}

unsafe extern "system" fn release_state(_this: *mut OrtNodeComputeInfo, _state: *mut c_void) {}

unsafe extern "system" fn compute(
    this: *mut OrtNodeComputeInfo,
    _state: *mut c_void,
    ctx: *mut OrtKernelContext,
) -> OrtStatusPtr {
    guard("Compute", || {
        non_null(this, "compute info")?;
        non_null(ctx, "kernel context")?;
        // SAFETY: `this` is a `ComputeInfo` created by `compile`.
        let info = unsafe { &*this.cast::<ComputeInfo>() };
        let plan = &info.plan;
        run(plan, &info.memo, ctx).map_err(|e| Error::new(format!("partition '{}': {e}", plan.name())))
    })
}

fn run(plan: &Plan, memo: &std::sync::Mutex<Vec<InputMemo>>, ctx: *mut OrtKernelContext) -> Result<()> {
    let mut count = 0usize;
    ort_call!(KernelContext_GetInputCount(ctx, &mut count))?;
    if count != plan.inputs().len() {
        return Err(Error::new(format!("ORT passed {count} inputs, the partition has {}", plan.inputs().len())));
    }
    let _mlx = mlx::lock();
    let run_started = Instant::now();
    let copy_in = plan.stats().phase(Phase::CopyIn, plan.name());
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
        let in_place = reads_in_place(&t);
        if !in_place && let Some(array) = memo[i].lookup(&t) {
            plan.stats().reused_in_bytes.fetch_add(t.bytes.len() as u64, Ordering::Relaxed);
            inputs.push(array);
            values.push(value);
            continue;
        }
        // SAFETY: as above; a borrowed array is held (below) until the outputs are copied and
        // dropped before this call returns.
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
    drop(copy_in);
    // Held until the outputs are copied: borrowed inputs must keep a second reference (MLX
    // never donates their buffers to outputs) and must not outlive this call.
    let held: Vec<mlx::Array> = inputs.clone();
    let run = plan.run(inputs)?;
    let copy_out = plan.stats().phase(Phase::CopyOut, plan.name());
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
    drop(copy_out);
    drop(run);
    drop(held);
    if let Some(t) = plan.stats().tracer() {
        let args = serde_json::json!({ "mode": format!("{:?}", plan.mode()) });
        t.record(plan.name(), "partition", run_started, Instant::now(), args);
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
