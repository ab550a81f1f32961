//! `keycache stats`: counts, layout and the numbers of each bank.

use std::process::ExitCode;

use keycache::report::{self, BankStats};

use crate::args::{ConfiguredStore, Json, Layout};
use crate::output::{outln, print_json, CmdResult};

/// The arguments of `keycache stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
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
