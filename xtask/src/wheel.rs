//! `cargo xtask wheel [--debug] [--cuda]`: the Python package `onnxruntime-mlx-ep` (import name
//! `onnxruntime_mlx`) as a platform wheel under `target/wheels/`.
//!
//! The wheel holds `python/onnxruntime_mlx` and the plugin library (release build, or the debug
//! one with `--debug`) at `onnxruntime_mlx/lib/`. Its metadata requires the MLX runtime wheel
//! of the platform (`mlx-cpu==0.32.2` on Linux, `mlx-cuda-13==0.32.2` with `--cuda`,
//! `mlx-metal==0.32.2` on macOS) and, following ORT's guidance for plugin EP packages, not
//! `onnxruntime` (the package checks the host ORT's version when it registers). The library's
//! run-time search path is set to the MLX runtime's `lib/` in the same site-packages
//! (`$ORIGIN/../../mlx/lib`, with patchelf), so no `LD_LIBRARY_PATH` is needed.

use crate::setup;
use crate::util::{self, Result, step};
use base64::Engine;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

const DIST: &str = "onnxruntime-mlx-ep";
const MLX_VERSION: &str = "0.32.2";

pub fn run(args: &[String]) -> Result {
    let (mut debug, mut cuda) = (false, false);
    for a in args {
        match a.as_str() {
            "--debug" => debug = true,
            "--cuda" => cuda = true,
            other => return Err(format!("wheel: unknown option `{other}`")),
        }
    }
    let path = build(debug, cuda)?;
    println!("{}", path.display());
    Ok(())
}

/// Builds the plugin and the wheel; returns the wheel's path.
pub fn build(debug: bool, cuda: bool) -> Result<PathBuf> {
    setup::ensure(None)?;
    let profile = if debug { "debug" } else { "release" };
    step(&format!("building the plugin ({profile})"));
    let mut cargo = util::cargo();
    cargo.args(["build", "-p", "onnxruntime-mlx-ep"]);
    if !debug {
        cargo.arg("--release");
    }
    util::run(&mut cargo)?;
    let version = env!("CARGO_PKG_VERSION");
    let package = util::root().join("python/onnxruntime_mlx");
    let init = std::fs::read_to_string(package.join("__init__.py")).map_err(|e| format!("reading the package: {e}"))?;
    if !init.contains(&format!("__version__ = \"{version}\"")) {
        return Err(format!("python/onnxruntime_mlx/__init__.py's __version__ is not the workspace version {version}"));
    }
    step("writing the wheel");
    let lib = relinked_library(&util::plugin_path(profile))?;
    let (tag, requirement) = platform(cuda)?;
    let out_dir = util::target_dir().join("wheels");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let name = DIST.replace('-', "_");
    let wheel = out_dir.join(format!("{name}-{version}-py3-none-{tag}.whl"));
    let dist_info = format!("{name}-{version}.dist-info");
    let mut files: Vec<(String, Vec<u8>, u32)> = Vec::new();
    for file in ["__init__.py", "py.typed"] {
        let data = std::fs::read(package.join(file)).map_err(|e| format!("reading {file}: {e}"))?;
        files.push((format!("onnxruntime_mlx/{file}"), data, 0o644));
    }
    let lib_data = std::fs::read(&lib).map_err(|e| format!("reading {}: {e}", lib.display()))?;
    files.push((format!("onnxruntime_mlx/lib/{}", util::plugin_file_name()), lib_data, 0o755));
    files.push((format!("{dist_info}/METADATA"), metadata(version, &requirement).into_bytes(), 0o644));
    files.push((
        format!("{dist_info}/WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: cargo xtask wheel\nRoot-Is-Purelib: false\nTag: py3-none-{tag}\n")
            .into_bytes(),
        0o644,
    ));
    files.push((format!("{dist_info}/top_level.txt"), b"onnxruntime_mlx\n".to_vec(), 0o644));
    let mut record = String::new();
    for (path, data, _) in &files {
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(data));
        record += &format!("{path},sha256={digest},{}\n", data.len());
    }
    record += &format!("{dist_info}/RECORD,,\n");
    files.push((format!("{dist_info}/RECORD"), record.into_bytes(), 0o644));
    write_zip(&wheel, &files)?;
    step("checking the wheel (check-wheel-contents)");
    util::run(Command::new(util::home().join("venv/bin/check-wheel-contents")).arg(&wheel))?;
    Ok(wheel)
}

/// A copy of the plugin whose run-time search path is the MLX runtime's `lib/` next to the
/// package in site-packages.
fn relinked_library(built: &Path) -> Result<PathBuf> {
    let dir = util::target_dir().join("wheels/build");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let copy = dir.join(util::plugin_file_name());
    std::fs::copy(built, &copy).map_err(|e| format!("copying {}: {e}", built.display()))?;
    if cfg!(target_os = "linux") {
        util::run(
            Command::new(util::home().join("venv/bin/patchelf"))
                .args(["--set-rpath", "$ORIGIN/../../mlx/lib"])
                .arg(&copy),
        )?;
    } else if cfg!(target_os = "macos") {
        util::run(Command::new("install_name_tool").args(["-add_rpath", "@loader_path/../../mlx/lib"]).arg(&copy))?;
    }
    Ok(copy)
}

/// The wheel's platform tag and the MLX runtime it requires.
fn platform(cuda: bool) -> Result<(String, String)> {
    let arch = std::env::consts::ARCH;
    if cfg!(target_os = "linux") {
        let runtime = if cuda { "mlx-cuda-13" } else { "mlx-cpu" };
        Ok((format!("linux_{arch}"), format!("{runtime}=={MLX_VERSION}")))
    } else if cfg!(target_os = "macos") {
        let arch = if arch == "aarch64" { "arm64" } else { arch };
        Ok((format!("macosx_11_0_{arch}"), format!("mlx-metal=={MLX_VERSION}")))
    } else {
        Err("wheels are built for Linux and macOS".into())
    }
}

fn metadata(version: &str, requirement: &str) -> String {
    format!(
        "Metadata-Version: 2.1\n\
         Name: {DIST}\n\
         Version: {version}\n\
         Summary: The MLX execution provider for ONNX Runtime (a plugin EP library)\n\
         License: MIT OR Apache-2.0\n\
         Requires-Python: >=3.9\n\
         Requires-Dist: {requirement}\n\
         Description-Content-Type: text/markdown\n\
         \n\
         Runs ONNX models on MLX through ONNX Runtime 1.31 or newer (install `onnxruntime`, or \
         another ONNX Runtime build, yourself):\n\
         \n\
         ```python\n\
         import onnxruntime as ort\n\
         import onnxruntime_mlx\n\
         \n\
         session = ort.InferenceSession(\"model.onnx\", onnxruntime_mlx.session_options())\n\
         ```\n"
    )
}

fn write_zip(path: &Path, files: &[(String, Vec<u8>, u32)]) -> Result {
    let file = std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let mut zip = zip::ZipWriter::new(file);
    for (name, data, mode) in files {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(*mode);
        zip.start_file(name.as_str(), options).map_err(|e| format!("{name}: {e}"))?;
        zip.write_all(data).map_err(|e| format!("{name}: {e}"))?;
    }
    zip.finish().map_err(|e| format!("finishing {}: {e}", path.display()))?;
    Ok(())
}
