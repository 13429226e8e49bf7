//! Multi-node cases: short chains of lowered ops, so partition boundaries, intermediates that
//! are also graph outputs, and broadcasting between nodes are exercised, not only single nodes.

use conformance_spec::strategy::*;
use conformance_spec::{Case, DType, NodeSpec, TensorSpec, Values};

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
                reference: Vec::new(),
                compare: conformance_spec::Compare::Values,
                identities: Vec::new(),
            }
        })
        .boxed()
}

fn tensor(name: &str, dtype: DType, shape: &[i64], values: Values) -> TensorSpec {
    TensorSpec { name: name.into(), dtype, shape: shape.to_vec(), values }
}

/// The matmul `onnxruntime.quantization.quantize_dynamic` writes: `DynamicQuantizeLinear(x)`,
/// `MatMulInteger` against a constant int8/uint8 weight with a per-tensor or per-column zero
/// point, `Cast` to float, and `Mul` by the product of the two scales. Activations are 2-D or
/// 3-D against a 2-D weight; K up to 300 crosses the exact-accumulation chunk.
pub fn dynamic_quant_matmul() -> BoxedStrategy<Case> {
    (
        (0..=2usize, 1..=6i64, 1..=300i64, 1..=8i64),
        select(&[DType::I8, DType::U8][..]),
        any::<(bool, bool)>(),
        (0.001f64..0.1, -4.0f64..0.0, 0.0f64..4.0),
        seed(),
    )
        .prop_map(|((batch, s, k, n), wt, (per_column, zero_x), (w_scale, lo, hi), seed)| {
            let mut x_shape: Vec<i64> = if batch == 0 { vec![] } else { vec![batch as i64] };
            x_shape.extend([s, k]);
            let mut y_shape = x_shape.clone();
            *y_shape.last_mut().expect("rank >= 2") = n;
            let weights = Values::int8_weights(wt);
            let params: &[i64] = if per_column { &[n] } else { &[] };
            // An all-zero activation (scale 0) now and then, as padding rows produce.
            let x_values = if zero_x { Values::Uniform { lo: 0.0, hi: 0.0 } } else { Values::Uniform { lo, hi } };
            Case {
                opsets: vec![(String::new(), 17)],
                inputs: vec![tensor("x", DType::F32, &x_shape, x_values)],
                constants: vec![
                    tensor("w", wt, &[k, n], weights.clone()),
                    tensor("w_zp", wt, params, weights),
                    tensor("w_scale", DType::F32, params, Values::Uniform { lo: w_scale, hi: 2.0 * w_scale }),
                ],
                nodes: vec![
                    node("DynamicQuantizeLinear", "quantize", &["x"], &["xq", "x_scale", "x_zp"], vec![]),
                    node("MatMulInteger", "matmul", &["xq", "w", "x_zp", "w_zp"], &["acc"], vec![]),
                    node("Cast", "cast", &["acc"], &["acc_f"], vec![("to".into(), conformance_spec::Attr::Int(1))]),
                    node("Mul", "scales", &["x_scale", "w_scale"], &["scale"], vec![]),
                    node("Mul", "rescale", &["acc_f", "scale"], &["y"], vec![]),
                ],
                outputs: vec![("y".to_owned(), DType::F32, y_shape)],
                seed,
                symbolic: None,
                reference: Vec::new(),
                compare: conformance_spec::Compare::Values,
                identities: Vec::new(),
            }
        })
        .boxed()
}

/// `Floor(x / c)` or `Cast<int64>(x / c)` for a one-element float32 constant `c` with a full
/// 24-bit mantissa and `x = k * c` (small integers `k`): the quotients land on or next to
/// integers, so a divisor that reaches a compiled kernel even one ulp off shows as a whole
/// unit in the output (T5's relative-position buckets divide by ln(16) and truncate this way).
pub fn exact_scalar_constant() -> BoxedStrategy<Case> {
    (1..=32usize, any::<u32>(), collection::vec(-40i32..=40, 32), any::<(bool, bool)>(), seed())
        .prop_map(|(n, bits, ks, (rank1, floor), seed)| {
            let c = f32::from_bits(0x3f80_0000 | (bits & 0x007f_ffff)) * (1 << (bits >> 30)) as f32;
            let x: Vec<f64> = ks[..n].iter().map(|&k| f64::from(k as f32 * c)).collect();
            let c_shape: &[i64] = if rank1 { &[1] } else { &[] };
            let (last, out_type) = if floor {
                (node("Floor", "floor", &["q"], &["y"], vec![]), DType::F32)
            } else {
                (
                    node("Cast", "truncate", &["q"], &["y"], vec![("to".into(), conformance_spec::Attr::Int(7))]),
                    DType::I64,
                )
            };
            Case {
                opsets: vec![(String::new(), 17)],
                inputs: vec![tensor("x", DType::F32, &[n as i64], Values::Data(x))],
                constants: vec![tensor("c", DType::F32, c_shape, Values::Data(vec![f64::from(c)]))],
                nodes: vec![node("Div", "divide", &["x", "c"], &["q"], vec![]), last],
                outputs: vec![("y".to_owned(), out_type, vec![n as i64])],
                seed,
                symbolic: None,
                reference: Vec::new(),
                compare: conformance_spec::Compare::Values,
                identities: Vec::new(),
            }
        })
        .boxed()
}
