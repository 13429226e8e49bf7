//! An out-of-tree style op crate: `com.microsoft:ExpandDims(x, axis)`, which inserts a size-1
//! dim at `axis` (an int32 scalar input; negative counts from the end of the output). The
//! example plugin bundles it without `ops-tensor` (which lowers the op too: two registrations of
//! one op in one library are refused as duplicates). It uses nothing but `ep_core`'s public lowering
//! API: a type implementing [`Lowering`], one [`ep_core::register_lowering!`] line, and a
//! `link()` function the plugin library calls so the linker keeps the registration.
#![forbid(unsafe_code)]

use ep_core::lowering::{ALL_TYPES, normalize_axis, require_constant, require_input_type, require_inputs};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, Lowering, NodeInfo, Result, bail};
use std::ops::RangeInclusive;

pub struct ExpandDims;

impl Lowering for ExpandDims {
    fn domain(&self) -> &'static str {
        "com.microsoft"
    }

    fn op_type(&self) -> &'static str {
        "ExpandDims"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        1..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 2)?;
        require_input_type(node, 0, ALL_TYPES)?;
        require_input_type(node, 1, &[ElemType::I32])?;
        // A runtime axis would make the output rank data-dependent: only constants are taken.
        require_constant(node, 1, "axis")
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
        let x = ctx.input(0)?;
        let Some(&axis) = ctx.host_i64(1)?.first() else { bail!("axis is empty") };
        let axis = normalize_axis(axis, x.ndim() + 1)?;
        Ok(vec![ops::expand_dims(x, axis as i32, ctx.stream())?])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::ShapeKeyed
    }
}

ep_core::register_lowering!(EXPAND_DIMS = ExpandDims);

/// Referenced by the plugin library so the linker keeps this crate's registration.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "example-expand-dims" }
}
