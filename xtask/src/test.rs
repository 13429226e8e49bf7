//! `cargo xtask test`: everything CI runs, in order: setup, `cargo fmt --check` and clippy
//! with `-D warnings` (the workspace lints), a trimmed plugin build, the
//! workspace build, `cargo test --workspace`, the property suite at a bounded case count, the
//! ONNX node tests and model suites (no test on the committed passing list may fail), the
//! Python checks against the wheel's ORT (the plugin, the installed wheel, bad input,
//! concurrency, quantized transformers, the EP's memory as a device, soak and churn), and
//! the bounded bad-input fuzz run (`cargo xtask fuzz` without options).

use crate::setup;
use crate::util::{self, Result, step};
use std::process::Command;

pub fn run(args: &[String]) -> Result {
    if let Some(a) = args.first() {
        return Err(format!("test: unknown option `{a}`"));
    }
    util::build_without_incremental();
    setup::ensure(None)?;
    step("house rules: cargo fmt --check, cargo clippy -D warnings");
    util::run(util::cargo().args(["fmt", "--all", "--check"]))?;
    util::run(util::cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]))?;
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
    // The forms a GPU takes (MLX's fused one-query attention with the mask carried in the
    // head dimension, half-type RMS norms), checked here on the CPU, where they are otherwise
    // not taken; and the layer norms beside them, which must not take the RMS form; and
    // weights a DequantizeLinear hands a MatMul in MLX's quantized form.
    for (op, cases) in [
        ("GroupQueryAttention", "200"),
        ("SkipSimplifiedLayerNormalization", "60"),
        ("SimplifiedLayerNormalization", "60"),
        ("SkipLayerNormalization", "60"),
        ("LayerNormalization", "60"),
        ("DequantizeLinear", "100"),
        ("MoE", "60"),
    ] {
        step(&format!("{op} in the GPU's forms (ONNXRUNTIME_EP_MLX_TEST_GPU_FORMS=1)"));
        util::run(
            util::cargo()
                .args(["run", "-q", "-p", "conformance", "--bin", "mlx-ep-conformance", "--"])
                .args(["--op", op, "--cases", cases])
                .env("ORT_MLX_EP_LIB", util::plugin_path("debug"))
                .env("ONNXRUNTIME_EP_MLX_TEST_GPU_FORMS", "1"),
        )?;
    }
    crate::conformance::node_suite(&[
        "--check-passing".to_string(),
        util::root().join(crate::conformance::PASSING_LIST).display().to_string(),
    ])?;
    python_package()?;
    step("Python check (onnxruntime wheel + plugin)");
    util::run(
        Command::new(util::venv_python())
            .arg(util::root().join("python/check_plugin.py"))
            .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
    )?;
    for (what, script) in [
        ("Bad input: every case in a child process, errors as the CPU EP raises them", "check_bad_input.py"),
        ("Concurrent runs: one session on 4 threads, 4 sessions, churn", "check_concurrency.py"),
        ("The EP's memory as a device: allocator, data transfer, IOBinding, options", "check_device_memory.py"),
        ("Soak and churn: 10,000 runs, 100 session cycles, 50 shapes; memory flat", "check_soak.py"),
        ("Dynamically quantized T5/BERT models against the CPU EP", "check_quantized_models.py"),
        ("QDQ weights (8 and 4 bits) multiplied as MLX's quantized matmul", "check_qdq_weights.py"),
        ("float4e2m1 Q/DQ (no ORT CPU kernel) against the onnx reference evaluator", "check_float4_qdq.py"),
        (
            "Control flow: Scan, a VAD-shaped and an audio front-end model as one MLX partition each",
            "check_control_flow.py",
        ),
        (
            "ai.onnx.ml TreeEnsemble (tensor attributes): 150 random forests against the CPU EP",
            "check_tree_ensemble.py",
        ),
        (
            "com.microsoft SparseAttention: 60 cases against a numpy reference (checked against ORT's kernel)",
            "check_sparse_attention.py",
        ),
    ] {
        step(what);
        util::run(
            Command::new(util::venv_python())
                .arg(util::root().join("python").join(script))
                .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
        )?;
    }
    // Last, the bounded bad-input fuzz run (`cargo xtask fuzz`: 2000 cases at a fixed seed).
    crate::fuzz::bounded()
}

/// Builds the wheel (debug plugin), installs it with `onnxruntime==1.31.1` into a fresh venv,
/// and runs `python/check_wheel.py` there in a new process.
fn python_package() -> Result {
    let wheel = crate::wheel::build(true, false)?;
    step("Python package: a fresh venv with onnxruntime==1.31.1 and the wheel");
    let dir = util::target_dir().join("wheel-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let base = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    util::run(Command::new(&base).args(["-m", "venv"]).arg(dir.join("venv")))?;
    let python = dir.join("venv/bin/python");
    util::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "onnxruntime==1.31.1"])
            .arg(&wheel),
    )?;
    let model = dir.join("model.onnx");
    util::run(Command::new(util::venv_python()).arg(util::root().join("python/wheel_test_model.py")).arg(&model))?;
    step("Python package: register through onnxruntime_mlx and run a model");
    // The script runs from the test folder (a script's own folder comes first on sys.path, and
    // python/ holds the package's sources) in an environment that points nowhere into the tree.
    let script = dir.join("check_wheel.py");
    std::fs::copy(util::root().join("python/check_wheel.py"), &script)
        .map_err(|e| format!("copying check_wheel.py: {e}"))?;
    util::run(
        Command::new(&python)
            .arg(&script)
            .arg(&model)
            .current_dir(&dir)
            .env_remove("ORT_MLX_EP_LIB")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("PYTHONPATH"),
    )
}
