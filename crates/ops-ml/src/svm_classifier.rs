//! SVMClassifier over `[N, F]` features (float32, or int32/int64 widened to float32, as ORT's
//! CPU EP reads them) with int64 labels, `post_transform` NONE and no probability estimates
//! (`prob_a`/`prob_b`), as ORT's CPU EP computes it:
//! - without support vectors (liblinear's form): a score per class, `x . coefficients[c] +
//!   rho[0]`; the label is the class of the highest score, but for two classes the second
//!   class wins when the highest score is at least 0.5 with every coefficient non-negative,
//!   or positive with some negative;
//! - with support vectors (libsvm's form, one against one): for each pair of classes `i < j`,
//!   `sum over i's vectors of coefficients[j - 1][v] K(x, sv_v) + sum over j's vectors of
//!   coefficients[i][v] K(x, sv_v) + rho[pair]`, a vote for `i` where that is positive and for
//!   `j` elsewhere; the label is the class with the most votes (the first of a tie). The
//!   scores are the pairs' (for two classes `[-score, score]`).
//!
//! Kernels as SVMRegressor's ([`crate::svm::KernelOf`]).

use crate::svm::{KernelOf, scalar};
use crate::{ML, floats, ints};
use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result};

struct Model<'a> {
    kernel: KernelOf,
    labels: &'a [i64],
    /// Support vectors per class; empty in the linear form.
    per_class: &'a [i64],
    support: &'a [f32],
    coefficients: &'a [f32],
    rho: &'a [f32],
}

impl Model<'_> {
    fn vectors(&self) -> usize {
        self.per_class.iter().map(|&v| v as usize).sum()
    }

    fn pairs(&self) -> usize {
        self.labels.len() * (self.labels.len() - 1) / 2
    }

    /// The features each input row must have.
    fn features(&self) -> usize {
        match self.vectors() {
            0 => self.coefficients.len() / self.labels.len(),
            v => self.support.len() / v,
        }
    }
}

fn model(node: &NodeInfo) -> std::result::Result<Model<'_>, String> {
    match node.attr("post_transform") {
        None => {}
        Some(AttrValue::String(t)) if t == "NONE" => {}
        Some(other) => return Err(format!("post_transform={other:?} is not supported (NONE is)")),
    }
    if !floats(node, "prob_a").is_empty() || !floats(node, "prob_b").is_empty() {
        return Err("probability estimates (prob_a, prob_b) are left to ORT".into());
    }
    if node.attr("classlabels_strings").is_some() {
        return Err("string class labels are left to ORT".into());
    }
    let labels = ints(node, "classlabels_ints");
    if labels.is_empty() {
        return Err("no classlabels_ints".into());
    }
    if labels.len() > MAX_CLASSES {
        // (The votes are counted through [pairs, classes] tables, cubic in the classes.)
        return Err(format!("{} classes; the MLX EP takes at most {MAX_CLASSES}", labels.len()));
    }
    let per_class = ints(node, "vectors_per_class");
    let (support, coefficients, rho) =
        (floats(node, "support_vectors"), floats(node, "coefficients"), floats(node, "rho"));
    let m = Model { kernel: KernelOf::of(node)?, labels, per_class, support, coefficients, rho };
    let classes = labels.len();
    if per_class.iter().any(|&v| v < 0) {
        return Err(format!("vectors_per_class {per_class:?} has a negative count"));
    }
    let vectors = m.vectors();
    if vectors == 0 {
        if coefficients.is_empty() || coefficients.len() % classes != 0 || rho.is_empty() {
            return Err(format!(
                "{} coefficients and {} rho value(s) for {classes} classes of the linear form",
                coefficients.len(),
                rho.len()
            ));
        }
    } else {
        if per_class.len() != classes || classes < 2 {
            return Err(format!(
                "vectors_per_class has {} entries for {classes} classes (two or more)",
                per_class.len()
            ));
        }
        if support.is_empty() || support.len() % vectors != 0 {
            return Err(format!("{} support vector values for {vectors} vectors", support.len()));
        }
        if coefficients.len() != (classes - 1) * vectors || rho.len() < m.pairs() {
            return Err(format!(
                "{} coefficients and {} rho values for {classes} classes and {vectors} vectors ({} and {} needed)",
                coefficients.len(),
                rho.len(),
                (classes - 1) * vectors,
                m.pairs()
            ));
        }
    }
    Ok(m)
}

/// The most classes a model may have.
const MAX_CLASSES: usize = 256;

const INPUTS: &[ElemType] = &[ElemType::F32, ElemType::I32, ElemType::I64];

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, INPUTS)?;
    require_input_rank(node, 0, 2..=2)?;
    let m = model(node).map_err(Decline)?;
    if let Some(Some(f)) = node.input(0).and_then(|v| v.shape.as_ref()).and_then(|s| s.get(1).copied())
        && f as usize != m.features()
    {
        return Err(Decline(format!("the input has {f} features, the model {}", m.features())));
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let m = model(node).map_err(Error::new)?;
    let s = ctx.stream();
    let x = ops::astype(ctx.input(0)?, Dtype::F32, s)?;
    let (rows, features) = (x.shape()[0], x.shape()[1]);
    if features as usize != m.features() {
        return Err(Error::new(format!("the input has {features} features, the model {}", m.features())));
    }
    let classes = m.labels.len() as i64;
    let labels = Array::from_slice(m.labels, &[classes])?;
    let vectors = m.vectors();
    if rows == 0 {
        // (MLX's argmax refuses an empty array.)
        let width = if vectors == 0 {
            classes
        } else if classes == 2 {
            2
        } else {
            m.pairs() as i64
        };
        return Ok(vec![
            ops::full(&[0], &ops::scalar(0.0, Dtype::I64, s)?, Dtype::I64, s)?,
            ops::full(&[0, width], &scalar(0.0, s)?, Dtype::F32, s)?,
        ]);
    }
    if vectors == 0 {
        let coef = Array::from_slice(m.coefficients, &[classes, features])?;
        let scores =
            ops::add(&ops::matmul(&x, &ops::transpose_axes(&coef, &[1, 0], s)?, s)?, &scalar(m.rho[0], s)?, s)?;
        let best = ops::argmax_axis(&scores, 1, false, s)?;
        let mut label = ops::take(&labels, &best, 0, s)?;
        if classes == 2 {
            // The second class where the highest score passes the form's threshold.
            let positive = m.coefficients.iter().all(|&c| c >= 0.0);
            let top = ops::max_axes(&scores, &[1], false, s)?;
            let second = if positive {
                ops::greater_equal(&top, &scalar(0.5, s)?, s)?
            } else {
                ops::greater(&top, &scalar(0.0, s)?, s)?
            };
            let second_label = ops::take(&labels, &Array::from_slice(&[1i32], &[1])?, 0, s)?;
            label = ops::where_(&second, &second_label, &label, s)?;
        }
        return Ok(vec![label, scores]);
    }
    let sv = Array::from_slice(m.support, &[vectors as i64, features])?;
    // [N, vectors]
    let k = m.kernel.matrix(&x, &sv, s)?;
    // Each pair's vectors (`[pairs, most]` indices into the kernels, padded with a column of
    // zeros so no product with a vector of another pair is formed: an infinite kernel value
    // times a zero weight would be NaN) and their weights, and which class each pair's win and
    // loss vote for (`[pairs, classes]`).
    let pairs = m.pairs();
    let starts: Vec<usize> =
        m.per_class.iter().scan(0usize, |at, &n| Some(std::mem::replace(at, *at + n as usize))).collect();
    let mut members: Vec<Vec<(i32, f32)>> = Vec::with_capacity(pairs);
    let c = classes as usize;
    let (mut wins, mut losses) = (vec![0.0f32; pairs * c], vec![0.0f32; pairs * c]);
    for i in 0..c {
        for j in i + 1..c {
            let mut own: Vec<(i32, f32)> = (starts[i]..starts[i] + m.per_class[i] as usize)
                .map(|v| (v as i32, m.coefficients[(j - 1) * vectors + v]))
                .collect();
            own.extend(
                (starts[j]..starts[j] + m.per_class[j] as usize).map(|v| (v as i32, m.coefficients[i * vectors + v])),
            );
            wins[members.len() * c + i] = 1.0;
            losses[members.len() * c + j] = 1.0;
            members.push(own);
        }
    }
    let most = members.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let (mut index, mut weight) = (vec![vectors as i32; pairs * most], vec![0.0f32; pairs * most]);
    for (p, own) in members.iter().enumerate() {
        for (slot, &(v, w)) in own.iter().enumerate() {
            index[p * most + slot] = v;
            weight[p * most + slot] = w;
        }
    }
    let padded = ops::concatenate(&[k, ops::full(&[rows, 1], &scalar(0.0, s)?, Dtype::F32, s)?], 1, s)?;
    let gathered = ops::take(&padded, &Array::from_slice(&index, &[(pairs * most) as i64])?, 1, s)?;
    let gathered = ops::reshape(&gathered, &[rows, pairs as i64, most as i64], s)?;
    let weight = Array::from_slice(&weight, &[pairs as i64, most as i64])?;
    let sums = ops::sum_axes(&ops::multiply(&gathered, &weight, s)?, &[2], false, s)?;
    let rho = Array::from_slice(&m.rho[..pairs], &[pairs as i64])?;
    let scores = ops::add(&sums, &rho, s)?;
    let won = ops::astype(&ops::greater(&scores, &scalar(0.0, s)?, s)?, Dtype::F32, s)?;
    let lost = ops::subtract(&scalar(1.0, s)?, &won, s)?;
    let votes = ops::add(
        &ops::matmul(&won, &Array::from_slice(&wins, &[pairs as i64, classes])?, s)?,
        &ops::matmul(&lost, &Array::from_slice(&losses, &[pairs as i64, classes])?, s)?,
        s,
    )?;
    // The first class of a tie: votes (whole numbers) ranked with a smaller index ahead.
    let order: Vec<f32> = (0..classes).map(|c| (classes - 1 - c) as f32).collect();
    let ranked = ops::add(
        &ops::multiply(&votes, &scalar((classes + 1) as f32, s)?, s)?,
        &Array::from_slice(&order, &[classes])?,
        s,
    )?;
    let label = ops::take(&labels, &ops::argmax_axis(&ranked, 1, false, s)?, 0, s)?;
    let scores = if classes == 2 { ops::concatenate(&[ops::negative(&scores, s)?, scores], 1, s)? } else { scores };
    debug_assert_eq!(scores.shape()[0], rows);
    Ok(vec![label, scores])
}

ep_core::register_lowering!(
    SVM_CLASSIFIER = FnLowering {
        domain: ML,
        op: "SVMClassifier",
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

    register_spec!(super::SVM_CLASSIFIER, || {
        (
            (1..=6i64, 1..=5i64, 1..=4usize),
            select(&["LINEAR", "POLY", "RBF", "SIGMOID"][..]),
            (any::<bool>(), 0..4u8, 0..3u8),
            seed(),
        )
            .prop_map(|((n, features, classes), kernel, (linear, degree, input), seed)| {
                let mut r = seed.wrapping_add(0x2545_f491_4f6c_dd1d);
                let mut next = move || {
                    r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    r >> 33
                };
                let mut value = || ((next() % 17) as f32) * 0.125 - 1.0;
                // One class only in the linear form (one against one needs two).
                let linear = linear || classes == 1;
                let per_class: Vec<i64> =
                    (0..classes).map(|c| if linear { 0 } else { ((seed >> (2 * c)) % 4) as i64 }).collect();
                let per_class = if !linear && per_class.iter().all(|&v| v == 0) { vec![1; classes] } else { per_class };
                let vectors: i64 = per_class.iter().sum();
                let pairs = classes * (classes - 1) / 2;
                let coefficients: Vec<f32> = if linear {
                    (0..classes as i64 * features).map(|_| value()).collect()
                } else {
                    (0..(classes as i64 - 1) * vectors).map(|_| value()).collect()
                };
                let support: Vec<f32> = (0..vectors * features).map(|_| value()).collect();
                let rho: Vec<f32> = (0..if linear { 1 } else { pairs }).map(|_| value()).collect();
                let labels: Vec<i64> = (0..classes as i64).map(|c| 7 * c - 3 + (seed % 5) as i64).collect();
                let scores = if linear {
                    classes
                } else if classes == 2 {
                    2
                } else {
                    pairs
                };
                let dtype = [DType::F32, DType::I32, DType::I64][input as usize];
                let mut case = Case::domain_op("ai.onnx.ml", "SVMClassifier", 1)
                    .input("x", dtype, &[n, features])
                    .attr_str("kernel_type", kernel)
                    .attr("kernel_params", Attr::Floats(vec![0.5, 0.25, f32::from(degree) + 1.0]))
                    .attr("coefficients", Attr::Floats(coefficients))
                    .attr("rho", Attr::Floats(rho))
                    .attr("classlabels_ints", Attr::Ints(labels));
                if !linear {
                    case = case
                        .attr("vectors_per_class", Attr::Ints(per_class))
                        .attr("support_vectors", Attr::Floats(support));
                }
                case.output("y", DType::I64, &[n]).output("z", DType::F32, &[n, scores as i64]).with_seed(seed)
            })
            .boxed()
    });
}
