//! ArrayFeatureExtractor: the features `indices` (int64, any shape, taken flat) of the input's
//! last axis; a 1-D input gives `[1, len(indices)]`. An index outside `[0, features)` fails the
//! run, as on ORT's CPU EP (checked with the outputs; clamped until then).

use crate::ML;
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, &[ElemType::F32, ElemType::I64, ElemType::I32])?;
    require_input_type(node, 1, &[ElemType::I64])
}

fn lower(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, idx) = (ctx.input(0)?.clone(), ctx.input(1)?.clone());
    let s = ctx.stream();
    let shape = x.shape();
    let c = *shape.last().ok_or_else(|| ep_core::Error::new("the input has rank 0: it has no features"))?;
    let count: i64 = idx.shape().iter().product();
    if count == 0 {
        return Err(ep_core::Error::new("no indices given (ORT's CPU EP refuses an empty selection)"));
    }
    if c == 0 {
        return Err(ep_core::Error::new("indices into an input with no features"));
    }
    let flat = ops::reshape(&idx, &[count], s)?;
    let zero = ops::scalar(0.0, Dtype::I64, s)?;
    let dim = ops::scalar(c as f64, Dtype::I64, s)?;
    let inside = ops::logical_and(&ops::greater_equal(&flat, &zero, s)?, &ops::less(&flat, &dim, s)?, s)?;
    ctx.check(&inside, format!("an index is outside [0, {c}) (the input has {c} features)"))?;
    let s = ctx.stream();
    let last = ops::scalar((c - 1).max(0) as f64, Dtype::I64, s)?;
    let safe = ops::clip(&flat, Some(&zero), Some(&last), s)?;
    let y = ops::take(&x, &safe, -1, s)?;
    Ok(vec![if shape.len() == 1 { ops::reshape(&y, &[1, count], s)? } else { y }])
}

ep_core::register_lowering!(
    ARRAY_FEATURE_EXTRACTOR = FnLowering {
        domain: ML,
        op: "ArrayFeatureExtractor",
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
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::ARRAY_FEATURE_EXTRACTOR, || {
        (select(&[DType::F32, DType::I64, DType::I32][..]), nonempty_shape(1..=3), 1..=4i64, seed())
            .prop_map(|(t, s, k, seed)| {
                let c = *s.last().expect("rank >= 1");
                let idx: Vec<f64> = (0..k).map(|i| ((i * 7 + seed as i64) % c) as f64).collect();
                let mut y = s.clone();
                if y.len() == 1 {
                    y.insert(0, 1);
                }
                *y.last_mut().expect("rank >= 1") = k;
                Case::domain_op("ai.onnx.ml", "ArrayFeatureExtractor", 1)
                    .input("x", t, &s)
                    .input_with("idx", DType::I64, &[k], Values::Data(idx))
                    .output("y", t, &y)
                    .with_seed(seed)
            })
            .boxed()
    });
}
