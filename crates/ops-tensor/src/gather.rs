//! Gather, GatherElements, GatherND (and `com.microsoft`'s earlier GatherND). Negative indices count from the end, as ONNX defines.

use ep_core::lowering::{ALL_TYPES, FnLowering, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const INDEX_TYPES: &[ElemType] = &[ElemType::I64, ElemType::I32];

fn claim_gather(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, INDEX_TYPES)
}

/// `idx` as positions along an axis of `dim` entries: negative indices wrap, and an index
/// outside `[-dim, dim)` fails the run (see `LowerCtx::checked_indices`).
fn positions(ctx: &mut LowerCtx<'_>, idx: &Array, dim: i64, axis: usize, s: &Stream) -> Result<Array> {
    if dim == 0 && idx.size() > 0 {
        bail!("indices into axis {axis}, which has no entries");
    }
    let reason = format!(
        "indices out of range: each must lie within the inclusive range [{}, {}] (axis {axis} has {dim} entries)",
        -dim,
        dim - 1
    );
    ctx.checked_index(idx, dim.max(1), &reason, s)
}

fn lower_gather(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, idx, s) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.stream());
    let axis = normalize_axis(node.attr_int("axis", 0)?, x.ndim())?;
    // One constant index (a `Shape -> Gather` picking a dimension, say): no gather kernel
    // (on CUDA one more JIT-compiled on a first run). From data already on the host (a
    // constant, or a few values computed while building, as a Shape's), the entries are
    // picked here (a large array in device memory is not read back: on CUDA that moves it);
    // otherwise a slice, a view, except in a shapeless trace (the slice would keep the traced
    // shape).
    if let Some([k]) = ctx.constant_i64(1)?.as_deref() {
        let xs = x.shape();
        let dim = xs[axis];
        let at = if *k < 0 { k + dim } else { *k };
        if !(0..dim).contains(&at) {
            bail!("index {k} is out of range for axis {axis} of {dim} entries");
        }
        let mut shape = xs.clone();
        shape.splice(axis..=axis, idx.shape());
        if let Some(bytes) = (ctx.is_constant(0) || x.size() <= 64).then(|| x.host_bytes()).flatten() {
            let inner = xs[axis + 1..].iter().product::<i64>() as usize * x.dtype().size_in_bytes();
            let (dim, at) = (dim as usize, at as usize);
            let picked: Vec<u8> = if dim * inner == 0 {
                Vec::new()
            } else {
                bytes.chunks(dim * inner).flat_map(|outer| &outer[at * inner..(at + 1) * inner]).copied().collect()
            };
            return Ok(vec![Array::from_bytes(&picked, &shape, x.dtype())?]);
        }
        if !ctx.shapeless() {
            let (mut start, mut stop) = (vec![0; x.ndim()], xs);
            (start[axis], stop[axis]) = (at, at + 1);
            return Ok(vec![ops::reshape(&ops::slice(&x, &start, &stop, s)?, &shape, s)?]);
        }
    }
    let idx = positions(ctx, &idx, x.shape()[axis], axis, s)?;
    Ok(vec![ops::take(&x, &idx, axis as i32, s)?])
}

ep_core::register_lowering!(
    GATHER = FnLowering {
        domain: "",
        op: "Gather",
        opsets: 1..=i32::MAX,
        claim: claim_gather,
        lower: lower_gather,
        safety: CompileSafety::ShapeKeyed,
        growth: Some(|q| ep_core::growth::carries_sizes(false, q)),
    }
);

fn lower_gather_elements(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, idx, s) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.stream());
    let (x, idx) = (&x, &idx);
    let (xs, is) = (x.shape(), idx.shape());
    if xs.len() != is.len() {
        bail!("indices have rank {}, data rank {}", is.len(), xs.len());
    }
    let axis = normalize_axis(node.attr_int("axis", 0)?, xs.len())?;
    // Indices may be smaller than the data on the other axes: only that part is read.
    let mut hi = xs.clone();
    for d in 0..xs.len() {
        if d != axis {
            if is[d] > xs[d] {
                bail!("indices dim {d} ({}) exceeds the data's ({})", is[d], xs[d]);
            }
            hi[d] = is[d];
        }
    }
    let part = if hi == xs { x.clone() } else { ops::slice(x, &vec![0; xs.len()], &hi, s)? };
    let idx = positions(ctx, idx, xs[axis], axis, s)?;
    Ok(vec![ops::take_along_axis(&part, &idx, axis as i32, s)?])
}

ep_core::register_lowering!(
    GATHER_ELEMENTS = FnLowering {
        domain: "",
        op: "GatherElements",
        opsets: 11..=i32::MAX,
        claim: claim_gather,
        lower: lower_gather_elements,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn lower_gather_nd(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, idx, s) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.stream());
    let (x, idx) = (&x, &idx);
    let (xs, is) = (x.shape(), idx.shape());
    let b = node.attr_int("batch_dims", 0)? as usize;
    let Some(&k) = is.last() else { bail!("indices are a scalar") };
    let k = k as usize;
    if is.len() < b + 1 || xs.len() < b + k || xs[..b] != is[..b] {
        bail!("indices {is:?} do not fit data {xs:?} with batch_dims {b}");
    }
    let batch: i64 = xs[..b].iter().product();
    let indexed: i64 = xs[b..b + k].iter().product();
    let rest = &xs[b + k..];
    // Row-major strides of the indexed dims, and their sizes for negative indices.
    let mut strides = vec![1i64; k];
    for j in (0..k.saturating_sub(1)).rev() {
        strides[j] = strides[j + 1] * xs[b + j + 1];
    }
    let indexed_dims = &xs[b..b + k];
    if indexed_dims.contains(&0) && idx.size() > 0 {
        bail!("indices into data {xs:?}, whose indexed dimensions {indexed_dims:?} include an empty one");
    }
    let dims = Array::from_slice(&indexed_dims.iter().map(|&d| d.max(1)).collect::<Vec<_>>(), &[k as i64])?;
    let reason = format!(
        "indices out of range: index column j must lie within [-d_j, d_j - 1] for the indexed dimensions {indexed_dims:?}"
    );
    let norm = ctx.checked_indices(idx, &dims, &reason, s)?;
    let flat = ops::sum_axes(&ops::multiply(&norm, &Array::from_slice(&strides, &[k as i64])?, s)?, &[-1], false, s)?;
    // Each batch's rows start `indexed` rows further into the flattened data.
    let flat = if b > 0 {
        let mut bshape = is[..b].to_vec();
        bshape.extend(std::iter::repeat_n(1, is.len() - 1 - b));
        let offsets = ops::reshape(&ops::arange(0.0, batch as f64, 1.0, Dtype::I64, s)?, &bshape, s)?;
        ops::add(&flat, &ops::multiply(&offsets, &ops::scalar(indexed as f64, Dtype::I64, s)?, s)?, s)?
    } else {
        flat
    };
    let mut data_shape = vec![batch * indexed];
    data_shape.extend_from_slice(rest);
    let data = ops::reshape(x, &data_shape, s)?;
    Ok(vec![ops::take(&data, &flat, 0, s)?])
}

ep_core::register_lowering!(
    GATHER_ND = FnLowering {
        domain: "",
        op: "GatherND",
        opsets: 11..=i32::MAX,
        claim: claim_gather,
        lower: lower_gather_nd,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_ms_gather_nd(node: &NodeInfo) -> std::result::Result<(), Decline> {
    if node.attr("batch_dims").is_some() {
        return Err(Decline::new("com.microsoft GatherND has no batch_dims"));
    }
    claim_gather(node)
}

// ORT's earlier form: GatherND without batch dims.
ep_core::register_lowering!(
    MS_GATHER_ND = FnLowering {
        domain: "com.microsoft",
        op: "GatherND",
        opsets: 1..=i32::MAX,
        claim: claim_ms_gather_nd,
        lower: lower_gather_nd,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::spec_util::*;
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn index_dtype() -> BoxedStrategy<DType> {
        select(&[DType::I64, DType::I32][..]).boxed()
    }

    register_spec!(super::GATHER, || {
        (
            any_dtype(),
            nonempty_shape(1..=3),
            shape(0..=2),
            any::<prop::sample::Index>(),
            index_dtype(),
            opset(7..=22),
            seed(),
            (any::<bool>(), any::<prop::sample::Index>()),
        )
            .prop_map(|(t, s, is, pick, it, v, seed, (constant, at))| {
                let axis = pick.index(s.len());
                let d = s[axis] as f64;
                let mut out = s[..axis].to_vec();
                out.extend(&is);
                out.extend(&s[axis + 1..]);
                // Negative indices are defined from opset 11.
                let lo = if v >= 11 { -d } else { 0.0 };
                let case = Case::op("Gather", v).input("x", t, &s);
                // One constant index (a dimension picked from a shape, say) runs as a slice.
                let case = if constant && is.iter().product::<i64>() == 1 {
                    let k = lo as i64 + at.index((d - lo) as usize) as i64;
                    case.constant("idx", it, &is, Values::Data(vec![k as f64]))
                } else {
                    case.input_with("idx", it, &is, Values::Uniform { lo, hi: d })
                };
                case.attr_int("axis", axis as i64).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::GATHER_ELEMENTS, || {
        (
            any_dtype(),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            collection::vec(0..=3i64, 3),
            index_dtype(),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(t, s, pick, extra, it, v, seed)| {
                let axis = pick.index(s.len());
                let is: Vec<i64> = s
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if i == axis { extra[i] } else { (d - extra[i] % 2).max(1) })
                    .collect();
                let d = s[axis] as f64;
                Case::op("GatherElements", v)
                    .input("x", t, &s)
                    .input_with("idx", it, &is, Values::Uniform { lo: -d, hi: d })
                    .attr_int("axis", axis as i64)
                    .output("y", t, &is)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::GATHER_ND, || {
        (any_dtype(), nonempty_shape(1..=4), 0..=1usize, 1..=3usize, shape(0..=1), opset(12..=22), seed())
            .prop_map(|(t, s, b, k, mid, v, seed)| {
                let b = b.min(s.len() - 1);
                let k = k.min(s.len() - b);
                let mut is = s[..b].to_vec();
                is.extend(&mid);
                is.push(k as i64);
                // Every index column stays within the smallest indexed dim, negative included.
                let d = s[b..b + k].iter().copied().min().unwrap_or(1) as f64;
                let mut out = is[..is.len() - 1].to_vec();
                out.extend(&s[b + k..]);
                Case::op("GatherND", v)
                    .input("x", t, &s)
                    .input_with("idx", DType::I64, &is, Values::Uniform { lo: -d, hi: d })
                    .attr_int("batch_dims", b as i64)
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::MS_GATHER_ND, || {
        (any_dtype(), nonempty_shape(1..=4), 1..=3usize, shape(0..=2), index_dtype(), seed())
            .prop_map(|(t, s, k, mid, it, seed)| {
                let k = k.min(s.len());
                let mut is = mid.clone();
                is.push(k as i64);
                let d = s[..k].iter().copied().min().unwrap_or(1) as f64;
                let mut out = mid;
                out.extend(&s[k..]);
                Case::domain_op("com.microsoft", "GatherND", 1)
                    .input("x", t, &s)
                    .input_with("idx", it, &is, Values::Uniform { lo: -d, hi: d })
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });
}
