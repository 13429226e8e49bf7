//! Data-dependent selections: NonZero, Compress and Unique. Their output shapes depend on input values,
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
        growth: None,
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
    // Entries past the axis are not read (ORT's CPU EP ignores them).
    let dim = data.shape()[axis];
    let keep: Vec<i64> =
        cond.iter().take(dim as usize).enumerate().filter(|(_, c)| **c != 0.0).map(|(i, _)| i as i64).collect();
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
        growth: None,
    }
);

fn claim_unique(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(
        node,
        0,
        &[ElemType::F32, ElemType::F64, ElemType::I64, ElemType::I32, ElemType::I8, ElemType::U8],
    )
}

/// Unique elements (no `axis`: of the flattened input) or slices along `axis`: sorted
/// ascending (`sorted=1`, lexicographically for slices) or in order of first occurrence; with
/// the first-occurrence indices, the inverse indices and the counts. Values are gathered from
/// the input itself, so they keep its exact type.
fn lower_unique(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream_for(x.dtype());
    let values = ctx.host_f64(0)?;
    let (data, axis) = match node.attr("axis") {
        Some(_) => (x.clone(), normalize_axis(node.attr_int("axis", 0)?, x.ndim())?),
        None => (ops::reshape(x, &[-1], s)?, 0),
    };
    let shape = data.shape();
    let n = shape[axis] as usize;
    let outer: usize = shape[..axis].iter().product::<i64>() as usize;
    let inner: usize = shape[axis + 1..].iter().product::<i64>() as usize;
    // The elements of slice i along `axis`, in row-major order.
    let slice = |i: usize| -> Vec<f64> {
        (0..outer).flat_map(|o| (0..inner).map(move |j| (o * n + i) * inner + j)).map(|k| values[k]).collect()
    };
    let slices: Vec<Vec<f64>> = (0..n).map(slice).collect();
    let mut firsts: Vec<usize> = Vec::new();
    let mut inverse_first = vec![0usize; n];
    for i in 0..n {
        match firsts.iter().position(|&f| slices[f] == slices[i]) {
            Some(p) => inverse_first[i] = p,
            None => {
                inverse_first[i] = firsts.len();
                firsts.push(i);
            }
        }
    }
    // Output order: by value when sorted, else by first occurrence.
    let mut order: Vec<usize> = (0..firsts.len()).collect();
    if node.attr_int("sorted", 1)? == 1 {
        order.sort_by(|&a, &b| slices[firsts[a]].partial_cmp(&slices[firsts[b]]).unwrap_or(std::cmp::Ordering::Equal));
    }
    let mut rank = vec![0i64; firsts.len()];
    for (r, &u) in order.iter().enumerate() {
        rank[u] = r as i64;
    }
    let indices: Vec<i64> = order.iter().map(|&u| firsts[u] as i64).collect();
    let inverse: Vec<i64> = inverse_first.iter().map(|&u| rank[u]).collect();
    let mut counts = vec![0i64; firsts.len()];
    for &u in &inverse {
        counts[u as usize] += 1;
    }
    let k = indices.len() as i64;
    let idx = Array::from_slice(&indices, &[k])?;
    let y = ops::take(&data, &idx, axis as i32, s)?;
    Ok(vec![y, idx, Array::from_slice(&inverse, &[inverse.len() as i64])?, Array::from_slice(&counts, &[k])?])
}

fn claim_contrib_unique(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    match ep_core::lowering::input_rank(node, 0) {
        Some(1) | None => Ok(()),
        Some(r) => Err(Decline(format!("input rank {r}: ORT's kernel takes 1-D input only"))),
    }
}

/// `com.microsoft` Unique (float32, 1-D): the distinct values in order of first occurrence
/// (values equal as floats are one: -0 and 0 keep the first seen; every NaN is its own), each
/// element's position among them, and the counts.
fn lower_contrib_unique(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    if x.ndim() != 1 {
        bail!("the input of shape {:?} must be 1-D", x.shape());
    }
    let s = ctx.stream_for(x.dtype());
    let values = ctx.host_f64(0)?;
    let mut firsts: Vec<usize> = Vec::new();
    let mut inverse = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        match firsts.iter().position(|&f| values[f] == *v) {
            Some(p) => inverse.push(p as i64),
            None => {
                inverse.push(firsts.len() as i64);
                firsts.push(i);
            }
        }
    }
    let mut counts = vec![0i64; firsts.len()];
    for &u in &inverse {
        counts[u as usize] += 1;
    }
    let k = firsts.len() as i64;
    let at: Vec<i64> = firsts.iter().map(|&i| i as i64).collect();
    let y = ops::take(x, &Array::from_slice(&at, &[k])?, 0, s)?;
    Ok(vec![y, Array::from_slice(&inverse, &[inverse.len() as i64])?, Array::from_slice(&counts, &[k])?])
}

ep_core::register_lowering!(
    CONTRIB_UNIQUE = FnLowering {
        domain: "com.microsoft",
        op: "Unique",
        opsets: 1..=i32::MAX,
        claim: claim_contrib_unique,
        lower: lower_contrib_unique,
        safety: CompileSafety::Never,
        growth: None,
    }
);

ep_core::register_lowering!(
    UNIQUE = FnLowering {
        domain: "",
        op: "Unique",
        opsets: 11..=i32::MAX,
        claim: claim_unique,
        lower: lower_unique,
        safety: CompileSafety::Never,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::NON_ZERO, || {
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

    register_spec!(super::UNIQUE, || {
        (
            select(&[DType::F32, DType::I64][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            any::<(bool, bool)>(),
            seed(),
        )
            .prop_map(|(t, s, pick, (with_axis, sorted), seed)| {
                // Few distinct values, so repeats occur; the output lengths come from the data.
                let n: i64 = s.iter().product();
                let data: Vec<f64> = (0..n).map(|i| ((i * 5 + seed as i64) % 4) as f64 - 1.0).collect();
                let axis = pick.index(s.len());
                let (count, mut y_shape) = if with_axis {
                    let inner: i64 = s[axis + 1..].iter().product();
                    let outer: i64 = s[..axis].iter().product();
                    let d = s[axis];
                    let slices: Vec<Vec<i64>> = (0..d)
                        .map(|i| {
                            (0..outer)
                                .flat_map(|o| (0..inner).map(move |j| (o * d + i) * inner + j))
                                .map(|k| data[k as usize] as i64)
                                .collect()
                        })
                        .collect();
                    let mut distinct = slices.clone();
                    distinct.sort();
                    distinct.dedup();
                    (distinct.len() as i64, s.clone())
                } else {
                    let mut v: Vec<i64> = data.iter().map(|&x| x as i64).collect();
                    v.sort();
                    v.dedup();
                    (v.len() as i64, vec![0])
                };
                if with_axis {
                    y_shape[axis] = count;
                } else {
                    y_shape[0] = count;
                }
                let inverse_len = if with_axis { s[axis] } else { n };
                let case =
                    Case::op("Unique", 11).input_with("x", t, &s, Values::Data(data)).attr_int("sorted", sorted as i64);
                let case = if with_axis { case.attr_int("axis", axis as i64) } else { case };
                case.output("y", t, &y_shape)
                    .output("indices", DType::I64, &[count])
                    .output("inverse", DType::I64, &[inverse_len])
                    .output("counts", DType::I64, &[count])
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::CONTRIB_UNIQUE, || {
        (0..=12i64, 1..=5i64, seed())
            .prop_map(|(n, spread, seed)| {
                // Repeats, and now and then both zeros. (NaN, which a case's JSON cannot hold,
                // comes from the fuzzer's nan-inf mutation.)
                let data: Vec<f64> = (0..n)
                    .map(|i| match (i as u64 * 7 + seed) % 13 {
                        1 if seed % 2 == 0 => -0.0,
                        v => ((v as i64) % spread) as f64 * 0.5,
                    })
                    .collect();
                let mut firsts: Vec<f64> = Vec::new();
                for &v in &data {
                    if !firsts.contains(&v) {
                        firsts.push(v);
                    }
                }
                let k = firsts.len() as i64;
                Case::domain_op("com.microsoft", "Unique", 1)
                    .input_with("x", DType::F32, &[n], Values::Data(data))
                    .output("y", DType::F32, &[k])
                    .output("idx", DType::I64, &[n])
                    .output("counts", DType::I64, &[k])
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::COMPRESS, || {
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
