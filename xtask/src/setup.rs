//! `cargo xtask setup [--cuda]`: everything a plain `cargo build` / `cargo test` needs, under
//! `target/mlx-ep/` (see `.cargo/config.toml`):
//!
//! - `venv/`: a Python environment with the pinned wheels of `python/requirements.txt` and the
//!   MLX runtime wheel (`mlx-cpu`, `mlx-cuda-13` with `--cuda`, `mlx-metal` on macOS);
//! - `mlx` -> the MLX prefix (`include/`, `lib/libmlx`): the wheel's, or `$MLX_PREFIX` when set
//!   (your own MLX build); `crates/mlx-sys` compiles against it and binaries find libmlx there;
//! - `lib/libonnxruntime.so` -> ONNX Runtime's library from the wheel (`ORT_DYLIB_PATH`);
//! - `libclang` -> the `libclang` wheel's library directory, for bindgen (`LIBCLANG_PATH`);
//! - `mlx-c/`: mlx-c's sources, copied out of its crates.io packaging, which cargo downloads.
//!
//! Each step is skipped when its stamp says it is already done.

use crate::util::{self, Result, step};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The MLX version the vendored mlx-c (crates.io `mlx-sys` 0.7.0) was written against.
pub const MLX_VERSION: &str = "0.32.2";
const MLX_C_CRATE: &str = "mlx-sys";

pub fn run(args: &[String]) -> Result {
    let mut cuda = false;
    for a in args {
        match a.as_str() {
            "--cuda" => cuda = true,
            other => return Err(format!("setup: unknown option `{other}`")),
        }
    }
    ensure(Some(cuda))
}

/// Runs setup; quiet when everything is already in place. `cuda: None` keeps the MLX wheel
/// variant already installed (`setup --cuda` once, then `demo` and `test` stay on CUDA).
pub fn ensure(cuda: Option<bool>) -> Result {
    let home = util::home();
    let cuda = cuda.unwrap_or_else(|| {
        fs::read_to_string(home.join("venv/.xtask-requirements")).is_ok_and(|stamp| installed_is_cuda(&stamp))
    });
    fs::create_dir_all(home.join("lib")).map_err(|e| format!("creating {}: {e}", home.display()))?;
    python_env(&home, cuda)?;
    let site = site_packages()?;
    link_runtime_libraries(&home, &site)?;
    mlx_c_sources(&home)?;
    Ok(())
}

/// Whether a requirements stamp records the CUDA MLX wheel.
fn installed_is_cuda(stamp: &str) -> bool {
    stamp.lines().any(|l| l.trim().starts_with(&format!("mlx-cuda-13=={MLX_VERSION}")))
}

fn mlx_wheel(cuda: bool) -> String {
    let name = if cuda {
        "mlx-cuda-13"
    } else if cfg!(target_os = "macos") {
        "mlx-metal"
    } else {
        "mlx-cpu"
    };
    format!("{name}=={MLX_VERSION}")
}

fn python_env(home: &Path, cuda: bool) -> Result {
    let python = util::venv_python();
    if !python.exists() {
        let host_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        step(&format!("creating Python environment {} with {host_python}", home.join("venv").display()));
        util::run(Command::new(&host_python).args(["-m", "venv"]).arg(home.join("venv")))
            .map_err(|e| format!("{e}\n(setup needs Python 3 with the venv module; set PYTHON to choose one)"))?;
    }
    let requirements = util::root().join("python/requirements.txt");
    let wanted = format!(
        "{}\n{}\n",
        fs::read_to_string(&requirements).map_err(|e| format!("reading {}: {e}", requirements.display()))?,
        mlx_wheel(cuda)
    );
    let stamp = home.join("venv/.xtask-requirements");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(());
    }
    step(&format!("installing pinned wheels ({}) into the Python environment", mlx_wheel(cuda)));
    // The MLX wheels all provide the `mlx` package: drop the ones not wanted before installing.
    let others: Vec<&str> = ["mlx-cpu", "mlx-cuda-13", "mlx-cuda-12", "mlx-metal"]
        .into_iter()
        .filter(|n| !mlx_wheel(cuda).starts_with(&format!("{n}==")))
        .collect();
    util::output(Command::new(&python).args(["-m", "pip", "uninstall", "-y", "-q"]).args(&others))?;
    util::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", "-r"])
            .arg(&requirements)
            .arg(mlx_wheel(cuda)),
    )?;
    fs::write(&stamp, wanted).map_err(|e| format!("writing {}: {e}", stamp.display()))
}

fn site_packages() -> Result<PathBuf> {
    let out = util::output(
        Command::new(util::venv_python()).args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]),
    )?;
    Ok(PathBuf::from(out.trim()))
}

fn link_runtime_libraries(home: &Path, site: &Path) -> Result {
    // MLX_PREFIX (an MLX build of the user's own) wins over the wheel.
    let (mlx, origin) = match std::env::var_os("MLX_PREFIX") {
        Some(p) => (PathBuf::from(p), "MLX_PREFIX"),
        None => (site.join("mlx"), "the MLX wheel"),
    };
    if !mlx.join("include/mlx/mlx.h").exists() {
        return Err(format!("{origin} has no MLX headers at {}", mlx.join("include/mlx").display()));
    }
    relink(&mlx, &home.join("mlx"))?;

    let capi = site.join("onnxruntime/capi");
    let ort = fs::read_dir(&capi)
        .map_err(|e| format!("reading {}: {e}", capi.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            (name.starts_with("libonnxruntime.so.")
                || (name.starts_with("libonnxruntime.") && name.ends_with(".dylib")))
                && !name.contains("providers")
        })
        .ok_or_else(|| format!("no libonnxruntime in {}", capi.display()))?;
    relink(&ort, &home.join("lib/libonnxruntime.so"))?;

    let clang = site.join("clang/native");
    if clang.exists() {
        relink(&clang, &home.join("libclang"))?;
    }
    Ok(())
}

/// Points `link` at `target`, replacing whatever link was there.
fn relink(target: &Path, link: &Path) -> Result {
    if fs::read_link(link).ok().as_deref() == Some(target) {
        return Ok(());
    }
    let _ = fs::remove_file(link);
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| format!("linking {} -> {}: {e}", link.display(), target.display()))
}

fn mlx_c_sources(home: &Path) -> Result {
    let dest = home.join("mlx-c");
    let manifest = util::root().join("xtask/mlx-c-source/Cargo.toml");
    let stamp = dest.join(".xtask-source");
    if stamp.exists() && dest.join("mlx/c/mlx.h").exists() {
        return Ok(());
    }
    step("fetching mlx-c sources through cargo (crates.io package `mlx-sys` 0.7.0)");
    util::run(util::cargo().args(["fetch", "--quiet", "--manifest-path"]).arg(&manifest))?;
    let meta =
        util::output(util::cargo().args(["metadata", "--format-version", "1", "--manifest-path"]).arg(&manifest))?;
    let meta: serde_json::Value = serde_json::from_str(&meta).map_err(|e| format!("cargo metadata: {e}"))?;
    let pkg_manifest = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == MLX_C_CRATE))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata did not list the mlx-c packaging crate")?;
    let src = Path::new(pkg_manifest).parent().unwrap().join("src/mlx-c");
    if !src.join("mlx/c/mlx.h").exists() {
        return Err(format!("no mlx-c sources at {}", src.display()));
    }
    let _ = fs::remove_dir_all(&dest);
    copy_dir(&src.join("mlx"), &dest.join("mlx"))?;
    fs::copy(src.join("LICENSE"), dest.join("LICENSE")).map_err(|e| format!("copying mlx-c LICENSE: {e}"))?;
    fs::write(&stamp, src.display().to_string()).map_err(|e| e.to_string())
}

fn copy_dir(from: &Path, to: &Path) -> Result {
    fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    for entry in fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &dest)?;
        } else {
            fs::copy(&path, &dest).map_err(|e| format!("copying {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installed_wheel_variant_is_kept() {
        assert!(installed_is_cuda(&format!("onnxruntime==1.31.1\n{}\n", mlx_wheel(true))));
        assert!(!installed_is_cuda(&format!("onnxruntime==1.31.1\n{}\n", mlx_wheel(false))));
        assert!(!installed_is_cuda("# mlx-cuda-13==0.32.2 is mentioned in a comment only\n"));
    }
}
