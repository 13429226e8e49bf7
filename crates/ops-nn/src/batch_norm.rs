//! BatchNormalization. At inference, `x * a + (bias - mean * a)` with `a = scale / sqrt(var +
//! eps)`, as ORT's CPU EP computes it. In training mode (opset 14's `training_mode` = 1,
//! float32), the statistics are the batch's own, per channel over every other axis (the
//! population variance), as ORT's CPU EP takes them, and the optional outputs are the running
//! statistics `input * momentum + batch * (1 - momentum)`. (Opsets before 14 signal training
//! by their extra outputs, which hold other statistics: those nodes stay on the CPU.)

use crate::norm::{check_channel_params, f32_of, per_channel};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn training(node: &NodeInfo) -> std::result::Result<bool, Decline> {
    Ok(node.since_version >= 14 && node.attr_int("training_mode", 0)? != 0)
}

fn claim_batch_norm(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 5, 5)?;
    if training(node)? {
        for i in 0..5 {
            require_input_type(node, i, &[ElemType::F32])?;
        }
        if node.outputs.len() > 3 {
            return Err(Decline(format!("{} outputs; training mode gives at most 3", node.outputs.len())));
        }
        return Ok(());
    }
    for i in 0..5 {
        require_input_type(node, i, &[ElemType::F32, ElemType::F16, ElemType::BF16, ElemType::F64])?;
    }
    if node.attr_int("training_mode", 0)? != 0 {
        return Err(Decline::new("training_mode before opset 14"));
    }
    if node.outputs.iter().skip(1).any(Option::is_some) {
        return Err(Decline::new("the statistics outputs of opsets before 14 (training) are not supported"));
    }
    Ok(())
}

fn lower_batch_norm(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let s = ctx.stream_for(x.dtype());
    let r = x.ndim();
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    check_channel_params(ctx, 1..5)?;
    let p = |i: usize| -> Result<Array> { per_channel(ctx.input(i)?, r, s) };
    let (scale, bias) = (p(1)?, p(2)?);
    let train = training(node).map_err(|d| ep_core::Error::new(d.0))?;
    let (mean, var) = if train {
        if r < 2 {
            bail!("training mode needs an input of rank 2 or more; it has rank {r}");
        }
        // The batch's mean and population variance per channel.
        let axes: Vec<i32> = std::iter::once(0).chain(2..r as i32).collect();
        let xs = f32_of(x, s)?;
        // (Counted when evaluated: a shapeless trace replays it right.)
        let count = ops::number_of_elements(&xs, &axes, Dtype::F32, s)?;
        let mean = ops::divide(&ops::sum_axes(&xs, &axes, true, s)?, &count, s)?;
        let dev = ops::subtract(&xs, &mean, s)?;
        let var = ops::divide(&ops::sum_axes(&ops::multiply(&dev, &dev, s)?, &axes, true, s)?, &count, s)?;
        (mean, var)
    } else {
        (p(3)?, p(4)?)
    };
    // `x * a + (bias - mean * a)` with `a = scale / sqrt(var + eps)` (training: `sqrt(1 / (var +
    // eps))`, as ORT's kernel forms it), so an infinite scale gives ORT's NaN.
    let shifted = ops::add(&var, &ops::scalar(eps, var.dtype(), s)?, s)?;
    let inv_std = if train { ops::sqrt(&ops::reciprocal(&shifted, s)?, s)? } else { ops::rsqrt(&shifted, s)? };
    let a = ops::multiply(&inv_std, &scale, s)?;
    let b = ops::subtract(&bias, &ops::multiply(&mean, &a, s)?, s)?;
    let y = ops::add(&ops::multiply(&f32_of(x, s)?, &a, s)?, &b, s)?;
    let mut outs = vec![ops::astype(&y, x.dtype(), s)?];
    if train && node.outputs.len() > 1 {
        let momentum = node.attr_float("momentum", 0.9)?;
        let keep = ops::scalar(f64::from(momentum), Dtype::F32, s)?;
        let take = ops::scalar(1.0 - f64::from(momentum), Dtype::F32, s)?;
        let c = ctx.input(3)?.shape();
        for (running, batch) in [(ctx.input(3)?, &mean), (ctx.input(4)?, &var)] {
            let batch = ops::reshape(batch, &c, s)?;
            outs.push(ops::add(&ops::multiply(running, &keep, s)?, &ops::multiply(&batch, &take, s)?, s)?);
        }
        outs.truncate(node.outputs.len());
    }
    Ok(outs)
}

ep_core::register_lowering!(
    BATCH_NORM = FnLowering {
        domain: "",
        op: "BatchNormalization",
        opsets: 7..=i32::MAX,
        claim: claim_batch_norm,
        lower: lower_batch_norm,
        safety: CompileSafety::Shapeless,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, register_spec};

    /// The five inputs, the variance positive.
    fn inputs(t: DType, s: &[i64], v: u32) -> Case {
        let c = s[1];
        let positive = conformance_spec::Values::Uniform { lo: 0.2, hi: 2.0 };
        Case::op("BatchNormalization", v)
            .input("x", t, s)
            .input("scale", t, &[c])
            .input("bias", t, &[c])
            .input("mean", t, &[c])
            .input_with("var", t, &[c], positive)
            .attr_float("epsilon", 1e-3)
            .output("y", t, s)
    }

    register_spec!(super::BATCH_NORM, || {
        let inference = (float_dtype(), nonempty_shape(2..=4), opset(9..=22), seed())
            .prop_map(|(t, s, v, seed)| inputs(t, &s, v).with_seed(seed));
        // Training mode: the batch's statistics, and the running ones (ONNX's type inference
        // asks for all three outputs).
        let training = (nonempty_shape(2..=4), opset(14..=22), 0..=9i64, seed()).prop_map(|(s, v, tenths, seed)| {
            let (c, t) = (s[1], DType::F32);
            inputs(t, &s, v)
                .attr_int("training_mode", 1)
                .attr_float("momentum", tenths as f32 / 10.0)
                .output("running_mean", t, &[c])
                .output("running_var", t, &[c])
                .with_seed(seed)
        });
        prop_oneof![inference, training].boxed()
    });
}
