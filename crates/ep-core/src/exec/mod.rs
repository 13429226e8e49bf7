//! The compiled form of one partition and how it runs.
//!
//! A [`Plan`] resolves every node to its lowering once and uploads constants once. Each run
//! binds the inputs, obtains the MLX graph of the partition's outputs, and evaluates all of
//! them in one MLX evaluation. The graph comes from one of two places:
//!
//! - **compiled** (the default): the partition is traced into an MLX closure and
//!   `mlx_compile`d, then replayed. When every lowering is [`CompileSafety::Shapeless`] the
//!   closure is compiled shapeless (the *decode* slot: a growing sequence length replays
//!   without re-tracing); otherwise it is compiled per input-shape key (the *general* slot),
//!   in a bounded cache.
//! - **eager**: the lowerings build the graph anew on every run. A partition runs eagerly when
//!   compilation is off (`ONNXRUNTIME_EP_MLX_COMPILE=0`), when a lowering declares
//!   [`CompileSafety::Never`], or after tracing, compiling or evaluating its compiled form
//!   failed once (the reason goes to the session summary).

mod branches;
mod compiled;
mod constants;
mod decode;
mod translate;
mod write_back;

pub use write_back::{WriteBack, row_byte_ranges};

use crate::graph::{ElemType, NodeInfo};
use crate::lowering::{CompileSafety, Lowering};
use crate::mlx::{Array, Dtype, Stream, VectorArray};
use crate::registry::Registry;
use crate::stats::{Phase, SessionStats};
use crate::{Error, Result};
use compiled::{Applied, CompiledCache, jit_retry};
use constants::PlanCaches;
use decode::DecodeState;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use translate::{Built, TraceMode, Translation, Verdict, inexact_in_kernels};

/// How many shape keys a shape-keyed partition keeps compiled closures for, unless the
/// `compiled_cache` option says otherwise.
pub const COMPILED_CACHE_CAPACITY: usize = 8;

/// Where a node input or a partition output comes from, resolved once when the plan is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The i-th runtime input of the partition.
    Input(usize),
    /// The i-th constant (initializer) of the partition, uploaded when the plan was built.
    Constant(usize),
    /// The i-th value produced by a node of the partition.
    Value(usize),
    /// An omitted optional input.
    Absent,
}

struct PlanNode {
    info: NodeInfo,
    lowering: &'static dyn Lowering,
    inputs: Vec<Source>,
    /// Sources of the node's implicit inputs (outer-scope values its subgraphs use).
    implicit: Vec<(String, Source)>,
    /// The value slot of each output (`None` for an omitted optional output).
    outputs: Vec<Option<usize>>,
}

/// One output of the partition: its value name, where it comes from, and the dtype ORT expects.
#[derive(Debug, Clone)]
pub struct PlanOutput {
    pub name: String,
    pub elem_type: ElemType,
    pub source: Source,
    dtype: Dtype,
}

/// The evaluated result of a partition run.
pub struct RunOutputs {
    /// One array per partition output, in ORT's dtypes, evaluated (but for one the last run
    /// wrote in place as rows, see [`Plan::note_in_place`]: copy-out evaluates it if need be).
    pub outputs: Vec<Array>,
    /// Outputs that are inputs with some rows changed, evaluated and row-contiguous.
    pub write_backs: Vec<WriteBack>,
}

/// How a partition's graph is obtained on each run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Traced and compiled once per input-shape key (the general slot).
    ShapeKeyed,
    /// Traced and compiled once for all shapes of the same ranks (the decode slot).
    Shapeless,
    /// Built anew on every run, for the reason given.
    Eager(String),
}

/// A partition ready to run.
pub struct Plan {
    translation: Arc<Translation>,
    stream: Stream,
    stats: Arc<SessionStats>,
    mode: Mutex<Mode>,
    cache: Mutex<CompiledCache>,
    /// For a shapeless partition, the shapeless keys whose first shape was compiled exactly
    /// (see [`Plan::run_compiled`]).
    exact_first: Mutex<std::collections::HashSet<compiled::InputKey>>,
    decode: Mutex<DecodeState>,
    /// Which of its graphs are traced with fused kernels (the session's `fuse` option).
    fusion: crate::mlx::device::Fusion,
    /// Per output: whether the last run wrote it in place as changed rows (ORT bound it to the
    /// buffer of the input it updates). Such an output is left out of the next evaluation
    /// (only its rows are needed); copy-out evaluates it after all where that guess fails.
    in_place: Vec<std::sync::atomic::AtomicBool>,
}

impl Plan {
    /// Resolves every node to its lowering and checks that each value a node reads is a
    /// runtime input, a constant or the output of an earlier node.
    ///
    /// `nodes` must be in topological order; `inputs` are the runtime inputs in the order the
    /// compute call receives them; `outputs` the values it must produce, in order. With
    /// `compile` false the plan always runs eagerly.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: impl Into<String>,
        nodes: Vec<NodeInfo>,
        inputs: Vec<String>,
        outputs: Vec<(String, ElemType)>,
        constants: HashMap<String, Arc<Array>>,
        registry: &Registry,
        stats: Arc<SessionStats>,
        compile: bool,
    ) -> Result<Plan> {
        let name = name.into();
        let constants: Vec<(String, Arc<Array>)> = constants.into_iter().collect();
        let mut sources: HashMap<&str, Source> = HashMap::new();
        for (i, n) in inputs.iter().enumerate() {
            sources.insert(n.as_str(), Source::Input(i));
        }
        for (i, (n, _)) in constants.iter().enumerate() {
            sources.entry(n.as_str()).or_insert(Source::Constant(i));
        }
        let mut plan_nodes = Vec::with_capacity(nodes.len());
        let mut num_values = 0;
        for info in &nodes {
            let lowering = registry
                .claim(info)
                .map_err(|d| Error::new(format!("cannot lower: {d}")).at_node(&info.name, &info.qualified_op()))?;
            let mut node_inputs = Vec::with_capacity(info.inputs.len());
            for v in &info.inputs {
                node_inputs.push(match v {
                    None => Source::Absent,
                    Some(v) => *sources.get(v.name.as_str()).ok_or_else(|| {
                        Error::new(format!("input '{}' has no source in the partition", v.name))
                            .at_node(&info.name, &info.qualified_op())
                    })?,
                });
            }
            let mut implicit = Vec::with_capacity(info.implicit_inputs.len());
            for v in &info.implicit_inputs {
                let src = *sources.get(v.name.as_str()).ok_or_else(|| {
                    Error::new(format!("outer-scope value '{}' has no source in the partition", v.name))
                        .at_node(&info.name, &info.qualified_op())
                })?;
                implicit.push((v.name.clone(), src));
            }
            let mut node_outputs = Vec::with_capacity(info.outputs.len());
            for v in &info.outputs {
                node_outputs.push(v.as_ref().map(|v| {
                    sources.insert(v.name.as_str(), Source::Value(num_values));
                    num_values += 1;
                    num_values - 1
                }));
            }
            plan_nodes.push((lowering, node_inputs, implicit, node_outputs));
        }
        let mut resolved_outputs = Vec::with_capacity(outputs.len());
        for (out, elem_type) in outputs {
            let source = *sources
                .get(out.as_str())
                .ok_or_else(|| Error::new(format!("partition {name}: output '{out}' is produced by no node")))?;
            // Sub-byte integer outputs are held unpacked and packed at copy-out.
            let dtype = elem_type
                .held_as()
                .ok_or_else(|| Error::new(format!("output '{out}' has type {elem_type:?}, which MLX cannot hold")))?;
            resolved_outputs.push(PlanOutput { name: out, elem_type, source, dtype });
        }
        let nodes: Vec<PlanNode> = nodes
            .into_iter()
            .zip(plan_nodes)
            .map(|(info, (lowering, inputs, implicit, outputs))| PlanNode { info, lowering, inputs, implicit, outputs })
            .collect();
        let mode = choose_mode(&nodes, compile);
        if let Mode::Eager(reason) = &mode {
            stats.record_fallback(format!("partition {name}: {reason}"));
        }
        let exact = constants.iter().map(|(_, a)| inexact_in_kernels(a)).collect();
        let translation = Translation {
            name,
            inputs,
            outputs: resolved_outputs,
            constants,
            exact,
            nodes,
            num_values,
            caches: PlanCaches::new(Arc::clone(&stats)).with_compile(compile),
            cpu: Stream::cpu()?,
            stats: Arc::clone(&stats),
        };
        let num_outputs = translation.outputs.len();
        Ok(Plan {
            translation: Arc::new(translation),
            stream: Stream::default_device()?,
            stats,
            mode: Mutex::new(mode),
            cache: Mutex::new(CompiledCache::default()),
            exact_first: Mutex::default(),
            decode: Mutex::new(DecodeState::default()),
            fusion: crate::mlx::device::fusion_for(None),
            in_place: (0..num_outputs).map(|_| Default::default()).collect(),
        })
    }

    /// Records whether output `i` was written in place as changed rows this run (see
    /// [`Plan::run`]'s evaluation).
    pub fn note_in_place(&self, i: usize, in_place: bool) {
        if let Some(flag) = self.in_place.get(i) {
            flag.store(in_place, Ordering::Relaxed);
        }
    }

    /// Whether output `i` was written in place as changed rows on the last run.
    pub(super) fn was_in_place(&self, i: usize) -> bool {
        self.in_place.get(i).is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Traces this plan's graphs with fused kernels as `fusion` says.
    pub fn with_fusion(mut self, fusion: crate::mlx::device::Fusion) -> Plan {
        self.fusion = fusion;
        let all = fusion == crate::mlx::device::Fusion::All;
        self.translation.caches.compiled.fused.store(all, Ordering::Relaxed);
        self
    }

    /// Keeps at most `capacity` compiled closures in each of the plan's slots.
    pub fn with_cache_capacity(self, capacity: usize) -> Plan {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).set_capacity(capacity);
        let mut decode = self.decode.lock().unwrap_or_else(|p| p.into_inner());
        decode.cache.set_capacity(capacity);
        decode.split_cache.set_capacity(capacity);
        drop(decode);
        self
    }

    pub fn name(&self) -> &str {
        &self.translation.name
    }

    pub fn inputs(&self) -> &[String] {
        &self.translation.inputs
    }

    pub fn outputs(&self) -> &[PlanOutput] {
        &self.translation.outputs
    }

    pub fn num_nodes(&self) -> usize {
        self.translation.nodes.len()
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    pub fn stats(&self) -> &Arc<SessionStats> {
        &self.stats
    }

    /// How this partition currently obtains its graph.
    pub fn mode(&self) -> Mode {
        self.mode.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs the partition: its outputs and in-place input updates, evaluated together in one
    /// MLX evaluation. The caller holds [`mlx::lock()`] for the whole run, copy-out included.
    pub fn run(&self, inputs: Vec<Array>) -> Result<RunOutputs> {
        let t = &self.translation;
        if inputs.len() != t.inputs.len() {
            return Err(Error::new(format!(
                "partition {}: {} inputs given, {} expected",
                t.name,
                inputs.len(),
                t.inputs.len()
            )));
        }
        let mode = self.mode();
        // MLX's compiled broadcasting gets size-0 operands wrong (a [5, 0] * [5, 1] product came
        // out [5, 1]): empty tensors, which cost nothing to run, run eagerly.
        let empty = inputs.iter().any(|a| a.shape().contains(&0));
        // Shapes already compiled exactly (a prompt length seen before) replay that closure;
        // the decode slot takes the others while dimensions grow.
        if mode == Mode::ShapeKeyed
            && !empty
            && let Some(key) = self.decode_key(&inputs)
            && !self.cache.lock().unwrap_or_else(|p| p.into_inner()).contains(&exact_key(&inputs))
        {
            match jit_retry(&self.stats, || self.run_split(&inputs).transpose()) {
                Ok(None) => {}
                Ok(Some(Applied::Ran(run))) => return Ok(run),
                Ok(Some(Applied::Invalid(e))) => return Err(e),
                // A guard of the fixed-shape graph failed: the shapeless slot takes this run.
                Ok(Some(Applied::GuardMiss)) => {
                    self.stats.decode_guard_misses.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.refuse_split(format!("{e}")),
            }
            match jit_retry(&self.stats, || self.run_decode(&inputs, key.clone())) {
                Ok(Applied::Ran(run)) => return Ok(run),
                Ok(Applied::Invalid(e)) => return Err(e),
                // A guard failed: this run takes the exact shape-keyed path.
                Ok(Applied::GuardMiss) => {
                    self.stats.decode_guard_misses.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.refuse_decode(format!("the decode slot failed ({e})")),
            }
        }
        if !matches!(mode, Mode::Eager(_)) && !empty {
            match jit_retry(&self.stats, || self.run_compiled(&inputs, &mode)) {
                Ok(Applied::Ran(run)) => return Ok(run),
                Ok(Applied::Invalid(e)) => return Err(e),
                // A lowering's assumption about data (a guard) failed: this run is built
                // eagerly, where the data is read as it is.
                Ok(Applied::GuardMiss) => {
                    self.stats.decode_guard_misses.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    let reason = format!("compiled run failed ({e}); running eagerly from now on");
                    self.stats.record_fallback(format!("partition {}: {reason}", t.name));
                    *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = Mode::Eager(reason);
                    self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
                }
            }
        }
        let shapes: Vec<Vec<i64>> = inputs.iter().map(Array::shape).collect();
        let Built { outputs, mut write_backs, rows_at, flags, meta } = {
            let _timer = self.stats.phase(Phase::Translate, &t.name);
            t.build(inputs, &self.stream, TraceMode::Eager)?
        };
        self.stats.eager_runs.fetch_add(1, Ordering::Relaxed);
        // The rows to write are read on the host from their own buffers: laid out contiguously.
        let mut rows_at = rows_at;
        for p in &mut rows_at {
            p.rows = crate::mlx::ops::contiguous(&p.rows, &self.stream)?;
        }
        let extra = rows_at.iter().flat_map(|p| [&p.rows, &p.starts]);
        self.evaluate(outputs.iter().chain(write_backs.iter().map(|w| &w.array)).chain(extra).chain(&flags))?;
        // An eager run is exact: a guard has nothing to say, a failed check fails it.
        if let Some(flags) = &flags
            && let Verdict::Invalid(e) = meta.read(flags, &self.stream, false)?
        {
            return Err(e);
        }
        for p in &rows_at {
            write_backs.push(p.resolve(&shapes[p.input])?);
        }
        Ok(RunOutputs { outputs, write_backs })
    }

    fn evaluate<'x>(&self, arrays: impl IntoIterator<Item = &'x Array>) -> Result<()> {
        let _timer = self.stats.phase(Phase::Eval, &self.translation.name);
        VectorArray::from_arrays(arrays)?
            .eval()
            .map_err(|e| Error::new(format!("partition {}: {e}", self.translation.name)))?;
        self.stats.evaluations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The shape-keyed slot's key: each input's dtype and exact shape.
fn exact_key(inputs: &[Array]) -> compiled::InputKey {
    inputs.iter().map(|a| (a.dtype(), a.shape())).collect()
}

fn choose_mode(nodes: &[PlanNode], compile: bool) -> Mode {
    if !compile {
        return Mode::Eager("compilation is disabled (ONNXRUNTIME_EP_MLX_COMPILE=0)".into());
    }
    let mut worst = CompileSafety::Shapeless;
    for n in nodes {
        let safety = n.lowering.compile_safety();
        if safety == CompileSafety::Never {
            return Mode::Eager(format!("node '{}' ({}) cannot be compiled", n.info.name, n.info.qualified_op()));
        }
        worst = worst.max(safety);
    }
    if worst == CompileSafety::Shapeless { Mode::Shapeless } else { Mode::ShapeKeyed }
}

#[cfg(test)]
mod tests;
