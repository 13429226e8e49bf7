//! Host-side driver for the MLX EP: loads ONNX Runtime (the `ort` crate, `load-dynamic`),
//! registers the plugin library, creates sessions on the CPU EP or the MLX EP, reads ORT's own
//! record of which EP ran each node, and compares outputs. Used by `cargo xtask demo/run`
//! (through the `mlx-ep-run` binary) and by the end-to-end tests.

pub mod decoder;
pub mod llm;
pub mod models;
mod ort_raw;
pub mod report;
pub mod values;

use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::SessionBuilder;
use std::path::PathBuf;
use std::sync::OnceLock;

pub use ort;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

/// The name ORT reports for the plugin's EP.
pub const MLX_EP: &str = "MLXExecutionProvider";
pub const CPU_EP: &str = "CPUExecutionProvider";

/// Where the plugin library is: `$ORT_MLX_EP_LIB` (which `cargo xtask` sets), else the
/// workspace's debug build.
pub fn plugin_path() -> Result<PathBuf> {
    let path = match std::env::var_os("ORT_MLX_EP_LIB") {
        Some(p) => PathBuf::from(p),
        // The workspace's debug build, for a plain `cargo test` (which builds the plugin too).
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/debug")
            .join(if cfg!(target_os = "macos") { "libonnxruntime_mlx_ep.dylib" } else { "libonnxruntime_mlx_ep.so" }),
    };
    if !path.exists() {
        return Err(format!(
            "the plugin library {} does not exist: build it (cargo build -p onnxruntime-mlx-ep) or point ORT_MLX_EP_LIB at it",
            path.display()
        )
        .into());
    }
    Ok(path)
}

/// ONNX Runtime is loaded from `$ORT_DYLIB_PATH` (set by `.cargo/config.toml` for cargo-run
/// processes, and printed by `cargo xtask env`); a missing library is a clear error here
/// rather than a panic inside the `ort` crate.
fn check_ort_library() -> Result<()> {
    match std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from) {
        Some(p) if p.exists() => Ok(()),
        Some(p) => Err(format!("ORT_DYLIB_PATH={} does not exist: run `cargo xtask setup`", p.display()).into()),
        None => Err("ORT_DYLIB_PATH is not set: run through cargo, or `eval \"$(cargo xtask env)\"` first".into()),
    }
}

static ENV: OnceLock<std::result::Result<(Environment, PathBuf), String>> = OnceLock::new();

/// The process's ORT environment: the one already created, else a new one with the plugin
/// from [`plugin_path`] registered.
pub fn environment() -> Result<&'static Environment> {
    if let Some(done) = ENV.get() {
        return done.as_ref().map(|(env, _)| env).map_err(|e| Error::from(e.clone()));
    }
    environment_with_plugin(&plugin_path()?)
}

/// The process's ORT environment with the plugin library at `plugin` registered. ORT allows
/// one environment per process: the first call decides the library, and a later call naming
/// another library is an error.
pub fn environment_with_plugin(plugin: &std::path::Path) -> Result<&'static Environment> {
    let (env, registered) = ENV
        .get_or_init(|| {
            let setup = || -> Result<Environment> {
                check_ort_library()?;
                let env = ort::init().with_name("mlx-ep-host").build()?;
                env.register_ep_library("MLX", plugin)?;
                if !env.devices().any(|d| d.ep().is_ok_and(|n| n == MLX_EP)) {
                    return Err(format!("the plugin registered no {MLX_EP} device").into());
                }
                Ok(env)
            };
            setup().map(|env| (env, plugin.to_path_buf())).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::from(e.clone()))?;
    if registered != plugin {
        return Err(format!(
            "this process already registered {}; cannot switch to {}",
            registered.display(),
            plugin.display()
        )
        .into());
    }
    Ok(env)
}

/// Which execution provider a session should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ep {
    /// ORT's CPU EP alone.
    Cpu,
    /// The MLX EP, with ORT's CPU EP for the nodes it leaves.
    Mlx,
}

impl Ep {
    pub fn label(self) -> &'static str {
        match self {
            Ep::Cpu => CPU_EP,
            Ep::Mlx => MLX_EP,
        }
    }
}

/// A session builder for `ep` that records EP assignment info.
pub fn session_builder(ep: Ep) -> Result<SessionBuilder> {
    let env = environment()?;
    let mut builder = SessionBuilder::new(env)?
        .with_config_entry("session.record_ep_graph_assignment_info", "1")
        .map_err(ort::Error::<()>::from)?;
    // Select the EP's devices explicitly: the `ort` crate otherwise sets an automatic device
    // policy under which ORT itself picks the MLX EP for a "CPU" session.
    let wanted = ep.label();
    builder = builder
        .with_devices(env.devices().filter(|d| d.ep().is_ok_and(|n| n == wanted)), None)
        .map_err(ort::Error::<()>::from)?;
    Ok(builder)
}

/// One node as ORT's assignment info reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedNode {
    pub name: String,
    pub domain: String,
    pub op_type: String,
}

/// The nodes one EP ran (one entry per subgraph ORT assigned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub ep: String,
    pub nodes: Vec<AssignedNode>,
}

/// ORT's record of which EP runs each node (`Session_GetEpGraphAssignmentInfo`).
pub fn assignment(session: &Session) -> Result<Vec<Assignment>> {
    ort_raw::assignment(session)
}

/// The EP that ran the node named `node`, if ORT reports it.
pub fn ep_of(assignment: &[Assignment], node: &str) -> Option<String> {
    assignment.iter().find(|a| a.nodes.iter().any(|n| n.name == node)).map(|a| a.ep.clone())
}
