//! Logging, exiting with an error, medians and the report's number formats.

use std::path::{Path, PathBuf};

pub(crate) fn die(msg: &str) -> ! {
    eprintln!("compare: error: {msg}");
    std::process::exit(2)
}

pub(crate) fn log(msg: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?");
    eprintln!("[{} load {load}] {msg}", chrono_now());
}

pub(crate) fn chrono_now() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!("{:02}:{:02}:{:02}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub(crate) fn size_label(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

pub(crate) fn fmt_rate(r: f64) -> String {
    if !r.is_finite() {
        "—".into()
    } else if r >= 1e6 {
        format!("{:.2} M/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k/s", r / 1e3)
    } else {
        format!("{r:.0} /s")
    }
}

pub(crate) fn fmt_secs(s: f64) -> String {
    if !s.is_finite() {
        "—".into()
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.1} µs", s * 1e6)
    } else {
        format!("{:.0} ns", s * 1e9)
    }
}

pub(crate) fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        "—".into()
    } else if r >= 100.0 {
        format!("{r:.0}x")
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else {
        format!("{r:.2}x")
    }
}

/// A target's figures: `a vs b (ratio)`, `a` and `b` written by `fmt`.
pub(crate) fn versus(fmt: fn(f64) -> String, a: f64, b: f64, ratio: f64) -> String {
    format!("{} vs {} ({})", fmt(a), fmt(b), fmt_ratio(ratio))
}
