//! The bad-input fuzzer: valid cases drawn from every registered spec (as [`crate::suite`]
//! draws them), each turned into a malformed one by one named mutation ([`mutate`]), run in a
//! child process on the CPU EP and the MLX EP ([`child`]), judged ([`verdict`]) and counted
//! per op ([`driver`]). A crash or a hang of the child is a finding, never the end of the run.
//!
//! A [`FuzzCase`] is what travels between the processes and what a saved failure replays: the
//! (possibly malformed) model as a [`Case`], the tensors fed at run time (which may disagree
//! with the declared inputs), and replacement values for constants.

pub mod child;
pub mod driver;
pub mod known;
pub mod mutate;
pub mod verdict;

use crate::model;
use conformance_spec::{Attr, Case, DType, TensorSpec, Values};
use serde::{Deserialize, Serialize};

/// A tensor with its values spelled out (NaN and infinities survive the JSON round trip).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FuzzTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<i64>,
    #[serde(with = "json_f64s")]
    pub values: Vec<f64>,
}

impl FuzzTensor {
    /// Element count (negative dims count as 0).
    pub fn len(&self) -> usize {
        element_count(&self.shape)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One malformed case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FuzzCase {
    /// The spec it was drawn from (`domain:op`, `op` for `ai.onnx`).
    pub op: String,
    /// Position in its run and the run's seed (with [`FuzzCase::op`], where it came from).
    pub index: u64,
    pub run_seed: u64,
    /// The mutation's name ([`mutate::MUTATIONS`]) and what it did.
    pub mutation: String,
    pub detail: String,
    /// Whether the MLX EP compiles its partitions (`ONNXRUNTIME_EP_MLX_COMPILE`).
    pub compile: bool,
    /// The model: declared inputs, constants, nodes and outputs.
    pub case: Case,
    /// What is fed for each runtime input (name, type, shape and values as fed).
    pub feeds: Vec<FuzzTensor>,
    /// Constants whose type, shape and values replace the case's own.
    pub constants: Vec<FuzzTensor>,
    /// Float attributes holding NaN or infinities (which JSON cannot carry in a [`Case`]):
    /// the case holds 0 in their place.
    #[serde(default)]
    pub special_floats: Vec<SpecialFloats>,
}

/// A float attribute (or list) with non-finite values, kept outside the [`Case`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpecialFloats {
    pub node: usize,
    pub name: String,
    /// `Attr::Floats` (else `Attr::Float`).
    pub list: bool,
    #[serde(with = "json_f64s")]
    pub values: Vec<f64>,
}

impl FuzzCase {
    /// The valid case, before any mutation: every runtime input fed as declared.
    pub fn valid(op: &str, case: Case) -> FuzzCase {
        let feeds = case.inputs.iter().enumerate().map(|(i, t)| materialize(t, case.seed, i as u64)).collect();
        FuzzCase {
            op: op.to_owned(),
            index: 0,
            run_seed: 0,
            mutation: "none".into(),
            detail: String::new(),
            compile: true,
            case,
            feeds,
            constants: Vec::new(),
            special_floats: Vec::new(),
        }
    }

    /// Moves float attributes with NaN or infinities out of the case into
    /// [`FuzzCase::special_floats`] (the case keeps 0 in their place).
    pub fn hoist_special_floats(&mut self) {
        for (n, node) in self.case.nodes.iter_mut().enumerate() {
            for (name, value) in &mut node.attributes {
                let (list, values): (bool, Vec<f64>) = match value {
                    Attr::Float(v) if !v.is_finite() => (false, vec![f64::from(*v)]),
                    Attr::Floats(v) if v.iter().any(|x| !x.is_finite()) => {
                        (true, v.iter().map(|&x| f64::from(x)).collect())
                    }
                    _ => continue,
                };
                *value = if list { Attr::Floats(vec![0.0; values.len()]) } else { Attr::Float(0.0) };
                self.special_floats.push(SpecialFloats { node: n, name: name.clone(), list, values });
            }
        }
    }

    /// The model to build: the case with the replaced constants written in as data.
    pub fn model_case(&self) -> Case {
        let mut case = self.case.clone();
        for o in &self.constants {
            if let Some(c) = case.constants.iter_mut().find(|c| c.name == o.name) {
                c.dtype = o.dtype;
                c.shape = o.shape.clone();
                c.values = Values::Data(o.values.clone());
            }
        }
        for f in &self.special_floats {
            let attr = case.nodes.get_mut(f.node).and_then(|n| n.attributes.iter_mut().find(|(k, _)| *k == f.name));
            if let Some((_, value)) = attr {
                let floats: Vec<f32> = f.values.iter().map(|&v| v as f32).collect();
                *value =
                    if f.list { Attr::Floats(floats) } else { Attr::Float(floats.first().copied().unwrap_or(0.0)) };
            }
        }
        case
    }

    /// The constant `name`, spelled out and recorded as replaced (so a mutation can edit it).
    pub fn constant_mut(&mut self, name: &str) -> Option<&mut FuzzTensor> {
        if !self.constants.iter().any(|c| c.name == name) {
            let (i, c) = self.case.constants.iter().enumerate().find(|(_, c)| c.name == name)?;
            let t = materialize(c, self.case.seed, 1000 + i as u64);
            self.constants.push(t);
        }
        self.constants.iter_mut().find(|c| c.name == name)
    }

    /// The names of the nodes (what an MLX error is expected to name).
    pub fn node_names(&self) -> Vec<String> {
        self.case.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// Directory name of a saved failure: `<op>-<mutation>-<hash>`.
    pub fn dir_name(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        format!("{}-{}-{h:016x}", self.op.replace([':', '/'], "_"), self.mutation)
    }

    /// One line: op, mutation, what it did, and the case's label.
    pub fn label(&self) -> String {
        format!("{} / {}: {} [{}]", self.op, self.mutation, self.detail, self.model_case().label())
    }
}

/// A spec tensor's values drawn as the conformance suite draws them (`stream` as in
/// [`model::input_values`] and [`model::build`]).
pub fn materialize(t: &TensorSpec, seed: u64, stream: u64) -> FuzzTensor {
    FuzzTensor {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        values: model::tensor_values(t, seed, stream),
    }
}

/// Values for `t` at a new shape: drawn again from its distribution, or its data repeated.
pub fn refill(t: &TensorSpec, shape: &[i64], seed: u64, stream: u64) -> Vec<f64> {
    let n = element_count(shape);
    match &t.values {
        Values::Data(d) if d.is_empty() => vec![0.0; n],
        Values::Data(d) => d.iter().copied().cycle().take(n).collect(),
        other => {
            let spec =
                TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: shape.to_vec(), values: other.clone() };
            model::tensor_values(&spec, seed, stream)
        }
    }
}

pub fn element_count(shape: &[i64]) -> usize {
    shape.iter().map(|&d| d.max(0) as usize).product()
}

/// `f64` lists in JSON with NaN and infinities as the strings `"nan"`, `"inf"`, `"-inf"`.
pub mod json_f64s {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    fn to_json(v: f64) -> serde_json::Value {
        if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf" } else { "-inf" }.into()
        } else {
            v.into()
        }
    }

    pub fn serialize<S: Serializer>(values: &[f64], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(values.iter().map(|&v| to_json(v)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        let raw: Vec<serde_json::Value> = Vec::deserialize(d)?;
        raw.into_iter()
            .map(|v| match &v {
                serde_json::Value::Number(n) => {
                    n.as_f64().ok_or_else(|| D::Error::custom("a number out of f64's range"))
                }
                serde_json::Value::String(s) if s == "nan" => Ok(f64::NAN),
                serde_json::Value::String(s) if s == "inf" => Ok(f64::INFINITY),
                serde_json::Value::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
                _ => Err(D::Error::custom(format!("not a number: {v}"))),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_values_survive_json() {
        let t = FuzzTensor {
            name: "x".into(),
            dtype: DType::F32,
            shape: vec![5],
            values: vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.5, 1.0e300],
        };
        let back: FuzzTensor = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert!(back.values[0].is_nan());
        assert_eq!(back.values[1..], t.values[1..]);
    }

    #[test]
    fn replaced_constants_reach_the_model() {
        let case = Case::op("Reshape", 14).input("x", DType::F32, &[2, 3]).constant_i64("shape", &[3, 2]);
        let mut fc = FuzzCase::valid("Reshape", case);
        fc.constant_mut("shape").unwrap().values[0] = (1u64 << 40) as f64;
        let built = fc.model_case();
        assert_eq!(built.constants[0].values, Values::Data(vec![(1u64 << 40) as f64, 2.0]));
        assert_eq!(fc.feeds[0].values.len(), 6);
    }

    #[test]
    fn non_finite_attributes_survive_json() {
        let case = Case::op("LeakyRelu", 16).input("x", DType::F32, &[2]).attr_float("alpha", f32::INFINITY);
        let mut fc = FuzzCase::valid("LeakyRelu", case);
        fc.hoist_special_floats();
        let back: FuzzCase = serde_json::from_str(&serde_json::to_string(&fc).unwrap()).unwrap();
        assert_eq!(back.model_case().nodes[0].attributes[0].1, Attr::Float(f32::INFINITY));
    }
}
