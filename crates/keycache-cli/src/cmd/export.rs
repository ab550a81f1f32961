//! `keycache export`: the store written back out as a `localfs_key` tree,
//! made equal to the store (key files of ids no longer in a state are
//! removed).

use std::path::PathBuf;

use keycache::export::ExportOptions;

use crate::args::{ConfiguredStore, Json, StoreArgs};
use crate::output::{errln, esc, esc_path, outln, print_json_line, CmdError, CmdResult};

/// The arguments of `keycache export`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// The pki_dir to write minions, minions_pre, ... into. Key files of ids
    /// the store no longer holds in that state are removed; entries whose
    /// names are not minion ids, and dot-files, are left alone.
    #[arg(long, value_name = "PKI_DIR")]
    to: PathBuf,
    /// Also overwrite the key files of minions_pre/, minions_rejected/ and
    /// minions_denied/ whose content differs from the store's (left alone
    /// and reported without it). A file of minions/ that differs is always
    /// replaced: Salt's validate_token would keep letting its old key in.
    #[arg(long)]
    force: bool,
    /// Show what would be written and removed; change nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// Runs `keycache export`: exit code 1 when files that differ were left
/// alone, 2 when a value was withheld (it holds a private key block) or an
/// entry could neither be replaced nor removed (nothing is written then).
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir())?;
    let opts = ExportOptions {
        force: a.force,
        dry_run: a.dry_run,
    };
    let r = keycache::export::export(&store, &a.to, &opts)?;
    if a.json.json {
        // One line, unlike the other commands' JSON.
        print_json_line(&r);
    } else {
        let (head, write, remove) = if r.dry_run {
            ("would export to", "to write", "to remove")
        } else {
            ("exported to", "written", "removed")
        };
        outln!(
            "{head} {}: {} {write}, {} unchanged, {} {remove}",
            esc_path(&a.to),
            r.written,
            r.unchanged,
            r.removed.len()
        );
        for p in &r.removed {
            outln!(
                "{}: {}",
                if r.dry_run { "would remove" } else { "removed" },
                esc(p)
            );
        }
        for p in &r.replaced {
            outln!(
                "{}: {} (it held another key than the one the store accepts)",
                if r.dry_run {
                    "would replace"
                } else {
                    "replaced"
                },
                esc(p)
            );
        }
        for p in &r.ignored {
            outln!("left alone: {} (not a minion id)", esc(p));
        }
        for c in &r.conflicts {
            errln!(
                "keycache: {}: exists with different content; not overwritten (use --force)",
                esc(c)
            );
        }
    }
    for id in &r.withheld {
        errln!(
            "keycache: {}: withheld: the stored key holds a PRIVATE KEY block (not written; delete or replace the key)",
            esc(id)
        );
    }
    if !r.withheld.is_empty() {
        return Err(CmdError::usage(format!(
            "{} key(s) withheld: they hold private key material",
            r.withheld.len()
        )));
    }
    Ok(crate::output::exit(r.conflicts.is_empty()))
}
