//! The `OrtNodeComputeInfo` of a compiled partition: binds ORT's inputs, runs the plan, writes
//! ORT's outputs.

use super::boundary::{guard, non_null};
use super::graph_reader::tensor_to_array;
use super::ort_call;
use super::tables::{OrtNodeComputeContext, OrtNodeComputeInfo, TABLE_VERSION};
use crate::exec::Plan;
use crate::stats::Phase;
use crate::{Error, Result, mlx};
use ort_sys::{OrtKernelContext, OrtStatusPtr, OrtValue};
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::Instant;

/// `table` must stay the first field: ORT sees a pointer to it.
#[repr(C)]
pub struct ComputeInfo {
    table: OrtNodeComputeInfo,
    plan: Plan,
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
        let plan = unsafe { &(*this.cast::<ComputeInfo>()).plan };
        run(plan, ctx).map_err(|e| Error::new(format!("partition '{}': {e}", plan.name())))
    })
}

fn run(plan: &Plan, ctx: *mut OrtKernelContext) -> Result<()> {
    let mut count = 0usize;
    ort_call!(KernelContext_GetInputCount(ctx, &mut count))?;
    if count != plan.inputs().len() {
        return Err(Error::new(format!("ORT passed {count} inputs, the partition has {}", plan.inputs().len())));
    }
    let _mlx = mlx::lock();
    let run_started = Instant::now();
    let copy_in = plan.stats().phase(Phase::CopyIn, plan.name());
    let mut inputs = Vec::with_capacity(count);
    for (i, name) in plan.inputs().iter().enumerate() {
        let mut value: *const OrtValue = null();
        ort_call!(KernelContext_GetInput(ctx, i, &mut value))?;
        if value.is_null() {
            return Err(Error::new(format!("input '{name}' is missing")));
        }
        // SAFETY: ORT keeps input values alive during Compute.
        inputs.push(unsafe { tensor_to_array(value, &format!("input '{name}'"))? });
    }
    drop(copy_in);
    let outputs = plan.run(inputs)?;
    let copy_out = plan.stats().phase(Phase::CopyOut, plan.name());
    for (i, (array, out)) in outputs.iter().zip(plan.outputs()).enumerate() {
        let shape = array.shape();
        let mut value: *mut OrtValue = null_mut();
        ort_call!(KernelContext_GetOutput(ctx, i, shape.as_ptr(), shape.len(), &mut value))?;
        if value.is_null() {
            return Err(Error::new(format!("ORT gave no buffer for output '{}'", out.name)));
        }
        let mut size = 0usize;
        ort_call!(GetTensorSizeInBytes(value, &mut size))?;
        let mut data: *mut c_void = null_mut();
        ort_call!(GetTensorMutableData(value, &mut data))?;
        let buf: &mut [u8] = if size == 0 {
            &mut []
        } else {
            // SAFETY: ORT allocated `size` bytes for this output.
            unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), size) }
        };
        array.copy_to(buf, plan.stream()).map_err(|e| Error::new(format!("output '{}': {e}", out.name)))?;
    }
    drop(copy_out);
    if let Some(t) = plan.stats().tracer() {
        t.record(
            plan.name(),
            "partition",
            run_started,
            Instant::now(),
            serde_json::json!({ "mode": format!("{:?}", plan.mode()) }),
        );
    }
    Ok(())
}
