//! The plan's caches of work done on constants: values derived from constant inputs (weight
//! transposes, repacked quantized weights: computed once, shared across sessions) and the MLX
//! copies of subgraph initializers; and the engine's side of the lowering contract
//! ([`Engine`]): derived constants and subgraphs evaluated by the same translator.

use crate::graph::Subgraph;
use crate::lowering::{Engine, LowerCtx, SubgraphCall};
use crate::mlx::Array;
use crate::{Error, Result};
use std::collections::HashMap;

/// A plan's caches of work done on constants, and its compiled subgraphs.
pub struct PlanCaches {
    pub derived: DerivedConstants,
    pub subgraphs: SubgraphConstants,
    pub compiled: super::branches::CompiledSubgraphs,
    /// How many times each seeded random node has drawn (see [`Engine::next_draw`]).
    draws: std::sync::Mutex<HashMap<String, u64>>,
}

impl PlanCaches {
    pub fn new(stats: std::sync::Arc<crate::stats::SessionStats>) -> PlanCaches {
        PlanCaches {
            derived: DerivedConstants::new(stats),
            subgraphs: SubgraphConstants::default(),
            compiled: Default::default(),
            draws: Default::default(),
        }
    }

    /// Whether subgraphs may be compiled apart (off with the `compile` option).
    pub(super) fn with_compile(self, compile: bool) -> PlanCaches {
        self.compiled.disabled.store(!compile, std::sync::atomic::Ordering::Relaxed);
        self
    }
}

/// The MLX copies of subgraph initializers, made once per plan. Keyed by the subgraph's
/// address, which is stable while the plan (which owns the node and its attributes) lives.
#[derive(Default)]
pub struct SubgraphConstants {
    pub(crate) arrays: std::sync::Mutex<std::collections::HashMap<(usize, String), Array>>,
}

impl SubgraphConstants {
    pub(super) fn get(
        &self,
        graph: &crate::graph::Subgraph,
        name: &str,
        data: &crate::graph::TensorData,
    ) -> Result<Array> {
        let key = (graph as *const crate::graph::Subgraph as usize, name.to_owned());
        let mut arrays = self.arrays.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = arrays.get(&key) {
            return Ok(a.clone());
        }
        let dtype = data
            .elem_type
            .to_mlx()
            .ok_or_else(|| Error::new(format!("subgraph initializer '{name}' has type {:?}", data.elem_type)))?;
        let shared = crate::shared::SharedConstants::global().get(&data.bytes, &data.shape, dtype)?;
        let a = Array::clone(&shared);
        arrays.insert(key, a.clone());
        Ok(a)
    }
}

type DerivedKey = (Vec<usize>, String);

/// The process-wide index of derived constants, so sessions of one model share them.
fn shared_derived() -> &'static std::sync::Mutex<std::collections::HashMap<DerivedKey, std::sync::Weak<Vec<Array>>>> {
    static TABLE: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<DerivedKey, std::sync::Weak<Vec<Array>>>>,
    > = std::sync::OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// The session's cache of values derived from constants, keyed by (the constants' identities,
/// transform tag). A constant's identity is its shared MLX copy (see [`crate::shared`]): equal
/// weights in two sessions are one copy, so their derived values are found across sessions
/// too. Entries live as long as a plan holds them (a plan also holds the constants they were
/// derived from, so an identity is never reused while an entry for it lives).
pub struct DerivedConstants {
    values: std::sync::Mutex<std::collections::HashMap<DerivedKey, std::sync::Arc<Vec<Array>>>>,
    stats: std::sync::Arc<crate::stats::SessionStats>,
}

impl DerivedConstants {
    pub fn new(stats: std::sync::Arc<crate::stats::SessionStats>) -> DerivedConstants {
        DerivedConstants { values: Default::default(), stats }
    }

    pub(super) fn stats(&self) -> std::sync::Arc<crate::stats::SessionStats> {
        std::sync::Arc::clone(&self.stats)
    }

    pub(super) fn get_or_compute(
        &self,
        ids: Vec<usize>,
        tag: &str,
        compute: impl FnOnce() -> Result<Vec<Array>>,
    ) -> Result<std::sync::Arc<Vec<Array>>> {
        use std::sync::atomic::Ordering::Relaxed;
        let key = (ids, tag.to_owned());
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = values.get(&key) {
            return Ok(std::sync::Arc::clone(a));
        }
        let mut shared = shared_derived().lock().unwrap_or_else(|p| p.into_inner());
        shared.retain(|_, w| w.strong_count() > 0);
        if let Some(found) = shared.get(&key).and_then(std::sync::Weak::upgrade) {
            self.stats.derived_constants_shared.fetch_add(1, Relaxed);
            values.insert(key, std::sync::Arc::clone(&found));
            return Ok(found);
        }
        let arrays = compute()?;
        crate::mlx::VectorArray::from_arrays(&arrays)?.eval()?;
        self.stats.derived_constants.fetch_add(1, Relaxed);
        let arrays = std::sync::Arc::new(arrays);
        shared.insert(key.clone(), std::sync::Arc::downgrade(&arrays));
        values.insert(key, std::sync::Arc::clone(&arrays));
        Ok(arrays)
    }
}

impl Engine for PlanCaches {
    fn next_draw(&self, node: &str) -> u64 {
        let mut draws = self.draws.lock().unwrap_or_else(|p| p.into_inner());
        let n = draws.entry(node.to_owned()).or_insert(0);
        *n += 1;
        *n - 1
    }

    fn derived(
        &self,
        ids: Vec<usize>,
        tag: &str,
        compute: &mut dyn FnMut() -> Result<Vec<Array>>,
    ) -> Result<Vec<Array>> {
        Ok(self.derived.get_or_compute(ids, tag, compute)?.as_ref().clone())
    }

    fn compiled_subgraph(
        &self,
        graph: &Subgraph,
        inputs: Vec<Array>,
        outer: Vec<(String, Array)>,
        at: SubgraphCall<'_>,
    ) -> Result<Option<Vec<Array>>> {
        self.run_compiled_subgraph(graph, inputs, outer, at)
    }

    /// The subgraph's nodes in order, each resolved to its registered lowering (a lowering
    /// with subgraphs checks in its claim that every node has one), built as the partition's
    /// own nodes are.
    fn subgraph(&self, graph: &Subgraph, inputs: Vec<Array>, at: SubgraphCall<'_>) -> Result<Vec<Array>> {
        if inputs.len() != graph.inputs.len() {
            return Err(Error::new(format!("subgraph takes {} inputs, {} given", graph.inputs.len(), inputs.len())));
        }
        let registry = crate::registry::global()?;
        let mut env: HashMap<String, Array> = at.scope.cloned().unwrap_or_default();
        for (name, t) in &graph.initializers {
            env.insert(name.clone(), self.subgraphs.get(graph, name, t)?);
        }
        for (formal, a) in graph.inputs.iter().zip(inputs) {
            env.insert(formal.name.clone(), a);
        }
        for node in &graph.nodes {
            let at_node = |e: Error| e.at_node(&node.name, &node.qualified_op());
            let lowering = registry.claim(node).map_err(|d| at_node(Error::new(format!("cannot lower: {d}"))))?;
            if at.tracing && lowering.compile_safety() == crate::lowering::CompileSafety::Never {
                // (A random generator in a branch would replay the values of its trace.)
                return Err(at_node(Error::new("this node cannot be compiled; the subgraph runs eagerly")));
            }
            let mut args = Vec::with_capacity(node.inputs.len());
            for v in &node.inputs {
                args.push(match v {
                    None => None,
                    Some(v) => {
                        Some(env.get(&v.name).cloned().ok_or_else(|| {
                            at_node(Error::new(format!("input '{}' is not defined in scope", v.name)))
                        })?)
                    }
                });
            }
            let results = {
                let constants = vec![None; node.inputs.len()];
                let mut ctx = LowerCtx::for_node(
                    args,
                    constants,
                    Some(self),
                    at.stream,
                    at.cpu,
                    at.tracing,
                    at.shapeless,
                    Some(&env),
                );
                let results = lowering.lower(&mut ctx, node).map_err(at_node)?;
                for c in ctx.take_checks() {
                    at.checks.push(crate::lowering::Check { reason: at_node(Error::new(c.reason)).0, ..c });
                }
                for g in ctx.take_guards() {
                    at.guards.push(crate::lowering::Check { reason: at_node(Error::new(g.reason)).0, ..g });
                }
                results
            };
            for (out, a) in node.outputs.iter().zip(results) {
                if let Some(out) = out {
                    env.insert(out.name.clone(), a);
                }
            }
        }
        graph
            .outputs
            .iter()
            .map(|o| {
                env.get(&o.name)
                    .cloned()
                    .ok_or_else(|| Error::new(format!("subgraph output '{}' was not produced", o.name)))
            })
            .collect()
    }
}
