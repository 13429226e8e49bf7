//! The compiled paths: a partition traced into an `mlx_compile`d closure (per input-shape
//! key, or shapeless), kept in a bounded cache, and applied with everything it returns
//! evaluated at once.

use super::translate::{Flags, Part, Split, TraceMode, Translation, Verdict};
use super::write_back::PendingRows;
use super::{COMPILED_CACHE_CAPACITY, Mode, Plan, RunOutputs};
use crate::mlx::{Array, Closure, Dtype, MlxError, Stream, VectorArray, ops};
use crate::stats::{Phase, SessionStats};
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How a compiled run ended.
pub(super) enum Applied {
    Ran(RunOutputs),
    GuardMiss,
    Invalid(Error),
}

/// Runs `attempt` again while it fails because MLX found a compiled kernel's shared library
/// half written: MLX 0.32.2 compiles CPU kernels into a cache shared by every process of the
/// machine, writing the library in place, so a second process that needs the same kernel at
/// the same moment can load a file still being written. The writer finishes within seconds;
/// without the retry the partition would fall back to eager runs for good.
/// The run's counters move only once an attempt has evaluated, so a retried run counts once.
pub(super) fn jit_retry<T>(stats: &SessionStats, mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    const WAIT: std::time::Duration = std::time::Duration::from_millis(100);
    let mut tries = 0;
    loop {
        match attempt() {
            Err(e) if e.0.contains("Could not load C++ shared library") && tries < 300 => {
                tries += 1;
                stats.jit_retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(WAIT);
            }
            other => return other,
        }
    }
}

/// What a compiled closure is specialised to: each input's dtype and shape (its rank alone
/// for shapeless closures).
pub(super) type InputKey = Vec<(Dtype, Vec<i64>)>;

/// Compiled closures by input key, at most the capacity (by default
/// [`COMPILED_CACHE_CAPACITY`]; the `compiled_cache` option), least recently used
/// first (the one bounded cache of compiled closures, for the general and the decode slot).
pub(super) struct CompiledCache {
    entries: VecDeque<(InputKey, Traced)>,
    capacity: usize,
}

impl Default for CompiledCache {
    fn default() -> Self {
        CompiledCache { entries: VecDeque::new(), capacity: COMPILED_CACHE_CAPACITY }
    }
}

impl CompiledCache {
    /// The closure for `key`, compiling it on a miss (evicting the least recently used entry
    /// when full).
    pub(super) fn get_or_compile(&mut self, key: InputKey, compile: impl FnOnce() -> Result<Traced>) -> Result<Traced> {
        if let Some(i) = self.entries.iter().position(|(k, _)| *k == key) {
            let entry = self.entries.remove(i).expect("index from position");
            let traced = entry.1.clone();
            self.entries.push_back(entry);
            return Ok(traced);
        }
        let traced = compile()?;
        while self.entries.len() >= self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back((key, traced.clone()));
        Ok(traced)
    }

    /// Keeps at most `capacity` closures (at least one), dropping the oldest beyond it.
    pub(super) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
        }
    }

    /// Whether a closure for `key` is cached.
    pub(super) fn contains(&self, key: &InputKey) -> bool {
        self.entries.iter().any(|(k, _)| k == key)
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What a trace returns beyond the partition's outputs (rows to write at data positions, a
/// guard), recorded when the closure is traced.
#[derive(Default, Clone)]
pub(super) struct TraceMeta {
    pub(super) rows_at: Vec<(usize, usize, String)>,
    /// Per entry of `rows_at`, the packed array its rows are in (see [`pack_rows`]); and
    /// how many packed arrays there are.
    pub(super) row_groups: Vec<usize>,
    pub(super) groups: usize,
    pub(super) flags: Flags,
}

/// A compiled closure and what its trace recorded (`None` until MLX has traced it, on the
/// first application: so whether an application traced is known from the record).
#[derive(Clone)]
pub(super) struct Traced {
    pub(super) closure: Arc<Closure>,
    pub(super) meta: Arc<Mutex<Option<Arc<TraceMeta>>>>,
    /// Replays so far (for the bare-replay measurement at the 8th).
    replays: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether it is a split decode slot's fixed-shape graph, which every decode step replays
    /// (see [`crate::mlx::device::Fusion`]).
    decode: bool,
}

/// The replay at which a closure's bare replays are timed (past warm-up).
const BARE_AT_REPLAY: usize = 8;

impl Traced {
    /// Traces `translation` into a closure compiled shapeless or per shape.
    pub(super) fn compile(
        translation: &Arc<Translation>,
        stats: &Arc<SessionStats>,
        mode: TraceMode,
    ) -> Result<Traced> {
        Self::compile_part(translation, stats, mode, None, false)
    }

    /// [`Self::compile`] of the graph part of a split partition (`split`: the closure takes
    /// the runtime inputs, then the boundary values), for a decode step's graph or not.
    pub(super) fn compile_part(
        translation: &Arc<Translation>,
        stats: &Arc<SessionStats>,
        mode: TraceMode,
        split: Option<Arc<Split>>,
        decode: bool,
    ) -> Result<Traced> {
        let meta: Arc<Mutex<Option<Arc<TraceMeta>>>> = Arc::default();
        let (t, st, m) = (Arc::clone(translation), Arc::clone(stats), Arc::clone(&meta));
        let traced = Closure::new(move |args: &[Array]| {
            st.traces.fetch_add(1, Ordering::Relaxed);
            let stream = Stream::default_device()?;
            let part = split.as_deref().map_or(Part::Whole, Part::Main);
            let built = t.build_part(args.to_vec(), &stream, mode, part).map_err(|e| MlxError(e.0))?;
            let (row_groups, packed) = pack_rows(&built.rows_at, &stream).map_err(|e| MlxError(e.0))?;
            *m.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(TraceMeta {
                rows_at: built.rows_at.iter().map(|p| (p.input, p.axis, p.output.clone())).collect(),
                groups: packed.len() - usize::from(!built.rows_at.is_empty()),
                row_groups,
                flags: built.meta,
            }));
            let mut outputs = built.outputs;
            outputs.extend(built.rows_at.into_iter().map(|p| p.rows));
            let mut packed = packed;
            match (packed.pop(), built.flags) {
                // The flags ride at the end of the packed starts: one host read for both.
                (Some(starts), Some(flags)) => {
                    let starts = ops::astype(&starts, Dtype::I64, &stream)?;
                    packed.push(ops::concatenate(&[starts, flags], 0, &stream)?);
                    outputs.extend(packed);
                }
                (starts, flags) => {
                    outputs.extend(packed);
                    outputs.extend(starts);
                    outputs.extend(flags);
                }
            }
            Ok(outputs)
        });
        let compiled = {
            let _timer = stats.phase(Phase::Compile, &translation.name);
            traced.compile(mode == TraceMode::Shapeless)?
        };
        stats.compiles.fetch_add(1, Ordering::Relaxed);
        Ok(Traced { closure: Arc::new(compiled), meta, replays: Arc::default(), decode })
    }
}

/// The rows of a run's in-place updates at data positions, packed for the host: every
/// update's rows flattened into one array per dtype, and every update's starts into one int32
/// array (last). On CUDA each array read on the host moves to unified memory with a
/// transfer and a wait of its own, so a decode step writing two rows per layer reads two
/// arrays instead of two per layer. Returns each update's packed array and the arrays.
fn pack_rows(rows_at: &[PendingRows], s: &Stream) -> Result<(Vec<usize>, Vec<Array>)> {
    if rows_at.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut dtypes: Vec<Dtype> = Vec::new();
    let mut members: Vec<Vec<Array>> = Vec::new();
    let mut group_of = Vec::with_capacity(rows_at.len());
    for p in rows_at {
        let d = p.rows.dtype();
        let g = dtypes.iter().position(|&x| x == d).unwrap_or_else(|| {
            dtypes.push(d);
            members.push(Vec::new());
            dtypes.len() - 1
        });
        group_of.push(g);
        // (The packed bytes are read on the host: `cat` below lays them out. `write_rows_at`
        // made the starts `[B]` int32.)
        members[g].push(ops::flatten(&p.rows, s)?);
    }
    // (Concatenation lays its result out; one member alone is made contiguous, as a
    // flattened view may still be strided.)
    let cat = |parts: &[Array]| -> Result<Array> {
        Ok(if parts.len() == 1 { ops::contiguous(&parts[0], s)? } else { ops::concatenate(parts, 0, s)? })
    };
    let mut packed: Vec<Array> = members.iter().map(|m| cat(m)).collect::<Result<_>>()?;
    let starts: Vec<Array> = rows_at.iter().map(|p| p.starts.clone()).collect();
    packed.push(cat(&starts)?);
    Ok((group_of, packed))
}

impl Plan {
    /// Replays `traced` `runs` times on `inputs` (already MLX arrays), each application
    /// evaluated, and records the median per run: the compiled graph alone, without ORT, the
    /// copies in and out or the EP's bookkeeping.
    fn time_bare_replays(&self, traced: &Traced, inputs: &[Array], runs: usize) -> Result<()> {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let started = Instant::now();
            let outputs = traced.closure.apply(inputs).map_err(Error::from)?;
            VectorArray::from_arrays(&outputs)?.eval()?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let what = format!("{} ({} inputs)", self.translation.name, inputs.len());
        self.stats.record_bare(what, times[times.len() / 2], runs);
        Ok(())
    }

    /// Runs a compiled closure for `inputs`. A shape-keyed partition has one per input-shape
    /// key. A shapeless one compiles its first shape exactly, and a shapeless closure only
    /// once a second shape of the same ranks comes: inside a shapeless trace MLX adds a
    /// broadcast of every operand of every binary operation (two primitives more per
    /// operation, each with host work on every run), which a model run at one shape never
    /// needs.
    pub(super) fn run_compiled(&self, inputs: &[Array], mode: &Mode) -> Result<Applied> {
        let exact = super::exact_key(inputs);
        let (key, mode) = if *mode == Mode::Shapeless {
            // A shapeless trace bakes in which dims broadcast (size 1): its key keeps, per
            // dim, whether it is 1, so `[n, 1] * [1, m]` and `[n, m] * [n, m]` get their own
            // traces while a growing sequence length (2, 3, 4, ...) replays one. (A loose key
            // equals an exact one only when every dim is 1: the same shapes.)
            let loose: InputKey = exact
                .iter()
                .map(|(d, shape)| (*d, shape.iter().map(|&n| if n == 1 { 1 } else { -1 }).collect()))
                .collect();
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.contains(&exact) {
                (exact, TraceMode::Keyed)
            } else if cache.contains(&loose)
                || !self.exact_first.lock().unwrap_or_else(|p| p.into_inner()).insert(loose.clone())
            {
                (loose, TraceMode::Shapeless)
            } else {
                (exact, TraceMode::Keyed)
            }
        } else {
            (exact, TraceMode::Keyed)
        };
        let traced = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_compile(key, || Traced::compile(&self.translation, &self.stats, mode))?;
        self.apply(&traced, inputs, None)
    }

    /// Applies a compiled closure and evaluates everything it returns in one evaluation: the
    /// outputs, the rows to write at data positions, the flags (guard and data checks), and
    /// `also` (the split prologue's own flags, read by the caller).
    pub(super) fn apply(&self, traced: &Traced, inputs: &[Array], also: Option<&Array>) -> Result<Applied> {
        let fresh = traced.meta.lock().unwrap_or_else(|p| p.into_inner()).is_none();
        let started = Instant::now();
        let mut outputs = if fresh {
            use crate::mlx::device::{Fusion, traced_with_fusion};
            let fused = match self.fusion {
                Fusion::All => true,
                Fusion::Off => false,
                Fusion::DecodeSteps => traced.decode,
            };
            if fused && traced.decode {
                crate::mlx::device::note_fused_compile();
            }
            traced_with_fusion(fused, || traced.closure.apply(inputs))?
        } else {
            let _span = self.stats.span("apply");
            traced.closure.apply(inputs)
        }
        .map_err(Error::from)?;
        if fresh {
            self.stats.add_time(Phase::Translate, started.elapsed());
            if self.stats.verbose {
                // What each later replay hands MLX: the compiled tape behind the outputs.
                let what = format!("{} ({} inputs)", self.translation.name, inputs.len());
                let dot = VectorArray::from_arrays(&outputs)?.graph_dot()?;
                crate::stats::keep_graph(&what, &dot);
                self.stats.record_graph(crate::stats::GraphSize::from_dot(what, &dot));
            }
        }
        // (Recorded by the trace, which ran in the apply above when fresh.)
        let meta = traced.meta.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        let meta = meta.as_ref();
        let n = self.translation.outputs.len();
        // An output the last run wrote in place as rows needs only its rows (evaluated below
        // as extras): left out, MLX skips the work that only it needs.
        let as_rows = |i: usize| {
            i < n && self.was_in_place(i) && meta.rows_at.iter().any(|(_, _, o)| *o == self.translation.outputs[i].name)
        };
        self.evaluate(outputs.iter().enumerate().filter(|(i, _)| !as_rows(*i)).map(|(_, a)| a).chain(also))?;
        // Counted once evaluated: an attempt `jit_retry` repeats is not a second run.
        if !fresh {
            self.stats.replays.fetch_add(1, Ordering::Relaxed);
        }
        if !fresh && traced.replays.fetch_add(1, Ordering::Relaxed) + 1 == BARE_AT_REPLAY && self.stats.verbose {
            let runs = crate::options::BARE_REPLAYS.env_count();
            if runs > 0 {
                self.time_bare_replays(traced, inputs, runs)?;
            }
        }
        let updates = meta.rows_at.len();
        let extras = updates + meta.groups + usize::from(updates > 0);
        // With updates, the flags are the last entries of the packed starts (see `compile`).
        let folded = updates > 0 && meta.flags.any();
        if outputs.len() != n + extras + (meta.flags.any() && !folded) as usize {
            return Err(Error::new(format!("a compiled closure returned {} arrays for {n} outputs", outputs.len())));
        }
        if meta.flags.any() && !folded {
            let flags = outputs.pop().expect("counted above");
            match meta.flags.read(&flags, &self.stream, true)? {
                Verdict::Valid => {}
                Verdict::GuardMiss => return Ok(Applied::GuardMiss),
                Verdict::Invalid(e) => return Ok(Applied::Invalid(e)),
            }
        }
        let mut extra = outputs.split_off(n);
        let mut write_backs = Vec::with_capacity(updates);
        if updates > 0 {
            let _span = self.stats.span("rows");
            let starts_all = extra.pop().expect("counted above");
            let groups = extra.split_off(updates);
            // One read of every start (and flag), one host pointer per packed array (see
            // `pack_rows`).
            let starts: Vec<i32> = if folded {
                // The starts widened to int64 to ride with the flags (see `compile`).
                let mut all = starts_all.to_vec::<i64>(&Stream::cpu()?)?;
                let at = all.len().checked_sub(meta.flags.count()).ok_or_else(|| Error::new("flags missing"))?;
                let flags = all.split_off(at);
                match meta.flags.judge(&flags, true)? {
                    Verdict::Valid => {}
                    Verdict::GuardMiss => return Ok(Applied::GuardMiss),
                    Verdict::Invalid(e) => return Ok(Applied::Invalid(e)),
                }
                all.into_iter().map(|v| v as i32).collect()
            } else {
                starts_all.to_vec::<i32>(&Stream::cpu()?)?
            };
            let (mut at, mut offsets) = (0usize, vec![0usize; groups.len()]);
            for ((&(input, axis, ref output), rows), &g) in meta.rows_at.iter().zip(extra).zip(&meta.row_groups) {
                let shape = inputs.get(input).map(Array::shape).unwrap_or_default();
                let b = rows.shape().first().map_or(0, |&d| d as usize);
                let taken = starts.get(at..at + b).ok_or_else(|| Error::new("the packed starts are too short"))?;
                let bytes = rows.size() * rows.dtype().size_in_bytes();
                let pending = PendingRows { input, rows, starts: starts_all.clone(), axis, output: output.clone() };
                write_backs.push(pending.resolve_in(&shape, taken, &groups[g], offsets[g])?);
                offsets[g] += bytes;
                at += b;
            }
        }
        Ok(Applied::Ran(RunOutputs { outputs, write_backs }))
    }
}
