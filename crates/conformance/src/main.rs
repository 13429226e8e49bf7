//! `mlx-ep-conformance`: the property suite as a command (run by `cargo xtask conformance`).
//!
//! ```text
//! mlx-ep-conformance [--cases N] [--op NAME] [--seed S] [--json PATH] [--replay DIR]
//! ```
//! Exits non-zero when a case fails or declines, or a lowering has no spec.

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
    let mut opts = Options { progress: true, ..Options::default() };
    let mut json = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--cases" => opts.cases = value()?.parse().map_err(|e| format!("--cases: {e}"))?,
            "--op" => opts.op = Some(value()?),
            "--seed" => opts.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--json" => json = Some(value()?),
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
