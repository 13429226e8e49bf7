//! LSTM: input, output, forget and cell gates (ONNX's `iofc` order), optional peepholes,
//! `input_forget` (the forget gate coupled to the input gate).

use crate::sequence::{self, Cell, Step};
use ep_core::lowering::FnLowering;
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result};

pub(crate) struct Lstm {
    pub(crate) input_forget: bool,
}

impl Cell for Lstm {
    const OP: &'static str = "LSTM";
    const GATES: i64 = 4;
    const ACTIVATIONS: usize = 3;
    const DEFAULTS: &'static [&'static str] = &["Sigmoid", "Tanh", "Tanh"];
    const STATES: usize = 2;

    fn step(&self, at: &Step<'_>, xw: &Array, states: &[Array]) -> Result<Vec<Array>> {
        let (s, h, c) = (at.stream, &states[0], &states[1]);
        let gates = ops::add(xw, &at.recurrent(h, 0..4)?, s)?;
        let peephole = |k: i64, state: &Array, pre: Array| -> Result<Array> {
            match at.peepholes {
                Some(p) => Ok(ops::add(&pre, &ops::multiply(&at.part(p, k)?, state, s)?, s)?),
                None => Ok(pre),
            }
        };
        let i = at.gate(0, &peephole(0, c, at.part(&gates, 0)?)?)?;
        let f = if self.input_forget {
            ops::subtract(&ops::scalar(1.0, i.dtype(), s)?, &i, s)?
        } else {
            at.gate(0, &peephole(2, c, at.part(&gates, 2)?)?)?
        };
        let candidate = at.gate(1, &at.part(&gates, 3)?)?;
        let c_new = ops::add(&ops::multiply(&f, c, s)?, &ops::multiply(&i, &candidate, s)?, s)?;
        let o = at.gate(0, &peephole(1, &c_new, at.part(&gates, 1)?)?)?;
        let h_new = ops::multiply(&o, &at.acts[2].apply(&c_new, s)?, s)?;
        Ok(vec![h_new, c_new])
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    sequence::claim::<Lstm>(node, 8)?;
    sequence::flag(node, "input_forget").map_err(Decline)?;
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let attrs = sequence::Attributes::read::<Lstm>(node).map_err(ep_core::Error::new)?;
    let input_forget = sequence::flag(node, "input_forget").map_err(ep_core::Error::new)?;
    sequence::run(&Lstm { input_forget }, ctx, &attrs, &[5, 6], Some(7), None)
}

ep_core::register_lowering!(
    LSTM = FnLowering {
        domain: "",
        op: "LSTM",
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

    register_spec!(super::LSTM, || case(Recurrent { op: "LSTM", gates: 4, activations: 3, states: 2 }));
}
