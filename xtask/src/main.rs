//! Project tasks, run as `cargo xtask <command>`.
//!
//! One module per subcommand; shared path and process helpers live in `util`.

mod bench;
mod conformance;
mod demo;
mod env;
mod fuzz;
mod gpu;
mod setup;
mod soak;
mod test;
mod util;
mod wheel;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  setup [--cuda]        create target/mlx-ep: Python env with pinned ONNX Runtime and MLX
                        wheels, mlx-c sources fetched through cargo (idempotent)
  env                   print `export` lines for using the built plugin from your shell
  demo                  build the plugin (release); run an MLP and a generated int4 decoder
                        (prefill + 32 greedy steps) on the CPU EP and the MLX EP
  llm [--preset tiny|small|qwen2.5-0.5b] [--prompt N] [--steps N] [--json PATH]
                        greedy generation of a generated decoder on both EPs
  bench [--presets tiny,small] [--prompt N] [--steps N] [--rounds N] [--no-micro]
                        decode/prefill of the generated decoders on the CPU EP, the MLX EP and
                        native MLX, plus criterion micro cases; target/bench/results.json, decode.svg
  run MODEL.onnx [--repeat N] [--json PATH] [--dim NAME=VALUE]...
                        the same report for any model
  conformance [--cases N] [--op NAME] [--seed S] [--json PATH] [--node-tests] [--update-passing]
                        the property suite (every lowering's spec, N generated cases each, against
                        ORT's CPU EP); with --node-tests also the ONNX backend node tests and model
                        suites, regenerating docs/CONFORMANCE.md; --json writes both as one object
  conformance --replay DIR
                        re-runs a saved failing case (target/conformance/failures/...)
  fuzz [--cases N] [--seed S] [--op NAME] [--mutation NAME] [--jobs J] [--timeout SECONDS]
                        the bad-input fuzzer: valid cases from every spec, mutated (bad attributes,
                        shapes, values, types, absent inputs), each in a child process on the CPU EP
                        and the MLX EP; crashes, hangs, wrong answers and spurious errors fail
  fuzz --replay DIR     re-runs a saved fuzz failure (target/fuzz/failures/...)
  soak [--runs N] [--cycles N] [--shape-runs N] [--shapes N] [--tolerance F] [--short]
                        soak and churn: one session run 10,000 times, 100 session cycles, 2,000
                        runs over 50 shapes; RSS and MLX memory sampled, flat within 5%
  gpu-stage             the release plugin and runners, stripped, and the MLX CUDA runtime in
                        parts under target/gpu/ for a GPU machine; gpu/run.sh runs there
  wheel [--debug] [--cuda]
                        the Python package (onnxruntime-mlx-ep) as a wheel under target/wheels/
  test                  everything CI runs: setup, build, cargo test, the Python check, the
                        node tests held to crates/conformance/node-tests-passing.txt, and a
                        bounded fuzz run (fixed seed)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "setup" => setup::run(rest),
        "env" => env::run(rest),
        "demo" => demo::demo(rest),
        "run" => demo::run_model(rest),
        "llm" => demo::llm(rest),
        "bench" => bench::bench(rest),
        "test" => test::run(rest),
        "conformance" => conformance::run(rest),
        "fuzz" => fuzz::run(rest),
        "soak" => soak::run(rest),
        "wheel" => wheel::run(rest),
        "gpu-stage" => gpu::stage(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}
