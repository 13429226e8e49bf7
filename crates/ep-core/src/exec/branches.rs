//! Subgraphs compiled apart from their partition: a partition that runs eagerly (an If whose
//! condition is read on the host, a Loop whose trip count is) would otherwise lower every node
//! of the branch or body again on each run, and on a GPU dispatch each operation alone. Here
//! a subgraph becomes an `mlx_compile`d closure over its formal inputs and the enclosing
//! values it reads, traced once per key of their dtypes and shapes and then replayed.

use super::compiled::InputKey;
use super::constants::PlanCaches;
use crate::graph::Subgraph;
use crate::lowering::{Check, Checked, Engine, SubgraphCall};
use crate::mlx::{Array, Closure, MlxError, Stream, ops};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The most closures a plan keeps (the table is emptied when full: keys beyond it are rare,
/// one per subgraph, input shapes and baked values).
const CAPACITY: usize = 32;

/// Enclosing integer and boolean values of at most this many elements are baked into the
/// closure, their values part of its key: a node of the subgraph may read them on the host
/// (Squeeze's axes, Reshape's shape, a nested If's condition), which a traced argument forbids.
/// (Few, so that data read as data, token ids say, rarely multiplies the traces.)
const BAKED_ELEMENTS: usize = 8;

/// A compiled subgraph's key: the subgraph's address (stable while the plan owns it), its
/// arguments' dtypes and shapes, and the baked values (name, dtype, shape, bytes).
type Key = (usize, InputKey, Vec<(String, crate::mlx::Dtype, Vec<i64>, Vec<u8>)>);

/// The most keys one subgraph is traced for: past them its arguments change shape from call
/// to call (a loop state that grows), and it is built node by node from then on.
const KEYS_PER_SUBGRAPH: usize = 8;

/// A plan's compiled subgraphs.
#[derive(Default)]
pub struct CompiledSubgraphs {
    entries: Mutex<HashMap<Key, Entry>>,
    /// Per subgraph, how many keys it was traced for (`usize::MAX`: refused).
    traced: Mutex<HashMap<usize, usize>>,
    /// Whether their traces may fuse elementwise chains (the plan's fusion setting for
    /// graphs that are not decode steps).
    pub(super) fused: AtomicBool,
    /// Compilation is off (the `compile` option): subgraphs are built node by node.
    pub(super) disabled: AtomicBool,
}

#[derive(Clone)]
enum Entry {
    Ready {
        closure: Arc<Closure>,
        /// The reasons of the data checks the trace declared, in the order of the flags the
        /// closure returns after the outputs.
        reasons: Arc<Mutex<Vec<String>>>,
        ran: bool,
    },
    /// The trace failed once (a node reads data on the host, declares a guard, ...).
    Refused,
}

impl PlanCaches {
    /// See [`Engine::compiled_subgraph`].
    pub(super) fn run_compiled_subgraph(
        &self,
        graph: &Subgraph,
        inputs: Vec<Array>,
        outer: Vec<(String, Array)>,
        at: SubgraphCall<'_>,
    ) -> Result<Option<Vec<Array>>> {
        if at.tracing || self.compiled.disabled.load(Ordering::Relaxed) {
            // Inside a trace the subgraph is part of the graph being compiled.
            return Ok(None);
        }
        let formal = inputs.len();
        let (mut names, mut args, mut baked, mut values) = (Vec::new(), inputs, Vec::new(), Vec::new());
        for (name, a) in outer {
            if a.dtype().is_float() || a.size() > BAKED_ELEMENTS {
                names.push(name);
                args.push(a);
            } else {
                let mut bytes = vec![0u8; a.size() * a.dtype().size_in_bytes()];
                a.copy_to(&mut bytes, at.cpu)?;
                // A copy of its own: the closure outlives the run, and `a` may be a view of a
                // buffer ORT lends for this run only.
                values.push((name.clone(), Array::from_bytes(&bytes, &a.shape(), a.dtype())?));
                baked.push((name, a.dtype(), a.shape(), bytes));
            }
        }
        let id = graph as *const Subgraph as usize;
        let key = (id, args.iter().map(|a| (a.dtype(), a.shape())).collect(), baked);
        let entry = {
            let mut entries = self.compiled.entries.lock().unwrap_or_else(|p| p.into_inner());
            if !entries.contains_key(&key) {
                let mut traced = self.compiled.traced.lock().unwrap_or_else(|p| p.into_inner());
                let n = traced.entry(id).or_insert(0);
                if *n == KEYS_PER_SUBGRAPH {
                    self.derived.stats().record_fallback(format!(
                        "a subgraph is built node by node on every run: its inputs took more than \
                         {KEYS_PER_SUBGRAPH} shapes or small values"
                    ));
                }
                if *n >= KEYS_PER_SUBGRAPH {
                    *n = usize::MAX;
                    return Ok(None);
                }
                *n += 1;
                if entries.len() >= CAPACITY {
                    // (The counts start again with the table: a key traced again counts anew.)
                    entries.clear();
                    traced.retain(|_, n| *n == usize::MAX);
                    traced.insert(id, 1);
                }
                let made = self.subgraph_closure(graph, formal, names, values);
                entries.insert(key.clone(), made);
            }
            entries[&key].clone()
        };
        let Entry::Ready { closure, reasons, ran } = entry else { return Ok(None) };
        let applied = if ran {
            closure.apply(&args)
        } else {
            let fused = self.compiled.fused.load(Ordering::Relaxed);
            crate::mlx::device::traced_with_fusion(fused, || closure.apply(&args))?
        };
        let mut out = match applied {
            Ok(out) => out,
            Err(e) if !ran => {
                self.derived.stats().record_fallback(format!("a subgraph is built node by node on every run: {e}"));
                self.compiled.entries.lock().unwrap_or_else(|p| p.into_inner()).insert(key, Entry::Refused);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(Entry::Ready { ran, .. }) =
            self.compiled.entries.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&key)
        {
            *ran = true;
        }
        let stats = self.derived.stats();
        let counter = if ran { &stats.subgraph_replays } else { &stats.subgraph_traces };
        counter.fetch_add(1, Ordering::Relaxed);
        let n = graph.outputs.len();
        if out.len() < n {
            return Err(Error::new(format!("a compiled subgraph returned {} values for {n} outputs", out.len())));
        }
        if let Some(flags) = out.split_off(n).first() {
            for (i, reason) in reasons.lock().unwrap_or_else(|p| p.into_inner()).iter().enumerate() {
                let holds = ops::slice(flags, &[i as i64], &[i as i64 + 1], at.stream)?;
                at.checks.push(Check { what: Checked::All(holds), reason: reason.clone() });
            }
        }
        Ok(Some(out))
    }

    /// The compiled closure of `graph`: `formal` arguments bound to its inputs, the rest to
    /// the enclosing values `names`, and the enclosing values `baked` held as constants; its
    /// nodes' data checks returned as one boolean flag each after the outputs. A node
    /// declaring a guard refuses the trace (a guard's assumption would need the trace replaced
    /// where it fails; the node-by-node build has none).
    fn subgraph_closure(
        &self,
        graph: &Subgraph,
        formal: usize,
        names: Vec<String>,
        baked: Vec<(String, Array)>,
    ) -> Entry {
        let g = Arc::new(graph.clone());
        let engine = Arc::new(PlanCaches::new(self.derived.stats()));
        let reasons: Arc<Mutex<Vec<String>>> = Arc::default();
        let told = Arc::clone(&reasons);
        let f = Closure::new(move |args: &[Array]| {
            let (stream, cpu) = (Stream::default_device()?, Stream::cpu()?);
            let (inputs, outer) = args.split_at(formal.min(args.len()));
            let scope: HashMap<String, Array> =
                names.iter().cloned().zip(outer.iter().cloned()).chain(baked.iter().cloned()).collect();
            let (mut checks, mut guards) = (Vec::new(), Vec::new());
            let call = SubgraphCall {
                stream: &stream,
                cpu: &cpu,
                tracing: true,
                shapeless: false,
                scope: Some(&scope),
                checks: &mut checks,
                guards: &mut guards,
            };
            let mut out = engine.subgraph(&g, inputs.to_vec(), call).map_err(|e| MlxError(e.0))?;
            if let Some(g) = guards.first() {
                return Err(MlxError(format!("it declares a guard ({})", g.reason)));
            }
            if !checks.is_empty() {
                let holds = checks.iter().map(|c| c.holds(&stream)).collect::<Result<Vec<_>>>();
                let holds = holds.map_err(|e| MlxError(e.0))?;
                out.push(ops::concatenate(&holds, 0, &stream)?);
            }
            *told.lock().unwrap_or_else(|p| p.into_inner()) = checks.into_iter().map(|c| c.reason).collect();
            Ok(out)
        });
        match f.compile(false) {
            Ok(closure) => Entry::Ready { closure: Arc::new(closure), reasons, ran: false },
            Err(e) => {
                self.derived.stats().record_fallback(format!("a subgraph is built node by node on every run: {e}"));
                Entry::Refused
            }
        }
    }
}
