//! Compiles mlx-c (MLX's C API) from source against an MLX runtime and generates its bindings.
//!
//! Inputs, in order of precedence:
//! - `MLX_PREFIX`: an MLX installation with `include/mlx/` and `lib/libmlx.{so,dylib}`;
//!   otherwise `$ORT_MLX_HOME/mlx`, the wheel that `cargo xtask setup` installed.
//! - `MLX_C_DIR`: an mlx-c source tree (holding `mlx/c/*.cpp`); otherwise `$ORT_MLX_HOME/mlx-c`,
//!   copied by `cargo xtask setup` from the crates.io packaging of mlx-c.
//! - `LIBCLANG_PATH`: for bindgen; `.cargo/config.toml` points it at the `libclang` wheel.
//!
//! Outputs: a static `mlxc` library, `bindings.rs`, a link to `libmlx`, and the `lib_dir`
//! metadata (`DEP_MLX_LIB_DIR`) that dependents use for their run-time search path.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    for var in ["MLX_PREFIX", "MLX_C_DIR", "ORT_MLX_HOME", "LIBCLANG_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=shim/format_compat.h");

    let home = env::var_os("ORT_MLX_HOME").map(PathBuf::from);
    let prefix = locate("MLX_PREFIX", home.as_deref().map(|h| h.join("mlx")), "include/mlx/mlx.h");
    let mlx_c = locate("MLX_C_DIR", home.as_deref().map(|h| h.join("mlx-c")), "mlx/c/mlx.h");
    let lib_dir = prefix.join("lib");

    let mut sources: Vec<PathBuf> = std::fs::read_dir(mlx_c.join("mlx/c"))
        .expect("reading mlx-c sources")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
        .collect();
    sources.sort();
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }

    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("shim/format_compat.h");
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .pic(true)
        .warnings(false)
        .include(&mlx_c)
        .include(prefix.join("include"))
        .flag("-include")
        .flag(shim.to_str().expect("utf-8 path"))
        .files(&sources)
        .compile("mlxc");

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:lib_dir={}", lib_dir.display());

    let mut builder = bindgen::Builder::default()
        .header(mlx_c.join("mlx/c/mlx.h").to_str().expect("utf-8 path"))
        .clang_arg(format!("-I{}", mlx_c.display()))
        .allowlist_function("_?mlx_.*")
        .allowlist_type("mlx_.*")
        .allowlist_var("MLX_.*")
        .default_enum_style(bindgen::EnumVariation::Rust { non_exhaustive: false })
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    // A libclang without its resource directory (the PyPI wheel) cannot find <stddef.h>;
    // the C compiler's own builtin headers serve as well.
    if let Some(dir) = compiler_include_dir() {
        builder = builder.clang_arg(format!("-idirafter{}", dir.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        panic!(
            "bindgen failed on mlx-c's headers: {e}\n\
             (bindgen needs libclang: run `cargo xtask setup`, or set LIBCLANG_PATH)"
        )
    });
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("writing bindings.rs");
}

/// `var` if set, else `fallback`; either must contain `marker`, or the build stops with a
/// message that says how to fix it.
fn locate(var: &str, fallback: Option<PathBuf>, marker: &str) -> PathBuf {
    let (dir, origin) = match env::var_os(var) {
        Some(v) => (PathBuf::from(v), format!("${var}")),
        None => match fallback {
            Some(f) => (f.clone(), format!("{} (set up by `cargo xtask setup`)", f.display())),
            None => panic!("neither {var} nor ORT_MLX_HOME is set: run `cargo xtask setup` or set {var}"),
        },
    };
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    if !dir.join(marker).exists() {
        panic!("{origin} = {} has no {marker}: run `cargo xtask setup`, or point {var} at a valid tree", dir.display());
    }
    dir
}

fn compiler_include_dir() -> Option<PathBuf> {
    let cc = cc::Build::new().get_compiler();
    let out = cc.to_command().arg("-print-file-name=include").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.join("stddef.h").exists().then_some(dir)
}
