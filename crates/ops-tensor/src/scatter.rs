//! ScatterElements and ScatterND, with every reduction (none, add, mul, max, min). Negative
//! indices count from the end. With `reduction="none"` and repeated indices the result is
//! unspecified by ONNX (and differs between runtimes).

use ep_core::lowering::{ALL_TYPES, FnLowering, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::ops::ScatterReduce;
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn reduction(node: &NodeInfo) -> std::result::Result<ScatterReduce, String> {
    Ok(match node.attr("reduction") {
        None => ScatterReduce::None,
        Some(AttrValue::String(r)) => match r.as_str() {
            "none" => ScatterReduce::None,
            "add" => ScatterReduce::Add,
            "mul" => ScatterReduce::Mul,
            "max" => ScatterReduce::Max,
            "min" => ScatterReduce::Min,
            other => return Err(format!("reduction '{other}' is not supported")),
        },
        Some(other) => return Err(format!("reduction {other:?} is not a string")),
    })
}

fn claim_scatter(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, &[ElemType::I64, ElemType::I32])?;
    require_input_type(node, 2, ALL_TYPES)?;
    reduction(node)?;
    Ok(())
}

/// The stream for a scatter into `data`: MLX's GPU scatter takes no 64-bit integers (0.32.2),
/// so those run on the CPU stream.
fn scatter_stream<'a>(ctx: &LowerCtx<'a>, data: &Array) -> &'a Stream {
    let wide_int = matches!(data.dtype(), Dtype::I64 | Dtype::U64 | Dtype::F64);
    if wide_int && ep_core::mlx::default_device_is_gpu() { ctx.cpu_stream() } else { ctx.stream() }
}

/// `idx` as int64 positions along axis `axis` of `dim` (at least 1) entries: negative indices
/// wrap, and an index outside `[-dim, dim)` fails the run (see `LowerCtx::checked_indices`).
fn wrap(ctx: &mut LowerCtx<'_>, idx: &Array, dim: i64, axis: usize, s: &Stream) -> Result<Array> {
    let reason = format!(
        "indices out of range: each must lie within the inclusive range [{}, {}] (axis {axis} has {dim} entries)",
        -dim,
        dim - 1
    );
    ctx.checked_indices(idx, &ops::scalar(dim as f64, Dtype::I64, s)?, &reason, s)
}

fn lower_scatter_elements(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (data, idx, upd) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.input(2)?.clone());
    let (data, idx, upd) = (&data, &idx, &upd);
    let s = scatter_stream(ctx, data);
    let shape = data.shape();
    let r = shape.len();
    let axis = normalize_axis(node.attr_int("axis", 0)?, r)?;
    let is = idx.shape();
    if is != upd.shape() || is.len() != r {
        bail!("indices {is:?} and updates {:?} must have the data's rank and one shape", upd.shape());
    }
    if is.contains(&0) {
        return Ok(vec![data.clone()]);
    }
    if shape[axis] == 0 {
        bail!("indices into axis {axis}, which has no entries");
    }
    if let Some(d) = (0..r).find(|&d| d != axis && is[d] > shape[d]) {
        bail!("indices {is:?} exceed the data {shape:?} on axis {d}");
    }
    // One index array per axis: the given indices on `axis`, positions elsewhere.
    let mut indices = Vec::with_capacity(r);
    for d in 0..r {
        if d == axis {
            indices.push(wrap(ctx, idx, shape[d], d, s)?);
        } else {
            let mut pos = vec![1i64; r];
            pos[d] = is[d];
            let range = ops::reshape(&ops::arange(0.0, is[d] as f64, 1.0, Dtype::I64, s)?, &pos, s)?;
            indices.push(ops::broadcast_to(&range, &is, s)?);
        }
    }
    let mut ushape = is.clone();
    ushape.extend(std::iter::repeat_n(1, r));
    let upd = ops::reshape(&ops::astype(upd, data.dtype(), s)?, &ushape, s)?;
    let axes: Vec<i32> = (0..r as i32).collect();
    Ok(vec![ops::scatter(data, &indices, &upd, &axes, reduction(node)?, s)?])
}

ep_core::register_lowering!(
    SCATTER_ELEMENTS = FnLowering {
        domain: "",
        op: "ScatterElements",
        opsets: 11..=i32::MAX,
        claim: claim_scatter,
        lower: lower_scatter_elements,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

// The deprecated opset 9-10 form: ScatterElements without `reduction`.
ep_core::register_lowering!(
    SCATTER = FnLowering {
        domain: "",
        op: "Scatter",
        opsets: 9..=10,
        claim: claim_scatter,
        lower: lower_scatter_elements,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn lower_scatter_nd(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (data, idx, upd) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.input(2)?.clone());
    let (data, idx, upd) = (&data, &idx, &upd);
    let s = scatter_stream(ctx, data);
    let shape = data.shape();
    let is = idx.shape();
    let Some(&k) = is.last() else { bail!("indices are a scalar") };
    let k = k as usize;
    let batch = &is[..is.len() - 1];
    if k > shape.len() || k == 0 {
        bail!("index depth {k} does not fit data of rank {}", shape.len());
    }
    let mut expected = batch.to_vec();
    expected.extend(&shape[k..]);
    if upd.shape() != expected {
        bail!("updates {:?} must have shape {expected:?} (indices {is:?}, data {shape:?})", upd.shape());
    }
    if batch.contains(&0) {
        return Ok(vec![data.clone()]);
    }
    if shape[..k].contains(&0) {
        bail!("indices into data {shape:?}, whose indexed dimensions include an empty one");
    }
    let idx = ops::astype(idx, Dtype::I64, s)?;
    let parts = ops::split_at(&idx, &(1..k as i64).collect::<Vec<_>>(), is.len() as i32 - 1, s)?;
    let mut indices = Vec::with_capacity(k);
    for (j, p) in parts.iter().enumerate() {
        indices.push(wrap(ctx, &ops::reshape(p, batch, s)?, shape[j], j, s)?);
    }
    let mut ushape = batch.to_vec();
    ushape.extend(std::iter::repeat_n(1, k));
    ushape.extend(&shape[k..]);
    let upd = ops::reshape(&ops::astype(upd, data.dtype(), s)?, &ushape, s)?;
    let axes: Vec<i32> = (0..k as i32).collect();
    Ok(vec![ops::scatter(data, &indices, &upd, &axes, reduction(node)?, s)?])
}

ep_core::register_lowering!(
    SCATTER_ND = FnLowering {
        domain: "",
        op: "ScatterND",
        opsets: 11..=i32::MAX,
        claim: claim_scatter,
        lower: lower_scatter_nd,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    const REDUCTIONS: &[&str] = &["none", "add", "mul", "max", "min"];

    fn reduction_at(v: u32, pick: usize) -> Option<&'static str> {
        // add/mul from opset 16, max/min from 18.
        let r = REDUCTIONS[pick % REDUCTIONS.len()];
        match r {
            "none" => None,
            "add" | "mul" if v >= 16 => Some(r),
            "max" | "min" if v >= 18 => Some(r),
            _ => None,
        }
    }

    register_spec!(super::SCATTER_ELEMENTS, || scatter_elements("ScatterElements", 13..=22));
    register_spec!(super::SCATTER, || scatter_elements("Scatter", 9..=10));

    fn scatter_elements(op: &'static str, versions: std::ops::RangeInclusive<u32>) -> BoxedStrategy<Case> {
        (
            select(&[DType::F32, DType::I64][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            0..5usize,
            opset(versions),
            seed(),
        )
            .prop_map(move |(t, s, pick, red, v, seed)| {
                let axis = pick.index(s.len());
                let reduction = reduction_at(v, red);
                // Distinct targets along the axis for each position (a rotation), so even
                // reduction="none" is defined; some negative.
                let mut is = s.clone();
                is[axis] = (s[axis] / 2).max(1);
                let n: i64 = is.iter().product();
                let inner: i64 = is[axis + 1..].iter().product();
                let data: Vec<f64> = (0..n)
                    .map(|e| {
                        let along = (e / inner) % is[axis];
                        let t = (along + seed as i64) % s[axis];
                        if (e + seed as i64) % 3 == 0 { (t - s[axis]) as f64 } else { t as f64 }
                    })
                    .collect();
                let case = Case::op(op, v)
                    .input("x", t, &s)
                    .input_with("idx", DType::I64, &is, Values::Data(data))
                    .input("upd", t, &is)
                    .attr_int("axis", axis as i64);
                let case = match reduction {
                    Some(r) => case.attr_str("reduction", r),
                    None => case,
                };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::SCATTER_ND, || {
        (select(&[DType::F32, DType::I64][..]), nonempty_shape(1..=3), 1..=3usize, 0..5usize, opset(13..=22), seed())
            .prop_map(|(t, s, k, red, v, seed)| {
                let k = k.min(s.len());
                let reduction = reduction_at(v, red);
                // Distinct target cells: the first `m` cells of the indexed block, rotated.
                let cells: i64 = s[..k].iter().product();
                let m = (cells / 2).max(1);
                let mut data = Vec::new();
                for j in 0..m {
                    let mut c = (j + seed as i64) % cells;
                    let mut coord = vec![0i64; k];
                    for d in (0..k).rev() {
                        coord[d] = c % s[d];
                        c /= s[d];
                    }
                    data.extend(coord.iter().map(|&x| x as f64));
                }
                let mut ushape = vec![m];
                ushape.extend(&s[k..]);
                let case = Case::op("ScatterND", v)
                    .input("x", t, &s)
                    .input_with("idx", DType::I64, &[m, k as i64], Values::Data(data))
                    .input("upd", t, &ushape);
                let case = match reduction {
                    Some(r) => case.attr_str("reduction", r),
                    None => case,
                };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    });
}
