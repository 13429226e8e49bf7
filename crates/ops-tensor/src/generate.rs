//! Tensors made from attributes and scalars: ConstantOfShape, Range, EyeLike, OneHot. (ORT turns
//! Constant nodes into initializers before an EP sees the graph, so Constant needs no lowering.)

use ep_core::lowering::{ALL_TYPES, FnLowering, NUMERIC, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, TensorData, bail};

fn tensor_array(t: &TensorData) -> Result<Array> {
    let dtype = t.elem_type.to_mlx().ok_or_else(|| Error::new(format!("tensor of type {:?}", t.elem_type)))?;
    Ok(Array::from_bytes(&t.bytes, &t.shape, dtype)?)
}

fn claim_constant_of_shape(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::I64])?;
    match node.attr_tensor("value")? {
        Some(t) if t.elem_type.to_mlx().is_none() => Err(Decline(format!("value of type {:?}", t.elem_type))),
        _ => Ok(()),
    }
}

fn lower_constant_of_shape(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let shape = ctx.host_i64(0)?;
    let value = match node.attr_tensor("value")? {
        Some(t) => ops::reshape(&tensor_array(t)?, &[], ctx.stream())?,
        None => Array::scalar_f32(0.0),
    };
    let dtype = value.dtype();
    ep_core::lowering::check_shape(&shape, dtype)?;
    Ok(vec![ops::full(&shape, &value, dtype, ctx.stream_for(dtype))?])
}

ep_core::register_lowering!(
    CONSTANT_OF_SHAPE = FnLowering {
        domain: "",
        op: "ConstantOfShape",
        opsets: 9..=i32::MAX,
        claim: claim_constant_of_shape,
        lower: lower_constant_of_shape,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

const RANGE_TYPES: &[ElemType] = &[ElemType::F32, ElemType::F64, ElemType::I16, ElemType::I32, ElemType::I64];

fn claim_range(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    ep_core::lowering::require_types(node, RANGE_TYPES)
}

fn lower_range(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let dtype = ctx.input(0)?.dtype();
    for i in 0..3 {
        // A scalar or a one-element vector, as ORT's CPU EP requires.
        let a = ctx.input(i)?;
        if a.ndim() > 1 || a.size() != 1 {
            bail!("input {i} of Range must be a scalar, not of shape {:?}", a.shape());
        }
    }
    let read = |i: usize| -> Result<f64> {
        ctx.host_f64(i)?.first().copied().ok_or_else(|| Error::new(format!("input {i} of Range is empty")))
    };
    let (start, limit, delta) = (read(0)?, read(1)?, read(2)?);
    if delta == 0.0 {
        bail!("Range with delta 0");
    }
    // (Checked before clamping: `max` would turn a NaN into 0.)
    let count = ((limit - start) / delta).ceil();
    if !count.is_finite() {
        bail!("the number of elements ({count}) of Range({start}, {limit}, {delta}) is not finite");
    }
    let n = count.max(0.0) as i64;
    // The positions are counted in int64 first.
    ep_core::lowering::check_shape(&[n], Dtype::I64)?;
    // start + i * delta, computed in the input type as ONNX does.
    let s = ctx.stream_for(dtype);
    let i = ops::astype(&ops::arange(0.0, n as f64, 1.0, Dtype::I64, s)?, dtype, s)?;
    let delta = ops::scalar(delta, dtype, ctx.cpu_stream())?;
    let start = ops::scalar(start, dtype, ctx.cpu_stream())?;
    Ok(vec![ops::add(&start, &ops::multiply(&i, &delta, s)?, s)?])
}

ep_core::register_lowering!(
    RANGE = FnLowering {
        domain: "",
        op: "Range",
        opsets: 11..=i32::MAX,
        claim: claim_range,
        lower: lower_range,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

// ORT's earlier form, the same op.
ep_core::register_lowering!(
    MS_RANGE = FnLowering {
        domain: "com.microsoft",
        op: "Range",
        opsets: 1..=i32::MAX,
        claim: claim_range,
        lower: lower_range,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_eye_like(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    ep_core::lowering::require_types(node, ALL_TYPES)?;
    if ep_core::lowering::input_rank(node, 0).is_some_and(|r| r != 2) {
        return Err(Decline::new("EyeLike needs a 2-D input"));
    }
    Ok(())
}

fn lower_eye_like(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let k = node.attr_int("k", 0)?;
    let dtype = match node.attr("dtype") {
        Some(AttrValue::Int(t)) => {
            ElemType::from_tensor_proto(*t as i32).to_mlx().ok_or("EyeLike dtype has no MLX type")?
        }
        _ => x.dtype(),
    };
    let s = ctx.stream_for(dtype);
    if shape.contains(&0) {
        // (No index ranges for an empty result: one of them may be 2^31 - 1 long.)
        return Ok(vec![ops::full(&shape, &ops::scalar(0.0, dtype, s)?, dtype, s)?]);
    }
    let rows = ops::reshape(&ops::arange(0.0, shape[0] as f64, 1.0, Dtype::I64, s)?, &[shape[0], 1], s)?;
    let cols = ops::arange(0.0, shape[1] as f64, 1.0, Dtype::I64, s)?;
    let diag = ops::equal(&ops::add(&rows, &ops::scalar(k as f64, Dtype::I64, s)?, s)?, &cols, s)?;
    Ok(vec![ops::astype(&diag, dtype, s)?])
}

ep_core::register_lowering!(
    EYE_LIKE = FnLowering {
        domain: "",
        op: "EyeLike",
        opsets: 9..=i32::MAX,
        claim: claim_eye_like,
        lower: lower_eye_like,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_one_hot(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    require_input_type(node, 0, NUMERIC)?;
    require_input_type(node, 1, NUMERIC)?;
    require_input_type(node, 2, ALL_TYPES)
}

fn lower_one_hot(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let ind = ops::astype(&ops::trunc(&ops::astype(ctx.input(0)?, Dtype::F32, s)?, s)?, Dtype::I64, s)?;
    let depth = ctx.host_f64(1)?.first().copied().ok_or("depth is empty")?;
    if depth.is_nan() || depth < 1.0 {
        bail!("depth {depth} is not positive");
    }
    let depth = depth as i64;
    let values = ctx.input(2)?;
    let mut out = ind.shape();
    out.push(depth);
    ep_core::lowering::check_shape(&out, values.dtype())?;
    let r = ind.ndim();
    let axis = normalize_axis(node.attr_int("axis", -1)?, r + 1)?;
    if out.contains(&0) {
        // An empty result: no class range is built (depth may be 2^31 - 1, the range alone
        // gigabytes).
        let mut shape = ind.shape();
        shape.insert(axis, depth);
        return Ok(vec![ops::full(&shape, &ops::scalar(0.0, values.dtype(), s)?, values.dtype(), s)?]);
    }
    let dim = ops::scalar(depth as f64, Dtype::I64, s)?;
    let zero = ops::scalar(0.0, Dtype::I64, s)?;
    let ind = ops::where_(&ops::less(&ind, &zero, s)?, &ops::add(&ind, &dim, s)?, &ind, s)?;
    let ind = ops::expand_dims(&ind, axis as i32, s)?;
    let mut pos = vec![1i64; r + 1];
    pos[axis] = depth;
    let classes = ops::reshape(&ops::arange(0.0, depth as f64, 1.0, Dtype::I64, s)?, &pos, s)?;
    let hot = ops::equal(&ind, &classes, s)?;
    let off = ops::slice(values, &[0], &[1], s)?;
    let on = ops::slice(values, &[1], &[2], s)?;
    let (off, on) = (ops::reshape(&off, &[], s)?, ops::reshape(&on, &[], s)?);
    Ok(vec![ops::where_(&hot, &on, &off, s)?])
}

ep_core::register_lowering!(
    ONE_HOT = FnLowering {
        domain: "",
        op: "OneHot",
        opsets: 9..=i32::MAX,
        claim: claim_one_hot,
        lower: lower_one_hot,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::CONSTANT_OF_SHAPE, || {
        (shape(0..=4), opset(9..=22))
            .prop_map(|(s, v)| {
                let n = s.len() as i64;
                Case::op("ConstantOfShape", v)
                    .input_with("shape", DType::I64, &[n], Values::Data(s.iter().map(|&d| d as f64).collect()))
                    .output("y", DType::F32, &s)
            })
            .boxed()
    });

    register_spec!(super::RANGE, || {
        (
            select(&[DType::F32, DType::I64, DType::I32][..]),
            -8..8i64,
            -8..8i64,
            prop_oneof![1..=3i64, -3..=-1i64],
            opset(11..=22),
        )
            .prop_map(|(t, start, limit, delta, v)| {
                let (start, limit, delta) = if t == DType::F32 {
                    (start as f64 * 0.75, limit as f64 * 0.5, delta as f64 * 0.75)
                } else {
                    (start as f64, limit as f64, delta as f64)
                };
                let n = ((limit - start) / delta).ceil().max(0.0) as i64;
                let scalar = |x: f64| Values::Data(vec![x]);
                // Runtime inputs: ORT folds a Range of constants before an EP sees it.
                Case::op("Range", v)
                    .input_with("start", t, &[], scalar(start))
                    .input_with("limit", t, &[], scalar(limit))
                    .input_with("delta", t, &[], scalar(delta))
                    .output("y", t, &[n])
            })
            .boxed()
    });

    register_spec!(super::MS_RANGE, || {
        (select(&[DType::F32, DType::I64, DType::I32][..]), -8..8i64, -8..8i64, prop_oneof![1..=3i64, -3..=-1i64])
            .prop_map(|(t, start, limit, delta)| {
                let (start, limit, delta) = (start as f64, limit as f64, delta as f64);
                let n = ((limit - start) / delta).ceil().max(0.0) as i64;
                let scalar = |x: f64| Values::Data(vec![x]);
                Case::domain_op("com.microsoft", "Range", 1)
                    .input_with("start", t, &[], scalar(start))
                    .input_with("limit", t, &[], scalar(limit))
                    .input_with("delta", t, &[], scalar(delta))
                    .output("y", t, &[n])
            })
            .boxed()
    });

    register_spec!(super::EYE_LIKE, || {
        (
            select(&[DType::F32, DType::F64, DType::I32, DType::I64][..]),
            1..=5i64,
            1..=5i64,
            -3..=3i64,
            any::<bool>(),
            opset(9..=22),
            seed(),
        )
            .prop_map(|(t, r, c, k, cast, v, seed)| {
                let case = Case::op("EyeLike", v).input("x", t, &[r, c]).attr_int("k", k);
                let (case, out) =
                    if cast { (case.attr_int("dtype", DType::F32.onnx_code()), DType::F32) } else { (case, t) };
                case.output("y", out, &[r, c]).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::ONE_HOT, || {
        (
            shape(1..=2),
            1..=5i64,
            any::<prop::sample::Index>(),
            select(&[DType::F32, DType::I64][..]),
            opset(11..=22),
            seed(),
        )
            .prop_map(|(s, depth, pick, t, v, seed)| {
                let r = s.len();
                let axis = pick.index(r + 1) as i64 - (r as i64 + 1) * (pick.index(2) as i64);
                let a = if axis < 0 { axis + r as i64 + 1 } else { axis } as usize;
                let mut out = s.clone();
                out.insert(a, depth);
                Case::op("OneHot", v)
                    .input_with("indices", DType::I64, &s, Values::Uniform { lo: -(depth as f64), hi: depth as f64 })
                    .constant("depth", DType::I64, &[], Values::Data(vec![depth as f64]))
                    .constant("values", t, &[2], Values::Data(vec![-2.0, 5.0]))
                    .attr_int("axis", axis)
                    .output("y", t, &out)
                    .with_seed(seed)
            })
            .boxed()
    });
}
