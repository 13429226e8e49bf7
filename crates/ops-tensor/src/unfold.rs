//! `com.microsoft` UnfoldTensor: the windows of `size` elements, `step` apart, along `dim`,
//! each window becoming a new last axis (`[.., n, ..]` to `[.., (n - size) / step + 1, .., size]`),
//! as one gather of a window-index table. float32, int32 and int64: the types ORT's kernel takes
//! that MLX's GPUs hold (float64 stays on the CPU).

use ep_core::lowering::{FnLowering, input_rank, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::F32, ElemType::I32, ElemType::I64])?;
    let rank = input_rank(node, 0).ok_or_else(|| Decline::new("the input's rank is not known"))?;
    if rank == 0 {
        return Err(Decline::new("a scalar has no dimension to unfold"));
    }
    normalize_axis(node.attr_int("dim", -1)?, rank)?;
    let (size, step) = (node.attr_int("size", 0)?, node.attr_int("step", 1)?);
    if size < 1 || step < 1 || size > i32::MAX as i64 || step > i32::MAX as i64 {
        return Err(Decline::new(format!("size {size} and step {step} must be positive 32-bit values")));
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let shape = x.shape();
    let rank = shape.len();
    let dim = normalize_axis(node.attr_int("dim", -1)?, rank)?;
    let (size, step) = (node.attr_int("size", 0)?, node.attr_int("step", 1)?);
    let n = shape[dim];
    if size > n {
        bail!("size {size} is larger than dimension {dim} ({n})");
    }
    let windows = (n - size) / step + 1;
    let at: Vec<i32> = (0..windows).flat_map(|w| (0..size).map(move |i| (w * step + i) as i32)).collect();
    let at = Array::from_slice(&at, &[windows, size])?;
    // [.., windows, size, ..] with the size axis then moved last.
    let y = ops::take(x, &at, dim as i32, s)?;
    let mut perm: Vec<i32> = (0..=rank as i32).filter(|&a| a != dim as i32 + 1).collect();
    perm.push(dim as i32 + 1);
    Ok(vec![ops::transpose_axes(&y, &perm, s)?])
}

ep_core::register_lowering!(
    UNFOLD_TENSOR = FnLowering {
        domain: "com.microsoft",
        op: "UnfoldTensor",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, register_spec};

    register_spec!(super::UNFOLD_TENSOR, || {
        let types = &[DType::F32, DType::I32, DType::I64][..];
        (dtype_of(types), nonempty_shape(1..=3), 0..3usize, 1..=3i64, 1..=3i64, seed())
            .prop_map(|(t, mut shape, dim, size, step, seed)| {
                let dim = dim % shape.len();
                shape[dim] = shape[dim].max(size);
                let mut out = shape.clone();
                out[dim] = (shape[dim] - size) / step + 1;
                out.push(size);
                let d = if seed % 2 == 0 { dim as i64 } else { dim as i64 - shape.len() as i64 };
                Case::domain_op("com.microsoft", "UnfoldTensor", 1)
                    .input("x", t, &shape)
                    .attr_int("dim", d)
                    .attr_int("size", size)
                    .attr_int("step", step)
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });
}
