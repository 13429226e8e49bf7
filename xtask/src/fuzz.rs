//! `cargo xtask fuzz [--cases N] [--seed S] [--op NAME] [--mutation NAME] [--jobs J]
//! [--timeout SECONDS] [--memory-mb MB]` and `cargo xtask fuzz --replay DIR`.
//!
//! The bad-input fuzzer (`mlx-ep-conformance --fuzz`): valid cases from every lowering's
//! conformance spec, each mutated into a malformed one and run in a child process on ORT's CPU
//! EP and the MLX EP; crashes, hangs, wrong answers and spurious errors fail the run and are
//! saved under `target/fuzz/failures/` with the command that replays them.

use crate::setup;
use crate::util::{self, Result, step};

/// The bounded run (`cargo xtask fuzz` without options, and the last step of `cargo xtask
/// test`): a fixed seed, about a minute on two cores with a warm MLX kernel cache.
pub const CI_CASES: u64 = 2000;
pub const CI_SEED: u64 = 20_261_203;

pub fn run(args: &[String]) -> Result {
    let mut forwarded = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cases" | "--seed" | "--op" | "--mutation" | "--jobs" | "--timeout" | "--memory-mb"
            | "--failures-dir" => {
                let v = it.next().ok_or(format!("fuzz: {a} needs a value"))?;
                forwarded.extend([a.clone(), v.clone()]);
            }
            "--replay" => {
                let v = it.next().ok_or("fuzz: --replay needs a directory")?;
                forwarded.extend(["--fuzz-replay".to_string(), v.clone()]);
            }
            other => return Err(format!("fuzz: unknown option `{other}`")),
        }
    }
    setup::ensure(None)?;
    util::run(util::cargo().args(["build", "-p", "onnxruntime-mlx-ep"]))?;
    if forwarded.is_empty() {
        return bounded();
    }
    fuzzer(&forwarded)
}

/// The bounded run (the plugin already built).
pub fn bounded() -> Result {
    fuzzer(&["--cases".to_string(), CI_CASES.to_string(), "--seed".to_string(), CI_SEED.to_string()])
}

/// Runs `mlx-ep-conformance --fuzz` (or `--fuzz-replay`) against the debug plugin.
fn fuzzer(args: &[String]) -> Result {
    step("bad-input fuzzer (mlx-ep-conformance --fuzz)");
    let mut cmd = util::cargo();
    cmd.args(["run", "-q", "-p", "conformance", "--bin", "mlx-ep-conformance", "--"]);
    if !args.iter().any(|a| a == "--fuzz-replay") {
        cmd.arg("--fuzz");
    }
    util::run(cmd.args(args).env("ORT_MLX_EP_LIB", util::plugin_path("debug")))
}
