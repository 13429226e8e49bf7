//! `cargo xtask demo` and `cargo xtask run MODEL.onnx`: build the plugin and the host runner in
//! release mode, then let the runner (`crates/host`) produce the per-EP report.

use crate::setup;
use crate::util::{self, Result, step};
use std::process::Command;

pub fn demo(args: &[String]) -> Result {
    runner(&[&["demo".to_string()], args].concat())
}

pub fn run_model(args: &[String]) -> Result {
    if args.is_empty() {
        return Err("usage: cargo xtask run MODEL.onnx [--repeat N] [--json PATH] [--dim NAME=VALUE]...".into());
    }
    runner(&[&["run".to_string()], args].concat())
}

/// `cargo xtask llm [--preset tiny|small|qwen2.5-0.5b] [--prompt N] [--steps N] [--json PATH]`:
/// a generated decoder, greedy, on both EPs.
pub fn llm(args: &[String]) -> Result {
    runner(&[&["llm".to_string()], args].concat())
}

fn runner(args: &[String]) -> Result {
    setup::ensure(None)?;
    step("building the plugin and the runner (release)");
    util::run(util::cargo().args(["build", "--release", "-p", "onnxruntime-mlx-ep", "-p", "mlx-ep-host"]))?;
    let bin = util::target_dir().join("release/mlx-ep-run");
    util::run(Command::new(bin).args(args).env("ORT_MLX_EP_LIB", util::plugin_path("release")))
}
