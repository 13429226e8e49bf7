//! Concat and Split.

use ep_core::lowering::{ALL_TYPES, FnLowering, normalize_axis, require_input_type, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_concat(node: &NodeInfo) -> std::result::Result<(), Decline> {
    if node.inputs.iter().flatten().count() == 0 {
        return Err(Decline::new("Concat has no inputs"));
    }
    // ORT's CPU EP refuses an omitted input (it does not skip it).
    if node.inputs.iter().any(Option::is_none) {
        return Err(Decline::new("an input of Concat is omitted"));
    }
    require_types(node, ALL_TYPES)?;
    node.attr_int("axis", i64::MIN).and_then(|a| if a == i64::MIN { Err("axis is required".into()) } else { Ok(a) })?;
    Ok(())
}

fn lower_concat(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let arrays: Vec<Array> = (0..ctx.num_inputs()).filter_map(|i| ctx.optional_input(i).cloned()).collect();
    let rank = arrays[0].ndim();
    let axis = normalize_axis(node.attr_int("axis", 0)?, rank)?;
    Ok(vec![ops::concatenate(&arrays, axis as i32, ctx.stream())?])
}

ep_core::register_lowering!(
    CONCAT = FnLowering {
        domain: "",
        op: "Concat",
        opsets: 4..=i32::MAX,
        claim: claim_concat,
        lower: lower_concat,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_split(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, &[ElemType::I64])?;
    if node.outputs.iter().any(Option::is_none) {
        return Err(Decline::new("an output of Split is omitted"));
    }
    Ok(())
}

fn lower_split(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let axis = normalize_axis(node.attr_int("axis", 0)?, shape.len())?;
    let dim = shape[axis];
    let outputs = node.outputs.len() as i64;
    // An empty `split` input counts as none, as ORT's CPU EP reads it.
    let given = if node.since_version >= 13 && ctx.optional_input(1).is_some() { ctx.host_i64(1)? } else { Vec::new() };
    let sizes: Vec<i64> = if !given.is_empty() {
        given
    } else if let Some(split) = node.attr_ints("split")?.filter(|_| node.since_version < 13) {
        split.to_vec()
    } else if node.since_version >= 18 && node.attr("num_outputs").is_some() {
        let n = node.attr_int("num_outputs", outputs)?;
        let chunk = (dim + n - 1) / n.max(1);
        // Chunks of ceil(dim / n), the last one smaller: as ORT's CPU EP, refused when the
        // last one would be empty (num_outputs above the dimension included).
        if n < 1 || chunk * (n - 1) >= dim {
            bail!("num_outputs {n} does not split a dimension of {dim} into chunks of {chunk}");
        }
        (0..n).map(|i| (dim - i * chunk).clamp(0, chunk)).collect()
    } else {
        if dim % outputs != 0 {
            bail!("dim {dim} does not split evenly into {outputs} outputs");
        }
        vec![dim / outputs; outputs as usize]
    };
    if sizes.len() as i64 != outputs || sizes.iter().sum::<i64>() != dim || sizes.iter().any(|&s| s < 0) {
        bail!("split sizes {sizes:?} do not fit dim {dim} into {outputs} outputs");
    }
    let mut bounds = Vec::new();
    let mut acc = 0;
    for s in &sizes[..sizes.len() - 1] {
        acc += s;
        bounds.push(acc);
    }
    Ok(ops::split_at(x, &bounds, axis as i32, ctx.stream())?)
}

ep_core::register_lowering!(
    SPLIT = FnLowering {
        domain: "",
        op: "Split",
        opsets: 2..=i32::MAX,
        claim: claim_split,
        lower: lower_split,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::spec_util::*;
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, register_spec};

    register_spec!(super::CONCAT, || {
        (
            any_dtype(),
            nonempty_shape(1..=4),
            collection::vec(0..=3i64, 1..=3),
            any::<prop::sample::Index>(),
            any::<bool>(),
            opset(7..=22),
            seed(),
        )
            .prop_map(|(t, s, sizes, pick, neg, v, seed)| {
                let axis = pick.index(s.len());
                let mut case = Case::op("Concat", v);
                for (i, &n) in sizes.iter().enumerate() {
                    let mut part = s.clone();
                    part[axis] = n;
                    case = case.input(&format!("x{i}"), t, &part);
                }
                let mut out = s.clone();
                out[axis] = sizes.iter().sum();
                let a = if neg { axis as i64 - s.len() as i64 } else { axis as i64 };
                case.attr_int("axis", a).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::SPLIT, || {
        (
            any_dtype(),
            nonempty_shape(1..=3),
            collection::vec(0..=3i64, 1..=3),
            any::<prop::sample::Index>(),
            0..3u8,
            opset(7..=22),
            seed(),
        )
            .prop_map(|(t, s, sizes, pick, form, v, seed)| {
                let axis = pick.index(s.len());
                let n = sizes.len();
                let mut s = s;
                // form 0: explicit sizes; 1: equal parts; 2: num_outputs (opset 18+, uneven).
                let sizes: Vec<i64> = match form {
                    1 => {
                        let each = (s[axis] / n as i64).max(1);
                        vec![each; n]
                    }
                    _ => sizes,
                };
                s[axis] = sizes.iter().sum();
                if form == 2 && v >= 18 {
                    s[axis] = 2 * n as i64 - 1;
                }
                let mut case = Case::op("Split", v).input("x", t, &s).attr_int("axis", axis as i64);
                let outs: Vec<i64> = if form == 2 && v >= 18 {
                    let dim = s[axis];
                    let chunk = (dim + n as i64 - 1) / n as i64;
                    case = case.attr_int("num_outputs", n as i64);
                    (0..n as i64).map(|i| (dim - i * chunk).clamp(0, chunk)).collect()
                } else if form == 1 {
                    if v >= 18 {
                        case = case.attr_int("num_outputs", n as i64);
                    }
                    sizes.clone()
                } else if v >= 13 {
                    case = case.constant_i64("split", &sizes);
                    sizes.clone()
                } else {
                    case = case.attr_ints("split", &sizes);
                    sizes.clone()
                };
                for (i, &d) in outs.iter().enumerate() {
                    let mut o = s.clone();
                    o[axis] = d;
                    case = case.output(&format!("y{i}"), t, &o);
                }
                case.with_seed(seed)
            })
            .boxed()
    });
}
