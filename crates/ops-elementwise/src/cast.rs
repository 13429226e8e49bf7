//! Type conversions and predicates: Cast, CastLike, BitCast, IsNaN, IsInf, Not, BitwiseNot.

use ep_core::float8::{self, Float8};
use ep_core::lowering::{ALL_TYPES, FnLowering, INTS, TakesFloat8, input_type, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

/// Converts as ONNX's Cast does: floats to integers truncate toward zero (the caller keeps
/// values in range), anything to bool is `x != 0` (NaN is true), bools to numbers are 0/1.
pub fn cast(x: &Array, to: Dtype, s: &Stream) -> Result<Array> {
    if x.dtype() == to {
        return Ok(x.clone());
    }
    if to == Dtype::Bool {
        let zero = ops::scalar(0.0, x.dtype(), s)?;
        return Ok(ops::not_equal(x, &zero, s)?);
    }
    Ok(ops::astype(x, to, s)?)
}

/// The stream for a conversion between `a` and `b`: the CPU for float64 on either side.
fn stream_for<'a>(ctx: &LowerCtx<'a>, a: Dtype, b: Dtype) -> &'a Stream {
    if a == Dtype::F64 || b == Dtype::F64 { ctx.cpu_stream() } else { ctx.stream() }
}

fn target(node: &NodeInfo) -> std::result::Result<ElemType, String> {
    let to = node.attr_int("to", -1)?;
    Ok(ElemType::from_tensor_proto(to as i32))
}

/// A type Cast and CastLike convert from and to: MLX's own, and the float8 types.
fn convertible(t: ElemType) -> bool {
    ALL_TYPES.contains(&t) || Float8::of(t).is_some()
}

fn claim_conversion(node: &NodeInfo, to: ElemType) -> std::result::Result<(), Decline> {
    match input_type(node, 0) {
        Some(f) if convertible(f) => {}
        other => return Err(Decline(format!("{} from {other:?} is not supported", node.op_type))),
    }
    if !convertible(to) {
        return Err(Decline(format!("{} to {to:?} is not supported", node.op_type)));
    }
    // (ORT's CPU EP refuses the node when creating its kernel: left to it, which raises.)
    if node.attr_int("saturate", 1)? == 0 && Float8::of(to).is_none() {
        return Err(Decline(format!("saturate=0 applies only to a float8 target, not {to:?}")));
    }
    Ok(())
}

/// `x` (of ONNX type `from`) converted to ONNX type `to`: float8 codes are decoded to float32
/// first and encoded last (rounding to nearest even, `saturate` as ONNX's Cast defines it).
fn convert(ctx: &LowerCtx<'_>, x: &Array, from: ElemType, to: ElemType, saturate: bool) -> Result<Array> {
    let decoded;
    let x = match Float8::of(from) {
        Some(f) => {
            decoded = float8::decode(x, f, ctx.stream())?;
            &decoded
        }
        None => x,
    };
    if let Some(f) = Float8::of(to) {
        return float8::encode(x, f, saturate, stream_for(ctx, x.dtype(), Dtype::F32));
    }
    let to = to.to_mlx().ok_or("the target type has no MLX type")?;
    cast(x, to, stream_for(ctx, x.dtype(), to))
}

fn type_of(node: &NodeInfo, i: usize) -> Result<ElemType> {
    Ok(input_type(node, i).ok_or_else(|| format!("input {i} has no known type"))?)
}

fn claim_cast(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    claim_conversion(node, target(node)?)
}

fn lower_cast(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let saturate = node.attr_int("saturate", 1)? != 0;
    Ok(vec![convert(ctx, x, type_of(node, 0)?, target(node)?, saturate)?])
}

ep_core::register_lowering!(
    CAST = TakesFloat8(FnLowering {
        domain: "",
        op: "Cast",
        opsets: 6..=i32::MAX,
        claim: claim_cast,
        lower: lower_cast,
        safety: CompileSafety::Shapeless,
        growth: Some(|q| ep_core::growth::carries_sizes(true, q)),
    })
);

fn claim_bit_cast(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, ALL_TYPES)?;
    let to = target(node)?;
    let from = node.input(0).and_then(|v| v.elem_type);
    match (from.and_then(ElemType::to_mlx), to.to_mlx()) {
        (Some(f), Some(t)) if ALL_TYPES.contains(&to) && f.size_in_bytes() == t.size_in_bytes() => Ok(()),
        (Some(_), Some(_)) if ALL_TYPES.contains(&to) => {
            Err(Decline(format!("BitCast from {from:?} to {to:?}: the bit widths differ")))
        }
        _ => Err(Decline(format!("BitCast from {from:?} to {to:?} is not supported"))),
    }
}

/// The input's bytes read as the target type (of the same width).
fn lower_bit_cast(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let to = target(node)?.to_mlx().ok_or("BitCast target has no MLX type")?;
    if x.dtype().size_in_bytes() != to.size_in_bytes() {
        return Err(format!("BitCast from {:?} to {to:?}: the bit widths differ", x.dtype()).into());
    }
    Ok(vec![ops::view(x, to, stream_for(ctx, x.dtype(), to))?])
}

ep_core::register_lowering!(
    BIT_CAST = FnLowering {
        domain: "",
        op: "BitCast",
        opsets: 26..=i32::MAX,
        claim: claim_bit_cast,
        lower: lower_bit_cast,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn claim_cast_like(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    let to = input_type(node, 1).ok_or_else(|| Decline::new("the target type is unknown"))?;
    claim_conversion(node, to)
}

fn lower_cast_like(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let saturate = node.attr_int("saturate", 1)? != 0;
    Ok(vec![convert(ctx, x, type_of(node, 0)?, type_of(node, 1)?, saturate)?])
}

ep_core::register_lowering!(
    CAST_LIKE = TakesFloat8(FnLowering {
        domain: "",
        op: "CastLike",
        opsets: 15..=i32::MAX,
        claim: claim_cast_like,
        lower: lower_cast_like,
        safety: CompileSafety::Shapeless,
        growth: None,
    })
);

const FLOATS64: &[ElemType] = &[ElemType::F32, ElemType::F16, ElemType::BF16, ElemType::F64];

fn claim_float_predicate(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, FLOATS64)
}

fn lower_isnan(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    Ok(vec![ops::isnan(x, ctx.stream_for(x.dtype()))?])
}

ep_core::register_lowering!(
    IS_NAN = FnLowering {
        domain: "",
        op: "IsNaN",
        opsets: 9..=i32::MAX,
        claim: claim_float_predicate,
        lower: lower_isnan,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn lower_isinf(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream_for(x.dtype());
    // Any value other than 0 is true, as ORT's CPU EP reads them.
    let (pos, neg) = (node.attr_int("detect_positive", 1)? != 0, node.attr_int("detect_negative", 1)? != 0);
    let y = match (pos, neg) {
        (true, true) => ops::isinf(x, s)?,
        (true, false) => ops::isposinf(x, s)?,
        (false, true) => ops::isneginf(x, s)?,
        (false, false) => {
            ops::not_equal(x, x, s).and_then(|nan| ops::logical_and(&nan, &ops::logical_not(&nan, s)?, s))?
        }
    };
    Ok(vec![y])
}

ep_core::register_lowering!(
    IS_INF = FnLowering {
        domain: "",
        op: "IsInf",
        opsets: 10..=i32::MAX,
        claim: claim_float_predicate,
        lower: lower_isinf,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn claim_not(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::Bool])
}

fn lower_not(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    Ok(vec![ops::logical_not(ctx.input(0)?, ctx.stream())?])
}

ep_core::register_lowering!(
    NOT = FnLowering {
        domain: "",
        op: "Not",
        opsets: 1..=i32::MAX,
        claim: claim_not,
        lower: lower_not,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

fn claim_bitwise_not(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, INTS)
}

fn lower_bitwise_not(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    Ok(vec![ops::bitwise_invert(ctx.input(0)?, ctx.stream())?])
}

ep_core::register_lowering!(
    BITWISE_NOT = FnLowering {
        domain: "",
        op: "BitwiseNot",
        opsets: 18..=i32::MAX,
        claim: claim_bitwise_not,
        lower: lower_bitwise_not,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    const CAST_TYPES: &[DType] =
        &[DType::F32, DType::F16, DType::F64, DType::I8, DType::I32, DType::I64, DType::U8, DType::Bool];

    /// Values both sides convert the same way: in range of every integer type of the pair,
    /// without halves (rounding of float16) where a float narrows.
    fn cast_values(from: DType, to: DType) -> Values {
        match (from, to) {
            (DType::Bool, _) => Values::Uniform { lo: 0.0, hi: 2.0 },
            (f, t) if f.is_float() && (t.is_float() || t == DType::Bool) => Values::Special,
            (f, DType::U8) if f.is_float() => Values::Uniform { lo: 0.0, hi: 250.0 },
            (f, _) if f.is_float() => Values::Uniform { lo: -120.0, hi: 120.0 },
            (DType::U8, _) => Values::Uniform { lo: 0.0, hi: 256.0 },
            (_, DType::U8) => Values::Uniform { lo: 0.0, hi: 256.0 },
            _ => Values::Uniform { lo: -128.0, hi: 128.0 },
        }
    }

    /// `x -> Cast(to float8, saturate) -> [Cast(to another float8)] -> Cast(back) -> y`: the
    /// float8 values never leave the partition (the suite feeds and reads only the host's
    /// types), every code the first conversion writes is read back by the last.
    fn float8_case(
        op: &str,
        from: DType,
        (code, max, exact_to): (i64, f64, f64),
        (second, saturate): (Option<(i64, f64, f64)>, bool),
        s: &[i64],
        v: u32,
        seed: u64,
    ) -> Case {
        // Values past the largest finite one half the time; without saturation, short of the
        // magnitudes where ORT's CPU EP departs from the specification.
        let reach = if saturate { max * 1.5 } else { exact_to.min(max * 1.5) };
        let reach = match second {
            Some((_, _, e)) if !saturate => reach.min(e),
            _ => reach,
        };
        // (float16's largest value, among the special ones, lies in E5M2's departing range.)
        let e5m2 = code == 19 || second.is_some_and(|f| f.0 == 19);
        let special = seed.is_multiple_of(3) && (saturate || from != DType::F16 || !e5m2);
        let reach = if from == DType::F16 { reach.min(65000.0) } else { reach };
        let values = if special { Values::Special } else { Values::Uniform { lo: -reach, hi: reach } };
        let mut case = Case::op(op, v).input_with("x", from, s, values);
        if op == "CastLike" {
            // The float8 `like` comes from a Cast of its own, before the node under test.
            case.nodes[0].inputs.push("like".into());
            case.nodes.insert(0, cast_node("like_of", "x", "like", code, true));
        } else {
            case = case.attr_int("to", code);
        }
        case = case.attr_int("saturate", saturate as i64);
        // The node under test writes float8 `t`; plain Casts carry it on and back.
        let under_test = case.nodes.len() - 1;
        case.nodes[under_test].outputs.push("t".into());
        let mut last = "t".to_owned();
        if let Some((code2, _, _)) = second {
            case.nodes.push(cast_node("onward", &last, "t2", code2, saturate));
            last = "t2".into();
        }
        case.nodes.push(cast_node("back", &last, "y", DType::F32.onnx_code(), true));
        case.outputs.push(("y".into(), DType::F32, s.to_vec()));
        case.with_seed(seed)
    }

    fn cast_node(name: &str, input: &str, output: &str, to: i64, saturate: bool) -> conformance_spec::NodeSpec {
        conformance_spec::NodeSpec {
            domain: String::new(),
            op: "Cast".into(),
            name: name.into(),
            inputs: vec![input.into()],
            outputs: vec![output.into()],
            attributes: vec![
                ("to".into(), conformance_spec::Attr::Int(to)),
                ("saturate".into(), conformance_spec::Attr::Int(saturate as i64)),
            ],
        }
    }

    fn float8_cases(op: &'static str) -> BoxedStrategy<Case> {
        let sources = &[DType::F32, DType::F16, DType::BF16][..];
        (
            select(sources),
            select(FLOAT8),
            prop::option::weighted(0.25, select(FLOAT8)),
            any::<bool>(),
            shape(0..=3),
            opset(19..=21),
            seed(),
        )
            .prop_map(move |(from, f8, second, saturate, s, v, seed)| {
                // (A Cast to the type it reads is one ORT's optimizer removes.)
                let second = second.filter(|g| g.0 != f8.0);
                float8_case(op, from, f8, (second, saturate), &s, v, seed)
            })
            .boxed()
    }

    register_spec!(super::CAST, || {
        let plain = (select(CAST_TYPES), select(CAST_TYPES), shape(0..=3), opset(13..=22), seed())
            .prop_map(|(from, to, s, v, seed)| {
                Case::op("Cast", v)
                    .input_with("x", from, &s, cast_values(from, to))
                    .attr_int("to", to.onnx_code())
                    .output("y", to, &s)
                    .with_seed(seed)
            })
            .boxed();
        prop_oneof![3 => plain, 1 => float8_cases("Cast")].boxed()
    });

    register_spec!(super::BIT_CAST, || {
        // Pairs of one width; float sources carry NaN and infinities, whose bits pass unchanged.
        const PAIRS: &[(DType, DType)] = &[
            (DType::F32, DType::I32),
            (DType::I32, DType::F32),
            (DType::F64, DType::I64),
            (DType::I64, DType::F64),
            (DType::U8, DType::I8),
            (DType::I8, DType::U8),
            (DType::F16, DType::I16),
            (DType::I16, DType::F16),
            (DType::U32, DType::F32),
        ];
        (select(PAIRS), shape(0..=3), seed())
            .prop_map(|((from, to), s, seed)| {
                let values = if from.is_float() { Values::Special } else { Values::Uniform { lo: -100.0, hi: 100.0 } };
                let values = if matches!(from, DType::U8 | DType::U32) {
                    Values::Uniform { lo: 0.0, hi: 250.0 }
                } else {
                    values
                };
                Case::op("BitCast", 26)
                    .input_with("x", from, &s, values)
                    .attr_int("to", to.onnx_code())
                    .output("y", to, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::CAST_LIKE, || {
        let plain = (select(CAST_TYPES), select(CAST_TYPES), shape(0..=3), opset(15..=22), seed())
            .prop_map(|(from, to, s, v, seed)| {
                Case::op("CastLike", v)
                    .input_with("x", from, &s, cast_values(from, to))
                    .input("like", to, &[1])
                    .output("y", to, &s)
                    .with_seed(seed)
            })
            .boxed();
        prop_oneof![3 => plain, 1 => float8_cases("CastLike")].boxed()
    });

    register_spec!(super::IS_NAN, || {
        (float_dtype(), shape(0..=3), opset(13..=22), seed())
            .prop_map(|(t, s, v, seed)| {
                Case::op("IsNaN", v)
                    .input_with("x", t, &s, Values::Special)
                    .output("y", DType::Bool, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::IS_INF, || {
        (select(&[DType::F32, DType::F64][..]), shape(0..=3), any::<(bool, bool)>(), opset(10..=22), seed())
            .prop_map(|(t, s, (pos, neg), v, seed)| {
                Case::op("IsInf", v)
                    .input_with("x", t, &s, Values::Special)
                    .attr_int("detect_positive", pos as i64)
                    .attr_int("detect_negative", neg as i64)
                    .output("y", DType::Bool, &s)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::NOT, || {
        (shape(0..=4), opset(7..=22), seed())
            .prop_map(|(s, v, seed)| Case::unary("Not", v, DType::Bool, &s).with_seed(seed))
            .boxed()
    });

    register_spec!(super::BITWISE_NOT, || {
        (select(&[DType::I32, DType::I64, DType::U8][..]), shape(0..=3), opset(18..=22), seed())
            .prop_map(|(t, s, v, seed)| {
                Case::op("BitwiseNot", v)
                    .input_with("x", t, &s, Values::Uniform { lo: if t.is_signed() { -100.0 } else { 0.0 }, hi: 200.0 })
                    .output("y", t, &s)
                    .with_seed(seed)
            })
            .boxed()
    });
}
