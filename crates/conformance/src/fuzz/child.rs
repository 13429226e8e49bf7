//! The fuzzer's child process (`mlx-ep-conformance --fuzz-child CASE.json`, `-` for stdin):
//! builds the case's model, creates a CPU-EP session and an MLX-EP session, feeds both the
//! same tensors (the MLX session twice: the second run replays a compiled graph), and prints
//! one line `FUZZ-RESULT {json}` ([`ChildResult`]). Before each step it prints a
//! `FUZZ-STAGE` line, so a crash can be pinned to the step that died.

use super::FuzzCase;
use crate::{Outcome, compare, model};
use mlx_ep_host::ort::value::DynValue;
use mlx_ep_host::values::{self, HostTensor};
use mlx_ep_host::{Ep, Result, assignment, session_builder};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const RESULT_MARK: &str = "FUZZ-RESULT ";
pub const STAGE_MARK: &str = "FUZZ-STAGE ";
/// Printed once the MLX EP's session exists when no node of the case was placed on the MLX EP
/// (it declined them all), so a crash that follows is the CPU EP's, whichever session it is in.
pub const NONE_ON_MLX_MARK: &str = "FUZZ-NONE-ON-MLX";

/// Values of an output kept in the result line (the comparison itself sees every value).
const HEAD: usize = 16;

/// One output as reported: name, type, shape and its first values.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputSummary {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<i64>,
    #[serde(with = "super::json_f64s")]
    pub head: Vec<f64>,
}

/// One run of a session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The run's error, if it failed.
    pub error: Option<String>,
    pub outputs: Vec<OutputSummary>,
    /// MLX runs, where both EPs answered: the first disagreement with the CPU EP's outputs
    /// beyond [`crate::tolerance`] (`None`: they agree).
    pub mismatch: Option<String>,
}

/// What one EP did with the case.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpResult {
    /// Creating the session failed (ORT's graph checks, a kernel refusing, the EP's compile).
    pub session_error: Option<String>,
    pub runs: Vec<RunResult>,
    /// ORT's assignment: `(ep, node names)` per assigned subgraph.
    pub assignment: Vec<(String, Vec<String>)>,
}

impl EpResult {
    pub fn refused(msg: String) -> EpResult {
        EpResult { session_error: Some(msg), ..EpResult::default() }
    }

    /// The first error: the session's, else the first run's.
    pub fn error(&self) -> Option<&str> {
        self.session_error.as_deref().or_else(|| self.runs.iter().find_map(|r| r.error.as_deref()))
    }
}

/// The child's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChildResult {
    pub cpu: EpResult,
    pub mlx: EpResult,
    /// The harness could not set the case up (a defect of the fuzzer, not of an EP).
    pub harness_error: Option<String>,
    /// Why the CPU EP's answer is not compared: a mutated case whose CPU side is a reference
    /// graph (an op without a CPU kernel, or with a wrong one), written for valid cases only. The MLX EP is then judged on its
    /// own conduct: no crash, and errors that name the node or the EP, or that are word for word
    /// the reference graph's (ORT's own checks of the fed inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreferenced: Option<String>,
}

fn stage(name: &str) {
    println!("{STAGE_MARK}{name}");
}

/// Reads a [`FuzzCase`] from `path` (`-`: standard input).
pub fn read_case(path: &str) -> Result<FuzzCase> {
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        let p = Path::new(path);
        let file = if p.is_dir() { p.join("case.json") } else { p.to_path_buf() };
        std::fs::read_to_string(&file).map_err(|e| format!("reading {}: {e}", file.display()))?
    };
    Ok(serde_json::from_str(&text)?)
}

/// The child's whole job: run the case, print the result line. With `mlx_only` the CPU EP is
/// not run (the parent asks so after the CPU EP itself crashed on the case).
pub fn main(path: &str, mlx_only: bool) -> Result<()> {
    let fc = read_case(path)?;
    let result = run(&fc, mlx_only);
    println!("{RESULT_MARK}{}", serde_json::to_string(&result)?);
    stage("teardown");
    Ok(())
}

/// The fed tensors as ORT values.
pub fn feeds(fc: &FuzzCase) -> Result<Vec<(String, DynValue)>> {
    fc.feeds
        .iter()
        .map(|t| {
            if t.values.len() != t.len() {
                return Err(format!("feed {}: {} values for shape {:?}", t.name, t.values.len(), t.shape).into());
            }
            Ok((t.name.clone(), values::tensor_from_f64(model::elem_type(t.dtype), &t.shape, &t.values)?))
        })
        .collect()
}

/// Runs the case on both EPs (or on the MLX EP alone).
pub fn run(fc: &FuzzCase, mlx_only: bool) -> ChildResult {
    let inputs = match feeds(fc) {
        Ok(v) => v,
        Err(e) => return ChildResult { harness_error: Some(format!("feeds: {e}")), ..ChildResult::default() },
    };
    let case = fc.model_case();
    stage("cpu");
    // A host panic makes the case invalid, but the MLX EP still runs: a crash there counts.
    let mut harness_error = None;
    let unreferenced = (!case.reference.is_empty() && fc.mutation != "none")
        .then(|| format!("{} has no kernel on ORT's CPU EP and its reference graph holds for valid cases only", fc.op));
    let (cpu, mut expected) = if mlx_only {
        (EpResult::refused("not run (--mlx-only)".into()), Vec::new())
    } else {
        guarded(|| run_ep(Ep::Cpu, &case, &inputs, 1)).unwrap_or_else(|e| {
            harness_error = Some(format!("CPU EP: {e}"));
            (EpResult::refused(e), Vec::new())
        })
    };
    // (The reference graph's errors still tell ORT's own input checks, which come first.)
    if unreferenced.is_some() {
        expected.clear();
    }
    stage("mlx");
    let (mut mlx, got) = guarded(|| run_ep(Ep::Mlx, &case, &inputs, 2)).unwrap_or_else(|e| {
        harness_error.get_or_insert(format!("MLX EP: {e}"));
        (EpResult::refused(e), Vec::new())
    });
    if let Some(Some(want)) = expected.first() {
        for (run, outputs) in mlx.runs.iter_mut().zip(&got) {
            if let Some(outputs) = outputs {
                run.mismatch = match compare(&case, outputs, want) {
                    Outcome::Failed(m) => Some(m),
                    _ => None,
                };
            }
        }
    }
    ChildResult { cpu, mlx, harness_error, unreferenced }
}

/// Runs `f`, turning a panic (the `ort` crate panics on some type information ORT reports for
/// malformed graphs, such as a negative inferred dim) into an error of the harness.
fn guarded<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        format!("the host (ort crate) panicked: {}", msg.unwrap_or_default())
    })
}

/// Creates a session on `ep` and runs it `runs` times; the outputs of each run, where it
/// answered.
fn run_ep(
    ep: Ep,
    case: &conformance_spec::Case,
    inputs: &[(String, DynValue)],
    runs: usize,
) -> (EpResult, Vec<Option<Vec<HostTensor>>>) {
    let tag = if ep == Ep::Cpu { "cpu" } else { "mlx" };
    stage(&format!("{tag}-session"));
    let (built, builder) = if ep == Ep::Cpu {
        (model::build_reference(case), crate::cpu_builder_for(case))
    } else {
        (model::build(case), crate::builder_for(ep))
    };
    let session = built
        .map_err(|e| format!("building the model: {e}"))
        .and_then(|m| m.into_session(&builder.map_err(|e| e.to_string())?).map_err(|e| e.to_string()));
    let mut session = match session {
        Ok(s) => s,
        Err(e) => return (EpResult::refused(e), Vec::new()),
    };
    let mut result = EpResult::default();
    match assignment(&session) {
        Ok(placed) => {
            result.assignment =
                placed.into_iter().map(|a| (a.ep, a.nodes.into_iter().map(|n| n.name).collect())).collect();
            if ep == Ep::Mlx
                && !result.assignment.iter().any(|(e, nodes)| e == mlx_ep_host::MLX_EP && !nodes.is_empty())
            {
                println!("{NONE_ON_MLX_MARK}");
            }
        }
        Err(e) => result.session_error = Some(format!("reading ORT's assignment info: {e}")),
    }
    let mut outputs = Vec::new();
    for k in 0..runs {
        stage(&format!("{tag}-run-{}", k + 1));
        match values::run(&mut session, inputs) {
            Ok(out) => {
                result.runs.push(RunResult { outputs: out.iter().map(summary).collect(), ..RunResult::default() });
                outputs.push(Some(out));
            }
            Err(e) => {
                result.runs.push(RunResult { error: Some(e.to_string()), ..RunResult::default() });
                outputs.push(None);
            }
        }
    }
    stage(&format!("{tag}-drop"));
    drop(session);
    (result, outputs)
}

fn summary(t: &HostTensor) -> OutputSummary {
    OutputSummary {
        name: t.name.clone(),
        dtype: format!("{:?}", t.elem_type),
        shape: t.shape.clone(),
        head: t.values.iter().take(HEAD).copied().collect(),
    }
}

/// Writes `model.onnx` (as ORT loads it, when the CPU EP accepts the graph) and `inputs.json`
/// (the fed tensors) for the case saved in `dir` (`mlx-ep-conformance --fuzz-save DIR`).
pub fn save_model(dir: &Path) -> Result<()> {
    let fc = read_case(&dir.display().to_string())?;
    let inputs = serde_json::to_string_pretty(&fc.feeds)?;
    std::fs::write(dir.join("inputs.json"), inputs)?;
    let builder = session_builder(Ep::Cpu)?
        .with_optimization_level(mlx_ep_host::ort::session::builder::GraphOptimizationLevel::Disable)
        .map_err(|e| e.to_string())?
        .with_optimized_model_path(dir.join("model.onnx"))
        .map_err(|e| e.to_string())?;
    model::build(&fc.model_case())?.into_session(&builder).map_err(|e| format!("ORT refuses the model: {e}"))?;
    Ok(())
}
