//! The decode slot of a shape-keyed partition: input dimensions that grow from run to run
//! (a KV cache, an attention mask), checked through the plan by asking each lowering how its
//! outputs grow, and one shapeless trace replayed across them.

use super::compiled::{Applied, CompiledCache, InputKey, Traced};
use super::translate::{Part, Split, TraceMode, Translation};
use super::{Plan, Source};
use crate::Result;
use crate::mlx::device::Fusion;
use crate::mlx::{Array, Closure, Dtype, MlxError, Stream};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The decode slot of a shape-keyed partition: which input dimensions grow from run to run
/// (they increased between two consecutive runs in which nothing shrank, or in the first
/// such pair at all: a KV cache's length, an attention mask's), and the shapeless closures
/// that replay across them.
#[derive(Default)]
pub(super) struct DecodeState {
    pub(super) last: Option<Vec<Vec<i64>>>,
    pub(super) growing: Vec<Vec<bool>>,
    /// The growing set [`Translation::decode_check`] accepted.
    pub(super) checked: Option<Vec<Vec<bool>>>,
    /// Why the slot is off for this partition.
    pub(super) refused: Option<String>,
    pub(super) cache: CompiledCache,
    /// The split for the growing set checked (see [`Plan::run_split`]), or why there is none,
    /// and the growing set it was made for.
    pub(super) split: Option<(Vec<Vec<bool>>, SplitOrWhy)>,
    /// Whether this run keeps the previous run's shapes but for the growing dimensions, a
    /// decode step (a new prompt changes the token count): only such a run takes the split.
    pub(super) steady: bool,
    /// The boundary's shapes at the split's first run: a later change ends the split.
    pub(super) boundary_shapes: Option<Vec<Vec<i64>>>,
    pub(super) split_cache: CompiledCache,
    /// The split's prologue compiled (see [`Plan::run_split`]), or why it runs eagerly.
    pub(super) prologue: Option<Prologue>,
}

/// How a split's prologue runs: compiled for the key of the inputs' other dimensions (and
/// whether it ran once), or eagerly (the reason is among the session's fallbacks).
pub(super) enum Prologue {
    Compiled(InputKey, Arc<Closure>, bool),
    Eager,
}

/// What a split's prologue hands the graph: the boundary values, and the prologue's guards
/// and data checks as booleans still to be read (`None`: none, or already read).
struct Boundary {
    values: Vec<Array>,
    flags: Option<Array>,
}

/// A partition's split, or why it has none.
pub(super) type SplitOrWhy = std::result::Result<Arc<Split>, String>;

/// The most elements a boundary value may hold (the values the prologue hands the graph are
/// lengths and sizes, not activations).
const BOUNDARY_ELEMENTS: usize = 64;

impl Translation {
    /// Whether the decode slot may replay one shapeless trace of this partition while the
    /// input dimensions marked in `growing` change: each node whose inputs grow is asked how
    /// its outputs grow ([`Lowering::growth`]), in order; a refusal names the node.
    pub(super) fn decode_check(&self, growing: &[Vec<bool>]) -> std::result::Result<(), String> {
        use crate::growth::{Growth, GrowthQuery};
        let mut values: HashMap<usize, Growth> = HashMap::new();
        let input_growth = |i: usize| -> Option<Growth> {
            let axes: Vec<usize> = growing.get(i)?.iter().enumerate().filter(|(_, g)| **g).map(|(a, _)| a).collect();
            (!axes.is_empty()).then_some(Growth::Axes(axes))
        };
        for node in &self.nodes {
            let inputs: Vec<Option<Growth>> = node
                .inputs
                .iter()
                .map(|src| match *src {
                    Source::Input(i) => input_growth(i),
                    Source::Value(v) => values.get(&v).cloned(),
                    _ => None,
                })
                .collect();
            // A value read through the node's subgraphs (an If's branch, a loop body) is
            // beyond what `growth` is asked about: a growing one refuses the slot.
            let grows = |src: &Source| match *src {
                Source::Input(i) => input_growth(i).is_some(),
                Source::Value(v) => values.contains_key(&v),
                _ => false,
            };
            if let Some((name, _)) = node.implicit.iter().find(|(_, src)| grows(src)) {
                return Err(format!(
                    "node '{}' ({}) reads the growing value '{name}' in its subgraphs",
                    node.info.name,
                    node.info.qualified_op()
                ));
            }
            if inputs.iter().all(Option::is_none) {
                continue;
            }
            let constants = |k: usize| -> Option<Vec<i64>> {
                let Some(Source::Constant(c)) = node.inputs.get(k).copied() else { return None };
                let a = &self.constants[c].1;
                let bytes = a.host_bytes()?;
                match a.dtype() {
                    Dtype::I64 => Some(
                        bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect(),
                    ),
                    Dtype::I32 => Some(
                        bytes
                            .chunks_exact(4)
                            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
                            .collect(),
                    ),
                    _ => None,
                }
            };
            let query = GrowthQuery { node: &node.info, inputs: &inputs, constants: &constants };
            let outputs = node
                .lowering
                .growth(&query)
                .map_err(|why| format!("node '{}' ({}) {why}", node.info.name, node.info.qualified_op()))?;
            for (slot, g) in node.outputs.iter().zip(outputs) {
                if let (Some(slot), Some(g)) = (slot, g) {
                    values.insert(*slot, g);
                }
            }
        }
        Ok(())
    }
}

impl Translation {
    /// The split of this partition for the inputs growing in `growing`: every node reading a
    /// growing input, or a value such a node computed, is in the prologue; a prologue node
    /// must read nothing else the graph computes. Refused when no node reads them.
    pub(super) fn split_for(&self, growing: &[Vec<bool>]) -> std::result::Result<Split, String> {
        let grows: Vec<bool> =
            (0..self.inputs.len()).map(|i| growing.get(i).is_some_and(|g| g.iter().any(|x| *x))).collect();
        let mut prologue = vec![false; self.nodes.len()];
        let mut from_prologue = vec![false; self.num_values];
        for (n, node) in self.nodes.iter().enumerate() {
            let sources = || node.inputs.iter().chain(node.implicit.iter().map(|(_, s)| s));
            let direct = sources().any(|s| matches!(*s, Source::Input(i) if grows[i]));
            let derived = sources().any(|s| matches!(*s, Source::Value(v) if from_prologue[v]));
            // Any other runtime data: an input that does not grow, a value of the graph.
            let other = sources().any(|s| match *s {
                Source::Input(i) => !grows[i],
                Source::Value(v) => !from_prologue[v],
                _ => false,
            });
            // A node reading growing inputs belongs to the prologue; one reading only what
            // the prologue computed (and constants) joins it; any other reads its values
            // from the boundary.
            if direct && other {
                return Err(format!(
                    "node '{}' ({}) reads a growing input and other runtime values",
                    node.info.name,
                    node.info.qualified_op()
                ));
            }
            if !(direct || derived && !other) {
                continue;
            }
            prologue[n] = true;
            for &slot in node.outputs.iter().flatten() {
                from_prologue[slot] = true;
            }
        }
        let held = prologue.iter().filter(|p| **p).count();
        if held == 0 {
            return Err("no node reads the growing inputs".into());
        }
        // The prologue is built eagerly on every run: it pays only when it is a small part.
        if held * 4 > self.nodes.len() {
            return Err(format!("{held} of {} nodes read the growing inputs", self.nodes.len()));
        }
        let mut boundary: Vec<usize> = Vec::new();
        let rest = self.nodes.iter().enumerate().filter(|(n, _)| !prologue[*n]);
        let read = rest.flat_map(|(_, node)| node.inputs.iter().chain(node.implicit.iter().map(|(_, s)| s)).copied());
        for src in read.chain(self.outputs.iter().map(|o| o.source)) {
            if let Source::Value(v) = src
                && from_prologue[v]
                && !boundary.contains(&v)
            {
                boundary.push(v);
            }
        }
        // (Every node reading a growing input is in the prologue; a partition output that is
        // one would be the graph's placeholder.)
        if let Some(o) = self.outputs.iter().find(|o| matches!(o.source, Source::Input(i) if grows[i])) {
            return Err(format!("output '{}' is a growing input", o.name));
        }
        if boundary.is_empty() {
            return Err("the rest of the graph reads nothing the growing inputs' nodes compute".into());
        }
        Ok(Split { prologue, boundary, growing: grows })
    }
}

impl Plan {
    /// The decode slot cut in two, for a partition whose growing inputs feed only a few
    /// small values (a genai decoder with its KV cache in one fixed buffer: only the
    /// attention mask grows, and only its sum and its length are read). The prologue runs
    /// eagerly; the rest is one graph of fixed shapes, traced and compiled per shape like
    /// any shape-keyed graph, so it replays without the broadcasts MLX adds to every
    /// operand inside a shapeless trace (on a GPU each costs host work on every run).
    /// `None` when the split does not apply (the shapeless decode slot runs instead).
    pub(super) fn run_split(&self, inputs: &[Array]) -> Option<Result<Applied>> {
        let split = {
            let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
            let growing = st.checked.clone()?;
            if !st.steady {
                return None;
            }
            // (Made again, with a fresh cache, when another set of dimensions grows.)
            if st.split.as_ref().is_none_or(|(made_for, _)| *made_for != growing) {
                let split = self.translation.split_for(&growing);
                if let Err(why) = &split {
                    let name = &self.translation.name;
                    self.stats.record_fallback(format!("partition {name}: no split decode slot: {why}"));
                }
                st.split = Some((growing, split.map(Arc::new)));
                st.boundary_shapes = None;
                st.split_cache.clear();
                st.prologue = None;
            }
            Arc::clone(st.split.as_ref().and_then(|(_, s)| s.as_ref().ok())?)
        };
        Some(self.run_split_with(&split, inputs))
    }

    fn run_split_with(&self, split: &Arc<Split>, inputs: &[Array]) -> Result<Applied> {
        let prologue = {
            let _span = self.stats.span("prologue");
            self.run_prologue(split, inputs)?
        };
        // A prologue whose guard or data check failed hands back nothing: this run is served
        // by the shapeless slot (which reports a failed check as the run's error).
        let Some(Boundary { values: boundary, flags }) = prologue.filter(|b| b.values.len() == split.boundary.len())
        else {
            return Ok(Applied::GuardMiss);
        };
        let shapes: Vec<Vec<i64>> = boundary.iter().map(Array::shape).collect();
        if let Some(b) = boundary.iter().find(|b| b.size() > BOUNDARY_ELEMENTS) {
            return Err(crate::Error::new(format!("a boundary value holds {} elements", b.size())));
        }
        {
            let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
            if *st.boundary_shapes.get_or_insert_with(|| shapes.clone()) != shapes {
                // (Another batch size, say: not this graph's run, the split stays.)
                return Ok(Applied::GuardMiss);
            }
        }
        // The growing inputs only the prologue reads: a one-element placeholder of their dtype.
        let mut args = Vec::with_capacity(inputs.len() + boundary.len());
        for (a, &grows) in inputs.iter().zip(&split.growing) {
            args.push(if grows { crate::mlx::ops::scalar(0.0, a.dtype(), &self.stream)? } else { a.clone() });
        }
        args.extend(boundary);
        let key = super::exact_key(&args);
        let traced = self.decode.lock().unwrap_or_else(|p| p.into_inner()).split_cache.get_or_compile(key, || {
            Traced::compile_part(&self.translation, &self.stats, TraceMode::Keyed, Some(Arc::clone(split)), true)
        })?;
        // The graph reads the boundary values unevaluated, and the prologue's flags are
        // evaluated with its outputs: one evaluation, one wait on a GPU. Where a flag is
        // false the graph's results are dropped (every lowering builds a memory-safe graph
        // whatever its data) and the shapeless slot serves the run.
        let run = self.apply(&traced, &args, flags.as_ref());
        if let Some(flags) = flags {
            // (Not evaluated with a graph that failed: evaluated alone, to tell whether the
            // prologue's data sent the run elsewhere; where it cannot be, the run's error.)
            if run.is_err() && flags.eval().is_err() {
                return run;
            }
            if !flags.to_vec::<bool>(&self.stream)?.iter().all(|&ok| ok) {
                return Ok(Applied::GuardMiss);
            }
        }
        let run = run?;
        if matches!(run, Applied::Ran(_)) {
            self.stats.split_runs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(run)
    }

    /// The split's prologue on this run's inputs: its boundary values, or `None` where one of
    /// its guards or data checks failed. Compiled once, shapeless (its inputs grow every
    /// step), and replayed: built eagerly node by node it cost a decode step 0.42 ms of host
    /// work on an H100. The compiled prologue is not evaluated here: its values and flags are
    /// evaluated with the graph that reads them. Where MLX refuses the compiled prologue, it
    /// is built eagerly (and evaluated) from then on.
    fn run_prologue(&self, split: &Arc<Split>, inputs: &[Array]) -> Result<Option<Boundary>> {
        // MLX keys a shapeless closure by ranks and dtypes alone; lowerings are shape-agnostic
        // only along the growing dimensions, so every other dimension keys the closure here.
        let compiled = {
            let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
            let shapes: Vec<Vec<i64>> = inputs.iter().map(Array::shape).collect();
            let key = growing_key(inputs, &shapes, st.split.as_ref().map_or(&[][..], |(g, _)| g.as_slice()));
            match &st.prologue {
                Some(Prologue::Eager) => None,
                Some(Prologue::Compiled(k, c, ran)) if *k == key => Some((Arc::clone(c), *ran)),
                _ => {
                    let made = prologue_closure(&self.translation, split).map(Arc::new);
                    st.prologue = Some(match &made {
                        Ok(c) => Prologue::Compiled(key, Arc::clone(c), false),
                        Err(e) => {
                            let name = &self.translation.name;
                            self.stats
                                .record_fallback(format!("partition {name}: the split's prologue runs eagerly: {e}"));
                            Prologue::Eager
                        }
                    });
                    made.ok().map(|c| (c, false))
                }
            }
        };
        if let Some((closure, ran)) = compiled {
            match self.apply_prologue(&closure, split, inputs, !ran) {
                Ok(boundary) => {
                    if let Some(Prologue::Compiled(_, _, ran)) =
                        &mut self.decode.lock().unwrap_or_else(|p| p.into_inner()).prologue
                    {
                        *ran = true;
                    }
                    return Ok(Some(boundary));
                }
                Err(e) => {
                    // A closure that never ran (MLX refused its trace) is given up; one that
                    // ran before fails this run only, which the eager prologue below serves.
                    let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(Prologue::Compiled(_, _, false)) = st.prologue {
                        let name = &self.translation.name;
                        self.stats.record_fallback(format!("partition {name}: the split's prologue runs eagerly: {e}"));
                        st.prologue = Some(Prologue::Eager);
                    }
                }
            }
        }
        let built =
            self.translation.build_part(inputs.to_vec(), &self.stream, TraceMode::Eager, Part::Prologue(split))?;
        let values = Some(built.outputs).filter(|b| !b.is_empty() || split.boundary.is_empty());
        Ok(values.map(|values| Boundary { values, flags: None }))
    }

    /// Applies the compiled prologue, unevaluated; its first application traces it, with
    /// fused kernels only where every graph is fused ([`Fusion::All`]): on CUDA the
    /// prologue's few small integer operations would be kernels NVRTC compiles for seconds
    /// each on a first run, and cost a step microseconds unfused.
    fn apply_prologue(&self, closure: &Closure, split: &Split, inputs: &[Array], first: bool) -> Result<Boundary> {
        let mut values = if first {
            crate::mlx::device::traced_with_fusion(self.fusion == Fusion::All, || closure.apply(inputs))?
        } else {
            closure.apply(inputs)
        }
        .map_err(crate::Error::from)?;
        let n = split.boundary.len();
        if values.len() < n {
            return Err(crate::Error::new(format!("the prologue returned {} values for {n}", values.len())));
        }
        let flags = values.split_off(n).into_iter().next();
        Ok(Boundary { values, flags })
    }

    /// Ends the split for this partition (the shapeless decode slot takes its runs).
    pub(super) fn refuse_split(&self, reason: String) {
        self.stats.record_fallback(format!("partition {}: no split decode slot: {reason}", self.translation.name));
        let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, split)) = st.split.as_mut() {
            *split = Err(reason);
        }
        st.split_cache.clear();
    }

    /// Records this run's input shapes and returns the decode slot's key when the slot
    /// applies: some dimensions grow, the partition handles them shape-agnostically, and the
    /// slot was not refused. The key keeps every other dimension exact.
    pub(super) fn decode_key(&self, inputs: &[Array]) -> Option<InputKey> {
        let shapes: Vec<Vec<i64>> = inputs.iter().map(Array::shape).collect();
        let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
        if st.growing.len() != shapes.len() {
            st.growing = shapes.iter().map(|s| vec![false; s.len()]).collect();
        }
        st.steady = false;
        if let Some(last) = st.last.take()
            && last.len() == shapes.len()
            && last.iter().zip(&shapes).all(|(a, b)| a.len() == b.len())
        {
            let shrank = last.iter().zip(&shapes).any(|(a, b)| a.iter().zip(b).any(|(x, y)| y < x));
            // Nothing shrank: every dimension as in the previous run or grown (and marked
            // below), a decode step; a prompt after decode steps shrinks the token count.
            st.steady = !shrank;
            // The first growth may come with a shrink (a prompt, then the first decode step:
            // the tokens shrink to one while the mask and the caches grow), so the first
            // step already replays the decode slot's closure; later, a shrink is a new start
            // (the next prompt) and marks nothing.
            let first = !st.growing.iter().flatten().any(|g| *g);
            if !shrank || first {
                for (i, (a, b)) in last.iter().zip(&shapes).enumerate() {
                    for (d, (x, y)) in a.iter().zip(b).enumerate() {
                        if y > x {
                            st.growing[i][d] = true;
                        }
                    }
                }
            }
        }
        st.last = Some(shapes.clone());
        if st.refused.is_some() || !st.growing.iter().flatten().any(|g| *g) {
            return None;
        }
        if st.checked.as_ref() != Some(&st.growing) {
            if let Err(reason) = self.translation.decode_check(&st.growing) {
                let reason = format!("partition {}: no decode slot: {reason}", self.translation.name);
                self.stats.record_fallback(reason.clone());
                st.refused = Some(reason);
                return None;
            }
            st.checked = Some(st.growing.clone());
        }
        Some(growing_key(inputs, &shapes, &st.growing))
    }

    pub(super) fn refuse_decode(&self, reason: String) {
        let reason = format!("partition {}: {reason}; using the shape-keyed slot", self.translation.name);
        self.stats.record_fallback(reason.clone());
        let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
        st.refused = Some(reason);
        st.cache.clear();
    }

    /// Runs the decode slot's shapeless closure for `key`.
    pub(super) fn run_decode(&self, inputs: &[Array], key: InputKey) -> Result<Applied> {
        let traced = self
            .decode
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cache
            .get_or_compile(key, || Traced::compile(&self.translation, &self.stats, TraceMode::Shapeless))?;
        let run = self.apply(&traced, inputs, None)?;
        self.stats.decode_runs.fetch_add(1, Ordering::Relaxed);
        Ok(run)
    }
}

/// The prologue of `split` as a shapeless compiled closure: the partition's inputs in, the
/// boundary values out, then (when it has guards or data checks) one boolean per condition.
fn prologue_closure(translation: &Arc<Translation>, split: &Arc<Split>) -> Result<Closure> {
    let (t, sp) = (Arc::clone(translation), Arc::clone(split));
    let f = Closure::new(move |args: &[Array]| {
        let stream = Stream::default_device()?;
        let built = t.build_part(args.to_vec(), &stream, TraceMode::Shapeless, Part::Prologue(&sp));
        let built = built.map_err(|e| MlxError(e.0))?;
        let mut out = built.outputs;
        out.extend(built.flags);
        Ok(out)
    });
    Ok(f.compile(true)?)
}

/// A key of each input's dtype and shape with its growing dimensions (beyond 1) as -1: every
/// other dimension exact (lowerings are shape-agnostic along the growing ones only).
fn growing_key(inputs: &[Array], shapes: &[Vec<i64>], growing: &[Vec<bool>]) -> InputKey {
    inputs
        .iter()
        .zip(shapes)
        .enumerate()
        .map(|(i, (a, shape))| {
            let grows = |d: usize| growing.get(i).and_then(|g| g.get(d)).copied().unwrap_or(false);
            let dims = shape.iter().enumerate().map(|(d, &n)| if grows(d) && n > 1 { -1 } else { n });
            (a.dtype(), dims.collect())
        })
        .collect()
}
