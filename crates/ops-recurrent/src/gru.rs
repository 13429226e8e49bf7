//! GRU: update gate z, reset gate r, hidden gate h (`linear_before_reset` applies the reset
//! after the recurrent product, as cuDNN does).

use crate::sequence::{self, Cell, Step};
use ep_core::lowering::FnLowering;
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result};

pub(crate) struct Gru {
    linear_before_reset: bool,
}

impl Cell for Gru {
    const OP: &'static str = "GRU";
    const GATES: i64 = 3;
    const ACTIVATIONS: usize = 2;
    const DEFAULTS: &'static [&'static str] = &["Sigmoid", "Tanh"];
    const STATES: usize = 1;

    fn late_recurrent_bias(&self) -> std::ops::Range<i64> {
        if self.linear_before_reset { 2..3 } else { 0..0 }
    }

    fn step(&self, at: &Step<'_>, xw: &Array, states: &[Array]) -> Result<Vec<Array>> {
        let (s, h) = (at.stream, &states[0]);
        let xw_zr = ops::slice(xw, &[0, 0], &[xw.shape()[0], 2 * at.hidden], s)?;
        let xw_h = at.part(xw, 2)?;
        let (zr, hidden) = if self.linear_before_reset {
            let all = at.recurrent(h, 0..3)?;
            let zr = ops::slice(&all, &[0, 0], &[all.shape()[0], 2 * at.hidden], s)?;
            let mut rh = at.part(&all, 2)?;
            if let Some(bias) = at.late_bias {
                rh = ops::add(&rh, bias, s)?;
            }
            (ops::add(&xw_zr, &zr, s)?, Some(rh))
        } else {
            (ops::add(&xw_zr, &at.recurrent(h, 0..2)?, s)?, None)
        };
        let z = at.gate(0, &at.part(&zr, 0)?)?;
        let r = at.gate(0, &at.part(&zr, 1)?)?;
        let pre = match hidden {
            Some(rh) => ops::add(&xw_h, &ops::multiply(&r, &rh, s)?, s)?,
            None => ops::add(&xw_h, &at.recurrent(&ops::multiply(&r, h, s)?, 2..3)?, s)?,
        };
        let candidate = at.gate(1, &pre)?;
        // (1 - z) * candidate + z * h.
        let one = ops::scalar(1.0, z.dtype(), s)?;
        let new = ops::add(&ops::multiply(&ops::subtract(&one, &z, s)?, &candidate, s)?, &ops::multiply(&z, h, s)?, s)?;
        Ok(vec![new])
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    sequence::claim::<Gru>(node, 6)?;
    sequence::flag(node, "linear_before_reset").map_err(Decline)?;
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let attrs = sequence::Attributes::read::<Gru>(node).map_err(ep_core::Error::new)?;
    let linear_before_reset = sequence::flag(node, "linear_before_reset").map_err(ep_core::Error::new)?;
    sequence::run(&Gru { linear_before_reset }, ctx, &attrs, &[5], None, None)
}

ep_core::register_lowering!(
    GRU = FnLowering {
        domain: "",
        op: "GRU",
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

    register_spec!(super::GRU, || case(Recurrent { op: "GRU", gates: 3, activations: 2, states: 1 }));
}
