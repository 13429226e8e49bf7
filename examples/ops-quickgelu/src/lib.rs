//! An out-of-tree style op crate: `com.microsoft:QuickGelu`, `y = x * sigmoid(alpha * x)`
//! (with `alpha = 1` it is Swish / SiLU). It uses nothing but `ep_core`'s public lowering API:
//! a type implementing [`Lowering`], one [`ep_core::register_lowering!`] line, and a `link()`
//! function the plugin library calls so the linker keeps the registration.
#![forbid(unsafe_code)]

use ep_core::lowering::{FLOATS, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, Error, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

pub struct QuickGelu;

impl QuickGelu {
    fn alpha(node: &NodeInfo) -> std::result::Result<f32, String> {
        node.attr_float("alpha", 1.702)
    }
}

impl Lowering for QuickGelu {
    fn domain(&self) -> &'static str {
        "com.microsoft"
    }

    fn op_type(&self) -> &'static str {
        "QuickGelu"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        1..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 1, 1)?;
        require_types(node, FLOATS)?;
        Self::alpha(node)?;
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let x = ctx.input(0)?;
        let alpha = Self::alpha(node).map_err(Error::new)?;
        let gate = ops::sigmoid(&ops::scale(x, alpha, s)?, s)?;
        Ok(vec![ops::multiply(x, &gate, s)?])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }
}

ep_core::register_lowering!(QUICK_GELU = QuickGelu);

/// Referenced by the plugin library so the linker keeps this crate's registration.
pub fn link() {}
