//! The report being written (Markdown and JSON) and the machine it is about.

use serde_json::{json, Value as Json};

use crate::util::versus;

pub(crate) fn machine() -> Json {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.to_string()))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "memory": mem.split_whitespace().nth(1).map(|k| format!("{:.1} GiB", k.parse::<f64>().unwrap_or(0.0) / 1048576.0)),
        "kernel": kernel.trim(),
        "loadavg": load.trim(),
    })
}

pub(crate) struct Report {
    pub(crate) out: String,
    pub(crate) json: serde_json::Map<String, Json>,
    pub(crate) targets: Vec<(String, String, bool)>,
}

impl Report {
    pub(crate) fn line(&mut self, s: &str) {
        self.out.push_str(s);
        self.out.push('\n');
    }
    /// A section of the report: nothing when nothing was `measured`, else its
    /// `head` (a heading, a blank line, a table's header and alignment rows),
    /// then what `body` writes.
    pub(crate) fn section(&mut self, measured: bool, head: &str, body: impl FnOnce(&mut Report)) {
        if measured {
            self.line(head);
            body(self);
        }
    }
    pub(crate) fn target(&mut self, what: &str, figures: String, met: bool) {
        self.targets.push((what.to_string(), figures, met));
    }
    /// A target met when `a >= factor * b`; its figures `a vs b (a / b)`, written by `fmt`.
    pub(crate) fn at_least(
        &mut self,
        what: &str,
        fmt: fn(f64) -> String,
        a: f64,
        factor: f64,
        b: f64,
    ) {
        self.target(what, versus(fmt, a, b, a / b), a >= factor * b);
    }
}
