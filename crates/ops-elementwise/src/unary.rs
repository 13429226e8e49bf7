//! Float activations and transcendental functions: Relu, Sigmoid, Tanh, Exp.

use ep_core::lowering::{FLOATS, require_inputs, require_types};
use ep_core::mlx::{Array, Result as MlxResult, Stream, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

pub struct Unary {
    op: &'static str,
    f: fn(&Array, &Stream) -> MlxResult<Array>,
}

impl Lowering for Unary {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        6..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 1, 1)?;
        require_types(node, FLOATS)
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
        Ok(vec![(self.f)(ctx.input(0)?, ctx.stream())?])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }

    fn name(&self) -> &'static str {
        self.op
    }
}

/// `max(x, 0)`; NaN stays NaN as in ONNX's definition.
fn relu(x: &Array, s: &Stream) -> MlxResult<Array> {
    let zero = ops::astype(&Array::scalar_f32(0.0), x.dtype(), s)?;
    ops::maximum(x, &zero, s)
}

ep_core::register_lowering!(RELU = Unary { op: "Relu", f: relu });
ep_core::register_lowering!(SIGMOID = Unary { op: "Sigmoid", f: ops::sigmoid });
ep_core::register_lowering!(TANH = Unary { op: "Tanh", f: ops::tanh });
ep_core::register_lowering!(EXP = Unary { op: "Exp", f: ops::exp });
