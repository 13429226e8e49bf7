//! `mlx-ep-bench native --preset P [--prompt N] [--steps N] [--mode eager|compiled] [--json PATH]`:
//! greedy generation (twice: the first one warms up) of a generated decoder written directly against MLX (the floor the EP is
//! measured against); `cargo xtask bench` checks its greedy tokens against ORT's CPU EP's.

use mlx_ep_bench::native::{Mode, NativeDecoder};
use mlx_ep_host::decoder::{self, DecoderConfig, DecoderWeights};
use std::process::ExitCode;

const USAGE: &str = "usage: mlx-ep-bench native [--preset tiny|small|qwen2.5-0.5b] [--prompt N] [--steps N] [--mode eager|compiled] [--json PATH]";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = args.split_first().ok_or(USAGE)?;
    if cmd != "native" {
        return Err(USAGE.into());
    }
    let (mut preset, mut prompt_len, mut steps, mut json) = ("tiny".to_owned(), 16usize, 32usize, None);
    let mut mode = Mode::Eager;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--preset" => preset = value()?.clone(),
            "--prompt" => prompt_len = value()?.parse()?,
            "--steps" => steps = value()?.parse()?,
            "--json" => json = Some(value()?.clone()),
            "--mode" => mode = Mode::parse(value()?)?,
            _ => return Err(format!("unexpected argument `{a}`\n{USAGE}").into()),
        }
    }
    let cfg = DecoderConfig::preset(&preset)?;
    let native = NativeDecoder::new(&cfg, &DecoderWeights::generate(&cfg, 1), mode)?;
    // A first generation compiles what MLX compiles on first use (on CUDA, its JIT kernels);
    // the figures are the second's, as for the EP.
    let prompt = decoder::prompt(&cfg, prompt_len);
    let first = std::time::Instant::now();
    let cold = native.generate(&prompt, steps)?;
    let first_ms = first.elapsed().as_secs_f64() * 1000.0;
    let g = native.generate(&prompt, steps)?;
    if g.tokens != cold.tokens {
        return Err("the second generation's tokens differ from the first's".into());
    }
    let traces = mlx_ep_bench::native::TRACES.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "native MLX '{}' ({}): prefill {:.2} ms, decode {:.3} ms/token ({:.1} tokens/s); {traces} trace(s) of the decode step; first generation {first_ms:.1} ms (prefill {:.1} ms)",
        cfg.name,
        mode.name(),
        g.prefill_ms,
        g.median_step_ms(),
        g.decode_tokens_per_s(),
        cold.prefill_ms
    );
    if let Some(path) = json {
        let v = serde_json::json!({
            "preset": cfg.name, "mode": mode.name(), "prompt_len": prompt_len, "steps": steps,
            "prefill_ms": g.prefill_ms, "decode_ms_per_token": g.median_step_ms(),
            "step_ms": g.step_ms, "tokens": g.tokens, "decode_traces": traces,
            "cold_total_ms": first_ms, "cold_prefill_ms": cold.prefill_ms,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
