//! Small models built in memory with ORT's Model Editor API (`ort::editor`).

use crate::Result;
use ort::editor::{Graph, Model, Node, ONNX_DOMAIN, Opset};
use ort::memory::Allocator;
use ort::value::{Outlet, Shape, SymbolicDimensions, Tensor, TensorElementType, ValueType};

/// A tensor type for graph inputs/outputs; `-1` marks a symbolic dimension named `batch`.
pub fn tensor_type(ty: TensorElementType, shape: &[i64]) -> ValueType {
    let symbols = shape.iter().map(|&d| if d < 0 { "batch".to_owned() } else { String::new() });
    ValueType::Tensor {
        ty,
        shape: Shape::new(shape.iter().copied()),
        dimension_symbols: SymbolicDimensions::new(symbols),
    }
}

/// A float32 initializer with deterministic pseudo-random values in [-scale, scale).
pub fn add_weight(graph: &mut Graph, name: &str, shape: &[i64], scale: f32, seed: u64) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let n: i64 = shape.iter().product();
    // The editor takes initializers allocated by ORT, filled in place.
    let mut weight = Tensor::<f32>::new(&Allocator::default(), shape.to_vec())?;
    let (_, data) = weight.extract_tensor_mut();
    for v in data.iter_mut().take(n as usize) {
        *v = (rng.f32() * 2.0 - 1.0) * scale;
    }
    graph.add_initializer(name, weight, false)?;
    Ok(())
}

/// The demo model: a two-layer MLP classifier, `softmax(relu(x @ W1 + b1) @ W2 + b2)`, with
/// a symbolic batch dimension. ORT fuses each MatMul + Add into a Gemm before EPs see it.
pub fn mlp(features: i64, hidden: i64, classes: i64) -> Result<Model> {
    let mut graph = Graph::new()?;
    graph.set_inputs([Outlet::new("x", tensor_type(TensorElementType::Float32, &[-1, features]))])?;
    graph.set_outputs([Outlet::new("probs", tensor_type(TensorElementType::Float32, &[-1, classes]))])?;
    add_weight(&mut graph, "W1", &[features, hidden], 1.0 / (features as f32).sqrt(), 1)?;
    add_weight(&mut graph, "b1", &[hidden], 0.1, 2)?;
    add_weight(&mut graph, "W2", &[hidden, classes], 1.0 / (hidden as f32).sqrt(), 3)?;
    add_weight(&mut graph, "b2", &[classes], 0.1, 4)?;
    graph.add_node(Node::new("MatMul", ONNX_DOMAIN, "fc1_matmul", ["x", "W1"], ["h0"], [])?)?;
    graph.add_node(Node::new("Add", ONNX_DOMAIN, "fc1_bias", ["h0", "b1"], ["h1"], [])?)?;
    graph.add_node(Node::new("Relu", ONNX_DOMAIN, "relu", ["h1"], ["h2"], [])?)?;
    graph.add_node(Node::new("MatMul", ONNX_DOMAIN, "fc2_matmul", ["h2", "W2"], ["l0"], [])?)?;
    graph.add_node(Node::new("Add", ONNX_DOMAIN, "fc2_bias", ["l0", "b2"], ["logits"], [])?)?;
    graph.add_node(Node::new("Softmax", ONNX_DOMAIN, "softmax", ["logits"], ["probs"], [])?)?;
    let mut model = Model::new([Opset::new(ONNX_DOMAIN, 17)?])?;
    model.set_graph(graph)?;
    Ok(model)
}

/// A graph input or output: name, element type, shape (`-1` for a symbolic `batch` dimension).
pub type Io<'a> = (&'a str, TensorElementType, &'a [i64]);

/// A one-graph model of default-domain `nodes` at `opset`, with float32 weights
/// (name, shape) filled with deterministic values in [-1, 1).
pub fn graph_model(
    opset: u32,
    inputs: &[Io<'_>],
    outputs: &[Io<'_>],
    weights: &[(&str, &[i64])],
    nodes: Vec<Node>,
) -> Result<Model> {
    graph_model_with_opsets(&[(ONNX_DOMAIN, opset)], inputs, outputs, weights, nodes)
}

/// [`graph_model`] importing several domains, as `(domain, version)` pairs.
pub fn graph_model_with_opsets(
    opsets: &[(&str, u32)],
    inputs: &[Io<'_>],
    outputs: &[Io<'_>],
    weights: &[(&str, &[i64])],
    nodes: Vec<Node>,
) -> Result<Model> {
    let mut graph = Graph::new()?;
    graph.set_inputs(inputs.iter().map(|(n, t, s)| Outlet::new(*n, tensor_type(*t, s))))?;
    graph.set_outputs(outputs.iter().map(|(n, t, s)| Outlet::new(*n, tensor_type(*t, s))))?;
    for (i, (name, shape)) in weights.iter().enumerate() {
        add_weight(&mut graph, name, shape, 1.0, 100 + i as u64)?;
    }
    for node in nodes {
        graph.add_node(node)?;
    }
    let opsets = opsets.iter().map(|(d, v)| Opset::new(d, *v)).collect::<ort::Result<Vec<_>>>()?;
    let mut model = Model::new(opsets)?;
    model.set_graph(graph)?;
    Ok(model)
}

/// A default-domain node; attributes as `(name, value)` pairs.
pub fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attributes: Vec<ort::operator::Attribute>,
) -> Result<Node> {
    domain_node("", op, name, inputs, outputs, attributes)
}

/// A node of any domain.
pub fn domain_node(
    domain: &str,
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attributes: Vec<ort::operator::Attribute>,
) -> Result<Node> {
    Ok(Node::new(op, domain, name, inputs, outputs, attributes)?)
}
