//! `keycache stats`: counts, layout and the numbers of each bank; with
//! `--prometheus`, the same as gauges in Prometheus' text exposition format
//! (for node_exporter's textfile collector).

use std::process::ExitCode;

use keycache::report::{self, BankStats};

use crate::args::{ConfiguredStore, Json, StoreArgs};
use crate::output::{outln, print_json, CmdResult};

/// The arguments of `keycache stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
    /// Prints the counts and the banks' numbers as gauges in Prometheus'
    /// text exposition format, for node_exporter's textfile collector
    /// (keycache_keys{state}, keycache_bank_load_factor{bank},
    /// keycache_bank_longest_probe{bank}, keycache_bank_heap_bytes{bank},
    /// keycache_bank_slots{bank}; bank is keys or denied_keys). No label
    /// holds a minion id. Not with --json.
    #[arg(long, conflicts_with = "json")]
    prometheus: bool,
}

/// `x`, or 0 when it is not finite (as the JSON output, which has no NaN,
/// always printed it).
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// Runs `keycache stats`.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir())?;
    let r = report::stats(&store)?;
    if a.json.json {
        print_json(&r);
        return Ok(ExitCode::SUCCESS);
    }
    if a.prometheus {
        outln!("{}", prometheus(&r).trim_end());
        return Ok(ExitCode::SUCCESS);
    }
    let c = &r.counts;
    outln!(
        "keys: {} accepted, {} pending, {} rejected; {} denied",
        c.accepted,
        c.pending,
        c.rejected,
        c.denied
    );
    for (name, b) in [("keys", &r.keys), ("denied_keys", &r.denied_keys)] {
        print_bank(name, b);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_bank(name: &str, b: &BankStats) {
    outln!("{name}:");
    outln!(
        "  slots:      {} occupied, {} deleted of {} (load factor {:.4})",
        b.occupied,
        b.deleted,
        b.capacity,
        finite(b.load_factor)
    );
    outln!(
        "  probes:     mean {:.3}, p99 {}, max {}",
        finite(b.probe_length.mean),
        b.probe_length.p99,
        b.probe_length.max
    );
    outln!(
        "  heap:       {} live of {} bytes (garbage {:.1}%), {} segment(s)",
        b.heap_live_bytes,
        b.heap_total_bytes,
        finite(b.garbage_ratio) * 100.0,
        b.segments
    );
}

/// One gauge of the exposition: its HELP and TYPE lines, then a sample per
/// `(label value, value)`, the label named `label`.
fn gauge(out: &mut String, name: &str, help: &str, label: &str, samples: &[(&str, f64)]) {
    use std::fmt::Write;
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (value_of_label, v) in samples {
        // The label values are this file's constants (states, bank names):
        // nothing to escape, and never a minion id.
        let _ = writeln!(out, "{name}{{{label}=\"{value_of_label}\"}} {}", finite(*v));
    }
}

/// The report as Prometheus' text exposition format (version 0.0.4).
fn prometheus(r: &report::StatsReport) -> String {
    let mut out = String::new();
    let c = &r.counts;
    gauge(
        &mut out,
        "keycache_keys",
        "Minion keys in the store, by state (denied: the denied_keys bank).",
        "state",
        &[
            ("accepted", c.accepted as f64),
            ("pending", c.pending as f64),
            ("rejected", c.rejected as f64),
            ("denied", c.denied as f64),
        ],
    );
    let banks = [("keys", &r.keys), ("denied_keys", &r.denied_keys)];
    let per_bank = |f: fn(&BankStats) -> f64| -> Vec<(&str, f64)> {
        banks.iter().map(|(n, b)| (*n, f(b))).collect()
    };
    gauge(
        &mut out,
        "keycache_bank_load_factor",
        "Occupied and deleted slots of the bank over its slots.",
        "bank",
        &per_bank(|b| b.load_factor),
    );
    gauge(
        &mut out,
        "keycache_bank_longest_probe",
        "Most slots a lookup of a live id of the bank visits.",
        "bank",
        &per_bank(|b| b.probe_length.max as f64),
    );
    gauge(
        &mut out,
        "keycache_bank_heap_bytes",
        "Bytes of the bank's heap segments, garbage included.",
        "bank",
        &per_bank(|b| b.heap_total_bytes as f64),
    );
    gauge(
        &mut out,
        "keycache_bank_slots",
        "Data slots of the bank (its table size).",
        "bank",
        &per_bank(|b| b.capacity as f64),
    );
    out
}
