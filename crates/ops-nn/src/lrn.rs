//! LRN, local response normalization across channels: `y = x / (bias + alpha / size *
//! sum(x^2 over the size channels around c))^beta` on `[N, C, H, W]` float32 (what ORT's CPU
//! EP runs, with an odd `size`; other ranks, types and sizes are left to it).

use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

/// The widest window summed slice by slice.
const MAX_SIZE: i64 = 64;

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32])?;
    require_input_rank(node, 0, 4..=4)?;
    let size = match node.attr("size") {
        Some(_) => node.attr_int("size", 0)?,
        None => return Err(Decline::new("LRN needs the `size` attribute")),
    };
    // ORT's CPU EP refuses an even window: left to it, the session fails as it would there.
    if !(1..=MAX_SIZE).contains(&size) || size % 2 == 0 {
        return Err(Decline(format!("size={size} is not an odd number in 1..={MAX_SIZE}")));
    }
    for name in ["alpha", "beta", "bias"] {
        let v = node.attr_float(name, 1.0)?;
        if !v.is_finite() {
            return Err(Decline(format!("{name}={v} is not finite")));
        }
    }
    // ORT's kernel refuses these when the session is created: left to it.
    for (name, default) in [("alpha", 1e-4), ("beta", 0.75)] {
        let v = node.attr_float(name, default)?;
        if v <= 0.0 {
            return Err(Decline(format!("{name}={v} is not positive")));
        }
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let size = node.attr_int("size", 1)?;
    let alpha = node.attr_float("alpha", 1e-4)? as f64;
    let beta = node.attr_float("beta", 0.75)? as f64;
    let bias = node.attr_float("bias", 1.0)? as f64;
    let shape = x.shape();
    let c = shape[1];
    let (lo, hi) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
    let zero = ops::scalar(0.0, x.dtype(), s)?;
    // Each window summed directly, slice by slice (a difference of running sums cancels: with
    // a bias of 0 the result is off by 1e-3). Where ORT's running sum has passed a non-finite
    // square (it subtracts it back out: inf - inf), every later channel is NaN there, as in ORT.
    let squares = ops::square(x, s)?;
    let padded = ops::pad(&squares, &[0, lo, 0, 0], &[0, hi, 0, 0], &zero, "constant", s)?;
    let mut sum = ops::slice(&padded, &[0, 0, 0, 0], &[shape[0], c, shape[2], shape[3]], s)?;
    for j in 1..size {
        let part = ops::slice(&padded, &[0, j, 0, 0], &[shape[0], j + c, shape[2], shape[3]], s)?;
        sum = ops::add(&sum, &part, s)?;
    }
    // Channel c's window is channels [c - lo, c + hi]: a non-finite square before c - lo has
    // left it (NaN squares poison from the moment they enter, which the window sum shows).
    // (`x - x` is 0 for a finite x, NaN for an infinite or NaN one.)
    let bad = ops::not_equal(&ops::subtract(&squares, &squares, s)?, &zero, s)?;
    let bad = ops::astype(&bad, Dtype::I32, s)?;
    let seen = ops::cumulative(&bad, 1, false, false, true, s)?;
    let left = ops::pad(&seen, &[0, lo + 1, 0, 0], &[0, 0, 0, 0], &ops::scalar(0.0, Dtype::I32, s)?, "constant", s)?;
    let left = ops::slice(&left, &[0, 0, 0, 0], &[shape[0], c, shape[2], shape[3]], s)?;
    let nan = ops::scalar(f64::NAN, x.dtype(), s)?;
    let sum = ops::where_(&ops::greater(&left, &ops::scalar(0.0, Dtype::I32, s)?, s)?, &nan, &sum, s)?;
    let scale = ops::multiply(&sum, &ops::scalar(alpha / size as f64, x.dtype(), s)?, s)?;
    let base = ops::add(&scale, &ops::scalar(bias, x.dtype(), s)?, s)?;
    let denom = ops::power(&base, &ops::scalar(beta, x.dtype(), s)?, s)?;
    Ok(vec![ops::divide(x, &denom, s)?])
}

ep_core::register_lowering!(
    LRN = FnLowering {
        domain: "",
        op: "LRN",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, register_spec};

    register_spec!(super::LRN, || {
        (1..=2i64, 1..=9i64, 1..=5i64, 1..=5i64, 0..=3i64, opset(1..=22), seed())
            .prop_map(|(n, c, h, w, half, v, seed)| {
                let size = 2 * half + 1;
                let v = if v < 13 { 1 } else { 13 };
                let x = [n, c, h, w];
                let case = Case::op("LRN", v).input("x", DType::F32, &x).attr("size", Attr::Int(size));
                let case = if seed % 2 == 0 {
                    case
                } else {
                    case.attr("alpha", Attr::Float(0.002)).attr("beta", Attr::Float(0.5)).attr("bias", Attr::Float(2.0))
                };
                case.output("y", DType::F32, &x).with_seed(seed)
            })
            .boxed()
    });
}
