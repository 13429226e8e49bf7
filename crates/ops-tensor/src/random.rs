//! Random generators: RandomUniform, RandomNormal (of the `shape` attribute), RandomUniformLike,
//! RandomNormalLike (of the input's shape; its type unless `dtype` says), Bernoulli (one draw
//! per probability of the input) and Multinomial (`sample_size` class indices per row of
//! unnormalized log probabilities), on MLX's generators.
//!
//! Without a `seed` every run draws new values (MLX's global key sequence); with one, each
//! run draws with the next key of a sequence that seed fixes, so a session's runs draw
//! different values and two sessions the same ones, as ORT's CPU EP seeds its generator once
//! per session and draws on from it run after run (neither matches the other's values, which
//! ONNX leaves to the runtime). A partition holding one of these runs eagerly: a compiled
//! graph would replay the values of its trace.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops, random};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

/// The element types drawn (ORT's CPU EP draws float and double; MLX's GPUs have no double).
const FLOAT_OUT: &[ElemType] = &[ElemType::F32, ElemType::F16, ElemType::BF16];

/// The `dtype` attribute's type (`default` when absent).
fn dtype_attr(node: &NodeInfo, default: Option<ElemType>) -> std::result::Result<ElemType, String> {
    match node.attr("dtype") {
        Some(AttrValue::Int(t)) => Ok(ElemType::from_tensor_proto(*t as i32)),
        None => default.ok_or_else(|| "the dtype attribute is missing".to_owned()),
        Some(other) => Err(format!("attribute 'dtype' should be an int, found {other:?}")),
    }
}

/// This run's key of the `seed` attribute (its bits), if any (see [`LowerCtx::seeded_key`]).
fn seed_key(ctx: &LowerCtx<'_>, node: &NodeInfo) -> Result<Option<Array>> {
    match node.attr("seed") {
        None => Ok(None),
        Some(AttrValue::Float(v)) => Ok(Some(ctx.seeded_key(node, u64::from(v.to_bits()))?)),
        Some(other) => bail!("attribute 'seed' should be a float, found {other:?}"),
    }
}

fn mlx_of(t: ElemType) -> Result<Dtype> {
    t.to_mlx().ok_or_else(|| Error::new(format!("type {t:?} has no MLX type")))
}

/// The output type of a generator: its `dtype`, else (for the `*Like` forms) the input's.
fn output_type(node: &NodeInfo) -> std::result::Result<ElemType, String> {
    let like = node.op_type.ends_with("Like");
    let input = if like { node.input(0).and_then(|v| v.elem_type) } else { None };
    dtype_attr(node, input.or(if like { None } else { Some(ElemType::F32) }))
}

fn claim_generator(node: &NodeInfo) -> std::result::Result<(), Decline> {
    if node.op_type.ends_with("Like") {
        require_inputs(node, 1, 1)?;
    } else {
        require_inputs(node, 0, 0)?;
        match node.attr_ints("shape")? {
            Some(s) if s.iter().all(|&d| d >= 0) => {}
            Some(s) => return Err(Decline(format!("shape {s:?} has a negative dimension"))),
            None => return Err(Decline::new("the shape attribute is missing")),
        }
    }
    let t = output_type(node).map_err(Decline)?;
    if !FLOAT_OUT.contains(&t) {
        return Err(Decline(format!("dtype {t:?}: float, float16 and bfloat16 are drawn")));
    }
    Ok(())
}

fn lower_generator(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let dtype = mlx_of(output_type(node).map_err(Error::new)?)?;
    let shape = if node.op_type.ends_with("Like") {
        ctx.input(0)?.shape()
    } else {
        node.attr_ints("shape")?.map(<[i64]>::to_vec).ok_or_else(|| Error::new("the shape attribute is missing"))?
    };
    let key = seed_key(ctx, node)?;
    let s = ctx.stream_for(dtype);
    let attr = |name: &str, default: f32| node.attr_float(name, default);
    let y = if node.op_type.starts_with("RandomUniform") {
        // (Bounds ONNX leaves undefined, infinite or reversed, give what `low + (high - low) u`
        // gives.)
        let (low, high) = (attr("low", 0.0)?, attr("high", 1.0)?);
        // Drawn in float32 and rounded to the output type (for a half type the rounding of a
        // draw just under `high` may reach it).
        let u =
            random::uniform(&Array::scalar_f32(low), &Array::scalar_f32(high), &shape, Dtype::F32, key.as_ref(), s)?;
        ops::astype(&u, dtype, s)?
    } else {
        let (mean, scale) = (attr("mean", 0.0)?, attr("scale", 1.0)?);
        ops::astype(&random::normal(&shape, Dtype::F32, mean, scale, key.as_ref(), s)?, dtype, s)?
    };
    Ok(vec![y])
}

macro_rules! generators {
    ($($name:ident: $op:expr, $since:expr;)*) => {$(
        ep_core::register_lowering!($name = FnLowering {
            domain: "",
            op: $op,
            opsets: $since..=i32::MAX,
            claim: claim_generator,
            lower: lower_generator,
            safety: CompileSafety::Never,
            growth: None,
        });
    )*};
}

generators! {
    RANDOM_UNIFORM: "RandomUniform", 1;
    RANDOM_NORMAL: "RandomNormal", 1;
    RANDOM_UNIFORM_LIKE: "RandomUniformLike", 1;
    RANDOM_NORMAL_LIKE: "RandomNormalLike", 1;
}

fn claim_bernoulli(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::F32, ElemType::F16, ElemType::BF16])?;
    let input = node.input(0).and_then(|v| v.elem_type);
    let t = dtype_attr(node, input).map_err(Decline)?;
    if t.to_mlx().is_none() || t == ElemType::F64 {
        return Err(Decline(format!("dtype {t:?} is not drawn")));
    }
    Ok(())
}

/// 1 where a uniform draw falls below the probability, in the output type.
fn lower_bernoulli(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let p = ctx.input(0)?;
    let dtype = match node.attr("dtype") {
        None => p.dtype(),
        Some(_) => mlx_of(dtype_attr(node, None).map_err(Error::new)?)?,
    };
    let s = ctx.stream();
    let key = seed_key(ctx, node)?;
    let hit = random::bernoulli(&ops::astype(p, Dtype::F32, s)?, &p.shape(), key.as_ref(), s)?;
    Ok(vec![ops::astype(&hit, dtype, s)?])
}

ep_core::register_lowering!(
    BERNOULLI = FnLowering {
        domain: "",
        op: "Bernoulli",
        opsets: 15..=i32::MAX,
        claim: claim_bernoulli,
        lower: lower_bernoulli,
        safety: CompileSafety::Never,
        growth: None,
    }
);

fn claim_multinomial(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::F32, ElemType::F16])?;
    match dtype_attr(node, Some(ElemType::I32)).map_err(Decline)? {
        ElemType::I32 | ElemType::I64 => {}
        t => return Err(Decline(format!("dtype {t:?} is not int32 or int64"))),
    }
    if node.attr_int("sample_size", 1)? < 1 {
        return Err(Decline::new("sample_size must be at least 1"));
    }
    match ep_core::lowering::input_rank(node, 0) {
        Some(r) if r != 2 => Err(Decline(format!("the input has rank {r}; [batch, classes] expected"))),
        _ => Ok(()),
    }
}

fn lower_multinomial(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let shape = x.shape();
    if shape.len() != 2 || shape[1] == 0 {
        bail!("the input has shape {shape:?}; [batch, classes] with classes expected");
    }
    let dtype = mlx_of(dtype_attr(node, Some(ElemType::I32)).map_err(Error::new)?)?;
    let samples =
        i32::try_from(node.attr_int("sample_size", 1)?).map_err(|_| Error::new("sample_size is too large"))?;
    let key = seed_key(ctx, node)?;
    let drawn = random::categorical(&ops::astype(x, Dtype::F32, s)?, 1, samples, key.as_ref(), s)?;
    Ok(vec![ops::astype(&drawn, dtype, s)?])
}

ep_core::register_lowering!(
    MULTINOMIAL = FnLowering {
        domain: "",
        op: "Multinomial",
        opsets: 7..=i32::MAX,
        claim: claim_multinomial,
        lower: lower_multinomial,
        safety: CompileSafety::Never,
        growth: None,
    }
);

/// Random values differ between runtimes: each case compares the samples' distributions
/// ([`conformance_spec::Compare::Distribution`]), with at least a few hundred of them.
#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    fn sizes() -> BoxedStrategy<Vec<i64>> {
        prop_oneof![Just(vec![512i64]), Just(vec![16, 32]), Just(vec![4, 8, 16])].boxed()
    }

    fn seeded(case: Case, seed: Option<u16>) -> Case {
        match seed {
            Some(v) => case.attr("seed", Attr::Float(f32::from(v))),
            None => case,
        }
    }

    fn generator(op: &'static str) -> BoxedStrategy<Case> {
        let like = op.ends_with("Like");
        let uniform = op.starts_with("RandomUniform");
        (sizes(), -3.0..3.0f32, 0.1..4.0f32, any::<(bool, Option<u16>)>(), seed())
            .prop_map(move |(shape, a, b, (explicit, key), seed)| {
                let case = Case::op(op, 20);
                let case = if like {
                    case.input_with("x", DType::F32, &shape, Values::Uniform { lo: 0.0, hi: 1.0 })
                } else {
                    case.attr_ints("shape", &shape)
                };
                let case = if explicit || !like { case.attr_int("dtype", DType::F32.onnx_code()) } else { case };
                let case = if uniform {
                    case.attr_float("low", a).attr_float("high", a + b)
                } else {
                    case.attr_float("mean", a).attr_float("scale", b)
                };
                seeded(case, key).output("y", DType::F32, &shape).with_seed(seed).distribution()
            })
            .boxed()
    }

    register_spec!(super::RANDOM_UNIFORM, || generator("RandomUniform"));
    register_spec!(super::RANDOM_NORMAL, || generator("RandomNormal"));
    register_spec!(super::RANDOM_UNIFORM_LIKE, || generator("RandomUniformLike"));
    register_spec!(super::RANDOM_NORMAL_LIKE, || generator("RandomNormalLike"));

    register_spec!(super::BERNOULLI, || {
        (
            sizes(),
            select(&[None, Some(DType::F32), Some(DType::I32), Some(DType::Bool)][..]),
            any::<Option<u16>>(),
            seed(),
        )
            .prop_map(|(shape, dtype, key, seed)| {
                let case =
                    Case::op("Bernoulli", 20).input_with("p", DType::F32, &shape, Values::Uniform { lo: 0.0, hi: 1.0 });
                let case = match dtype {
                    Some(t) => case.attr_int("dtype", t.onnx_code()),
                    None => case,
                };
                seeded(case, key).output("y", dtype.unwrap_or(DType::F32), &shape).with_seed(seed).distribution()
            })
            .boxed()
    });

    register_spec!(super::MULTINOMIAL, || {
        (1..=4i64, 2..=8i64, 100..=200i64, select(&[DType::I32, DType::I64][..]), any::<Option<u16>>(), seed())
            .prop_map(|(batch, classes, samples, t, key, seed)| {
                let case = Case::op("Multinomial", 20)
                    .input_with("x", DType::F32, &[batch, classes], Values::Uniform { lo: -2.0, hi: 2.0 })
                    .attr_int("sample_size", samples)
                    .attr_int("dtype", t.onnx_code());
                seeded(case, key).output("y", t, &[batch, samples]).with_seed(seed).distribution()
            })
            .boxed()
    });
}
