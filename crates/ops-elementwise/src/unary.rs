//! Float unary math and activations: Relu, Sigmoid, Tanh, Exp, Log, Sqrt, Abs, Neg, Reciprocal,
//! Floor, Ceil, Round, Sign, Erf, the trigonometric and hyperbolic functions and their inverses.
//! Each is exactly MLX's elementwise function of the same meaning (Round: halves to even, as
//! ONNX defines it). Abs and Neg also take integers (wrapping at the type's minimum, as ORT's
//! CPU EP does); the other integer forms are left to the CPU EP.

use ep_core::ElemType;
use ep_core::lowering::{FLOATS, require_inputs, require_types};
use ep_core::mlx::{Array, Result as MlxResult, Stream, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

pub struct Unary {
    op: &'static str,
    /// The first opset whose definition this lowering implements.
    since: i32,
    f: fn(&Array, &Stream) -> MlxResult<Array>,
    /// The element types it takes.
    types: &'static [ElemType],
}

/// Abs: floats and every integer type.
const ABS_TYPES: &[ElemType] = &[
    ElemType::F32,
    ElemType::F16,
    ElemType::BF16,
    ElemType::I8,
    ElemType::I16,
    ElemType::I32,
    ElemType::I64,
    ElemType::U8,
    ElemType::U16,
    ElemType::U32,
    ElemType::U64,
];

/// Neg: floats and the signed integer types.
const NEG_TYPES: &[ElemType] =
    &[ElemType::F32, ElemType::F16, ElemType::BF16, ElemType::I8, ElemType::I16, ElemType::I32, ElemType::I64];

impl Lowering for Unary {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        self.since..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 1, 1)?;
        require_types(node, self.types)
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

/// `sign(x)`, with NaN kept NaN (MLX's sign gives 0 for NaN).
/// NaN stays NaN, except in float16, where ORT's CPU EP answers 0 (its half-type kernel
/// compares with zero).
fn sign(x: &Array, s: &Stream) -> MlxResult<Array> {
    let nan_to = if x.dtype() == ep_core::mlx::Dtype::F16 { ops::scalar(0.0, x.dtype(), s)? } else { x.clone() };
    ops::where_(&ops::isnan(x, s)?, &nan_to, &ops::sign(x, s)?, s)
}

ep_core::register_lowering!(RELU = Unary { op: "Relu", since: 6, f: relu, types: FLOATS });
ep_core::register_lowering!(SIGMOID = Unary { op: "Sigmoid", since: 6, f: ops::sigmoid, types: FLOATS });
ep_core::register_lowering!(TANH = Unary { op: "Tanh", since: 6, f: ops::tanh, types: FLOATS });
ep_core::register_lowering!(EXP = Unary { op: "Exp", since: 6, f: ops::exp, types: FLOATS });
ep_core::register_lowering!(LOG = Unary { op: "Log", since: 6, f: ops::log, types: FLOATS });
ep_core::register_lowering!(SQRT = Unary { op: "Sqrt", since: 6, f: ops::sqrt, types: FLOATS });
ep_core::register_lowering!(ABS = Unary { op: "Abs", since: 6, f: ops::abs, types: ABS_TYPES });
ep_core::register_lowering!(NEG = Unary { op: "Neg", since: 6, f: ops::negative, types: NEG_TYPES });
ep_core::register_lowering!(RECIPROCAL = Unary { op: "Reciprocal", since: 6, f: ops::reciprocal, types: FLOATS });
ep_core::register_lowering!(FLOOR = Unary { op: "Floor", since: 6, f: ops::floor, types: FLOATS });
ep_core::register_lowering!(CEIL = Unary { op: "Ceil", since: 6, f: ops::ceil, types: FLOATS });
ep_core::register_lowering!(ROUND = Unary { op: "Round", since: 11, f: ops::round, types: FLOATS });
ep_core::register_lowering!(SIGN = Unary { op: "Sign", since: 9, f: sign, types: FLOATS });
ep_core::register_lowering!(ERF = Unary { op: "Erf", since: 9, f: ops::erf, types: FLOATS });
ep_core::register_lowering!(SIN = Unary { op: "Sin", since: 7, f: ops::sin, types: FLOATS });
ep_core::register_lowering!(COS = Unary { op: "Cos", since: 7, f: ops::cos, types: FLOATS });
ep_core::register_lowering!(TAN = Unary { op: "Tan", since: 7, f: ops::tan, types: FLOATS });
ep_core::register_lowering!(ASIN = Unary { op: "Asin", since: 7, f: ops::arcsin, types: FLOATS });
ep_core::register_lowering!(ACOS = Unary { op: "Acos", since: 7, f: ops::arccos, types: FLOATS });
ep_core::register_lowering!(ATAN = Unary { op: "Atan", since: 7, f: ops::arctan, types: FLOATS });
ep_core::register_lowering!(SINH = Unary { op: "Sinh", since: 9, f: ops::sinh, types: FLOATS });
ep_core::register_lowering!(COSH = Unary { op: "Cosh", since: 9, f: ops::cosh, types: FLOATS });
ep_core::register_lowering!(ASINH = Unary { op: "Asinh", since: 9, f: ops::arcsinh, types: FLOATS });
ep_core::register_lowering!(ACOSH = Unary { op: "Acosh", since: 9, f: ops::arccosh, types: FLOATS });
ep_core::register_lowering!(ATANH = Unary { op: "Atanh", since: 9, f: ops::arctanh, types: FLOATS });

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// Any float shape (scalars and size-0 dims included), values with NaN, ±inf and extremes
    /// mixed in, at an opset from the lowering's first to 22.
    fn unary(op: &'static str, since: u32) -> BoxedStrategy<Case> {
        unary_with(op, since, |_| Values::Special)
    }

    /// Floats and integers (unsigned too where `unsigned`), extremes included: integer
    /// minimums wrap (`Neg(-128) = -128` in int8), as ORT's CPU EP computes them.
    fn with_ints(op: &'static str, unsigned: bool) -> BoxedStrategy<Case> {
        let signed = [DType::F32, DType::F16, DType::I8, DType::I16, DType::I32, DType::I64];
        let all = [
            DType::F32,
            DType::F16,
            DType::I8,
            DType::I16,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::U16,
            DType::U32,
            DType::U64,
        ];
        let types: Vec<DType> = if unsigned { all.to_vec() } else { signed.to_vec() };
        (select(types), shape(0..=4), opset(13..=22), seed())
            .prop_map(move |(t, s, v, seed)| {
                Case::op(op, v).input_with("x", t, &s, Values::Special).output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    fn unary_with(op: &'static str, since: u32, values: fn(DType) -> Values) -> BoxedStrategy<Case> {
        (float_dtype(), shape(0..=4), opset(since.max(7)..=22), seed())
            .prop_map(move |(t, s, v, seed)| {
                Case::op(op, v).input_with("x", t, &s, values(t)).output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::RELU, || unary("Relu", 6));
    register_spec!(super::SIGMOID, || unary("Sigmoid", 6));
    register_spec!(super::TANH, || unary("Tanh", 6));
    register_spec!(super::EXP, || unary("Exp", 6));
    register_spec!(super::LOG, || unary("Log", 6));
    register_spec!(super::SQRT, || unary("Sqrt", 6));
    register_spec!(super::ABS, || with_ints("Abs", true));
    register_spec!(super::NEG, || with_ints("Neg", false));
    register_spec!(super::RECIPROCAL, || unary("Reciprocal", 6));
    register_spec!(super::FLOOR, || unary("Floor", 6));
    register_spec!(super::CEIL, || unary("Ceil", 6));
    register_spec!(super::ROUND, || unary("Round", 11));
    // ORT's CPU EP gives Sign(NaN) = NaN in float32 but 0 in float16; the lowering keeps NaN
    // (NumPy's and ONNX's reference answer), so float16 cases leave NaN out.
    register_spec!(super::SIGN, || {
        unary_with("Sign", 9, |t| if t == DType::F16 { Values::Uniform { lo: -3.0, hi: 3.0 } } else { Values::Special })
    });
    register_spec!(super::ERF, || unary("Erf", 9));
    register_spec!(super::SIN, || unary("Sin", 7));
    register_spec!(super::COS, || unary("Cos", 7));
    register_spec!(super::TAN, || unary("Tan", 7));
    register_spec!(super::ASIN, || unary("Asin", 7));
    register_spec!(super::ACOS, || unary("Acos", 7));
    register_spec!(super::ATAN, || unary("Atan", 7));
    register_spec!(super::SINH, || unary("Sinh", 9));
    register_spec!(super::COSH, || unary("Cosh", 9));
    register_spec!(super::ASINH, || unary("Asinh", 9));
    register_spec!(super::ACOSH, || unary("Acosh", 9));
    register_spec!(super::ATANH, || unary("Atanh", 9));
}
