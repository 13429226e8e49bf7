//! Differential testing of the MLX EP against ONNX Runtime's CPU EP.
//!
//! A [`Case`] is a one-node model; [`check`] runs it on both EPs with the same inputs, asserts
//! through ORT's assignment info that the MLX EP ran the node (a declined node is a failure,
//! never a pass), and compares outputs with a per-dtype tolerance.

use mlx_ep_host::models::{Io, graph_model, node};
use mlx_ep_host::ort::operator::Attribute;
use mlx_ep_host::ort::value::TensorElementType;
use mlx_ep_host::values::{self, HostTensor};
use mlx_ep_host::{Ep, MLX_EP, Result, assignment, ep_of, session_builder};

/// One single-node case: `op` at `opset`, with graph inputs and outputs of the given types and
/// shapes, and attributes made by `attributes` (ORT attributes are single-use).
pub struct Case {
    pub op: &'static str,
    pub opset: u32,
    pub inputs: Vec<(&'static str, TensorElementType, Vec<i64>)>,
    pub outputs: Vec<(&'static str, TensorElementType, Vec<i64>)>,
    pub attributes: fn() -> Result<Vec<Attribute>>,
}

pub fn no_attributes() -> Result<Vec<Attribute>> {
    Ok(Vec::new())
}

impl Case {
    pub fn label(&self) -> String {
        let ins: Vec<String> = self.inputs.iter().map(|(_, t, s)| format!("{t:?}{s:?}")).collect();
        format!("{} (opset {}) on {}", self.op, self.opset, ins.join(", "))
    }

    fn model(&self) -> Result<mlx_ep_host::ort::editor::Model> {
        let ins: Vec<Io> = self.inputs.iter().map(|(n, t, s)| (*n, *t, s.as_slice())).collect();
        let outs: Vec<Io> = self.outputs.iter().map(|(n, t, s)| (*n, *t, s.as_slice())).collect();
        let in_names: Vec<&str> = self.inputs.iter().map(|i| i.0).collect();
        let out_names: Vec<&str> = self.outputs.iter().map(|o| o.0).collect();
        graph_model(
            self.opset,
            &ins,
            &outs,
            &[],
            vec![node(self.op, "under_test", &in_names, &out_names, (self.attributes)()?)?],
        )
    }
}

/// Tolerance `(atol, rtol)` per element type: |mlx - cpu| <= atol + rtol * |cpu|.
pub fn tolerance(t: TensorElementType) -> (f64, f64) {
    match t {
        TensorElementType::Float32 => (1e-5, 1e-4),
        TensorElementType::Float16 | TensorElementType::Bfloat16 => (2e-3, 1e-2),
        TensorElementType::Float64 => (1e-12, 1e-10),
        _ => (0.0, 0.0),
    }
}

/// Runs the case on both EPs; `Err` describes the first difference.
pub fn check(case: &Case, seed: u64) -> Result<()> {
    let mut cpu = case.model()?.into_session(&session_builder(Ep::Cpu)?)?;
    let mut mlx = case.model()?.into_session(&session_builder(Ep::Mlx)?)?;
    let ran_on = ep_of(&assignment(&mlx)?, "under_test");
    if ran_on.as_deref() != Some(MLX_EP) {
        return Err(format!("{}: declined (ran on {ran_on:?}), not run by {MLX_EP}", case.label()).into());
    }
    let inputs = values::random_inputs(&cpu, &Default::default(), seed)?;
    let expected = values::run(&mut cpu, &inputs)?;
    let got = values::run(&mut mlx, &inputs)?;
    compare(case, &got, &expected)
}

fn compare(case: &Case, got: &[HostTensor], expected: &[HostTensor]) -> Result<()> {
    for (g, e) in got.iter().zip(expected) {
        if g.shape != e.shape || g.elem_type != e.elem_type {
            return Err(format!(
                "{}: output '{}' is {:?}{:?}, CPU gives {:?}{:?}",
                case.label(),
                g.name,
                g.elem_type,
                g.shape,
                e.elem_type,
                e.shape
            )
            .into());
        }
        let (atol, rtol) = tolerance(g.elem_type);
        for (i, (&x, &y)) in g.values.iter().zip(&e.values).enumerate() {
            let same_nan = x.is_nan() && y.is_nan();
            if !same_nan && !approx::relative_eq!(x, y, epsilon = atol, max_relative = rtol) {
                return Err(format!("{}: output '{}' element {i}: MLX {x} vs CPU {y}", case.label(), g.name).into());
            }
        }
    }
    Ok(())
}
