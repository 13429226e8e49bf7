//! Broadcasting arithmetic: Add, Sub, Mul, Div (opset 7 on: NumPy-style broadcasting).

use ep_core::lowering::{FLOATS, require_inputs, require_types};
use ep_core::mlx::{Array, Result as MlxResult, Stream, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

pub struct Binary {
    op: &'static str,
    f: fn(&Array, &Array, &Stream) -> MlxResult<Array>,
}

impl Lowering for Binary {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        7..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 2)?;
        require_types(node, FLOATS)
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
        Ok(vec![(self.f)(ctx.input(0)?, ctx.input(1)?, ctx.stream())?])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }

    fn name(&self) -> &'static str {
        self.op
    }
}

ep_core::register_lowering!(ADD = Binary { op: "Add", f: ops::add });
ep_core::register_lowering!(SUB = Binary { op: "Sub", f: ops::subtract });
ep_core::register_lowering!(MUL = Binary { op: "Mul", f: ops::multiply });
ep_core::register_lowering!(DIV = Binary { op: "Div", f: ops::divide });
