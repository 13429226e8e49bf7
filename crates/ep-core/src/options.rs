//! Every setting of the EP, declared once: its provider-option key (what
//! `add_provider_for_devices(devices, {key: value})` or the session entry
//! `ep.mlxexecutionprovider.<key>` sets), the environment variable that overrides it for
//! debugging, its default and its documentation. The README's table is [`markdown_table`] (a
//! test holds the two equal), and nothing else in the plugin reads an `ONNXRUNTIME_EP_MLX_*`
//! variable or an option key by name.
//!
//! [`Options::resolve`] turns a session's option entries into typed settings: an unknown key
//! or a value that does not parse is an error naming it, so a typo never passes silently.

use crate::{Error, Result};
use std::path::PathBuf;

/// What values a setting takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// `1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`.
    Switch,
    /// A byte count: digits with an optional `K`, `M` or `G` suffix (powers of 1024).
    Bytes,
    /// A count: a whole number of at least 1.
    Count,
    /// A file path.
    Path,
    /// One of the listed words.
    Choice(&'static [&'static str]),
}

/// One setting.
pub struct Setting {
    /// The provider-option key; `None` for a setting only the environment sets (read before
    /// any session exists).
    pub key: Option<&'static str>,
    /// The environment variable that overrides the option.
    pub env: &'static str,
    pub kind: Kind,
    /// The value when neither the option nor the variable is given (`""`: none).
    pub default: &'static str,
    /// Whether it applies to the whole process (MLX's device, TF32 mode and limits are
    /// process-wide) rather than to one session.
    pub process_wide: bool,
    pub doc: &'static str,
}

impl Setting {
    /// The variable's value, when set and not empty.
    fn env_value(&self) -> Option<String> {
        std::env::var(self.env).ok().filter(|v| !v.is_empty())
    }

    /// Whether a switch is on, from the environment alone (for settings read before any
    /// session, and for tools).
    pub fn env_on(&self) -> bool {
        let v = self.env_value().unwrap_or_else(|| self.default.to_owned());
        parse_switch(&v).unwrap_or(false)
    }

    /// A choice from the environment alone, when set to one of its words.
    pub fn env_choice(&self) -> Option<String> {
        let Kind::Choice(words) = self.kind else { return None };
        self.env_value().filter(|v| words.contains(&v.as_str()))
    }

    /// A count from the environment alone, 0 when unset or not a count.
    pub fn env_count(&self) -> usize {
        self.env_value().and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    fn check(&self, value: &str, source: &str) -> Result<()> {
        let ok = match self.kind {
            Kind::Switch => parse_switch(value).is_some(),
            Kind::Bytes => parse_bytes(value).is_some(),
            Kind::Count => value.parse::<usize>().is_ok_and(|n| n >= 1),
            Kind::Path => !value.is_empty(),
            Kind::Choice(words) => words.contains(&value),
        };
        if ok {
            return Ok(());
        }
        let expected = match self.kind {
            Kind::Switch => "1/0, true/false, on/off or yes/no".to_owned(),
            Kind::Bytes => "a byte count such as 4096, 512M or 8G (0: MLX's default)".to_owned(),
            Kind::Count => "a whole number of at least 1".to_owned(),
            Kind::Path => "a file path".to_owned(),
            Kind::Choice(words) => format!("one of {}", words.join(", ")),
        };
        Err(Error::new(format!("{source} = '{value}' is not valid: expected {expected}")))
    }
}

fn parse_switch(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let (digits, scale) = match v.char_indices().last()? {
        (i, 'k' | 'K') => (&v[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&v[..i], 1 << 20),
        (i, 'g' | 'G') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

pub const DEVICE: Setting = Setting {
    key: Some("device"),
    env: "ONNXRUNTIME_EP_MLX_DEVICE",
    kind: Kind::Choice(&["auto", "gpu", "cpu"]),
    default: "auto",
    process_wide: true,
    doc: "the MLX device partitions run on: `auto` (MLX's default: the GPU where the backend has one), `gpu` (an error where there is none) or `cpu`",
};

pub const TF32: Setting = Setting {
    key: Some("tf32"),
    env: "ONNXRUNTIME_EP_MLX_TF32",
    kind: Kind::Switch,
    default: "0",
    process_wide: true,
    doc: "let float32 matmuls and convolutions on CUDA run as TF32 (faster, about 3 decimal digits); off by default, so float32 means float32",
};

pub const COMPILE: Setting = Setting {
    key: Some("compile"),
    env: "ONNXRUNTIME_EP_MLX_COMPILE",
    kind: Kind::Switch,
    default: "1",
    process_wide: false,
    doc: "run partitions through `mlx_compile`d closures; `0` runs every partition eagerly",
};

pub const FUSE: Setting = Setting {
    key: Some("fuse"),
    env: "ONNXRUNTIME_EP_MLX_FUSE",
    kind: Kind::Switch,
    default: "",
    process_wide: false,
    doc: "let `mlx_compile` fuse chains of elementwise ops into generated kernels. Unset: on for the CPU and Metal; on CUDA only in the fixed-shape graph a decode step replays (a decoder's per-token graph with its KV cache in one buffer: 2.5x faster steps on an H100), since each fused kernel is compiled with NVRTC the first time it runs (about 15 s for a CNN, a minute for a decoder's prompt graph on an empty kernel cache) and only a graph replayed per token wins that back. `1` fuses every compiled graph, `0` none.",
};

pub const MEMORY_LIMIT: Setting = Setting {
    key: Some("memory_limit"),
    env: "ONNXRUNTIME_EP_MLX_MEMORY_LIMIT",
    kind: Kind::Bytes,
    default: "0",
    process_wide: true,
    doc: "MLX's memory limit (`512M`, `8G`); a node whose result would pass it fails with an error naming it. `0` keeps MLX's default",
};

pub const CACHE_LIMIT: Setting = Setting {
    key: Some("cache_limit"),
    env: "ONNXRUNTIME_EP_MLX_CACHE_LIMIT",
    kind: Kind::Bytes,
    default: "1G",
    process_wide: true,
    doc: "the most memory MLX's buffer cache keeps for reuse after arrays are freed (MLX's own default is its memory limit); the default applies once per process, an explicit value on every session that gives it. `0` keeps MLX's default",
};

pub const COMPILED_CACHE: Setting = Setting {
    key: Some("compiled_cache"),
    env: "ONNXRUNTIME_EP_MLX_COMPILED_CACHE",
    kind: Kind::Count,
    default: "8",
    process_wide: false,
    doc: "compiled closures each partition keeps, one per input-shape key (and as many for the decode slot); the least recently used is dropped first",
};

pub const KERNEL_CACHE: Setting = Setting {
    key: Some("kernel_cache"),
    env: "ONNXRUNTIME_EP_MLX_KERNEL_CACHE",
    kind: Kind::Path,
    default: "",
    process_wide: true,
    doc: "where MLX's CUDA backend keeps the kernels it JIT-compiles, so a later process (after a reboot too) skips compiling them: unset means `$XDG_CACHE_HOME/onnxruntime-mlx-ep/kernels` (else `~/.cache/...`), unless `MLX_PTX_CACHE_DIR` is set. Settled by the first session",
};

pub const VERBOSE: Setting = Setting {
    key: Some("verbose"),
    env: "ONNXRUNTIME_EP_MLX_VERBOSE",
    kind: Kind::Switch,
    default: "0",
    process_wide: false,
    doc: "print a summary when the session ends: nodes claimed, partitions, claimed ops, compiled replays / eager runs / traces / compiles, bytes moved, time per phase",
};

pub const CLAIM_DEBUG: Setting = Setting {
    key: Some("claim_debug"),
    env: "ONNXRUNTIME_EP_MLX_CLAIM_DEBUG",
    kind: Kind::Switch,
    default: "0",
    process_wide: false,
    doc: "print every node the EP leaves to other EPs, with the reason, and the partitions it forms",
};

pub const TRACE: Setting = Setting {
    key: Some("trace"),
    env: "ONNXRUNTIME_EP_MLX_TRACE",
    kind: Kind::Path,
    default: "",
    process_wide: false,
    doc: "write a Chrome trace (Perfetto, chrome://tracing) to this file when the session ends: spans per partition run, per phase (copy-in, translate, compile, eval, copy-out) and per node built, with shapes and dtypes",
};

pub const ZERO_COPY: Setting = Setting {
    key: Some("zero_copy"),
    env: "ONNXRUNTIME_EP_MLX_ZERO_COPY",
    kind: Kind::Switch,
    default: "1",
    process_wide: false,
    doc: "read aligned host input buffers in place on MLX's CPU device; `0` copies every host input into MLX memory",
};

pub const DEVICE_MEMORY: Setting = Setting {
    key: None,
    env: "ONNXRUNTIME_EP_MLX_DEVICE_MEMORY",
    kind: Kind::Switch,
    default: "0",
    process_wide: true,
    doc: "on MLX's CPU backend, give the EP's device its own memory (allocator and data transfer), as it has on a GPU: for testing the device path; read when the plugin is registered",
};

pub const GRAPH_DIR: Setting = Setting {
    key: None,
    env: "ONNXRUNTIME_EP_MLX_GRAPH_DIR",
    kind: Kind::Path,
    default: "",
    process_wide: false,
    doc: "with `verbose` on, also write each compiled closure's graph (the primitives one run hands MLX) as Graphviz text into this directory, `graph-N.dot` in the order first run",
};

pub const BARE_REPLAYS: Setting = Setting {
    key: None,
    env: "ONNXRUNTIME_EP_MLX_BARE_REPLAYS",
    kind: Kind::Count,
    default: "",
    process_wide: true,
    doc: "with `verbose` on, at the 8th replay of each compiled closure also replay it this many times on the same inputs (already in MLX memory) and report the median per run in the summary: the bare compiled graph the EP's run time is compared with",
};

pub const HOST_COPY: Setting = Setting {
    key: None,
    env: "ONNXRUNTIME_EP_MLX_HOST_COPY",
    kind: Kind::Choice(&["staged", "direct", "kernel"]),
    default: "staged",
    process_wide: true,
    doc: "on CUDA, how copies of 16 KiB or more between host memory and the EP's memory run: `staged` through a pinned host buffer, `direct` one driver copy each, `kernel` through the pinned buffer by the EP's copy kernel (on an H100 the three measured alike within the run-to-run noise: see the README's GPU figures)",
};

pub const TEST_GPU_FORMS: Setting = Setting {
    key: None,
    env: "ONNXRUNTIME_EP_MLX_TEST_GPU_FORMS",
    kind: Kind::Switch,
    default: "0",
    process_wide: true,
    doc: "build the lowerings' GPU forms on the CPU too (fused RMS norm, one query token through MLX's fused attention kernel with the key mask carried in the head dimension, half-type quantized matmuls): for testing them where CI runs and for counting a GPU graph's primitives",
};

pub const ATTENTION_KERNEL: Setting = Setting {
    key: None,
    env: "ONNXRUNTIME_EP_MLX_ATTENTION_KERNEL",
    kind: Kind::Switch,
    default: "1",
    process_wide: true,
    doc: "on CUDA, one query token's masked attention (a decode step over a static KV buffer) as the EP's own kernel, one launch per layer, instead of MLX's fused kernel with the key mask carried in the head dimension (three concatenations and a copy more per layer); `0` goes back to MLX's kernel (`gpu/run.sh attention` checks and measures both)",
};

/// Every setting, in the README's order.
pub const ALL: &[&Setting] = &[
    &DEVICE,
    &TF32,
    &COMPILE,
    &FUSE,
    &MEMORY_LIMIT,
    &CACHE_LIMIT,
    &COMPILED_CACHE,
    &KERNEL_CACHE,
    &VERBOSE,
    &CLAIM_DEBUG,
    &TRACE,
    &ZERO_COPY,
    &DEVICE_MEMORY,
    &GRAPH_DIR,
    &BARE_REPLAYS,
    &HOST_COPY,
    &ATTENTION_KERNEL,
    &TEST_GPU_FORMS,
];

/// The prefix ORT gives provider options in a session's configuration.
pub const SESSION_PREFIX: &str = "ep.mlxexecutionprovider.";

/// The MLX device a session asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Auto,
    Gpu,
    Cpu,
}

/// A session's settings, resolved from its provider options and the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub device: Device,
    /// `None` when neither the option nor the variable says (the process settles it off).
    pub tf32: Option<bool>,
    pub compile: bool,
    /// `None` when neither the option nor the variable says (fused, except on CUDA).
    pub fuse: Option<bool>,
    pub memory_limit: Option<u64>,
    pub cache_limit: Option<u64>,
    /// Whether `cache_limit` was given (option or variable) rather than the default.
    pub cache_limit_explicit: bool,
    pub compiled_cache: usize,
    /// Where MLX's CUDA kernels are cached; `None`: the user's cache directory.
    pub kernel_cache: Option<PathBuf>,
    pub verbose: bool,
    pub claim_debug: bool,
    pub trace: Option<PathBuf>,
    pub zero_copy: bool,
}

impl Options {
    /// Resolves settings from the session configuration `entries` (all of them: entries
    /// without [`SESSION_PREFIX`] are ORT's and ignored). For each setting the environment
    /// variable wins over the option, and the option over the default.
    pub fn resolve<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Options> {
        let mut given: Vec<(&Setting, String)> = Vec::new();
        for (key, value) in entries {
            let Some(name) = key.strip_prefix(SESSION_PREFIX) else { continue };
            let Some(setting) = ALL.iter().copied().find(|s| s.key == Some(name)) else {
                let known: Vec<&str> = ALL.iter().filter_map(|s| s.key).collect();
                return Err(Error::new(format!(
                    "unknown option '{name}' (session entry '{key}'); the options are: {}",
                    known.join(", ")
                )));
            };
            setting.check(value, &format!("option '{name}'"))?;
            given.push((setting, value.to_owned()));
        }
        let explicit = |s: &Setting| -> Result<Option<String>> {
            if let Some(v) = s.env_value() {
                s.check(&v, &format!("environment variable {}", s.env))?;
                return Ok(Some(v));
            }
            Ok(given.iter().rev().find(|(g, _)| std::ptr::eq(*g, s)).map(|(_, v)| v.clone()))
        };
        let value = |s: &Setting| -> Result<String> { Ok(explicit(s)?.unwrap_or_else(|| s.default.to_owned())) };
        let switch = |s: &Setting| -> Result<bool> { Ok(parse_switch(&value(s)?).unwrap_or(false)) };
        let bytes = |s: &Setting| -> Result<Option<u64>> { Ok(parse_bytes(&value(s)?).filter(|&n| n > 0)) };
        let device = match value(&DEVICE)?.as_str() {
            "gpu" => Device::Gpu,
            "cpu" => Device::Cpu,
            _ => Device::Auto,
        };
        let trace = value(&TRACE)?;
        let kernel_cache = value(&KERNEL_CACHE)?;
        Ok(Options {
            device,
            tf32: explicit(&TF32)?.and_then(|v| parse_switch(&v)),
            compile: switch(&COMPILE)?,
            fuse: explicit(&FUSE)?.and_then(|v| parse_switch(&v)),
            memory_limit: bytes(&MEMORY_LIMIT)?,
            cache_limit: bytes(&CACHE_LIMIT)?,
            cache_limit_explicit: explicit(&CACHE_LIMIT)?.is_some(),
            compiled_cache: value(&COMPILED_CACHE)?.parse().unwrap_or(8),
            kernel_cache: (!kernel_cache.is_empty()).then(|| PathBuf::from(kernel_cache)),
            verbose: switch(&VERBOSE)?,
            claim_debug: switch(&CLAIM_DEBUG)?,
            trace: (!trace.is_empty()).then(|| PathBuf::from(trace)),
            zero_copy: switch(&ZERO_COPY)?,
        })
    }

    /// The settings of a session that sets no options.
    pub fn from_env() -> Result<Options> {
        Options::resolve(std::iter::empty())
    }
}

/// The README's table of the settings.
pub fn markdown_table() -> String {
    let mut t = String::from("| option | variable | default | effect |\n|---|---|---|---|\n");
    for s in ALL {
        let key = s.key.map_or_else(|| "(none)".to_owned(), |k| format!("`{k}`"));
        let default = if s.default.is_empty() { "unset".to_owned() } else { format!("`{}`", s.default) };
        let scope = if s.process_wide { " (process-wide)" } else { "" };
        t.push_str(&format!("| {key} | `{}` | {default} | {}{scope} |\n", s.env, s.doc));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(pairs: &[(&str, &str)]) -> Result<Options> {
        Options::resolve(pairs.iter().copied())
    }

    #[test]
    fn the_readme_documents_every_setting_as_declared() {
        let readme = include_str!("../../../README.md");
        let table = markdown_table();
        assert!(readme.contains(&table), "README.md must hold this table of the settings:\n{table}");
    }

    #[test]
    fn options_are_read_from_the_session_entries_and_others_are_ignored() {
        let o = resolve(&[
            ("session.intra_op_num_threads", "4"),
            ("ep.mlxexecutionprovider.compile", "0"),
            ("ep.mlxexecutionprovider.memory_limit", "512M"),
            ("ep.mlxexecutionprovider.tf32", "true"),
            ("ep.mlxexecutionprovider.device", "cpu"),
            ("ep.mlxexecutionprovider.trace", "/tmp/t.json"),
        ])
        .unwrap();
        // The test environment sets none of the variables (they would override).
        if ALL.iter().all(|s| s.env_value().is_none()) {
            assert!(!o.compile);
            assert_eq!(o.tf32, Some(true));
            assert_eq!(o.memory_limit, Some(512 << 20));
            assert_eq!(o.cache_limit, Some(1 << 30));
            assert!(!o.cache_limit_explicit);
            assert_eq!(o.compiled_cache, 8);
            assert_eq!(o.device, Device::Cpu);
            assert_eq!(o.trace, Some(PathBuf::from("/tmp/t.json")));
        }
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it_and_the_known_ones() {
        let e = resolve(&[("ep.mlxexecutionprovider.compiel", "0")]).unwrap_err().to_string();
        assert!(e.contains("unknown option 'compiel'"), "{e}");
        assert!(e.contains("compile, fuse, memory_limit"), "{e}");
    }

    #[test]
    fn a_bad_value_is_an_error_naming_the_option_and_what_it_takes() {
        for (key, value, expect) in [
            ("compile", "maybe", "1/0, true/false"),
            ("fuse", "sometimes", "1/0, true/false"),
            ("memory_limit", "lots", "byte count"),
            ("memory_limit", "-5", "byte count"),
            ("memory_limit", "99999999999999999999G", "byte count"),
            ("device", "tpu", "one of auto, gpu, cpu"),
            ("trace", "", "a file path"),
        ] {
            let e = resolve(&[(&format!("{SESSION_PREFIX}{key}"), value)]).unwrap_err().to_string();
            assert!(e.contains(&format!("option '{key}' = '{value}'")) && e.contains(expect), "{key}={value}: {e}");
        }
    }

    #[test]
    fn byte_counts_take_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("2k"), Some(2048));
        assert_eq!(parse_bytes("3G"), Some(3 << 30));
        assert_eq!(parse_bytes("G"), None);
        assert_eq!(parse_bytes("1.5G"), None);
    }

    #[test]
    fn no_other_file_of_the_plugin_reads_a_setting_by_name() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("options.rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for s in ALL {
                        assert!(
                            !text.contains(&format!("\"{}\"", s.env)),
                            "{} reads {} directly; use ep_core::options",
                            path.display(),
                            s.env
                        );
                    }
                }
            }
        }
    }
}
