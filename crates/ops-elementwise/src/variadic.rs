//! Variadic broadcasting reductions over inputs: Min, Max, Sum, Mean.

use ep_core::lowering::{NUMERIC, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

#[derive(Clone, Copy)]
enum Kind {
    Min,
    Max,
    Sum,
    Mean,
}

pub struct Variadic {
    op: &'static str,
    kind: Kind,
}

impl Lowering for Variadic {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        // Opsets 6 and 7 differ only in broadcasting, which the lowering always does.
        6..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        if node.inputs.iter().flatten().count() == 0 {
            return Err(Decline::new("no inputs"));
        }
        require_types(node, NUMERIC)
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
        let inputs: Vec<Array> = (0..ctx.num_inputs()).filter_map(|i| ctx.optional_input(i).cloned()).collect();
        let s = ctx.stream_for(inputs[0].dtype());
        let mut acc = inputs[0].clone();
        for x in &inputs[1..] {
            acc = match self.kind {
                Kind::Min => ops::minimum(&acc, x, s)?,
                Kind::Max => ops::maximum(&acc, x, s)?,
                Kind::Sum | Kind::Mean => ops::add(&acc, x, s)?,
            };
        }
        if let Kind::Mean = self.kind {
            let n = ops::scalar(inputs.len() as f64, acc.dtype(), s)?;
            acc = ops::divide(&acc, &n, s)?;
        }
        // A single input still broadcasts nothing: return it as a new value.
        if inputs.len() == 1 && acc.dtype() != Dtype::Bool {
            acc = ops::copy(&acc, s)?;
        }
        Ok(vec![acc])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }

    fn name(&self) -> &'static str {
        self.op
    }
}

ep_core::register_lowering!(MIN = Variadic { op: "Min", kind: Kind::Min });
ep_core::register_lowering!(MAX = Variadic { op: "Max", kind: Kind::Max });
ep_core::register_lowering!(SUM = Variadic { op: "Sum", kind: Kind::Sum });
ep_core::register_lowering!(MEAN = Variadic { op: "Mean", kind: Kind::Mean });

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// One to three inputs that broadcast together; floats with special values.
    fn variadic(op: &'static str, types: &'static [DType]) -> BoxedStrategy<Case> {
        (select(types), broadcast_pair(0..=3), broadcast_pair(0..=3), 1..=3usize, opset(13..=22), seed())
            .prop_map(move |(t, (a, b, _), (_, c, _), n, v, seed)| {
                let shapes = [a, b, c];
                let shapes = &shapes[..n];
                let mut y: Vec<i64> = vec![];
                for s in shapes {
                    y = broadcast_shape(&y, s).unwrap_or_else(|| s.clone());
                }
                // The third operand must broadcast with the first two: otherwise drop it.
                let ok = shapes.iter().try_fold(vec![], |acc: Vec<i64>, s| broadcast_shape(&acc, s)).is_some();
                let shapes: Vec<Vec<i64>> = if ok { shapes.to_vec() } else { shapes[..2.min(n)].to_vec() };
                let y = shapes.iter().try_fold(vec![], |acc: Vec<i64>, s| broadcast_shape(&acc, s)).unwrap_or_default();
                let vals = if t.is_float() { Values::Special } else { Values::Uniform { lo: -50.0, hi: 50.0 } };
                let mut case = Case::op(op, v);
                for (i, s) in shapes.iter().enumerate() {
                    case = case.input_with(&format!("x{i}"), t, s, vals.clone());
                }
                case.output("y", t, &y).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::MIN, || variadic("Min", &[DType::F32, DType::F16, DType::I32, DType::I64]));
    register_spec!(super::MAX, || variadic("Max", &[DType::F32, DType::F16, DType::I32, DType::I64]));
    register_spec!(super::SUM, || variadic("Sum", &[DType::F32, DType::F16]));
    register_spec!(super::MEAN, || variadic("Mean", &[DType::F32, DType::F16]));
}
