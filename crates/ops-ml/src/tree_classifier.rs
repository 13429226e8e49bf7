//! TreeEnsembleClassifier with int64 labels and three classes or more (scikit-learn's forests
//! and gradient-boosted multi-class exports): the trees walked as in `tree.rs`, each class's
//! leaf weights summed over the trees, as ORT's CPU EP computes them:
//! - a class some reached leaf weighs, or any class when `base_values` are given, has a score
//!   (the sum, plus its base value); any other class scores 0;
//! - the label is that of the first class with the highest score among those that have one;
//! - `Z` is the scores after `post_transform`: NONE, SOFTMAX (over every class), LOGISTIC.
//!
//! Two classes follow ORT's binary rules where every leaf weighs one and the same class (the
//! binary exports of gradient-boosting libraries and scikit-learn): that class's sum `v`
//! (plus the base value where it is class 0 and one is given: ORT ignores it for class 1)
//! decides the label, `v > 0.5` with no negative weight and `v > 0` otherwise; the scores
//! are `[σ(-v), σ(v)]` under LOGISTIC, else `[1 - v, v]` with no negative weight and `[-v, v]`
//! with one, for class 0, and the transform of `[0, v]` for class 1 (a row no leaf weighed takes class
//! 0's form with `v = 0`). Leaves weighing both classes (ORT then labels rows 0 and 1, not
//! with the class labels), two base values, string labels, and the other transforms stay on
//! ORT's CPU EP. (The leaves' weights are gathered as
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
    /// Two classes: the class every leaf weighs, and whether no weight is negative.
    binary: Option<(usize, bool)>,
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
    if labels.len() < 2 || labels.len() > 4096 {
        return Err(format!("{} classes (2 to 4096 are supported)", labels.len()));
    }
    let binary = if labels.len() == 2 {
        let ids = ints(node, "class_ids");
        let class = match ids.first() {
            Some(&c @ (0 | 1)) if ids.iter().all(|&i| i == c) => c as usize,
            _ => return Err("two classes with leaves weighing both (ORT labels those rows 0 and 1)".into()),
        };
        if floats(node, "base_values").len() > 1 {
            return Err("two classes with two base values".into());
        }
        Some((class, !floats(node, "class_weights").iter().any(|&w| w < 0.0)))
    } else {
        None
    };
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
    if bases != 0 && bases != labels.len() && binary.is_none() {
        return Err(format!("{bases} base values for {} classes", labels.len()));
    }
    let forest = tree::build(node, labels.len(), Aggregate::Sum, "class")?;
    Ok(Classifier { forest, labels, transform, binary })
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
    if let Some((class, positive)) = c.binary {
        return binary(&score, &has, class, positive, &c, s);
    }
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

/// ORT's two-class rules (see the module's documentation) over the class sums `score` and
/// `has` (`[rows, 2]`).
fn binary(
    score: &Array,
    has: &Array,
    class: usize,
    positive: bool,
    c: &Classifier,
    s: &ep_core::mlx::Stream,
) -> Result<Vec<Array>> {
    let rows = score.shape()[0];
    let column = |a: &Array| ops::slice(a, &[0, class as i64], &[rows, class as i64 + 1], s);
    let (sum, reached) = (column(score)?, column(has)?);
    let f = |v: f64| ops::scalar(v, Dtype::F32, s);
    // A base value counts for class 0 only (ORT ignores it for class 1).
    let sum = match (class, c.forest.base.first()) {
        (0, Some(&b)) => ops::add(&sum, &f(f64::from(b))?, s)?,
        _ => sum,
    };
    let v = ops::where_(&reached, &sum, &f(0.0)?, s)?;
    let above = ops::greater(&v, &f(if positive { 0.5 } else { 0.0 })?, s)?;
    let labels = |k: usize| Array::from_slice(&[c.labels[k]], &[1, 1]);
    let label = ops::reshape(&ops::where_(&above, &labels(1)?, &labels(0)?, s)?, &[rows], s)?;
    let pair = |a: &Array, b: &Array| ops::concatenate(&[a.clone(), b.clone()], 1, s);
    let neg = ops::negative(&v, s)?;
    // One value (class 0's form): `[σ(-v), σ(v)]` under LOGISTIC; otherwise no transform.
    let one = if c.transform == Transform::Logistic {
        pair(&ops::sigmoid(&neg, s)?, &ops::sigmoid(&v, s)?)?
    } else if positive {
        pair(&ops::subtract(&f(1.0)?, &v, s)?, &v)?
    } else {
        pair(&neg, &v)?
    };
    let z = if class == 0 {
        one
    } else {
        let two = match c.transform {
            Transform::None => pair(&ops::full(&v.shape(), &f(0.0)?, Dtype::F32, s)?, &v)?,
            Transform::Logistic => pair(&ops::full(&v.shape(), &f(0.5)?, Dtype::F32, s)?, &ops::sigmoid(&v, s)?)?,
            Transform::Softmax => pair(&ops::sigmoid(&neg, s)?, &ops::sigmoid(&v, s)?)?,
        };
        ops::where_(&reached, &two, &one, s)?
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
            (1..=6i64, 1..=5i64, 1..=4i64, 0..=4u32, 2..=5i64),
            select(&["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "mixed"][..]),
            (select(&["NONE", "SOFTMAX", "LOGISTIC"][..]), any::<bool>(), any::<bool>()),
            (0..=1i64, any::<bool>()),
            seed(),
        )
            .prop_map(
                |((n, features, trees, depth, classes), mode, (transform, base, missing), (class, positive), seed)| {
                    let case = Case::domain_op("ai.onnx.ml", "TreeEnsembleClassifier", 1).input(
                        "x",
                        DType::F32,
                        &[n, features],
                    );
                    // Two classes: every leaf weighs one class (`class`), as binary exports do.
                    let (weighed, first, positive) =
                        if classes == 2 { (1, class, positive) } else { (classes, 0, false) };
                    let case = crate::tree::spec::forest_with(
                        case,
                        seed,
                        trees,
                        depth,
                        features,
                        weighed,
                        mode,
                        missing,
                        "class",
                        true,
                        (first, positive),
                    );
                    let labels: Vec<i64> = (0..classes).map(|j| 10 * j + 3).collect();
                    let case = case.attr_ints("classlabels_int64s", &labels).attr_str("post_transform", transform);
                    let bases = if classes == 2 { 1 } else { classes };
                    let case = if base {
                        case.attr("base_values", Attr::Floats((0..bases).map(|j| j as f32 * 0.25 - 0.5).collect()))
                    } else {
                        case
                    };
                    case.output("y", DType::I64, &[n]).output("z", DType::F32, &[n, classes]).with_seed(seed)
                },
            )
            .boxed()
    });
}
