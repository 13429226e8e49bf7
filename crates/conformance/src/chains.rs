//! Multi-node cases: short chains of lowered ops, so partition boundaries, intermediates that
//! are also graph outputs, and broadcasting between nodes are exercised, not only single nodes.

use conformance_spec::strategy::*;
use conformance_spec::{Case, NodeSpec, TensorSpec, Values};

const UNARY: &[&str] = &["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Sin", "Floor", "Erf"];
const BINARY: &[&str] = &["Add", "Sub", "Mul", "Max", "Min"];

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attributes: Vec<(String, conformance_spec::Attr)>,
) -> NodeSpec {
    NodeSpec {
        domain: String::new(),
        op: op.to_owned(),
        name: name.to_owned(),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        attributes,
    }
}

/// `x -> U1 -> t1 -> Reshape(flat) -> U2 -> t2 -> B(t2, b) -> y`, with `t1` also a graph output
/// half the time (an intermediate that leaves the partition).
pub fn strategy() -> BoxedStrategy<Case> {
    (float_dtype(), nonempty_shape(1..=3), select(UNARY), select(UNARY), select(BINARY), any::<(bool, bool)>(), seed())
        .prop_map(|(t, shape, u1, u2, b, (expose, scalar_b), seed)| {
            let n: i64 = shape.iter().product();
            let unit = Values::Uniform { lo: -2.0, hi: 2.0 };
            let b_shape = if scalar_b { vec![] } else { vec![n] };
            let mut nodes = vec![
                node(u1, "n1", &["x"], &["t1"], vec![]),
                node("Reshape", "n2", &["t1", "flat"], &["f"], vec![]),
                node(u2, "n3", &["f"], &["t2"], vec![]),
                node(b, "n4", &["t2", "b"], &["y"], vec![]),
            ];
            let mut outputs = vec![("y".to_owned(), t, vec![n])];
            if expose {
                outputs.push(("t1".to_owned(), t, shape.clone()));
            }
            nodes.shrink_to_fit();
            Case {
                opsets: vec![(String::new(), 17)],
                inputs: vec![
                    TensorSpec { name: "x".into(), dtype: t, shape: shape.clone(), values: unit.clone() },
                    TensorSpec { name: "b".into(), dtype: t, shape: b_shape, values: unit },
                ],
                constants: vec![TensorSpec {
                    name: "flat".into(),
                    dtype: conformance_spec::DType::I64,
                    shape: vec![1],
                    values: Values::Data(vec![-1.0]),
                }],
                nodes,
                outputs,
                seed,
                symbolic: None,
            }
        })
        .boxed()
}
