//! `keycache merge`: a peer's snapshot merged into the store: per entry,
//! the version that wins (see `keycache_merge::merge`), in one batch under both
//! banks' locks, with the key tree in step; each change recorded in the
//! audit trail (`keycache::audit`) as a `merge`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use keycache_merge::history::{show_ident, History, HistoryOptions, Kind, Version};
use keycache_merge::merge::{self, Base, BaseFile, MergeOptions, MergePlan, PlanCounts};
use keycache_merge::snapshot::{Entry, Snapshot};

use crate::args::{announce_lock_wait, Json, Reason, StoreArgs};
use crate::cmd::snapshot::lock_wait;
use crate::cmd::state::TreeMode;
use crate::output::{
    errln, esc, esc_path, exit, outln, print_json, print_tree_changes, CmdError, CmdResult,
};

/// The arguments of `keycache merge`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The store directory, optional (default: the one the Salt master
    /// config names, see -c), then their snapshot: a file, or `-` for
    /// stdin.
    #[arg(value_name = "[STORE] THEIRS", num_args = 1..=2, required = true)]
    paths: Vec<PathBuf>,
    /// The base file of the last merge from this peer (written by
    /// --write-base): a snapshot of the same store older than it is
    /// refused. A missing FILE is no base (the first merge); one that
    /// cannot be read is an error.
    #[arg(long, value_name = "FILE")]
    base: Option<PathBuf>,
    /// After the merge, write the base for the next merge from this peer
    /// to FILE (prepared before the merge writes anything, put in place
    /// after it).
    #[arg(long, value_name = "FILE")]
    write_base: Option<PathBuf>,
    /// Print the plan; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take the merge even when it would delete or take out of accepted
    /// more than --max-revoke-percent of the store's keys (a peer that
    /// really deleted most keys: salt-key -D).
    #[arg(long)]
    allow_mass_revoke: bool,
    /// The share of the store's keys, in percent, one merge may delete or
    /// take out of accepted (10 keys always may).
    #[arg(long, value_name = "PERCENT", default_value_t = 50)]
    max_revoke_percent: u32,
    /// Merge even when this store's directory or the snapshot's store has
    /// no cluster key (neither cluster.pub nor master.pub): the merge then
    /// cannot refuse a snapshot of another cluster.
    #[arg(long)]
    allow_unknown_cluster: bool,
    /// How long tombstones (deletions) are kept, in days; snapshots older
    /// than that are refused. Give every peer the same.
    #[arg(long, value_name = "DAYS", default_value_t = 30)]
    horizon_days: u64,
    /// How far ahead of this clock a peer's clock may be, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    max_clock_skew: u64,
    /// Keep the key tree of the store's directory (minions/, ...) in step,
    /// as accept/reject/delete do: `auto` when it has a `minions` entry,
    /// `accepted` minions/ alone. Default: the master config's
    /// keycache_tree when the config is read, else auto.
    #[arg(long, value_enum, value_name = "WHEN")]
    tree: Option<TreeMode>,
    /// How long to wait for each bank's lock, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    lock_wait: f64,
    /// Accepted for the timers of keycache 0.1 and ignored: merges order
    /// versions, there are no conflicts left to settle.
    #[arg(long, value_name = "POLICY", hide = true)]
    on_conflict: Option<String>,
    /// Accepted for the timers of keycache 0.1 and ignored.
    #[arg(long, value_name = "POLICY", hide = true)]
    on_key_mismatch: Option<String>,
    #[command(flatten)]
    reason: Reason,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

impl Args {
    fn options(&self) -> Result<MergeOptions, CmdError> {
        Ok(MergeOptions {
            history: HistoryOptions {
                horizon: Duration::from_secs(self.horizon_days.saturating_mul(86_400)),
                ..HistoryOptions::default()
            },
            lock_wait: lock_wait(self.lock_wait)?,
            max_skew: Duration::from_secs(self.max_clock_skew),
            max_revoke_percent: self.max_revoke_percent,
            allow_mass_revoke: self.allow_mass_revoke,
            allow_unknown_cluster: self.allow_unknown_cluster,
        })
    }
}

/// Reads their snapshot from a file, or from stdin for `-`, keeping only
/// what the store (history `h`) does not hold already.
fn read(h: &History, path: &Path) -> Result<Snapshot, CmdError> {
    if path == Path::new("-") {
        if std::io::stdin().is_terminal() {
            return Err(CmdError::usage(
                "refusing to read a snapshot from a terminal: pipe it (ssh peer keycache \
                 snapshot | keycache merge -) or give a file",
            ));
        }
        Ok(merge::read_snapshot(
            h,
            &mut std::io::stdin().lock(),
            "stdin",
        )?)
    } else {
        let mut f = std::fs::File::open(path).map_err(|e| keycache::Error::Io {
            path: path.to_path_buf(),
            op: "open the snapshot",
            source: e,
        })?;
        Ok(merge::read_snapshot(h, &mut f, &path.to_string_lossy())?)
    }
}

/// `e`, naming the snapshot's file (`path`) when it is about the snapshot.
fn name_snapshot(e: keycache_merge::Error, path: &Path) -> keycache_merge::Error {
    match e {
        keycache_merge::Error::UnknownCluster {
            side,
            snapshot: true,
            why,
        } => {
            let file = if path == Path::new("-") {
                "from stdin".to_owned()
            } else {
                esc_path(path)
            };
            keycache_merge::Error::UnknownCluster {
                side: side.replacen("the snapshot", &format!("the snapshot {file}"), 1),
                snapshot: true,
                why,
            }
        }
        e => e,
    }
}

/// A version in the JSON output.
#[derive(Debug, Serialize)]
struct JsonVersion {
    kind: &'static str,
    stamp: u64,
    /// xxh3-64 of the kind and key (0 for absent), in hex.
    hash: String,
}

fn json_version(v: Version) -> JsonVersion {
    JsonVersion {
        kind: v.kind.name(),
        stamp: v.stamp,
        hash: format!("{:016x}", v.hash),
    }
}

/// One plan entry in the JSON output.
#[derive(Debug, Serialize)]
struct JsonEntry {
    bank: &'static str,
    id: String,
    action: &'static str,
    ours: Option<JsonVersion>,
    theirs: JsonVersion,
    result: JsonVersion,
}

/// The JSON output.
#[derive(Debug, Serialize)]
struct Report {
    store: String,
    dry_run: bool,
    their_store: String,
    their_generation: u64,
    entries: Vec<JsonEntry>,
    counts: PlanCounts,
    /// Entries of the store written (0 in a dry run).
    written: usize,
    /// Key files written and removed (paths), when the tree is kept.
    tree: Option<keycache::tree::TreeChanges>,
    /// Where the next base was written, if it was.
    base_written: Option<String>,
}

/// A value as the text plan shows it.
fn shown(kind: Option<Kind>) -> &'static str {
    kind.map_or("absent", Kind::name)
}

fn print_text(dir: &Path, plan: &MergePlan, dry_run: bool, written: usize) {
    for e in &plan.entries {
        let mut line = format!(
            "{:<8} {:<11} {}: {} -> {}",
            e.action.name(),
            e.bank().name(),
            esc(e.id()),
            shown(e.ours.map(|o| o.kind)),
            shown(Some(e.result.kind))
        );
        let theirs: &Entry = &e.result;
        if let Some(o) = e.ours {
            if o.kind != Kind::Absent
                && theirs.kind != Kind::Absent
                && o.hash != theirs.version().hash
            {
                line.push_str(" (another key)");
            }
        }
        if e.action == merge::Action::Held {
            line.push_str(": accepted on the peer long ago, unknown here; held pending");
        }
        outln!("{line}");
    }
    let c = plan.counts();
    outln!(
        "{} {}: {} added, {} changed, {} deleted, {} held pending; {} {}",
        if dry_run {
            "would merge into"
        } else {
            "merged into"
        },
        esc_path(dir),
        c.added,
        c.changed,
        c.deleted,
        c.held,
        if dry_run { c.store_changes } else { written },
        if dry_run {
            "entries to write"
        } else {
            "entries written"
        },
    );
}

/// Runs `keycache merge`: exit code 0 when merged (or planned, with
/// --dry-run), 1 when it was but entries were held pending for an
/// operator, 2 on errors and refusals (nothing is written then).
pub(crate) fn run(a: Args) -> CmdResult {
    let (store_dir, theirs_path) = match a.paths.as_slice() {
        [t] => (PathBuf::new(), t.clone()),
        [s, t] => (s.clone(), t.clone()),
        _ => return Err(CmdError::usage("give [STORE] THEIRS")),
    };
    if a.on_conflict.is_some() || a.on_key_mismatch.is_some() {
        errln!(
            "keycache: --on-conflict and --on-key-mismatch are ignored: merges take the later \
             version of each entry, and never undo a revocation"
        );
    }
    let opts = a.options()?;
    let base = match a.base.as_deref() {
        None => None,
        Some(p) => match Base::read_file(p)? {
            BaseFile::Missing => None,
            BaseFile::Old => {
                errln!(
                    "keycache: {} is a base of an older keycache (a whole snapshot): ignored, \
                     --write-base replaces it",
                    esc_path(p)
                );
                None
            }
            BaseFile::Base(b) => Some(b),
        },
    };
    // Each entry it changes is recorded in the audit trail, as a merge.
    let (store, _) = TreeMode::open_recorded(
        a.tree,
        &a.layout,
        &store_dir,
        TreeMode::Auto,
        a.reason.reason.clone(),
        Some("merge"),
    )?;
    if !a.dry_run {
        super::etcd::refuse_local_write(store.dir(), "merge")?;
    }
    let history = History::load(store.dir(), &opts.history)?;
    let theirs = read(&history, &theirs_path)?;
    // Before the base is prepared: a refusal leaves no file behind.
    let cluster = keycache_merge::history::cluster_of(&store)?;
    merge::check_cluster_known(Some(store.dir()), cluster, &theirs, &opts)
        .map_err(|e| name_snapshot(e, &theirs_path))?;
    if let Some(b) = &base {
        b.check(&theirs)?;
    }
    let (plan, report, base_written) = if a.dry_run {
        (
            merge::dry_run_with(&store, history, &theirs, &opts)?,
            merge::MergeReport::default(),
            None,
        )
    } else {
        // The next base is written before the merge writes anything: a
        // base that cannot be written refuses the merge.
        let prepared = a
            .write_base
            .as_deref()
            .map(|p| Base::of(&theirs).prepare(p))
            .transpose()?;
        announce_lock_wait(store.dir());
        let (plan, report) = merge::merge_with(&store, history, &theirs, &opts)?;
        if let Some(p) = prepared {
            p.commit()?;
        }
        let written = a
            .write_base
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned());
        (plan, report, written)
    };
    let counts = plan.counts();
    if a.json.json {
        let entries = plan
            .entries
            .iter()
            .map(|e| JsonEntry {
                bank: e.bank().name(),
                id: e.id().to_owned(),
                action: e.action.name(),
                ours: e.ours.map(json_version),
                theirs: json_version(e.theirs.version()),
                result: json_version(e.result.version()),
            })
            .collect();
        print_json(&Report {
            store: store.dir().to_string_lossy().into_owned(),
            dry_run: a.dry_run,
            their_store: show_ident(&plan.their_store),
            their_generation: plan.their_generation,
            entries,
            counts,
            written: report.written,
            tree: store.tree().is_on().then(|| report.tree.clone()),
            base_written,
        });
    } else {
        print_text(store.dir(), &plan, a.dry_run, report.written);
        let rel = |v: &[PathBuf]| -> Vec<PathBuf> {
            v.iter()
                .map(|p| p.strip_prefix(store.dir()).unwrap_or(p).to_path_buf())
                .collect()
        };
        let t = &report.tree;
        print_tree_changes("Key tree: ", ".", &rel(&t.written), &rel(&t.removed));
    }
    if counts.held > 0 {
        errln!(
            "keycache: {} id(s) accepted on the peer longer ago than the tombstone horizon, and \
             unknown here, were taken pending: check their fingerprints before accepting them",
            counts.held
        );
    }
    Ok(exit(counts.held == 0))
}
