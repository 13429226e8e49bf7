//! The translation: the part of a plan a compiled closure captures, and the one walk over its
//! nodes that builds the MLX graph of the partition's outputs (eagerly or inside a trace),
//! with the guards, data checks and in-place updates the lowerings declare.

use super::constants::PlanCaches;
use super::write_back::{PendingRows, WriteBack, row_byte_ranges};
use super::{PlanNode, PlanOutput, Source};
use crate::lowering::{ChangedRows, Check, LowerCtx, RowUpdate};
use crate::mlx::{self, Array, Dtype, Stream};
use crate::stats::SessionStats;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Under which trace a translation builds its graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TraceMode {
    /// Not traced: built for this run only.
    Eager,
    /// Traced for one input-shape key.
    Keyed,
    /// Traced once for every shape of the same ranks (and size-1 dims).
    Shapeless,
}

/// A partition cut in two for its decode steps (see `Plan::run_split`): the nodes that read
/// growing inputs, directly or through each other (the prologue, built eagerly before the
/// graph: an attention mask's sum and shape), and the values they hand the rest (the
/// boundary, a few elements of fixed shape), which the rest's graph takes as trailing inputs.
pub(super) struct Split {
    /// Per node, whether it is in the prologue.
    pub(super) prologue: Vec<bool>,
    /// The value slots the rest of the graph (or the partition's outputs) read from it.
    pub(super) boundary: Vec<usize>,
    /// Per runtime input, whether only the prologue reads it (the graph gets a placeholder).
    pub(super) growing: Vec<bool>,
}

/// Which nodes a build lowers.
#[derive(Clone, Copy)]
pub(super) enum Part<'a> {
    /// Every node: the partition's graph.
    Whole,
    /// The prologue's nodes only; the build's outputs are the boundary values.
    Prologue(&'a Split),
    /// Every other node; the inputs end with the boundary values.
    Main(&'a Split),
}

/// The part of a plan a compiled closure captures: everything needed to build the graph.
pub(super) struct Translation {
    pub(super) name: String,
    pub(super) inputs: Vec<String>,
    pub(super) outputs: Vec<PlanOutput>,
    pub(super) constants: Vec<(String, Arc<Array>)>,
    /// Per constant: its value when it is one float32/float64 element that a compiled
    /// kernel's source would not hold exactly.
    pub(super) exact: Vec<Option<(f64, Dtype, Vec<i64>)>>,
    pub(super) nodes: Vec<PlanNode>,
    pub(super) num_values: usize,
    pub(super) caches: PlanCaches,
    pub(super) cpu: Stream,
    pub(super) stats: Arc<SessionStats>,
}

impl Translation {
    /// Builds the MLX graph of the partition's outputs from `inputs` (not evaluated): each
    /// output cast to ORT's dtype, plus the in-place input updates the
    /// lowerings asked for, built under `mode` (eagerly or inside a trace).
    pub(super) fn build(&self, inputs: Vec<Array>, stream: &Stream, mode: TraceMode) -> Result<Built> {
        self.build_part(inputs, stream, mode, Part::Whole)
    }

    /// [`Self::build`] of one part of a split partition.
    pub(super) fn build_part(
        &self,
        mut inputs: Vec<Array>,
        stream: &Stream,
        mode: TraceMode,
        part: Part<'_>,
    ) -> Result<Built> {
        let (tracing, shapeless) = (mode != TraceMode::Eager, mode == TraceMode::Shapeless);
        let mut write_backs = Vec::new();
        let mut rows_at = Vec::new();
        let mut guards: Vec<Check> = Vec::new();
        let mut checks: Vec<Check> = Vec::new();
        let mut values: Vec<Option<Array>> = vec![None; self.num_values];
        if let Part::Main(split) = part {
            let at =
                inputs.len().checked_sub(split.boundary.len()).ok_or_else(|| Error::new("boundary values missing"))?;
            for (&slot, a) in split.boundary.iter().zip(inputs.split_off(at)) {
                values[slot] = Some(a);
            }
        }
        let lowered = |n: usize| match part {
            Part::Whole => true,
            Part::Prologue(split) => split.prologue[n],
            Part::Main(split) => !split.prologue[n],
        };
        let memo = crate::lowering::SharedValues::default();
        // Which nodes read each value, and as which input (a producer may publish a form of
        // its output that only some readers use: see `LowerCtx::publish`).
        let mut readers: HashMap<usize, Vec<(&crate::NodeInfo, usize)>> = HashMap::new();
        for n in &self.nodes {
            for (i, src) in n.inputs.iter().enumerate() {
                if let Source::Value(v) = src {
                    readers.entry(*v).or_default().push((&n.info, i));
                }
            }
        }
        let resolve = |values: &[Option<Array>], src: Source| -> Option<Array> {
            match src {
                Source::Input(i) => inputs.get(i).cloned(),
                // Inside a trace, a one-element float constant is rebuilt exactly (see
                // `mlx::ops::exact_float`): MLX would write it into the kernel's source rounded.
                Source::Constant(i) => match (&self.exact[i], tracing) {
                    (Some((v, dtype, shape)), true) => mlx::ops::exact_float(*v, *dtype, shape, stream).ok(),
                    _ => Some(Array::clone(&self.constants[i].1)),
                },
                Source::Value(i) => values[i].clone(),
                Source::Absent => None,
            }
        };
        for (n, node) in self.nodes.iter().enumerate() {
            if !lowered(n) {
                continue;
            }
            let info = &node.info;
            let args: Vec<Option<Array>> = node.inputs.iter().map(|&src| resolve(&values, src)).collect();
            let constant_ids = node.inputs.iter().map(|src| self.constant_identity(*src)).collect();
            let tracer = self.stats.tracer();
            let described = tracer.map(|_| describe(&args));
            let started = Instant::now();
            let scope: Option<HashMap<String, Array>> = (!node.implicit.is_empty()).then(|| {
                node.implicit
                    .iter()
                    .filter_map(|(name, src)| resolve(&values, *src).map(|a| (name.clone(), a)))
                    .collect()
            });
            let mut ctx = LowerCtx::for_node(
                args,
                constant_ids,
                Some(&self.caches),
                stream,
                &self.cpu,
                tracing,
                shapeless,
                scope.as_ref(),
            )
            .with_sources(node.inputs.iter().map(|src| format!("{src:?}")).collect(), Some(&memo))
            .with_outputs(
                node.outputs
                    .iter()
                    .map(|o| o.map_or_else(String::new, |v| format!("{:?}", Source::Value(v))))
                    .collect(),
                node.outputs.iter().map(|o| o.and_then(|v| readers.get(&v).cloned()).unwrap_or_default()).collect(),
            );
            let results =
                node.lowering.lower(&mut ctx, info).map_err(|e| e.at_node(&info.name, &info.qualified_op()))?;
            guards.extend(ctx.take_guards());
            for c in ctx.take_checks() {
                checks.push(Check { reason: Error::new(c.reason).at_node(&info.name, &info.qualified_op()).0, ..c });
            }
            for update in ctx.take_row_updates() {
                match self.row_update(node, update, stream).map_err(|e| e.at_node(&info.name, &info.qualified_op()))? {
                    Some(Resolved::Now(wb)) => write_backs.push(wb),
                    Some(Resolved::AfterEvaluation(pending)) => rows_at.push(pending),
                    None => {}
                }
            }
            if let (Some(t), Some(inputs)) = (tracer, described) {
                let args = serde_json::json!({
                    "op": info.qualified_op(), "inputs": inputs, "outputs": describe_all(&results),
                });
                t.record(info.name.clone(), "node", started, Instant::now(), args);
            }
            check_sizes(&results).map_err(|e| e.at_node(&info.name, &info.qualified_op()))?;
            if results.len() < node.outputs.iter().flatten().count() {
                return Err(Error::new(format!(
                    "lowering returned {} outputs for {}",
                    results.len(),
                    info.outputs.len()
                ))
                .at_node(&info.name, &info.qualified_op()));
            }
            for (slot, array) in node.outputs.iter().zip(results) {
                if let Some(slot) = slot {
                    values[*slot] = Some(array);
                }
            }
        }
        if let Part::Prologue(split) = part {
            if !(write_backs.is_empty() && rows_at.is_empty()) {
                return Err(Error::new("a node of the prologue updates an input in place"));
            }
            // Its guards and data checks are read here (a few elements), in one evaluation
            // with the boundary values: where one fails, the split graph does not serve this
            // run, told by no boundary values.
            let boundary = split
                .boundary
                .iter()
                .map(|&v| values[v].clone().ok_or_else(|| Error::new("a boundary value was not produced")));
            let outputs = boundary.collect::<Result<Vec<_>>>()?;
            let mut conds = Vec::with_capacity(guards.len() + checks.len());
            for c in guards.iter().chain(&checks) {
                conds.push(c.holds(stream)?);
            }
            let cond = if conds.is_empty() { None } else { Some(mlx::ops::concatenate(&conds, 0, stream)?) };
            if tracing {
                // Traced (the compiled prologue): the conditions travel as the flags, read by
                // the caller with the boundary values.
                return Ok(Built { outputs, write_backs, rows_at, flags: cond, meta: Flags::default() });
            }
            if let Some(cond) = cond {
                mlx::VectorArray::from_arrays(std::iter::once(&cond).chain(&outputs))?.eval()?;
                if !cond.to_vec::<bool>(stream)?.iter().all(|&ok| ok) {
                    return Ok(Built {
                        outputs: Vec::new(),
                        write_backs,
                        rows_at,
                        flags: None,
                        meta: Flags::default(),
                    });
                }
            }
            return Ok(Built { outputs, write_backs, rows_at, flags: None, meta: Flags::default() });
        }
        let mut results = Vec::with_capacity(self.outputs.len());
        for out in &self.outputs {
            let a = resolve(&values, out.source).ok_or_else(|| {
                Error::new(format!("partition {}: output '{}' was not produced", self.name, out.name))
            })?;
            // Not forced row-contiguous here (one more dispatched operation per output): the
            // copy-out copies evaluated row-contiguous arrays directly and makes the rare view
            // contiguous itself.
            results.push(mlx::ops::astype(&a, out.dtype, stream)?);
        }
        // The guard and the data checks travel as one int64 vector (one small read after the
        // evaluation tells both), built from reductions, reshapes and concatenations only: on
        // CUDA every distinct chain of elementwise operations MLX fuses is a kernel NVRTC
        // compiles on a machine's first run (seconds each), and the conditions are the same
        // in every model.
        // Boolean guards joined into one entry (first), range guards two entries each (an empty
        // range holds).
        let (mut joined, mut ranged, mut guard_ranges) = (Vec::new(), Vec::new(), Vec::new());
        for g in &guards {
            match (&g.what, g.bounds()) {
                (_, Some(bounds)) => {
                    ranged.extend(g.flag_values(stream)?);
                    guard_ranges.push(bounds);
                }
                (crate::lowering::Checked::All(cond), None) => {
                    joined.push(mlx::ops::reshape(&mlx::ops::astype(cond, Dtype::Bool, stream)?, &[-1], stream)?);
                }
                (crate::lowering::Checked::Range { .. }, None) => {}
            }
        }
        let guard = match joined.len() {
            0 => None,
            n => {
                let joined = if n == 1 { joined.remove(0) } else { mlx::ops::concatenate(&joined, 0, stream)? };
                let all = mlx::ops::all_axes(&joined, &[0], false, stream)?;
                Some(mlx::ops::reshape(&mlx::ops::astype(&all, Dtype::I64, stream)?, &[1], stream)?)
            }
        };
        let mut flags: Vec<Array> = guard.iter().cloned().chain(ranged).collect();
        let mut kinds = Vec::with_capacity(checks.len());
        for c in checks {
            flags.extend(c.flag_values(stream)?);
            kinds.push((c.bounds(), c.reason));
        }
        let flags = if flags.is_empty() { None } else { Some(mlx::ops::concatenate(&flags, 0, stream)?) };
        Ok(Built {
            outputs: results,
            write_backs,
            rows_at,
            flags,
            meta: Flags { guard: guard.is_some(), guard_ranges, checks: kinds },
        })
    }

    /// The identity of a constant input for the derived-constant cache: the address of its
    /// shared MLX copy (equal weights in two sessions are one copy).
    pub(super) fn constant_identity(&self, src: Source) -> Option<usize> {
        match src {
            Source::Constant(i) => Some(Arc::as_ptr(&self.constants[i].1) as usize),
            _ => None,
        }
    }

    /// The partition output a node output is, when it is one.
    pub(super) fn partition_output(&self, node: &PlanNode, output: usize) -> Option<String> {
        node.info
            .outputs
            .get(output)
            .cloned()
            .flatten()
            .map(|v| v.name)
            .filter(|name| self.outputs.iter().any(|o| o.name == *name))
    }

    /// Resolves a lowering's row update against the partition: `None` when the input is not a
    /// runtime input or the updated value not a partition output (no buffer could be shared:
    /// the output is copied whole); rows known now become a write-back, rows at data positions
    /// one resolved after the evaluation.
    pub(super) fn row_update(&self, node: &PlanNode, update: RowUpdate, stream: &Stream) -> Result<Option<Resolved>> {
        // Only a buffer ORT provides at run time can be shared with an output.
        let Some(Source::Input(input)) = node.inputs.get(update.input).copied() else {
            return Ok(None);
        };
        let Some(output) = self.partition_output(node, update.aliased_output) else {
            return Ok(None);
        };
        Ok(Some(match update.rows {
            ChangedRows::Known { updated, patches } => {
                let shape = updated.shape();
                let byte_ranges = row_byte_ranges(&shape, updated.dtype().size_in_bytes(), update.axis, &patches)?;
                let chunks = byte_ranges.into_iter().map(|r| (r.clone(), r.start)).collect();
                Resolved::Now(WriteBack { input, array: mlx::ops::contiguous(&updated, stream)?, chunks, output })
            }
            ChangedRows::At { rows, starts } => {
                Resolved::AfterEvaluation(PendingRows { input, rows, starts, axis: update.axis, output })
            }
        }))
    }
}

/// A row update resolved against the partition.
pub(super) enum Resolved {
    Now(WriteBack),
    AfterEvaluation(PendingRows),
}

/// A built graph: the partition's outputs, in-place input updates, and the flags: the
/// conjunction of the lowerings' guards (see [`LowerCtx::guard`]) and each data check (see
/// [`LowerCtx::check`]), as one boolean vector.
pub(super) struct Built {
    pub(super) outputs: Vec<Array>,
    pub(super) write_backs: Vec<WriteBack>,
    pub(super) rows_at: Vec<PendingRows>,
    pub(super) flags: Option<Array>,
    pub(super) meta: Flags,
}

/// What the entries of a built graph's int64 flag vector mean: the guard first when there is
/// one (0 or 1), then each data check's entries with the error it raises: one (0 or 1) for a
/// boolean check, two (the minimum and the maximum) for a range check with its bounds.
#[derive(Default, Clone, Debug)]
pub(super) struct Flags {
    pub(super) guard: bool,
    /// The range guards' bounds, two entries each after the boolean guard's.
    pub(super) guard_ranges: Vec<(i64, i64)>,
    pub(super) checks: Vec<(Option<(i64, i64)>, String)>,
}

impl Flags {
    pub(super) fn any(&self) -> bool {
        self.guard || !self.guard_ranges.is_empty() || !self.checks.is_empty()
    }

    /// Reads the evaluated flag vector: a guard miss (where `guarded`: an exact run has no use
    /// for its guard), the first failed check, or a valid run.
    pub(super) fn read(&self, flags: &Array, stream: &Stream, guarded: bool) -> Result<Verdict> {
        self.judge(&flags.to_vec::<i64>(stream)?, guarded)
    }

    /// How many entries the flag vector has.
    pub(super) fn count(&self) -> usize {
        self.guard as usize
            + 2 * self.guard_ranges.len()
            + self.checks.iter().map(|(b, _)| if b.is_some() { 2 } else { 1 }).sum::<usize>()
    }

    /// [`Self::read`] of flag values already on the host.
    pub(super) fn judge(&self, values: &[i64], guarded: bool) -> Result<Verdict> {
        if values.len() != self.count() {
            return Err(Error::new(format!("{} flags evaluated for {:?}", values.len(), self)));
        }
        let base = self.guard as usize;
        let ranges_hold = (self.guard_ranges.iter().enumerate())
            .all(|(k, &(lo, hi))| lo <= values[base + 2 * k] && values[base + 2 * k + 1] <= hi);
        let mut at = base + 2 * self.guard_ranges.len();
        if guarded && ((self.guard && values[0] == 0) || !ranges_hold) {
            return Ok(Verdict::GuardMiss);
        }
        for (bounds, reason) in &self.checks {
            let holds = match bounds {
                Some((lo, hi)) => {
                    at += 2;
                    *lo <= values[at - 2] && values[at - 1] <= *hi
                }
                None => {
                    at += 1;
                    values[at - 1] != 0
                }
            };
            if !holds {
                return Ok(Verdict::Invalid(Error::new(reason.clone())));
            }
        }
        Ok(Verdict::Valid)
    }
}

/// What a run's flags say.
pub(super) enum Verdict {
    Valid,
    /// A guard failed: the outputs are discarded and the run takes the exact path.
    GuardMiss,
    /// The input data is invalid for a node (an index out of range): the run fails with this.
    Invalid(Error),
}

/// Refuses node results larger than MLX's memory limit, before anything is allocated: such a
/// graph would fail in MLX's allocator, or take the host's memory, when evaluated.
pub(super) fn check_sizes(results: &[Array]) -> Result<()> {
    for (i, a) in results.iter().enumerate() {
        crate::lowering::check_shape(&a.shape(), a.dtype()).map_err(|e| Error::new(format!("output {i}: {e}")))?;
    }
    Ok(())
}

/// "dtype[shape]" of each input, for trace spans.
pub(super) fn describe(arrays: &[Option<Array>]) -> Vec<String> {
    arrays
        .iter()
        .map(|a| a.as_ref().map_or_else(|| "absent".to_owned(), |a| format!("{:?}{:?}", a.dtype(), a.shape())))
        .collect()
}

pub(super) fn describe_all(arrays: &[Array]) -> Vec<String> {
    arrays.iter().map(|a| format!("{:?}{:?}", a.dtype(), a.shape())).collect()
}

/// The value of a one-element float32/float64 constant that MLX's compiled kernels would
/// round (see [`mlx::ops::survives_kernel_source`]).
pub(super) fn inexact_in_kernels(a: &Array) -> Option<(f64, Dtype, Vec<i64>)> {
    if a.size() != 1 {
        return None;
    }
    let bytes = a.host_bytes()?;
    let v = match a.dtype() {
        Dtype::F32 => f64::from(f32::from_le_bytes(bytes.get(..4)?.try_into().ok()?)),
        Dtype::F64 => f64::from_le_bytes(bytes.get(..8)?.try_into().ok()?),
        _ => return None,
    };
    (!mlx::ops::survives_kernel_source(v, a.dtype())).then(|| (v, a.dtype(), a.shape()))
}
