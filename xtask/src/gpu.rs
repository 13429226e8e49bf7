//! `cargo xtask gpu-stage`: everything a GPU measurement needs, laid out under `target/gpu/`
//! for a GPU machine that has no package registry and takes one folder of at most 64 MiB per
//! transfer. Builds the release plugin, runner, native benchmark and property suite, strips them into
//! `target/gpu/bin`, and has the workplace's `stage.sh` (`$MLX_GPU_STAGE`, else
//! `../shared/gpu/stage.sh` beside the checkout) split the MLX CUDA runtime, ONNX Runtime and
//! the MLX Python bindings into `target/gpu/stage/1`, `2`, ... `gpu/run.sh` runs there.

use crate::setup;
use crate::util::{self, Result, step};
use std::path::PathBuf;
use std::process::Command;

const SUITE: &str = "mlx-ep-conformance";
const BINARIES: [&str; 4] = ["libonnxruntime_mlx_ep.so", "mlx-ep-run", "mlx-ep-bench", SUITE];

pub fn stage(args: &[String]) -> Result {
    if let Some(a) = args.first() {
        return Err(format!("unexpected argument `{a}`; usage: cargo xtask gpu-stage"));
    }
    let stage_sh = std::env::var_os("MLX_GPU_STAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| util::root().join("../shared/gpu/stage.sh"));
    if !stage_sh.is_file() {
        return Err(format!(
            "{} not found: point MLX_GPU_STAGE at the stage.sh that lays out the MLX CUDA runtime",
            stage_sh.display()
        ));
    }
    setup::ensure(None)?;
    step("building the plugin, the runner, the native benchmark and the property suite (release)");
    crate::bench::build_release()?;
    util::run(util::cargo().args(["build", "--release", "-p", "conformance"]))?;
    let gpu = util::target_dir().join("gpu");
    let bin = gpu.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    step("stripping them into target/gpu/bin");
    for name in BINARIES {
        let from = util::target_dir().join("release").join(name);
        let to = bin.join(name);
        util::run(Command::new("strip").arg("-o").arg(&to).arg(&from))?;
        if name == SUITE {
            // Compressed: the last part, the binaries and the models must fit one transfer.
            util::run(Command::new("gzip").args(["-9", "-f"]).arg(&to))?;
        }
    }
    step("writing the GPU checks' models into target/gpu/models (gpu/attention_models.py)");
    let models = gpu.join("models");
    util::run(
        Command::new(util::venv_python()).arg(util::root().join("gpu/attention_models.py")).arg("build").arg(&models),
    )?;
    step("laying out the MLX CUDA runtime in parts (stage.sh)");
    util::run(Command::new("bash").arg(&stage_sh).arg(gpu.join("stage")).env("PYTHON", util::venv_python()))?;
    let size = |p: &PathBuf| -> u64 {
        std::fs::read_dir(p).map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
    };
    let mut parts: Vec<PathBuf> = std::fs::read_dir(gpu.join("stage"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.parse::<u32>().is_ok()))
        .collect();
    parts.sort();
    println!("\nSend these, one call each, the next within 30 s of the last one returning:");
    let n = parts.len();
    for (i, p) in parts.iter().enumerate() {
        let rel = p.strip_prefix(util::root()).unwrap_or(p).display().to_string();
        let carry = if i + 1 == n {
            format!("[\"{rel}\", \"target/gpu/bin\", \"target/gpu/models\"]")
        } else {
            format!("[\"{rel}\"]")
        };
        let extra = if i + 1 == n { size(&bin) + size(&models) } else { 0 };
        println!(
            "  carry {carry}  ({:.1} MB)  command: bash gpu/run.sh {}",
            (size(p) + extra) as f64 / 1e6,
            if i + 1 == n { "check llm cnn" } else { "install" }
        );
    }
    println!("Later calls on the same machine carry nothing: bash gpu/run.sh [check] [llm] [cnn]");
    Ok(())
}
