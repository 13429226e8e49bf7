//! The ONNX quantization ops: DequantizeLinear and QuantizeLinear (per tensor, per axis,
//! blocked, to and from the integer, float8 and float4 types; `com.microsoft`'s earlier forms too,
//! integers only) and DynamicQuantizeLinear. (MatMulInteger and QLinearMatMul:
//! `integer_matmul.rs`.)
//!
//! Rounding is half to even, as ORT's kernels do.

use ep_core::float4;
use ep_core::float8::{self, Float8};
use ep_core::graph::ElemType;
use ep_core::lowering::{FnLowering, TakesFloat8, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::dynamic_uint8;
use ep_core::{CompileSafety, Decline, Error, LowerCtx, NodeInfo, Result, bail};

const FLOAT: &[ElemType] = &[ElemType::F32, ElemType::F16, ElemType::BF16];

/// The 8-bit integer types of the quantized matrix and elementwise ops.
pub(crate) const Q8: &[ElemType] = &[ElemType::I8, ElemType::U8];

/// A scale or zero point that must hold one value (a scalar or a vector of one element, as
/// ORT's CPU EP requires), as a float32 scalar.
pub(crate) fn one_value(a: &Array, what: &str, s: &Stream) -> Result<Array> {
    if a.size() != 1 || a.ndim() > 1 {
        bail!("{what} of shape {:?} must be a scalar or a vector of one element", a.shape());
    }
    Ok(ops::reshape(&f32(a, s)?, &[], s)?)
}

fn f32(a: &Array, s: &Stream) -> Result<Array> {
    Ok(ops::astype(a, Dtype::F32, s)?)
}

/// `param` (a scale or zero point: a scalar, a 1-D per-axis vector, or a blocked tensor of
/// `x`'s rank) shaped to broadcast against `x`: per-axis vectors along `axis`, blocks repeated
/// `block` times along `axis` and cut to `x`'s length.
fn broadcast_param(param: &Array, x: &[i64], axis: usize, block: i64, s: &Stream) -> Result<Array> {
    let ps = param.shape();
    if param.size() == 1 && block == 0 {
        return Ok(ops::reshape(param, &[], s)?);
    }
    if block == 0 {
        if ps.len() != 1 || ps[0] != x[axis] {
            bail!("a per-axis parameter of shape {ps:?} does not match dimension {axis} of {x:?}");
        }
        let mut shape = vec![1; x.len()];
        shape[axis] = x[axis];
        return Ok(ops::reshape(param, &shape, s)?);
    }
    // As ORT's CPU EP: exactly ceil(x / block) blocks along the axis, no more. (Written so
    // that a block size near 2^63 cannot overflow.)
    let blocks = if x[axis] == 0 { 0 } else { (x[axis] - 1) / block + 1 };
    if ps.len() != x.len() || (0..x.len()).any(|d| d != axis && ps[d] != x[d]) || ps[axis] != blocks {
        bail!("blocked parameter {ps:?} does not hold ceil({x:?} / {block}) blocks along axis {axis}");
    }
    // A block longer than the axis is the axis: one block (MLX's sizes are 32-bit).
    let block = block.min(x[axis].max(1));
    let mut wide = ps.clone();
    wide.insert(axis + 1, block);
    let t = ops::broadcast_to(&ops::expand_dims(param, axis as i32 + 1, s)?, &wide, s)?;
    let mut flat = ps.clone();
    flat[axis] *= block;
    let t = ops::reshape(&t, &flat, s)?;
    if flat[axis] == x[axis] {
        return Ok(t);
    }
    let mut stop = flat;
    stop[axis] = x[axis];
    Ok(ops::slice(&t, &vec![0; x.len()], &stop, s)?)
}

/// The (axis, block size) of a Quantize/DequantizeLinear node for an input of rank `rank` and a
/// scale of shape `scale` (declared or at run time; `None` when not known).
fn layout(node: &NodeInfo, rank: usize, scale: Option<&[Option<i64>]>) -> std::result::Result<(usize, i64), String> {
    let block = node.attr_int("block_size", 0)?;
    // A per-tensor scale makes the axis irrelevant (ORT accepts any value then).
    let per_tensor = block == 0 && scale.is_some_and(|s| s.iter().all(|d| *d == Some(1)));
    let axis = if rank == 0 || per_tensor { 0 } else { normalize_axis(node.attr_int("axis", 1)?, rank)? };
    if block < 0 {
        return Err(format!("block_size {block} is negative"));
    }
    Ok((axis, block))
}

fn declared_scale(node: &NodeInfo) -> Option<&[Option<i64>]> {
    node.input(1).and_then(|v| v.shape.as_deref())
}

fn runtime_dims(a: &Array) -> Vec<Option<i64>> {
    a.shape().into_iter().map(Some).collect()
}

/// The zero point, when given, has the scale's shape (both of one element for a per-tensor
/// layout), as ORT's CPU EP requires; `None`: not known.
fn check_zero_point(scale: Option<&[Option<i64>]>, zp: Option<&[Option<i64>]>) -> std::result::Result<(), String> {
    let (Some(scale), Some(zp)) = (scale, zp) else { return Ok(()) };
    let one = |d: &[Option<i64>]| d.len() <= 1 && d.iter().all(|&d| d == Some(1));
    let same = scale.len() == zp.len() && scale.iter().zip(zp).all(|(a, b)| a.is_none() || b.is_none() || a == b);
    if !(same || (one(scale) && one(zp))) {
        let show = |d: &[Option<i64>]| d.iter().map(|d| d.map_or("?".into(), |d| d.to_string())).collect::<Vec<_>>();
        return Err(format!("the zero point {:?} does not have the scale's shape {:?}", show(zp), show(scale)));
    }
    Ok(())
}

/// [`check_zero_point`] on the declared shapes and at run time.
fn claim_zero_point(node: &NodeInfo) -> std::result::Result<(), Decline> {
    check_zero_point(declared_scale(node), node.input(2).and_then(|v| v.shape.as_deref())).map_err(Decline)
}

fn zero_point_fits(ctx: &LowerCtx<'_>) -> Result<()> {
    let zp = ctx.optional_input(2).map(runtime_dims);
    Ok(check_zero_point(Some(&runtime_dims(ctx.input(1)?)), zp.as_deref())?)
}

/// The float8 format of input or output `v`, if it is one.
fn float8_of(v: Option<&ep_core::ValueInfo>) -> Option<Float8> {
    v.and_then(|v| v.elem_type).and_then(Float8::of)
}

/// A float8 zero point must be 0 (ORT's CPU EP's rule for DequantizeLinear; ONNX leaves
/// float8 zero points unused); the claim asks it to be a constant so that this can be checked.
fn claim_float8_zero_point(node: &NodeInfo) -> std::result::Result<(), Decline> {
    match node.input(2) {
        Some(zp) if !zp.is_constant => Err(Decline::new("a float8 zero point that is not a constant")),
        _ => Ok(()),
    }
}

fn float8_zero_point_is_zero(ctx: &LowerCtx<'_>, format: Float8) -> Result<()> {
    let Some(zp) = ctx.optional_input(2) else { return Ok(()) };
    let bytes = zp.host_bytes().ok_or_else(|| Error::new("the float8 zero point is not on the host"))?;
    if bytes.iter().any(|&c| format.value(c) != 0.0) {
        bail!("a float8 zero point must be 0");
    }
    Ok(())
}

/// Whether input or output `v` is float4e2m1.
fn is_float4(v: Option<&ep_core::ValueInfo>) -> bool {
    v.and_then(|v| v.elem_type) == Some(ElemType::FLOAT4E2M1)
}

fn claim_dequantize(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 3)?;
    if float8_of(node.input(0)).is_some() {
        claim_float8_zero_point(node)?;
    } else if is_float4(node.input(0)) {
        // (Its zero point is not read, as in the `onnx` reference; ORT has no kernel.)
    } else {
        // The sub-byte integers arrive unpacked (one element per byte) from the engine.
        require_input_type(
            node,
            0,
            &[
                ElemType::I8,
                ElemType::U8,
                ElemType::I16,
                ElemType::U16,
                ElemType::I32,
                ElemType::INT4,
                ElemType::UINT4,
                ElemType::INT2,
                ElemType::UINT2,
            ],
        )?;
    }
    require_input_type(node, 1, FLOAT)?;
    if node.input(2).and_then(|v| v.elem_type) != node.input(2).and(node.input(0).and_then(|v| v.elem_type)) {
        return Err(Decline::new("the zero point's type differs from the input's"));
    }
    layout(node, ep_core::lowering::input_rank(node, 0).unwrap_or(1), declared_scale(node))?;
    claim_zero_point(node)?;
    if !node.output(0).and_then(|v| v.elem_type).is_some_and(|t| FLOAT.contains(&t)) {
        return Err(Decline::new("the output is not float32, float16 or bfloat16"));
    }
    Ok(())
}

fn lower_dequantize(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let shape = x.shape();
    let (axis, block) = layout(node, shape.len(), Some(&runtime_dims(ctx.input(1)?))).map_err(Error::new)?;
    zero_point_fits(ctx)?;
    let out = node
        .output(0)
        .and_then(|v| v.elem_type)
        .and_then(|t| t.to_mlx())
        .ok_or_else(|| Error::new("the output type is unknown"))?;
    let float4 = is_float4(node.input(0));
    let mut v = match float8_of(node.input(0)) {
        Some(format) => {
            float8_zero_point_is_zero(ctx, format)?;
            float8::decode(x, format, s)?
        }
        None if float4 => float4::decode(x, s)?,
        None => f32(x, s)?,
    };
    if let (Some(zp), None, false) = (ctx.optional_input(2), float8_of(node.input(0)), float4) {
        v = ops::subtract(&v, &broadcast_param(&f32(zp, s)?, &shape, axis, block, s)?, s)?;
    }
    let scale = broadcast_param(&f32(ctx.input(1)?, s)?, &shape, axis, block, s)?;
    let y = ops::astype(&ops::multiply(&v, &scale, s)?, out, s)?;
    // (An optimisation for the MatMul that may read it: a weight it cannot repack is simply
    // not published, and that MatMul multiplies `y`.)
    let _ = crate::affine_weight::publish(ctx, node, axis, block, out);
    Ok(vec![y])
}

/// The representable range of an output type (the sub-byte integers held as int8/uint8).
fn range_of(t: ElemType) -> Result<(f64, f64)> {
    match t {
        ElemType::INT4 => Ok((-8.0, 7.0)),
        ElemType::UINT4 => Ok((0.0, 15.0)),
        ElemType::INT2 => Ok((-2.0, 1.0)),
        ElemType::UINT2 => Ok((0.0, 3.0)),
        other => range(other.to_mlx().ok_or_else(|| Error::new(format!("{other:?} is not a quantized type")))?),
    }
}

/// The representable range of an integer type.
pub(crate) fn range(t: Dtype) -> Result<(f64, f64)> {
    Ok(match t {
        Dtype::I8 => (-128.0, 127.0),
        Dtype::U8 => (0.0, 255.0),
        Dtype::I16 => (-32768.0, 32767.0),
        Dtype::U16 => (0.0, 65535.0),
        other => bail!("{other:?} is not a quantized type"),
    })
}

/// `saturate(round(x / scale) + zero_point)` as `t` (saturating to `(lo, hi)`), in float32. As
/// ORT's CPU EP converts them, a NaN becomes `lo`, and so does an infinity when the input was a
/// half type (`half`).
pub(crate) fn quantize(
    x: &Array,
    scale: &Array,
    zp: Option<&Array>,
    t: Dtype,
    range: (f64, f64),
    s: &Stream,
) -> Result<Array> {
    quantize_from(x, scale, zp, t, range, false, s)
}

fn quantize_from(
    x: &Array,
    scale: &Array,
    zp: Option<&Array>,
    t: Dtype,
    (lo, hi): (f64, f64),
    half: bool,
    s: &Stream,
) -> Result<Array> {
    let rounded = ops::round(&ops::divide(x, scale, s)?, s)?;
    let q = match zp {
        Some(zp) => ops::add(&rounded, zp, s)?,
        None => rounded.clone(),
    };
    let (lowest, highest) = (ops::scalar(lo, Dtype::F32, s)?, ops::scalar(hi, Dtype::F32, s)?);
    // ORT's CPU EP: float32 NaN is the lowest value (infinities saturate). Its half-type path
    // converts `x / scale` to int32 before adding the zero point, so NaN, infinities and
    // quotients past 2^31 become INT_MIN, and INT_MIN plus a negative zero point wraps to the
    // top: the highest value then, the lowest otherwise.
    let (bad, wrapped) = if half {
        let inside = ops::less(&ops::abs(&rounded, s)?, &ops::scalar(2147483648.0, Dtype::F32, s)?, s)?;
        let wrapped = match zp {
            Some(zp) => ops::where_(&ops::less(zp, &ops::scalar(0.0, Dtype::F32, s)?, s)?, &highest, &lowest, s)?,
            None => lowest.clone(),
        };
        (ops::logical_not(&inside, s)?, wrapped)
    } else {
        (ops::isnan(&q, s)?, lowest.clone())
    };
    let q = ops::clip(&q, Some(&lowest), Some(&highest), s)?;
    Ok(ops::astype(&ops::where_(&bad, &wrapped, &q, s)?, t, s)?)
}

fn claim_quantize(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 3)?;
    require_input_type(node, 0, FLOAT)?;
    require_input_type(node, 1, FLOAT)?;
    const OUT: &[ElemType] = &[
        ElemType::I8,
        ElemType::U8,
        ElemType::I16,
        ElemType::U16,
        ElemType::INT4,
        ElemType::UINT4,
        ElemType::INT2,
        ElemType::UINT2,
    ];
    let out = node.output(0).and_then(|v| v.elem_type);
    if let Some(format) = out.and_then(Float8::of) {
        // (Its zero point, which the specification requires to be 0, is not read: ORT's CPU
        // EP ignores it too.)
        require_input_type(node, 2, &[format.elem_type()])?;
        node.attr_int("saturate", 1)?;
    } else if out == Some(ElemType::FLOAT4E2M1) {
        require_input_type(node, 2, &[ElemType::FLOAT4E2M1])?;
    } else {
        require_input_type(node, 2, OUT)?;
        if !out.is_some_and(|t| OUT.contains(&t)) {
            return Err(Decline::new(
                "the output is not a float8 or float4 type or a 2-, 4-, 8- or 16-bit integer type",
            ));
        }
    }
    precision(node).map_err(|e| Decline(e.to_string()))?;
    layout(node, ep_core::lowering::input_rank(node, 0).unwrap_or(1), declared_scale(node))?;
    claim_zero_point(node)?;
    Ok(())
}

/// The type opset 25's `precision` attribute asks `x / scale` to be computed in, if any.
fn precision(node: &NodeInfo) -> Result<Option<Dtype>> {
    match node.attr_int("precision", 0)? {
        0 => Ok(None),
        p => ElemType::from_tensor_proto(p as i32)
            .to_mlx()
            .filter(|d| matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16))
            .map(Some)
            .ok_or_else(|| Error::new(format!("precision {p} is not float32, float16 or bfloat16"))),
    }
}

/// `x / scale` computed in `dtype`, the scale laid out along `axis` (in blocks of `block`).
fn quotient(x: &Array, scale: &Array, dtype: Dtype, (axis, block): (usize, i64), s: &Stream) -> Result<Array> {
    let scale = broadcast_param(&ops::astype(scale, dtype, s)?, &x.shape(), axis, block, s)?;
    Ok(ops::divide(&ops::astype(x, dtype, s)?, &scale, s)?)
}

fn lower_quantize(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let shape = x.shape();
    let (axis, block) = layout(node, shape.len(), Some(&runtime_dims(ctx.input(1)?))).map_err(Error::new)?;
    zero_point_fits(ctx)?;
    let out = node.output(0).and_then(|v| v.elem_type).ok_or_else(|| Error::new("the output type is unknown"))?;
    let scale = broadcast_param(&f32(ctx.input(1)?, s)?, &shape, axis, block, s)?;
    if let Some(format) = Float8::of(out) {
        // `x / scale` in float32, rounded to the format (ties to even), saturating or not.
        let saturate = node.attr_int("saturate", 1)? != 0;
        return Ok(vec![float8::encode(&ops::divide(&f32(x, s)?, &scale, s)?, format, saturate, s)?]);
    }
    if out == ElemType::FLOAT4E2M1 {
        // As the `onnx` reference computes it: `x / scale + zero_point` in the `precision`
        // attribute's type (opset 25), else in the type of x and the scale when they share one
        // and float32 otherwise, then rounded to the format (which saturates: `saturate`
        // changes nothing).
        let raw_scale = ctx.input(1)?;
        let within = match precision(node)? {
            Some(p) => p,
            None if x.dtype() == raw_scale.dtype() => x.dtype(),
            None => Dtype::F32,
        };
        let mut q = quotient(x, raw_scale, within, (axis, block), s)?;
        if let Some(z) = ctx.optional_input(2) {
            let z = ops::astype(&float4::decode(z, s)?, within, s)?;
            q = ops::add(&q, &broadcast_param(&z, &shape, axis, block, s)?, s)?;
        }
        return Ok(vec![float4::encode(&q, s)?]);
    }
    let t = out.to_mlx().or_else(|| out.unpacked_sub_byte()).ok_or_else(|| Error::new("the output type is unknown"))?;
    let zp = match ctx.optional_input(2) {
        Some(z) => Some(broadcast_param(&f32(z, s)?, &shape, axis, block, s)?),
        None => None,
    };
    if let Some(p) = precision(node)?.filter(|&p| p != Dtype::F32) {
        // `x / scale` in that type (ORT 1.31's CPU EP ignores the attribute; ONNX and its
        // reference implementation divide in it), then rounded and saturated as below.
        let q = f32(&quotient(x, ctx.input(1)?, p, (axis, block), s)?, s)?;
        let one = ops::scalar(1.0, Dtype::F32, s)?;
        return Ok(vec![quantize_from(&q, &one, zp.as_ref(), t, range_of(out)?, false, s)?]);
    }
    let half = matches!(x.dtype(), Dtype::F16 | Dtype::BF16);
    Ok(vec![quantize_from(&f32(x, s)?, &scale, zp.as_ref(), t, range_of(out)?, half, s)?])
}

fn claim_dynamic(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::F32])
}

/// uint8 with scale `(max(0, max x) - min(0, min x)) / 255` (1 when that range is 0) and zero
/// point `saturate(round(-min / scale))`, as ORT's CPU EP computes them: NaN elements take no
/// part in the range and quantize to 0, and an undefined zero point (an infinite range) is 255.
fn lower_dynamic(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let (q, scale, zp) = dynamic_uint8(ctx.input(0)?, ctx.stream())?;
    Ok(vec![q, scale, zp])
}

ep_core::register_lowering!(
    DEQUANTIZE_LINEAR = TakesFloat8(FnLowering {
        domain: "",
        op: "DequantizeLinear",
        opsets: 10..=i32::MAX,
        claim: claim_dequantize,
        lower: lower_dequantize,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    })
);

ep_core::register_lowering!(
    QUANTIZE_LINEAR = TakesFloat8(FnLowering {
        domain: "",
        op: "QuantizeLinear",
        opsets: 10..=i32::MAX,
        claim: claim_quantize,
        lower: lower_quantize,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    })
);

fn claim_ms_dequantize(node: &NodeInfo) -> std::result::Result<(), Decline> {
    if node.attr("block_size").is_some() {
        return Err(Decline::new("com.microsoft DequantizeLinear has no block_size"));
    }
    claim_dequantize(node)
}

fn claim_ms_quantize(node: &NodeInfo) -> std::result::Result<(), Decline> {
    if node.attr("block_size").is_some() {
        return Err(Decline::new("com.microsoft QuantizeLinear has no block_size"));
    }
    claim_quantize(node)
}

// ORT's earlier forms (per tensor or per axis), the same computations.
ep_core::register_lowering!(
    MS_DEQUANTIZE_LINEAR = FnLowering {
        domain: "com.microsoft",
        op: "DequantizeLinear",
        opsets: 1..=i32::MAX,
        claim: claim_ms_dequantize,
        lower: lower_dequantize,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    MS_QUANTIZE_LINEAR = FnLowering {
        domain: "com.microsoft",
        op: "QuantizeLinear",
        opsets: 1..=i32::MAX,
        claim: claim_ms_quantize,
        lower: lower_quantize,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    DYNAMIC_QUANTIZE_LINEAR = FnLowering {
        domain: "",
        op: "DynamicQuantizeLinear",
        opsets: 11..=i32::MAX,
        claim: claim_dynamic,
        lower: lower_dynamic,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
pub(crate) mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    pub(crate) fn qtype() -> BoxedStrategy<DType> {
        dtype_of(&[DType::I8, DType::U8])
    }

    pub(crate) fn full_range(t: DType) -> Values {
        match t {
            DType::I8 => Values::Uniform { lo: -128.0, hi: 128.0 },
            _ => Values::Uniform { lo: 0.0, hi: 256.0 },
        }
    }

    /// (x shape, axis, block size, parameter shape) for per-tensor, per-axis and blocked forms.
    fn layout() -> BoxedStrategy<(Vec<i64>, i64, i64, Vec<i64>)> {
        (nonempty_shape(1..=3), 0..3u8, 0..3usize, 1..=3i64)
            .prop_map(|(shape, form, axis, block)| {
                let axis = axis % shape.len();
                match form {
                    0 => (shape, 1, 0, vec![]),
                    1 => {
                        let p = vec![shape[axis]];
                        (shape, axis as i64, 0, p)
                    }
                    _ => {
                        let mut p = shape.clone();
                        p[axis] = (shape[axis] + block - 1) / block;
                        // ORT takes a one-element parameter as per-tensor, which forbids a block size.
                        if p.iter().product::<i64>() == 1 {
                            return (shape, 1, 0, vec![]);
                        }
                        (shape, axis as i64, block, p)
                    }
                }
            })
            .boxed()
    }

    /// `QuantizeLinear(x, scale) -> float8 (output_dtype) -> DequantizeLinear(t, scale) -> y`,
    /// the node under test one of the two (the float8 values stay inside the partition: the
    /// suite feeds and reads only the host's types).
    fn float8_round_trip(dequantize_under_test: bool) -> BoxedStrategy<Case> {
        (select(FLOAT8), dtype_of(&[DType::F32, DType::F16]), layout(), any::<bool>(), seed())
            .prop_map(move |((code, max, exact_to), xt, (shape, axis, block, p), saturate, seed)| {
                // Scales in [0.25, 2]: `x / scale` up to 4 |x|, past the largest value at times
                // when saturating, short of where ORT's CPU EP departs when not.
                let reach = if saturate { 2.0 * max } else { exact_to / 4.0 };
                let reach = if xt == DType::F16 { reach.min(60000.0) } else { reach };
                let mut case = Case::op("QuantizeLinear", 21)
                    .input_with("x", xt, &shape, Values::Uniform { lo: -reach, hi: reach })
                    .input_with("scale", xt, &p, Values::Uniform { lo: 0.25, hi: 2.0 })
                    .attr_int("output_dtype", code)
                    .attr_int("saturate", saturate as i64)
                    .attr_int("axis", axis);
                if block > 0 {
                    case = case.attr_int("block_size", block);
                }
                case.nodes[0].outputs.push("t".into());
                let mut dq = conformance_spec::NodeSpec {
                    domain: String::new(),
                    op: "DequantizeLinear".into(),
                    name: "dequantize".into(),
                    inputs: vec!["t".into(), "scale".into()],
                    outputs: vec!["y".into()],
                    attributes: vec![("axis".into(), conformance_spec::Attr::Int(axis))],
                };
                if block > 0 {
                    dq.attributes.push(("block_size".into(), conformance_spec::Attr::Int(block)));
                }
                if dequantize_under_test {
                    // The node the suite reports on is named `under_test`.
                    dq.name = std::mem::replace(&mut case.nodes[0].name, "quantize".into());
                }
                case.nodes.push(dq);
                case.outputs.push(("y".into(), xt, shape.clone()));
                case.with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::DEQUANTIZE_LINEAR, || {
        let integer = (qtype(), layout(), any::<bool>(), seed())
            .prop_map(|(t, (shape, axis, block, p), zp, seed)| {
                let opset = if block > 0 { 21 } else { 19 };
                let mut case = Case::op("DequantizeLinear", opset)
                    .input_with("x", t, &shape, full_range(t))
                    .input_with("scale", DType::F32, &p, Values::Uniform { lo: 0.01, hi: 2.0 });
                if zp {
                    case = case.input_with("zero_point", t, &p, full_range(t));
                }
                if block > 0 {
                    case = case.attr_int("block_size", block);
                }
                case.attr_int("axis", axis).output("y", DType::F32, &shape).with_seed(seed)
            })
            .boxed()
            .prop_union(qdq_matmul())
            .boxed();
        prop_oneof![4 => integer, 1 => float8_round_trip(true)].boxed()
    });

    /// A weight-quantized MatMul as QDQ exports write it: `x @ DequantizeLinear(w)` with `w` a
    /// constant `[K, N]` of 8 bits per tensor, per column or in blocks of 32/64/128 along K,
    /// which the MLX EP multiplies as MLX's quantized matmul (see `affine_weight.rs`).
    fn qdq_matmul() -> BoxedStrategy<Case> {
        let dims = (1..=6usize, 1..=24i64, shape(0..=2));
        // Float32 activations: MLX's CPU backend multiplies float16 matrices with float16 sums
        // (these weights' products drift past float16's tolerance over K); the float16 forms
        // are checked by python/check_qdq_weights.py. The reader: MatMul, Gemm, Gemm with
        // transB (the weight stored `[N, K]`; Gemm takes 2-D inputs, a bias row C, alpha, beta).
        (qtype(), Just(DType::F32), dims, (0..3u8, 0..3usize, 0..3u8), any::<bool>(), seed())
            .prop_map(|(t, xt, (kk, n, lead), (form, b, reader), zp, seed)| {
                let k = 32 * kk as i64;
                let block = [32i64, 64, 128][b];
                let block = if k % block == 0 { block } else { 32 };
                let trans_b = reader == 2;
                let (k_axis, n_axis) = if trans_b { (1, 0) } else { (0, 1) };
                let (axis, block, p) = match form {
                    0 => (n_axis, 0, vec![]),
                    1 => (n_axis, 0, vec![n]),
                    _ if trans_b => (k_axis, block, vec![n, k / block]),
                    _ => (k_axis, block, vec![k / block, n]),
                };
                let w_shape = if trans_b { [n, k] } else { [k, n] };
                let opset = if block > 0 { 21 } else { 19 };
                let mut case = Case::op("DequantizeLinear", opset).constant("w", t, &w_shape, full_range(t)).constant(
                    "scale",
                    xt,
                    &p,
                    Values::Uniform { lo: 0.001, hi: 0.02 },
                );
                if zp {
                    case = case.constant("zero_point", t, &p, full_range(t));
                }
                if block > 0 {
                    case = case.attr_int("block_size", block);
                }
                let mut case = case.attr_int("axis", axis).output("wf", xt, &w_shape).with_seed(seed);
                let lead = if reader == 0 { lead } else { vec![lead.iter().product::<i64>().max(1)] };
                let mut x_shape = lead.clone();
                x_shape.push(k);
                let mut y_shape = lead;
                y_shape.push(n);
                case.outputs.clear();
                case.inputs.push(conformance_spec::TensorSpec {
                    name: "x".into(),
                    dtype: xt,
                    shape: x_shape,
                    values: Values::Uniform { lo: -1.0, hi: 1.0 },
                });
                let (op, inputs, attributes) = if reader == 0 {
                    ("MatMul", vec!["x".into(), "wf".into()], Vec::new())
                } else {
                    case.constants.push(conformance_spec::TensorSpec {
                        name: "c".into(),
                        dtype: xt,
                        shape: vec![n],
                        values: Values::Uniform { lo: -1.0, hi: 1.0 },
                    });
                    let attributes = vec![
                        ("transB".to_string(), conformance_spec::Attr::Int(i64::from(trans_b))),
                        ("alpha".to_string(), conformance_spec::Attr::Float(0.5)),
                        ("beta".to_string(), conformance_spec::Attr::Float(2.0)),
                    ];
                    ("Gemm", vec!["x".into(), "wf".into(), "c".into()], attributes)
                };
                case.nodes.push(conformance_spec::NodeSpec {
                    domain: String::new(),
                    op: op.into(),
                    name: "reader".into(),
                    inputs,
                    outputs: vec!["y".into()],
                    attributes,
                });
                case.outputs.push(("y".into(), xt, y_shape));
                case
            })
            .boxed()
    }

    register_spec!(super::QUANTIZE_LINEAR, || {
        let integer = (qtype(), dtype_of(&[DType::F32, DType::F16]), layout(), seed())
            .prop_map(|(t, xt, (shape, axis, block, p), seed)| {
                let opset = if block > 0 { 21 } else { 19 };
                let mut case = Case::op("QuantizeLinear", opset)
                    .input_with("x", xt, &shape, Values::Uniform { lo: -300.0, hi: 300.0 })
                    .input_with("scale", xt, &p, Values::Uniform { lo: 0.25, hi: 2.0 })
                    .input_with("zero_point", t, &p, full_range(t));
                if block > 0 {
                    case = case.attr_int("block_size", block);
                }
                case.attr_int("axis", axis).output("y", t, &shape).with_seed(seed)
            })
            .boxed();
        prop_oneof![3 => integer, 1 => float8_round_trip(false), 1 => with_precision()].boxed()
    });

    /// Opset 25's `precision`: `x / scale` in float16. ORT 1.31's CPU EP ignores the
    /// attribute, so its reference graph rounds x and the scale to float16, divides in float32
    /// and rounds the quotient to float16 (the correctly rounded float16 quotient: float32's
    /// 24 bits make the double rounding harmless), then quantizes it with a scale of 1. (A
    /// float16 Div there would not do: ORT computes it in float32 and drops the Casts around
    /// it.) Per tensor, as the reference's Div broadcasts. (bfloat16 takes the same path.)
    fn with_precision() -> BoxedStrategy<Case> {
        (qtype(), Just(DType::F16), nonempty_shape(1..=3), any::<bool>(), seed())
            .prop_map(|(t, p, shape, zp, seed)| {
                // (Without a zero point the output is uint8.)
                let t = if zp { t } else { DType::U8 };
                let mut case = Case::op("QuantizeLinear", 25)
                    .input_with("x", DType::F32, &shape, Values::Uniform { lo: -300.0, hi: 300.0 })
                    .input_with("scale", DType::F32, &[], Values::Uniform { lo: 0.25, hi: 2.0 });
                if zp {
                    case = case.input_with("zero_point", t, &[], full_range(t));
                }
                let to = |d: DType| vec![("to", conformance_spec::Attr::Int(d.onnx_code()))];
                case.attr_int("precision", p.onnx_code())
                    .output("y", t, &shape)
                    .reference_constant("reference_one", DType::F32, &[], Values::Data(vec![1.0]))
                    .reference("Cast", &["x"], &["reference_xh"], to(p))
                    .reference("Cast", &["reference_xh"], &["reference_x"], to(DType::F32))
                    .reference("Cast", &["scale"], &["reference_sh"], to(p))
                    .reference("Cast", &["reference_sh"], &["reference_scale"], to(DType::F32))
                    .reference("Div", &["reference_x", "reference_scale"], &["reference_q"], vec![])
                    .reference("Cast", &["reference_q"], &["reference_qh"], to(p))
                    .reference("Cast", &["reference_qh"], &["reference_qf"], to(DType::F32))
                    .reference(
                        "QuantizeLinear",
                        &["reference_qf", "reference_one", if zp { "zero_point" } else { "" }],
                        &["y"],
                        vec![],
                    )
                    .with_seed(seed)
            })
            .boxed()
    }

    /// A per-tensor or per-axis layout (com.microsoft's forms have no blocks).
    fn unblocked() -> BoxedStrategy<(Vec<i64>, i64, i64, Vec<i64>)> {
        layout()
            .prop_map(|(shape, axis, block, p)| if block > 0 { (shape, 1, 0, vec![]) } else { (shape, axis, block, p) })
            .boxed()
    }

    register_spec!(super::MS_DEQUANTIZE_LINEAR, || {
        (qtype(), unblocked(), any::<bool>(), seed())
            .prop_map(|(t, (shape, axis, _, p), zp, seed)| {
                let mut case = Case::domain_op("com.microsoft", "DequantizeLinear", 1)
                    .input_with("x", t, &shape, full_range(t))
                    .input_with("scale", DType::F32, &p, Values::Uniform { lo: 0.01, hi: 2.0 });
                if zp {
                    case = case.input_with("zero_point", t, &p, full_range(t));
                }
                case.attr_int("axis", axis).output("y", DType::F32, &shape).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::MS_QUANTIZE_LINEAR, || {
        (qtype(), unblocked(), seed())
            .prop_map(|(t, (shape, axis, _, p), seed)| {
                Case::domain_op("com.microsoft", "QuantizeLinear", 1)
                    .input_with("x", DType::F32, &shape, Values::Uniform { lo: -300.0, hi: 300.0 })
                    .input_with("scale", DType::F32, &p, Values::Uniform { lo: 0.25, hi: 2.0 })
                    .input_with("zero_point", t, &p, full_range(t))
                    .attr_int("axis", axis)
                    .output("y", t, &shape)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::DYNAMIC_QUANTIZE_LINEAR, || {
        (nonempty_shape(1..=3), 0..3u8, seed())
            .prop_map(|(shape, kind, seed)| {
                // Positive, mixed, or all zero (scale 0 before ORT's fallback to 1).
                let values = match kind {
                    0 => Values::Uniform { lo: 0.0, hi: 5.0 },
                    1 => Values::Uniform { lo: -3.0, hi: 2.0 },
                    _ => Values::Uniform { lo: 0.0, hi: 0.0 },
                };
                Case::op("DynamicQuantizeLinear", 11)
                    .input_with("x", DType::F32, &shape, values)
                    .output("y", DType::U8, &shape)
                    .output("y_scale", DType::F32, &[])
                    .output("y_zero_point", DType::U8, &[])
                    .with_seed(seed)
            })
            .boxed()
    });
}
