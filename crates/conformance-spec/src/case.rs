//! A generated case: a small graph (usually one node named [`UNDER_TEST`]) with its inputs,
//! constants, attributes and the values to feed. Serializable, so a failing case can be saved
//! and replayed.

use serde::{Deserialize, Serialize};

/// The name of the node whose placement the suite asserts.
pub const UNDER_TEST: &str = "under_test";

/// Element types the suite generates and compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
}

impl DType {
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        !self.is_float() && self != DType::Bool
    }

    pub fn is_signed(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64) || self.is_float()
    }

    /// The ONNX name (`float`, `float16`, `int64`, ...).
    pub fn onnx_name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "double",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
        }
    }

    /// The ONNX `TensorProto.DataType` code (for `Cast`'s `to`).
    pub fn onnx_code(self) -> i64 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
        }
    }

    /// The smallest and largest finite values.
    pub fn range(self) -> (f64, f64) {
        match self {
            DType::F32 => (f32::MIN as f64, f32::MAX as f64),
            DType::F16 => (-65504.0, 65504.0),
            DType::BF16 => (-3.3895e38, 3.3895e38),
            DType::F64 => (f64::MIN, f64::MAX),
            DType::I8 => (i8::MIN as f64, i8::MAX as f64),
            DType::I16 => (i16::MIN as f64, i16::MAX as f64),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            DType::I64 => (i64::MIN as f64, i64::MAX as f64),
            DType::U8 => (0.0, u8::MAX as f64),
            DType::U16 => (0.0, u16::MAX as f64),
            DType::U32 => (0.0, u32::MAX as f64),
            DType::U64 => (0.0, u64::MAX as f64),
            DType::Bool => (0.0, 1.0),
        }
    }
}

/// How a tensor's values are drawn (from the case's seed, so a case replays exactly).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Values {
    /// Uniform in `[lo, hi)` (floats), or integers in `[lo, hi)` (rounded toward zero).
    Uniform { lo: f64, hi: f64 },
    /// Mostly uniform in `[-3, 3)`, with NaN, ±inf, ±0, ±1 and the type's extremes mixed in.
    Special,
    /// Exactly these values (row-major, length = element count).
    Data(Vec<f64>),
    /// The values of the case's constant of that name, as its type holds them: a reference
    /// graph's copy of a constant in a wider type.
    CopyOf(String),
}

impl Values {
    /// The default for `dtype`: floats in [-1, 1), integers in [-4, 4) (unsigned [0, 8)), bools.
    pub fn default_for(dtype: DType) -> Values {
        match dtype {
            d if d.is_float() => Values::Uniform { lo: -1.0, hi: 1.0 },
            DType::Bool => Values::Uniform { lo: 0.0, hi: 2.0 },
            d if d.is_signed() => Values::Uniform { lo: -4.0, hi: 4.0 },
            _ => Values::Uniform { lo: 0.0, hi: 8.0 },
        }
    }

    /// An 8-bit integer matrix product's weights (the right-hand side): uint8 over its whole
    /// range, int8 within 7 bits, [-64, 64). ORT's CPU EP multiplies uint8 by int8 on x86
    /// without VNNI with an instruction that saturates the sum of two products at 16 bits
    /// (its quantization docs say so), so a full-range int8 weight gives a different answer on
    /// such hosts than on VNNI hosts; the MLX EP is exact at any range.
    pub fn int8_weights(dtype: DType) -> Values {
        match dtype {
            DType::I8 => Values::Uniform { lo: -64.0, hi: 64.0 },
            _ => Values::Uniform { lo: 0.0, hi: 256.0 },
        }
    }
}

/// A graph input or constant: name, element type, shape and how its values are drawn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub values: Values,
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strs(Vec<String>),
}

/// One node of the case's graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub domain: String,
    pub op: String,
    pub name: String,
    /// Input names; `""` is an absent optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<(String, Attr)>,
}

impl NodeSpec {
    fn new(
        domain: &str,
        op: &str,
        name: String,
        inputs: &[&str],
        outputs: &[&str],
        attributes: Vec<(&str, Attr)>,
    ) -> NodeSpec {
        NodeSpec {
            domain: domain.to_owned(),
            op: op.to_owned(),
            name,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            attributes: attributes.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    }
}

/// A generated case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// `(domain, version)` imports; `""` is `ai.onnx`.
    pub opsets: Vec<(String, u32)>,
    /// Runtime graph inputs.
    pub inputs: Vec<TensorSpec>,
    /// Initializers (constants the lowering may read at claim time, such as shapes and axes).
    pub constants: Vec<TensorSpec>,
    pub nodes: Vec<NodeSpec>,
    /// Graph outputs with their element types and shapes.
    pub outputs: Vec<(String, DType, Vec<i64>)>,
    /// Seed of the input values.
    pub seed: u64,
    /// Declare every input and output dim symbolic (`None`: a third of the cases, by seed), so
    /// ORT cannot fold shape computations and the EP sees unknown dims.
    #[serde(default)]
    pub symbolic: Option<bool>,
    /// For an op ORT's CPU EP has no kernel for (ops ORT runs on CUDA only), or one whose CPU
    /// kernel is wrong for a type: ops it runs right computing the same outputs from the same
    /// inputs and constants, written from the op's specification. The CPU EP runs these in
    /// place of [`Case::nodes`]; empty, it runs the nodes themselves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference: Vec<NodeSpec>,
    /// How outputs are compared: value by value, or (random generators) as samples of one
    /// distribution.
    #[serde(default, skip_serializing_if = "Compare::is_values")]
    pub compare: Compare,
    /// Identities every draw must satisfy, which the graph computes from the drawn outputs
    /// (Dropout's output is its kept inputs, scaled): boolean outputs that must be true
    /// everywhere on both EPs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<String>,
}

/// How a case's outputs are compared with the CPU EP's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compare {
    /// Element by element, within the type's tolerance.
    #[default]
    Values,
    /// Same shapes and types, as many NaNs and infinities, the same support (0/1, indices), and
    /// with enough samples means and spreads alike (within a few standard errors): outputs of
    /// random generators, which no two runtimes draw alike.
    Distribution,
    /// Element by element, the absolute tolerance this many times the type's: outputs each of
    /// which sums many products (a long transform), whose rounding grows with the terms on
    /// either EP.
    Summed(u32),
}

impl Compare {
    pub fn is_values(&self) -> bool {
        *self == Compare::Values
    }
}

impl Case {
    /// An empty one-node case of `op` (domain `ai.onnx`) at `opset`: the node is [`UNDER_TEST`].
    pub fn op(op: &str, opset: u32) -> Case {
        Case::domain_op("", op, opset)
    }

    /// An empty one-node case of a node in `domain` (which is imported at `opset`, next to
    /// `ai.onnx` 17 when the domain is another one).
    pub fn domain_op(domain: &str, op: &str, opset: u32) -> Case {
        let mut opsets = vec![(domain.to_owned(), opset)];
        if !domain.is_empty() {
            opsets.push((String::new(), 17));
        }
        Case {
            opsets,
            inputs: Vec::new(),
            constants: Vec::new(),
            nodes: vec![NodeSpec {
                domain: domain.to_owned(),
                op: op.to_owned(),
                name: UNDER_TEST.to_owned(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                attributes: Vec::new(),
            }],
            outputs: Vec::new(),
            seed: 0,
            symbolic: None,
            reference: Vec::new(),
            compare: Compare::Values,
            identities: Vec::new(),
        }
    }

    /// The node under test (nodes appended with [`Case::then`] follow it), else the last.
    fn node_mut(&mut self) -> &mut NodeSpec {
        let at = self.nodes.iter().position(|n| n.name == UNDER_TEST).unwrap_or(self.nodes.len().saturating_sub(1));
        self.nodes.get_mut(at).expect("a case has a node")
    }

    /// A runtime input of the node with default values for its type.
    pub fn input(self, name: &str, dtype: DType, shape: &[i64]) -> Case {
        self.input_with(name, dtype, shape, Values::default_for(dtype))
    }

    /// A runtime input with the given value distribution.
    pub fn input_with(mut self, name: &str, dtype: DType, shape: &[i64], values: Values) -> Case {
        self.inputs.push(TensorSpec { name: name.to_owned(), dtype, shape: shape.to_vec(), values });
        self.node_mut().inputs.push(name.to_owned());
        self
    }

    /// A constant (initializer) input of the node.
    pub fn constant(mut self, name: &str, dtype: DType, shape: &[i64], values: Values) -> Case {
        self.constants.push(TensorSpec { name: name.to_owned(), dtype, shape: shape.to_vec(), values });
        self.node_mut().inputs.push(name.to_owned());
        self
    }

    /// A 1-D int64 constant input holding `data`.
    pub fn constant_i64(self, name: &str, data: &[i64]) -> Case {
        let shape = [data.len() as i64];
        self.constant(name, DType::I64, &shape, Values::Data(data.iter().map(|&v| v as f64).collect()))
    }

    /// An absent optional input.
    pub fn absent(mut self) -> Case {
        self.node_mut().inputs.push(String::new());
        self
    }

    /// An output of the node, which is also a graph output.
    pub fn output(mut self, name: &str, dtype: DType, shape: &[i64]) -> Case {
        self.outputs.push((name.to_owned(), dtype, shape.to_vec()));
        self.node_mut().outputs.push(name.to_owned());
        self
    }

    pub fn attr(mut self, name: &str, value: Attr) -> Case {
        self.node_mut().attributes.push((name.to_owned(), value));
        self
    }

    pub fn attr_int(self, name: &str, v: i64) -> Case {
        self.attr(name, Attr::Int(v))
    }

    pub fn attr_float(self, name: &str, v: f32) -> Case {
        self.attr(name, Attr::Float(v))
    }

    pub fn attr_ints(self, name: &str, v: &[i64]) -> Case {
        self.attr(name, Attr::Ints(v.to_vec()))
    }

    pub fn attr_str(self, name: &str, v: &str) -> Case {
        self.attr(name, Attr::Str(v.to_owned()))
    }

    /// Appends a node of the reference graph (see [`Case::reference`]): `op` of the default
    /// domain reading and writing the named values (`""` an absent input); intermediate names
    /// are the reference's own.
    pub fn reference(self, op: &str, inputs: &[&str], outputs: &[&str], attributes: Vec<(&str, Attr)>) -> Case {
        self.reference_in("", op, inputs, outputs, attributes)
    }

    /// [`Case::reference`] with a node of `domain` (one the case imports).
    pub fn reference_in(
        mut self,
        domain: &str,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attributes: Vec<(&str, Attr)>,
    ) -> Case {
        let name = format!("reference_{}_{op}", self.reference.len());
        self.reference.push(NodeSpec::new(domain, op, name, inputs, outputs, attributes));
        self
    }

    /// Adds a constant the reference graph reads (not an input of the node under test).
    pub fn reference_constant(mut self, name: &str, dtype: DType, shape: &[i64], values: Values) -> Case {
        self.constants.push(TensorSpec { name: name.to_owned(), dtype, shape: shape.to_vec(), values });
        self
    }

    /// Compares the outputs as samples of a distribution (see [`Compare::Distribution`]).
    pub fn distribution(mut self) -> Case {
        self.compare = Compare::Distribution;
        self
    }

    /// Appends a node after the node under test (it must run on the MLX EP too), computing
    /// `outputs` from `inputs` (graph values by name).
    pub fn then(mut self, op: &str, inputs: &[&str], outputs: &[&str], attributes: Vec<(&str, Attr)>) -> Case {
        let name = format!("{UNDER_TEST}_then_{}_{op}", self.nodes.len());
        self.nodes.push(NodeSpec::new("", op, name, inputs, outputs, attributes));
        self
    }

    /// An output of the node under test that is not an output of the graph (nodes appended
    /// with [`Case::then`] read it).
    pub fn intermediate(mut self, name: &str) -> Case {
        self.node_mut().outputs.push(name.to_owned());
        self
    }

    /// A boolean graph output that must be true everywhere on both EPs (see
    /// [`Case::identities`]).
    pub fn identity_output(mut self, name: &str, shape: &[i64]) -> Case {
        self.identities.push(name.to_owned());
        self.outputs.push((name.to_owned(), DType::Bool, shape.to_vec()));
        self
    }

    /// Compares values with `k` times the type's absolute tolerance (see [`Compare::Summed`]).
    pub fn summed(mut self, k: u32) -> Case {
        self.compare = Compare::Summed(k);
        self
    }

    /// Forces symbolic dims on (or off).
    pub fn symbolic(mut self, on: bool) -> Case {
        self.symbolic = Some(on);
        self
    }

    /// Whether the model declares its dims symbolic.
    pub fn is_symbolic(&self) -> bool {
        self.symbolic.unwrap_or(self.seed % 3 == 1)
    }

    pub fn with_seed(mut self, seed: u64) -> Case {
        self.seed = seed;
        self
    }

    /// `op(x) -> y`, same type and shape.
    pub fn unary(op: &str, opset: u32, dtype: DType, shape: &[i64]) -> Case {
        Case::op(op, opset).input("x", dtype, shape).output("y", dtype, shape)
    }

    /// `op(a, b) -> y` with `y`'s type and shape given.
    pub fn binary(op: &str, opset: u32, dtype: DType, a: &[i64], b: &[i64], y: (DType, &[i64])) -> Case {
        Case::op(op, opset).input("a", dtype, a).input("b", dtype, b).output("y", y.0, y.1)
    }

    /// The element type the case is reported under: the first input's (or first constant's).
    pub fn dtype(&self) -> DType {
        self.inputs.first().or(self.constants.first()).map(|t| t.dtype).unwrap_or(DType::F32)
    }

    /// A one-line description: ops, opset, input types and shapes, attributes.
    pub fn label(&self) -> String {
        let ops: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let attrs: Vec<String> = n.attributes.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
                if attrs.is_empty() { n.op.clone() } else { format!("{}[{}]", n.op, attrs.join(", ")) }
            })
            .collect();
        let ins: Vec<String> = self
            .inputs
            .iter()
            .chain(&self.constants)
            .map(|t| format!("{}:{:?}{:?}", t.name, t.dtype, t.shape))
            .collect();
        format!("{} (opset {}) on {}", ops.join(" -> "), self.opsets[0].1, ins.join(", "))
    }
}
