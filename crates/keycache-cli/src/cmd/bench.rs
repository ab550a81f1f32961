//! `keycache bench`: lookup throughput of an existing store on this
//! machine (the measurement is `keycache_bench::bench_store`).

use std::process::ExitCode;

use crate::args::{Json, Layout, StoreDir};
use crate::output::{print_json, CmdResult};

/// The arguments of `keycache bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: StoreDir,
    /// Reader threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// Runs `keycache bench`.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir)?;
    let r = keycache_bench::bench_store(&store, a.threads, a.seconds)?;
    if a.json.json {
        print_json(&r);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} keys, {} thread(s), {} s per measurement",
        r.keys, r.threads, a.seconds
    );
    println!("{:<14} {:>16} {:>14}", "lookup", "lookups/s", "ns/lookup");
    for (name, rate) in [
        ("hit", r.hit),
        ("miss", r.miss),
        ("get_many", r.get_many),
        ("get_in", r.get_in),
        ("reader_get_in", r.reader_get_in),
        ("get_many_in", r.get_many_in),
    ] {
        println!(
            "{:<14} {:>16.0} {:>14.1}",
            name, rate.lookups_per_s, rate.ns_per_lookup
        );
    }
    Ok(ExitCode::SUCCESS)
}
