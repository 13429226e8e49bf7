//! `mlx-ep-conformance`: the property suite as a command (run by `cargo xtask conformance`),
//! and the bad-input fuzzer (run by `cargo xtask fuzz`).
//!
//! ```text
//! mlx-ep-conformance [--cases N] [--op NAME[,NAME...]] [--seed S] [--json PATH] [--failures-dir DIR]
//!                    [--log] [--replay DIR]
//! mlx-ep-conformance --fuzz [--cases N] [--seed S] [--op NAME] [--mutation NAME] [--jobs J]
//!                    [--timeout SECONDS] [--memory-mb MB] [--failures-dir DIR]
//! mlx-ep-conformance --fuzz-replay DIR
//! ```
//! The suite exits non-zero when a case fails or declines, or a lowering has no spec; the
//! fuzzer when a case crashes, hangs, answers wrongly or fails spuriously. Hidden modes of the
//! fuzzer's child processes: `--fuzz-child CASE.json [--mlx-only]` (`-`: standard input) and
//! `--fuzz-save DIR`.

use conformance::fuzz;
use conformance::suite::{self, Options};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mlx-ep-conformance: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool, String> {
    conformance::link_op_crates();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--fuzz-child") => {
            let path = args.get(1).ok_or("--fuzz-child needs a case file (or -)")?;
            let mlx_only = args.get(2).is_some_and(|a| a == "--mlx-only");
            fuzz::child::main(path, mlx_only).map_err(|e| e.to_string())?;
            return Ok(true);
        }
        Some("--fuzz-save") => {
            let dir = args.get(1).ok_or("--fuzz-save needs a directory")?;
            fuzz::child::save_model(dir.as_ref()).map_err(|e| e.to_string())?;
            return Ok(true);
        }
        Some("--fuzz" | "--fuzz-replay") => return fuzz_command(&args),
        _ => {}
    }
    let mut opts = Options { progress: true, ..Options::default() };
    let mut json = None;
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--cases" => opts.cases = value()?.parse().map_err(|e| format!("--cases: {e}"))?,
            "--op" => opts.op = Some(value()?),
            "--seed" => opts.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--json" => json = Some(value()?),
            "--failures-dir" => opts.failures_dir = Some(value()?.into()),
            "--log" => opts.log = true,
            "--replay" => {
                let dir = value()?;
                let (case, outcome) = suite::replay(dir.as_ref()).map_err(|e| e.to_string())?;
                println!("{}\n{outcome:?}", case.label());
                return Ok(outcome.is_pass());
            }
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    let report = suite::run(&opts);
    print!("{}", report.table());
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "property": report.json() }))
            .map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("writing {path}: {e}"))?;
    }
    Ok(report.ok())
}

/// `--fuzz [options]` and `--fuzz-replay DIR [options]`.
fn fuzz_command(args: &[String]) -> Result<bool, String> {
    let mut opts = fuzz::driver::Options::default();
    let mut replay = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{a}: {e}"));
        match a.as_str() {
            "--fuzz" => {}
            "--fuzz-replay" => replay = Some(value()?),
            "--cases" => opts.cases = number(value()?)?,
            "--seed" => opts.seed = number(value()?)?,
            "--op" => opts.op = Some(value()?),
            "--mutation" => {
                let m = value()?;
                if !fuzz::mutate::MUTATIONS.iter().any(|(n, ..)| *n == m) {
                    let names: Vec<&str> = fuzz::mutate::MUTATIONS.iter().map(|(n, ..)| *n).collect();
                    return Err(format!("--mutation: `{m}` is none of {}", names.join(", ")));
                }
                opts.mutation = Some(m);
            }
            "--jobs" => opts.jobs = number(value()?)?.max(1) as usize,
            "--timeout" => opts.timeout = std::time::Duration::from_secs(number(value()?)?),
            "--memory-mb" => opts.memory_mb = number(value()?)?,
            "--failures-dir" => opts.failures_dir = value()?.into(),
            other => return Err(format!("unknown fuzz option `{other}`")),
        }
    }
    if let Some(dir) = replay {
        return fuzz::driver::replay(dir.as_ref(), &opts);
    }
    let report = fuzz::driver::run(&opts);
    print!("{}", report.table());
    Ok(report.ok())
}
