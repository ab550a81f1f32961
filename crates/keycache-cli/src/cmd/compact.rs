//! `keycache compact`: both banks rebuilt without garbage and tombstones,
//! with the `master_keys` bank beside them (Salt opens all three with one
//! `mmap_key_size`).

use std::process::ExitCode;

use keycache::report;
use keycache::table::OpenOptions;
use keycache_merge::history::HistoryOptions;

use crate::args::{announce_lock_wait, ConfiguredStore, Json, StoreArgs, User};
use crate::output::{esc_path, outln, print_json, CmdError, CmdResult};

/// The arguments of `keycache compact`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("user", |a| a.help("Owner of the files written (USER[:GROUP], names or numbers). Default: the owner of the files replaced")))]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// New table size of every bank (keys, denied_keys, master_keys); the
    /// Salt master config then needs `mmap_key_size: N`. Refused when the
    /// entries of a bank would fill more than 80% of it.
    #[arg(long = "to-size", value_name = "N")]
    to_size: Option<u64>,
    #[command(flatten)]
    user: User,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// A compaction's error; an overfull `--to-size` names the option that
/// fixes it (`--size` is the current layout's, and means something else).
fn compact_error(e: keycache::Error) -> CmdError {
    match e {
        keycache::Error::Overfull {
            path,
            entries,
            size,
            load,
            max_load,
            suggested,
        } => CmdError::usage(format!(
            "{}: {entries} entries would fill {:.0}% of a table of size {size} (keycache refuses above {:.0}%); \
             use --to-size {suggested} and then set `mmap_key_size: {suggested}` in the Salt master config",
            esc_path(&path),
            load * 100.0,
            max_load * 100.0
        )),
        e => e.into(),
    }
}

/// Runs `keycache compact`.
pub(crate) fn run(a: Args) -> CmdResult {
    let resolved = a.layout.resolve(&a.store.dir(), true)?;
    let dir = &resolved.dir;
    let ownership = a.user.ownership()?;
    let opts = OpenOptions {
        ownership,
        ..a.layout.options(resolved.params)
    };
    // Refusals (a layout that is not the files', a size too small) come
    // before the notice of a wait for the lock, and before any write.
    {
        let store = a.layout.open_with(dir, opts.clone())?;
        if let Some(size) = a.to_size {
            report::check_compact_size(&store, size).map_err(compact_error)?;
        }
    }
    announce_lock_wait(dir);
    let r = report::compact_report(dir, &opts, a.to_size).map_err(compact_error)?;
    // A store without a history (made by an older keycache, or by Salt's
    // own writer) begins one here, as one being made does; an etcd replica
    // never merges with peers: it keeps none.
    if !dir.join(keycache::format::REPLICA_FILE).exists() {
        // In the size the compaction left (`--to-size`).
        let mut now = opts.clone();
        now.params = keycache::Params::from_files(dir, now.params);
        let store = keycache::Store::open_with(dir, &now)?;
        let begun =
            keycache_merge::history::begin_if_missing(&store, &HistoryOptions::default(), None)?;
        // The removal log (`.keycache-removed`, which a history makes every
        // removal append to) folded into the history, as a snapshot folds
        // it: a master that never merges does not grow it for ever.
        if !begun {
            if let Err(e) = keycache_merge::snapshot::take(&store, &Default::default()) {
                crate::output::errln!(
                    "keycache: {}: the removal log was not folded into the history (a snapshot \
                     or merge will): {e}",
                    esc_path(dir)
                );
            }
        }
    }
    if a.json.json {
        print_json(&r);
    } else {
        outln!(
            "compacted {}{}: heap {} -> {} bytes, {} -> 0 deleted slots",
            esc_path(dir),
            if r.master_keys {
                " (keys, denied_keys and master_keys)"
            } else {
                ""
            },
            r.before.heap_total_bytes,
            r.after.heap_total_bytes,
            r.before.deleted
        );
        if a.to_size.is_some() {
            outln!(
                "table size is now {0}: set `mmap_key_size: {0}` in the Salt master config",
                r.size
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
