//! `cargo xtask test`: everything CI runs, in order: setup, build, `cargo test --workspace`,
//! then the Python check against the wheel's ONNX Runtime.

use crate::setup;
use crate::util::{self, Result, step};
use std::process::Command;

pub fn run(args: &[String]) -> Result {
    if let Some(a) = args.first() {
        return Err(format!("test: unknown option `{a}`"));
    }
    setup::ensure(false)?;
    step("building the plugin");
    util::run(util::cargo().args(["build", "-p", "onnxruntime-mlx-ep"]))?;
    step("cargo test --workspace");
    util::run(util::cargo().args(["test", "--workspace"]).env("ORT_MLX_EP_LIB", util::plugin_path("debug")))?;
    step("Python check (onnxruntime wheel + plugin)");
    util::run(
        Command::new(util::venv_python())
            .arg(util::root().join("python/check_plugin.py"))
            .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
    )?;
    Ok(())
}
