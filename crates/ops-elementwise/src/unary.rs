//! Float unary math and activations: Relu, Sigmoid, Tanh, Exp, Log, Sqrt, Abs, Neg, Reciprocal,
//! Floor, Ceil, Round, Sign, Erf, the trigonometric and hyperbolic functions and their inverses.
//! Each is exactly MLX's elementwise function of the same meaning (Round: halves to even, as
//! ONNX defines it); integer forms are left to the CPU EP for now.

use ep_core::lowering::{FLOATS, require_inputs, require_types};
use ep_core::mlx::{Array, Result as MlxResult, Stream, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

pub struct Unary {
    op: &'static str,
    /// The first opset whose definition this lowering implements.
    since: i32,
    f: fn(&Array, &Stream) -> MlxResult<Array>,
}

impl Lowering for Unary {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        self.since..=i32::MAX
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

ep_core::register_lowering!(RELU = Unary { op: "Relu", since: 6, f: relu });
ep_core::register_lowering!(SIGMOID = Unary { op: "Sigmoid", since: 6, f: ops::sigmoid });
ep_core::register_lowering!(TANH = Unary { op: "Tanh", since: 6, f: ops::tanh });
ep_core::register_lowering!(EXP = Unary { op: "Exp", since: 6, f: ops::exp });
ep_core::register_lowering!(LOG = Unary { op: "Log", since: 6, f: ops::log });
ep_core::register_lowering!(SQRT = Unary { op: "Sqrt", since: 6, f: ops::sqrt });
ep_core::register_lowering!(ABS = Unary { op: "Abs", since: 6, f: ops::abs });
ep_core::register_lowering!(NEG = Unary { op: "Neg", since: 6, f: ops::negative });
ep_core::register_lowering!(RECIPROCAL = Unary { op: "Reciprocal", since: 6, f: ops::reciprocal });
ep_core::register_lowering!(FLOOR = Unary { op: "Floor", since: 6, f: ops::floor });
ep_core::register_lowering!(CEIL = Unary { op: "Ceil", since: 6, f: ops::ceil });
ep_core::register_lowering!(ROUND = Unary { op: "Round", since: 11, f: ops::round });
ep_core::register_lowering!(SIGN = Unary { op: "Sign", since: 9, f: ops::sign });
ep_core::register_lowering!(ERF = Unary { op: "Erf", since: 9, f: ops::erf });
ep_core::register_lowering!(SIN = Unary { op: "Sin", since: 7, f: ops::sin });
ep_core::register_lowering!(COS = Unary { op: "Cos", since: 7, f: ops::cos });
ep_core::register_lowering!(TAN = Unary { op: "Tan", since: 7, f: ops::tan });
ep_core::register_lowering!(ASIN = Unary { op: "Asin", since: 7, f: ops::arcsin });
ep_core::register_lowering!(ACOS = Unary { op: "Acos", since: 7, f: ops::arccos });
ep_core::register_lowering!(ATAN = Unary { op: "Atan", since: 7, f: ops::arctan });
ep_core::register_lowering!(SINH = Unary { op: "Sinh", since: 9, f: ops::sinh });
ep_core::register_lowering!(COSH = Unary { op: "Cosh", since: 9, f: ops::cosh });
ep_core::register_lowering!(ASINH = Unary { op: "Asinh", since: 9, f: ops::arcsinh });
ep_core::register_lowering!(ACOSH = Unary { op: "Acosh", since: 9, f: ops::arccosh });
ep_core::register_lowering!(ATANH = Unary { op: "Atanh", since: 9, f: ops::arctanh });
