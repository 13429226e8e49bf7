//! `cargo xtask bench`: the generated decoders on ORT's CPU EP, on the MLX EP and written
//! directly against MLX (the native floor), side by side in one run, plus the criterion micro
//! cases. Writes `target/bench/results.json` and `target/bench/decode.svg` and prints the
//! table the README shows.

use crate::setup;
use crate::util::{self, Result, step};
use serde_json::{Value, json};
use std::process::Command;

struct Options {
    presets: Vec<String>,
    prompt: usize,
    steps: usize,
    rounds: usize,
    micro: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        presets: vec!["tiny".into(), "small".into(), "small:shared".into()],
        prompt: 32,
        steps: 64,
        rounds: 5,
        micro: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--presets" => o.presets = value()?.split(',').map(str::to_owned).collect(),
            "--prompt" => o.prompt = value()?.parse().map_err(|_| "--prompt needs a number")?,
            "--steps" => o.steps = value()?.parse().map_err(|_| "--steps needs a number")?,
            "--rounds" => o.rounds = value()?.parse().map_err(|_| "--rounds needs a number")?,
            "--no-micro" => o.micro = false,
            other => {
                return Err(format!(
                    "unexpected argument `{other}`; usage: cargo xtask bench [--presets tiny,small,small:shared] [--prompt N] \
                     [--steps N] [--rounds N] [--no-micro]"
                ));
            }
        }
    }
    Ok(o)
}

/// The counter printed right before `label` in the EP's verbose session summary.
fn counter(summary: &str, label: &str) -> Result<f64> {
    let at = summary.find(label).ok_or_else(|| format!("no '{label}' in the session summary:\n{summary}"))?;
    let digits: String = summary[..at].trim_end().chars().rev().take_while(char::is_ascii_digit).collect();
    let digits: String = digits.chars().rev().collect();
    digits.parse::<f64>().map_err(|_| format!("no count before '{label}' in:\n{summary}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

fn read_json(path: &std::path::Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn write(path: &std::path::Path, text: &str) -> Result {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The release plugin, the runner (`mlx-ep-run`) and the native benchmark (`mlx-ep-bench`).
pub fn build_release() -> Result {
    util::run(util::cargo().args([
        "build",
        "--release",
        "-p",
        "onnxruntime-mlx-ep",
        "-p",
        "mlx-ep-host",
        "-p",
        "mlx-ep-bench",
    ]))
}

pub fn bench(args: &[String]) -> Result {
    let o = parse(args)?;
    setup::ensure(None)?;
    step("building the plugin, the runner and the benchmarks (release)");
    crate::bench::build_release()?;
    let out = util::target_dir().join("bench");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let plugin = util::plugin_path("release");
    let release = util::target_dir().join("release");
    let mut rows = Vec::new();
    for entry in &o.presets {
        let (preset, kv) = entry.split_once(':').unwrap_or((entry.as_str(), "growing"));
        step(&format!("decoder '{preset}' ({kv} KV): {} rounds of prompt {} + {} steps", o.rounds, o.prompt, o.steps));
        let (mut cpu, mut ep, mut native) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cpu_prefill, mut ep_prefill, mut native_prefill) = (Vec::new(), Vec::new(), Vec::new());
        let mut summary = String::new();
        let mut agreement = json!(null);
        for round in 0..o.rounds {
            let ep_json = out.join(format!("{preset}-{kv}-ep-{round}.json"));
            let common = ["--preset", preset, "--prompt", &o.prompt.to_string(), "--steps", &o.steps.to_string()];
            let run = Command::new(release.join("mlx-ep-run"))
                .arg("llm")
                .args(common)
                .args(["--kv", kv])
                .arg("--json")
                .arg(&ep_json)
                .env("ORT_MLX_EP_LIB", &plugin)
                .env("ONNXRUNTIME_EP_MLX_VERBOSE", "1")
                .output()
                .map_err(|e| format!("mlx-ep-run: {e}"))?;
            if !run.status.success() {
                return Err(format!(
                    "mlx-ep-run llm failed:\n{}{}",
                    String::from_utf8_lossy(&run.stdout),
                    String::from_utf8_lossy(&run.stderr)
                ));
            }
            summary = String::from_utf8_lossy(&run.stderr).into_owned();
            let native_json = out.join(format!("{preset}-native-{round}.json"));
            util::run(
                Command::new(release.join("mlx-ep-bench")).arg("native").args(common).arg("--json").arg(&native_json),
            )?;
            let (e, n) = (read_json(&ep_json)?, read_json(&native_json)?);
            let get = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(f64::NAN);
            cpu.push(get(&e, "/cpu/decode_ms_per_token"));
            ep.push(get(&e, "/mlx/decode_ms_per_token"));
            native.push(get(&n, "/decode_ms_per_token"));
            cpu_prefill.push(get(&e, "/cpu/prefill_ms"));
            ep_prefill.push(get(&e, "/mlx/prefill_ms"));
            native_prefill.push(get(&n, "/prefill_ms"));
            agreement = json!({
                "ep_vs_cpu_tokens": format!("{}/{}", e["agreeing_tokens"], e["steps"]),
                "native_vs_cpu_tokens_equal": n["tokens"] == e["cpu"]["tokens"],
                "max_logit_diff": e["max_logit_diff"],
            });
        }
        // `mlx-ep-run llm` runs two generations per session (the first compiles, the second
        // is timed): the session summary counts both.
        let runs = 2.0 * (o.steps + 1) as f64;
        let traces = counter(&summary, "traces")?;
        // Warm-up traces: the prefill's or the first decode step's (shape-keyed) and the decode
        // slot's; every other run should replay.
        let retraces = (traces - 2.0).max(0.0);
        let row = json!({
            "preset": preset,
            "kv": kv,
            "prompt": o.prompt,
            "steps": o.steps,
            "decode_ms_per_token": {"cpu_ep": median(cpu), "mlx_ep": median(ep.clone()), "native_mlx": median(native.clone())},
            "prefill_tokens_per_s": {
                "cpu_ep": o.prompt as f64 / median(cpu_prefill) * 1000.0,
                "mlx_ep": o.prompt as f64 / median(ep_prefill) * 1000.0,
                "native_mlx": o.prompt as f64 / median(native_prefill) * 1000.0,
            },
            "mlx_ep_vs_native": median(ep.clone()) / median(native.clone()),
            "evaluations_per_run": counter(&summary, "; bytes copied in")? / runs,
            "traces": traces,
            "retraces_after_warmup": retraces,
            "decode_slot_runs": counter(&summary, "in the decode slot")?,
            "bytes_copied_per_run": {
                "in": counter(&summary, ", out:")? / runs,
                "out": counter(&summary, " (inputs read in place")? / runs,
                "kv_rows_written_in_place": counter(&summary, " bytes of changed rows written")? / runs,
            },
            "input_bytes_read_in_place_per_run": counter(&summary, " bytes; unchanged")? / runs,
            "input_bytes_reused_per_run": counter(&summary, " bytes)\n")? / runs,
            "agreement": agreement,
            "rounds": o.rounds,
        });
        rows.push(row);
    }
    let mut micro = Vec::new();
    if o.micro {
        step("criterion micro cases (cargo bench -p mlx-ep-bench --bench micro)");
        util::run(
            util::cargo()
                .args(["bench", "-p", "mlx-ep-bench", "--bench", "micro", "--", "--warm-up-time", "1"])
                .args(["--measurement-time", "3"])
                .env("ORT_MLX_EP_LIB", &plugin),
        )?;
        for case in ["matmul_nbits_1x1024x1024", "gqa_decode_step_past256"] {
            let mut entry = json!({"case": case});
            for ep in ["CPUExecutionProvider", "MLXExecutionProvider"] {
                let path = util::target_dir().join("criterion").join(case).join(ep).join("new/estimates.json");
                let ns = read_json(&path)?.pointer("/mean/point_estimate").and_then(Value::as_f64).unwrap_or(f64::NAN);
                entry[ep] = json!(ns / 1000.0);
            }
            entry["mlx_ep_vs_cpu_ep"] = json!(
                entry["MLXExecutionProvider"].as_f64().unwrap_or(f64::NAN)
                    / entry["CPUExecutionProvider"].as_f64().unwrap_or(f64::NAN)
            );
            micro.push(entry);
        }
    }
    let results = json!({"device": "MLX default device of this machine", "decoders": rows, "micro_us": micro});
    write(&out.join("results.json"), &serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?)?;
    write(&out.join("decode.svg"), &chart(&rows))?;
    println!("\n{}", table(&rows, &micro));
    println!("wrote {} and {}", out.join("results.json").display(), out.join("decode.svg").display());
    Ok(())
}

fn f(v: &Value, p: &str) -> f64 {
    v.pointer(p).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// The markdown table the README shows.
fn table(rows: &[Value], micro: &[Value]) -> String {
    let mut s = String::from(
        "| decoder | decode ms/token: CPU EP | MLX EP | native MLX | MLX EP / native | MLX EP / CPU EP | prefill tok/s (CPU EP / MLX EP / native) | evals per run | retraces after warm-up | bytes in+out per run |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} ({} KV) | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.0} / {:.0} / {:.0} | {:.2} | {} | {:.0} |\n",
            r["preset"].as_str().unwrap_or("?"),
            r["kv"].as_str().unwrap_or("?"),
            f(r, "/decode_ms_per_token/cpu_ep"),
            f(r, "/decode_ms_per_token/mlx_ep"),
            f(r, "/decode_ms_per_token/native_mlx"),
            f(r, "/mlx_ep_vs_native"),
            f(r, "/decode_ms_per_token/mlx_ep") / f(r, "/decode_ms_per_token/cpu_ep"),
            f(r, "/prefill_tokens_per_s/cpu_ep"),
            f(r, "/prefill_tokens_per_s/mlx_ep"),
            f(r, "/prefill_tokens_per_s/native_mlx"),
            f(r, "/evaluations_per_run"),
            f(r, "/retraces_after_warmup"),
            f(r, "/bytes_copied_per_run/in") + f(r, "/bytes_copied_per_run/out"),
        );
    }
    if !micro.is_empty() {
        s += "\n| micro case (criterion mean) | CPU EP µs | MLX EP µs | MLX EP / CPU EP |\n|---|---|---|---|\n";
        for m in micro {
            s += &format!(
                "| {} | {:.1} | {:.1} | {:.1} |\n",
                m["case"].as_str().unwrap_or("?"),
                f(m, "/CPUExecutionProvider"),
                f(m, "/MLXExecutionProvider"),
                f(m, "/mlx_ep_vs_cpu_ep")
            );
        }
    }
    s
}

/// A grouped bar chart of decode ms/token per decoder (SVG, no dependencies).
fn chart(rows: &[Value]) -> String {
    let series =
        [("cpu_ep", "CPU EP", "#8c8c8c"), ("mlx_ep", "MLX EP", "#2f6fdf"), ("native_mlx", "native MLX", "#35a853")];
    let max = rows
        .iter()
        .flat_map(|r| series.iter().map(move |(k, _, _)| f(r, &format!("/decode_ms_per_token/{k}"))))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let (w, h, left, bottom) = (160.0 * rows.len().max(1) as f64 + 120.0, 320.0, 60.0, 40.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{left}\" y=\"18\">decode ms/token (lower is better)</text>\n"
    );
    for (i, r) in rows.iter().enumerate() {
        let x0 = left + 160.0 * i as f64;
        for (j, (k, _, color)) in series.iter().enumerate() {
            let v = f(r, &format!("/decode_ms_per_token/{k}"));
            let bh = if v.is_finite() { (h - bottom - 40.0) * v / max } else { 0.0 };
            let x = x0 + 40.0 * j as f64;
            let y = h - bottom - bh;
            s += &format!("<rect x=\"{x}\" y=\"{y:.1}\" width=\"34\" height=\"{bh:.1}\" fill=\"{color}\"/>\n");
            s += &format!("<text x=\"{x}\" y=\"{:.1}\">{v:.2}</text>\n", y - 4.0);
        }
        s += &format!(
            "<text x=\"{x0}\" y=\"{}\">{} ({})</text>\n",
            h - bottom + 18.0,
            r["preset"].as_str().unwrap_or("?"),
            r["kv"].as_str().unwrap_or("?")
        );
    }
    for (j, (_, label, color)) in series.iter().enumerate() {
        let y = 34.0 + 16.0 * j as f64;
        s += &format!(
            "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{label}</text>\n",
            w - 110.0,
            y - 9.0,
            w - 95.0,
            y
        );
    }
    s + "</svg>\n"
}
