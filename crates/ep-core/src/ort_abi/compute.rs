//! The `OrtNodeComputeInfo` of a compiled partition: under the MLX lock, binds ORT's inputs
//! (`copy_in`), runs the plan, writes ORT's outputs (`copy_out`).

use super::boundary::{guard, non_null};
use super::copy_in::{self, InputMemo};
use super::copy_out;
use super::ort_call;
use super::tables::{OrtNodeComputeContext, OrtNodeComputeInfo, TABLE_VERSION};
use crate::exec::Plan;
use crate::stats::Phase;
use crate::{Error, Result, mlx};
use ort_sys::{OrtKernelContext, OrtStatusPtr};
use std::ffi::c_void;
use std::time::Instant;

/// `table` must stay the first field: ORT sees a pointer to it.
#[repr(C)]
pub struct ComputeInfo {
    table: OrtNodeComputeInfo,
    plan: Plan,
    memo: std::sync::Mutex<Vec<InputMemo>>,
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
    let (inputs, values) = {
        let _copy_in = plan.stats().phase(Phase::CopyIn, plan.name());
        copy_in::bind_inputs(plan, memo, ctx, count)?
    };
    // Held until the outputs are copied: borrowed inputs must keep a second reference (MLX
    // never donates their buffers to outputs) and must not outlive this call.
    let held: Vec<mlx::Array> = inputs.clone();
    let run = plan.run(inputs)?;
    {
        let _copy_out = plan.stats().phase(Phase::CopyOut, plan.name());
        copy_out::write_outputs(plan, &run, &values, ctx)?;
    }
    drop(run);
    drop(held);
    if let Some(t) = plan.stats().tracer() {
        let args = serde_json::json!({ "mode": format!("{:?}", plan.mode()) });
        t.record(plan.name(), "partition", run_started, Instant::now(), args);
    }
    Ok(())
}
