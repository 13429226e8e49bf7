//! `cargo xtask test`: everything CI runs, in order: setup, a trimmed plugin build, the
//! workspace build, `cargo test --workspace`, the property suite at a bounded case count, the
//! ONNX node tests and model suites (no test on the committed
//! passing list may fail), then the Python check against the wheel's ORT.

use crate::setup;
use crate::util::{self, Result, step};
use std::process::Command;

pub fn run(args: &[String]) -> Result {
    if let Some(a) = args.first() {
        return Err(format!("test: unknown option `{a}`"));
    }
    setup::ensure(None)?;
    step("building a trimmed plugin (elementwise family only) into target/debug/trimmed");
    util::run(util::cargo().args([
        "build",
        "-p",
        "onnxruntime-mlx-ep",
        "--no-default-features",
        "--features",
        "elementwise",
    ]))?;
    let trimmed = util::target_dir().join("debug/trimmed");
    std::fs::create_dir_all(&trimmed).map_err(|e| format!("creating {}: {e}", trimmed.display()))?;
    std::fs::copy(util::plugin_path("debug"), trimmed.join(util::plugin_file_name()))
        .map_err(|e| format!("copying the trimmed plugin: {e}"))?;
    step("building the workspace (full plugin, example plugin, tools)");
    util::run(util::cargo().args(["build", "--workspace"]))?;
    step("cargo test --workspace");
    util::run(util::cargo().args(["test", "--workspace"]).env("ORT_MLX_EP_LIB", util::plugin_path("debug")))?;
    crate::conformance::property_suite(&["--cases".to_string(), crate::conformance::CI_CASES.to_string()])?;
    crate::conformance::node_suite(&[
        "--check-passing".to_string(),
        util::root().join(crate::conformance::PASSING_LIST).display().to_string(),
    ])?;
    step("Python check (onnxruntime wheel + plugin)");
    util::run(
        Command::new(util::venv_python())
            .arg(util::root().join("python/check_plugin.py"))
            .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
    )?;
    Ok(())
}
