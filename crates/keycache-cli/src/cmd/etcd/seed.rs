//! `keycache etcd seed`: the key state of a store, or of a `localfs_key`
//! tree, into the etcd prefix (`keycache_etcd::seed`). A tree is migrated
//! first into a temporary store (the library's migrate, as `keycache
//! migrate` does it), which is removed afterwards.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use keycache::format::{DENIED_INDEX, KEYS_INDEX};
use keycache::migrate::{self, MigrateOptions, Report as MigrateReport};
use keycache::store::Store;
use keycache_etcd::{block_on, seed};
use serde::Serialize;

use crate::args::{Json, StoreArgs};
use crate::output::{errln, esc, esc_path, outln, print_json, CmdError, CmdResult};

/// The arguments of `keycache etcd seed`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Seed from this instead of the master's store: a keycache/mmap_key
    /// store directory (it holds .mmap_keys.idx; a store's own key tree
    /// beside it is not read), or a localfs_key tree (minions/,
    /// minions_pre/, minions_rejected/, minions_denied/), which is migrated
    /// into a temporary store first.
    #[arg(long, value_name = "STORE_OR_TREE")]
    from: Option<PathBuf>,
    /// Seed a prefix that already holds keys: its values are replaced by
    /// the source's, and its keys the source lacks are removed.
    #[arg(long)]
    replace: bool,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// What `keycache etcd seed` did.
#[derive(Debug, Serialize)]
struct Out {
    prefix: String,
    /// The store or tree read.
    from: PathBuf,
    /// `store` or `tree`.
    source: &'static str,
    /// Entries put.
    put: u64,
    /// Keys of the prefix removed (`--replace`).
    removed: u64,
    /// Transactions committed.
    txns: u64,
    /// etcd's revision after the last one.
    revision: i64,
    /// Entries of a tree that were not migrated (and so not seeded).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    skipped: Vec<migrate::Skipped>,
}

/// The source of a seed: a store, and the temporary directory it lives in
/// when it was migrated from a tree.
struct Source {
    store: Store,
    kind: &'static str,
    from: PathBuf,
    skipped: Vec<migrate::Skipped>,
    _scratch: Option<tempfile::TempDir>,
}

/// Whether `dir` holds a store (either bank's index file).
fn is_store(dir: &Path) -> bool {
    [KEYS_INDEX, DENIED_INDEX]
        .iter()
        .any(|n| std::fs::symlink_metadata(dir.join(n)).is_ok())
}

/// Whether `dir` holds a `localfs_key` tree (one of its state
/// directories).
fn is_tree(dir: &Path) -> bool {
    [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ]
    .iter()
    .any(|n| std::fs::symlink_metadata(dir.join(n)).is_ok_and(|m| m.is_dir()))
}

/// Opens the source: the master's store, `--from`'s store, or `--from`'s
/// tree migrated into a temporary store (with the master's layout, so
/// that what does not fit the master's store is refused here too).
fn source(a: &Args) -> Result<Source, CmdError> {
    let Some(from) = &a.from else {
        let store = a.layout.open(Path::new(""))?;
        return Ok(Source {
            from: store.dir().to_path_buf(),
            store,
            kind: "store",
            skipped: Vec::new(),
            _scratch: None,
        });
    };
    match std::fs::metadata(from) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(CmdError::usage(format!(
                "--from {}: not a directory (give a store directory or a localfs_key tree)",
                esc_path(from)
            )))
        }
        Err(e) => return Err(CmdError::usage(format!("--from {}: {e}", esc_path(from)))),
    }
    if is_store(from) {
        let r = a.layout.resolve_from(from, "--from", true)?;
        let store = a.layout.open_with(&r.dir, a.layout.options(r.params))?;
        return Ok(Source {
            store,
            kind: "store",
            from: from.clone(),
            skipped: Vec::new(),
            _scratch: None,
        });
    }
    if !is_tree(from) {
        return Err(CmdError::usage(format!(
            "--from {}: neither a store ({KEYS_INDEX}) nor a localfs_key tree (minions/, \
             minions_pre/, minions_rejected/ or minions_denied/)",
            esc_path(from)
        )));
    }
    // The master's layout (its store is not opened: the size is the
    // config's, the flags', or read off its index files).
    let params = a.layout.resolve(Path::new(""), false)?.params;
    let scratch = tempfile::Builder::new()
        .prefix("keycache-seed-")
        .tempdir()
        .map_err(|e| CmdError::usage(format!("a temporary directory for the migration: {e}")))?;
    let opts = MigrateOptions {
        params,
        out: Some(scratch.path().to_path_buf()),
        rebuild_settle: std::time::Duration::ZERO,
        ..MigrateOptions::default()
    };
    let report: MigrateReport = migrate::migrate(from, &opts, &|_, _| {})?;
    let store = a
        .layout
        .open_with(scratch.path(), a.layout.options(params))?;
    Ok(Source {
        store,
        kind: "tree",
        from: from.clone(),
        skipped: report.skipped,
        _scratch: Some(scratch),
    })
}

/// Runs `keycache etcd seed`.
pub(crate) fn run(a: Args) -> CmdResult {
    let settings = super::required(&a.layout, "etcd seed")?;
    let prefix = settings.layout.prefix().to_owned();
    let replace = a.replace;
    // block_on wants etcd's errors; the source's keep their own (Ok(Err)).
    let (kind, from, skipped, s) = block_on(async {
        let mut client = settings.connect().await?;
        // A prefix that holds keys is refused before a tree is migrated.
        if !replace {
            let (n, _) = seed::count(&mut client, &settings).await?;
            if n > 0 {
                return Err(keycache_etcd::Error::PrefixNotEmpty {
                    prefix: prefix.clone(),
                    count: n,
                });
            }
        }
        let src = match source(&a) {
            Ok(src) => src,
            Err(e) => return Ok(Err(e)),
        };
        let s = seed::seed(&mut client, &settings, &src.store, replace).await?;
        Ok(Ok((src.kind, src.from, src.skipped, s)))
    })??;
    let out = Out {
        prefix,
        from,
        source: kind,
        put: s.put,
        removed: s.removed,
        txns: s.txns,
        revision: s.revision,
        skipped,
    };
    if a.json.json {
        print_json(&out);
        return Ok(ExitCode::SUCCESS);
    }
    for sk in &out.skipped {
        errln!("keycache: skipped: {} ({})", esc(&sk.path), esc(&sk.detail));
    }
    outln!(
        "Seeded {} from the {kind} {}: {} entries put in {} transaction{}{}, revision {}.",
        esc(&out.prefix),
        esc_path(&out.from),
        out.put,
        out.txns,
        if out.txns == 1 { "" } else { "s" },
        if replace {
            format!(", {} keys the source lacks removed", out.removed)
        } else {
            String::new()
        },
        out.revision
    );
    Ok(ExitCode::SUCCESS)
}
