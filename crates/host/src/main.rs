//! `mlx-ep-run`: the report behind `cargo xtask demo` and `cargo xtask run MODEL.onnx`.

use mlx_ep_host::report::{self, Options, Source};
use mlx_ep_host::{Result, decoder, models};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: mlx-ep-run demo [--repeat N] [--json PATH]
       mlx-ep-run llm [--preset tiny|small|qwen2.5-0.5b] [--layers N] [--kv growing|shared|device] [--prompt N] [--steps N] [--repeat N] [--json PATH]
       mlx-ep-run run MODEL.onnx [--repeat N] [--json PATH] [--dim NAME=VALUE]... [--io host|device]
The plugin is taken from $ORT_MLX_EP_LIB, ONNX Runtime from $ORT_DYLIB_PATH.";

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = args.split_first().ok_or(USAGE)?;
    let mut opts = Options::default();
    let mut json: Option<PathBuf> = None;
    let mut model: Option<PathBuf> = None;
    let (mut preset, mut prompt_len, mut steps) = ("tiny".to_owned(), 16usize, 32usize);
    let mut kv = decoder::KvStyle::Growing;
    let mut layers: Option<usize> = None;
    // llm: steady generations timed after the first (medians over them).
    let mut llm_repeat = 3usize;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--repeat" => {
                opts.repeat =
                    it.next().ok_or("--repeat needs a value")?.parse().map_err(|_| "--repeat needs a number")?;
                if opts.repeat < 1 {
                    return Err("--repeat needs at least 1".into());
                }
                llm_repeat = opts.repeat;
            }
            "--json" => json = Some(it.next().ok_or("--json needs a path")?.into()),
            "--dim" => {
                let spec = it.next().ok_or("--dim needs NAME=VALUE")?;
                let (k, v) = spec.split_once('=').ok_or("--dim needs NAME=VALUE")?;
                opts.dims
                    .insert(k.to_owned(), v.parse().map_err(|_| format!("--dim {spec}: value is not an integer"))?);
            }
            "--io" => {
                opts.device_io = match it.next().map(String::as_str) {
                    Some("host") => false,
                    Some("device") => true,
                    _ => return Err("--io takes host or device".into()),
                }
            }
            "--kv" => {
                kv = match it.next().map(String::as_str) {
                    Some("growing") => decoder::KvStyle::Growing,
                    Some("shared") => decoder::KvStyle::Shared,
                    Some("device") => decoder::KvStyle::Device,
                    _ => return Err("--kv takes growing, shared or device".into()),
                }
            }
            "--preset" => preset = it.next().ok_or("--preset needs a name")?.clone(),
            "--layers" => {
                let n: usize =
                    it.next().ok_or("--layers needs a count")?.parse().map_err(|_| "--layers needs a number")?;
                if n < 1 {
                    return Err("--layers needs at least 1".into());
                }
                layers = Some(n);
            }
            "--prompt" => {
                prompt_len =
                    it.next().ok_or("--prompt needs a length")?.parse().map_err(|_| "--prompt needs a number")?
            }
            "--steps" => {
                steps = it.next().ok_or("--steps needs a count")?.parse().map_err(|_| "--steps needs a number")?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(true);
            }
            other if cmd == "run" && model.is_none() && !other.starts_with('-') => model = Some(other.into()),
            other => return Err(format!("unexpected argument `{other}`\n{USAGE}").into()),
        }
    }
    if cmd == "llm" {
        let mut cfg = decoder::DecoderConfig::preset(&preset)?;
        if let Some(n) = layers {
            cfg.layers = n;
        }
        let report = decoder::compare_with(&cfg, prompt_len, steps, kv, llm_repeat)?;
        decoder::print(&report);
        if let Some(path) = json {
            std::fs::write(&path, serde_json::to_string_pretty(&decoder::to_json(&report))?)?;
            println!("\nwrote {}", path.display());
        }
        return Ok(report.within_bounds());
    }
    let source = match cmd.as_str() {
        "demo" => {
            opts.dims.entry("batch".into()).or_insert(64);
            Source::Built { name: "mlp 256-512-10".into(), build: Box::new(|| models::mlp(256, 512, 10)) }
        }
        "run" => {
            let path = model.ok_or("run needs a model path")?;
            if !path.exists() {
                return Err(format!("{} does not exist", path.display()).into());
            }
            Source::File(path)
        }
        _ => return Err(USAGE.into()),
    };
    let report = report::compare_eps(&source, &opts)?;
    report::print(&report);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report::to_json(&report))?)?;
        println!("\nwrote {}", path.display());
    }
    let mut ok = report.within_tolerance();
    if cmd == "demo" {
        // The LLM part of the demo: a generated genai-style int4 decoder, greedy, both EPs.
        println!();
        let llm = decoder::compare(&decoder::DecoderConfig::tiny(), prompt_len, steps)?;
        decoder::print(&llm);
        ok &= llm.within_bounds();
    }
    Ok(ok)
}
