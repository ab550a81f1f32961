//! `keycache bench`: lookup throughput of an existing store on this
//! machine (the measurement is `keycache_bench::bench_store`).

use std::process::ExitCode;

use keycache_bench::{MAX_SECONDS, MAX_THREADS};

use crate::args::{ConfiguredStore, Json, Layout};
use crate::output::{outln, print_json, CmdResult};

/// The arguments of `keycache bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// Reader threads (1 to 256).
    #[arg(long, default_value_t = 1, value_parser = threads)]
    threads: usize,
    /// Seconds per measurement (above 0, at most 3600).
    #[arg(long, default_value_t = 2.0, value_parser = seconds)]
    seconds: f64,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// `--threads`: 1 to [`MAX_THREADS`].
fn threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!("give a whole number from 1 to {MAX_THREADS}")),
    }
}

/// `--seconds`: finite, above 0, at most [`MAX_SECONDS`].
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= MAX_SECONDS => Ok(x),
        _ => Err(format!("give a number above 0 and at most {MAX_SECONDS}")),
    }
}

/// Runs `keycache bench`.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir())?;
    let r = keycache_bench::bench_store(&store, a.threads, a.seconds)?;
    if a.json.json {
        print_json(&r);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{} keys, {} thread(s), {} s per measurement",
        r.keys,
        r.threads,
        a.seconds
    );
    outln!("{:<14} {:>16} {:>14}", "lookup", "lookups/s", "ns/lookup");
    for (name, rate) in [
        ("hit", r.hit),
        ("miss", r.miss),
        ("get_many", r.get_many),
        ("get_in", r.get_in),
        ("reader_get_in", r.reader_get_in),
        ("get_many_in", r.get_many_in),
    ] {
        outln!(
            "{:<14} {:>16.0} {:>14.1}",
            name,
            rate.lookups_per_s,
            rate.ns_per_lookup
        );
    }
    Ok(ExitCode::SUCCESS)
}
