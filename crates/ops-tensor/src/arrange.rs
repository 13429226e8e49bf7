//! Orderings and rearrangements: Trilu, CumSum, CumProd, ArgMax, ArgMin, TopK, DepthToSpace,
//! SpaceToDepth.

use ep_core::lowering::{
    ALL_TYPES, FnLowering, NUMERIC, normalize_axis, require_attr_in, require_input_type, require_inputs,
};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_trilu(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 2)?;
    require_input_type(node, 0, ALL_TYPES)?;
    require_input_type(node, 1, &[ElemType::I64])?;
    if ep_core::lowering::input_rank(node, 0).is_some_and(|r| r < 2) {
        return Err(Decline::new("Trilu needs rank 2 or more"));
    }
    Ok(())
}

fn lower_trilu(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let k = if ctx.optional_input(1).is_some() { ctx.host_i64(1)?.first().copied().unwrap_or(0) } else { 0 };
    let shape = x.shape();
    let (n, m) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let k = k.clamp(-n - 1, m + 1) as i32;
    let s = ctx.stream();
    // A mask instead of MLX's tril/triu, which take float inputs only.
    let rows = ops::reshape(&ops::arange(0.0, n as f64, 1.0, Dtype::I64, s)?, &[n, 1], s)?;
    let cols = ops::reshape(&ops::arange(0.0, m as f64, 1.0, Dtype::I64, s)?, &[1, m], s)?;
    let diff = ops::subtract(&cols, &rows, s)?;
    let kk = ops::scalar(k as f64, Dtype::I64, s)?;
    // Any value other than 0 means upper, as ORT's CPU EP reads it.
    let keep = if node.attr_int("upper", 1)? != 0 {
        ops::greater_equal(&diff, &kk, s)?
    } else {
        ops::less_equal(&diff, &kk, s)?
    };
    let zero = ops::scalar(0.0, x.dtype(), s)?;
    Ok(vec![ops::where_(&keep, x, &zero, s)?])
}

ep_core::register_lowering!(
    TRILU = FnLowering {
        domain: "",
        op: "Trilu",
        opsets: 14..=i32::MAX,
        claim: claim_trilu,
        lower: lower_trilu,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

// ORT's earlier form, the same op.
ep_core::register_lowering!(
    MS_TRILU = FnLowering {
        domain: "com.microsoft",
        op: "Trilu",
        opsets: 1..=i32::MAX,
        claim: claim_trilu,
        lower: lower_trilu,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

const CUMSUM_TYPES: &[ElemType] = &[
    ElemType::F32,
    ElemType::F16,
    ElemType::BF16,
    ElemType::F64,
    ElemType::I32,
    ElemType::I64,
    ElemType::U32,
    ElemType::U64,
];

fn claim_cumsum(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, CUMSUM_TYPES)?;
    require_input_type(node, 1, &[ElemType::I32, ElemType::I64])?;
    // ORT's CPU EP refuses any other value when it creates the kernel.
    require_attr_in(node, "exclusive", 0, &[0, 1])?;
    require_attr_in(node, "reverse", 0, &[0, 1])?;
    Ok(())
}

fn lower_cumsum(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    cumulative(ctx, node, false)
}

/// CumSum or CumProd along the axis input, `exclusive` and `reverse` as ONNX defines them.
fn cumulative(ctx: &mut LowerCtx<'_>, node: &NodeInfo, product: bool) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let axis = match ctx.host_i64(1)?[..] {
        [a] => a,
        ref other => bail!("the axis input must hold exactly one value, not {other:?}"),
    };
    let axis = normalize_axis(axis, x.ndim())?;
    let exclusive = node.attr_int("exclusive", 0)? == 1;
    let reverse = node.attr_int("reverse", 0)? == 1;
    let s = ctx.stream_for(x.dtype());
    if x.size() == 0 {
        // Nothing to accumulate (MLX's scan divides by the axis size).
        return Ok(vec![x.clone()]);
    }
    let y = ops::cumulative(x, axis as i32, product, reverse, !exclusive, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?])
}

ep_core::register_lowering!(
    CUMSUM = FnLowering {
        domain: "",
        op: "CumSum",
        opsets: 11..=i32::MAX,
        claim: claim_cumsum,
        lower: lower_cumsum,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    CUMPROD = FnLowering {
        domain: "",
        op: "CumProd",
        opsets: 26..=i32::MAX,
        claim: claim_cumsum,
        lower: |ctx, node| cumulative(ctx, node, true),
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_arg(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, NUMERIC)
}

fn lower_arg(ctx: &mut LowerCtx<'_>, node: &NodeInfo, max: bool) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let raw_axis = node.attr_int("axis", 0)?;
    if x.size() == 0 && raw_axis < 0 {
        // As ORT's CPU EP answers an input without elements: a negative axis reduces nothing.
        return Ok(vec![ops::full(&shape, &ops::scalar(0.0, Dtype::I64, ctx.stream())?, Dtype::I64, ctx.stream())?]);
    }
    let axis = normalize_axis(raw_axis, shape.len())?;
    let keep = node.attr_int("keepdims", 1)? == 1;
    // Any value other than 0 selects the last index, as ORT's CPU EP reads it.
    let last = node.attr_int("select_last_index", 0)? != 0;
    let s = ctx.stream_for(x.dtype());
    if x.size() == 0 {
        if shape[axis] == 0 {
            bail!("axis {axis} of {shape:?} is empty: it has no extreme");
        }
        let mut out = shape.clone();
        if keep {
            out[axis] = 1
        } else {
            out.remove(axis);
        };
        return Ok(vec![ops::full(&out, &ops::scalar(0.0, Dtype::I64, s)?, Dtype::I64, s)?]);
    }
    let arg = |a: &Array| {
        if max { ops::argmax_axis(a, axis as i32, keep, s) } else { ops::argmin_axis(a, axis as i32, keep, s) }
    };
    // The last extreme is the first one of the reversed axis.
    let n = shape[axis];
    let last_arg = |a: &Array| -> Result<Array> {
        let rev = Array::from_slice(&(0..n).rev().collect::<Vec<i64>>(), &[n])?;
        let i = ops::astype(&arg(&ops::take(a, &rev, axis as i32, s)?)?, Dtype::I64, s)?;
        Ok(ops::subtract(&ops::scalar((n - 1) as f64, Dtype::I64, s)?, &i, s)?)
    };
    let plain = |a: &Array| -> Result<Array> { if last { last_arg(a) } else { Ok(arg(a)?) } };
    let idx = if x.dtype().is_float() && n > 1 {
        // NaN as ORT's CPU EP takes it: a 1-D input answers its first NaN (first index only);
        // otherwise a NaN is passed over unless it comes first (then index 0 is the answer).
        let nan = ops::isnan(x, s)?;
        let a = axis as i32;
        let (pick, first) = if shape.len() == 1 && !last {
            (ops::argmax_axis(&nan, a, keep, s)?, ops::max_axes(&ops::astype(&nan, Dtype::U8, s)?, &[a], keep, s)?)
        } else {
            let mut out = shape.clone();
            if keep {
                out[axis] = 1;
            } else {
                out.remove(axis);
            }
            let lead = ops::take(&nan, &Array::from_slice(&[0i64], &[1])?, a, s)?;
            let lead = ops::reshape(&ops::astype(&lead, Dtype::U8, s)?, &out, s)?;
            (ops::full(&out, &ops::scalar(0.0, Dtype::I64, s)?, Dtype::I64, s)?, lead)
        };
        let skip = if max { f64::NEG_INFINITY } else { f64::INFINITY };
        let rest = ops::astype(&plain(&ops::where_(&nan, &ops::scalar(skip, x.dtype(), s)?, x, s)?)?, Dtype::I64, s)?;
        ops::where_(&ops::astype(&first, Dtype::Bool, s)?, &ops::astype(&pick, Dtype::I64, s)?, &rest, s)?
    } else {
        plain(x)?
    };
    Ok(vec![ops::astype(&idx, Dtype::I64, s)?])
}

ep_core::register_lowering!(
    ARGMAX = FnLowering {
        domain: "",
        op: "ArgMax",
        opsets: 1..=i32::MAX,
        claim: claim_arg,
        lower: |ctx, node| lower_arg(ctx, node, true),
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    ARGMIN = FnLowering {
        domain: "",
        op: "ArgMin",
        opsets: 1..=i32::MAX,
        claim: claim_arg,
        lower: |ctx, node| lower_arg(ctx, node, false),
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

const TOPK_TYPES: &[ElemType] =
    &[ElemType::F32, ElemType::F16, ElemType::BF16, ElemType::F64, ElemType::I32, ElemType::I64];

fn claim_topk(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 2)?;
    require_input_type(node, 0, TOPK_TYPES)?;
    require_input_type(node, 1, &[ElemType::I64])?;
    if node.attr_int("sorted", 1)? != 1 {
        return Err(Decline::new("TopK with sorted=0 (unspecified order) is left to the CPU EP"));
    }
    Ok(())
}

fn lower_topk(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let axis = normalize_axis(node.attr_int("axis", -1)?, shape.len())?;
    let k = if node.since_version >= 10 {
        match (ctx.input(1)?.ndim(), &ctx.host_i64(1)?[..]) {
            (1, &[k]) => k,
            (_, other) => bail!("k must be a 1-D tensor of one value, not {other:?}"),
        }
    } else {
        node.attr_int("k", 1)?
    };
    // ORT's CPU EP reads k as a 32-bit integer (its low 32 bits: 2^40 is 0).
    let k = k as i32 as i64;
    if k < 0 || k > shape[axis] {
        bail!("k = {k} is out of range for axis of size {}", shape[axis]);
    }
    let largest = node.attr_int("largest", 1)? == 1;
    let s = ctx.stream_for(x.dtype());
    let mut hi = shape.clone();
    hi[axis] = k;
    if hi.contains(&0) {
        // An empty result (MLX's sort divides by the axis size, which may be 0).
        let values = ops::full(&hi, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?;
        let indices = ops::full(&hi, &ops::scalar(0.0, Dtype::I64, s)?, Dtype::I64, s)?;
        return Ok(vec![values, indices]);
    }
    // A stable sort keeps equal values in index order, as ORT's TopK does.
    let key = if largest { ops::negative(x, s)? } else { x.clone() };
    let order = ops::argsort_axis(&key, axis as i32, s)?;
    let idx = ops::slice(&order, &vec![0; shape.len()], &hi, s)?;
    let values = ops::take_along_axis(x, &idx, axis as i32, s)?;
    Ok(vec![values, ops::astype(&idx, Dtype::I64, s)?])
}

ep_core::register_lowering!(
    TOPK = FnLowering {
        domain: "",
        op: "TopK",
        opsets: 1..=i32::MAX,
        claim: claim_topk,
        lower: lower_topk,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_space(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, ALL_TYPES)?;
    if ep_core::lowering::input_rank(node, 0).is_some_and(|r| r != 4) {
        return Err(Decline::new("needs a 4-D input"));
    }
    if node.attr_int("blocksize", 0)? < 1 {
        return Err(Decline::new("blocksize must be positive"));
    }
    // ORT's CPU EP refuses any mode but these when the session is created.
    match node.attr("mode") {
        None => Ok(()),
        Some(ep_core::AttrValue::String(m)) if m == "DCR" || m == "CRD" => Ok(()),
        Some(m) => Err(Decline(format!("mode {m:?} is neither DCR nor CRD"))),
    }
}

fn lower_depth_to_space(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let sh = x.shape();
    let (n, c, h, w) = (sh[0], sh[1], sh[2], sh[3]);
    let b = node.attr_int("blocksize", 1)?;
    let crd = matches!(node.attr("mode"), Some(ep_core::AttrValue::String(m)) if m == "CRD");
    let s = ctx.stream();
    let (split, perm): (Vec<i64>, [i32; 6]) = if crd {
        (vec![n, c / (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3])
    } else {
        (vec![n, b, b, c / (b * b), h, w], [0, 3, 4, 1, 5, 2])
    };
    let t = ops::transpose_axes(&ops::reshape(x, &split, s)?, &perm, s)?;
    Ok(vec![ops::reshape(&t, &[n, c / (b * b), h * b, w * b], s)?])
}

ep_core::register_lowering!(
    DEPTH_TO_SPACE = FnLowering {
        domain: "",
        op: "DepthToSpace",
        opsets: 1..=i32::MAX,
        claim: claim_space,
        lower: lower_depth_to_space,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn lower_space_to_depth(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let sh = x.shape();
    let (n, c, h, w) = (sh[0], sh[1], sh[2], sh[3]);
    let b = node.attr_int("blocksize", 1)?;
    let s = ctx.stream();
    let t = ops::reshape(x, &[n, c, h / b, b, w / b, b], s)?;
    let t = ops::transpose_axes(&t, &[0, 3, 5, 1, 2, 4], s)?;
    Ok(vec![ops::reshape(&t, &[n, c * b * b, h / b, w / b], s)?])
}

ep_core::register_lowering!(
    SPACE_TO_DEPTH = FnLowering {
        domain: "",
        op: "SpaceToDepth",
        opsets: 1..=i32::MAX,
        claim: claim_space,
        lower: lower_space_to_depth,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::TRILU, || {
        (
            select(&[DType::F32, DType::F64, DType::I64][..]),
            shape(0..=1),
            nonempty_shape(2..=2),
            -4..=4i64,
            any::<(bool, bool)>(),
            opset(14..=22),
            seed(),
        )
            .prop_map(|(t, b, m, k, (upper, with_k), v, seed)| {
                let s = [b, m].concat();
                let case = Case::op("Trilu", v).input("x", t, &s);
                let case =
                    if with_k { case.constant("k", DType::I64, &[], Values::Data(vec![k as f64])) } else { case };
                case.attr_int("upper", upper as i64).output("y", t, &s).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::MS_TRILU, || {
        (
            select(&[DType::F32, DType::F64, DType::I64][..]),
            shape(0..=1),
            nonempty_shape(2..=2),
            -4..=4i64,
            any::<(bool, bool)>(),
            seed(),
        )
            .prop_map(|(t, b, m, k, (upper, with_k), seed)| {
                let s = [b, m].concat();
                let case = Case::domain_op("com.microsoft", "Trilu", 1).input("x", t, &s);
                let case =
                    if with_k { case.constant("k", DType::I64, &[], Values::Data(vec![k as f64])) } else { case };
                case.attr_int("upper", upper as i64).output("y", t, &s).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::CUMPROD, || {
        (
            select(&[DType::F32, DType::I64][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            any::<(bool, bool)>(),
            seed(),
        )
            .prop_map(|(t, s, pick, (exclusive, reverse), seed)| {
                let axis = pick.index(s.len()) as i64;
                Case::op("CumProd", 26)
                    .input_with("x", t, &s, Values::Uniform { lo: -2.0, hi: 3.0 })
                    .constant("axis", DType::I64, &[], Values::Data(vec![axis as f64]))
                    .attr_int("exclusive", exclusive as i64)
                    .attr_int("reverse", reverse as i64)
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::CUMSUM, || {
        (
            select(&[DType::F32, DType::F64, DType::I32, DType::I64][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            any::<(bool, bool)>(),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(t, s, pick, (exclusive, reverse), v, seed)| {
                let axis = pick.index(2 * s.len()) as i64 - s.len() as i64;
                Case::op("CumSum", v)
                    .input("x", t, &s)
                    .constant("axis", DType::I64, &[], Values::Data(vec![axis as f64]))
                    .attr_int("exclusive", exclusive as i64)
                    .attr_int("reverse", reverse as i64)
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    fn arg(op: &'static str) -> BoxedStrategy<Case> {
        (
            select(&[DType::F32, DType::I32, DType::I64][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            any::<(bool, bool)>(),
            opset(11..=22),
            seed(),
        )
            .prop_map(move |(t, s, pick, (keep, last), v, seed)| {
                let axis = pick.index(s.len());
                let mut out = s.clone();
                if keep {
                    out[axis] = 1;
                } else {
                    out.remove(axis);
                }
                // Few distinct values, so ties (and select_last_index) matter.
                let case = Case::op(op, v)
                    .input_with("x", t, &s, Values::Uniform { lo: -3.0, hi: 3.0 })
                    .attr_int("axis", axis as i64)
                    .attr_int("keepdims", keep as i64);
                let case = if v >= 12 { case.attr_int("select_last_index", last as i64) } else { case };
                case.output("y", DType::I64, &out).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::ARGMAX, || arg("ArgMax"));
    register_spec!(super::ARGMIN, || arg("ArgMin"));

    register_spec!(super::TOPK, || {
        (
            select(&[DType::F32, DType::I64][..]),
            nonempty_shape(1..=3),
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            any::<bool>(),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(t, s, pick, kpick, largest, v, seed)| {
                let axis = pick.index(s.len());
                let k = kpick.index(s[axis] as usize + 1) as i64;
                let mut out = s.clone();
                out[axis] = k;
                // Distinct values: the order of ties is not part of TopK's definition.
                let n: i64 = s.iter().product();
                let mut data: Vec<f64> = (0..n).map(|i| i as f64 * 1.5 - n as f64).collect();
                let mut h = seed;
                for i in (1..data.len()).rev() {
                    h = h.wrapping_mul(6364136223846793005).wrapping_add(1);
                    data.swap(i, (h >> 33) as usize % (i + 1));
                }
                Case::op("TopK", v)
                    .input_with("x", t, &s, Values::Data(data))
                    .constant_i64("k", &[k])
                    .attr_int("axis", axis as i64)
                    .attr_int("largest", largest as i64)
                    .output("values", t, &out)
                    .output("indices", DType::I64, &out)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::DEPTH_TO_SPACE, || {
        (
            select(&[DType::F32, DType::F64][..]),
            1..=2i64,
            1..=3i64,
            1..=2i64,
            1..=3i64,
            1..=3i64,
            any::<bool>(),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(t, n, c, b, h, w, crd, v, seed)| {
                Case::op("DepthToSpace", v)
                    .input("x", t, &[n, c * b * b, h, w])
                    .attr_int("blocksize", b)
                    .attr_str("mode", if crd { "CRD" } else { "DCR" })
                    .output("y", t, &[n, c, h * b, w * b])
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::SPACE_TO_DEPTH, || {
        (select(&[DType::F32, DType::F64][..]), 1..=2i64, 1..=3i64, 1..=2i64, 1..=3i64, 1..=3i64, opset(7..=22), seed())
            .prop_map(|(t, n, c, b, h, w, v, seed)| {
                Case::op("SpaceToDepth", v)
                    .input("x", t, &[n, c, h * b, w * b])
                    .attr_int("blocksize", b)
                    .output("y", t, &[n, c * b * b, h, w])
                    .with_seed(seed)
            })
            .boxed()
    });
}
