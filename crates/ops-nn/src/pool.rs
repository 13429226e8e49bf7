//! Pooling: MaxPool, AveragePool, LpPool (strides, dilations, pads, `auto_pad`, `ceil_mode`,
//! `count_include_pad`) as a strided window view reduced over its window axes, and the global
//! forms (GlobalMaxPool, GlobalAveragePool, GlobalLpPool) as reductions over the spatial axes;
//! `com.microsoft` NhwcMaxPool (8-bit integers, channels last) through the same window.

use crate::window::{Window, windows};
use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Average,
    Lp,
}

fn claim_pool(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    // MaxPool takes 8-bit integers too (opset 12 on), compared exactly in float32.
    if node.op_type == "MaxPool" && node.since_version >= 12 {
        require_input_type(node, 0, &[FLOATS, &[ElemType::I8, ElemType::U8]].concat())?;
    } else {
        require_input_type(node, 0, FLOATS)?;
    }
    claim_window(node)
}

/// The pooling attributes and the input's rank (3 to 5) and dims, for any layout.
pub(crate) fn claim_window(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let indices = node.outputs.iter().skip(1).any(Option::is_some);
    // (Checked against ORT's kernel in float32; other types are left to it.)
    if indices && (node.op_type != "MaxPool" || ep_core::lowering::input_type(node, 0) != Some(ElemType::F32)) {
        return Err(Decline::new("the Indices output is taken for float32 MaxPool only"));
    }
    // Column-major indices over two spatial axes (the order is moot without indices).
    match node.attr_int("storage_order", 0)? {
        0 => {}
        1 if !indices || ep_core::lowering::input_rank(node, 0) == Some(4) => {}
        other => return Err(Decline(format!("storage_order={other} is taken for 2-D indices only"))),
    }
    let Some(kernel) = node.attr_ints("kernel_shape")? else {
        return Err(Decline::new("kernel_shape is required"));
    };
    if kernel.iter().any(|&k| k < 1) {
        return Err(Decline(format!("kernel_shape {kernel:?} has a size below 1")));
    }
    for name in ["strides", "dilations"] {
        if let Some(v) = node.attr_ints(name)?
            && v.iter().any(|&x| x < 1)
        {
            return Err(Decline(format!("{name} {v:?} has a value below 1")));
        }
    }
    // As ORT's CPU EP requires (it refuses such a node when the session is created).
    if let Some(pads) = node.attr_ints("pads")?
        && pads.iter().enumerate().any(|(i, &p)| p < 0 || kernel.get(i % kernel.len()).is_some_and(|&k| p >= k))
    {
        return Err(Decline(format!("pads {pads:?} must be non-negative and smaller than kernel_shape {kernel:?}")));
    }
    crate::window::claim_same_pad_dilation(node)?;
    match ep_core::lowering::input_rank(node, 0) {
        Some(3..=5) => claim_nonempty(node),
        r => Err(Decline(format!("input rank {r:?}: 1-D, 2-D and 3-D pools are supported"))),
    }
}

/// Declines a declared empty dimension: the CPU EP answers an empty batch and refuses any other
/// (ORT's layout transformer refuses an empty channel axis before a node runs).
fn claim_nonempty(node: &NodeInfo) -> std::result::Result<(), Decline> {
    match node.input(0).and_then(|v| v.shape.as_ref()) {
        Some(dims) if dims.contains(&Some(0)) => Err(Decline::new("an empty input dimension is left to the CPU EP")),
        _ => Ok(()),
    }
}

/// For a pool input `[N, C, *spatial]` with an empty dimension: the empty result when the batch
/// is empty, else an error, as ORT's CPU EP answers.
fn empty_pool(shape: &[i64], out_spatial: impl FnOnce() -> Result<Vec<i64>>) -> Result<Option<Vec<i64>>> {
    if !shape.contains(&0) {
        return Ok(None);
    }
    if shape[0] != 0 {
        bail!("invalid input shape {shape:?}: only the batch may be empty");
    }
    Ok(Some([vec![0, shape[1]], out_spatial()?].concat()))
}

fn pool(ctx: &mut LowerCtx<'_>, node: &NodeInfo, kind: Kind) -> Result<Vec<Array>> {
    if kind == Kind::Max && node.output(1).is_some() {
        return max_pool_with_indices(ctx.input(0)?, node, ctx.stream());
    }
    Ok(vec![pool_of(ctx.input(0)?, node, kind, ctx.stream())?])
}

/// MaxPool with its Indices output, as ORT's CPU kernel computes both in one scan: each window
/// starts from its first element inside the input and takes a later one only when strictly
/// greater (the first of equal maxima; NaN never replaces, and a NaN first element stays), the
/// index being the element's position in the flattened input (`(n * C + c) * spatial +
/// position`, the position row-major, or column-major over two spatial axes with
/// `storage_order=1`).
fn max_pool_with_indices(x: &Array, node: &NodeInfo, s: &Stream) -> Result<Vec<Array>> {
    let shape = x.shape();
    let k = shape.len() - 2;
    let kernel = node.attr_ints("kernel_shape")?.ok_or("kernel_shape is required")?.to_vec();
    let ceil = node.attr_int("ceil_mode", 0)? == 1;
    let w = Window::of_pool(node, &shape[2..], kernel, ceil)?;
    let out = [shape[..2].to_vec(), w.out.clone()].concat();
    if shape.contains(&0) || w.out.contains(&0) {
        if shape.contains(&0) && shape[0] != 0 {
            bail!("invalid input shape {shape:?}: only the batch may be empty");
        }
        return Ok(vec![
            ops::full(&out, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?,
            ops::full(&out, &ops::scalar(0.0, Dtype::I64, s)?, Dtype::I64, s)?,
        ]);
    }
    let spatial = &shape[2..];
    // Each spatial position's index (row-major, or column-major), as a [1, 1, *spatial] map.
    let column = node.attr_int("storage_order", 0)? == 1;
    let mut strides = vec![1i64; k];
    for i in 0..k {
        strides[i] = if column { spatial[..i].iter().product() } else { spatial[i + 1..].iter().product() };
    }
    let positions: Vec<i64> = (0..spatial.iter().product::<i64>())
        .map(|flat| {
            let mut rest = flat;
            let mut at = 0;
            for i in (0..k).rev() {
                at += (rest % spatial[i]) * strides[i];
                rest /= spatial[i];
            }
            at
        })
        .collect();
    let map = Array::from_slice(&positions, &[vec![1, 1], spatial.to_vec()].concat())?;
    // Windows: [N, C, o1, k1, o2, k2, ...] -> [N, C, o1, o2, ..., k1 * k2 * ...].
    let mut perm: Vec<i32> = vec![0, 1];
    perm.extend((0..k as i32).map(|i| 2 + 2 * i));
    perm.extend((0..k as i32).map(|i| 3 + 2 * i));
    let taps: i64 = w.kernel.iter().product();
    let flat = |a: &Array, lead: &[i64]| -> Result<Array> {
        let t = ops::transpose_axes(a, &perm, s)?;
        Ok(ops::reshape(&t, &[lead.to_vec(), w.out.clone(), vec![taps]].concat(), s)?)
    };
    let raw = flat(&windows(x, &w, f64::NEG_INFINITY, s)?, &shape[..2])?;
    let places = ops::broadcast_to(&flat(&windows(&map, &w, -1.0, s)?, &[1, 1])?, &raw.shape(), s)?;
    // The window's first element inside the input, then the first later one strictly
    // greater than all before it: the first of the largest non-NaN elements where that is
    // greater; a NaN first element stays. (A dilated window may hold no element of the
    // input: float32's lowest value there, at position -1 on every axis, as ORT answers.)
    let inside = ops::greater_equal(&places, &ops::scalar(0.0, Dtype::I64, s)?, s)?;
    let any_inside = ops::any_axes(&inside, &[-1], true, s)?;
    let first = ops::argmax_axis(&inside, -1, true, s)?;
    let first_value = ops::take_along_axis(&raw, &first, -1, s)?;
    let neg_inf = ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?;
    let skipped =
        ops::where_(&ops::logical_and(&inside, &ops::logical_not(&ops::isnan(&raw, s)?, s)?, s)?, &raw, &neg_inf, s)?;
    let top = ops::max_axes(&skipped, &[-1], true, s)?;
    let later = ops::argmax_axis(&skipped, -1, true, s)?;
    let replaced = ops::greater(&top, &first_value, s)?;
    let tap = ops::where_(&replaced, &later, &first, s)?;
    let none = ops::scalar(-strides.iter().sum::<i64>() as f64, Dtype::I64, s)?;
    let place = ops::where_(&any_inside, &ops::take_along_axis(&places, &tap, -1, s)?, &none, s)?;
    let lowest = ops::scalar(f64::from(f32::MIN), Dtype::F32, s)?;
    let value = ops::where_(&any_inside, &ops::where_(&replaced, &top, &first_value, s)?, &lowest, s)?;
    let x_step: i64 = spatial.iter().product();
    let mut cshape = vec![shape[0], shape[1]];
    cshape.resize(2 + k + 1, 1);
    let channel = ops::arange(0.0, (shape[0] * shape[1]) as f64, 1.0, Dtype::I64, s)?;
    let offset = ops::multiply(&ops::reshape(&channel, &cshape, s)?, &ops::scalar(x_step as f64, Dtype::I64, s)?, s)?;
    let index = ops::reshape(&ops::add(&place, &offset, s)?, &out, s)?;
    Ok(vec![ops::reshape(&value, &out, s)?, index])
}

/// `x` (NCHW-ordered: `[N, C, *spatial]`) pooled as `node`'s attributes say.
fn pool_of(x: &Array, node: &NodeInfo, kind: Kind, s: &Stream) -> Result<Array> {
    let shape = x.shape();
    let k = shape.len() - 2;
    let kernel = node.attr_ints("kernel_shape")?.ok_or("kernel_shape is required")?.to_vec();
    let ceil = node.attr_int("ceil_mode", 0)? == 1;
    if let Some(out) = empty_pool(&shape, || Ok(Window::of_pool(node, &shape[2..], kernel.clone(), ceil)?.out))? {
        return Ok(ops::full(&out, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?);
    }
    let w = Window::of_pool(node, &shape[2..], kernel, ceil)?;
    if w.out.contains(&0) {
        let out = [shape[..2].to_vec(), w.out.clone()].concat();
        return Ok(ops::full(&out, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?);
    }
    let axes: Vec<i32> = (0..k as i32).map(|i| 3 + 2 * i).collect();
    let t = x.dtype();
    let work = if t == Dtype::F32 { x.clone() } else { ops::astype(x, Dtype::F32, s)? };
    let y = match kind {
        Kind::Max if t == Dtype::F32 && k > 1 => {
            ops::max_axes(&windows(&work, &w, f64::NEG_INFINITY, s)?, &axes, false, s)?
        }
        Kind::Max => {
            // As ORT's CPU kernel for half types and over one axis: NaN passed over, and
            // float32's lowest value as the start (a window of NaN or -inf only gives it, -inf
            // once rounded). (Over more axes its float32 NaN answers depend on where the NaN
            // falls; MLX propagates NaN there.)
            let skipped =
                ops::where_(&ops::isnan(&work, s)?, &ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?, &work, s)?;
            let m = ops::max_axes(&windows(&skipped, &w, f64::NEG_INFINITY, s)?, &axes, false, s)?;
            ops::maximum(&m, &ops::scalar(f32::MIN as f64, Dtype::F32, s)?, s)?
        }
        Kind::Lp => {
            let p = node.attr_int("p", 2)? as f64;
            let powered = ops::power(&ops::abs(&work, s)?, &ops::scalar(p, Dtype::F32, s)?, s)?;
            let sum = ops::sum_axes(&windows(&powered, &w, 0.0, s)?, &axes, false, s)?;
            ops::power(&sum, &ops::scalar(1.0 / p, Dtype::F32, s)?, s)?
        }
        Kind::Average => {
            let sum = ops::sum_axes(&windows(&work, &w, 0.0, s)?, &axes, false, s)?;
            // The divisor counts the window's input elements, and its explicit pads when
            // count_include_pad=1 (never the extra end padding of ceil_mode): per axis on the
            // host, multiplied across axes.
            let include = node.attr_int("count_include_pad", 0)? == 1;
            let mut counts: Option<Array> = None;
            for i in 0..k {
                let (lo, len) =
                    if include { (0, shape[2 + i] + w.pad_lo[i] + w.pad_hi[i]) } else { (w.pad_lo[i], shape[2 + i]) };
                let c: Vec<f32> = (0..w.out[i])
                    .map(|o| {
                        (0..w.kernel[i])
                            .filter(|&t| (lo..lo + len).contains(&(o * w.strides[i] + t * w.dilations[i])))
                            .count() as f32
                    })
                    .collect();
                let mut cshape = vec![1i64; 2 + k];
                cshape[2 + i] = w.out[i];
                let c = Array::from_slice(&c, &cshape)?;
                counts = Some(match counts {
                    Some(acc) => ops::multiply(&acc, &c, s)?,
                    None => c,
                });
            }
            let counted = counts.ok_or("a pool needs a spatial axis")?;
            ops::divide(&sum, &counted, s)?
        }
    };
    Ok(ops::astype(&y, t, s)?)
}

fn claim_nhwc_max_pool(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::I8, ElemType::U8])?;
    claim_window(node)
}

/// `com.microsoft` NhwcMaxPool: MaxPool over 8-bit integers laid out `[N, *spatial, C]`.
fn nhwc_max_pool(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let r = x.ndim() as i32;
    let to_nchw: Vec<i32> = [0, r - 1].into_iter().chain(1..r - 1).collect();
    let to_nhwc: Vec<i32> = [0].into_iter().chain(2..r).chain([1]).collect();
    let y = pool_of(&ops::transpose_axes(x, &to_nchw, s)?, node, Kind::Max, s)?;
    Ok(vec![ops::transpose_axes(&y, &to_nhwc, s)?])
}

ep_core::register_lowering!(
    NHWC_MAX_POOL = FnLowering {
        domain: "com.microsoft",
        op: "NhwcMaxPool",
        opsets: 1..=i32::MAX,
        claim: claim_nhwc_max_pool,
        lower: nhwc_max_pool,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

macro_rules! pools {
    ($($name:ident: $op:expr, $since:expr, $kind:expr;)*) => {$(
        ep_core::register_lowering!($name = FnLowering {
            domain: "",
            op: $op,
            opsets: $since..=i32::MAX,
            claim: claim_pool,
            lower: |ctx, node| pool(ctx, node, $kind),
            safety: CompileSafety::ShapeKeyed,
            growth: None,
        });
    )*};
}

pools! {
    MAX_POOL: "MaxPool", 1, Kind::Max;
    AVERAGE_POOL: "AveragePool", 1, Kind::Average;
    LP_POOL: "LpPool", 2, Kind::Lp;
}

fn claim_global(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, FLOATS)?;
    // The CPU EP pools over 1 to 3 spatial axes.
    match ep_core::lowering::input_rank(node, 0) {
        Some(3..=5) => claim_nonempty(node),
        r => Err(Decline(format!("input rank {r:?}: 1 to 3 spatial axes are supported"))),
    }
}

fn global(ctx: &mut LowerCtx<'_>, node: &NodeInfo, kind: Kind) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream();
    let shape = x.shape();
    if let Some(out) = empty_pool(&shape, || Ok(vec![1; shape.len() - 2]))? {
        return Ok(vec![ops::full(&out, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?]);
    }
    let axes: Vec<i32> = (2..x.ndim() as i32).collect();
    let t = x.dtype();
    let work = if t == Dtype::F32 { x.clone() } else { ops::astype(x, Dtype::F32, s)? };
    let y = match kind {
        // Over one spatial axis ORT's CPU kernel starts from float32's lowest value and passes
        // NaN over (a row of NaN only gives that value). (Over more, its NaN answers depend on
        // where the NaN falls; MLX propagates NaN there.)
        Kind::Max if shape.len() == 3 => {
            let skipped =
                ops::where_(&ops::isnan(&work, s)?, &ops::scalar(f64::NEG_INFINITY, Dtype::F32, s)?, &work, s)?;
            let m = ops::max_axes(&skipped, &axes, true, s)?;
            ops::maximum(&m, &ops::scalar(f32::MIN as f64, Dtype::F32, s)?, s)?
        }
        Kind::Max => ops::max_axes(&work, &axes, true, s)?,
        Kind::Average => ops::mean_axes(&work, &axes, true, s)?,
        Kind::Lp => {
            let p = node.attr_int("p", 2)? as f64;
            let powered = ops::power(&ops::abs(&work, s)?, &ops::scalar(p, Dtype::F32, s)?, s)?;
            ops::power(&ops::sum_axes(&powered, &axes, true, s)?, &ops::scalar(1.0 / p, Dtype::F32, s)?, s)?
        }
    };
    Ok(vec![ops::astype(&y, t, s)?])
}

macro_rules! globals {
    ($($name:ident: $op:expr, $kind:expr;)*) => {$(
        ep_core::register_lowering!($name = FnLowering {
            domain: "",
            op: $op,
            opsets: 1..=i32::MAX,
            claim: claim_global,
            lower: |ctx, node| global(ctx, node, $kind),
            safety: CompileSafety::Shapeless,
            growth: None,
        });
    )*};
}

globals! {
    GLOBAL_MAX_POOL: "GlobalMaxPool", Kind::Max;
    GLOBAL_AVERAGE_POOL: "GlobalAveragePool", Kind::Average;
    GLOBAL_LP_POOL: "GlobalLpPool", Kind::Lp;
}

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, register_spec};

    /// Output size of one axis, ONNX's rule (ceil mode drops a window starting in the end pad).
    fn out_dim(i: i64, k: i64, s: i64, d: i64, lo: i64, hi: i64, ceil: bool) -> i64 {
        let span = i + lo + hi - ((k - 1) * d + 1);
        let mut o = if ceil { (span + s - 1) / s + 1 } else { span / s + 1 };
        if ceil && (o - 1) * s >= i + lo {
            o -= 1;
        }
        o
    }

    /// The same kernel, stride, dilation and pad on each of `dims` spatial axes, and ceil mode.
    fn window(case: Case, dims: usize, k: i64, stride: i64, dil: i64, pad: i64, ceil: bool) -> Case {
        let mut case = case
            .attr_ints("kernel_shape", &vec![k; dims])
            .attr_ints("strides", &vec![stride; dims])
            .attr_ints("pads", &vec![pad; 2 * dims]);
        if dil > 1 {
            case = case.attr_ints("dilations", &vec![dil; dims]);
        }
        if ceil {
            case = case.attr_int("ceil_mode", 1);
        }
        case
    }

    fn pool(op: &'static str) -> BoxedStrategy<Case> {
        let geometry = (1..=3usize, 1..=3i64, 1..=2i64, 1..=2i64, 0..=1i64, any::<(bool, bool)>());
        let types = select(&[DType::F32, DType::F32, DType::F16, DType::I8, DType::U8][..]);
        (types, geometry, opset(12..=22), seed())
            .prop_map(move |(t, (dims, k, stride, dil, pad, (ceil, include)), v, seed)| {
                // 8-bit integers only for MaxPool.
                let t = if op != "MaxPool" && matches!(t, DType::I8 | DType::U8) { DType::F32 } else { t };
                let dil = if op == "MaxPool" || v >= 19 { dil } else { 1 };
                let dil = if op == "LpPool" { 1 } else { dil };
                let ceil = ceil && op != "LpPool";
                let spatial: Vec<i64> = (0..dims).map(|i| 5 + i as i64).collect();
                // Pads stay below the kernel, as ORT requires.
                let pad = pad.min(k - 1);
                let x = [vec![1, 2], spatial.clone()].concat();
                let mut out = vec![1, 2];
                for &i in &spatial {
                    out.push(out_dim(i, k, stride, dil, pad, pad, ceil));
                }
                let mut case = window(Case::op(op, v).input("x", t, &x), dims, k, stride, dil, pad, ceil);
                if op == "AveragePool" && include {
                    case = case.attr_int("count_include_pad", 1);
                }
                let case = case.output("y", t, &out);
                // MaxPool's Indices (float32; opset 8 on): row-major, or column-major over two
                // spatial axes.
                if op == "MaxPool" && include && t == DType::F32 {
                    let case = if dims == 2 && seed % 2 == 1 { case.attr_int("storage_order", 1) } else { case };
                    return case.output("indices", DType::I64, &out).with_seed(seed);
                }
                case.with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::MAX_POOL, || pool("MaxPool"));

    register_spec!(super::NHWC_MAX_POOL, || {
        let geometry = (1..=3usize, 1..=3i64, 1..=2i64, 1..=2i64, 0..=1i64, any::<bool>());
        (select(&[DType::I8, DType::U8][..]), geometry, 1..=3i64, seed())
            .prop_map(|(t, (dims, k, stride, dil, pad, ceil), c, seed)| {
                let spatial: Vec<i64> = (0..dims).map(|i| 4 + i as i64).collect();
                let pad = pad.min(k - 1);
                let x = [vec![2], spatial.clone(), vec![c]].concat();
                let mut out = vec![2];
                for &i in &spatial {
                    out.push(out_dim(i, k, stride, dil, pad, pad, ceil));
                }
                out.push(c);
                let case = Case::domain_op("com.microsoft", "NhwcMaxPool", 1).input("x", t, &x);
                window(case, dims, k, stride, dil, pad, ceil).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });
    register_spec!(super::AVERAGE_POOL, || pool("AveragePool"));
    register_spec!(super::LP_POOL, || pool("LpPool"));

    fn global(op: &'static str) -> BoxedStrategy<Case> {
        // ORT's CPU EP has no GlobalLpPool of opset 22.
        (float_dtype(), nonempty_shape(3..=5), opset(7..=21), seed())
            .prop_map(move |(t, s, v, seed)| {
                let out: Vec<i64> = s.iter().enumerate().map(|(i, &d)| if i < 2 { d } else { 1 }).collect();
                Case::op(op, v).input("x", t, &s).output("y", t, &out).with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::GLOBAL_MAX_POOL, || global("GlobalMaxPool"));
    register_spec!(super::GLOBAL_AVERAGE_POOL, || global("GlobalAveragePool"));
    register_spec!(super::GLOBAL_LP_POOL, || global("GlobalLpPool"));
}
