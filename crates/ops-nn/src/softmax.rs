//! Softmax, LogSoftmax and Hardmax. Opset 13 on: along one axis (default -1). Opsets 1 to 12: the
//! input is viewed as a 2-D matrix split at `axis` (default 1) and each row is normalised.

use ep_core::lowering::{FLOATS, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

pub struct Softmax {
    op: &'static str,
    kind: Kind,
    /// Opsets before 13 flatten to 2-D around the axis.
    flattening: bool,
}

/// The op along one axis of `x`.
fn apply(kind: Kind, x: &Array, axis: usize, s: &ep_core::mlx::Stream) -> Result<Array> {
    let n = x.shape()[axis];
    Ok(match kind {
        Kind::Softmax if n == 1 => {
            // One element per row: 1, or NaN for NaN/inf (as exp(x - max) gives). MLX 0.32.2's
            // compiled CPU reduction crashed on a size-1 middle axis, so it is not reduced.
            ops::add(&ops::subtract(x, x, s)?, &ops::astype(&Array::scalar_f32(1.0), x.dtype(), s)?, s)?
        }
        Kind::Softmax => {
            let t = x.dtype();
            if t == Dtype::F16 || t == Dtype::BF16 {
                // ONNX's definition step by step, each step rounded to the half type:
                // exp(x - max) / sum(exp(x - max)), the sum accumulated in float32.
                let a = axis as i32;
                let e = ops::exp(&ops::subtract(x, &ops::max_axes(x, &[a], true, s)?, s)?, s)?;
                let sum = ops::astype(&ops::sum_axes(&ops::astype(&e, Dtype::F32, s)?, &[a], true, s)?, t, s)?;
                ops::divide(&e, &sum, s)?
            } else {
                ops::softmax(x, axis as i32, s)?
            }
        }
        Kind::LogSoftmax if n == 1 => ops::subtract(x, x, s)?,
        Kind::LogSoftmax => {
            // In float32 for half types: x - logsumexp(x).
            let t = x.dtype();
            let w = if t == Dtype::F32 || t == Dtype::F64 { x.clone() } else { ops::astype(x, Dtype::F32, s)? };
            let lse = ops::logsumexp_axes(&w, &[axis as i32], true, s)?;
            ops::astype(&ops::subtract(&w, &lse, s)?, t, s)?
        }
        Kind::Hardmax => {
            // 1 at the first maximum of each row.
            let idx = ops::argmax_axis(x, axis as i32, true, s)?;
            let mut pos = vec![1i64; x.ndim()];
            pos[axis] = n;
            let range = ops::reshape(&ops::arange(0.0, n as f64, 1.0, Dtype::U32, s)?, &pos, s)?;
            ops::astype(&ops::equal(&ops::astype(&idx, Dtype::U32, s)?, &range, s)?, x.dtype(), s)?
        }
    })
}

impl Softmax {
    fn axis(&self, node: &NodeInfo, rank: usize) -> std::result::Result<usize, String> {
        let axis = node.attr_int("axis", if self.flattening { 1 } else { -1 })?;
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        // A scalar has no axis to normalise over; opset 13 allows axis 0 on rank 0 only as -1/0.
        if rank == 0 || a < 0 || a >= r.max(1) {
            return Err(format!("axis {axis} is out of range for rank {rank}"));
        }
        Ok(a as usize)
    }
}

impl Lowering for Softmax {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        if self.flattening { 1..=12 } else { 13..=i32::MAX }
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 1, 1)?;
        require_types(node, FLOATS)?;
        // With a known rank the axis is checked now; with an unknown one (a dynamic Reshape in
        // front) when the shape is known, as an error naming the node.
        if let Some(rank) = ep_core::lowering::input_rank(node, 0) {
            if rank == 0 {
                return Err(Decline::new("Softmax of a scalar"));
            }
            self.axis(node, rank)?;
        }
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let x = ctx.input(0)?;
        let shape = x.shape();
        let axis = self.axis(node, shape.len()).map_err(Error::new)?;
        if x.size() == 0 {
            // Nothing to normalize (MLX's argmax refuses an empty array).
            return Ok(vec![x.clone()]);
        }
        if !self.flattening {
            return Ok(vec![apply(self.kind, x, axis, s)?]);
        }
        let rows: i64 = shape[..axis].iter().product();
        let cols: i64 = shape[axis..].iter().product();
        let flat = ops::reshape(x, &[rows, cols], s)?;
        let y = apply(self.kind, &flat, 1, s)?;
        Ok(vec![ops::reshape(&y, &shape, s)?])
    }

    /// The opset 1-12 form reads the input's dimensions to flatten it.
    fn compile_safety(&self) -> CompileSafety {
        if self.flattening { CompileSafety::ShapeKeyed } else { CompileSafety::Shapeless }
    }

    fn name(&self) -> &'static str {
        if self.flattening { "Softmax(opset 1-12)" } else { "Softmax(opset 13+)" }
    }
}

ep_core::register_lowering!(SOFTMAX_2D = Softmax { op: "Softmax", kind: Kind::Softmax, flattening: true });
ep_core::register_lowering!(SOFTMAX = Softmax { op: "Softmax", kind: Kind::Softmax, flattening: false });
ep_core::register_lowering!(LOG_SOFTMAX_2D = Softmax { op: "LogSoftmax", kind: Kind::LogSoftmax, flattening: true });
ep_core::register_lowering!(LOG_SOFTMAX = Softmax { op: "LogSoftmax", kind: Kind::LogSoftmax, flattening: false });
ep_core::register_lowering!(HARDMAX_2D = Softmax { op: "Hardmax", kind: Kind::Hardmax, flattening: true });
ep_core::register_lowering!(HARDMAX = Softmax { op: "Hardmax", kind: Kind::Hardmax, flattening: false });

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, Values, register_spec};

    /// Both definitions (opset < 13 flattens at `axis`, 13+ is per-axis), every axis.
    fn softmax(op: &'static str) -> BoxedStrategy<Case> {
        (float_dtype(), nonempty_shape(1..=4), opset(7..=22), any::<prop::sample::Index>(), any::<bool>(), seed())
            .prop_map(move |(t, s, v, axis, default_axis, seed)| {
                let r = s.len() as i64;
                let axis = axis.index(2 * s.len()) as i64 - r;
                let case = Case::op(op, v).input_with("x", t, &s, Values::Uniform { lo: -5.0, hi: 5.0 });
                // Before opset 13 the default axis is 1, which a 1-D input does not have.
                let case = if default_axis && (v >= 13 || r >= 2) { case } else { case.attr_int("axis", axis) };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::SOFTMAX, || softmax("Softmax"));
    register_spec!(super::LOG_SOFTMAX, || softmax("LogSoftmax"));
    register_spec!(super::HARDMAX, || softmax("Hardmax"));
}
