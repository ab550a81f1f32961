//! `keycache export`: the store written back out as a `localfs_key` tree.

use std::path::PathBuf;

use crate::args::{Json, Layout, StoreDir};
use crate::output::{exit, print_json_line, CmdResult};

/// The arguments of `keycache export`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: StoreDir,
    /// The pki_dir to write minions, minions_pre, ... into.
    #[arg(long, value_name = "PKI_DIR")]
    to: PathBuf,
    /// Overwrite key files whose content differs.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// Runs `keycache export`: exit code 1 when files that differ were left
/// alone.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir)?;
    let r = keycache::export::export(&store, &a.to, a.force)?;
    if a.json.json {
        // One line, unlike the other commands' JSON.
        print_json_line(&r);
    } else {
        println!(
            "exported to {}: {} written, {} unchanged",
            a.to.display(),
            r.written,
            r.unchanged
        );
        for c in &r.conflicts {
            eprintln!(
                "keycache: {c}: exists with different content; not overwritten (use --force)"
            );
        }
    }
    Ok(exit(r.conflicts.is_empty()))
}
