//! `cargo xtask conformance [--node-tests] [--update-passing]`: the differential suite
//! (`cargo test -p conformance`) and, with `--node-tests`, the ONNX backend node tests
//! (`python/node_suite.py`), which regenerate `docs/CONFORMANCE.md` and write
//! `target/conformance/node-tests.json`. `--update-passing` also rewrites the committed list of
//! passing node tests that `cargo xtask test` holds the EP to.

use crate::setup;
use crate::util::{self, Result, step};
use std::process::Command;

pub const PASSING_LIST: &str = "crates/conformance/node-tests-passing.txt";

pub fn run(args: &[String]) -> Result {
    let (mut node_tests, mut update) = (false, false);
    for a in args {
        match a.as_str() {
            "--node-tests" => node_tests = true,
            "--update-passing" => update = true,
            other => return Err(format!("conformance: unknown option `{other}`")),
        }
    }
    if update && !node_tests {
        return Err("--update-passing needs --node-tests".into());
    }
    setup::ensure(None)?;
    util::run(util::cargo().args(["build", "-p", "onnxruntime-mlx-ep"]))?;
    step("differential suite (cargo test -p conformance)");
    util::run(util::cargo().args(["test", "-p", "conformance"]).env("ORT_MLX_EP_LIB", util::plugin_path("debug")))?;
    if node_tests {
        let root = util::root();
        let mut extra = vec!["--report".to_string(), root.join("docs/CONFORMANCE.md").display().to_string()];
        if update {
            extra.extend(["--passing".to_string(), root.join(PASSING_LIST).display().to_string()]);
        } else {
            extra.extend(["--check-passing".to_string(), root.join(PASSING_LIST).display().to_string()]);
        }
        node_suite(&extra)?;
    }
    Ok(())
}

/// Runs the ONNX node-test suite with the debug plugin; `extra` are node_suite.py options.
pub fn node_suite(extra: &[String]) -> Result {
    step("ONNX backend node tests (python/node_suite.py)");
    let out = util::target_dir().join("conformance");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    util::run(
        Command::new(util::venv_python())
            .arg(util::root().join("python/node_suite.py"))
            .arg("--out-json")
            .arg(out.join("node-tests.json"))
            .arg("--data-dir")
            .arg(util::target_dir().join("onnx-node-tests"))
            .args(extra)
            .current_dir(util::root())
            .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
    )
}
