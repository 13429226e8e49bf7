//! TreeEnsembleClassifier with int64 labels and three classes or more (scikit-learn's forests
//! and gradient-boosted multi-class exports): the trees walked as in `tree.rs`, each class's
//! leaf weights summed over the trees, as ORT's CPU EP computes them:
//! - a class some reached leaf weighs, or any class when `base_values` are given, has a score
//!   (the sum, plus its base value); any other class scores 0;
//! - the label is that of the first class with the highest score among those that have one;
//! - `Z` is the scores after `post_transform`: NONE, SOFTMAX (over every class), LOGISTIC.
//!
//! Two classes (ORT's binary rules, which derive the second score from the first), string
//! labels, and the other transforms stay on ORT's CPU EP. (The leaves' weights are gathered as
//! `[rows, trees, classes]`: a large multi-class boosted forest over many rows takes memory in
//! proportion.)

use crate::tree::{self, Aggregate, Forest};
use crate::{ML, floats, ints};
use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transform {
    None,
    Softmax,
    Logistic,
}

struct Classifier {
    forest: Forest,
    labels: Vec<i64>,
    transform: Transform,
}

fn classifier(node: &NodeInfo) -> std::result::Result<Classifier, String> {
    if let Some(AttrValue::Strings(s)) = node.attr("classlabels_strings")
        && !s.is_empty()
    {
        return Err("string class labels stay on the CPU".into());
    }
    for attr in
        ["nodes_values_as_tensor", "class_weights_as_tensor", "base_values_as_tensor", "nodes_hitrates_as_tensor"]
    {
        if node.attr(attr).is_some() {
            return Err(format!("{attr} (double precision) is not supported"));
        }
    }
    let labels = ints(node, "classlabels_int64s").to_vec();
    if labels.len() < 3 || labels.len() > 4096 {
        return Err(format!("{} classes (3 to 4096 are supported; two follow ORT's binary rules)", labels.len()));
    }
    let transform = match node.attr("post_transform") {
        None => Transform::None,
        Some(AttrValue::String(t)) => match t.as_str() {
            "NONE" => Transform::None,
            "SOFTMAX" => Transform::Softmax,
            "LOGISTIC" => Transform::Logistic,
            other => return Err(format!("post_transform={other} is not supported (NONE, SOFTMAX, LOGISTIC are)")),
        },
        Some(other) => return Err(format!("post_transform={other:?} is not a string")),
    };
    let bases = floats(node, "base_values").len();
    if bases != 0 && bases != labels.len() {
        return Err(format!("{bases} base values for {} classes", labels.len()));
    }
    let forest = tree::build(node, labels.len(), Aggregate::Sum, "class")?;
    Ok(Classifier { forest, labels, transform })
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_rank(node, 0, 2..=2)?;
    classifier(node).map(|_| ()).map_err(Decline)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let c = classifier(node).map_err(ep_core::Error::new)?;
    let f = &c.forest;
    let rows = ctx.input(0)?.shape()[0];
    if rows == 0 {
        // (MLX does not reduce an empty array to its argmax.)
        let s = ctx.stream();
        let empty = |shape: &[i64], t: Dtype| ops::full(shape, &ops::scalar(0.0, t, s)?, t, s);
        return Ok(vec![empty(&[0], Dtype::I64)?, empty(&[0, f.targets as i64], Dtype::F32)?]);
    }
    let at = tree::reach(ctx, f)?;
    let s = ctx.stream();
    let (n, classes) = (f.mode.len() as i64, f.targets as i64);
    // [rows, trees, classes] -> [rows, classes]
    let score = ops::sum_axes(&ops::take(&Array::from_slice(&f.weights, &[n, classes])?, &at, 0, s)?, &[1], false, s)?;
    let has = ops::any_axes(&ops::take(&Array::from_slice(&f.has, &[n, classes])?, &at, 0, s)?, &[1], false, s)?;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let (score, has) = if f.base.is_empty() {
        (ops::where_(&has, &score, &zero, s)?, has)
    } else {
        // Base values give every class a score.
        let all = ops::full(&has.shape(), &ops::scalar(1.0, Dtype::Bool, s)?, Dtype::Bool, s)?;
        (ops::add(&score, &Array::from_slice(&f.base, &[classes])?, s)?, all)
    };
    // The first highest score among the classes that have one (a row where none has is
    // given the first class). Where the highest is -inf, the first class that has a score
    // (an unscored class, filled with -inf, must not win the tie).
    let lowest = ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?;
    let ranked = ops::where_(&has, &score, &lowest, s)?;
    let top = ops::max_axes(&ranked, &[1], false, s)?;
    let first_scored = ops::argmax_axis(&ops::astype(&has, Dtype::U8, s)?, 1, false, s)?;
    let best = ops::where_(&ops::equal(&top, &lowest, s)?, &first_scored, &ops::argmax_axis(&ranked, 1, false, s)?, s)?;
    let label = ops::take(&Array::from_slice(&c.labels, &[classes])?, &best, 0, s)?;
    let z = match c.transform {
        Transform::None => score,
        Transform::Softmax => ops::softmax(&score, 1, s)?,
        Transform::Logistic => ops::sigmoid(&score, s)?,
    };
    Ok(vec![label, z])
}

ep_core::register_lowering!(
    TREE_ENSEMBLE_CLASSIFIER = FnLowering {
        domain: ML,
        op: "TreeEnsembleClassifier",
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
    use conformance_spec::{Attr, Case, DType, register_spec};

    register_spec!(super::TREE_ENSEMBLE_CLASSIFIER, || {
        (
            (1..=6i64, 1..=5i64, 1..=4i64, 0..=4u32, 3..=5i64),
            select(&["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "mixed"][..]),
            (select(&["NONE", "SOFTMAX", "LOGISTIC"][..]), any::<bool>(), any::<bool>()),
            seed(),
        )
            .prop_map(|((n, features, trees, depth, classes), mode, (transform, base, missing), seed)| {
                let case =
                    Case::domain_op("ai.onnx.ml", "TreeEnsembleClassifier", 1).input("x", DType::F32, &[n, features]);
                let case = crate::tree::spec::forest_with(
                    case, seed, trees, depth, features, classes, mode, missing, "class", true,
                );
                let labels: Vec<i64> = (0..classes).map(|j| 10 * j + 3).collect();
                let case = case.attr_ints("classlabels_int64s", &labels).attr_str("post_transform", transform);
                let case = if base {
                    case.attr("base_values", Attr::Floats((0..classes).map(|j| j as f32 * 0.25 - 0.5).collect()))
                } else {
                    case
                };
                case.output("y", DType::I64, &[n]).output("z", DType::F32, &[n, classes]).with_seed(seed)
            })
            .boxed()
    });
}
