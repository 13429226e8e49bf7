//! Paths and process helpers shared by the subcommands.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

pub type Result<T = ()> = std::result::Result<T, String>;

/// The workspace root (the parent of this crate's manifest directory).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// `target/mlx-ep`: everything `setup` creates (venv, links to the wheels' libraries, mlx-c).
pub fn home() -> PathBuf {
    std::env::var_os("ORT_MLX_HOME").map(PathBuf::from).unwrap_or_else(|| root().join("target/mlx-ep"))
}

pub fn venv_python() -> PathBuf {
    home().join("venv/bin/python")
}

/// The cargo that runs us (`$CARGO`), never a bare `cargo` from PATH.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    if NO_INCREMENTAL.load(Ordering::Relaxed) && std::env::var_os("CARGO_INCREMENTAL").is_none() {
        c.env("CARGO_INCREMENTAL", "0");
    }
    c
}

static NO_INCREMENTAL: AtomicBool = AtomicBool::new(false);

/// Every later `cargo` this process starts builds without incremental state (unless the
/// caller set `CARGO_INCREMENTAL`): `cargo xtask test` builds each crate once, and the
/// incremental caches would take gigabytes of a CI machine's disk for nothing.
pub fn build_without_incremental() {
    NO_INCREMENTAL.store(true, Ordering::Relaxed);
}

/// Runs a command, failing with its command line when it does not exit 0.
pub fn run(cmd: &mut Command) -> Result {
    let status = cmd.status().map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed with {status}")) }
}

/// Runs a command and returns its standard output.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed with {}:\n{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn step(msg: &str) {
    eprintln!("==> {msg}");
}

/// File name of the plugin library on this platform.
pub fn plugin_file_name() -> &'static str {
    if cfg!(target_os = "macos") { "libonnxruntime_mlx_ep.dylib" } else { "libonnxruntime_mlx_ep.so" }
}

/// Path of the built plugin for a cargo profile directory (`debug` or `release`).
pub fn plugin_path(profile: &str) -> PathBuf {
    target_dir().join(profile).join(plugin_file_name())
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}
