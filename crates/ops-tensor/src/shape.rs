//! Shape manipulation: Reshape, Flatten, Squeeze, Unsqueeze (and `com.microsoft` ExpandDims), Identity, Shape, Size, Transpose,
//! Expand, Tile.

use ep_core::lowering::{ALL_TYPES, FnLowering, normalize_axis, require_input_type, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

const MAX: i32 = i32::MAX;

/// Data input 0 of any type, integer operands (if any) of type int64.
fn claim_data_and_i64(node: &NodeInfo, min: usize, max: usize) -> std::result::Result<(), Decline> {
    require_inputs(node, min, max)?;
    require_input_type(node, 0, ALL_TYPES)?;
    for i in 1..node.inputs.len() {
        require_input_type(node, i, &[ElemType::I64])?;
    }
    Ok(())
}

/// The target shape of ONNX Reshape: 0 copies the input dim (unless `allowzero`), -1 is inferred.
pub fn reshape_target(input: &[i64], spec: &[i64], allowzero: bool) -> Result<Vec<i64>> {
    let mut out: Vec<i64> = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            0 if !allowzero => out.push(
                *input
                    .get(i)
                    .ok_or_else(|| Error::new(format!("shape[{i}] = 0 copies a dim the input does not have")))?,
            ),
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            d if d >= 0 => out.push(d),
            d => bail!("shape has an invalid dim {d}"),
        }
    }
    let total: i64 = input.iter().product();
    if let Some(i) = infer {
        let known: i64 = out.iter().product();
        if known == 0 || total % known != 0 {
            bail!("cannot infer a dim of {spec:?} from {input:?}");
        }
        out[i] = total / known;
    }
    if out.iter().product::<i64>() != total {
        bail!("cannot reshape {input:?} to {spec:?}");
    }
    Ok(out)
}

fn claim_reshape(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_data_and_i64(node, 2, 2)
}

fn lower_reshape(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let spec = ctx.host_i64(1)?;
    let target = reshape_target(&x.shape(), &spec, node.attr_int("allowzero", 0)? == 1)?;
    Ok(vec![ops::reshape(x, &target, ctx.stream())?])
}

ep_core::register_lowering!(
    RESHAPE = FnLowering {
        domain: "",
        op: "Reshape",
        opsets: 5..=MAX,
        claim: claim_reshape,
        lower: lower_reshape,
        safety: CompileSafety::ShapeKeyed,
        growth: Some(|q| ep_core::growth::carries_sizes(false, q)),
    }
);

fn claim_flatten(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_data_and_i64(node, 1, 1)?;
    if let Some(r) = ep_core::lowering::input_rank(node, 0) {
        let axis = node.attr_int("axis", 1)?;
        if axis < -(r as i64) || axis > r as i64 {
            return Err(Decline(format!("axis {axis} is out of range for rank {r}")));
        }
    }
    Ok(())
}

fn lower_flatten(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let r = shape.len() as i64;
    let axis = node.attr_int("axis", 1)?;
    let axis = if axis < 0 { axis + r } else { axis } as usize;
    let outer: i64 = shape[..axis].iter().product();
    let inner: i64 = shape[axis..].iter().product();
    Ok(vec![ops::reshape(x, &[outer, inner], ctx.stream())?])
}

ep_core::register_lowering!(
    FLATTEN = FnLowering {
        domain: "",
        op: "Flatten",
        opsets: 1..=MAX,
        claim: claim_flatten,
        lower: lower_flatten,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

/// Axes from the `axes` attribute (opsets before 13) or input 1 (13 and later).
fn axes(ctx: &LowerCtx<'_>, node: &NodeInfo) -> Result<Option<Vec<i64>>> {
    if node.since_version >= 13 {
        if ctx.optional_input(1).is_some() { Ok(Some(ctx.host_i64(1)?)) } else { Ok(None) }
    } else {
        Ok(node.attr_ints("axes")?.map(<[i64]>::to_vec))
    }
}

fn claim_squeeze(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_data_and_i64(node, 1, 2)
}

fn lower_squeeze(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let axes = match axes(ctx, node)? {
        // (An empty axes input squeezes every size-1 dim, as ORT's CPU EP reads it.)
        Some(a) if !a.is_empty() => {
            a.iter().map(|&a| normalize_axis(a, shape.len())).collect::<std::result::Result<Vec<_>, _>>()?
        }
        _ => (0..shape.len()).filter(|&i| shape[i] == 1).collect(),
    };
    if let Some(&bad) = axes.iter().find(|&&a| shape[a] != 1) {
        bail!("cannot squeeze axis {bad} of size {}", shape[bad]);
    }
    let target: Vec<i64> = shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
    Ok(vec![ops::reshape(x, &target, ctx.stream())?])
}

ep_core::register_lowering!(
    SQUEEZE = FnLowering {
        domain: "",
        op: "Squeeze",
        opsets: 1..=MAX,
        claim: claim_squeeze,
        lower: lower_squeeze,
        safety: CompileSafety::ShapeKeyed,
        growth: Some(|q| ep_core::growth::carries_sizes(false, q)),
    }
);

fn claim_unsqueeze(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_data_and_i64(node, 1, 2)
}

fn lower_unsqueeze(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let Some(axes) = axes(ctx, node)? else { bail!("Unsqueeze needs axes") };
    let out_rank = shape.len() + axes.len();
    let mut axes = axes.iter().map(|&a| normalize_axis(a, out_rank)).collect::<std::result::Result<Vec<_>, _>>()?;
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        bail!("axes repeat");
    }
    let mut dims = shape.iter();
    let target: Vec<i64> =
        (0..out_rank).map(|i| if axes.contains(&i) { 1 } else { *dims.next().expect("rank adds up") }).collect();
    Ok(vec![ops::reshape(x, &target, ctx.stream())?])
}

ep_core::register_lowering!(
    UNSQUEEZE = FnLowering {
        domain: "",
        op: "Unsqueeze",
        opsets: 1..=MAX,
        claim: claim_unsqueeze,
        lower: lower_unsqueeze,
        safety: CompileSafety::ShapeKeyed,
        growth: Some(|q| ep_core::growth::carries_sizes(false, q)),
    }
);

fn claim_expand_dims(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, &[ElemType::I32])
}

/// `com.microsoft` ExpandDims: a dim of 1 inserted at `axis` (input 1, an int32 scalar read
/// on the host), negative counting from the end of the output, as ORT's CPU EP reads it.
fn lower_expand_dims(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let mut shape = x.shape();
    let axis = match ctx.host_i64(1)?.as_slice() {
        &[a] => a,
        other => bail!("axis must hold one value, not {}", other.len()),
    };
    let r = shape.len() as i64;
    if axis < -r - 1 || axis > r {
        bail!("axis {axis} is out of range for rank {r} (from {} to {r})", -r - 1);
    }
    let at = if axis < 0 { axis + r + 1 } else { axis } as usize;
    shape.insert(at, 1);
    Ok(vec![ops::reshape(x, &shape, ctx.stream())?])
}

ep_core::register_lowering!(
    EXPAND_DIMS = FnLowering {
        domain: "com.microsoft",
        op: "ExpandDims",
        opsets: 1..=MAX,
        claim: claim_expand_dims,
        lower: lower_expand_dims,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_identity(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, ALL_TYPES)
}

fn lower_identity(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    Ok(vec![ctx.input(0)?.clone()])
}

ep_core::register_lowering!(
    IDENTITY = FnLowering {
        domain: "",
        op: "Identity",
        opsets: 1..=MAX,
        claim: claim_identity,
        lower: lower_identity,
        safety: CompileSafety::Shapeless,
        growth: Some(|q| ep_core::growth::carries_sizes(true, q)),
    }
);

fn claim_shape(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, ALL_TYPES)
}

fn lower_shape(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let shape = ctx.input(0)?.shape();
    let r = shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(node.attr_int("start", 0)?);
    let end = clamp(node.attr_int("end", r)?);
    let dims: Vec<i64> = if start < end { shape[start..end].to_vec() } else { Vec::new() };
    Ok(vec![Array::from_slice(&dims, &[dims.len() as i64])?])
}

ep_core::register_lowering!(
    SHAPE = FnLowering {
        domain: "",
        op: "Shape",
        opsets: 1..=MAX,
        claim: claim_shape,
        lower: lower_shape,
        safety: CompileSafety::ShapeKeyed,
        growth: Some(ep_core::growth::to_size),
    }
);

fn lower_size(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let n: i64 = ctx.input(0)?.shape().iter().product();
    Ok(vec![Array::from_slice(&[n], &[])?])
}

ep_core::register_lowering!(
    SIZE = FnLowering {
        domain: "",
        op: "Size",
        opsets: 1..=MAX,
        claim: claim_shape,
        lower: lower_size,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_transpose(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, ALL_TYPES)?;
    if let (Some(perm), Some(r)) = (node.attr_ints("perm")?, ep_core::lowering::input_rank(node, 0)) {
        let mut sorted: Vec<i64> = perm.iter().map(|&p| if p < 0 { p + r as i64 } else { p }).collect();
        sorted.sort_unstable();
        if sorted != (0..r as i64).collect::<Vec<_>>() {
            return Err(Decline(format!("perm {perm:?} is not a permutation of rank {r}")));
        }
    }
    Ok(())
}

fn lower_transpose(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let r = x.ndim() as i64;
    let perm: Vec<i32> = match node.attr_ints("perm")? {
        Some(p) => p.iter().map(|&p| (if p < 0 { p + r } else { p }) as i32).collect(),
        None => (0..r as i32).rev().collect(),
    };
    Ok(vec![ops::transpose_axes(x, &perm, ctx.stream())?])
}

ep_core::register_lowering!(
    TRANSPOSE = FnLowering {
        domain: "",
        op: "Transpose",
        opsets: 1..=MAX,
        claim: claim_transpose,
        lower: lower_transpose,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

/// NumPy broadcast of two shapes.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Result<Vec<i64>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            match (da, db) {
                (x, y) if x == y => Ok(x),
                (1, y) => Ok(y),
                (x, 1) => Ok(x),
                _ => bail!("shapes {a:?} and {b:?} do not broadcast"),
            }
        })
        .collect()
}

fn claim_expand(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_data_and_i64(node, 2, 2)
}

fn lower_expand(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let target = broadcast_shapes(&x.shape(), &ctx.host_i64(1)?)?;
    Ok(vec![ops::broadcast_to(x, &target, ctx.stream())?])
}

ep_core::register_lowering!(
    EXPAND = FnLowering {
        domain: "",
        op: "Expand",
        opsets: 8..=MAX,
        claim: claim_expand,
        lower: lower_expand,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_tile(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_data_and_i64(node, 2, 2)
}

fn lower_tile(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let reps = ctx.host_i64(1)?;
    if reps.len() != x.ndim() || reps.iter().any(|&r| r < 0) {
        bail!("repeats {reps:?} do not fit rank {}", x.ndim());
    }
    if x.ndim() == 0 {
        return Ok(vec![x.clone()]);
    }
    let out: Vec<i64> = x.shape().iter().zip(&reps).map(|(&d, &r)| d.saturating_mul(r)).collect();
    ep_core::lowering::check_shape(&out, x.dtype())?;
    if out.contains(&0) {
        // Empty whatever the other repeats (which may be past MLX's sizes).
        return Ok(vec![ops::full(&out, &ops::scalar(0.0, x.dtype(), ctx.stream())?, x.dtype(), ctx.stream())?]);
    }
    Ok(vec![ops::tile(x, &reps, ctx.stream())?])
}

ep_core::register_lowering!(
    TILE = FnLowering {
        domain: "",
        op: "Tile",
        opsets: 6..=MAX,
        claim: claim_tile,
        lower: lower_tile,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::spec_util::*;
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::RESHAPE, || {
        (any_dtype(), nonempty_shape(0..=4), any::<prop::sample::Index>(), 0..3u8, opset(5..=22), seed())
            .prop_map(|(t, s, pick, form, v, seed)| {
                let n: i64 = s.iter().product();
                // form 0: flat with -1; 1: [first, -1] / keep dims with 0; 2: the same shape.
                let spec: Vec<i64> = match form {
                    0 => vec![-1],
                    1 if !s.is_empty() => {
                        let mut v = vec![0; s.len()];
                        v[pick.index(s.len())] = -1;
                        v
                    }
                    _ => s.clone(),
                };
                let out = match form {
                    0 => vec![n],
                    1 if !s.is_empty() => s.clone(),
                    _ => s.clone(),
                };
                Case::op("Reshape", v)
                    .input("x", t, &s)
                    .constant_i64("shape", &spec)
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::FLATTEN, || {
        (any_dtype(), shape(0..=4), any::<prop::sample::Index>(), any::<bool>(), opset(11..=22), seed())
            .prop_map(|(t, s, pick, neg, v, seed)| {
                let r = s.len();
                let axis = pick.index(r + 1) as i64;
                let outer: i64 = s[..axis as usize].iter().product();
                let inner: i64 = s[axis as usize..].iter().product();
                let a = if neg && axis < r as i64 { axis - r as i64 } else { axis };
                Case::op("Flatten", v)
                    .input("x", t, &s)
                    .attr_int("axis", a)
                    .output("y", t, &[outer, inner])
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::SQUEEZE, || {
        (any_dtype(), shape(1..=4), collection::vec(any::<bool>(), 4), any::<bool>(), opset(7..=22), seed())
            .prop_map(|(t, mut s, ones, all, v, seed)| {
                for (d, &o) in s.iter_mut().zip(&ones) {
                    if o {
                        *d = 1;
                    }
                }
                let axes: Vec<i64> = (0..s.len() as i64).filter(|&i| s[i as usize] == 1).collect();
                let out: Vec<i64> = s.iter().copied().filter(|&d| d != 1).collect();
                let case = Case::op("Squeeze", v).input("x", t, &s);
                let case = match (all, v >= 13) {
                    (true, _) => case,
                    (false, true) => case.constant_i64("axes", &axes),
                    (false, false) => case.attr_ints("axes", &axes),
                };
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::EXPAND_DIMS, || {
        (any_dtype(), shape(0..=3), any::<prop::sample::Index>(), any::<bool>(), seed())
            .prop_map(|(t, s, pick, neg, seed)| {
                let r = s.len();
                let at = pick.index(r + 1);
                let axis = if neg { at as i64 - r as i64 - 1 } else { at as i64 };
                let mut out = s.clone();
                out.insert(at, 1);
                Case::domain_op("com.microsoft", "ExpandDims", 1)
                    .input("x", t, &s)
                    .constant("axis", DType::I32, &[], Values::Data(vec![axis as f64]))
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::UNSQUEEZE, || {
        (any_dtype(), shape(0..=3), 1..=2usize, any::<prop::sample::Index>(), any::<bool>(), opset(7..=22), seed())
            .prop_map(|(t, s, k, pick, neg, v, seed)| {
                let out_rank = s.len() + k;
                let first = pick.index(out_rank - k + 1);
                let axes: Vec<i64> =
                    (first..first + k).map(|a| if neg { a as i64 - out_rank as i64 } else { a as i64 }).collect();
                let mut out = s.clone();
                for a in first..first + k {
                    out.insert(a, 1);
                }
                let case = Case::op("Unsqueeze", v).input("x", t, &s);
                let case = if v >= 13 { case.constant_i64("axes", &axes) } else { case.attr_ints("axes", &axes) };
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::IDENTITY, || {
        (any_dtype(), shape(0..=4), opset(7..=22), seed())
            .prop_map(|(t, s, v, seed)| Case::unary("Identity", v, t, &s).with_seed(seed))
            .boxed()
    });

    register_spec!(super::SHAPE, || {
        (any_dtype(), shape(1..=4), opset(7..=22), any::<(i8, i8)>(), any::<bool>(), seed())
            .prop_map(|(t, s, v, (a, b), sliced, seed)| {
                let r = s.len() as i64;
                // Symbolic dims: ORT folds the Shape of a static shape before an EP sees it.
                let case = Case::op("Shape", v).input("x", t, &s).symbolic(true);
                if v >= 15 && sliced {
                    let (start, end) = ((a as i64) % (r + 2), (b as i64) % (r + 2));
                    let norm = |x: i64| (if x < 0 { x + r } else { x }).clamp(0, r);
                    let n = (norm(end) - norm(start)).max(0);
                    case.attr_int("start", start).attr_int("end", end).output("y", DType::I64, &[n]).with_seed(seed)
                } else {
                    case.output("y", DType::I64, &[r]).with_seed(seed)
                }
            })
            .boxed()
    });

    register_spec!(super::SIZE, || {
        (any_dtype(), shape(0..=4), opset(7..=22), seed())
            .prop_map(|(t, s, v, seed)| {
                Case::op("Size", v).input("x", t, &s).symbolic(true).output("y", DType::I64, &[]).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::TRANSPOSE, || {
        (any_dtype(), shape(0..=4), any::<u64>(), any::<bool>(), opset(7..=22), seed())
            .prop_map(|(t, s, perm_seed, default, v, seed)| {
                let r = s.len();
                let mut perm: Vec<i64> = (0..r as i64).collect();
                let mut h = perm_seed;
                for i in (1..r).rev() {
                    h = h.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    perm.swap(i, (h >> 33) as usize % (i + 1));
                }
                if default {
                    perm = (0..r as i64).rev().collect();
                }
                let out: Vec<i64> = perm.iter().map(|&p| s[p as usize]).collect();
                let case = Case::op("Transpose", v).input("x", t, &s);
                let case = if default { case } else { case.attr_ints("perm", &perm) };
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::EXPAND, || {
        (any_dtype(), broadcast_pair(0..=4), opset(8..=22), seed())
            .prop_map(|(t, (a, b, y), v, seed)| {
                Case::op("Expand", v).input("x", t, &a).constant_i64("shape", &b).output("y", t, &y).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::TILE, || {
        (any_dtype(), shape(1..=3), collection::vec(0..=3i64, 3), opset(7..=22), seed())
            .prop_map(|(t, s, reps, v, seed)| {
                let reps = &reps[..s.len()];
                let out: Vec<i64> = s.iter().zip(reps).map(|(d, r)| d * r).collect();
                Case::op("Tile", v).input("x", t, &s).constant_i64("repeats", reps).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });
}
