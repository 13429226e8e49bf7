//! `cargo xtask conformance [--cases N] [--op NAME] [--seed S] [--json PATH] [--replay DIR]
//! [--node-tests] [--update-passing]`.
//!
//! The property suite (`mlx-ep-conformance`: every lowering's spec, `N` generated cases each,
//! differentially against ORT's CPU EP) and, with `--node-tests`, the ONNX backend node tests and
//! model suites (`python/node_suite.py`), which regenerate `docs/CONFORMANCE.md`. `--json PATH`
//! writes one object with the lists `property` and `node_tests`. `--update-passing` rewrites the
//! committed list of passing node tests that `cargo xtask test` holds the EP to.

use crate::setup;
use crate::util::{self, Result, step};
use std::process::Command;

pub const PASSING_LIST: &str = "crates/conformance/node-tests-passing.txt";

/// Cases per spec in CI (`cargo xtask test`).
pub const CI_CASES: u32 = 24;

pub fn run(args: &[String]) -> Result {
    let (mut node_tests, mut update) = (false, false);
    let (mut json, mut suite_args) = (None, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("conformance: {a} needs a value"));
        match a.as_str() {
            "--node-tests" => node_tests = true,
            "--update-passing" => update = true,
            "--json" => json = Some(value()?),
            "--cases" | "--op" | "--seed" | "--replay" => {
                let v = value()?;
                suite_args.extend([a.clone(), v]);
            }
            other => return Err(format!("conformance: unknown option `{other}`")),
        }
    }
    if update && !node_tests {
        return Err("--update-passing needs --node-tests".into());
    }
    setup::ensure(None)?;
    util::run(util::cargo().args(["build", "-p", "onnxruntime-mlx-ep"]))?;
    let property_json = util::target_dir().join("conformance/property.json");
    std::fs::create_dir_all(util::target_dir().join("conformance")).map_err(|e| e.to_string())?;
    let replay = suite_args.iter().any(|a| a == "--replay");
    if !replay {
        suite_args.extend(["--json".to_string(), property_json.display().to_string()]);
    }
    let property = property_suite(&suite_args);
    if replay {
        return property;
    }
    if node_tests {
        let root = util::root();
        let mut extra = vec![
            "--report".to_string(),
            root.join("docs/CONFORMANCE.md").display().to_string(),
            "--property-json".to_string(),
            property_json.display().to_string(),
        ];
        let list = root.join(PASSING_LIST).display().to_string();
        extra.extend([if update { "--passing" } else { "--check-passing" }.to_string(), list]);
        node_suite(&extra)?;
    }
    if let Some(path) = json {
        write_json(&path, &property_json, node_tests)?;
        println!("wrote {path}");
    }
    property
}

/// Runs `mlx-ep-conformance` (the property suite) against the debug plugin.
pub fn property_suite(args: &[String]) -> Result {
    step("property suite (mlx-ep-conformance)");
    util::run(
        util::cargo()
            .args(["run", "-q", "-p", "conformance", "--bin", "mlx-ep-conformance", "--"])
            .args(args)
            .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
    )
}

/// One object: `property` (per op and dtype) and `node_tests` (per ONNX node or model test,
/// with `test`, `claimed` and `result`; tests ORT itself cannot load are left out).
fn write_json(path: &str, property_json: &std::path::Path, node_tests: bool) -> Result {
    let read = |p: &std::path::Path| -> Result<serde_json::Value> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
    };
    let property = read(property_json)?.get("property").cloned().unwrap_or_default();
    let mut tests = Vec::new();
    if node_tests {
        let records = read(&util::target_dir().join("conformance/node-tests.json"))?;
        for r in records.as_array().into_iter().flatten() {
            if r["result"] == "skipped" {
                continue;
            }
            let mut t = serde_json::json!({ "test": r["test"], "claimed": r["claimed"], "result": r["result"] });
            for extra in ["op", "domain", "suite", "cpu"] {
                if let Some(v) = r.get(extra) {
                    t[extra] = v.clone();
                }
            }
            tests.push(t);
        }
    }
    let out = serde_json::json!({ "property": property, "node_tests": tests });
    std::fs::write(path, serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?)
        .map_err(|e| format!("writing {path}: {e}"))
}

/// Runs the ONNX node-test suite with the debug plugin; `extra` are node_suite.py options.
pub fn node_suite(extra: &[String]) -> Result {
    step("ONNX backend node tests and model suites (python/node_suite.py)");
    let out = util::target_dir().join("conformance");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    util::run(
        Command::new(util::venv_python())
            .arg(util::root().join("python/node_suite.py"))
            .arg("--out-json")
            .arg(out.join("node-tests.json"))
            .arg("--data-dir")
            .arg(util::target_dir().join("onnx-node-tests"))
            .args(extra)
            .current_dir(util::root())
            .env("ORT_MLX_EP_LIB", util::plugin_path("debug")),
    )
}
