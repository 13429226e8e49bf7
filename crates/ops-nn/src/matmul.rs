//! MatMul (NumPy semantics, any batch rank) and Gemm (`alpha * A' @ B' + beta * C`).
//! Both are shape-agnostic and compile shapeless.
//! ORT rewrites MatMul followed by Add into Gemm before the EP sees the graph.

use ep_core::lowering::{FLOATS, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

pub struct MatMul;

impl Lowering for MatMul {
    fn op_type(&self) -> &'static str {
        "MatMul"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        1..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 2)?;
        require_types(node, FLOATS)?;
        require_input_rank(node, 0, 1..=8)?;
        require_input_rank(node, 1, 1..=8)?;
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
        Ok(vec![ops::matmul(ctx.input(0)?, ctx.input(1)?, ctx.stream())?])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }
}

pub struct Gemm;

impl Lowering for Gemm {
    fn op_type(&self) -> &'static str {
        "Gemm"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        7..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 3)?;
        require_types(node, FLOATS)?;
        require_input_rank(node, 0, 2..=2)?;
        require_input_rank(node, 1, 2..=2)?;
        if node.input(2).is_some() {
            require_input_rank(node, 2, 0..=2)?;
        }
        for flag in ["transA", "transB"] {
            let v = node.attr_int(flag, 0)?;
            if v != 0 && v != 1 {
                return Err(Decline(format!("attribute {flag}={v} is not 0 or 1")));
            }
        }
        node.attr_float("alpha", 1.0)?;
        node.attr_float("beta", 1.0)?;
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let alpha = node.attr_float("alpha", 1.0).map_err(ep_core::Error::new)?;
        let beta = node.attr_float("beta", 1.0).map_err(ep_core::Error::new)?;
        // A transposed weight is computed once per session (derived constant), not per run.
        let transposed = |i: usize, flag: &str| -> Result<Array> {
            if node.attr_int(flag, 0).map_err(ep_core::Error::new)? == 1 {
                ctx.derived(i, "transpose", |x, s| Ok(ops::transpose(x, s)?))
            } else {
                Ok(ctx.input(i)?.clone())
            }
        };
        let a = transposed(0, "transA")?;
        let b = transposed(1, "transB")?;
        // `alpha * (A' @ B') + beta * C` as a product and a broadcasting add, not MLX's fused
        // addmm: compiled shapeless, addmm keeps the trace's shape for C and corrupts memory
        // when a later call has fewer rows (MLX 0.32.2).
        let mut out = ops::matmul(&a, &b, s)?;
        if alpha != 1.0 {
            out = ops::scale(&out, alpha, s)?;
        }
        if let Some(c) = ctx.optional_input(2).filter(|_| beta != 0.0) {
            let c = if beta == 1.0 { c.clone() } else { ops::scale(c, beta, s)? };
            out = ops::add(&out, &c, s)?;
        }
        Ok(vec![out])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }
}

ep_core::register_lowering!(MATMUL = MatMul);
ep_core::register_lowering!(GEMM = Gemm);
