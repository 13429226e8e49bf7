//! RNN, the simple recurrence `H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`.

use crate::activation::{self, Activation};
use crate::sequence::{self, Cell, Step};
use ep_core::lowering::FnLowering;
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result};

pub(crate) struct Rnn;

impl Cell for Rnn {
    const OP: &'static str = "RNN";
    const GATES: i64 = 1;
    const ACTIVATIONS: usize = 1;
    const DEFAULTS: &'static [&'static str] = &["Tanh"];
    const STATES: usize = 1;
    const EMPTY_ENDS_AT_ZERO: bool = false;

    /// One activation per direction, spelled exactly as ONNX does; a forward or reverse node
    /// may carry the schema's default pair (`["Tanh", "Tanh"]`), of which the first counts.
    /// Direction `d` takes `activation_alpha[d]` and `activation_beta[d]` (ORT's CPU EP reads
    /// them so): a node where that differs from ONNX's in-order reading, or where an
    /// activation that takes a parameter is given none, is left to ORT.
    fn activations(
        names: &[String],
        alphas: Option<&[f32]>,
        betas: Option<&[f32]>,
        directions: usize,
    ) -> std::result::Result<Vec<Activation>, String> {
        let names: Vec<&str> = match names.len() {
            0 => vec!["Tanh"; directions],
            n if n == directions => names.iter().map(String::as_str).collect(),
            2 if directions == 1 => vec![names[0].as_str()],
            n => return Err(format!("{n} activations given; RNN has one per direction ({directions})")),
        };
        let mut takers = (0, 0);
        let mut acts = Vec::new();
        for (d, name) in names.iter().enumerate() {
            let name = activation::canonical(name, true)?;
            let (takes_a, takes_b) = activation::takes(name);
            let param = |takes: bool, list: Option<&[f32]>, count: &mut usize, what: &str| {
                if !takes {
                    return Ok(None);
                }
                let value = list.and_then(|l| l.get(d)).map(|&v| f64::from(v));
                if value.is_none() || *count != d {
                    return Err(format!(
                        "direction {d}'s {name} takes activation_{what}[{d}], which ONNX reads differently or which is missing"
                    ));
                }
                *count += 1;
                Ok(value)
            };
            let a = param(takes_a, alphas, &mut takers.0, "alpha")?;
            let b = param(takes_b, betas, &mut takers.1, "beta")?;
            acts.push(activation::make(name, a, b)?);
        }
        Ok(acts)
    }

    /// A negative bound means no clipping.
    fn clip(c: f32) -> std::result::Result<Option<f64>, String> {
        Ok((c >= 0.0).then_some(f64::from(c)))
    }

    fn step(&self, at: &Step<'_>, xw: &Array, states: &[Array]) -> Result<Vec<Array>> {
        let pre = ops::add(xw, &at.recurrent(&states[0], 0..1)?, at.stream)?;
        Ok(vec![at.gate(0, &pre)?])
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    sequence::claim::<Rnn>(node, 6).map(drop)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let attrs = sequence::Attributes::read::<Rnn>(node).map_err(ep_core::Error::new)?;
    sequence::run(&Rnn, ctx, &attrs, &[5], None, None)
}

ep_core::register_lowering!(
    RNN = FnLowering {
        domain: "",
        op: "RNN",
        opsets: 7..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use crate::sequence::spec::{Recurrent, case};
    use conformance_spec::register_spec;

    register_spec!(super::RNN, || case(Recurrent { op: "RNN", gates: 1, activations: 1, states: 1 }));
}
