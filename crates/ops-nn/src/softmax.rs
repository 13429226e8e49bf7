//! Softmax, LogSoftmax and Hardmax. Opset 13 on: along one axis (default -1). Opsets 1 to 12: the
//! input is viewed as a 2-D matrix split at `axis` (default 1) and each row is normalised.
//! `com.microsoft` BiasSoftmax (ORT runs it on CUDA only): `softmax(x + bias)` over the
//! dimensions from `axis` on, flattened, in float32 for float16.

use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, Error, LowerCtx, Lowering, NodeInfo, Result, bail};
use std::ops::RangeInclusive;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

pub struct Softmax {
    op: &'static str,
    kind: Kind,
    /// Opsets before 13 flatten to 2-D around the axis.
    flattening: bool,
}

/// The op along one axis of `x`.
fn apply(kind: Kind, x: &Array, axis: usize, s: &ep_core::mlx::Stream) -> Result<Array> {
    let n = x.shape()[axis];
    Ok(match kind {
        Kind::Softmax if n == 1 => {
            // One element per row: 1, or NaN for NaN/inf (as exp(x - max) gives). MLX 0.32.2's
            // compiled CPU reduction crashed on a size-1 middle axis, so it is not reduced.
            ops::add(&ops::subtract(x, x, s)?, &ops::astype(&Array::scalar_f32(1.0), x.dtype(), s)?, s)?
        }
        Kind::Softmax => {
            let t = x.dtype();
            if t == Dtype::F16 || t == Dtype::BF16 {
                // ONNX's definition step by step, each step rounded to the half type:
                // exp(x - max) / sum(exp(x - max)), the sum accumulated in float32.
                let a = axis as i32;
                let e = ops::exp(&ops::subtract(x, &ops::max_axes(x, &[a], true, s)?, s)?, s)?;
                let sum = ops::astype(&ops::sum_axes(&ops::astype(&e, Dtype::F32, s)?, &[a], true, s)?, t, s)?;
                ops::divide(&e, &sum, s)?
            } else {
                ops::softmax(x, axis as i32, s)?
            }
        }
        Kind::LogSoftmax if n == 1 => ops::subtract(x, x, s)?,
        Kind::LogSoftmax => {
            // In float32 for half types: (x - max) - log(sum(exp(x - max))), as ORT's CPU EP
            // computes it (a row holding +inf is NaN throughout).
            let t = x.dtype();
            let w = if t == Dtype::F32 || t == Dtype::F64 { x.clone() } else { ops::astype(x, Dtype::F32, s)? };
            let a = axis as i32;
            let shifted = ops::subtract(&w, &ops::max_axes(&w, &[a], true, s)?, s)?;
            let lse = ops::log(&ops::sum_axes(&ops::exp(&shifted, s)?, &[a], true, s)?, s)?;
            ops::astype(&ops::subtract(&shifted, &lse, s)?, t, s)?
        }
        Kind::Hardmax if n == 1 => {
            // (Not reduced, as above.) 1 unless the element is NaN.
            ops::astype(&ops::logical_not(&ops::isnan(x, s)?, s)?, x.dtype(), s)?
        }
        Kind::Hardmax => {
            // 1 at the first element equal to the row's maximum, that maximum taken as ORT's CPU
            // EP takes it (the first element, replaced by any larger one): NaN when the row
            // starts with NaN, and then the row is all 0; a later NaN is passed over.
            let a = axis as i32;
            let nan = ops::isnan(x, s)?;
            let skipped = ops::where_(&nan, &ops::scalar(f64::NEG_INFINITY, x.dtype(), s)?, x, s)?;
            let first = ops::take_range(&nan, 0, 1, a, s)?;
            let top = ops::max_axes(&skipped, &[a], true, s)?;
            let top = ops::where_(&first, &ops::scalar(f64::NAN, x.dtype(), s)?, &top, s)?;
            let hit = ops::equal(x, &top, s)?;
            let idx = ops::argmax_axis(&hit, a, true, s)?;
            let any = ops::max_axes(&ops::astype(&hit, Dtype::U8, s)?, &[a], true, s)?;
            let mut pos = vec![1i64; x.ndim()];
            pos[axis] = n;
            let range = ops::reshape(&ops::arange(0.0, n as f64, 1.0, Dtype::U32, s)?, &pos, s)?;
            let one_hot = ops::equal(&ops::astype(&idx, Dtype::U32, s)?, &range, s)?;
            let one_hot = ops::logical_and(&one_hot, &ops::astype(&any, Dtype::Bool, s)?, s)?;
            ops::astype(&one_hot, x.dtype(), s)?
        }
    })
}

impl Softmax {
    fn axis(&self, node: &NodeInfo, rank: usize) -> std::result::Result<usize, String> {
        let axis = node.attr_int("axis", if self.flattening { 1 } else { -1 })?;
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        // A scalar has no axis to normalise over; opset 13 allows axis 0 on rank 0 only as -1/0.
        if rank == 0 || a < 0 || a >= r.max(1) {
            return Err(format!("axis {axis} is out of range for rank {rank}"));
        }
        Ok(a as usize)
    }
}

impl Lowering for Softmax {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        if self.flattening { 1..=12 } else { 13..=i32::MAX }
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 1, 1)?;
        require_types(node, FLOATS)?;
        // With a known rank the axis is checked now; with an unknown one (a dynamic Reshape in
        // front) when the shape is known, as an error naming the node.
        if let Some(rank) = ep_core::lowering::input_rank(node, 0) {
            if rank == 0 {
                return Err(Decline::new("Softmax of a scalar"));
            }
            self.axis(node, rank)?;
        }
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let x = ctx.input(0)?;
        let shape = x.shape();
        let axis = self.axis(node, shape.len()).map_err(Error::new)?;
        if x.size() == 0 {
            // Nothing to normalize (MLX's argmax refuses an empty array).
            return Ok(vec![x.clone()]);
        }
        if !self.flattening {
            return Ok(vec![apply(self.kind, x, axis, s)?]);
        }
        let rows: i64 = shape[..axis].iter().product();
        let cols: i64 = shape[axis..].iter().product();
        let flat = ops::reshape(x, &[rows, cols], s)?;
        let y = apply(self.kind, &flat, 1, s)?;
        Ok(vec![ops::reshape(&y, &shape, s)?])
    }

    /// The opset 1-12 form reads the input's dimensions to flatten it.
    fn compile_safety(&self) -> CompileSafety {
        if self.flattening { CompileSafety::ShapeKeyed } else { CompileSafety::Shapeless }
    }

    fn name(&self) -> &'static str {
        if self.flattening { "Softmax(opset 1-12)" } else { "Softmax(opset 13+)" }
    }
}

ep_core::register_lowering!(SOFTMAX_2D = Softmax { op: "Softmax", kind: Kind::Softmax, flattening: true });
ep_core::register_lowering!(SOFTMAX = Softmax { op: "Softmax", kind: Kind::Softmax, flattening: false });
ep_core::register_lowering!(LOG_SOFTMAX_2D = Softmax { op: "LogSoftmax", kind: Kind::LogSoftmax, flattening: true });
ep_core::register_lowering!(LOG_SOFTMAX = Softmax { op: "LogSoftmax", kind: Kind::LogSoftmax, flattening: false });
ep_core::register_lowering!(HARDMAX_2D = Softmax { op: "Hardmax", kind: Kind::Hardmax, flattening: true });
ep_core::register_lowering!(HARDMAX = Softmax { op: "Hardmax", kind: Kind::Hardmax, flattening: false });

fn claim_bias_softmax(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    for i in 0..2 {
        require_input_type(node, i, &[ElemType::F32, ElemType::F16, ElemType::F64])?;
    }
    if node.attr("is_inner_broadcast").is_none() {
        return Err(Decline::new("the is_inner_broadcast attribute is required"));
    }
    Ok(())
}

/// The input viewed as `N` rows of `D` (the dimensions before and from `axis`), the bias as
/// `B` such rows (`B` dividing `N`): with `is_inner_broadcast` row `n` takes bias row
/// `n / (N / B)` (the bias spans the leading dimensions), without it row `n % B` (the
/// trailing ones, as right-aligned broadcasting does).
fn lower_bias_softmax(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, bias) = (ctx.input(0)?, ctx.input(1)?);
    let s = ctx.stream_for(x.dtype());
    let shape = x.shape();
    let r = shape.len() as i64;
    let axis = node.attr_int("axis", 1)?;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..r.max(1)).contains(&a) {
        bail!("axis {axis} is out of range for the input's rank {r}");
    }
    let (n, d): (i64, i64) = (shape[..a as usize].iter().product(), shape[a as usize..].iter().product());
    let size = bias.size() as i64;
    if d == 0 || n == 0 {
        return Ok(vec![x.clone()]);
    }
    let rows = size / d;
    if size % d != 0 || rows == 0 || n % rows != 0 {
        bail!(
            "bias {:?} is not whole rows of the {d} elements from axis {axis} of {shape:?} that divide its {n} rows",
            bias.shape()
        );
    }
    let inner = node.attr_int("is_inner_broadcast", 0)? != 0;
    let (xs, bs) = if inner { ([rows, n / rows, d], [rows, 1, d]) } else { ([n / rows, rows, d], [1, rows, d]) };
    let wide = |a: &Array| -> Result<Array> {
        Ok(if a.dtype() == Dtype::F16 { ops::astype(a, Dtype::F32, s)? } else { a.clone() })
    };
    let sum = ops::add(&ops::reshape(&wide(x)?, &xs, s)?, &ops::reshape(&wide(bias)?, &bs, s)?, s)?;
    let y = ops::softmax(&sum, 2, s)?;
    Ok(vec![ops::reshape(&ops::astype(&y, x.dtype(), s)?, &shape, s)?])
}

ep_core::register_lowering!(
    BIAS_SOFTMAX = FnLowering {
        domain: "com.microsoft",
        op: "BiasSoftmax",
        opsets: 1..=i32::MAX,
        claim: claim_bias_softmax,
        lower: lower_bias_softmax,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    /// Both definitions (opset < 13 flattens at `axis`, 13+ is per-axis), every axis.
    fn softmax(op: &'static str) -> BoxedStrategy<Case> {
        (float_dtype(), nonempty_shape(1..=4), opset(7..=22), any::<prop::sample::Index>(), any::<bool>(), seed())
            .prop_map(move |(t, s, v, axis, default_axis, seed)| {
                let r = s.len() as i64;
                let axis = axis.index(2 * s.len()) as i64 - r;
                let case = Case::op(op, v).input_with("x", t, &s, Values::Uniform { lo: -5.0, hi: 5.0 });
                // Before opset 13 the default axis is 1, which a 1-D input does not have.
                let case = if default_axis && (v >= 13 || r >= 2) { case } else { case.attr_int("axis", axis) };
                case.output("y", t, &s).with_seed(seed)
            })
            .boxed()
    }

    // ORT's CPU EP has no BiasSoftmax kernel: the reference adds in float32, flattens at the
    // axis and normalizes each row. The bias spans the leading dimensions (`is_inner_broadcast`,
    // ones between them and the axis) or the trailing ones (fewer dimensions), so that
    // broadcasting it is the op's pairing of rows.
    register_spec!(super::BIAS_SOFTMAX, || {
        (
            float_dtype(),
            nonempty_shape(2..=4),
            any::<(prop::sample::Index, prop::sample::Index)>(),
            any::<bool>(),
            seed(),
        )
            .prop_map(|(t, s, (axis, keep), inner, seed)| {
                let r = s.len();
                let a = 1 + axis.index(r - 1);
                let k = keep.index(a + 1);
                let bias: Vec<i64> =
                    if inner { [&s[..k], &vec![1; a - k][..], &s[a..]].concat() } else { s[a - k..].to_vec() };
                let to = |t: DType| vec![("to", Attr::Int(t.onnx_code()))];
                Case::domain_op("com.microsoft", "BiasSoftmax", 1)
                    .input_with("x", t, &s, Values::Uniform { lo: -5.0, hi: 5.0 })
                    .input("bias", t, &bias)
                    .attr_int("axis", a as i64)
                    .attr_int("is_inner_broadcast", inner as i64)
                    .output("y", t, &s)
                    .with_seed(seed)
                    .reference("Cast", &["x"], &["x_f"], to(DType::F32))
                    .reference("Cast", &["bias"], &["bias_f"], to(DType::F32))
                    .reference("Add", &["x_f", "bias_f"], &["sum"], vec![])
                    .reference("Flatten", &["sum"], &["rows"], vec![("axis", Attr::Int(a as i64))])
                    .reference("Softmax", &["rows"], &["normed"], vec![("axis", Attr::Int(1))])
                    .reference("Shape", &["x"], &["x_shape"], vec![])
                    .reference("Reshape", &["normed", "x_shape"], &["y_f"], vec![])
                    .reference("Cast", &["y_f"], &["y"], to(t))
            })
            .boxed()
    });

    register_spec!(super::SOFTMAX, || softmax("Softmax"));
    register_spec!(super::LOG_SOFTMAX, || softmax("LogSoftmax"));
    register_spec!(super::HARDMAX, || softmax("Hardmax"));
}
