//! TreeEnsemble (`ai.onnx.ml` 5): the same forests as TreeEnsembleRegressor in the newer
//! layout (branch nodes and leaves listed apart, each branch's children flagged as leaves or
//! not, thresholds, leaf weights and set members as tensors, `BRANCH_MEMBER` sets), over
//! float32 features. Read into the flattened table the regressor walks (`tree::walk`).
//!
//! ORT turns this layout into the older one before it runs: a small member set (fewer than 31
//! integers in [0, 30]) becomes a chain of equality tests, a larger or wider one a set tested
//! with the feature truncated toward zero (NaN goes true where missing values do), a tree
//! whose root names the same leaf on both sides is that leaf, and the aggregation, base-less
//! here, is the regressor's (a target no reached leaf weighs is 0).

use crate::tree::{self, Aggregate, Forest, Mode};
use crate::{ML, ints};
use ep_core::lowering::FnLowering;
use ep_core::mlx::Array;
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

/// The most values of one BRANCH_MEMBER set.
const MAX_MEMBERS: usize = 256;

/// A float32 tensor attribute's values (`None` when absent; an error for another type).
fn tensor_f32(node: &NodeInfo, name: &str) -> std::result::Result<Option<Vec<f32>>, String> {
    match node.attr(name) {
        None => Ok(None),
        Some(AttrValue::Tensor(t)) if t.elem_type == ElemType::F32 => {
            Ok(Some(t.bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect()))
        }
        Some(AttrValue::Tensor(t)) => Err(format!("{name} is {:?} (float32 is supported)", t.elem_type)),
        Some(other) => Err(format!("{name} is {other:?}, not a tensor")),
    }
}

fn forest(node: &NodeInfo) -> std::result::Result<Forest, String> {
    let aggregate = match node.attr_int("aggregate_function", 1).map_err(|e| e.to_string())? {
        0 => Aggregate::Average,
        1 => Aggregate::Sum,
        2 => Aggregate::Min,
        3 => Aggregate::Max,
        other => return Err(format!("aggregate_function={other} is unknown")),
    };
    let post = node.attr_int("post_transform", 0).map_err(|e| e.to_string())?;
    if post != 0 {
        return Err(format!("post_transform={post} is not supported (0, NONE, is)"));
    }
    let targets = match node.attr("n_targets") {
        Some(AttrValue::Int(t)) if (1..=4096).contains(t) => *t as usize,
        other => return Err(format!("n_targets={other:?} (a positive count is required)")),
    };
    let modes: Vec<u8> = match node.attr("nodes_modes") {
        Some(AttrValue::Tensor(t)) if t.elem_type == ElemType::U8 => t.bytes.clone(),
        other => return Err(format!("nodes_modes={other:?} is not a uint8 tensor")),
    };
    let splits = tensor_f32(node, "nodes_splits")?.ok_or("nodes_splits is missing")?;
    let weights = tensor_f32(node, "leaf_weights")?.ok_or("leaf_weights is missing")?;
    let member_values = tensor_f32(node, "membership_values")?.unwrap_or_default();
    let (features, trues, falses) =
        (ints(node, "nodes_featureids"), ints(node, "nodes_truenodeids"), ints(node, "nodes_falsenodeids"));
    let (true_leaf, false_leaf) = (ints(node, "nodes_trueleafs"), ints(node, "nodes_falseleafs"));
    let missing = ints(node, "nodes_missing_value_tracks_true");
    let (leaf_targets, roots) = (ints(node, "leaf_targetids"), ints(node, "tree_roots"));
    let n = modes.len();
    let lens = [splits.len(), features.len(), trues.len(), falses.len(), true_leaf.len(), false_leaf.len()];
    if n == 0 || lens.iter().any(|&l| l != n) || !(missing.is_empty() || missing.len() == n) {
        return Err(format!("the nodes_* attributes have lengths {n} and {lens:?}"));
    }
    let leaves = leaf_targets.len();
    if weights.len() != leaves || leaves == 0 || roots.is_empty() {
        return Err(format!("{leaves} leaf targets, {} leaf weights, {} roots", weights.len(), roots.len()));
    }
    // Table: the branch nodes, then the leaves.
    let total = n + leaves;
    let mut f = Forest {
        feature: vec![0; total],
        threshold: vec![0.0; total],
        mode: vec![Mode::Leaf; total],
        yes: (0..total as i32).collect(),
        no: (0..total as i32).collect(),
        missing_true: vec![false; total],
        roots: Vec::with_capacity(roots.len()),
        depth: 0,
        targets,
        weights: vec![0.0; total * targets],
        has: vec![false; total * targets],
        aggregate,
        base: Vec::new(),
        members: vec![Vec::new(); total],
        member_trunc: vec![false; total],
    };
    let child = |id: i64, leaf: i64| -> std::result::Result<i32, String> {
        let (at, count) = if leaf != 0 { (n, leaves) } else { (0, n) };
        usize::try_from(id)
            .ok()
            .filter(|&i| i < count)
            .map(|i| (at + i) as i32)
            .ok_or_else(|| format!("child {id} of {count}"))
    };
    // The member sets, one per BRANCH_MEMBER node in order, each ended by a NaN.
    let mut sets = member_values.split(|v| v.is_nan());
    for i in 0..n {
        f.mode[i] = match modes[i] {
            0 => Mode::Leq,
            1 => Mode::Lt,
            2 => Mode::Gte,
            3 => Mode::Gt,
            4 => Mode::Eq,
            5 => Mode::Neq,
            6 => {
                let set = sets.next().filter(|s| !s.is_empty()).ok_or("a BRANCH_MEMBER node has no members")?;
                // (Each step compares every row's feature with a whole set: wide sets stay on
                // ORT's CPU EP.)
                if set.len() > MAX_MEMBERS {
                    return Err(format!("a BRANCH_MEMBER set of {} values (at most {MAX_MEMBERS})", set.len()));
                }
                // ORT tests a small set of integers in [0, 30] for equality; a larger or wider
                // one, which must hold int32 integers, with the feature truncated to an integer.
                let big = set.len() >= 31 || set.iter().any(|&v| !(0.0..=30.0).contains(&v));
                let int32 = |v: f32| v.fract() == 0.0 && v > i32::MIN as f32 && v <= i32::MAX as f32;
                if big && !set.iter().all(|&v| int32(v)) {
                    return Err("a large member set holds values that are not int32 integers".into());
                }
                f.members[i] = set.to_vec();
                f.member_trunc[i] = big;
                Mode::Member
            }
            other => return Err(format!("node mode {other} is not supported")),
        };
        f.feature[i] = i32::try_from(features[i]).ok().filter(|&v| v >= 0).ok_or("a negative feature id")?;
        f.threshold[i] = splits[i];
        f.yes[i] = child(trues[i], true_leaf[i])?;
        f.no[i] = child(falses[i], false_leaf[i])?;
        f.missing_true[i] = missing.get(i) == Some(&1);
    }
    for &r in roots {
        let r = usize::try_from(r).ok().filter(|&r| r < n).ok_or_else(|| format!("tree root {r} of {n} nodes"))?;
        // A root naming one leaf on both sides is that leaf (a tree of one leaf).
        let lone = falses[r] == trues[r] && false_leaf[r] != 0 && true_leaf[r] != 0;
        f.roots.push(if lone { f.yes[r] } else { r as i32 });
    }
    for (k, (&t, &w)) in leaf_targets.iter().zip(&weights).enumerate() {
        let t =
            usize::try_from(t).ok().filter(|&t| t < targets).ok_or_else(|| format!("leaf target {t} of {targets}"))?;
        // One target: the leaf's weight whatever its id; more: its target's.
        let slot = (n + k) * targets + if targets == 1 { 0 } else { t };
        (f.weights[slot], f.has[slot]) = (w, true);
    }
    f.depth = tree::depth(&f)?;
    Ok(f)
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    tree::claim_with(node, forest)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    tree::lower_with(ctx, node, forest)
}

ep_core::register_lowering!(
    TREE_ENSEMBLE = FnLowering {
        domain: ML,
        op: "TreeEnsemble",
        opsets: 5..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);
