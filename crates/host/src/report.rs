//! Runs one model on the CPU EP and on the MLX EP and reports: which nodes each EP ran (from
//! ORT's assignment info), median latency of each, and the largest output differences.

use crate::values::{self, HostTensor};
use crate::{Assignment, CPU_EP, Ep, MLX_EP, Result, assignment, session_builder};
use ort::editor::Model;
use ort::session::Session;
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

/// Where a model comes from: a file, or a builder run once per session.
pub enum Source {
    File(PathBuf),
    Built { name: String, build: Box<dyn Fn() -> Result<Model>> },
}

impl Source {
    pub fn name(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Built { name, .. } => format!("{name} (built in memory)"),
        }
    }

    pub fn session(&self, ep: Ep) -> Result<Session> {
        let builder = session_builder(ep)?;
        match self {
            Source::File(p) => Ok(builder.clone().commit_from_file(p)?),
            Source::Built { build, .. } => Ok(build()?.into_session(&builder)?),
        }
    }
}

pub struct Options {
    pub repeat: usize,
    pub dims: HashMap<String, i64>,
    pub seed: u64,
    /// Also time the MLX EP with every input and output in its device memory (IOBinding).
    pub device_io: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { repeat: 20, dims: HashMap::new(), seed: 7, device_io: false }
    }
}

/// One EP's run of the model.
pub struct EpRun {
    pub ep: Ep,
    pub assignment: Vec<Assignment>,
    /// Session creation (graph partitioning, lowering, weights upload).
    pub session_ms: f64,
    /// The first run: on MLX it builds and, with compilation on, compiles the graph.
    pub first_run_ms: f64,
    pub median_ms: f64,
    /// With `--io device`: the median with inputs and outputs in the EP's device memory, and
    /// the largest difference of those outputs (copied back) from the host-bound run's.
    pub device_io: Option<(f64, f64)>,
    pub outputs: Vec<HostTensor>,
}

pub struct OutputDiff {
    pub name: String,
    pub shape: Vec<i64>,
    pub elem_type: String,
    pub max_abs: f64,
    pub max_rel: f64,
    pub within_tolerance: bool,
}

/// A model input as generated: name, element type, shape.
pub type InputDesc = (String, String, Vec<i64>);

pub struct Report {
    pub model: String,
    pub inputs: Vec<InputDesc>,
    pub cpu: EpRun,
    pub mlx: EpRun,
    pub diffs: Vec<OutputDiff>,
}

impl Report {
    pub fn within_tolerance(&self) -> bool {
        self.diffs.iter().all(|d| d.within_tolerance)
    }
}

/// Per-dtype tolerance: |mlx - cpu| <= atol + rtol * |cpu|, elementwise.
fn tolerance(elem_type: ort::value::TensorElementType) -> (f64, f64) {
    use ort::value::TensorElementType as T;
    match elem_type {
        T::Float32 => (1e-5, 1e-4),
        T::Float16 | T::Bfloat16 => (1e-3, 1e-2),
        T::Float64 => (1e-10, 1e-9),
        _ => (0.0, 0.0),
    }
}

fn within(a: &HostTensor, b: &HostTensor) -> bool {
    let (atol, rtol) = tolerance(a.elem_type);
    a.values.iter().zip(&b.values).all(|(&x, &y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= atol + rtol * y.abs())
}

fn run_on(source: &Source, ep: Ep, opts: &Options) -> Result<(EpRun, Vec<InputDesc>)> {
    let created = Instant::now();
    let mut session = source.session(ep)?;
    let session_ms = created.elapsed().as_secs_f64() * 1e3;
    let assignment = assignment(&session)?;
    let inputs = values::random_inputs(&session, &opts.dims, opts.seed)?;
    let described = inputs
        .iter()
        .map(|(n, v)| {
            let (ty, shape) = match v.dtype() {
                ort::value::ValueType::Tensor { ty, shape, .. } => (format!("{ty:?}"), shape.to_vec()),
                other => (format!("{other:?}"), Vec::new()),
            };
            (n.clone(), ty, shape)
        })
        .collect();
    // The first run includes one-time work (graph building, kernel compilation): reported
    // apart from the steady state.
    let first = Instant::now();
    let outputs = values::run(&mut session, &inputs)?;
    let first_run_ms = first.elapsed().as_secs_f64() * 1e3;
    let median_ms = median_ms(opts.repeat, || values::run(&mut session, &inputs).map(drop))?;
    let device_io = if opts.device_io && ep == Ep::Mlx {
        Some(run_device_io(&mut session, &inputs, &outputs, opts.repeat)?)
    } else {
        None
    };
    Ok((EpRun { ep, assignment, session_ms, first_run_ms, median_ms, device_io, outputs }, described))
}

/// Runs `session` with its inputs copied once into the MLX EP's device memory and its outputs
/// bound there (IOBinding), as an application keeping tensors on the GPU does; returns the
/// median run time and the largest difference of the outputs (copied back) from `expected`.
fn run_device_io(
    session: &mut Session,
    inputs: &[(String, ort::value::DynValue)],
    expected: &[HostTensor],
    repeat: usize,
) -> Result<(f64, f64)> {
    let env = crate::environment()?;
    let device = env.devices().find(|d| d.ep().is_ok_and(|n| n == MLX_EP)).ok_or("the MLX EP offers no device")?;
    let on_device = |ty, shape: &[i64]| {
        crate::ort_raw::device_tensor(env, &device, ty, shape).map_err(|e| {
            format!("{e} (--io device needs the EP's own memory: a GPU, or ONNXRUNTIME_EP_MLX_DEVICE_MEMORY=1 on the CPU backend)")
        })
    };
    let mut device_inputs = Vec::with_capacity(inputs.len());
    for (name, v) in inputs {
        let ort::value::ValueType::Tensor { ty, shape, .. } = v.dtype() else {
            return Err(format!("input '{name}' is not a tensor").into());
        };
        let d = on_device(*ty, shape)?;
        crate::ort_raw::copy_tensors(env, &[v], &[&d])?;
        device_inputs.push((name, d));
    }
    let mut device_outputs = Vec::with_capacity(expected.len());
    for e in expected {
        device_outputs.push((e.name.clone(), on_device(e.elem_type, &e.shape)?));
    }
    let mut binding = session.create_binding()?;
    for (name, d) in &device_inputs {
        binding.bind_input(name.as_str(), d)?;
    }
    for (name, d) in device_outputs.iter_mut() {
        binding.bind_output(name.as_str(), d)?;
    }
    session.run_binding(&binding)?;
    let ms = median_ms(repeat, || session.run_binding(&binding).map(drop).map_err(Into::into))?;
    let mut max_diff = 0f64;
    for (e, (_, d)) in expected.iter().zip(&device_outputs) {
        let host = values::tensor_from_f64(e.elem_type, &e.shape, &vec![0.0; e.values.len()])?;
        crate::ort_raw::copy_tensors(env, &[d], &[&host])?;
        let back = values::run_output(&e.name, &host)?;
        max_diff = max_diff.max(values::compare(&back, e)?.0);
    }
    Ok((ms, max_diff))
}

/// The median wall time of `repeat` (at least one) calls of `run`, in milliseconds.
fn median_ms(repeat: usize, mut run: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut times = Vec::with_capacity(repeat.max(1));
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        run()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Runs the model on both EPs and compares them.
pub fn compare_eps(source: &Source, opts: &Options) -> Result<Report> {
    let (cpu, inputs) = run_on(source, Ep::Cpu, opts)?;
    let (mlx, _) = run_on(source, Ep::Mlx, opts)?;
    let mut diffs = Vec::new();
    for (m, c) in mlx.outputs.iter().zip(&cpu.outputs) {
        let (max_abs, max_rel) = values::compare(m, c)?;
        diffs.push(OutputDiff {
            name: m.name.clone(),
            shape: m.shape.clone(),
            elem_type: format!("{:?}", m.elem_type),
            max_abs,
            max_rel,
            within_tolerance: within(m, c),
        });
    }
    Ok(Report { model: source.name(), inputs, cpu, mlx, diffs })
}

/// Per EP in order of appearance: its subgraphs, each a list of "name (op)".
fn nodes_by_ep(run: &EpRun) -> Vec<(String, Vec<Vec<String>>)> {
    let mut out: Vec<(String, Vec<Vec<String>>)> = Vec::new();
    for a in &run.assignment {
        let nodes = a.nodes.iter().map(|n| format!("{} ({})", n.name, n.op_type)).collect();
        match out.iter_mut().find(|(ep, _)| *ep == a.ep) {
            Some((_, groups)) => groups.push(nodes),
            None => out.push((a.ep.clone(), vec![nodes])),
        }
    }
    out
}

pub fn print(report: &Report) {
    println!("model: {}", report.model);
    for (name, ty, shape) in &report.inputs {
        println!("  input {name}: {ty} {shape:?}");
    }
    let total: usize = report.mlx.assignment.iter().map(|a| a.nodes.len()).sum();
    println!("\nnode assignment with the MLX EP ({total} nodes after ORT's graph optimizations):");
    for (ep, groups) in nodes_by_ep(&report.mlx) {
        let count: usize = groups.iter().map(Vec::len).sum();
        if ep == MLX_EP {
            println!("  {ep}: {count} node(s) in {} partition(s)", groups.len());
            for (i, g) in groups.iter().enumerate() {
                // Long partitions are shown by their first nodes (the JSON report lists all).
                let shown = g.iter().take(12).cloned().collect::<Vec<_>>().join(", ");
                let more = if g.len() > 12 { format!(", ... ({} more)", g.len() - 12) } else { String::new() };
                println!("    partition {}: {shown}{more}", i + 1);
            }
        } else {
            println!("  {ep}: {count} node(s)");
            for n in groups.iter().flatten() {
                println!("    {n}");
            }
        }
    }
    if !report.mlx.assignment.iter().any(|a| a.ep == CPU_EP) {
        println!("  {CPU_EP}: 0 nodes");
    }
    println!("\nsession creation and first run (one-time work):");
    for r in [&report.cpu, &report.mlx] {
        println!("  {}: session {:.1} ms, first run {:.1} ms", r.ep.label(), r.session_ms, r.first_run_ms);
    }
    println!("\nlatency (median of repeated runs, after one warm-up run):");
    println!("  {CPU_EP}: {:.3} ms", report.cpu.median_ms);
    println!(
        "  {MLX_EP}: {:.3} ms  ({:.2}x the CPU EP's time)",
        report.mlx.median_ms,
        report.mlx.median_ms / report.cpu.median_ms
    );
    if let Some((ms, diff)) = report.mlx.device_io {
        println!(
            "  {MLX_EP}, inputs and outputs in its device memory: {ms:.3} ms  ({:.2}x the CPU EP's time; outputs differ from the host-bound run's by at most {diff:.3e})",
            ms / report.cpu.median_ms
        );
    }
    println!("\noutputs, MLX EP vs CPU EP:");
    for d in &report.diffs {
        println!(
            "  {} {} {:?}: max abs diff {:.3e}, max rel diff {:.3e}: {}",
            d.name,
            d.elem_type,
            d.shape,
            d.max_abs,
            d.max_rel,
            if d.within_tolerance { "within tolerance" } else { "OUTSIDE TOLERANCE" }
        );
    }
}

pub fn to_json(report: &Report) -> serde_json::Value {
    let run = |r: &EpRun| {
        json!({
            "ep": r.ep.label(),
            "median_ms": r.median_ms,
            "session_ms": r.session_ms,
            "first_run_ms": r.first_run_ms,
            "device_io_median_ms": r.device_io.map(|(ms, _)| ms),
            "device_io_max_abs_diff": r.device_io.map(|(_, d)| d),
            "assignment": r.assignment.iter().map(|a| json!({
                "ep": a.ep,
                "nodes": a.nodes.iter().map(|n| json!({"name": n.name, "domain": n.domain, "op_type": n.op_type})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    };
    json!({
        "model": report.model,
        "inputs": report.inputs.iter().map(|(n, t, s)| json!({"name": n, "type": t, "shape": s})).collect::<Vec<_>>(),
        "cpu": run(&report.cpu),
        "mlx": run(&report.mlx),
        "mlx_over_cpu_latency": report.mlx.median_ms / report.cpu.median_ms,
        "outputs": report.diffs.iter().map(|d| json!({
            "name": d.name, "type": d.elem_type, "shape": d.shape,
            "max_abs_diff": d.max_abs, "max_rel_diff": d.max_rel, "within_tolerance": d.within_tolerance,
        })).collect::<Vec<_>>(),
    })
}
