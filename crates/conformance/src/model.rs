//! A [`Case`] as an ONNX model (ORT's Model Editor API) and its input values.

use conformance_spec::{Attr, Case, DType, NodeSpec, TensorSpec, Values};
use mlx_ep_host::Result;
use mlx_ep_host::models::tensor_type;
use mlx_ep_host::ort::editor::{Graph, Model, Node, Opset};
use mlx_ep_host::ort::operator::Attribute;
use mlx_ep_host::ort::value::{DynValue, Outlet, Shape, SymbolicDimensions, TensorElementType, ValueType};
use mlx_ep_host::values;

/// ORT's element type for a spec dtype.
pub fn elem_type(d: DType) -> TensorElementType {
    match d {
        DType::F32 => TensorElementType::Float32,
        DType::F16 => TensorElementType::Float16,
        DType::BF16 => TensorElementType::Bfloat16,
        DType::F64 => TensorElementType::Float64,
        DType::I8 => TensorElementType::Int8,
        DType::I16 => TensorElementType::Int16,
        DType::I32 => TensorElementType::Int32,
        DType::I64 => TensorElementType::Int64,
        DType::U8 => TensorElementType::Uint8,
        DType::U16 => TensorElementType::Uint16,
        DType::U32 => TensorElementType::Uint32,
        DType::U64 => TensorElementType::Uint64,
        DType::Bool => TensorElementType::Bool,
    }
}

/// The case's graph as a model.
pub fn build(case: &Case) -> Result<Model> {
    build_with(case, &case.nodes)
}

/// The graph ORT's CPU EP runs for the case: its reference graph where it has one (an op the
/// CPU EP has no kernel for), else the case's own.
pub fn build_reference(case: &Case) -> Result<Model> {
    build_with(case, if case.reference.is_empty() { &case.nodes } else { &case.reference })
}

fn build_with(case: &Case, nodes: &[NodeSpec]) -> Result<Model> {
    let mut graph = Graph::new()?;
    let symbolic = case.is_symbolic();
    let declare = |name: &str, d: DType, shape: &[i64]| {
        if symbolic {
            let symbols = (0..shape.len()).map(|i| format!("{name}_d{i}"));
            ValueType::Tensor {
                ty: elem_type(d),
                shape: Shape::new(shape.iter().map(|_| -1)),
                dimension_symbols: SymbolicDimensions::new(symbols),
            }
        } else {
            tensor_type(elem_type(d), shape)
        }
    };
    graph.set_inputs(case.inputs.iter().map(|t| Outlet::new(&t.name, declare(&t.name, t.dtype, &t.shape))))?;
    graph.set_outputs(case.outputs.iter().map(|(n, d, s)| Outlet::new(n, declare(n, *d, s))))?;
    for (i, c) in case.constants.iter().enumerate() {
        let data = constant_values(case, i)?;
        graph.add_initializer(&c.name, values::ort_tensor_from_f64(elem_type(c.dtype), &c.shape, &data)?, false)?;
    }
    for n in nodes {
        let attrs = n.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Result<Vec<_>>>()?;
        graph.add_node(Node::new(&n.op, &n.domain, &n.name, &n.inputs, &n.outputs, attrs)?)?;
    }
    let opsets = case.opsets.iter().map(|(d, v)| Opset::new(d, *v)).collect::<std::result::Result<Vec<_>, _>>()?;
    let mut model = Model::new(opsets)?;
    model.set_graph(graph)?;
    Ok(model)
}

fn attribute(name: &str, value: &Attr) -> Result<Attribute> {
    Ok(match value {
        Attr::Int(v) => Attribute::new(name, *v)?,
        Attr::Float(v) => Attribute::new(name, *v)?,
        Attr::Str(v) => Attribute::new(name, v.clone())?,
        Attr::Ints(v) => Attribute::new(name, v.clone())?,
        Attr::Floats(v) => Attribute::new(name, v.clone())?,
        Attr::Strs(v) => Attribute::new(name, v.clone())?,
    })
}

/// Constant `i`'s values (a [`Values::CopyOf`] resolved to the named constant's, rounded to
/// that constant's type).
pub fn constant_values(case: &Case, i: usize) -> Result<Vec<f64>> {
    let c = &case.constants[i];
    let Values::CopyOf(name) = &c.values else { return Ok(tensor_values(c, case.seed, 1000 + i as u64)) };
    let Some(j) = case.constants.iter().position(|o| &o.name == name && !matches!(o.values, Values::CopyOf(_))) else {
        return Err(format!("constant {} copies {name}, which is not a constant of the case", c.name).into());
    };
    let of = &case.constants[j];
    let held = |v: f64| match of.dtype {
        DType::F16 => Ok(half::f16::from_f64(v).to_f64()),
        DType::BF16 => Ok(half::bf16::from_f64(v).to_f64()),
        DType::F32 => Ok(v as f32 as f64),
        DType::F64 => Ok(v),
        other => Err(format!("constant {} copies {name}, of type {other:?}: only float constants are copied", c.name)),
    };
    Ok(tensor_values(of, case.seed, 1000 + j as u64).into_iter().map(held).collect::<std::result::Result<_, _>>()?)
}

/// The runtime inputs' values, drawn from the case's seed.
pub fn input_values(case: &Case) -> Result<Vec<(String, DynValue)>> {
    case.inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let data = tensor_values(t, case.seed, i as u64);
            Ok((t.name.clone(), values::tensor_from_f64(elem_type(t.dtype), &t.shape, &data)?))
        })
        .collect()
}

/// A tensor's values as f64, deterministic in (`seed`, `stream`).
pub fn tensor_values(t: &TensorSpec, seed: u64, stream: u64) -> Vec<f64> {
    let n: usize = t.shape.iter().map(|&d| d.max(0) as usize).product();
    let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(stream));
    let draw = |rng: &mut fastrand::Rng, lo: f64, hi: f64| -> f64 {
        if t.dtype.is_float() {
            lo + rng.f64() * (hi - lo)
        } else if hi - lo <= 1.0 {
            lo
        } else {
            rng.i64(lo as i64..hi as i64) as f64
        }
    };
    match &t.values {
        Values::Data(d) => d.clone(),
        // (Resolved by `constant_values`; an input that copies is a spec defect, fed NaN so
        // that no comparison passes on it.)
        Values::CopyOf(_) => vec![f64::NAN; n],
        Values::Uniform { lo, hi } => (0..n).map(|_| draw(&mut rng, *lo, *hi)).collect(),
        Values::Special => {
            let (min, max) = t.dtype.range();
            let specials: Vec<f64> = if t.dtype.is_float() {
                vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, max, min, 1e-7]
            } else {
                vec![min, max, 0.0, 1.0, if t.dtype.is_signed() { -1.0 } else { 2.0 }]
            };
            (0..n)
                .map(|_| {
                    if rng.u8(0..100) < 15 {
                        specials[rng.usize(0..specials.len())]
                    } else if t.dtype.is_float() {
                        draw(&mut rng, -3.0, 3.0)
                    } else {
                        draw(&mut rng, min.max(-50.0), max.min(50.0))
                    }
                })
                .collect()
        }
    }
}
