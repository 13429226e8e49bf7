//! TreeEnsembleRegressor: a forest of decision trees (scikit-learn's and the gradient-boosting
//! libraries' exports) over `[N, F]` float32 features, `n_targets` float32 outputs per row, as
//! ORT's CPU EP computes them.
//!
//! Every row walks every tree at once: the current node of each (row, tree) pair is an index
//! into the forest's flattened node table, and one step gathers each node's feature, threshold
//! and branch mode, compares, and moves to the true or false child (a leaf points at itself).
//! After as many steps as the deepest tree is deep, every pair sits at its leaf, whose weights
//! are gathered and aggregated over the trees (SUM, AVERAGE, MIN, MAX) with the base values.
//!
//! ORT's semantics followed: node `(tree, id)` pairs are unique, children are found in their
//! own tree, each tree's root is the first node listed for it; a comparison is `x <op>
//! threshold` in float32, or true for a NaN feature where `nodes_missing_value_tracks_true` is
//! set. With one target ORT takes each leaf's first weight whatever its target id and adds the
//! one base value; with more it adds every weight of a leaf to its target, and a target no
//! reached leaf of a row weighs is 0 for that row, without its base value (as ORT 1.31 computes
//! it, whatever the aggregate). Only `post_transform` NONE is claimed
//! (with one target ORT ignores the other transforms but PROBIT, a quirk not to rely on).

use crate::{ML, floats, ints};
use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};
use std::collections::HashMap;

/// A reduction over axes (MLX's min or max).
type Reduce = fn(&Array, &[i32], bool, &Stream) -> ep_core::mlx::Result<Array>;

/// The deepest tree walked (deeper forests are left to ORT's CPU EP: each level is a step of
/// the graph).
pub(crate) const MAX_DEPTH: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Leaf,
    /// The feature is one of the node's set (`Forest::members`).
    Member,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "BRANCH_LEQ" => Mode::Leq,
            "BRANCH_LT" => Mode::Lt,
            "BRANCH_GTE" => Mode::Gte,
            "BRANCH_GT" => Mode::Gt,
            "BRANCH_EQ" => Mode::Eq,
            "BRANCH_NEQ" => Mode::Neq,
            "LEAF" => Mode::Leaf,
            _ => return None,
        })
    }

    const BRANCHES: [Mode; 7] = [Mode::Leq, Mode::Lt, Mode::Gte, Mode::Gt, Mode::Eq, Mode::Neq, Mode::Member];

    fn code(self) -> i32 {
        self as i32
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Aggregate {
    Sum,
    Average,
    Min,
    Max,
}

/// The forest, flattened: node `g` of the table (in the order listed).
pub(crate) struct Forest {
    pub(crate) feature: Vec<i32>,
    pub(crate) threshold: Vec<f32>,
    pub(crate) mode: Vec<Mode>,
    pub(crate) yes: Vec<i32>,
    pub(crate) no: Vec<i32>,
    pub(crate) missing_true: Vec<bool>,
    pub(crate) roots: Vec<i32>,
    pub(crate) depth: usize,
    pub(crate) targets: usize,
    /// `[nodes, targets]`: each leaf's weight per target (summed, or its min / max).
    pub(crate) weights: Vec<f32>,
    /// `[nodes, targets]`: whether the leaf has a weight for the target.
    pub(crate) has: Vec<bool>,
    pub(crate) aggregate: Aggregate,
    /// Added after aggregation, per target (empty: none).
    pub(crate) base: Vec<f32>,
    /// Per node, its set for [`Mode::Member`] (empty for other nodes).
    pub(crate) members: Vec<Vec<f32>>,
    /// Per node, whether its set is tested with the feature truncated to an integer (ORT's
    /// large sets).
    pub(crate) member_trunc: Vec<bool>,
}

fn strings<'a>(node: &'a NodeInfo, name: &str) -> &'a [String] {
    match node.attr(name) {
        Some(AttrValue::Strings(v)) => v,
        _ => &[],
    }
}

fn forest(node: &NodeInfo) -> std::result::Result<Forest, String> {
    for attr in
        ["nodes_values_as_tensor", "target_weights_as_tensor", "base_values_as_tensor", "nodes_hitrates_as_tensor"]
    {
        if node.attr(attr).is_some() {
            return Err(format!("{attr} (double precision) is not supported"));
        }
    }
    match node.attr("post_transform") {
        None => {}
        Some(AttrValue::String(t)) if t == "NONE" => {}
        Some(other) => return Err(format!("post_transform={other:?} is not supported (NONE is)")),
    }
    let aggregate = match node.attr("aggregate_function") {
        None => Aggregate::Sum,
        Some(AttrValue::String(a)) => match a.as_str() {
            "SUM" => Aggregate::Sum,
            "AVERAGE" => Aggregate::Average,
            "MIN" => Aggregate::Min,
            "MAX" => Aggregate::Max,
            other => return Err(format!("aggregate_function={other} is unknown")),
        },
        Some(other) => return Err(format!("aggregate_function={other:?} is not a string")),
    };
    // (ORT requires n_targets, positive; its base values number 0 or n_targets.)
    let targets = match node.attr("n_targets") {
        Some(AttrValue::Int(t)) if (1..=4096).contains(t) => *t,
        other => return Err(format!("n_targets={other:?} (a positive count is required)")),
    };
    let bases = floats(node, "base_values").len();
    if bases != 0 && bases as i64 != targets {
        return Err(format!("{bases} base values for {targets} target(s)"));
    }
    build(node, targets as usize, aggregate, "target")
}

/// The forest of a node's `nodes_*` attributes, its leaves weighted by the `{prefix}_treeids`,
/// `_nodeids`, `_ids` and `_weights` attributes (`target` for the regressor, `class` for the
/// classifier) for `targets` outputs.
pub(crate) fn build(
    node: &NodeInfo,
    targets: usize,
    aggregate: Aggregate,
    prefix: &str,
) -> std::result::Result<Forest, String> {
    let (tree_ids, node_ids, features) =
        (ints(node, "nodes_treeids"), ints(node, "nodes_nodeids"), ints(node, "nodes_featureids"));
    let (values, modes) = (floats(node, "nodes_values"), strings(node, "nodes_modes"));
    let (trues, falses) = (ints(node, "nodes_truenodeids"), ints(node, "nodes_falsenodeids"));
    let missing = ints(node, "nodes_missing_value_tracks_true");
    let n = tree_ids.len();
    let lens = [node_ids.len(), features.len(), values.len(), modes.len(), trues.len(), falses.len()];
    if n == 0 || lens.iter().any(|&l| l != n) || !(missing.is_empty() || missing.len() == n) {
        return Err(format!("the nodes_* attributes have lengths {n} and {lens:?} (missing tracks {})", missing.len()));
    }
    let mut index: HashMap<(i64, i64), usize> = HashMap::with_capacity(n);
    let mut roots = Vec::new();
    let mut seen_trees = std::collections::HashSet::new();
    for g in 0..n {
        if index.insert((tree_ids[g], node_ids[g]), g).is_some() {
            return Err(format!("node {} of tree {} is listed twice", node_ids[g], tree_ids[g]));
        }
        if g == 0 || tree_ids[g] != tree_ids[g - 1] {
            // Each tree's nodes listed together: its first node is its root.
            if !seen_trees.insert(tree_ids[g]) {
                return Err(format!("the nodes of tree {} are not listed together", tree_ids[g]));
            }
            roots.push(g as i32);
        }
    }
    let mut f = Forest {
        feature: Vec::with_capacity(n),
        threshold: values.to_vec(),
        mode: Vec::with_capacity(n),
        yes: Vec::with_capacity(n),
        no: Vec::with_capacity(n),
        missing_true: (0..n).map(|g| missing.get(g) == Some(&1)).collect(),
        roots,
        depth: 0,
        targets,
        weights: vec![0.0; n * targets],
        has: vec![false; n * targets],
        aggregate,
        base: floats(node, "base_values").to_vec(),
        members: vec![Vec::new(); n],
        member_trunc: vec![false; n],
    };
    for g in 0..n {
        let mode = Mode::parse(&modes[g]).ok_or_else(|| format!("node mode {} is not supported", modes[g]))?;
        f.mode.push(mode);
        if mode == Mode::Leaf {
            f.feature.push(0);
            f.yes.push(g as i32);
            f.no.push(g as i32);
            continue;
        }
        f.feature.push(i32::try_from(features[g]).ok().filter(|&i| i >= 0).ok_or("a negative feature id")?);
        for (child, to) in [(trues[g], &mut f.yes), (falses[g], &mut f.no)] {
            let c = *index
                .get(&(tree_ids[g], child))
                .ok_or_else(|| format!("node {} of tree {} has no child {child}", node_ids[g], tree_ids[g]))?;
            if c == g {
                return Err(format!("node {} of tree {} is its own child", node_ids[g], tree_ids[g]));
            }
            to.push(c as i32);
        }
    }
    f.depth = depth(&f)?;
    leaf_weights(node, &mut f, &index, prefix)?;
    Ok(f)
}

/// The most branch nodes on a path from a root (a cycle is refused). Each node's depth is
/// computed once: trees may share subtrees (a chain of tests whose branches meet), whose paths
/// a plain walk would count over and over.
pub(crate) fn depth(f: &Forest) -> std::result::Result<usize, String> {
    // 0: not seen, 1: on the current path, 2: done (its depth in `memo`).
    let n = f.mode.len();
    let (mut state, mut memo) = (vec![0u8; n], vec![0usize; n]);
    let mut deepest = 0;
    for &root in &f.roots {
        let mut stack = vec![root as usize];
        while let Some(&g) = stack.last() {
            if state[g] == 2 {
                stack.pop();
                continue;
            }
            if f.mode[g] == Mode::Leaf {
                (state[g], memo[g]) = (2, 0);
                stack.pop();
                continue;
            }
            let (a, b) = (f.yes[g] as usize, f.no[g] as usize);
            if state[g] == 0 {
                state[g] = 1;
                for c in [a, b] {
                    match state[c] {
                        1 => return Err("a tree has a cycle".into()),
                        0 => stack.push(c),
                        _ => {}
                    }
                }
                continue;
            }
            // Both children done: this node's depth.
            memo[g] = 1 + memo[a].max(memo[b]);
            if memo[g] > MAX_DEPTH {
                return Err(format!("a tree is deeper than {MAX_DEPTH} levels"));
            }
            state[g] = 2;
            stack.pop();
        }
        deepest = deepest.max(memo[root as usize]);
    }
    Ok(deepest)
}

fn leaf_weights(
    node: &NodeInfo,
    f: &mut Forest,
    index: &HashMap<(i64, i64), usize>,
    prefix: &str,
) -> std::result::Result<(), String> {
    let attr = |what: &str| format!("{prefix}_{what}");
    let (trees, nodes, ids) = (ints(node, &attr("treeids")), ints(node, &attr("nodeids")), ints(node, &attr("ids")));
    let weights = floats(node, &attr("weights"));
    let n = trees.len();
    if [nodes.len(), ids.len(), weights.len()].iter().any(|&l| l != n) {
        return Err(format!(
            "the {prefix}_* attributes have lengths {n}, {}, {}, {}",
            nodes.len(),
            ids.len(),
            weights.len()
        ));
    }
    let t = f.targets;
    for k in 0..n {
        let g = *index
            .get(&(trees[k], nodes[k]))
            .ok_or_else(|| format!("a weight names node {} of tree {}, which does not exist", nodes[k], trees[k]))?;
        // (ORT refuses any target id outside [0, n_targets), one target included.)
        let id =
            usize::try_from(ids[k]).ok().filter(|&i| i < t).ok_or_else(|| format!("target id {} of {t}", ids[k]))?;
        if t == 1 {
            // One target: each leaf's first weight, whatever its target id.
            if !f.has[g] {
                (f.weights[g], f.has[g]) = (weights[k], true);
            }
            continue;
        }
        let (w, h) = (&mut f.weights[g * t + id], &mut f.has[g * t + id]);
        *w = match (f.aggregate, *h) {
            (_, false) => weights[k],
            (Aggregate::Min, true) => w.min(weights[k]),
            (Aggregate::Max, true) => w.max(weights[k]),
            _ => *w + weights[k],
        };
        *h = true;
    }
    if t == 1 {
        // ORT reads the first weight of every leaf reached: a leaf without one is refused.
        if let Some(g) = (0..f.mode.len()).find(|&g| f.mode[g] == Mode::Leaf && !f.has[g]) {
            return Err(format!(
                "leaf {} of tree {} has no weight",
                ints(node, "nodes_nodeids")[g],
                ints(node, "nodes_treeids")[g]
            ));
        }
    }
    Ok(())
}

/// Reads a node's attributes into a forest (TreeEnsembleRegressor's layout or TreeEnsemble's).
pub(crate) type Parse = fn(&NodeInfo) -> std::result::Result<Forest, String>;

/// Claims a forest op over `[N, F]` float32 features whose attributes `parse` reads.
pub(crate) fn claim_with(node: &NodeInfo, parse: Parse) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32])?;
    require_input_rank(node, 0, 2..=2)?;
    parse(node).map(|_| ()).map_err(Decline)
}

/// Lowers a forest op whose attributes `parse` reads.
pub(crate) fn lower_with(ctx: &mut LowerCtx<'_>, node: &NodeInfo, parse: Parse) -> Result<Vec<Array>> {
    let f = parse(node).map_err(ep_core::Error::new)?;
    walk(ctx, &f)
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_with(node, forest)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    lower_with(ctx, node, forest)
}

/// Every row of input 0 through every tree of `f`, aggregated: `[rows, targets]`.
pub(crate) fn walk(ctx: &mut LowerCtx<'_>, f: &Forest) -> Result<Vec<Array>> {
    let at = reach(ctx, f)?;
    let s = ctx.stream();
    let (n, trees) = (f.mode.len() as i64, f.roots.len() as i64);
    let t = f.targets as i64;
    let weights = Array::from_slice(&f.weights, &[n, t])?;
    // [rows, trees, targets]
    let reached = ops::take(&weights, &at, 0, s)?;
    let base = match f.base.len() {
        l if l == f.targets => Some(Array::from_slice(&f.base, &[t])?),
        // One target: a single base value is ORT's `origin`.
        _ => None,
    };
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let mut y = match f.aggregate {
        Aggregate::Sum => ops::sum_axes(&reached, &[1], false, s)?,
        Aggregate::Average => {
            ops::divide(&ops::sum_axes(&reached, &[1], false, s)?, &ops::scalar(trees as f64, Dtype::F32, s)?, s)?
        }
        Aggregate::Min | Aggregate::Max => {
            let has = ops::take(&Array::from_slice(&f.has, &[n, t])?, &at, 0, s)?;
            let (fill, reduce): (f64, Reduce) = if f.aggregate == Aggregate::Min {
                (f64::INFINITY, ops::min_axes)
            } else {
                (f64::NEG_INFINITY, ops::max_axes)
            };
            reduce(&ops::where_(&has, &reached, &ops::scalar(fill, Dtype::F32, s)?, s)?, &[1], false, s)?
        }
    };
    if let Some(b) = base {
        y = ops::add(&y, &b, s)?;
    }
    if f.targets > 1 {
        // A target no leaf of the row weighs is 0, its base value not added (ORT 1.31).
        let has = ops::take(&Array::from_slice(&f.has, &[n, t])?, &at, 0, s)?;
        y = ops::where_(&ops::any_axes(&has, &[1], false, s)?, &y, &zero, s)?;
    }
    Ok(vec![y])
}

/// The leaf each row of input 0 reaches in each tree of `f`: node indices `[rows, trees]`.
pub(crate) fn reach(ctx: &mut LowerCtx<'_>, f: &Forest) -> Result<Array> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let (rows, columns) = (x.shape()[0], x.shape()[1]);
    if let Some(&bad) = f.feature.iter().find(|&&i| i64::from(i) >= columns) {
        return Err(ep_core::Error::new(format!("a node reads feature {bad} of {columns}")));
    }
    let table = |v: Vec<i32>| -> Result<Array> {
        let n = v.len() as i64;
        Ok(Array::from_slice(&v, &[n])?)
    };
    let n = f.mode.len() as i64;
    let trees = f.roots.len() as i64;
    let feature = table(f.feature.clone())?;
    let threshold = Array::from_slice(&f.threshold, &[n])?;
    let mode = table(f.mode.iter().map(|m| m.code()).collect())?;
    let (yes, no) = (table(f.yes.clone())?, table(f.no.clone())?);
    let present: Vec<Mode> = Mode::BRANCHES.into_iter().filter(|m| f.mode.contains(m)).collect();
    let missing = f.missing_true.iter().any(|m| *m).then(|| Array::from_slice(&f.missing_true, &[n])).transpose()?;
    // The sets of member nodes, `[nodes, widest]`, padded with NaN (equal to nothing).
    let widest = f.members.iter().map(Vec::len).max().unwrap_or(0);
    let members = (widest > 0)
        .then(|| {
            let mut table = vec![f32::NAN; f.members.len() * widest];
            for (g, set) in f.members.iter().enumerate() {
                table[g * widest..g * widest + set.len()].copy_from_slice(set);
            }
            Array::from_slice(&table, &[n, widest as i64])
        })
        .transpose()?;
    let truncated = f.member_trunc.iter().any(|t| *t).then(|| Array::from_slice(&f.member_trunc, &[n])).transpose()?;
    // [rows, trees]: every pair at its tree's root, then one level per step.
    let mut at = ops::broadcast_to(&ops::reshape(&table(f.roots.clone())?, &[1, trees], s)?, &[rows, trees], s)?;
    for _ in 0..f.depth {
        let v = ops::take_along_axis(x, &ops::take(&feature, &at, 0, s)?, 1, s)?;
        let th = ops::take(&threshold, &at, 0, s)?;
        let compare = |m: Mode| -> Result<Array> {
            Ok(match m {
                Mode::Leq => ops::less_equal(&v, &th, s)?,
                Mode::Lt => ops::less(&v, &th, s)?,
                Mode::Gte => ops::greater_equal(&v, &th, s)?,
                Mode::Gt => ops::greater(&v, &th, s)?,
                Mode::Eq => ops::equal(&v, &th, s)?,
                Mode::Neq | Mode::Leaf => ops::not_equal(&v, &th, s)?,
                Mode::Member => match &members {
                    Some(table) => {
                        let set = ops::take(table, &at, 0, s)?;
                        let tested = match &truncated {
                            // Toward zero, on the nodes whose sets ORT tests that way.
                            Some(flags) => {
                                let toward_zero = ops::where_(
                                    &ops::less(&v, &ops::scalar(0.0, Dtype::F32, s)?, s)?,
                                    &ops::ceil(&v, s)?,
                                    &ops::floor(&v, s)?,
                                    s,
                                )?;
                                ops::where_(&ops::take(flags, &at, 0, s)?, &toward_zero, &v, s)?
                            }
                            None => v.clone(),
                        };
                        let hits = ops::equal(&ops::expand_dims(&tested, 2, s)?, &set, s)?;
                        ops::any_axes(&hits, &[2], false, s)?
                    }
                    None => ops::not_equal(&v, &v, s)?,
                },
            })
        };
        let mut go = compare(present[0])?;
        if present.len() > 1 {
            let m = ops::take(&mode, &at, 0, s)?;
            for &other in &present[1..] {
                let is = ops::equal(&m, &ops::scalar(f64::from(other.code()), Dtype::I32, s)?, s)?;
                go = ops::where_(&is, &compare(other)?, &go, s)?;
            }
        }
        if let Some(missing) = &missing {
            let tracked = ops::logical_and(&ops::isnan(&v, s)?, &ops::take(missing, &at, 0, s)?, s)?;
            go = ops::logical_or(&go, &tracked, s)?;
        }
        at = ops::where_(&go, &ops::take(&yes, &at, 0, s)?, &ops::take(&no, &at, 0, s)?, s)?;
    }
    Ok(at)
}

ep_core::register_lowering!(
    TREE_ENSEMBLE_REGRESSOR = FnLowering {
        domain: ML,
        op: "TreeEnsembleRegressor",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `n` tests whose two branches both lead to the next (LightGBM's set tests
    /// come out that way), then a leaf; `cycle` points the last test back at the first.
    fn chain(n: usize, cycle: bool) -> Forest {
        let mut next: Vec<i32> = (1..=n as i32).collect();
        if cycle {
            next[n - 1] = 0;
        }
        let mut mode = vec![Mode::Leq; n];
        mode.push(Mode::Leaf);
        next.push(n as i32);
        Forest {
            feature: vec![0; n + 1],
            threshold: vec![0.0; n + 1],
            mode,
            yes: next.clone(),
            no: next,
            missing_true: vec![false; n + 1],
            roots: vec![0],
            depth: 0,
            targets: 1,
            weights: vec![0.0; n + 1],
            has: vec![true; n + 1],
            aggregate: Aggregate::Sum,
            base: Vec::new(),
            members: vec![Vec::new(); n + 1],
            member_trunc: vec![false; n + 1],
        }
    }

    #[test]
    fn depth_counts_each_shared_subtree_once() {
        // 2^40 paths, 40 levels: answered at once.
        assert_eq!(depth(&chain(40, false)), Ok(40));
        assert!(depth(&chain(MAX_DEPTH + 1, false)).is_err());
        assert_eq!(depth(&chain(5, true)), Err("a tree has a cycle".to_string()));
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, register_spec};

    /// A seeded random forest's attributes: trees of up to `depth` levels (a node stops as a
    /// leaf at random), thresholds on a grid the inputs straddle, leaf weights per target.
    #[allow(clippy::too_many_arguments)]
    fn forest(
        case: Case,
        seed: u64,
        trees: i64,
        depth: u32,
        features: i64,
        targets: i64,
        mode: &str,
        missing: bool,
    ) -> Case {
        forest_with(case, seed, trees, depth, features, targets, mode, missing, "target", false, (0, false))
            .attr_int("n_targets", targets)
    }

    /// [`forest`]'s trees with the leaf weights in the `{prefix}_*` attributes; with
    /// `weigh_every_leaf`, every leaf weighs at least one target. Target `j` is written as id
    /// `first_id + j`; with `positive`, no weight is negative.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forest_with(
        case: Case,
        seed: u64,
        trees: i64,
        depth: u32,
        features: i64,
        targets: i64,
        mode: &str,
        missing: bool,
        prefix: &str,
        weigh_every_leaf: bool,
        (first_id, positive): (i64, bool),
    ) -> Case {
        let mut r = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut next = move |m: u64| {
            r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (r >> 33) % m
        };
        const MODES: [&str; 6] = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"];
        let (mut tree_ids, mut node_ids, mut feature_ids, mut values, mut modes) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut trues, mut falses, mut tracks) = (vec![], vec![], vec![]);
        let (mut w_trees, mut w_nodes, mut w_ids, mut w_values) = (vec![], vec![], vec![], vec![]);
        for t in 0..trees {
            // Breadth first: the root is listed first, as ORT finds it.
            let mut queue = std::collections::VecDeque::from([(0i64, 0u32)]);
            let mut next_id = 1i64;
            while let Some((id, d)) = queue.pop_front() {
                tree_ids.push(t);
                node_ids.push(id);
                let leaf = d == depth || (d > 0 && next(3) == 0);
                if leaf {
                    feature_ids.push(0);
                    values.push(0.0f32);
                    modes.push("LEAF".to_string());
                    trues.push(0);
                    falses.push(0);
                    tracks.push(0);
                    let weighed = next(targets as u64) as i64;
                    for j in 0..targets {
                        // One target: exactly one weight; more: most targets weighted, some twice.
                        let n = if targets == 1 || (weigh_every_leaf && j == weighed) {
                            1
                        } else {
                            [0, 1, 1, 2][next(4) as usize]
                        };
                        for _ in 0..n {
                            w_trees.push(t);
                            w_nodes.push(id);
                            w_ids.push(first_id + j);
                            let w = (next(17) as f32 - 8.0) * 0.125;
                            w_values.push(if positive { w.abs() * 0.25 } else { w });
                        }
                    }
                    continue;
                }
                feature_ids.push(next(features as u64) as i64);
                values.push((next(9) as f32 - 4.0) * 0.25);
                modes.push(if mode == "mixed" { MODES[next(6) as usize].to_string() } else { mode.to_string() });
                trues.push(next_id);
                falses.push(next_id + 1);
                tracks.push(if missing { next(2) as i64 } else { 0 });
                queue.push_back((next_id, d + 1));
                queue.push_back((next_id + 1, d + 1));
                next_id += 2;
            }
        }
        let case = case
            .attr_ints("nodes_treeids", &tree_ids)
            .attr_ints("nodes_nodeids", &node_ids)
            .attr_ints("nodes_featureids", &feature_ids)
            .attr("nodes_values", Attr::Floats(values))
            .attr("nodes_modes", Attr::Strs(modes))
            .attr_ints("nodes_truenodeids", &trues)
            .attr_ints("nodes_falsenodeids", &falses)
            .attr_ints(&format!("{prefix}_treeids"), &w_trees)
            .attr_ints(&format!("{prefix}_nodeids"), &w_nodes)
            .attr_ints(&format!("{prefix}_ids"), &w_ids)
            .attr(&format!("{prefix}_weights"), Attr::Floats(w_values));
        if missing { case.attr_ints("nodes_missing_value_tracks_true", &tracks) } else { case }
    }

    register_spec!(super::TREE_ENSEMBLE_REGRESSOR, || {
        (
            (1..=5i64, 1..=5i64, 1..=4i64, 0..=4u32, 1..=3i64),
            select(&["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "mixed"][..]),
            (select(&["SUM", "AVERAGE", "MIN", "MAX"][..]), any::<bool>(), any::<bool>()),
            seed(),
        )
            .prop_map(|((n, features, trees, depth, targets), mode, (aggregate, base, missing), seed)| {
                let case =
                    Case::domain_op("ai.onnx.ml", "TreeEnsembleRegressor", 3).input("x", DType::F32, &[n, features]);
                let case = forest(case, seed, trees, depth, features, targets, mode, missing)
                    .attr_str("aggregate_function", aggregate);
                let case = if base {
                    case.attr("base_values", Attr::Floats((0..targets).map(|j| j as f32 * 0.5 - 0.25).collect()))
                } else {
                    case
                };
                case.output("y", DType::F32, &[n, targets]).with_seed(seed)
            })
            .boxed()
    });
}
