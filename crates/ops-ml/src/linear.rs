//! LinearRegressor: `y = x @ coefficients^T + intercepts` for `[N, C]` float32 input and
//! `targets` outputs per row (`post_transform` NONE; the others are left to ORT's CPU EP).
//! LinearClassifier: the same scores per class, an int64 label per row (the first best class;
//! with one class, the second label where the score is positive) and the scores after
//! `post_transform` (NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO), as ORT's CPU EP computes them.

use crate::{ML, floats, ints};
use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32])?;
    require_input_rank(node, 0, 2..=2)?;
    match node.attr("post_transform") {
        None => {}
        Some(AttrValue::String(t)) if t == "NONE" => {}
        Some(other) => return Err(Decline(format!("post_transform={other:?} is not supported (NONE is)"))),
    }
    let targets = node.attr_int("targets", 1)?;
    let coefficients = floats(node, "coefficients").len() as i64;
    if targets < 1 || coefficients == 0 {
        return Err(Decline(format!("{coefficients} coefficients for {targets} target(s)")));
    }
    let intercepts = floats(node, "intercepts").len() as i64;
    if intercepts != 0 && intercepts != targets {
        return Err(Decline(format!("{intercepts} intercepts for {targets} target(s)")));
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let targets = node.attr_int("targets", 1)?;
    let coefficients = floats(node, "coefficients");
    let c = x.shape()[1];
    // ORT's CPU EP reads the first `targets * features` coefficients (any beyond are unused).
    let used = usize::try_from(targets * c).unwrap_or(usize::MAX);
    if coefficients.len() < used {
        return Err(ep_core::Error::new(format!(
            "the input has {c} features: {targets} target(s) need {used} coefficients, {} given",
            coefficients.len()
        )));
    }
    let w = Array::from_slice(&coefficients[..used], &[targets, c])?;
    let y = ops::matmul(x, &ops::transpose_axes(&w, &[1, 0], s)?, s)?;
    let intercepts = floats(node, "intercepts");
    if intercepts.is_empty() {
        return Ok(vec![y]);
    }
    Ok(vec![ops::add(&y, &Array::from_slice(intercepts, &[targets])?, s)?])
}

ep_core::register_lowering!(
    LINEAR_REGRESSOR = FnLowering {
        domain: ML,
        op: "LinearRegressor",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn post_transform(node: &NodeInfo) -> std::result::Result<&str, Decline> {
    match node.attr("post_transform") {
        None => Ok("NONE"),
        Some(AttrValue::String(t)) if ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"].contains(&t.as_str()) => Ok(t),
        Some(other) => Err(Decline(format!(
            "post_transform={other:?} is not supported (NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO are)"
        ))),
    }
}

fn claim_classifier(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32, ElemType::I64, ElemType::I32])?;
    require_input_rank(node, 0, 1..=2)?;
    post_transform(node)?;
    if matches!(node.attr("classlabels_strings"), Some(AttrValue::Strings(v)) if !v.is_empty()) {
        return Err(Decline::new("string labels stay on ORT's CPU EP"));
    }
    let classes = floats(node, "intercepts").len();
    let labels = ints(node, "classlabels_ints").len();
    if classes == 0 || floats(node, "coefficients").is_empty() {
        return Err(Decline::new("LinearClassifier needs coefficients and one intercept per class"));
    }
    let fits = if classes == 1 { labels == 0 || labels == 2 } else { labels == classes };
    if !fits {
        return Err(Decline(format!("{labels} labels for {classes} classes")));
    }
    Ok(())
}

fn lower_classifier(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ops::astype(ctx.input(0)?, ep_core::mlx::Dtype::F32, s)?;
    let x = if x.ndim() == 1 { ops::reshape(&x, &[1, x.shape()[0]], s)? } else { x };
    let intercepts = floats(node, "intercepts");
    let classes = intercepts.len() as i64;
    let coefficients = floats(node, "coefficients");
    let f = x.shape()[1];
    // As ORT's CPU EP: the first `classes * features` coefficients (any beyond are unused).
    let used = usize::try_from(classes * f).unwrap_or(usize::MAX);
    if coefficients.len() < used {
        return Err(ep_core::Error::new(format!(
            "{} coefficients for {classes} classes of {f} features (the input's second dim)",
            coefficients.len()
        )));
    }
    let n = x.shape()[0];
    if n == 0 {
        let z = if classes == 1 && ints(node, "classlabels_ints").len() == 2 { 2 } else { classes };
        let empty = |t| ops::full(&[0], &ops::scalar(0.0, t, s)?, t, s);
        return Ok(vec![
            empty(ep_core::mlx::Dtype::I64)?,
            ops::reshape(&empty(ep_core::mlx::Dtype::F32)?, &[0, z], s)?,
        ]);
    }
    let w = Array::from_slice(&coefficients[..used], &[classes, f])?;
    let scores = ops::add(
        &ops::matmul(&x, &ops::transpose_axes(&w, &[1, 0], s)?, s)?,
        &Array::from_slice(intercepts, &[classes])?,
        s,
    )?;
    let labels = ints(node, "classlabels_ints");
    let i64s = |v: &[i64]| Array::from_slice(v, &[v.len() as i64]);
    let zero = ops::scalar(0.0, ep_core::mlx::Dtype::F32, s)?;
    if classes == 1 {
        let (neg, pos) = if labels.len() == 2 { (labels[0], labels[1]) } else { (0, 1) };
        let score = ops::reshape(&scores, &[n], s)?;
        let label = ops::where_(&ops::greater(&score, &zero, s)?, &i64s(&[pos])?, &i64s(&[neg])?, s)?;
        // With two labels the scores are [1 - s, s], or [logistic(-s), logistic(s)] for
        // LOGISTIC (ORT's CPU EP applies no other transform there, nor any to a single column).
        let post = post_transform(node).map_err(|d| ep_core::Error::new(d.0))?;
        let z = if labels.len() == 2 && post == "LOGISTIC" {
            ops::concatenate(&[ops::sigmoid(&ops::negative(&scores, s)?, s)?, ops::sigmoid(&scores, s)?], 1, s)?
        } else if labels.len() == 2 {
            let one = ops::scalar(1.0, ep_core::mlx::Dtype::F32, s)?;
            ops::concatenate(&[ops::subtract(&one, &scores, s)?, scores], 1, s)?
        } else {
            scores
        };
        return Ok(vec![label, z]);
    }
    // The first best class: argmax takes the first of equal maxima.
    let best = ops::argmax_axis(&scores, 1, false, s)?;
    let label = ops::take(&i64s(labels)?, &ops::astype(&best, ep_core::mlx::Dtype::I32, s)?, 0, s)?;
    let post = post_transform(node).map_err(|d| ep_core::Error::new(d.0))?;
    let z = match post {
        "LOGISTIC" => ops::sigmoid(&scores, s)?,
        "SOFTMAX" => ops::softmax(&scores, 1, s)?,
        "SOFTMAX_ZERO" => {
            // Scores within 1e-7 of zero stay (scaled by e^-max) and take no part in the sum.
            let max = ops::max_axes(&scores, &[1], true, s)?;
            let tiny = ops::less_equal(&ops::abs(&scores, s)?, &ops::scalar(1e-7, ep_core::mlx::Dtype::F32, s)?, s)?;
            let e = ops::exp(&ops::subtract(&scores, &max, s)?, s)?;
            let sum = ops::sum_axes(&ops::where_(&tiny, &zero, &e, s)?, &[1], true, s)?;
            let small = ops::multiply(&scores, &ops::exp(&ops::negative(&max, s)?, s)?, s)?;
            ops::divide(&ops::where_(&tiny, &small, &e, s)?, &sum, s)?
        }
        _ => scores,
    };
    Ok(vec![label, z])
}

ep_core::register_lowering!(
    LINEAR_CLASSIFIER = FnLowering {
        domain: ML,
        op: "LinearClassifier",
        opsets: 1..=i32::MAX,
        claim: claim_classifier,
        lower: lower_classifier,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, register_spec};

    register_spec!(super::LINEAR_REGRESSOR, || {
        (1..=4i64, 1..=6i64, 1..=3i64, any::<bool>(), seed())
            .prop_map(|(n, c, targets, intercepts, seed)| {
                let coefficients: Vec<f32> =
                    (0..c * targets).map(|i| ((i * 5 + seed as i64) % 9) as f32 * 0.25 - 1.0).collect();
                let case = Case::domain_op("ai.onnx.ml", "LinearRegressor", 1)
                    .input("x", DType::F32, &[n, c])
                    .attr("coefficients", Attr::Floats(coefficients))
                    .attr_int("targets", targets);
                let case = if intercepts {
                    case.attr("intercepts", Attr::Floats((0..targets).map(|t| t as f32 * 0.5 - 0.25).collect()))
                } else {
                    case
                };
                case.output("y", DType::F32, &[n, targets]).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::LINEAR_CLASSIFIER, || {
        (
            (1..=4i64, 1..=5i64, 1..=4i64, any::<bool>()),
            select(&["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"][..]),
            select(&[DType::F32, DType::I64][..]),
            seed(),
        )
            .prop_map(|((n, f, classes, two_labels), post, t, seed)| {
                let coefficients: Vec<f32> =
                    (0..classes * f).map(|i| ((i * 7 + seed as i64) % 11) as f32 * 0.2 - 1.0).collect();
                let intercepts: Vec<f32> = (0..classes).map(|c| c as f32 * 0.3 - 0.4).collect();
                let labels: Vec<i64> = if classes == 1 {
                    if two_labels { vec![5, 9] } else { vec![] }
                } else {
                    (0..classes).map(|c| c * 10 + 3).collect()
                };
                let z = if classes == 1 && two_labels { 2 } else { classes };
                let case = Case::domain_op("ai.onnx.ml", "LinearClassifier", 1)
                    .input("x", t, &[n, f])
                    .attr("coefficients", Attr::Floats(coefficients))
                    .attr("intercepts", Attr::Floats(intercepts))
                    .attr_str("post_transform", post);
                let case = if labels.is_empty() { case } else { case.attr_ints("classlabels_ints", &labels) };
                case.output("y", DType::I64, &[n]).output("z", DType::F32, &[n, z]).with_seed(seed)
            })
            .boxed()
    });
}
