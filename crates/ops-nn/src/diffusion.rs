//! The `com.microsoft` ops ORT's diffusion (UNet) optimizer fuses, which ORT runs on CUDA only:
//! - GroupNorm: a group normalization over channels-last (`channels_last=1`, the default) or
//!   channels-first 4-D input, groups of contiguous channels, statistics in float32 (biased
//!   variance, epsilon inside the root), `gamma`/`beta` per channel, then SiLU when
//!   `activation=1`; rounded to the input's type once;
//! - SkipGroupNorm: `S = x + skip (+ bias)` in the input's type (`skip` as `[N, H, W, C]`,
//!   `[N, 1, 1, C]` or `[N, C]`, `bias` per channel), GroupNorm of `S`; `S` is the optional
//!   second output (channels-last only, as the op defines its skip shapes);
//! - BiasAdd: `(x + bias) + skip` in the input's type, `x` and `skip` `[N, S, C]`;
//! - BiasSplitGelu: `x + bias` in the input's type, split in halves along the last axis,
//!   `left * gelu(right)` (erf form) in float32, rounded once.
//!
//! The CUDA kernels accept only some channel counts (BiasAdd 320, 640 or 1280, BiasSplitGelu
//! 2560, 5120 or 10240, GroupNorm up to 512 channels per group); these take any.

use crate::norm::{f32_of, standardize};
use ep_core::activation::Activation;
use ep_core::lowering::{FnLowering, input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const MS: &str = "com.microsoft";
const TYPES: &[ElemType] = &[ElemType::F32, ElemType::F16];

fn require_rank(node: &NodeInfo, i: usize, rank: usize, what: &str) -> std::result::Result<(), Decline> {
    match input_rank(node, i) {
        Some(r) if r != rank => Err(Decline(format!("{what} has rank {r}; {rank} expected"))),
        _ => Ok(()),
    }
}

/// The group norm's attributes: `(groups, epsilon, silu, channels_last)`.
fn group_attrs(node: &NodeInfo) -> std::result::Result<(i64, f64, bool, bool), String> {
    let groups = node.attr_int("groups", 0)?;
    if groups < 1 {
        return Err(format!("groups is {groups}; it must be at least 1"));
    }
    let eps = node.attr_float("epsilon", 1e-5)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(format!("epsilon is {eps}; it must not be negative"));
    }
    let silu = match node.attr("activation").map(|_| node.attr_int("activation", 0)).transpose()? {
        Some(0) => false,
        Some(1) => true,
        Some(a) => return Err(format!("activation {a} is not one of 0 (none) and 1 (SiLU)")),
        None => return Err("the activation attribute is required".into()),
    };
    let channels_last = match node.attr_int("channels_last", 1)? {
        0 => false,
        1 => true,
        c => return Err(format!("channels_last {c} is not 0 or 1")),
    };
    Ok((groups, eps as f64, silu, channels_last))
}

fn claim_group_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let skip = node.op_type == "SkipGroupNorm";
    if skip {
        require_inputs(node, 4, 5)?;
    } else {
        require_inputs(node, 3, 3)?;
    }
    for i in 0..node.inputs.len() {
        require_input_type(node, i, TYPES)?;
    }
    let (_, _, _, channels_last) = group_attrs(node).map_err(Decline)?;
    if skip && !channels_last {
        return Err(Decline::new("SkipGroupNorm defines its skip shapes for channels-last input only"));
    }
    require_rank(node, 0, 4, "the input")?;
    require_rank(node, 1, 1, "gamma")?;
    require_rank(node, 2, 1, "beta")
}

/// `x` (the sum for SkipGroupNorm) normalized per (instance, group), scaled, shifted and
/// activated, in float32.
fn group_norm(x: &Array, gamma: &Array, beta: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let (groups, eps, silu, channels_last) = group_attrs(node).map_err(ep_core::Error::new)?;
    let shape = x.shape();
    if shape.len() != 4 {
        bail!("the input has shape {shape:?}; a 4-D input is expected");
    }
    let c = if channels_last { shape[3] } else { shape[1] };
    if c % groups != 0 {
        bail!("{c} channels do not divide into {groups} groups");
    }
    for (name, p) in [("gamma", gamma), ("beta", beta)] {
        if p.shape() != [c] {
            bail!("{name} has shape {:?}; it must hold the {c} channels", p.shape());
        }
    }
    let n = shape[0];
    let xf = f32_of(x, s)?;
    let (y, gamma, beta) = if channels_last {
        let grouped = ops::reshape(&xf, &[n, -1, groups, c / groups], s)?;
        let (y, _, _) = standardize(&grouped, &[1, 3], eps, s)?;
        (ops::reshape(&y, &shape, s)?, f32_of(gamma, s)?, f32_of(beta, s)?)
    } else {
        let grouped = ops::reshape(&xf, &[n, groups, -1], s)?;
        let (y, _, _) = standardize(&grouped, &[2], eps, s)?;
        let per = |p: &Array| -> Result<Array> { Ok(ops::reshape(&f32_of(p, s)?, &[c, 1, 1], s)?) };
        (ops::reshape(&y, &shape, s)?, per(gamma)?, per(beta)?)
    };
    let y = ops::add(&ops::multiply(&y, &gamma, s)?, &beta, s)?;
    Ok(if silu { ops::multiply(&y, &ops::sigmoid(&y, s)?, s)? } else { y })
}

fn lower_group_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let y = group_norm(x, ctx.input(1)?, ctx.input(2)?, node, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?])
}

fn lower_skip_group_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let shape = x.shape();
    if shape.len() != 4 {
        bail!("the input has shape {shape:?}; a 4-D input is expected");
    }
    let (n, c) = (shape[0], shape[3]);
    let skip = ctx.input(3)?;
    let skip = match skip.shape().as_slice() {
        sk if sk == shape.as_slice() || sk == [n, 1, 1, c] => skip.clone(),
        [a, b] if [*a, *b] == [n, c] => ops::reshape(skip, &[n, 1, 1, c], s)?,
        other => bail!("skip has shape {other:?}; {shape:?}, [{n}, 1, 1, {c}] or [{n}, {c}] expected"),
    };
    let mut sum = ops::add(x, &ops::astype(&skip, x.dtype(), s)?, s)?;
    if let Some(bias) = ctx.optional_input(4) {
        if bias.shape() != [c] {
            bail!("bias has shape {:?}; it must hold the {c} channels", bias.shape());
        }
        sum = ops::add(&sum, &ops::astype(bias, x.dtype(), s)?, s)?;
    }
    let y = group_norm(&sum, ctx.input(1)?, ctx.input(2)?, node, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?, sum])
}

ep_core::register_lowering!(
    GROUP_NORM_MS = FnLowering {
        domain: MS,
        op: "GroupNorm",
        opsets: 1..=i32::MAX,
        claim: claim_group_norm,
        lower: lower_group_norm,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    SKIP_GROUP_NORM = FnLowering {
        domain: MS,
        op: "SkipGroupNorm",
        opsets: 1..=i32::MAX,
        claim: claim_group_norm,
        lower: lower_skip_group_norm,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_bias_add(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    for i in 0..3 {
        require_input_type(node, i, TYPES)?;
    }
    require_rank(node, 0, 3, "the input")?;
    require_rank(node, 1, 1, "the bias")?;
    require_rank(node, 2, 3, "skip")
}

fn lower_bias_add(ctx: &mut LowerCtx<'_>, _: &NodeInfo) -> Result<Vec<Array>> {
    let (x, bias, skip, s) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?, ctx.stream());
    let shape = x.shape();
    if shape.len() != 3 || skip.shape() != shape || bias.shape() != [shape[2]] {
        bail!(
            "input {shape:?}, bias {:?} and skip {:?}: [N, S, C], [C] and [N, S, C] expected",
            bias.shape(),
            skip.shape()
        );
    }
    Ok(vec![ops::add(&ops::add(x, bias, s)?, skip, s)?])
}

ep_core::register_lowering!(
    BIAS_ADD = FnLowering {
        domain: MS,
        op: "BiasAdd",
        opsets: 1..=i32::MAX,
        claim: claim_bias_add,
        lower: lower_bias_add,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_bias_split_gelu(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    for i in 0..2 {
        require_input_type(node, i, TYPES)?;
    }
    require_rank(node, 0, 3, "the input")?;
    require_rank(node, 1, 1, "the bias")
}

fn lower_bias_split_gelu(ctx: &mut LowerCtx<'_>, _: &NodeInfo) -> Result<Vec<Array>> {
    let (x, bias, s) = (ctx.input(0)?, ctx.input(1)?, ctx.stream());
    let shape = x.shape();
    let d = shape.last().copied().unwrap_or(0);
    if shape.len() != 3 || bias.shape() != [d] || d % 2 != 0 {
        bail!("input {shape:?} and bias {:?}: [N, S, D] and [D] with D even expected", bias.shape());
    }
    let sum = ops::add(x, bias, s)?;
    let halves = ops::split_at(&f32_of(&sum, s)?, &[d / 2], 2, s)?;
    let [left, right] = &halves[..] else { bail!("the split gave {} parts", halves.len()) };
    let gelu = Activation::Gelu.apply(right, s)?;
    Ok(vec![ops::astype(&ops::multiply(left, &gelu, s)?, x.dtype(), s)?])
}

ep_core::register_lowering!(
    BIAS_SPLIT_GELU = FnLowering {
        domain: MS,
        op: "BiasSplitGelu",
        opsets: 1..=i32::MAX,
        claim: claim_bias_split_gelu,
        lower: lower_bias_split_gelu,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

/// ORT's CPU EP has no kernel for these ops: each case carries a reference graph of standard
/// ops computing the op as its specification defines it, in float32.
#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    fn ints(v: &[i64]) -> Values {
        Values::Data(v.iter().map(|&x| x as f64).collect())
    }

    fn scalar(case: Case, name: &str, v: f64) -> Case {
        case.reference_constant(name, DType::F32, &[], Values::Data(vec![v]))
    }

    fn to(t: DType) -> Vec<(&'static str, Attr)> {
        vec![("to", Attr::Int(t.onnx_code()))]
    }

    /// Reference nodes: the group norm of `x` (float32, 4-D `shape`) into `y` (type `t`).
    fn group_norm_reference(case: Case, x: &str, shape: &[i64], groups: i64, silu: bool, last: bool, t: DType) -> Case {
        let (n, c) = (shape[0], if last { shape[3] } else { shape[1] });
        let (grouped, axes, param) = if last {
            (vec![n, -1, groups, c / groups], vec![1, 3], vec![c])
        } else {
            (vec![n, groups, -1], vec![2], vec![c, 1, 1])
        };
        let mean = |axes: &[i64]| vec![("axes", Attr::Ints(axes.to_vec())), ("keepdims", Attr::Int(1))];
        let case = case
            .reference_constant("grouped_shape", DType::I64, &[grouped.len() as i64], ints(&grouped))
            .reference_constant("x_shape", DType::I64, &[4], ints(shape))
            .reference_constant("param_shape", DType::I64, &[param.len() as i64], ints(&param));
        let case = scalar(case, "eps", 1e-5);
        let case = case
            .reference("Reshape", &[x, "grouped_shape"], &["g"], vec![])
            .reference("ReduceMean", &["g"], &["mean"], mean(&axes))
            .reference("Sub", &["g", "mean"], &["centered"], vec![])
            .reference("Mul", &["centered", "centered"], &["sq"], vec![])
            .reference("ReduceMean", &["sq"], &["var"], mean(&axes))
            .reference("Add", &["var", "eps"], &["var_eps"], vec![])
            .reference("Sqrt", &["var_eps"], &["root"], vec![])
            .reference("Div", &["centered", "root"], &["normed"], vec![])
            .reference("Reshape", &["normed", "x_shape"], &["unflat"], vec![])
            .reference("Cast", &["gamma"], &["gamma_f"], to(DType::F32))
            .reference("Cast", &["beta"], &["beta_f"], to(DType::F32))
            .reference("Reshape", &["gamma_f", "param_shape"], &["gamma_c"], vec![])
            .reference("Reshape", &["beta_f", "param_shape"], &["beta_c"], vec![])
            .reference("Mul", &["unflat", "gamma_c"], &["scaled"], vec![])
            .reference("Add", &["scaled", "beta_c"], &["shifted"], vec![]);
        let case = if silu {
            case.reference("Sigmoid", &["shifted"], &["gate"], vec![]).reference(
                "Mul",
                &["shifted", "gate"],
                &["activated"],
                vec![],
            )
        } else {
            case.reference("Identity", &["shifted"], &["activated"], vec![])
        };
        case.reference("Cast", &["activated"], &["y"], to(t))
    }

    fn group_shape() -> BoxedStrategy<(DType, DType, Vec<i64>, i64)> {
        (float_dtype(), float_dtype(), 1..=2i64, 1..=3i64, 1..=3i64, 1..=3i64, 1..=3i64)
            .prop_map(|(t, p, n, h, w, groups, per)| (t, p, vec![n, h, w, groups * per], groups))
            .boxed()
    }

    register_spec!(super::GROUP_NORM_MS, || {
        (group_shape(), any::<(bool, bool)>(), seed())
            .prop_map(|((t, p, nhwc, groups), (silu, last), seed)| {
                let c = nhwc[3];
                let shape = if last { nhwc } else { vec![nhwc[0], c, nhwc[1], nhwc[2]] };
                let case = Case::domain_op("com.microsoft", "GroupNorm", 1)
                    .input("x", t, &shape)
                    .input("gamma", p, &[c])
                    .input("beta", p, &[c])
                    .attr_int("groups", groups)
                    .attr_int("activation", silu as i64)
                    .attr_int("channels_last", last as i64)
                    .attr_float("epsilon", 1e-5)
                    .output("y", t, &shape)
                    .with_seed(seed)
                    .reference("Cast", &["x"], &["x_f"], to(DType::F32));
                group_norm_reference(case, "x_f", &shape, groups, silu, last, t)
            })
            .boxed()
    });

    register_spec!(super::SKIP_GROUP_NORM, || {
        (group_shape(), 0..3usize, any::<(bool, bool, bool)>(), seed())
            .prop_map(|((t, p, shape, groups), skip_form, (silu, bias, sum_out), seed)| {
                let (n, c) = (shape[0], shape[3]);
                let skip = match skip_form {
                    0 => shape.clone(),
                    1 => vec![n, 1, 1, c],
                    _ => vec![n, c],
                };
                let skip4 = if skip_form == 0 { shape.clone() } else { vec![n, 1, 1, c] };
                let case = Case::domain_op("com.microsoft", "SkipGroupNorm", 1)
                    .input("x", t, &shape)
                    .input("gamma", p, &[c])
                    .input("beta", p, &[c])
                    .input("skip", t, &skip);
                let case = if bias { case.input("bias", t, &[c]) } else { case };
                let case = case
                    .attr_int("groups", groups)
                    .attr_int("activation", silu as i64)
                    .attr_float("epsilon", 1e-5)
                    .output("y", t, &shape);
                let case = if sum_out { case.output("s", t, &shape) } else { case };
                let case = case
                    .with_seed(seed)
                    .reference_constant("skip_shape", DType::I64, &[4], ints(&skip4))
                    .reference("Reshape", &["skip", "skip_shape"], &["skip4"], vec![])
                    .reference("Add", &["x", "skip4"], &["sum0"], vec![]);
                let sum = if sum_out { "s" } else { "sum" };
                let case = if bias {
                    case.reference("Add", &["sum0", "bias"], &[sum], vec![])
                } else {
                    case.reference("Identity", &["sum0"], &[sum], vec![])
                };
                let case = case.reference("Cast", &[sum], &["sum_f"], to(DType::F32));
                group_norm_reference(case, "sum_f", &shape, groups, silu, true, t)
            })
            .boxed()
    });

    register_spec!(super::BIAS_ADD, || {
        (float_dtype(), 1..=2i64, 1..=4i64, 1..=8i64, seed())
            .prop_map(|(t, n, sq, c, seed)| {
                Case::domain_op("com.microsoft", "BiasAdd", 1)
                    .input("x", t, &[n, sq, c])
                    .input("bias", t, &[c])
                    .input("skip", t, &[n, sq, c])
                    .output("y", t, &[n, sq, c])
                    .with_seed(seed)
                    .reference("Add", &["x", "bias"], &["biased"], vec![])
                    .reference("Add", &["biased", "skip"], &["y"], vec![])
            })
            .boxed()
    });

    register_spec!(super::BIAS_SPLIT_GELU, || {
        (float_dtype(), 1..=2i64, 1..=4i64, 1..=6i64, seed())
            .prop_map(|(t, n, sq, half, seed)| {
                let d = 2 * half;
                let case = Case::domain_op("com.microsoft", "BiasSplitGelu", 1)
                    .input("x", t, &[n, sq, d])
                    .input("bias", t, &[d])
                    .output("y", t, &[n, sq, half])
                    .with_seed(seed);
                let case =
                    scalar(scalar(scalar(case, "half", 0.5), "one", 1.0), "rsqrt2", std::f64::consts::FRAC_1_SQRT_2);
                case.reference("Add", &["x", "bias"], &["sum"], vec![])
                    .reference("Cast", &["sum"], &["sum_f"], to(DType::F32))
                    .reference("Split", &["sum_f"], &["left", "right"], vec![("axis", Attr::Int(-1))])
                    .reference("Mul", &["right", "rsqrt2"], &["scaled"], vec![])
                    .reference("Erf", &["scaled"], &["erf"], vec![])
                    .reference("Add", &["erf", "one"], &["erf1"], vec![])
                    .reference("Mul", &["right", "half"], &["half_right"], vec![])
                    .reference("Mul", &["half_right", "erf1"], &["gelu"], vec![])
                    .reference("Mul", &["left", "gelu"], &["product"], vec![])
                    .reference("Cast", &["product"], &["y"], to(t))
            })
            .boxed()
    });
}
