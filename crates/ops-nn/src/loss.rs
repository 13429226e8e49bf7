//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12 on): per element, minus the
//! log-probability of its target class (times the class's weight), with `ignore_index` targets
//! counting as zero loss and zero weight; reduced by `none`, `sum` or `mean` (the weighted mean
//! divides by the weights of the targets not ignored: NaN when all are), as the ops' function
//! bodies, which ORT's CPU EP runs, compute them. SoftmaxCrossEntropyLoss takes the
//! log-softmax over the class axis first and can answer it as `log_prob`. A target outside
//! `[-C, C)` that is not ignored fails the run (negative ones count from the end, and a target
//! smaller than the input reads its leading part, as the bodies' GatherElements does).

use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn reduction(node: &NodeInfo) -> std::result::Result<&str, String> {
    match node.attr("reduction") {
        None => Ok("mean"),
        Some(AttrValue::String(r)) if ["none", "sum", "mean"].contains(&r.as_str()) => Ok(r),
        Some(other) => Err(format!("reduction {other:?} is not none, sum or mean")),
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 3)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::I32, ElemType::I64])?;
    require_input_type(node, 2, &[ElemType::F32])?;
    require_input_rank(node, 0, 2..=8)?;
    if node.input(2).is_some() {
        require_input_rank(node, 2, 1..=1)?;
    }
    reduction(node).map(|_| ()).map_err(Decline)
}

/// The loss of log-probabilities `logp` (`[N, C, d..]`) at `target` (`[N, d..]`).
fn nll(ctx: &mut LowerCtx<'_>, node: &NodeInfo, logp: &Array, target: &Array, weight: Option<&Array>) -> Result<Array> {
    let s = ctx.stream();
    let (ls, ts) = (logp.shape(), target.shape());
    let c = ls[1];
    // As the ops' GatherElements: the target may cover less than the input along any axis but
    // the class axis (the input's leading part is read), never more.
    let mut expect = ls.clone();
    expect.remove(1);
    if ts.len() != expect.len() || ts.iter().zip(&expect).any(|(t, x)| t > x) {
        bail!("the target {ts:?} must have the input's rank less its class axis and fit its shape ({expect:?})");
    }
    let logp = if ts != expect {
        let mut stop = ts.clone();
        stop.insert(1, c);
        ops::slice(logp, &vec![0; ls.len()], &stop, s)?
    } else {
        logp.clone()
    };
    let logp = &logp;
    let t = ops::astype(target, Dtype::I64, s)?;
    let zero_i = ops::scalar(0.0, Dtype::I64, s)?;
    let ignored = match node.attr("ignore_index") {
        Some(AttrValue::Int(v)) => Some(ops::equal(&t, &Array::from_slice(&[*v], &[])?, s)?),
        _ => None,
    };
    let t = match &ignored {
        Some(m) => ops::where_(m, &zero_i, &t, s)?,
        None => t,
    };
    if c == 0 || t.size() == 0 {
        if t.size() > 0 {
            bail!("the input has no classes");
        }
    } else {
        // Negative targets count from the end, as the ops' GatherElements reads them.
        let lo = ops::scalar(-c as f64, Dtype::I64, s)?;
        let top = ops::scalar((c - 1) as f64, Dtype::I64, s)?;
        let inside = ops::logical_and(&ops::greater_equal(&t, &lo, s)?, &ops::less_equal(&t, &top, s)?, s)?;
        ctx.check(&inside, format!("a target is outside [-{c}, {c}) and not ignored"))?;
    }
    let s = ctx.stream();
    let t = ops::where_(&ops::less(&t, &zero_i, s)?, &ops::add(&t, &ops::scalar(c as f64, Dtype::I64, s)?, s)?, &t, s)?;
    let top = ops::scalar((c - 1).max(0) as f64, Dtype::I64, s)?;
    let t = ops::clip(&t, Some(&zero_i), Some(&top), s)?;
    let zero = ops::scalar(0.0, Dtype::F32, s)?;
    let picked = if c == 0 {
        ops::full(&ts, &zero, Dtype::F32, s)?
    } else {
        let g = ops::take_along_axis(logp, &ops::expand_dims(&t, 1, s)?, 1, s)?;
        ops::reshape(&g, &ts, s)?
    };
    let mut loss = ops::negative(&picked, s)?;
    // The weights are gathered by target (the bodies' Gather): any length holding every target.
    let mut w = match weight {
        Some(w) if c > 0 && t.size() > 0 => {
            let n = w.size() as i64;
            if n == 0 {
                bail!("the weight is empty");
            }
            let inside = ops::less(&t, &ops::scalar(n as f64, Dtype::I64, s)?, s)?;
            let inside = match &ignored {
                Some(m) => ops::logical_or(&inside, m, s)?,
                None => inside,
            };
            ctx.check(&inside, format!("a target is past the weight's {n} values"))?;
            let s = ctx.stream();
            let idx = ops::minimum(&t, &ops::scalar((n - 1) as f64, Dtype::I64, s)?, s)?;
            Some(ops::take(w, &idx, 0, s)?)
        }
        Some(_) => Some(ops::full(&ts, &zero, Dtype::F32, s)?),
        None => None,
    };
    let s = ctx.stream();
    if let Some(m) = &ignored {
        loss = ops::where_(m, &zero, &loss, s)?;
        let one = ops::scalar(1.0, Dtype::F32, s)?;
        w = Some(ops::where_(m, &zero, w.as_ref().unwrap_or(&one), s)?);
    }
    if let Some(w) = &w {
        loss = ops::multiply(&loss, w, s)?;
    }
    let all: Vec<i32> = (0..ts.len() as i32).collect();
    Ok(match reduction(node).map_err(ep_core::Error::new)? {
        "none" => loss,
        "sum" => ops::sum_axes(&loss, &all, false, s)?,
        // The mean of no targets: 0, as ORT's CPU EP answers it (where all of them are
        // ignored, 0 / 0).
        _ if loss.size() == 0 => ops::full(&[], &zero, Dtype::F32, s)?,
        _ => match &w {
            Some(w) => ops::divide(&ops::sum_axes(&loss, &all, false, s)?, &ops::sum_axes(w, &all, false, s)?, s)?,
            None => ops::mean_axes(&loss, &all, false, s)?,
        },
    })
}

fn lower_nll(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, t) = (ctx.input(0)?.clone(), ctx.input(1)?.clone());
    let w = ctx.optional_input(2).cloned();
    Ok(vec![nll(ctx, node, &x, &t, w.as_ref())?])
}

ep_core::register_lowering!(
    NLL_LOSS = FnLowering {
        domain: "",
        op: "NegativeLogLikelihoodLoss",
        opsets: 12..=i32::MAX,
        claim,
        lower: lower_nll,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

/// SoftmaxCrossEntropyLoss: ORT checks its body's NegativeLogLikelihoodLoss against the declared
/// shapes, so a target whose declared dims differ from the scores' (less the class axis) is
/// refused when the model loads; this declines it alike.
fn claim_sce(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim(node)?;
    let dims = |i: usize| node.input(i).and_then(|v| v.shape.clone());
    if let (Some(mut x), Some(t)) = (dims(0), dims(1)) {
        x.remove(1);
        if x.len() != t.len() || x.iter().zip(&t).any(|(a, b)| matches!((a, b), (Some(a), Some(b)) if a != b)) {
            return Err(Decline::new("the target's declared dims differ from the scores' less the class axis"));
        }
    }
    Ok(())
}

fn lower_sce(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, t) = (ctx.input(0)?.clone(), ctx.input(1)?.clone());
    let w = ctx.optional_input(2).cloned();
    let s = ctx.stream();
    // (x - max) - log(sum(e^(x - max))), as ORT's LogSoftmax orders it (an infinity gives NaN).
    let logp = if x.size() == 0 {
        x.clone()
    } else {
        let shifted = ops::subtract(&x, &ops::max_axes(&x, &[1], true, s)?, s)?;
        let sum = ops::sum_axes(&ops::exp(&shifted, s)?, &[1], true, s)?;
        ops::subtract(&shifted, &ops::log(&sum, s)?, s)?
    };
    let loss = nll(ctx, node, &logp, &t, w.as_ref())?;
    let mut out = vec![loss, logp];
    out.truncate(node.outputs.len().clamp(1, 2));
    Ok(out)
}

ep_core::register_lowering!(
    SCE_LOSS = FnLowering {
        domain: "",
        op: "SoftmaxCrossEntropyLoss",
        opsets: 12..=i32::MAX,
        claim: claim_sce,
        lower: lower_sce,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    fn case(op: &'static str) -> BoxedStrategy<Case> {
        (
            (1..=3i64, 1..=4i64, shape(0..=2)),
            select(&["none", "sum", "mean"][..]),
            any::<(bool, bool, bool)>(),
            dtype_of(&[DType::I64, DType::I32]),
            seed(),
        )
            .prop_map(move |((n, c, rest), reduction, (weight, ignore, log_prob), tt, seed)| {
                let rest: Vec<i64> = rest.iter().map(|&d| d.max(1)).collect();
                let x = [vec![n, c], rest.clone()].concat();
                let t = [vec![n], rest].concat();
                let input = if op == "NegativeLogLikelihoodLoss" {
                    Values::Uniform { lo: -3.0, hi: 0.0 }
                } else {
                    Values::Uniform { lo: -2.0, hi: 2.0 }
                };
                let mut case = Case::op(op, 13).input_with("x", DType::F32, &x, input).input_with(
                    "target",
                    tt,
                    &t,
                    Values::Uniform { lo: 0.0, hi: c as f64 },
                );
                if weight {
                    case = case.input_with("weight", DType::F32, &[c], Values::Uniform { lo: 0.1, hi: 2.0 });
                }
                if ignore {
                    case = case.attr_int("ignore_index", (seed % c as u64) as i64);
                }
                let out: Vec<i64> = if reduction == "none" { t.clone() } else { vec![] };
                case = case.attr_str("reduction", reduction).output("y", DType::F32, &out);
                if op == "SoftmaxCrossEntropyLoss" && log_prob {
                    case = case.output("log_prob", DType::F32, &x);
                }
                case.with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::NLL_LOSS, || case("NegativeLogLikelihoodLoss"));
    register_spec!(super::SCE_LOSS, || case("SoftmaxCrossEntropyLoss"));
}
