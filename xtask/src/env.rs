//! `cargo xtask env`: `export` lines for using the built plugin from a shell or from Python.

use crate::util::{self, Result};

pub fn run(args: &[String]) -> Result {
    let profile = match args.first().map(String::as_str) {
        None | Some("--release") => "release",
        Some("--debug") => "debug",
        Some(other) => {
            return Err(format!("env: unknown option `{other}` (use --release or --debug)"));
        }
    };
    let plugin = util::plugin_path(profile);
    if !plugin.exists() {
        eprintln!("# note: {} is not built yet (cargo xtask demo builds it)", plugin.display());
    }
    let ort = std::fs::canonicalize(util::home().join("lib/libonnxruntime.so"))
        .map_err(|_| "ONNX Runtime is not set up yet: run `cargo xtask setup`".to_string())?;
    println!("export ORT_MLX_EP_LIB={}", plugin.display());
    println!("export ORT_DYLIB_PATH={}", ort.display());
    println!("export ORT_MLX_PYTHON={}", util::venv_python().display());
    Ok(())
}
