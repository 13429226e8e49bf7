//! The property suite: every registered spec, `cases` generated cases each, per-op and
//! per-dtype counts, shrinking and saving of failures.

use crate::{Case, DType, Outcome, check, model};
use conformance_spec::OpSpec;
use mlx_ep_host::{Ep, Result, session_builder};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Ops whose lowerings take subgraph or tensor attributes, which ORT's Model Editor cannot
/// build, or that ORT's CPU EP cannot serve as the reference of: they are checked by
/// `python/check_plugin.py`, `python/check_control_flow.py`, `python/check_tree_ensemble.py`
/// and `python/check_sparse_attention.py` (a numpy reference: ORT's kernel needs present bound
/// to past's buffer) instead (and the suite verifies they are there).
pub const CHECKED_IN_PYTHON: &[&str] = &["If", "Loop", "Scan", "TreeEnsemble", "SparseAttention"];

/// The multi-node chains, reported as the op `chain` (not a lowering, so outside the coverage
/// check).
static CHAINS: OpSpec = OpSpec { key: || ("", "chain"), cases: crate::chains::strategy, file: file!() };
static QUANT_CHAIN: OpSpec =
    OpSpec { key: || ("", "chain:dynamic-quant-matmul"), cases: crate::chains::dynamic_quant_matmul, file: file!() };
static EXACT_CONSTANT_CHAIN: OpSpec =
    OpSpec { key: || ("", "chain:exact-scalar-constant"), cases: crate::chains::exact_scalar_constant, file: file!() };

pub struct Options {
    /// Cases per spec.
    pub cases: u32,
    /// Only specs of these ops (case-sensitive op types, comma-separated).
    pub op: Option<String>,
    /// Seed of the case generators (the same seed draws the same cases).
    pub seed: u64,
    /// Where shrunk failures are saved (`None`: not saved).
    pub failures_dir: Option<PathBuf>,
    /// Most shrink steps per failure.
    pub max_shrink_steps: u32,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
    /// Print a line per spec as it ends, and its failure (a run cut short by a time limit
    /// still tells how far it got and what failed).
    pub log: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cases: 12,
            op: None,
            seed: 0x6d6c_785f_6570,
            failures_dir: Some(default_failures_dir()),
            max_shrink_steps: 64,
            progress: false,
            log: false,
        }
    }
}

/// `target/conformance/failures` of this workspace.
pub fn default_failures_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().and_then(Path::parent).unwrap_or(Path::new("."));
    workspace.join("target/conformance/failures")
}

/// One row of the report: an op at one dtype.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    pub op: String,
    pub domain: String,
    pub dtype: String,
    pub cases: u32,
    pub passed: u32,
    pub declined: u32,
    pub failed: u32,
    pub max_abs_err: f64,
    pub max_rel_err: f64,
}

/// A shrunk failing case.
#[derive(Debug, Clone)]
pub struct Failure {
    pub op: String,
    pub case: Case,
    pub outcome: Outcome,
    /// Where it was saved, with the command that replays it.
    pub saved: Option<(PathBuf, String)>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub failures: Vec<Failure>,
    /// Registered lowerings (`domain:op`) that have no spec.
    pub missing_specs: Vec<String>,
    /// Specs whose op has no registered lowering.
    pub orphan_specs: Vec<String>,
    pub seconds: f64,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.failures.is_empty() && self.missing_specs.is_empty() && self.orphan_specs.is_empty()
    }

    /// The rows as the `property` list of the JSON report.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(&self.rows).expect("rows serialize")
    }

    /// A fixed-width table, one line per op and dtype, then the failures.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<28} {:<8} {:>6} {:>6} {:>8} {:>6} {:>10} {:>10}\n",
            "op", "dtype", "cases", "passed", "declined", "failed", "max abs", "max rel"
        );
        for r in &self.rows {
            let op = if r.domain.is_empty() { r.op.clone() } else { format!("{}:{}", r.domain, r.op) };
            s += &format!(
                "{:<28} {:<8} {:>6} {:>6} {:>8} {:>6} {:>10.2e} {:>10.2e}\n",
                op, r.dtype, r.cases, r.passed, r.declined, r.failed, r.max_abs_err, r.max_rel_err
            );
        }
        for name in &self.missing_specs {
            s += &format!("MISSING SPEC: the lowering {name} has no conformance spec (register one next to it)\n");
        }
        for name in &self.orphan_specs {
            s += &format!("ORPHAN SPEC: {name} has a spec but no registered lowering\n");
        }
        for f in &self.failures {
            s += &format!("FAILED {}: {}\n  case: {}\n", f.op, describe(&f.outcome), f.case.label());
            if let Some((dir, cmd)) = &f.saved {
                s += &format!("  saved: {}\n  replay: {cmd}\n", dir.display());
            }
        }
        let total: u32 = self.rows.iter().map(|r| r.cases).sum();
        let passed: u32 = self.rows.iter().map(|r| r.passed).sum();
        s += &format!(
            "property suite: {} ops, {total} cases, {passed} passed, {} failing ops, {} missing specs ({:.1} s)\n",
            self.rows.iter().map(|r| (&r.domain, &r.op)).collect::<BTreeSet<_>>().len(),
            self.failures.len(),
            self.missing_specs.len(),
            self.seconds
        );
        s
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Passed { .. } => "passed".into(),
        Outcome::Declined(r) => format!("declined: {r}"),
        Outcome::Failed(r) => format!("mismatch: {r}"),
        Outcome::Invalid(r) => format!("invalid case (spec defect): {r}"),
    }
}

/// `(domain, op)` of every registered lowering, from the linked op crates' registry.
pub fn registered_ops() -> BTreeSet<(String, String)> {
    ep_core::registry::LOWERINGS.iter().map(|l| (l.domain().to_owned(), l.op_type().to_owned())).collect()
}

/// Every registered spec, then the multi-node chains.
pub fn specs_and_chains() -> Vec<&'static OpSpec> {
    conformance_spec::specs().into_iter().chain([&CHAINS, &QUANT_CHAIN, &EXACT_CONSTANT_CHAIN]).collect()
}

/// Runs the suite.
pub fn run(opts: &Options) -> Report {
    let started = Instant::now();
    let mut report = Report::default();
    let specs: Vec<&'static OpSpec> = specs_and_chains()
        .into_iter()
        .filter(|s| opts.op.as_deref().is_none_or(|ops| ops.split(',').any(|op| op == s.op())))
        .collect();
    let spec_keys: BTreeSet<(String, String)> =
        conformance_spec::specs().iter().map(|s| (s.domain().to_owned(), s.op().to_owned())).collect();
    (report.missing_specs, report.orphan_specs) = spec_coverage(&registered_ops(), &spec_keys);
    let bar = if opts.progress {
        indicatif::ProgressBar::new(specs.len() as u64 * opts.cases as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} cases  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let gpu = ep_core::mlx::default_device_is_gpu();
    for spec in specs {
        bar.set_message(display_name(spec.domain(), spec.op()));
        let spec_started = Instant::now();
        let failures_before = report.failures.len();
        let mut rows: BTreeMap<DType, Row> = BTreeMap::new();
        let mut runner = TestRunner::new_with_rng(
            Config { cases: opts.cases, failure_persistence: None, ..Config::default() },
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(opts.seed, spec.domain(), spec.op())),
        );
        let strategy = (spec.cases)();
        let mut failed_once = false;
        for _ in 0..opts.cases {
            bar.inc(1);
            // A spec whose strategy panics is a defect of that spec: reported under its op.
            let drawn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| strategy.new_tree(&mut runner)));
            let mut tree = match drawn {
                Ok(Ok(tree)) => tree,
                Ok(Err(_)) => continue,
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                    report.failures.push(Failure {
                        op: display_name(spec.domain(), spec.op()),
                        case: Case::op(spec.op(), 0),
                        outcome: Outcome::Invalid(format!("the spec's strategy panicked: {}", msg.unwrap_or_default())),
                        saved: None,
                    });
                    break;
                }
            };
            let case = tree.current();
            let outcome = check(&case);
            let row = rows.entry(case.dtype()).or_insert_with(|| Row {
                op: spec.op().to_owned(),
                domain: spec.domain().to_owned(),
                dtype: case.dtype().onnx_name().to_owned(),
                ..Row::default()
            });
            row.cases += 1;
            match &outcome {
                Outcome::Passed { max_abs, max_rel } => {
                    row.passed += 1;
                    row.max_abs_err = row.max_abs_err.max(*max_abs);
                    row.max_rel_err = row.max_rel_err.max(*max_rel);
                }
                Outcome::Declined(_) => row.declined += 1,
                Outcome::Failed(_) | Outcome::Invalid(_) => row.failed += 1,
            }
            // On a GPU device the EP leaves float64 to the CPU EP by design: such a decline is
            // counted, not failed.
            let expected_decline = matches!(outcome, Outcome::Declined(_)) && gpu && case_has_f64(&case);
            if !outcome.is_pass() && !expected_decline && !failed_once {
                failed_once = true;
                let (case, outcome) = shrink(&mut tree, case, outcome, opts.max_shrink_steps);
                let saved = opts.failures_dir.as_deref().and_then(|d| save(d, spec, &case, &outcome).ok());
                report.failures.push(Failure { op: display_name(spec.domain(), spec.op()), case, outcome, saved });
            }
        }
        if opts.log {
            let (cases, passed) = rows.values().fold((0, 0), |(c, p), r| (c + r.cases, p + r.passed));
            eprintln!(
                "{}: {passed}/{cases} passed ({:.1} s)",
                display_name(spec.domain(), spec.op()),
                spec_started.elapsed().as_secs_f64()
            );
            for f in &report.failures[failures_before..] {
                eprintln!("  FAILED: {}\n  case: {}", describe(&f.outcome), f.case.label());
            }
        }
        report.rows.extend(rows.into_values());
    }
    bar.finish_and_clear();
    report.seconds = started.elapsed().as_secs_f64();
    report
}

/// Registered lowerings without a spec (ops checked in Python excepted), and specs without a
/// lowering, each as `domain:op` (`op` for `ai.onnx`).
pub fn spec_coverage(
    registered: &BTreeSet<(String, String)>,
    specs: &BTreeSet<(String, String)>,
) -> (Vec<String>, Vec<String>) {
    let missing = registered
        .difference(specs)
        .filter(|(_, op)| !CHECKED_IN_PYTHON.contains(&op.as_str()))
        .map(|(d, o)| display_name(d, o))
        .collect();
    let orphans = specs.difference(registered).map(|(d, o)| display_name(d, o)).collect();
    (missing, orphans)
}

fn case_has_f64(case: &Case) -> bool {
    case.inputs.iter().chain(&case.constants).any(|t| t.dtype == DType::F64)
        || case.outputs.iter().any(|o| o.1 == DType::F64)
}

pub(crate) fn display_name(domain: &str, op: &str) -> String {
    if domain.is_empty() { op.to_owned() } else { format!("{domain}:{op}") }
}

pub(crate) fn seed_bytes(seed: u64, domain: &str, op: &str) -> [u8; 32] {
    // FNV-1a of the op name, so each op draws its own sequence from the one suite seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in domain.bytes().chain(op.bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let mut out = [0u8; 32];
    out[..8].copy_from_slice(&seed.to_le_bytes());
    out[8..16].copy_from_slice(&h.to_le_bytes());
    out
}

/// proptest's shrink loop: simplify while the case still fails, step back when it passes.
fn shrink<T: ValueTree<Value = Case>>(tree: &mut T, case: Case, outcome: Outcome, max_steps: u32) -> (Case, Outcome) {
    let (mut best, mut best_outcome) = (case, outcome);
    let same_kind = |a: &Outcome, b: &Outcome| std::mem::discriminant(a) == std::mem::discriminant(b);
    let mut steps = 0;
    if !tree.simplify() {
        return (best, best_outcome);
    }
    while steps < max_steps {
        steps += 1;
        let candidate = tree.current();
        let o = check(&candidate);
        if same_kind(&o, &best_outcome) {
            best = candidate;
            best_outcome = o;
            if !tree.simplify() {
                break;
            }
        } else if !tree.complicate() {
            break;
        }
    }
    (best, best_outcome)
}

/// Saves a failing case: `case.json` (replayable), `model.onnx` and `inputs.json`.
fn save(root: &Path, spec: &OpSpec, case: &Case, outcome: &Outcome) -> Result<(PathBuf, String)> {
    let name =
        format!("{}-{}-{:016x}", display_name(spec.domain(), spec.op()).replace(':', "_"), case.dtype().onnx_name(), {
            let s = serde_json::to_string(case)?;
            s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
        });
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("case.json"), serde_json::to_string_pretty(case)?)?;
    let inputs: Vec<serde_json::Value> = case
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({
                "name": t.name, "dtype": t.dtype.onnx_name(), "shape": t.shape,
                "values": model::tensor_values(t, case.seed, i as u64),
            })
        })
        .collect();
    std::fs::write(dir.join("inputs.json"), serde_json::to_string_pretty(&inputs)?)?;
    std::fs::write(dir.join("outcome.txt"), format!("{}\n{}\n", case.label(), describe(outcome)))?;
    // The model as a file: ORT writes the graph it loads when optimizations are off.
    let builder = session_builder(Ep::Cpu)?
        .with_optimization_level(mlx_ep_host::ort::session::builder::GraphOptimizationLevel::Disable)
        .map_err(|e| e.to_string())?
        .with_optimized_model_path(dir.join("model.onnx"))
        .map_err(|e| e.to_string())?;
    let _ = model::build(case)?.into_session(&builder);
    let cmd = format!("cargo xtask conformance --replay {}", dir.display());
    Ok((dir, cmd))
}

/// Re-runs a saved case (`case.json` in `dir`).
pub fn replay(dir: &Path) -> Result<(Case, Outcome)> {
    let path = if dir.is_dir() { dir.join("case.json") } else { dir.to_path_buf() };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let case: Case = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let outcome = check(&case);
    Ok((case, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
        items.iter().map(|(d, o)| (d.to_string(), o.to_string())).collect()
    }

    #[test]
    fn a_lowering_without_a_spec_is_named() {
        let registered = set(&[("", "Relu"), ("com.example", "Swish"), ("", "If")]);
        let specs = set(&[("", "Relu"), ("", "Gone")]);
        let (missing, orphans) = spec_coverage(&registered, &specs);
        assert_eq!(missing, vec!["com.example:Swish".to_string()]);
        assert_eq!(orphans, vec!["Gone".to_string()]);
    }
}
