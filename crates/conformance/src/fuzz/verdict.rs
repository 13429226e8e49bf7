//! Judging one fuzz case from how its child process ended and what it printed.
//!
//! OK: both EPs refuse or fail (an MLX run error must name `MLXExecutionProvider` or a node,
//! unless it is ORT's own check, word for word the CPU EP's error, or no node ran on MLX);
//! or both answer the same within [`crate::tolerance`]. Failures: a *crash* (the child died
//! by a signal, or exited without its result line), a *hang* (past the timeout), a *wrong*
//! answer (MLX answered where the CPU EP raised, or answered differently), and a *spurious*
//! error (MLX failed where the CPU EP answered, or its error names nothing). A crash in a CPU
//! EP stage is rerun on the MLX EP alone: it is the MLX EP's only if that crashes too. A
//! spurious error
//! where the CPU EP is known to be the lenient one ([`CPU_LENIENT`]) is counted as *lenient*,
//! not as a failure.

use super::child::{ChildResult, EpResult, RESULT_MARK, STAGE_MARK};
pub use super::known::{
    CPU_ANSWER_WRONG, CPU_ANSWER_WRONG_WHERE, CPU_LENIENT, ONNX_OVER_CPU, ONNX_OVER_CPU_OUTPUT, ONNX_WHERE_CPU_REFUSES,
};
use mlx_ep_host::MLX_EP;
use serde::Serialize;

/// The class of a case's outcome (a column of the report).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Class {
    Ok,
    Crash,
    Hang,
    Wrong,
    Spurious,
    /// ORT's CPU EP itself crashed on the case and the MLX EP alone did not (rerun without the
    /// CPU EP), or ORT died creating either session: an ONNX Runtime finding, not a failure.
    CpuCrash,
    /// The MLX EP refused, clearly, input the CPU EP is known to accept without checking it
    /// ([`CPU_LENIENT`]): not a failure.
    Lenient,
    /// The harness could not set the case up (counted, never a finding about an EP).
    Invalid,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Ok => "ok",
            Class::Crash => "crash",
            Class::Hang => "hang",
            Class::Wrong => "wrong",
            Class::Spurious => "spurious",
            Class::Lenient => "lenient",
            Class::CpuCrash => "cpu-crash",
            Class::Invalid => "invalid",
        }
    }

    /// A finding (a failure of the run).
    pub fn is_failure(self) -> bool {
        matches!(self, Class::Crash | Class::Hang | Class::Wrong | Class::Spurious)
    }
}

/// A judged case: its class and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub class: Class,
    pub reason: String,
}

impl Verdict {
    fn new(class: Class, reason: impl Into<String>) -> Verdict {
        Verdict { class, reason: reason.into() }
    }
}

/// Turns a spurious error into [`Class::Lenient`] where [`CPU_LENIENT`] says the CPU EP is the
/// lenient one for this op and mutation, a different answer where [`ONNX_OVER_CPU`] says the
/// MLX EP follows ONNX there or [`CPU_ANSWER_WRONG`] shows the CPU EP wrong, and an answer to
/// a CPU EP error only where [`ONNX_WHERE_CPU_REFUSES`] names that error.
pub fn excuse(v: Verdict, op: &str, mutation: &str, attributes: &[(String, conformance_spec::Attr)]) -> Verdict {
    // Different values only.
    if v.class == Class::Wrong && v.reason.contains(" vs CPU ") {
        let given = |name: &str, value: &str| {
            attributes.iter().any(|(n, a)| {
                n == name
                    && match a {
                        conformance_spec::Attr::Str(s) => s == value,
                        conformance_spec::Attr::Int(i) => i.to_string() == value,
                        _ => false,
                    }
            })
        };
        if let Some((.., why)) = ONNX_OVER_CPU.iter().find(|(o, name, value, _)| *o == op && given(name, value)) {
            return Verdict::new(Class::Lenient, format!("{why}; MLX: {}", v.reason));
        }
        let in_output = |out: &str| v.reason.contains(&format!("output '{out}'"));
        if let Some((.., why)) = ONNX_OVER_CPU_OUTPUT
            .iter()
            .find(|(o, name, value, out, _)| *o == op && given(name, value) && in_output(out))
        {
            return Verdict::new(Class::Lenient, format!("{why}; MLX: {}", v.reason));
        }
    }
    if v.class == Class::Wrong
        && v.reason.contains("where the CPU EP raised")
        && let Some((.., why)) = ONNX_WHERE_CPU_REFUSES.iter().find(|(o, text, _)| *o == op && v.reason.contains(text))
    {
        return Verdict::new(Class::Lenient, format!("{why}; MLX: {}", v.reason));
    }
    // A different answer (never one where the CPU EP raised) the CPU EP is known to get wrong.
    if v.class == Class::Wrong
        && !v.reason.contains("the CPU EP raised")
        && let Some(why) =
            CPU_ANSWER_WRONG.iter().find(|(o, m, _)| *o == op && *m == mutation).map(|e| e.2).or_else(|| {
                CPU_ANSWER_WRONG_WHERE
                    .iter()
                    .find(|(o, m, text, _)| *o == op && *m == mutation && v.reason.contains(text))
                    .map(|e| e.3)
            })
    {
        return Verdict::new(Class::Lenient, format!("{why}; MLX: {}", v.reason));
    }
    if v.class != Class::Spurious {
        return v;
    }
    // The EP's memory guard (`ep_core::claims::check_shape`): MLX does not survive a failed
    // allocation, so a tensor of more than half of what the process may still allocate is
    // refused by name; the CPU EP, whose allocations fail cleanly, may still answer.
    if v.reason.contains("more than half of what the process can still allocate") {
        let why = "a tensor of more than half of what the process may still allocate (the fuzzer's children \
                   run under an address-space limit): the MLX EP refuses it by name, as MLX does not survive \
                   a failed allocation; the CPU EP's allocations fail cleanly, so it may answer";
        return Verdict::new(Class::Lenient, format!("{why}; MLX: {}", v.reason));
    }
    match CPU_LENIENT.iter().find(|(o, ms, text, _)| *o == op && ms.contains(&mutation) && v.reason.contains(text)) {
        Some((.., why)) => Verdict::new(Class::Lenient, format!("{why}; MLX: {}", v.reason)),
        None => v,
    }
}

/// How the child process ended.
#[derive(Clone, Debug)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// It ran past the timeout (and was killed).
    TimedOut,
}

/// The last `FUZZ-STAGE` the child reached, and its result line if it printed one.
pub fn parse_stdout(stdout: &str) -> (Option<String>, Option<Result<ChildResult, String>>) {
    let mut stage = None;
    let mut result = None;
    for line in stdout.lines() {
        if let Some(s) = line.strip_prefix(STAGE_MARK) {
            stage = Some(s.trim().to_owned());
        } else if let Some(json) = line.strip_prefix(RESULT_MARK) {
            result = Some(serde_json::from_str::<ChildResult>(json).map_err(|e| e.to_string()));
        }
    }
    (stage, result)
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        _ => return format!("signal {sig}"),
    };
    format!("{name} ({sig})")
}

/// Judges a case from its exit and standard output; `nodes` are the case's node names.
pub fn judge(exit: &Exit, stdout: &str, nodes: &[String]) -> Verdict {
    let (stage, result) = parse_stdout(stdout);
    let at = stage.as_deref().unwrap_or("start");
    match (exit, result) {
        (Exit::TimedOut, _) => Verdict::new(Class::Hang, format!("no answer within the timeout (stage {at})")),
        (Exit::Signal(s), _) => Verdict::new(Class::Crash, format!("killed by {} in stage {at}", signal_name(*s))),
        // Before the first stage the child only reads the case: a failure there is the harness's.
        (Exit::Code(c), None) if stage.is_none() => {
            Verdict::new(Class::Invalid, format!("the child exited with {c} before running the case"))
        }
        (Exit::Code(c), None) => Verdict::new(Class::Crash, format!("exited with {c} without a result (stage {at})")),
        (Exit::Code(_), Some(Err(e))) => Verdict::new(Class::Invalid, format!("unreadable result line: {e}")),
        (Exit::Code(c), Some(Ok(r))) => {
            let v = judge_result(&r, nodes);
            if *c != 0 && v.class != Class::Invalid {
                Verdict::new(Class::Crash, format!("exited with {c} after its result (stage {at}); {}", v.reason))
            } else {
                v
            }
        }
    }
}

/// Whether any of the case's nodes ran on the MLX EP.
fn mlx_ran_nodes(mlx: &EpResult) -> bool {
    mlx.assignment.iter().any(|(ep, nodes)| ep == MLX_EP && !nodes.is_empty())
}

/// Judges a child's result.
pub fn judge_result(r: &ChildResult, nodes: &[String]) -> Verdict {
    if let Some(e) = &r.harness_error {
        return Verdict::new(Class::Invalid, e.clone());
    }
    if r.unreferenced.is_some() {
        return judge_alone(&r.mlx, r.cpu.error(), nodes);
    }
    let cpu_error = r.cpu.error();
    let on_mlx = mlx_ran_nodes(&r.mlx);
    let placement = if on_mlx { "on MLX" } else { "declined to the CPU EP" };
    if let Some(e) = &r.mlx.session_error {
        return match cpu_error {
            Some(_) => Verdict::new(Class::Ok, "both refuse or fail"),
            None => {
                Verdict::new(Class::Spurious, format!("the MLX session was refused where the CPU EP answered: {e}"))
            }
        };
    }
    if r.mlx.runs.is_empty() {
        return Verdict::new(Class::Invalid, "the MLX session made no run");
    }
    for (k, run) in r.mlx.runs.iter().enumerate() {
        let which = format!("run {} ({placement})", k + 1);
        match (&run.error, cpu_error) {
            (Some(e), Some(cpu)) => {
                let named = e.contains(MLX_EP) || nodes.iter().any(|n| e.contains(n.as_str()));
                if !(named || !on_mlx || e == cpu) {
                    return Verdict::new(
                        Class::Spurious,
                        format!("{which}: the error names neither the EP nor a node: {e}"),
                    );
                }
            }
            (Some(e), None) => {
                return Verdict::new(Class::Spurious, format!("{which}: MLX failed where the CPU EP answered: {e}"));
            }
            (None, Some(cpu)) => {
                let got: Vec<String> = run.outputs.iter().map(|o| format!("{}{:?}", o.name, o.shape)).collect();
                return Verdict::new(
                    Class::Wrong,
                    format!("{which}: MLX answered {} where the CPU EP raised: {cpu}", got.join(", ")),
                );
            }
            (None, None) => {
                if let Some(m) = &run.mismatch {
                    // Declined, the CPU EP ran every node in both sessions: a difference is its
                    // own (values it leaves unwritten, such as GroupQueryAttention's output_qk
                    // under a qk_output it does not know), not the MLX EP's.
                    let class = if on_mlx { Class::Wrong } else { Class::Lenient };
                    return Verdict::new(class, format!("{which}: {m}"));
                }
            }
        }
    }
    let what = match (cpu_error, on_mlx) {
        (Some(_), _) => "both fail",
        (None, true) => "both answer the same (on MLX)",
        (None, false) => "both answer the same (declined to the CPU EP)",
    };
    Verdict::new(Class::Ok, what)
}

/// The MLX EP's conduct on a case with nothing to compare against (see
/// [`ChildResult::unreferenced`]): refusing, answering, or failing with an error that names the
/// node or the EP (or is `reference`'s word for word: ORT's own input checks) is fine; an error
/// that names neither is spurious.
fn judge_alone(mlx: &EpResult, reference: Option<&str>, nodes: &[String]) -> Verdict {
    if let Some(e) = &mlx.session_error {
        // The MLX EP names itself in every error it raises while a session is created (its
        // ABI boundary prefixes them): an error without its name is ORT's, or the CPU EP's
        // for a node the MLX EP declined.
        let whose =
            if e.contains(MLX_EP) { "the MLX EP refused the case" } else { "ORT or its CPU EP refused the case" };
        return Verdict::new(Class::Ok, format!("{whose} (nothing to compare with)"));
    }
    if mlx.runs.is_empty() {
        return Verdict::new(Class::Invalid, "the MLX session made no run");
    }
    let on_mlx = mlx_ran_nodes(mlx);
    for (k, run) in mlx.runs.iter().enumerate() {
        if let Some(e) = &run.error {
            let named = e.contains(MLX_EP) || nodes.iter().any(|n| e.contains(n.as_str()));
            if on_mlx && !named && reference != Some(e.as_str()) {
                return Verdict::new(
                    Class::Spurious,
                    format!("run {}: the error names neither the EP nor a node: {e}", k + 1),
                );
            }
        }
    }
    Verdict::new(Class::Ok, "the MLX EP answered or failed cleanly (no CPU kernel to compare)")
}

#[cfg(test)]
mod tests {
    use super::super::child::{OutputSummary, RunResult};
    use super::*;
    use mlx_ep_host::CPU_EP;

    fn nodes() -> Vec<String> {
        vec!["under_test".into()]
    }

    fn ep(on: &str, runs: Vec<RunResult>) -> EpResult {
        EpResult { session_error: None, runs, assignment: vec![(on.into(), vec!["under_test".into()])] }
    }

    fn answer() -> RunResult {
        RunResult {
            outputs: vec![OutputSummary { name: "y".into(), ..OutputSummary::default() }],
            ..RunResult::default()
        }
    }

    fn error(msg: &str) -> RunResult {
        RunResult { error: Some(msg.into()), ..RunResult::default() }
    }

    fn line(r: &ChildResult) -> String {
        format!("{STAGE_MARK}mlx-run-2\n{RESULT_MARK}{}\n{STAGE_MARK}teardown\n", serde_json::to_string(r).unwrap())
    }

    #[test]
    fn classes() {
        let cpu_ok = ep(CPU_EP, vec![answer()]);
        let cpu_err = ep(CPU_EP, vec![error("index 9 out of range")]);
        let mlx_err = "Non-zero status code returned while running MLXExecutionProvider_0 node: bad index";
        let cases = [
            (cpu_ok.clone(), ep(MLX_EP, vec![answer(), answer()]), Class::Ok),
            (cpu_err.clone(), ep(MLX_EP, vec![error(mlx_err), error(mlx_err)]), Class::Ok),
            (cpu_err.clone(), ep(MLX_EP, vec![error("bad"), error("bad")]), Class::Spurious),
            (cpu_err.clone(), ep(CPU_EP, vec![error("index 9 out of range"); 2]), Class::Ok),
            (cpu_err.clone(), ep(MLX_EP, vec![answer(), answer()]), Class::Wrong),
            (cpu_ok.clone(), ep(MLX_EP, vec![answer(), error(mlx_err)]), Class::Spurious),
            (
                cpu_ok.clone(),
                ep(MLX_EP, vec![RunResult { mismatch: Some("differs".into()), ..answer() }]),
                Class::Wrong,
            ),
            (EpResult::refused("no kernel".into()), EpResult::refused("no kernel".into()), Class::Ok),
            (cpu_ok.clone(), EpResult::refused("compile failed".into()), Class::Spurious),
        ];
        for (i, (cpu, mlx, want)) in cases.into_iter().enumerate() {
            let r = ChildResult { cpu, mlx, harness_error: None, unreferenced: None };
            assert_eq!(judge(&Exit::Code(0), &line(&r), &nodes()).class, want, "case {i}");
        }
    }

    #[test]
    fn known_cpu_leniency_is_excused() {
        let v = Verdict::new(
            Class::Spurious,
            "run 1: MLX failed where the CPU EP answered: axis 9 is out of range for rank 4",
        );
        assert_eq!(excuse(v.clone(), "MeanVarianceNormalization", "attr-out-of-range", &[]).class, Class::Lenient);
        assert_eq!(excuse(v, "ReduceSum", "attr-out-of-range", &[]).class, Class::Spurious);
    }

    #[test]
    fn a_different_answer_is_excused_only_where_the_cpu_ep_is_known_wrong() {
        let differs = Verdict::new(Class::Wrong, "run 1 (on MLX): output 'y' is Float32[5] on MLX, Float32[4] on CPU");
        assert_eq!(excuse(differs.clone(), "Unique", "nan-inf", &[]).class, Class::Lenient);
        assert_eq!(excuse(differs.clone(), "Unique", "size-0-dim", &[]).class, Class::Wrong);
        assert_eq!(excuse(differs, "ReduceMax", "nan-inf", &[]).class, Class::Wrong);
        let raised = Verdict::new(Class::Wrong, "run 1 (on MLX): MLX answered y[5] where the CPU EP raised: bad");
        assert_eq!(excuse(raised.clone(), "Unique", "nan-inf", &[]).class, Class::Wrong);
        assert_eq!(excuse(raised, "Attention", "size-0-dim", &[]).class, Class::Wrong);
        let short_mask = Verdict::new(
            Class::Wrong,
            "run 1 (on MLX): MLX answered y[2, 1, 16] where the CPU EP raised: attn_mask == nullptr || ... was \
             false. inconsistent total_sequence_length (between attn_mask and past_key and past_value)",
        );
        assert_eq!(excuse(short_mask.clone(), "Attention", "size-0-dim", &[]).class, Class::Lenient);
        assert_eq!(excuse(short_mask, "GroupQueryAttention", "size-0-dim", &[]).class, Class::Wrong);
    }

    #[test]
    fn deaths() {
        let v = judge(&Exit::Signal(11), &format!("{STAGE_MARK}mlx-run-1\n"), &nodes());
        assert_eq!(v.class, Class::Crash);
        assert!(v.reason.contains("SIGSEGV") && v.reason.contains("mlx-run-1"), "{}", v.reason);
        assert_eq!(judge(&Exit::Code(134), &format!("{STAGE_MARK}cpu\n"), &nodes()).class, Class::Crash);
        assert_eq!(judge(&Exit::Code(2), "", &nodes()).class, Class::Invalid);
        assert_eq!(judge(&Exit::TimedOut, "", &nodes()).class, Class::Hang);
        let r = ChildResult {
            cpu: ep(CPU_EP, vec![answer()]),
            mlx: ep(MLX_EP, vec![answer()]),
            harness_error: None,
            unreferenced: None,
        };
        assert_eq!(judge(&Exit::Code(1), &line(&r), &nodes()).class, Class::Crash);
    }

    #[test]
    fn a_case_without_a_cpu_kernel_is_judged_on_the_mlx_eps_conduct() {
        let alone = |mlx: EpResult| {
            let r = ChildResult {
                cpu: ep(CPU_EP, vec![error("input x: got 5, expected 2")]),
                mlx,
                harness_error: None,
                unreferenced: Some("no CPU kernel".into()),
            };
            judge_result(&r, &nodes()).class
        };
        assert_eq!(alone(ep(MLX_EP, vec![answer()])), Class::Ok);
        assert_eq!(alone(ep(MLX_EP, vec![error("node 'under_test': bad shape")])), Class::Ok);
        assert_eq!(alone(ep(MLX_EP, vec![error("bad shape")])), Class::Spurious);
        assert_eq!(alone(ep(MLX_EP, vec![error("input x: got 5, expected 2")])), Class::Ok);
        assert_eq!(alone(EpResult::refused("node 'under_test': refused".into())), Class::Ok);
        assert_eq!(alone(EpResult::refused("input x: got 5, expected 2".into())), Class::Ok);
        assert_eq!(alone(ep(MLX_EP, vec![])), Class::Invalid);
    }
}
