//! Every setting the EP reads from its environment, declared once with its documentation.
//! The README's table of them is this module's [`markdown_table`] (a test holds the two
//! equal), and nothing else in the plugin reads an `ONNXRUNTIME_EP_MLX_*` variable.

use std::path::PathBuf;

/// One environment variable.
pub struct Knob {
    pub name: &'static str,
    /// How it is written to take effect, for the documentation (`NAME=1`).
    pub example: &'static str,
    pub doc: &'static str,
    /// For a switch: its value when the variable is unset or empty.
    default_on: bool,
}

impl Knob {
    /// A switch: unset or empty gives the default, `0` turns it off, anything else on.
    pub fn on(&self) -> bool {
        match std::env::var(self.name) {
            Ok(v) if !v.is_empty() => v != "0",
            _ => self.default_on,
        }
    }

    /// A path: the variable's value when set and not empty.
    pub fn path(&self) -> Option<PathBuf> {
        std::env::var_os(self.name).filter(|v| !v.is_empty()).map(PathBuf::from)
    }
}

pub const CLAIM_DEBUG: Knob = Knob {
    name: "ONNXRUNTIME_EP_MLX_CLAIM_DEBUG",
    example: "ONNXRUNTIME_EP_MLX_CLAIM_DEBUG=1",
    doc: "print every node the EP leaves to other EPs, with the reason, and the partitions it forms",
    default_on: false,
};

pub const VERBOSE: Knob = Knob {
    name: "ONNXRUNTIME_EP_MLX_VERBOSE",
    example: "ONNXRUNTIME_EP_MLX_VERBOSE=1",
    doc: "print a summary when a session ends: nodes claimed, partitions, claimed ops, compiled replays / eager runs / traces / compiles, derived and shared constants, time per phase",
    default_on: false,
};

pub const COMPILE: Knob = Knob {
    name: "ONNXRUNTIME_EP_MLX_COMPILE",
    example: "ONNXRUNTIME_EP_MLX_COMPILE=0",
    doc: "run every partition eagerly instead of through `mlx_compile`d closures",
    default_on: true,
};

pub const TRACE: Knob = Knob {
    name: "ONNXRUNTIME_EP_MLX_TRACE",
    example: "ONNXRUNTIME_EP_MLX_TRACE=path.json",
    doc: "write a Chrome trace (Perfetto, chrome://tracing) when the session ends: spans per partition run, per phase (copy-in, translate, compile, eval, copy-out) and per node built, with shapes and dtypes; with several sessions, the last to end writes the file",
    default_on: false,
};

pub const ZERO_COPY: Knob = Knob {
    name: "ONNXRUNTIME_EP_MLX_ZERO_COPY",
    example: "ONNXRUNTIME_EP_MLX_ZERO_COPY=0",
    doc: "copy every input into MLX memory instead of reading aligned ORT buffers in place (CPU device only; GPUs always copy)",
    default_on: true,
};

/// Every knob, in the README's order.
pub const ALL: &[&Knob] = &[&CLAIM_DEBUG, &VERBOSE, &COMPILE, &TRACE, &ZERO_COPY];

/// The README's table of the knobs.
pub fn markdown_table() -> String {
    let mut t = String::from("| variable | effect |\n|---|---|\n");
    for k in ALL {
        t.push_str(&format!("| `{}` | {} |\n", k.example, k.doc));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_documents_every_knob_as_declared() {
        let readme = include_str!("../../../README.md");
        let table = markdown_table();
        assert!(readme.contains(&table), "README.md must hold this table of the knobs:\n{table}");
    }

    #[test]
    fn no_other_file_of_the_plugin_reads_a_knob_by_name() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("knobs.rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for k in ALL {
                        assert!(
                            !text.contains(&format!("\"{}\"", k.name)),
                            "{} reads {} directly; use ep_core::knobs",
                            path.display(),
                            k.name
                        );
                    }
                }
            }
        }
    }
}
