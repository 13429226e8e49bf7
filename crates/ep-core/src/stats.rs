//! Per-session counters and timings, printed at session teardown when
//! `ONNXRUNTIME_EP_MLX_VERBOSE=1`.

use crate::trace::Tracer;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A phase of a partition run whose time is accumulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// ORT inputs to MLX arrays.
    CopyIn,
    /// Building the MLX graph node by node (eager runs, and traces).
    Translate,
    /// `mlx_compile` of a traced partition.
    Compile,
    /// The MLX evaluation of a run's outputs.
    Eval,
    /// MLX outputs into ORT's buffers.
    CopyOut,
}

impl Phase {
    const ALL: [Phase; 5] = [Phase::CopyIn, Phase::Translate, Phase::Compile, Phase::Eval, Phase::CopyOut];

    fn name(self) -> &'static str {
        match self {
            Phase::CopyIn => "copy-in",
            Phase::Translate => "translate",
            Phase::Compile => "compile",
            Phase::Eval => "eval",
            Phase::CopyOut => "copy-out",
        }
    }
}

/// Counters of one session (one `OrtEp`), shared by its partitions.
#[derive(Default)]
pub struct SessionStats {
    claim: Mutex<ClaimSummary>,
    /// Times a partition's lowerings built an MLX graph for a compiled closure.
    pub traces: AtomicU64,
    /// `mlx_compile` calls.
    pub compiles: AtomicU64,
    /// Runs served by an already compiled closure.
    pub replays: AtomicU64,
    /// Compiled runs attempted again because MLX loaded a JIT kernel library another process
    /// was still writing (see `exec::compiled::jit_retry`).
    pub jit_retries: AtomicU64,
    /// Runs that built and evaluated the MLX graph eagerly.
    pub eager_runs: AtomicU64,
    /// MLX evaluations (each run of a partition should make exactly one).
    pub evaluations: AtomicU64,
    /// Bytes copied from ORT's input buffers into MLX, and from MLX into ORT's outputs.
    pub copied_in_bytes: AtomicU64,
    /// Input bytes read in place (CPU device, no copy).
    pub borrowed_in_bytes: AtomicU64,
    /// Input bytes already in the EP's memory (a device value), read where they are.
    pub device_in_bytes: AtomicU64,
    /// Input bytes unchanged since the previous run, whose earlier copy was reused.
    pub reused_in_bytes: AtomicU64,
    pub copied_out_bytes: AtomicU64,
    /// Runs through the decode slot (one shapeless closure across growing KV lengths).
    pub decode_runs: AtomicU64,
    /// Decode-slot runs whose guard failed (rerun through the shape-keyed slot).
    pub decode_guard_misses: AtomicU64,
    /// Decode-slot runs of a split partition (a prologue, then a fixed-shape graph).
    pub split_runs: AtomicU64,
    /// Subgraphs (an If's branch, a loop body) run as compiled closures from eager runs, and
    /// how many of those were traces.
    pub subgraph_replays: AtomicU64,
    pub subgraph_traces: AtomicU64,
    /// Values computed from constants (transposes, casts, repacks), each once per session.
    pub derived_constants: AtomicU64,
    /// Derived values found in another session's cache (same weights) instead of computed.
    pub derived_constants_shared: AtomicU64,
    /// Bytes copied into outputs bound to the buffer of the input they update (changed rows).
    pub written_back_bytes: AtomicU64,
    /// Bytes of such outputs not copied because they were already in place.
    pub aliased_bytes_not_copied: AtomicU64,
    phase_ns: [AtomicU64; 5],
    fallbacks: Mutex<Vec<String>>,
    /// Per compiled closure (when verbose): what one application evaluates, counted on its
    /// first application.
    graphs: Mutex<Vec<GraphSize>>,
    /// Bare replays of compiled closures (what, median ms per run, runs).
    bare: Mutex<Vec<(String, f64, usize)>>,
    /// Whether the session prints its summary (and so counts graph sizes).
    pub verbose: bool,
    tracer: Option<Tracer>,
}

/// The graph one compiled closure hands MLX per run, as MLX's `export_to_dot` draws it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphSize {
    /// Which partition and slot.
    pub what: String,
    /// Primitives to run (the fused kernels of `mlx_compile` count one each).
    pub primitives: usize,
    /// Of those, fused elementwise kernels.
    pub fused: usize,
    /// Primitives by name, most frequent first.
    pub by_name: Vec<(String, usize)>,
}

impl GraphSize {
    /// Counts the primitive nodes of a Graphviz text from MLX's `export_to_dot` (a node line
    /// carries a `label`; inputs and constants are drawn as boxes without a primitive).
    pub fn from_dot(what: impl Into<String>, dot: &str) -> GraphSize {
        let mut by_name: std::collections::BTreeMap<String, usize> = Default::default();
        for line in dot.lines() {
            let Some(at) = line.find("label =\"").or_else(|| line.find("label=\"")) else { continue };
            if line.contains("shape=box") || line.contains("shape = box") {
                continue;
            }
            let rest = &line[at..];
            let start = rest.find('"').map_or(0, |i| i + 1);
            let label: String = rest[start..].chars().take_while(|&c| c != '"').collect();
            *by_name.entry(label).or_default() += 1;
        }
        let primitives = by_name.values().sum();
        let fused = by_name.iter().filter(|(n, _)| n.starts_with("Compiled")).map(|(_, c)| c).sum();
        let mut by_name: Vec<(String, usize)> = by_name.into_iter().collect();
        by_name.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        GraphSize { what: what.into(), primitives, fused, by_name }
    }
}

/// With verbose on and `ONNXRUNTIME_EP_MLX_GRAPH_DIR` set (a debugging aid, read per graph),
/// each compiled closure's graph is also written there as Graphviz text, one file per
/// closure (`graph-N.dot`, numbered in the order they were first applied, the closure named
/// in the first line), for reading which primitives a run hands MLX.
pub fn keep_graph(what: &str, dot: &str) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let Some(dir) = std::env::var_os(crate::options::GRAPH_DIR.env).filter(|d| !d.is_empty()) else { return };
    let dir = std::path::PathBuf::from(dir);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let text = format!("// {what}\n{dot}");
    if let Err(e) =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join(format!("graph-{n}.dot")), text))
    {
        eprintln!("[MLXExecutionProvider] could not keep the graph of {what} in {}: {e}", dir.display());
    }
}

#[derive(Default, Clone)]
struct ClaimSummary {
    nodes_total: usize,
    nodes_claimed: usize,
    partition_sizes: Vec<usize>,
    ops: BTreeMap<String, usize>,
}

/// Times one phase of a partition run; on drop adds the time to the session's totals and, when
/// tracing, records a span.
pub struct PhaseTimer<'a> {
    stats: &'a SessionStats,
    phase: Phase,
    partition: &'a str,
    start: Instant,
}

impl Drop for PhaseTimer<'_> {
    fn drop(&mut self) {
        let end = Instant::now();
        self.stats.add_time(self.phase, end - self.start);
        if let Some(t) = &self.stats.tracer {
            t.record(self.phase.name(), "phase", self.start, end, serde_json::json!({ "partition": self.partition }));
        }
    }
}

/// A named span inside a partition run (a part of a phase, or of the work between phases),
/// recorded in the trace only (category "step"); nothing is timed without a tracer.
pub struct Span<'a> {
    tracer: Option<&'a Tracer>,
    name: &'static str,
    start: Option<Instant>,
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        if let (Some(t), Some(start)) = (self.tracer, self.start) {
            t.record(self.name, "step", start, Instant::now(), serde_json::Value::Null);
        }
    }
}

impl SessionStats {
    /// Starts a span named `name` (see [`Span`]).
    pub fn span(&self, name: &'static str) -> Span<'_> {
        let tracer = self.tracer.as_ref();
        Span { tracer, name, start: tracer.map(|_| Instant::now()) }
    }

    /// Statistics that also record a Chrome trace.
    pub fn with_tracer(tracer: Option<Tracer>) -> SessionStats {
        SessionStats { tracer, ..SessionStats::default() }
    }

    /// A session's statistics; `verbose` also counts each compiled closure's graph.
    pub fn new(tracer: Option<Tracer>, verbose: bool) -> SessionStats {
        SessionStats { tracer, verbose, ..SessionStats::default() }
    }

    pub fn tracer(&self) -> Option<&Tracer> {
        self.tracer.as_ref()
    }

    /// Starts timing `phase` of `partition`.
    pub fn phase<'a>(&'a self, phase: Phase, partition: &'a str) -> PhaseTimer<'a> {
        PhaseTimer { stats: self, phase, partition, start: Instant::now() }
    }

    /// Writes the trace, if one is being recorded.
    pub fn finish(&self) {
        if let Some(t) = &self.tracer
            && let Err(e) = t.write()
        {
            eprintln!("[{}] could not write the trace {}: {e}", crate::EP_NAME, t.path().display());
        }
    }

    /// Records one `GetCapability` result (ORT may call it for several graphs).
    pub fn record_claims(&self, nodes_total: usize, claimed_ops: &[String], partition_sizes: &[usize]) {
        let mut c = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        c.nodes_total += nodes_total;
        c.nodes_claimed += claimed_ops.len();
        c.partition_sizes.extend_from_slice(partition_sizes);
        for op in claimed_ops {
            *c.ops.entry(op.clone()).or_default() += 1;
        }
    }

    pub fn add_time(&self, phase: Phase, d: Duration) {
        self.phase_ns[phase as usize].fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Notes why a partition runs eagerly instead of compiled.
    pub fn record_fallback(&self, reason: String) {
        self.fallbacks.lock().unwrap_or_else(|p| p.into_inner()).push(reason);
    }

    /// Records the size of a compiled closure's graph.
    pub fn record_graph(&self, g: GraphSize) {
        self.graphs.lock().unwrap_or_else(|p| p.into_inner()).push(g);
    }

    /// Records the median time of `runs` bare replays of one compiled closure.
    pub fn record_bare(&self, what: String, median_ms: f64, runs: usize) {
        self.bare.lock().unwrap_or_else(|p| p.into_inner()).push((what, median_ms, runs));
    }

    pub fn graphs(&self) -> Vec<GraphSize> {
        self.graphs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn count(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub fn time(&self, phase: Phase) -> Duration {
        Duration::from_nanos(self.phase_ns[phase as usize].load(Ordering::Relaxed))
    }

    /// The human-readable session summary.
    pub fn summary(&self) -> String {
        let c = self.claim.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut s = String::new();
        let _ = writeln!(s, "[{}] session summary", crate::EP_NAME);
        let _ = writeln!(s, "  nodes claimed: {} of {}", c.nodes_claimed, c.nodes_total);
        let _ = writeln!(s, "  partitions: {} of sizes {:?}", c.partition_sizes.len(), c.partition_sizes);
        let ops: Vec<String> = c.ops.iter().map(|(op, n)| format!("{op} x{n}")).collect();
        let _ = writeln!(s, "  claimed ops: {}", ops.join(", "));
        let _ = writeln!(
            s,
            "  runs: {} compiled replays, {} eager; {} traces, {} compiles; {} in the decode slot ({} guard misses)",
            Self::count(&self.replays),
            Self::count(&self.eager_runs),
            Self::count(&self.traces),
            Self::count(&self.compiles),
            Self::count(&self.decode_runs),
            Self::count(&self.decode_guard_misses)
        );
        if Self::count(&self.split_runs) > 0 {
            let _ = writeln!(
                s,
                "  decode slot split: {} runs as a prologue (the growing inputs' nodes, compiled shapeless) and a fixed-shape graph",
                Self::count(&self.split_runs)
            );
        }
        if Self::count(&self.subgraph_replays) + Self::count(&self.subgraph_traces) > 0 {
            let _ = writeln!(
                s,
                "  subgraphs compiled apart: {} replays, {} traces (branches and bodies run from eager runs)",
                Self::count(&self.subgraph_replays),
                Self::count(&self.subgraph_traces)
            );
        }
        if Self::count(&self.jit_retries) > 0 {
            let _ = writeln!(
                s,
                "  retried: {} attempts found a JIT kernel library another process was still writing",
                Self::count(&self.jit_retries)
            );
        }
        let _ = writeln!(
            s,
            "  evaluations: {}; bytes copied in: {}, out: {} (inputs read in place: {} bytes; in the EP's memory: {} bytes; unchanged, not copied again: {} bytes)",
            Self::count(&self.evaluations),
            Self::count(&self.copied_in_bytes),
            Self::count(&self.copied_out_bytes),
            Self::count(&self.borrowed_in_bytes),
            Self::count(&self.device_in_bytes),
            Self::count(&self.reused_in_bytes)
        );
        let _ = writeln!(
            s,
            "  derived constants computed: {} (shared from another session: {})",
            Self::count(&self.derived_constants),
            Self::count(&self.derived_constants_shared)
        );
        let _ = writeln!(
            s,
            "  in-place outputs: {} bytes of changed rows written, {} bytes already in place",
            Self::count(&self.written_back_bytes),
            Self::count(&self.aliased_bytes_not_copied)
        );
        let shared = crate::shared::SharedConstants::global();
        let _ = writeln!(
            s,
            "  constants (process-wide): {} uploaded, {} shared ({} bytes not copied again)",
            Self::count(&shared.uploads),
            Self::count(&shared.reuses),
            Self::count(&shared.bytes_saved)
        );
        if let Some(memory) = crate::ort_abi::device::allocation_summary() {
            let _ = writeln!(s, "  {memory}");
        }
        let phases: Vec<String> =
            Phase::ALL.iter().map(|&p| format!("{} {:.3} ms", p.name(), self.time(p).as_secs_f64() * 1e3)).collect();
        let _ = writeln!(s, "  time: {}", phases.join(", "));
        for g in self.graphs() {
            let top: Vec<String> = g.by_name.iter().take(40).map(|(n, c)| format!("{n} x{c}")).collect();
            let _ = writeln!(
                s,
                "  graph per run, {}: {} primitives ({} fused kernels): {}",
                g.what,
                g.primitives,
                g.fused,
                top.join(", ")
            );
        }
        for (what, ms, runs) in self.bare.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(s, "  bare compiled graph, {what}: {ms:.3} ms per run (median of {runs} replays)");
        }
        for f in self.fallbacks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(s, "  eager fallback: {f}");
        }
        s
    }
}
