//! `com.microsoft` MatMulIntegerToFloat and DynamicQuantizeMatMul: an 8-bit integer matrix
//! product (exact, in int32) scaled back to float32, `acc * (a_scale * b_scale) + bias`, with
//! `b`'s scale and zero point per tensor or per column. DynamicQuantizeMatMul first quantizes
//! its float `A` to uint8 as DynamicQuantizeLinear does (as ORT's CPU EP does).

use crate::qdq::{Q8, one_value};
use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::{dynamic_uint8, integer_matmul};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// The scales, zero points and bias (inputs `from..`) have rank 0 or 1 where declared.
fn claim_parameters(node: &NodeInfo, from: usize) -> std::result::Result<(), Decline> {
    for i in from..node.inputs.len() {
        if node.input(i).is_some() {
            require_input_rank(node, i, 0..=1)?;
        }
    }
    Ok(())
}

/// `b`'s parameter (scale or zero point) `p`: one element, or one per column of `n`.
fn per_column(p: &Array, n: i64, what: &str, s: &Stream) -> Result<Array> {
    let sh = p.shape();
    if p.size() == 1 {
        return Ok(ops::reshape(p, &[], s)?);
    }
    if sh.len() == 1 && sh[0] == n {
        return Ok(p.clone());
    }
    bail!("b's {what} of shape {sh:?} must be one element or one per column ({n})")
}

/// `acc * (a_scale * b_scale) + bias` in float32.
fn scale_back(acc: &Array, a_scale: &Array, b_scale: &Array, bias: Option<&Array>, s: &Stream) -> Result<Array> {
    let n = *acc.shape().last().unwrap_or(&1);
    let f = |a: &Array| ops::astype(a, Dtype::F32, s);
    let multiplier =
        ops::multiply(&f(&one_value(a_scale, "a_scale", s)?)?, &f(&per_column(b_scale, n, "scale", s)?)?, s)?;
    let y = ops::multiply(&f(acc)?, &multiplier, s)?;
    match bias {
        // (An empty product reads no bias, as ORT's CPU EP.)
        Some(_) if y.size() == 0 => Ok(y),
        Some(b) if b.ndim() == 1 && b.shape()[0] == n => Ok(ops::add(&y, &f(b)?, s)?),
        Some(b) => bail!("the bias of shape {:?} must hold one value per column ({n})", b.shape()),
        None => Ok(y),
    }
}

fn claim_to_float(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 4, 7)?;
    for i in [0, 4] {
        require_input_type(node, i, Q8)?;
    }
    for i in [1, 5] {
        require_input_type(node, i, Q8)?;
    }
    for i in [2, 3, 6] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    require_input_rank(node, 1, 2..=2)?;
    if ep_core::lowering::input_rank(node, 0).is_none_or(|r| r < 2) {
        return Err(Decline::new("A must have rank 2 or more"));
    }
    claim_parameters(node, 2)
}

fn lower_to_float(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let n = ctx.input(1)?.shape()[1];
    let a_zp = ctx.optional_input(4).map(|z| one_value(z, "a_zero_point", s)).transpose()?;
    let b_zp = ctx.optional_input(5).map(|z| per_column(z, n, "zero point", s)).transpose()?;
    let acc = integer_matmul(ctx.input(0)?, ctx.input(1)?, a_zp.as_ref(), b_zp.as_ref(), s)?;
    Ok(vec![scale_back(&acc, ctx.input(2)?, ctx.input(3)?, ctx.optional_input(6), s)?])
}

ep_core::register_lowering!(
    MATMUL_INTEGER_TO_FLOAT = FnLowering {
        domain: "com.microsoft",
        op: "MatMulIntegerToFloat",
        opsets: 1..=i32::MAX,
        claim: claim_to_float,
        lower: lower_to_float,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_dynamic(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 5)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, Q8)?;
    require_input_type(node, 2, &[ElemType::F32])?;
    require_input_type(node, 3, Q8)?;
    require_input_type(node, 4, &[ElemType::F32])?;
    require_input_rank(node, 1, 2..=2)?;
    if ep_core::lowering::input_rank(node, 0).is_none_or(|r| r < 2) {
        return Err(Decline::new("A must have rank 2 or more"));
    }
    claim_parameters(node, 2)
}

fn lower_dynamic(ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let n = ctx.input(1)?.shape()[1];
    let (a, a_scale, a_zp) = dynamic_uint8(ctx.input(0)?, s)?;
    let b_zp = ctx.optional_input(3).map(|z| per_column(z, n, "zero point", s)).transpose()?;
    let acc = integer_matmul(&a, ctx.input(1)?, Some(&a_zp), b_zp.as_ref(), s)?;
    Ok(vec![scale_back(&acc, &a_scale, ctx.input(2)?, ctx.optional_input(4), s)?])
}

ep_core::register_lowering!(
    DYNAMIC_QUANTIZE_MATMUL = FnLowering {
        domain: "com.microsoft",
        op: "DynamicQuantizeMatMul",
        opsets: 1..=i32::MAX,
        claim: claim_dynamic,
        lower: lower_dynamic,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::qdq::spec::{full_range, qtype};
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn shapes() -> BoxedStrategy<(i64, i64, i64, i64)> {
        (1..=2i64, 1..=4i64, prop_oneof![1..=40i64, 250..=400i64], 1..=4i64).boxed()
    }

    register_spec!(super::MATMUL_INTEGER_TO_FLOAT, || {
        (qtype(), qtype(), shapes(), any::<(bool, bool, bool)>(), seed())
            .prop_map(|(ta, tb, (batch, m, k, n), (zp, columns, bias), seed)| {
                // (ORT's CPU EP has no kernel for int8 A with uint8 B.)
                let tb = if ta == DType::I8 { DType::I8 } else { tb };
                let a = if batch > 1 { vec![batch, m, k] } else { vec![m, k] };
                let y = if batch > 1 { vec![batch, m, n] } else { vec![m, n] };
                let p: Vec<i64> = if columns { vec![n] } else { vec![] };
                let scale = Values::Uniform { lo: 0.001, hi: 0.05 };
                let mut case = Case::domain_op("com.microsoft", "MatMulIntegerToFloat", 1)
                    .input_with("a", ta, &a, full_range(ta))
                    .input_with("b", tb, &[k, n], Values::int8_weights(tb))
                    .input_with("a_scale", DType::F32, &[], scale.clone())
                    .input_with("b_scale", DType::F32, &p, scale);
                if zp || bias {
                    case = case.input_with("a_zp", ta, &[], full_range(ta)).input_with("b_zp", tb, &p, full_range(tb));
                }
                if bias {
                    case = case.input("bias", DType::F32, &[n]);
                }
                case.output("y", DType::F32, &y).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::DYNAMIC_QUANTIZE_MATMUL, || {
        (qtype(), shapes(), any::<(bool, bool, bool)>(), seed())
            .prop_map(|(tb, (batch, m, k, n), (zp, columns, bias), seed)| {
                let a = if batch > 1 { vec![batch, m, k] } else { vec![m, k] };
                let y = if batch > 1 { vec![batch, m, n] } else { vec![m, n] };
                let p: Vec<i64> = if columns { vec![n] } else { vec![] };
                let mut case = Case::domain_op("com.microsoft", "DynamicQuantizeMatMul", 1)
                    .input_with("a", DType::F32, &a, Values::Uniform { lo: -2.0, hi: 3.0 })
                    .input_with("b", tb, &[k, n], Values::int8_weights(tb))
                    .input_with("b_scale", DType::F32, &p, Values::Uniform { lo: 0.001, hi: 0.05 });
                if zp || bias {
                    case = case.input_with("b_zp", tb, &p, full_range(tb));
                }
                if bias {
                    case = case.input("bias", DType::F32, &[n]);
                }
                case.output("y", DType::F32, &y).with_seed(seed)
            })
            .boxed()
    });
}
