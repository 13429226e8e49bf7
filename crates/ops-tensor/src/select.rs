//! Data-dependent selections: NonZero and Compress. Their output shapes depend on input values,
//! so the condition is read on the host and the partition runs eagerly.

use ep_core::lowering::{ALL_TYPES, FnLowering, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_nonzero(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, ALL_TYPES)
}

/// The `[rank, count]` int64 coordinates of the nonzero elements, in row-major order.
fn lower_nonzero(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let values = ctx.host_f64(0)?;
    let r = shape.len();
    let hits: Vec<usize> = values.iter().enumerate().filter(|(_, v)| **v != 0.0).map(|(i, _)| i).collect();
    let mut coords = vec![0i64; r.max(1) * hits.len()];
    for (j, &flat) in hits.iter().enumerate() {
        let mut rest = flat as i64;
        for d in (0..r).rev() {
            coords[d * hits.len() + j] = rest % shape[d];
            rest /= shape[d];
        }
    }
    let rows = if r == 0 { 1 } else { r as i64 };
    if r == 0 {
        coords.iter_mut().for_each(|c| *c = 0);
    }
    Ok(vec![Array::from_slice(&coords, &[rows, hits.len() as i64])?])
}

ep_core::register_lowering!(
    NON_ZERO = FnLowering {
        domain: "",
        op: "NonZero",
        opsets: 9..=i32::MAX,
        claim: claim_nonzero,
        lower: lower_nonzero,
        safety: CompileSafety::Never,
    }
);

fn claim_compress(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, &[ElemType::Bool])
}

fn lower_compress(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let cond = ctx.host_f64(1)?;
    let s = ctx.stream_for(x.dtype());
    let (data, axis) = match node.attr("axis") {
        Some(_) => (x.clone(), normalize_axis(node.attr_int("axis", 0)?, x.ndim())?),
        None => (ops::reshape(x, &[-1], s)?, 0),
    };
    let dim = data.shape()[axis];
    if cond.len() as i64 > dim {
        bail!("condition has {} values for an axis of {dim}", cond.len());
    }
    let keep: Vec<i64> = cond.iter().enumerate().filter(|(_, c)| **c != 0.0).map(|(i, _)| i as i64).collect();
    let idx = Array::from_slice(&keep, &[keep.len() as i64])?;
    Ok(vec![ops::take(&data, &idx, axis as i32, s)?])
}

ep_core::register_lowering!(
    COMPRESS = FnLowering {
        domain: "",
        op: "Compress",
        opsets: 9..=i32::MAX,
        claim: claim_compress,
        lower: lower_compress,
        safety: CompileSafety::Never,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!("", "NonZero", || {
        (select(&[DType::F32, DType::I64, DType::Bool][..]), shape(1..=3), opset(13..=22), seed())
            .prop_map(|(t, s, v, seed)| {
                // Output length depends on the values: the case computes it from the same data.
                let n: i64 = s.iter().product();
                let data: Vec<f64> = (0..n)
                    .map(|i| ((i * 7 + seed as i64) % 3) as f64 * if t == DType::Bool { 0.5 } else { 1.0 })
                    .map(|x| if t == DType::Bool { (x > 0.0) as i64 as f64 } else { x })
                    .collect();
                let nnz = data.iter().filter(|&&x| x != 0.0).count() as i64;
                Case::op("NonZero", v)
                    .input_with("x", t, &s, Values::Data(data))
                    .output("y", DType::I64, &[s.len() as i64, nnz])
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!("", "Compress", || {
        (
            select(&[DType::F32, DType::I64][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            any::<bool>(),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(t, s, pick, flat, v, seed)| {
                let axis = pick.index(s.len());
                let dim = if flat { s.iter().product() } else { s[axis] };
                let cond: Vec<f64> = (0..dim).map(|i| ((i + seed as i64) % 2) as f64).collect();
                let kept = cond.iter().filter(|&&c| c != 0.0).count() as i64;
                let case = Case::op("Compress", v).input("x", t, &s).input_with(
                    "cond",
                    DType::Bool,
                    &[dim],
                    Values::Data(cond),
                );
                let (case, out) = if flat {
                    (case, vec![kept])
                } else {
                    let mut out = s.clone();
                    out[axis] = kept;
                    (case.attr_int("axis", axis as i64), out)
                };
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });
}
