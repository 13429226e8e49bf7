//! Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
//! ReduceLogSum, ReduceLogSumExp, ReduceSumSquare. Axes come from the attribute (before opset
//! 13 for ReduceSum, 18 for the others) or the optional input; `keepdims` and
//! `noop_with_empty_axes` as ONNX defines them.

use ep_core::lowering::{FnLowering, normalize_axis, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

const TYPES: &[ElemType] = &[
    ElemType::F32,
    ElemType::F16,
    ElemType::BF16,
    ElemType::F64,
    ElemType::I32,
    ElemType::I64,
    ElemType::U8,
    ElemType::I8,
];

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 2)?;
    // ReduceMax and ReduceMin take bool from opset 20 (any and all).
    let bool_ok = matches!(node.op_type.as_str(), "ReduceMax" | "ReduceMin") && node.since_version >= 20;
    if !(bool_ok && node.input(0).and_then(|v| v.elem_type) == Some(ElemType::Bool)) {
        require_input_type(node, 0, TYPES)?;
    }
    if node.op_type == "ReduceLogSumExp"
        && node
            .input(0)
            .and_then(|v| v.elem_type)
            .is_some_and(|t| matches!(t, ElemType::I32 | ElemType::I64 | ElemType::U8 | ElemType::I8))
    {
        // ORT's integer form rounds its partial sums in the integer type by a rule of its own
        // (the log-sum-exp of seven 5s and ten 4s is 6, of seven -5s and ten -6s -3).
        return Err(Decline::new("ReduceLogSumExp of integers is left to ORT's CPU EP"));
    }
    require_input_type(node, 1, &[ElemType::I64])
}

/// The first opset whose axes are an input.
fn axes_input_since(kind: Kind) -> i32 {
    if kind == Kind::Sum { 13 } else { 18 }
}

fn reduce(ctx: &mut LowerCtx<'_>, node: &NodeInfo, kind: Kind) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let r = shape.len();
    let keep = node.attr_int("keepdims", 1)? == 1;
    let axes: Option<Vec<i64>> = if node.since_version >= axes_input_since(kind) {
        if ctx.optional_input(1).is_some() { Some(ctx.host_i64(1)?) } else { None }
    } else {
        node.attr_ints("axes")?.map(<[i64]>::to_vec)
    };
    // With noop_with_empty_axes nothing is reduced, but L1, L2, LogSum and SumSquare still
    // apply their elementwise parts (as ORT's CPU EP does).
    let axes = match axes {
        // A scalar has nothing to reduce, whatever the axes (as ORT's CPU EP answers it).
        _ if r == 0 => Vec::new(),
        Some(a) if !a.is_empty() => a,
        _ if node.attr_int("noop_with_empty_axes", 0)? == 1 => Vec::new(),
        _ => (0..r as i64).collect(),
    };
    if x.size() == 0 {
        return Ok(vec![empty_input(kind, x, &axes, keep, ctx.stream_for(x.dtype()), ctx.cpu_stream())?]);
    }
    let mut axes: Vec<usize> = axes.iter().map(|&a| normalize_axis(a, r)).collect::<std::result::Result<_, _>>()?;
    axes.sort_unstable();
    axes.dedup();
    let dtype = x.dtype();
    let wide = widened(kind, dtype);
    let s = ctx.stream_for(wide.unwrap_or(dtype));
    // Half types accumulate in float32, as ORT's CPU EP does; bools are reduced as 0/1;
    // integers as `widened` says.
    let work = match (wide, dtype) {
        (Some(w), _) => ops::astype(x, w, s)?,
        (None, Dtype::F16 | Dtype::BF16) => ops::astype(x, Dtype::F32, s)?,
        (None, Dtype::Bool) => ops::astype(x, Dtype::U8, s)?,
        _ => x.clone(),
    };
    let pre = match kind {
        Kind::L1 => ops::abs(&work, s)?,
        Kind::L2 | Kind::SumSquare => ops::square(&work, s)?,
        _ => work,
    };
    // Size-1 axes need no reduction (and MLX's compiled CPU reduction crashed on one): only the
    // others are reduced; the size-1 ones are dropped by the final reshape when not kept.
    let reduced: Vec<i32> = axes.iter().filter(|&&a| shape[a] != 1).map(|&a| a as i32).collect();
    let y = if reduced.is_empty() {
        pre
    } else {
        match kind {
            Kind::Sum | Kind::L1 | Kind::L2 | Kind::SumSquare | Kind::LogSum => ops::sum_axes(&pre, &reduced, true, s)?,
            Kind::Mean => ops::mean_axes(&pre, &reduced, true, s)?,
            Kind::Max | Kind::Min if pre.dtype().is_float() => nan_as_ort(&pre, &reduced, kind == Kind::Max, s)?,
            Kind::Max => ops::max_axes(&pre, &reduced, true, s)?,
            Kind::Min => ops::min_axes(&pre, &reduced, true, s)?,
            Kind::Prod => ops::prod_axes(&pre, &reduced, true, s)?,
            Kind::LogSumExp => ops::logsumexp_axes(&pre, &reduced, true, s)?,
        }
    };
    let y = match kind {
        Kind::L2 => ops::sqrt(&y, s)?,
        Kind::LogSum => ops::log(&y, s)?,
        _ => y,
    };
    let out_shape: Vec<i64> =
        (0..r).filter_map(|d| if axes.contains(&d) { keep.then_some(1) } else { Some(shape[d]) }).collect();
    let y = ops::reshape(&y, &out_shape, s)?;
    Ok(vec![if wide.is_some() { saturate(&y, dtype, s)? } else { cast_back(&y, dtype, s)? }])
}

/// The wider type an integer reduction runs in, as ORT's CPU EP reduces integers (in double,
/// the result cast back saturating, truncated toward zero): sums of smaller integers in int64
/// (exact, then clamped, which is ORT's answer while it is below 2^53), a product, sum of
/// squares, mean, norm or log of any integer in float64 (MLX's own integer mean divides in
/// float32, which loses digits past 2^24); int64 sums stay int64 (exact where ORT's double
/// rounds past 2^53, wrapping past 2^63 where it saturates; a decoder's lengths are such
/// sums, kept on the device). `None`: in the input's own type (and maxima and minima always).
fn widened(kind: Kind, dtype: Dtype) -> Option<Dtype> {
    if dtype.is_float() || dtype == Dtype::Bool {
        return None;
    }
    match kind {
        Kind::Max | Kind::Min => None,
        Kind::Sum | Kind::L1 if dtype == Dtype::I64 => None,
        // (Squares of int32 values overflow an int64 sum; past int32's range the answer
        // saturates anyway, so float64's rounding does not show.)
        Kind::Sum | Kind::L1 => Some(Dtype::I64),
        _ => Some(Dtype::F64),
    }
}

/// `y` (int64 or float64) back to the integer type `dtype`, clamped to its range.
fn saturate(y: &Array, dtype: Dtype, s: &Stream) -> Result<Array> {
    let (lo, hi) = match dtype {
        Dtype::I8 => (i8::MIN as f64, i8::MAX as f64),
        Dtype::U8 => (0.0, u8::MAX as f64),
        Dtype::I32 => (i32::MIN as f64, i32::MAX as f64),
        // (2^63 itself is not an int64: it becomes the largest one below.)
        _ => (i64::MIN as f64, i64::MAX as f64),
    };
    let t = y.dtype();
    let clamped = ops::clip(y, Some(&ops::scalar(lo, t, s)?), Some(&ops::scalar(hi, t, s)?), s)?;
    let out = ops::astype(&clamped, dtype, s)?;
    if dtype == Dtype::I64 && t == Dtype::F64 {
        let top = ops::greater_equal(y, &ops::scalar(i64::MAX as f64, t, s)?, s)?;
        let max = ops::astype(&Array::from_slice(&[i64::MAX], &[])?, Dtype::I64, s)?;
        return Ok(ops::where_(&top, &max, &out, s)?);
    }
    Ok(out)
}

/// Max or min over `axes` (kept) as ORT's CPU EP computes it for floats: its running
/// comparison keeps the first element when that is NaN and skips every later NaN, so the result
/// is NaN exactly when the first element of the reduced block is, else the max (min) of the
/// others.
fn nan_as_ort(x: &Array, axes: &[i32], max: bool, s: &Stream) -> Result<Array> {
    let shape = x.shape();
    let stop: Vec<i64> =
        shape.iter().enumerate().map(|(d, &n)| if axes.contains(&(d as i32)) { 1 } else { n }).collect();
    let first = ops::slice(x, &vec![0; shape.len()], &stop, s)?;
    let skip = ops::scalar(if max { f64::NEG_INFINITY } else { f64::INFINITY }, x.dtype(), s)?;
    let clean = ops::where_(&ops::not_equal(x, x, s)?, &skip, x, s)?;
    let y = if max { ops::max_axes(&clean, axes, true, s)? } else { ops::min_axes(&clean, axes, true, s)? };
    Ok(ops::where_(&ops::not_equal(&first, &first, s)?, &first, &y, s)?)
}

/// The reduction of an input without elements, as ORT's CPU EP answers it: the axes are taken
/// as given (a negative or out-of-range one reduces nothing), and every output element is the
/// operation's identity (the type's lowest value for Max, LogSum and LogSumExp, its highest for
/// Min, 0 for Mean; for bool, false for Max and true for Min, as ONNX defines them where ORT's
/// CPU EP refuses).
fn empty_input(kind: Kind, x: &Array, axes: &[i64], keep: bool, s: &Stream, cpu: &Stream) -> Result<Array> {
    let shape = x.shape();
    let out: Vec<i64> = (0..shape.len())
        .filter_map(|d| if axes.contains(&(d as i64)) { keep.then_some(1) } else { Some(shape[d]) })
        .collect();
    let dtype = x.dtype();
    let (lowest, highest) = match dtype {
        Dtype::I8 => (i8::MIN as i64, i8::MAX as i64),
        Dtype::U8 => (0, u8::MAX as i64),
        Dtype::I32 => (i32::MIN as i64, i32::MAX as i64),
        Dtype::I64 => (i64::MIN, i64::MAX),
        // ONNX's identities: max of no bools is false (any), min true (all).
        Dtype::Bool => (0, 1),
        _ => (0, 0),
    };
    let value = if dtype.is_float() {
        let v = match kind {
            Kind::Prod => 1.0,
            Kind::Max | Kind::LogSum | Kind::LogSumExp => f64::NEG_INFINITY,
            Kind::Min => f64::INFINITY,
            _ => 0.0,
        };
        Array::from_slice(&[v], &[])?
    } else {
        let v = match kind {
            Kind::Prod => 1,
            Kind::Max | Kind::LogSum | Kind::LogSumExp => lowest,
            Kind::Min => highest,
            _ => 0,
        };
        Array::from_slice(&[v], &[])?
    };
    let value = ops::astype(&value, dtype, cpu)?;
    Ok(ops::full(&out, &value, dtype, s)?)
}

/// Back to the input type (integer means truncate toward zero, as integer division does).
fn cast_back(y: &Array, dtype: Dtype, s: &Stream) -> Result<Array> {
    Ok(ops::astype(y, dtype, s)?)
}

macro_rules! reductions {
    ($($name:ident: $op:expr, $kind:expr;)*) => {$(
        ep_core::register_lowering!($name = FnLowering {
            domain: "",
            op: $op,
            opsets: 1..=i32::MAX,
            claim,
            lower: |ctx, node| reduce(ctx, node, $kind),
            safety: CompileSafety::ShapeKeyed,
            growth: Some(growth),
        });
    )*};
}

/// A reduction absorbs growing axes it covers (MLX evaluates a mean's count when the graph
/// runs, not when it is traced); the axes come from the attribute or a constant input.
fn growth(q: &ep_core::growth::GrowthQuery<'_>) -> ep_core::growth::GrowthResult {
    let mut axes: Vec<i64> = q.node.attr_ints("axes").ok().flatten().map(<[i64]>::to_vec).unwrap_or_default();
    axes.extend(q.constant_i64(1).unwrap_or_default());
    let rank = q.node.input(0).and_then(ep_core::ValueInfo::rank).unwrap_or(0);
    ep_core::growth::reduction(q, &axes, rank)
}

reductions! {
    REDUCE_SUM: "ReduceSum", Kind::Sum;
    REDUCE_MEAN: "ReduceMean", Kind::Mean;
    REDUCE_MAX: "ReduceMax", Kind::Max;
    REDUCE_MIN: "ReduceMin", Kind::Min;
    REDUCE_PROD: "ReduceProd", Kind::Prod;
    REDUCE_L1: "ReduceL1", Kind::L1;
    REDUCE_L2: "ReduceL2", Kind::L2;
    REDUCE_LOG_SUM: "ReduceLogSum", Kind::LogSum;
    REDUCE_LOG_SUM_EXP: "ReduceLogSumExp", Kind::LogSumExp;
    REDUCE_SUM_SQUARE: "ReduceSumSquare", Kind::SumSquare;
}

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// Axes as attribute or input (by opset), negative or not, keepdims, and the empty-axes
    /// forms (reduce all, or `noop_with_empty_axes`).
    fn reduction(op: &'static str, input_since: u32, types: &'static [DType], positive: bool) -> BoxedStrategy<Case> {
        (select(types), nonempty_shape(1..=4), any::<u64>(), any::<(bool, bool)>(), 0..4u8, opset(11..=22), seed())
            .prop_map(move |(t, s, pick, (keep, noop), form, v, seed)| {
                // Bool inputs from opset 20.
                let v = if t == DType::Bool { v.max(20) } else { v };
                let r = s.len();
                let mut axes: Vec<i64> = (0..r as i64).filter(|i| pick >> i & 1 == 1).collect();
                if form == 0 {
                    axes.clear();
                }
                let neg = pick >> 10 & 1 == 1;
                let written: Vec<i64> = axes.iter().map(|&a| if neg { a - r as i64 } else { a }).collect();
                // Integers small, or (half the cases) large: int32 sums past its range (ORT
                // saturates them), int64 values past float32's digits, int64 products and
                // squares past int64's (saturated, in float64 on both sides).
                let large = seed >> 7 & 1 == 1 && !t.is_float() && t != DType::Bool;
                let (lo, hi): (f64, f64) = match (t, op) {
                    (DType::I64, "ReduceProd") if large => (-3e5, 3e5),
                    (DType::I64, _) if large => (-3e12, 3e12),
                    (_, _) if large => (-2e9, 2e9),
                    _ => (-9.0, 9.0),
                };
                let vals = if t == DType::Bool {
                    Values::Uniform { lo: 0.0, hi: 2.0 }
                } else if positive {
                    if t.is_float() {
                        Values::Uniform { lo: 0.1, hi: 2.0 }
                    } else {
                        Values::Uniform { lo: 1.0, hi: hi.max(9.0) }
                    }
                } else if t.is_float() {
                    Values::Uniform { lo: -2.0, hi: 2.0 }
                } else {
                    Values::Uniform { lo, hi }
                };
                let mut case = Case::op(op, v).input_with("x", t, &s, vals);
                let noop = noop && v >= input_since && axes.is_empty();
                if v >= input_since {
                    if !axes.is_empty() {
                        case = case.constant_i64("axes", &written);
                    }
                    if noop {
                        case = case.attr_int("noop_with_empty_axes", 1);
                    }
                } else if !axes.is_empty() {
                    case = case.attr_ints("axes", &written);
                }
                let all: Vec<i64> = (0..r as i64).collect();
                let reduced = if noop {
                    vec![]
                } else if axes.is_empty() {
                    all
                } else {
                    axes
                };
                let out: Vec<i64> = (0..r as i64)
                    .filter_map(|d| if reduced.contains(&d) { keep.then_some(1) } else { Some(s[d as usize]) })
                    .collect();
                case.attr_int("keepdims", keep as i64).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    }

    const FLOAT: &[DType] = &[DType::F32, DType::F32, DType::F16];
    const NUM: &[DType] = &[DType::F32, DType::F32, DType::F16, DType::I32, DType::I64];

    register_spec!(super::REDUCE_SUM, || reduction("ReduceSum", 13, NUM, false));
    register_spec!(super::REDUCE_MEAN, || reduction("ReduceMean", 18, NUM, false));
    const NUM_BOOL: &[DType] = &[DType::F32, DType::F32, DType::F16, DType::I32, DType::I64, DType::Bool];

    register_spec!(super::REDUCE_MAX, || reduction("ReduceMax", 18, NUM_BOOL, false));
    register_spec!(super::REDUCE_MIN, || reduction("ReduceMin", 18, NUM_BOOL, false));
    register_spec!(super::REDUCE_PROD, || reduction("ReduceProd", 18, NUM, false));
    register_spec!(super::REDUCE_L1, || reduction("ReduceL1", 18, NUM, false));
    register_spec!(super::REDUCE_L2, || reduction("ReduceL2", 18, NUM, false));
    register_spec!(super::REDUCE_LOG_SUM, || reduction("ReduceLogSum", 18, NUM, true));
    register_spec!(super::REDUCE_LOG_SUM_EXP, || reduction("ReduceLogSumExp", 18, FLOAT, false));
    register_spec!(super::REDUCE_SUM_SQUARE, || reduction("ReduceSumSquare", 18, NUM, false));
}
