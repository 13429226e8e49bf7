//! The compiled form of one partition and how it runs: nodes resolved to their lowerings once,
//! constants uploaded once, then per run: bind inputs, build the MLX graph node by node,
//! evaluate every partition output in one MLX evaluation.

use crate::graph::{ElemType, NodeInfo};
use crate::lowering::{LowerCtx, Lowering};
use crate::mlx::{self, Array, Dtype, Stream, VectorArray};
use crate::registry::Registry;
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};

struct PlanNode {
    info: NodeInfo,
    lowering: &'static dyn Lowering,
}

/// One output of the partition: its value name and the dtype ORT expects.
#[derive(Debug, Clone)]
pub struct PlanOutput {
    pub name: String,
    pub elem_type: ElemType,
    dtype: Dtype,
}

/// A partition ready to run.
pub struct Plan {
    name: String,
    inputs: Vec<String>,
    outputs: Vec<PlanOutput>,
    constants: HashMap<String, Array>,
    nodes: Vec<PlanNode>,
    stream: Stream,
}

impl Plan {
    /// Resolves every node to its lowering and checks that each value a node reads is a
    /// runtime input, a constant or the output of an earlier node.
    ///
    /// `nodes` must be in topological order; `inputs` are the runtime inputs in the order the
    /// compute call receives them; `outputs` the values it must produce, in order.
    pub fn new(
        name: impl Into<String>,
        nodes: Vec<NodeInfo>,
        inputs: Vec<String>,
        outputs: Vec<(String, ElemType)>,
        constants: HashMap<String, Array>,
        registry: &Registry,
    ) -> Result<Plan> {
        let name = name.into();
        let mut available: HashSet<&str> =
            inputs.iter().map(String::as_str).chain(constants.keys().map(String::as_str)).collect();
        let mut plan_nodes = Vec::with_capacity(nodes.len());
        for info in &nodes {
            let lowering = registry
                .claim(info)
                .map_err(|d| Error::new(format!("cannot lower: {d}")).at_node(&info.name, &info.qualified_op()))?;
            for v in info.inputs.iter().flatten() {
                if !available.contains(v.name.as_str()) {
                    return Err(Error::new(format!("input '{}' has no source in the partition", v.name))
                        .at_node(&info.name, &info.qualified_op()));
                }
            }
            available.extend(info.outputs.iter().flatten().map(|v| v.name.as_str()));
            plan_nodes.push(lowering);
        }
        let mut resolved_outputs = Vec::with_capacity(outputs.len());
        for (out, elem_type) in outputs {
            if !available.contains(out.as_str()) {
                return Err(Error::new(format!("partition {name}: output '{out}' is produced by no node")));
            }
            let dtype = elem_type
                .to_mlx()
                .ok_or_else(|| Error::new(format!("output '{out}' has type {elem_type:?}, which MLX cannot hold")))?;
            resolved_outputs.push(PlanOutput { name: out, elem_type, dtype });
        }
        let nodes = nodes.into_iter().zip(plan_nodes).map(|(info, lowering)| PlanNode { info, lowering }).collect();
        Ok(Plan { name, inputs, outputs: resolved_outputs, constants, nodes, stream: Stream::default_device()? })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn inputs(&self) -> &[String] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[PlanOutput] {
        &self.outputs
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Runs the partition: one array per output, in ORT's dtypes, evaluated and row-contiguous.
    /// The caller holds [`mlx::lock()`] for the whole run, copy-out included.
    pub fn run(&self, inputs: Vec<Array>) -> Result<Vec<Array>> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::new(format!(
                "partition {}: {} inputs given, {} expected",
                self.name,
                inputs.len(),
                self.inputs.len()
            )));
        }
        let mut env: HashMap<&str, Array> = self.inputs.iter().map(String::as_str).zip(inputs).collect();
        for node in &self.nodes {
            let info = &node.info;
            let args = info
                .inputs
                .iter()
                .map(|v| {
                    v.as_ref().and_then(|v| env.get(v.name.as_str()).or_else(|| self.constants.get(&v.name)).cloned())
                })
                .collect();
            let mut ctx = LowerCtx::new(args, &self.stream);
            let results =
                node.lowering.lower(&mut ctx, info).map_err(|e| e.at_node(&info.name, &info.qualified_op()))?;
            if results.len() < info.outputs.iter().flatten().count() {
                return Err(Error::new(format!(
                    "lowering returned {} outputs for {}",
                    results.len(),
                    info.outputs.len()
                ))
                .at_node(&info.name, &info.qualified_op()));
            }
            for (out, array) in info.outputs.iter().zip(results) {
                if let Some(out) = out {
                    env.insert(out.name.as_str(), array);
                }
            }
        }
        let mut results = Vec::with_capacity(self.outputs.len());
        for out in &self.outputs {
            let a = env
                .get(out.name.as_str())
                .or_else(|| self.constants.get(&out.name))
                .expect("checked when the plan was built");
            let a = mlx::ops::astype(a, out.dtype, &self.stream)?;
            results.push(mlx::ops::contiguous(&a, &self.stream)?);
        }
        VectorArray::from_arrays(results.iter())?
            .eval()
            .map_err(|e| Error::new(format!("partition {}: {e}", self.name)))?;
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ValueInfo;
    use crate::lowering::Decline;

    struct TestBinary(&'static str, fn(&Array, &Array, &Stream) -> mlx::Result<Array>);
    impl Lowering for TestBinary {
        fn op_type(&self) -> &'static str {
            self.0
        }
        fn opsets(&self) -> std::ops::RangeInclusive<i32> {
            1..=i32::MAX
        }
        fn claim(&self, _: &NodeInfo) -> std::result::Result<(), Decline> {
            Ok(())
        }
        fn lower(&self, ctx: &mut LowerCtx<'_>, _: &NodeInfo) -> Result<Vec<Array>> {
            Ok(vec![(self.1)(ctx.input(0)?, ctx.input(1)?, ctx.stream())?])
        }
    }
    static ADD: TestBinary = TestBinary("Add", mlx::ops::add);
    static MUL: TestBinary = TestBinary("Mul", mlx::ops::multiply);

    fn value(name: &str) -> Option<ValueInfo> {
        Some(ValueInfo {
            name: name.into(),
            elem_type: Some(ElemType::F32),
            shape: Some(vec![Some(2)]),
            is_constant: false,
        })
    }

    fn node(op: &str, inputs: [&str; 2], output: &str) -> NodeInfo {
        NodeInfo {
            name: format!("{op}_node"),
            op_type: op.into(),
            domain: String::new(),
            since_version: 14,
            inputs: inputs.iter().map(|n| value(n)).collect(),
            outputs: vec![value(output)],
            attributes: Default::default(),
        }
    }

    #[test]
    fn a_plan_runs_inputs_constants_and_intermediates() {
        let registry = Registry::build(&[&ADD, &MUL]).unwrap();
        let _g = mlx::lock();
        let w = Array::from_slice(&[10.0f32, 20.0], &[2]).unwrap();
        let plan = Plan::new(
            "p",
            vec![node("Add", ["x", "w"], "t"), node("Mul", ["t", "x"], "y")],
            vec!["x".into()],
            vec![("y".into(), ElemType::F32), ("t".into(), ElemType::F32)],
            HashMap::from([("w".to_owned(), w)]),
            &registry,
        )
        .unwrap();
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let out = plan.run(vec![x]).unwrap();
        let s = Stream::cpu().unwrap();
        assert_eq!(out[0].to_vec::<f32>(&s).unwrap(), vec![11.0, 44.0]);
        assert_eq!(out[1].to_vec::<f32>(&s).unwrap(), vec![11.0, 22.0]);
    }

    #[test]
    fn a_value_without_source_is_rejected_naming_the_node() {
        let registry = Registry::build(&[&ADD]).unwrap();
        let err = Plan::new(
            "p",
            vec![node("Add", ["x", "missing"], "y")],
            vec!["x".into()],
            vec![("y".into(), ElemType::F32)],
            HashMap::new(),
            &registry,
        )
        .err()
        .unwrap();
        assert!(err.0.contains("Add_node") && err.0.contains("missing"), "{err}");
    }

    #[test]
    fn an_op_without_lowering_is_rejected() {
        let registry = Registry::build(&[&ADD]).unwrap();
        let err = Plan::new(
            "p",
            vec![node("Mul", ["x", "x"], "y")],
            vec!["x".into()],
            vec![("y".into(), ElemType::F32)],
            HashMap::new(),
            &registry,
        )
        .err()
        .unwrap();
        assert!(err.0.contains("no lowering registered for Mul"), "{err}");
    }

    #[test]
    fn mlx_failures_during_a_run_name_the_node() {
        let registry = Registry::build(&[&ADD]).unwrap();
        let _g = mlx::lock();
        let plan = Plan::new(
            "p",
            vec![node("Add", ["x", "z"], "y")],
            vec!["x".into(), "z".into()],
            vec![("y".into(), ElemType::F32)],
            HashMap::new(),
            &registry,
        )
        .unwrap();
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let z = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let err = plan.run(vec![x, z]).unwrap_err();
        assert!(err.0.contains("node 'Add_node' (Add)"), "{err}");
    }
}
