//! The fuzzer's parent process (`mlx-ep-conformance --fuzz ...`): draws `cases` valid cases
//! round-robin over every spec (a shuffled op order per round, so a short run still spreads
//! over the ops; each op's draws and mutations depend only on the seed and the op, so adding
//! an op leaves the other ops' cases as they were), mutates each, runs each in a child process under a timeout and an address
//! space limit, counts the verdicts per op and per mutation, and saves failures under
//! `target/fuzz/failures/<op>-<mutation>-<hash>/` with the command that replays them.
//! The parent itself never loads ONNX Runtime or MLX.

use super::verdict::{self, Class, Exit, Verdict};
use super::{FuzzCase, mutate};
use crate::suite;
use conformance_spec::OpSpec;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Options {
    /// Cases in all (spread over the ops).
    pub cases: u64,
    pub seed: u64,
    /// Only this op (as `--op` of the property suite: the op type).
    pub op: Option<String>,
    /// Only this mutation (a name of [`mutate::MUTATIONS`]).
    pub mutation: Option<String>,
    /// Per case.
    pub timeout: Duration,
    /// Child processes at a time.
    pub jobs: usize,
    /// Address-space limit of a child in MiB (`ulimit -v`; 0: none).
    pub memory_mb: u64,
    pub failures_dir: PathBuf,
    /// Failures saved per (op, mutation, class); the rest are only counted.
    pub saved_per_group: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cases: 1000,
            seed: 0x6675_7a7a,
            op: None,
            mutation: None,
            timeout: Duration::from_secs(60),
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
            memory_mb: 4096,
            failures_dir: default_failures_dir(),
            saved_per_group: 3,
        }
    }
}

/// `target/fuzz/failures` of this workspace.
pub fn default_failures_dir() -> PathBuf {
    suite::default_failures_dir().parent().and_then(Path::parent).unwrap_or(Path::new("target")).join("fuzz/failures")
}

fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable 64-bit hash of an op's name (FNV-1a).
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Draws and mutates the run's cases (deterministic in the options' seed, op and mutation).
pub fn draw(opts: &Options) -> Vec<FuzzCase> {
    let specs: Vec<&'static OpSpec> =
        suite::specs_and_chains().into_iter().filter(|s| opts.op.as_deref().is_none_or(|op| op == s.op())).collect();
    let mut sources: Vec<_> = specs
        .iter()
        .map(|s| {
            let runner = TestRunner::new_with_rng(
                Config { failure_persistence: None, ..Config::default() },
                TestRng::from_seed(RngAlgorithm::ChaCha, &suite::seed_bytes(opts.seed, s.domain(), s.op())),
            );
            (suite::display_name(s.domain(), s.op()), (s.cases)(), runner)
        })
        .collect();
    // Each op's own stream: its place in a round and its mutations come from the seed and
    // its name, not from how many other ops there are.
    let keys: Vec<u64> = sources.iter().map(|(op, ..)| mix(opts.seed, name_hash(op))).collect();
    let mut out = Vec::new();
    let mut order: Vec<usize> = Vec::new();
    for i in 0..opts.cases {
        if sources.is_empty() {
            break;
        }
        let (k, round) = ((i % sources.len() as u64) as usize, i / sources.len() as u64);
        if k == 0 {
            order = (0..sources.len()).collect();
            order.sort_by_key(|&o| mix(keys[o], round));
        }
        let key = keys[order[k]];
        let (op, strategy, runner) = &mut sources[order[k]];
        let mut rng = fastrand::Rng::with_seed(mix(key, round));
        for _attempt in 0..8 {
            let drawn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| strategy.new_tree(runner)));
            let Ok(Ok(tree)) = drawn else { continue };
            let mut fc = FuzzCase::valid(op, tree.current());
            fc.index = i;
            fc.run_seed = opts.seed;
            fc.compile = rng.bool();
            // A mutation that panics is the fuzzer's defect: that draw is skipped, the run goes on.
            let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &opts.mutation {
                Some(name) => mutate::apply_named(&mut fc, name, &mut rng),
                None => mutate::apply(&mut fc, &mut rng),
            }))
            .unwrap_or(false);
            if applied {
                out.push(fc);
                break;
            }
        }
    }
    out
}

/// How a child ended, with its standard output and the tail of its standard error.
pub struct ChildRun {
    pub exit: Exit,
    pub stdout: String,
    pub stderr_tail: String,
    pub seconds: f64,
}

/// Runs this binary with `args` in a child process (the case on its standard input) under
/// the timeout and memory limit.
pub fn spawn(args: &[&str], stdin: &str, compile: bool, opts: &Options) -> std::io::Result<ChildRun> {
    let exe = std::env::current_exe()?;
    let mut cmd = if opts.memory_mb > 0 {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("ulimit -v \"$1\" 2>/dev/null; shift; exec \"$@\"")
            .arg("mlx-ep-fuzz-child")
            .arg((opts.memory_mb * 1024).to_string())
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.args(args)
        .env("ONNXRUNTIME_EP_MLX_COMPILE", if compile { "1" } else { "0" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let mut input = child.stdin.take();
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    if let Some(mut pipe) = input.take() {
        let _ = pipe.write_all(stdin.as_bytes());
    }
    let exit = loop {
        if let Some(status) = child.try_wait()? {
            break exit_of(status);
        }
        if started.elapsed() > opts.timeout {
            let _ = child.kill();
            let _ = child.wait();
            break Exit::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = out.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    let stderr = err.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    let mut cut = stderr.len().saturating_sub(2000);
    while !stderr.is_char_boundary(cut) {
        cut += 1;
    }
    let stderr_tail = stderr[cut..].to_owned();
    Ok(ChildRun { exit, stdout, stderr_tail, seconds: started.elapsed().as_secs_f64() })
}

fn reader(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return Exit::Signal(sig);
        }
    }
    Exit::Code(status.code().unwrap_or(-1))
}

/// Runs one case in a child and judges it. When the child died in a CPU EP stage, the case
/// runs again on the MLX EP alone: a crash or hang there is the MLX EP's, else the CPU EP's.
/// So does a death in teardown, after both EPs answered (a heap one of them corrupted is found
/// only when it is freed; a CPU kernel writing past its output does that).
pub fn run_case(fc: &FuzzCase, opts: &Options) -> (Verdict, ChildRun) {
    let json = serde_json::to_string(fc).unwrap_or_default();
    let run = match spawn(&["--fuzz-child", "-"], &json, fc.compile, opts) {
        Ok(run) => run,
        Err(e) => return not_started(e),
    };
    let v = verdict::judge(&run.exit, &run.stdout, &fc.node_names());
    let (stage, _) = verdict::parse_stdout(&run.stdout);
    let in_cpu = stage.as_deref().is_some_and(|s| s.starts_with("cpu") || s == "teardown");
    if !(in_cpu && matches!(v.class, Class::Crash | Class::Hang)) {
        let attributes = fc.case.nodes.first().map(|n| n.attributes.as_slice()).unwrap_or(&[]);
        return (verdict::excuse(v, &fc.op, &fc.mutation, attributes), run);
    }
    let alone = match spawn(&["--fuzz-child", "-", "--mlx-only"], &json, fc.compile, opts) {
        Ok(run) => run,
        Err(e) => return not_started(e),
    };
    let mlx = verdict::judge(&alone.exit, &alone.stdout, &fc.node_names());
    // Both sessions dying while being created, by the same signal, is ORT's own graph
    // checking (shape inference), which runs before any EP sees the graph.
    let (mlx_stage, _) = verdict::parse_stdout(&alone.stdout);
    let same_death = matches!((&run.exit, &alone.exit), (Exit::Signal(a), Exit::Signal(b)) if a == b);
    let both_sessions = stage.as_deref() == Some("cpu-session") && mlx_stage.as_deref() == Some("mlx-session");
    if same_death && both_sessions {
        let reason = format!("ORT died creating either session ({}), before any EP ran", v.reason);
        return (Verdict { class: Class::CpuCrash, reason }, run);
    }
    let declined = alone.stdout.lines().any(|l| l == super::child::NONE_ON_MLX_MARK);
    if matches!(mlx.class, Class::Crash | Class::Hang) && declined {
        let reason = format!(
            "the CPU EP {}; in the MLX EP's session too, which declined the node to the CPU EP",
            v.reason.replacen("in stage ", "in ", 1)
        );
        return (Verdict { class: Class::CpuCrash, reason }, run);
    }
    if matches!(mlx.class, Class::Crash | Class::Hang) {
        let reason = format!("MLX EP alone: {} (the CPU EP failed first: {})", mlx.reason, v.reason);
        return (Verdict { class: mlx.class, reason }, alone);
    }
    let seconds = run.seconds + alone.seconds;
    let reason = format!("the CPU EP {}; the MLX EP alone did not crash", v.reason.replacen("in stage ", "in ", 1));
    (Verdict { class: Class::CpuCrash, reason }, ChildRun { seconds, ..run })
}

fn not_started(e: std::io::Error) -> (Verdict, ChildRun) {
    (
        Verdict { class: Class::Invalid, reason: format!("could not start the child: {e}") },
        ChildRun { exit: Exit::Code(-1), stdout: String::new(), stderr_tail: String::new(), seconds: 0.0 },
    )
}

/// Counts of one row of the report.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub cases: u64,
    pub by_class: BTreeMap<Class, u64>,
}

impl Counts {
    fn add(&mut self, c: Class) {
        self.cases += 1;
        *self.by_class.entry(c).or_default() += 1;
    }

    pub fn get(&self, c: Class) -> u64 {
        self.by_class.get(&c).copied().unwrap_or(0)
    }

    fn failures(&self) -> u64 {
        self.by_class.iter().filter(|(c, _)| c.is_failure()).map(|(_, n)| n).sum()
    }
}

/// One distinct finding: every failure of one class, op and mutation.
#[derive(Clone, Debug)]
pub struct Finding {
    pub class: Class,
    pub op: String,
    pub mutation: String,
    pub count: u64,
    /// The first case's reason and description, and its replay command where it was saved.
    pub reason: String,
    pub label: String,
    pub replays: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub by_op: BTreeMap<String, Counts>,
    pub by_mutation: BTreeMap<String, Counts>,
    pub findings: BTreeMap<(Class, String, String), Finding>,
    pub total: Counts,
    pub seconds: f64,
    pub case_seconds: f64,
}

const COLUMNS: [Class; 8] = [
    Class::Ok,
    Class::Crash,
    Class::Hang,
    Class::Wrong,
    Class::Spurious,
    Class::Lenient,
    Class::CpuCrash,
    Class::Invalid,
];

impl Report {
    /// No crash, hang, wrong answer or spurious error.
    pub fn ok(&self) -> bool {
        self.total.failures() == 0
    }

    fn row(name: &str, c: &Counts) -> String {
        let mut s = format!("{name:<36} {:>6}", c.cases);
        for col in COLUMNS {
            s += &format!(" {:>8}", c.get(col));
        }
        s + "\n"
    }

    fn header(first: &str) -> String {
        let mut head = format!("{first:<36} {:>6}", "cases");
        for col in COLUMNS {
            head += &format!(" {:>8}", col.name());
        }
        head + "\n"
    }

    /// The per-op table, the per-mutation table, the totals and the distinct findings.
    pub fn table(&self) -> String {
        let mut s = Self::header("op");
        for (op, c) in &self.by_op {
            s += &Self::row(op, c);
        }
        s += &format!("\n{}", Self::header("mutation"));
        for (m, c) in &self.by_mutation {
            s += &Self::row(m, c);
        }
        s += &Self::row("TOTAL", &self.total);
        for f in self.findings.values() {
            let note = if f.class.is_failure() { "" } else { " [not a failure]" };
            s += &format!(
                "\n{}{note} {} / {} ({} cases): {}\n  case: {}\n",
                f.class.name().to_uppercase(),
                f.op,
                f.mutation,
                f.count,
                f.reason,
                f.label
            );
            for r in &f.replays {
                s += &format!("  replay: {r}\n");
            }
        }
        s += &format!(
            "\nfuzz: {} cases over {} ops, {} ok, {} crash, {} hang, {} wrong, {} spurious, {} lenient CPU EP, {} CPU EP crashes, {} invalid; {} distinct failures ({:.0} s; {:.2} s per case in the children)\n",
            self.total.cases,
            self.by_op.len(),
            self.total.get(Class::Ok),
            self.total.get(Class::Crash),
            self.total.get(Class::Hang),
            self.total.get(Class::Wrong),
            self.total.get(Class::Spurious),
            self.total.get(Class::Lenient),
            self.total.get(Class::CpuCrash),
            self.total.get(Class::Invalid),
            self.findings.keys().filter(|(c, ..)| c.is_failure()).count(),
            self.seconds,
            self.case_seconds / self.total.cases.max(1) as f64,
        );
        s
    }
}

/// Runs the fuzzer.
pub fn run(opts: &Options) -> Report {
    let started = Instant::now();
    let cases = draw(opts);
    println!(
        "fuzz: {} cases drawn (seed {:#x}, {} jobs, timeout {:?})",
        cases.len(),
        opts.seed,
        opts.jobs,
        opts.timeout
    );
    let mut report = Report::default();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Verdict, ChildRun)>();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..opts.jobs.max(1) {
            let tx = tx.clone();
            let (next, cases) = (&next, &cases);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(fc) = cases.get(i) else { break };
                    let (v, run) = run_case(fc, opts);
                    if tx.send((i, v, run)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (done, (i, v, run)) in rx.into_iter().enumerate() {
            record(&mut report, &cases[i], &v, &run, opts);
            if (done + 1) % 100 == 0 || done + 1 == cases.len() {
                let t = &report.total;
                println!(
                    "fuzz: {}/{} cases, {} crash, {} hang, {} wrong, {} spurious ({:.0} s)",
                    done + 1,
                    cases.len(),
                    t.get(Class::Crash),
                    t.get(Class::Hang),
                    t.get(Class::Wrong),
                    t.get(Class::Spurious),
                    started.elapsed().as_secs_f64()
                );
                let _ = std::io::stdout().flush();
            }
        }
    });
    report.seconds = started.elapsed().as_secs_f64();
    report
}

fn record(report: &mut Report, fc: &FuzzCase, v: &Verdict, run: &ChildRun, opts: &Options) {
    report.by_op.entry(fc.op.clone()).or_default().add(v.class);
    report.by_mutation.entry(fc.mutation.clone()).or_default().add(v.class);
    report.total.add(v.class);
    report.case_seconds += run.seconds;
    // Failures, and what is worth a look without failing the run (the CPU EP's own crashes,
    // its known leniency), are listed and saved.
    if !(v.class.is_failure() || matches!(v.class, Class::CpuCrash | Class::Lenient)) {
        return;
    }
    let key = (v.class, fc.op.clone(), fc.mutation.clone());
    let finding = report.findings.entry(key).or_insert_with(|| Finding {
        class: v.class,
        op: fc.op.clone(),
        mutation: fc.mutation.clone(),
        count: 0,
        reason: v.reason.clone(),
        label: fc.label(),
        replays: Vec::new(),
    });
    finding.count += 1;
    if finding.replays.len() < opts.saved_per_group {
        match save(fc, v, run, opts) {
            Ok(cmd) => finding.replays.push(cmd),
            Err(e) => finding.replays.push(format!("(not saved: {e})")),
        }
    }
}

/// Saves a failing case (`case.json`, `outcome.txt`; `model.onnx` and `inputs.json` written by
/// a child, since building a session is what may crash); returns the replay command.
fn save(fc: &FuzzCase, v: &Verdict, run: &ChildRun, opts: &Options) -> std::io::Result<String> {
    let dir = opts.failures_dir.join(fc.dir_name());
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("case.json"), serde_json::to_string_pretty(fc).map_err(std::io::Error::other)?)?;
    let cmd = format!("cargo xtask fuzz --replay {}", dir.display());
    let (stage, _) = verdict::parse_stdout(&run.stdout);
    let outcome = format!(
        "{}\n{}: {}\nlast stage: {}\nreplay: {cmd}\n--- stderr (tail) ---\n{}\n",
        fc.label(),
        v.class.name(),
        v.reason,
        stage.unwrap_or_default(),
        run.stderr_tail
    );
    std::fs::write(dir.join("outcome.txt"), outcome)?;
    let dir_arg = dir.display().to_string();
    if let Ok(r) = spawn(&["--fuzz-save", &dir_arg], "", fc.compile, opts)
        && !matches!(r.exit, Exit::Code(0))
    {
        let note = format!("model.onnx not written: {}\n", r.stderr_tail.lines().last().unwrap_or("?"));
        let mut f = std::fs::OpenOptions::new().append(true).open(dir.join("outcome.txt"))?;
        f.write_all(note.as_bytes())?;
    }
    Ok(cmd)
}

/// Replays a saved case: runs it in a child as the fuzzer did and prints what each EP did.
/// `true` when it no longer fails.
pub fn replay(dir: &Path, opts: &Options) -> Result<bool, String> {
    let fc = super::child::read_case(&dir.display().to_string()).map_err(|e| e.to_string())?;
    let (v, run) = run_case(&fc, opts);
    println!("{}\ncompile: {}", fc.label(), fc.compile);
    let (stage, result) = verdict::parse_stdout(&run.stdout);
    if let Some(Ok(r)) = result {
        for (name, ep) in [("CPU EP", &r.cpu), ("MLX EP", &r.mlx)] {
            print!("{}", describe_ep(name, ep));
        }
    }
    println!("last stage: {}", stage.unwrap_or_default());
    if v.class.is_failure() {
        println!("--- stderr (tail) ---\n{}", run.stderr_tail);
    }
    println!("{}: {}", v.class.name().to_uppercase(), v.reason);
    Ok(!v.class.is_failure())
}

/// What one EP did, a few lines: session, assignment, each run's error or outputs.
fn describe_ep(name: &str, ep: &super::child::EpResult) -> String {
    let mut s = format!("{name}:\n");
    if let Some(e) = &ep.session_error {
        return s + &format!("  session refused: {e}\n");
    }
    let placed: Vec<String> = ep.assignment.iter().map(|(ep, nodes)| format!("{ep}: {}", nodes.join(", "))).collect();
    s += &format!("  assignment: {}\n", placed.join("; "));
    for (k, run) in ep.runs.iter().enumerate() {
        match &run.error {
            Some(e) => s += &format!("  run {}: error: {e}\n", k + 1),
            None => {
                for o in &run.outputs {
                    let head: Vec<String> = o.head.iter().map(|v| format!("{v:.6}")).collect();
                    s += &format!("  run {}: {} {} {:?} [{}]\n", k + 1, o.name, o.dtype, o.shape, head.join(", "));
                }
                if let Some(m) = &run.mismatch {
                    s += &format!("  run {}: differs from the CPU EP: {m}\n", k + 1);
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_spread_over_every_spec_and_mutation() {
        crate::link_op_crates();
        let opts = Options { cases: 3000, seed: 5, ..Options::default() };
        let cases = draw(&opts);
        assert_eq!(cases.len(), 3000);
        let ops: std::collections::BTreeSet<&str> = cases.iter().map(|c| c.op.as_str()).collect();
        assert_eq!(ops.len(), suite::specs_and_chains().len());
        for (name, ..) in mutate::MUTATIONS {
            assert!(cases.iter().any(|c| c.mutation == *name), "{name} never drawn");
        }
        for fc in &cases {
            let back: FuzzCase = serde_json::from_str(&serde_json::to_string(fc).unwrap()).unwrap();
            assert_eq!(back.model_case().label(), fc.model_case().label());
            assert!(fc.feeds.iter().all(|t| t.values.len() == t.len() && t.len() <= 1 << 15), "{}", fc.label());
        }
        let again = draw(&opts);
        assert!(again.iter().zip(&cases).all(|(a, b)| a.label() == b.label()), "draws are deterministic");
    }

    #[test]
    fn an_op_draws_the_same_cases_whatever_the_other_ops() {
        crate::link_op_crates();
        // One op alone, and the same op among all of them: its cases (model, mutation, compile
        // or eager) are the same, in the same order.
        let op = "Gather";
        let alone = draw(&Options { cases: 5, seed: 9, op: Some(op.into()), ..Options::default() });
        let all = draw(&Options { cases: 5 * suite::specs_and_chains().len() as u64, seed: 9, ..Options::default() });
        let among: Vec<&FuzzCase> = all.iter().filter(|c| c.op == op).collect();
        assert_eq!(alone.len(), 5);
        assert_eq!(among.len(), 5);
        for (a, b) in alone.iter().zip(among) {
            assert_eq!((a.label(), &a.mutation, a.compile), (b.label(), &b.mutation, b.compile));
        }
    }
}
