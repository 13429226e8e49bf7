//! ReverseSequence: for each batch entry `b`, the first `sequence_lens[b]` steps along the time
//! axis in reverse order, the rest as they are. The lengths are data: the source position of
//! every step is computed on the device, and a length outside `[0, T]` fails the run.

use ep_core::lowering::{ALL_TYPES, FnLowering, require_input_type, require_inputs};
use ep_core::mlx::Array;
use ep_core::mlx::{Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, &[ElemType::I64])?;
    let (time, batch) = (node.attr_int("time_axis", 0)?, node.attr_int("batch_axis", 1)?);
    match (time, batch) {
        (0, 1) | (1, 0) => Ok(()),
        _ => Err(Decline(format!("time_axis {time} and batch_axis {batch} must be 0 and 1 in some order"))),
    }
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, lens, s) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.stream());
    let shape = x.shape();
    let time = node.attr_int("time_axis", 0)? as usize;
    let batch = 1 - time;
    if shape.len() < 2 || lens.shape() != [shape[batch]] {
        bail!("sequence_lens {:?} must hold one length per batch entry of {shape:?}", lens.shape());
    }
    let t = shape[time];
    let lens = ops::astype(&lens, Dtype::I64, s)?;
    let (zero, full) = (ops::scalar(0.0, Dtype::I64, s)?, ops::scalar(t as f64, Dtype::I64, s)?);
    let valid = ops::logical_and(&ops::greater_equal(&lens, &zero, s)?, &ops::less_equal(&lens, &full, s)?, s)?;
    ctx.check(&valid, format!("a sequence length is outside [0, {t}] (the time axis has {t} steps)"))?;
    let lens = ops::clip(&lens, Some(&zero), Some(&full), s)?;
    // Source step of each (time, batch) position: len - 1 - t inside the length, t beyond it.
    let mut at = vec![1i64; shape.len()];
    at[time] = t;
    let steps = ops::reshape(&ops::arange(0.0, t as f64, 1.0, Dtype::I64, s)?, &at, s)?;
    let mut per_batch = vec![1i64; shape.len()];
    per_batch[batch] = shape[batch];
    let lens = ops::reshape(&lens, &per_batch, s)?;
    let reversed = ops::subtract(&ops::subtract(&lens, &ops::scalar(1.0, Dtype::I64, s)?, s)?, &steps, s)?;
    let source = ops::where_(&ops::less(&steps, &lens, s)?, &reversed, &steps, s)?;
    let source = ops::broadcast_to(&source, &shape, s)?;
    Ok(vec![ops::take_along_axis(&x, &source, time as i32, s)?])
}

ep_core::register_lowering!(
    REVERSE_SEQUENCE = FnLowering {
        domain: "",
        op: "ReverseSequence",
        opsets: 10..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::spec_util::*;
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::REVERSE_SEQUENCE, || {
        (any_dtype(), 1..=5i64, 1..=4i64, shape(0..=2), any::<bool>(), seed())
            .prop_map(|(t, steps, batch, rest, batch_first, seed)| {
                let (time_axis, batch_axis) = if batch_first { (1, 0) } else { (0, 1) };
                let mut x = if batch_first { vec![batch, steps] } else { vec![steps, batch] };
                x.extend(&rest);
                Case::op("ReverseSequence", 10)
                    .input("x", t, &x)
                    .input_with("lens", DType::I64, &[batch], Values::Uniform { lo: 0.0, hi: steps as f64 + 1.0 })
                    .attr_int("time_axis", time_axis)
                    .attr_int("batch_axis", batch_axis)
                    .output("y", t, &x)
                    .with_seed(seed)
            })
            .boxed()
    });
}
