//! `com.microsoft` CDist: the pairwise distances of the rows of `A` `[M, K]` and `B` `[N, K]`,
//! `euclidean` or `sqeuclidean`, as ORT's CPU EP computes them:
//! `|‖a‖² + ‖b‖² - 2 a·b|` (the square root of it for `euclidean`).

use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn metric(node: &NodeInfo) -> std::result::Result<bool, String> {
    match node.attr("metric") {
        Some(AttrValue::String(m)) if m == "euclidean" => Ok(true),
        Some(AttrValue::String(m)) if m == "sqeuclidean" => Ok(false),
        other => Err(format!("metric {other:?} is not euclidean or sqeuclidean")),
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_types(node, &[ElemType::F32])?;
    require_input_rank(node, 0, 2..=2)?;
    require_input_rank(node, 1, 2..=2)?;
    metric(node).map(|_| ()).map_err(Decline)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    let (sa, sb) = (a.shape(), b.shape());
    if sa[1] != sb[1] {
        bail!("A {sa:?} and B {sb:?} have rows of different lengths");
    }
    let dot = ops::matmul(a, &ops::transpose(b, s)?, s)?;
    let na = ops::sum_axes(&ops::square(a, s)?, &[1], true, s)?;
    let nb = ops::reshape(&ops::sum_axes(&ops::square(b, s)?, &[1], false, s)?, &[1, sb[0]], s)?;
    let d = ops::abs(&ops::add(&ops::add(&ops::scale(&dot, -2.0, s)?, &na, s)?, &nb, s)?, s)?;
    Ok(vec![if metric(node).map_err(ep_core::Error::new)? { ops::sqrt(&d, s)? } else { d }])
}

ep_core::register_lowering!(
    CDIST = FnLowering {
        domain: "com.microsoft",
        op: "CDist",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, register_spec};

    register_spec!(super::CDIST, || {
        (1..=5i64, 1..=5i64, 1..=8i64, any::<bool>(), seed())
            .prop_map(|(m, n, k, euclidean, seed)| {
                Case::domain_op("com.microsoft", "CDist", 1)
                    .input("a", DType::F32, &[m, k])
                    .input("b", DType::F32, &[n, k])
                    .attr_str("metric", if euclidean { "euclidean" } else { "sqeuclidean" })
                    .output("y", DType::F32, &[m, n])
                    .with_seed(seed)
            })
            .boxed()
    });
}
