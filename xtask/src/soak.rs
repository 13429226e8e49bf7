//! `cargo xtask soak [--runs N] [--cycles N] [--shape-runs N] [--shapes N] [--tolerance F]
//! [--short]`: `python/check_soak.py` against the debug plugin, at full size unless told
//! otherwise; the samples go to `target/soak/results.json`.

use crate::setup;
use crate::util::{self, Result, step};
use std::process::Command;

pub fn run(args: &[String]) -> Result {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" | "--cycles" | "--shape-runs" | "--shapes" | "--tolerance" => {
                it.next().ok_or(format!("soak: {a} needs a value"))?;
            }
            "--short" => {}
            other => return Err(format!("soak: unknown option `{other}`")),
        }
    }
    setup::ensure(None)?;
    util::run(util::cargo().args(["build", "-p", "onnxruntime-mlx-ep"]))?;
    let out = util::target_dir().join("soak");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    step("soak and churn (python/check_soak.py)");
    util::run(
        Command::new(util::venv_python())
            .arg(util::root().join("python/check_soak.py"))
            .args(args)
            .arg("--json")
            .arg(out.join("results.json"))
            .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
    )
}
