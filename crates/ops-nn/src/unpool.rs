//! MaxUnpool (opset 9 on): each value of `X` written at its flat position `I` in a zero output
//! of the shape MaxPool's inverse gives (`(in - 1) * stride - pads + kernel` per spatial axis) or
//! of `output_shape` (the input's batch and channels), as ORT's CPU EP writes it: positions index the whole output, the last of
//! several values for one position wins, and a position outside the output fails the run.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::ops::ScatterReduce;
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn ints(node: &NodeInfo, name: &str, k: usize, default: i64) -> std::result::Result<Vec<i64>, String> {
    match node.attr_ints(name)? {
        Some(v) if v.len() == k => Ok(v.to_vec()),
        Some(v) => {
            Err(format!("{name} has {} values for {} spatial axes", v.len(), k / if name == "pads" { 2 } else { 1 }))
        }
        None => Ok(vec![default; k]),
    }
}

/// Kernel, strides and pads (begins then ends).
type Geometry = (Vec<i64>, Vec<i64>, Vec<i64>);

fn geometry(node: &NodeInfo) -> std::result::Result<Geometry, String> {
    let kernel = node.attr_ints("kernel_shape")?.ok_or("kernel_shape is required")?.to_vec();
    let k = kernel.len();
    let strides = ints(node, "strides", k, 1)?;
    let pads = ints(node, "pads", 2 * k, 0)?;
    for d in 0..k {
        if kernel[d] < 1 || strides[d] < 1 || pads[d] < 0 || pads[d + k] < 0 {
            return Err(format!("kernel {kernel:?}, strides {strides:?} or pads {pads:?} out of range"));
        }
        if pads[d] >= kernel[d] || pads[d + k] >= kernel[d] {
            return Err(format!("pads {pads:?} must be smaller than the kernel {kernel:?} (as ORT's CPU EP requires)"));
        }
    }
    Ok((kernel, strides, pads))
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 3)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::I64])?;
    require_input_type(node, 2, &[ElemType::I64])?;
    let (kernel, ..) = geometry(node).map_err(Decline)?;
    match ep_core::lowering::input_rank(node, 0) {
        Some(r) if r == kernel.len() + 2 => Ok(()),
        None => Ok(()),
        Some(r) => Err(Decline(format!("X has rank {r} for a kernel of {} axes", kernel.len()))),
    }
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (kernel, strides, pads) = geometry(node).map_err(ep_core::Error::new)?;
    let k = kernel.len();
    let x = ctx.input(0)?.clone();
    let xs = x.shape();
    if xs.len() != k + 2 || ctx.input(1)?.shape() != xs {
        bail!("X {xs:?} and I {:?} must have one shape, of rank {}", ctx.input(1)?.shape(), k + 2);
    }
    let mut inferred = xs[..2].to_vec();
    for d in 0..k {
        let o = (xs[d + 2] - 1) * strides[d] - pads[d] - pads[d + k] + kernel[d];
        if o < 1 {
            bail!("the output's axis {} would have {o} elements", d + 2);
        }
        inferred.push(o);
    }
    let shape = if ctx.optional_input(2).is_some() {
        let given = ctx.host_i64(2)?;
        if given.len() != xs.len() {
            bail!("output_shape {given:?} must have {} values", xs.len());
        }
        if given[..2] != xs[..2] {
            bail!("output_shape {given:?} must keep the input's batch and channel dims {:?}", &xs[..2]);
        }
        if given.iter().any(|&d| d < 0) || given.iter().product::<i64>() < inferred.iter().product::<i64>() {
            bail!("output_shape {given:?} is smaller than the minimum required {inferred:?}");
        }
        given
    } else {
        inferred
    };
    let total: i64 = shape.iter().product();
    ep_core::lowering::check_shape(&shape, Dtype::F32)?;
    let s = ctx.stream();
    let m = x.size() as i64;
    let idx = ops::reshape(ctx.input(1)?, &[m], s)?;
    let zero = ops::scalar(0.0, Dtype::I64, s)?;
    let top = ops::scalar((total - 1).max(0) as f64, Dtype::I64, s)?;
    let inside = ops::logical_and(&ops::greater_equal(&idx, &zero, s)?, &ops::less_equal(&idx, &top, s)?, s)?;
    ctx.check(&inside, format!("an index is outside the output's {total} elements"))?;
    let s = ctx.stream();
    if m == 0 || total == 0 {
        return Ok(vec![ops::full(&shape, &ops::scalar(0.0, Dtype::F32, s)?, Dtype::F32, s)?]);
    }
    let idx = ops::astype(&ops::clip(&idx, Some(&zero), Some(&top), s)?, Dtype::I32, s)?;
    // The last value for each position: the largest element number scattered there.
    let order = ops::reshape(&ops::arange(0.0, m as f64, 1.0, Dtype::I32, s)?, &[m, 1], s)?;
    let none = ops::full(&[total], &ops::scalar(-1.0, Dtype::I32, s)?, Dtype::I32, s)?;
    let winner = ops::scatter(&none, &[idx], &order, &[0], ScatterReduce::Max, s)?;
    let present = ops::greater_equal(&winner, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
    let at = ops::maximum(&winner, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
    let values = ops::take(&ops::reshape(&x, &[m], s)?, &at, 0, s)?;
    let y = ops::where_(&present, &values, &ops::scalar(0.0, Dtype::F32, s)?, s)?;
    Ok(vec![ops::reshape(&y, &shape, s)?])
}

ep_core::register_lowering!(
    MAX_UNPOOL = FnLowering {
        domain: "",
        op: "MaxUnpool",
        opsets: 9..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::MAX_UNPOOL, || {
        ((1..=2i64, 1..=2i64, 1..=3i64, 1..=3i64), (1..=3i64, 1..=2i64), any::<(bool, bool)>(), seed())
            .prop_map(|((n, c, h, w), (kernel, stride), (pad, bigger), seed)| {
                let p = if pad && kernel > 1 { 1 } else { 0 };
                let oh = (h - 1) * stride - p + kernel;
                let ow = (w - 1) * stride + kernel;
                let total = n * c * oh * ow;
                let out = if bigger { vec![n, c, oh + 1, ow] } else { vec![n, c, oh, ow] };
                let case = Case::op("MaxUnpool", 11)
                    .input("x", DType::F32, &[n, c, h, w])
                    .input_with("i", DType::I64, &[n, c, h, w], Values::Uniform { lo: 0.0, hi: total as f64 })
                    .attr_ints("kernel_shape", &[kernel, kernel])
                    .attr_ints("strides", &[stride, stride])
                    .attr_ints("pads", &[p, 0, 0, 0]);
                let case = if bigger { case.constant_i64("output_shape", &out) } else { case };
                case.output("y", DType::F32, &out).with_seed(seed)
            })
            .boxed()
    });
}
