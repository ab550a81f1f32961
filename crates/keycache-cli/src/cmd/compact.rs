//! `keycache compact`: both banks rebuilt without garbage and tombstones.

use std::process::ExitCode;

use keycache::report;
use keycache::table::OpenOptions;

use crate::args::{Json, Layout, StoreDir, User};
use crate::output::{print_json, CmdResult};

/// The arguments of `keycache compact`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("user", |a| a.help("Owner of the files written (user name or UID[:GID]). Default: the owner of the files replaced")))]
pub(crate) struct Args {
    #[command(flatten)]
    store: StoreDir,
    /// New table size; the Salt master config then needs `mmap_key_size: N`.
    #[arg(long = "to-size", value_name = "N")]
    to_size: Option<u64>,
    #[command(flatten)]
    user: User,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// Runs `keycache compact`.
pub(crate) fn run(a: Args) -> CmdResult {
    let dir = &a.store.dir;
    let ownership = a.user.ownership()?;
    let opts = OpenOptions {
        ownership,
        ..a.layout.options(a.layout.params(dir)?)
    };
    let r = report::compact(dir, &opts, a.to_size)?;
    if a.json.json {
        print_json(&r);
    } else {
        println!(
            "compacted {}: heap {} -> {} bytes, {} -> 0 deleted slots",
            dir.display(),
            r.before.heap_total_bytes,
            r.after.heap_total_bytes,
            r.before.deleted
        );
        if a.to_size.is_some() {
            println!(
                "table size is now {0}: set `mmap_key_size: {0}` in the Salt master config",
                r.size
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
