//! Chrome trace output (`ONNXRUNTIME_EP_MLX_TRACE=path.json`, loadable in Perfetto or
//! chrome://tracing): a span per partition run, per phase (copy-in, translate, compile, eval,
//! copy-out) and per node built, written when the session ends. With the variable unset no
//! tracer exists and recording is one `Option` check.

use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

struct Event {
    name: String,
    cat: &'static str,
    start: Instant,
    end: Instant,
    tid: u64,
    args: Value,
}

/// Collects spans of one session and writes them as a Chrome trace.
pub struct Tracer {
    path: PathBuf,
    origin: Instant,
    events: Mutex<Vec<Event>>,
}

fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|id| *id)
}

impl Tracer {
    pub fn new(path: PathBuf) -> Tracer {
        Tracer { path, origin: Instant::now(), events: Mutex::new(Vec::new()) }
    }

    /// Records a completed span.
    pub fn record(&self, name: impl Into<String>, cat: &'static str, start: Instant, end: Instant, args: Value) {
        let event = Event { name: name.into(), cat, start, end, tid: thread_number(), args };
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }

    /// The trace as Chrome's JSON object format.
    pub fn to_json(&self) -> Value {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let us = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64() * 1e6;
        let list: Vec<Value> = events
            .iter()
            .map(|e| {
                json!({
                    "name": e.name, "cat": e.cat, "ph": "X",
                    "ts": us(e.start), "dur": (us(e.end) - us(e.start)).max(0.0),
                    "pid": std::process::id(), "tid": e.tid, "args": e.args,
                })
            })
            .collect();
        json!({ "traceEvents": list, "displayTimeUnit": "ms" })
    }

    /// Writes the trace file.
    pub fn write(&self) -> std::io::Result<()> {
        let text = serde_json::to_string(&self.to_json()).map_err(std::io::Error::other)?;
        std::fs::write(&self.path, text)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}
