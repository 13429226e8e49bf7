//! Einsum (MLX's einsum, with ONNX's subscript spelling) and `com.microsoft` FusedMatMul and its earlier name TransposeMatMul
//! (`alpha * op(A) @ op(B)`, transposes of the last two dims).

use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, LowerCtx, NodeInfo, Result, bail};

fn equation(node: &NodeInfo) -> std::result::Result<String, String> {
    match node.attr("equation") {
        Some(AttrValue::String(e)) => Ok(e.chars().filter(|c| !c.is_whitespace()).collect()),
        _ => Err("Einsum needs an equation".into()),
    }
}

fn claim_einsum(node: &NodeInfo) -> std::result::Result<(), Decline> {
    if node.inputs.iter().flatten().count() == 0 {
        return Err(Decline::new("no inputs"));
    }
    require_types(node, FLOATS)?;
    let eq = equation(node)?;
    if eq.contains("...") {
        return Err(Decline::new("ellipsis subscripts are left to the CPU EP"));
    }
    Ok(())
}

fn lower_einsum(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let operands: Vec<Array> = (0..ctx.num_inputs()).filter_map(|i| ctx.optional_input(i).cloned()).collect();
    let t = operands[0].dtype();
    // Half types contract in float32 and round once.
    let work: Vec<Array> = if t == Dtype::F16 || t == Dtype::BF16 {
        operands.iter().map(|a| ops::astype(a, Dtype::F32, s)).collect::<std::result::Result<_, _>>()?
    } else {
        operands
    };
    let y = ops::einsum(&equation(node)?, &work, s)?;
    Ok(vec![ops::astype(&y, t, s)?])
}

ep_core::register_lowering!(
    EINSUM = FnLowering {
        domain: "",
        op: "Einsum",
        opsets: 12..=i32::MAX,
        claim: claim_einsum,
        lower: lower_einsum,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_fused_matmul(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, FLOATS)?;
    require_input_type(node, 1, FLOATS)?;
    for flag in ["transBatchA", "transBatchB"] {
        if node.attr_int(flag, 0)? != 0 {
            return Err(Decline(format!("{flag}=1 is not supported")));
        }
    }
    Ok(())
}

fn lower_fused_matmul(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let t = |x: &Array| -> Result<Array> {
        let r = x.ndim() as i32;
        if r < 2 {
            bail!("a transposed operand needs rank 2 or more");
        }
        let mut perm: Vec<i32> = (0..r).collect();
        perm.swap(r as usize - 1, r as usize - 2);
        Ok(ops::transpose_axes(x, &perm, s)?)
    };
    // Any value other than 0 transposes, as ORT's CPU EP reads the flags.
    let trans_a = node.attr_int("transA", 0)? != 0;
    let a = if trans_a { t(ctx.input(0)?)? } else { ctx.input(0)?.clone() };
    let b = if node.attr_int("transB", 0)? != 0 { t(ctx.input(1)?)? } else { ctx.input(1)?.clone() };
    // (ORT multiplies a transposed A batch by batch: no folding of its rows.)
    crate::matmul::check_batch_broadcast(&a.shape(), &b.shape(), !trans_a)?;
    let y = ops::matmul(&a, &b, s)?;
    let alpha = node.attr_float("alpha", 1.0)?;
    Ok(vec![if alpha == 1.0 { y } else { ops::scale(&y, alpha, s)? }])
}

ep_core::register_lowering!(
    FUSED_MATMUL = FnLowering {
        domain: "com.microsoft",
        op: "FusedMatMul",
        opsets: 1..=i32::MAX,
        claim: claim_fused_matmul,
        lower: lower_fused_matmul,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

// ORT's earlier name of FusedMatMul, the same op.
ep_core::register_lowering!(
    TRANSPOSE_MATMUL = FnLowering {
        domain: "com.microsoft",
        op: "TransposeMatMul",
        opsets: 1..=i32::MAX,
        claim: claim_fused_matmul,
        lower: lower_fused_matmul,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, register_spec};

    /// An equation, its operands' shapes and the output shape.
    type Equation = (&'static str, &'static [&'static [i64]], &'static [i64]);

    /// Matrix products, transposes, traces-free contractions and outer products.
    const EQUATIONS: &[Equation] = &[
        ("ij,jk->ik", &[&[3, 4], &[4, 5]], &[3, 5]),
        ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 2]], &[2, 3, 2]),
        ("ij->ji", &[&[3, 4]], &[4, 3]),
        ("ij->i", &[&[3, 4]], &[3]),
        ("i,j->ij", &[&[3], &[4]], &[3, 4]),
        ("bhqd,bhkd->bhqk", &[&[1, 2, 3, 4], &[1, 2, 5, 4]], &[1, 2, 3, 5]),
        ("ij,ij->", &[&[2, 3], &[2, 3]], &[]),
    ];

    register_spec!(super::EINSUM, || {
        (float_dtype(), select(EQUATIONS), opset(12..=22), seed())
            .prop_map(|(t, (eq, ins, out), v, seed)| {
                let mut case = Case::op("Einsum", v);
                for (i, s) in ins.iter().enumerate() {
                    case = case.input(&format!("x{i}"), t, s);
                }
                case.attr("equation", Attr::Str(eq.to_string())).output("y", t, out).with_seed(seed)
            })
            .boxed()
    });

    fn fused_matmul(op: &'static str) -> BoxedStrategy<Case> {
        (float_dtype(), shape(0..=2), (1..=4i64, 1..=5i64, 1..=4i64), any::<(bool, bool)>(), seed())
            .prop_map(|(t, batch, (m, k, n), (ta, tb), seed)| {
                let batch: Vec<i64> = batch.iter().map(|&d| d.max(1)).collect();
                let a = [batch.clone(), if ta { vec![k, m] } else { vec![m, k] }].concat();
                let b = [batch.clone(), if tb { vec![n, k] } else { vec![k, n] }].concat();
                let y = [batch, vec![m, n]].concat();
                Case::domain_op("com.microsoft", op, 1)
                    .input("a", t, &a)
                    .input("b", t, &b)
                    .attr_int("transA", ta as i64)
                    .attr_int("transB", tb as i64)
                    .attr_float("alpha", 0.5)
                    .output("y", t, &y)
                    .with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::FUSED_MATMUL, || fused_matmul("FusedMatMul"));
    register_spec!(super::TRANSPOSE_MATMUL, || fused_matmul("TransposeMatMul"));
}
