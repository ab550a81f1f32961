//! `keycache merge`: a peer's snapshot merged into the store (three-way
//! with `--base`, else a union), in one atomic commit; see
//! `keycache::merge` for the rules and the policies.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use serde::Serialize;

use keycache::merge::{self, KeyMismatch, MergeOptions, MergePlan, PlanCounts, Policy};
use keycache::snapshot::{Entry, Snapshot};

use crate::args::{announce_lock_wait, Json, Layout};
use crate::cmd::snapshot::lock_wait;
use crate::cmd::state::TreeMode;
use crate::output::{errln, esc, esc_path, exit, outln, print_json, CmdError, CmdResult};

/// The arguments of `keycache merge`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The store directory, optional (default: the one the Salt master
    /// config names, see -c), then their snapshot: a file, or `-` for
    /// stdin.
    #[arg(value_name = "[STORE] THEIRS", num_args = 1..=2, required = true)]
    paths: Vec<PathBuf>,
    /// Their snapshot merged last (the file --write-base wrote at the last
    /// merge from this peer): a three-way merge, which also takes their
    /// deletions. Without it (or while FILE does not exist yet), a union
    /// that adds and never deletes, unless their snapshot carries a seen
    /// section. `-` for stdin.
    #[arg(long, value_name = "FILE")]
    base: Option<PathBuf>,
    /// How a conflict (both sides changed an entry, differently) is settled:
    /// `restrictive` (the default; symmetric: rejected over pending over
    /// accepted, a deletion over a change), `newer` (the later Salt slot
    /// mtime), `ours`, `theirs`.
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = ConflictArg::Restrictive)]
    on_conflict: ConflictArg,
    /// How the same id with two different public keys (both changed) is
    /// settled: `pending` (the default: held out of accepted, with the
    /// greater key bytewise, for the operator to check), `reject`, `newer`,
    /// `ours`, `theirs` (that side's entry as it is, accepted if it was).
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = MismatchArg::Pending)]
    on_key_mismatch: MismatchArg,
    /// Print the plan; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// After the merge, write their snapshot (without its seen section: the
    /// state both stores now descend from) to FILE atomically: the --base of
    /// the next merge from the same peer, and the --seen of the snapshots
    /// this store sends to that peer.
    #[arg(long, value_name = "FILE")]
    write_base: Option<PathBuf>,
    /// Keep the key tree of the store's directory (minions/, ...) in step,
    /// as accept/reject/delete do: `auto` when it has a `minions` entry.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = TreeMode::Auto)]
    tree: TreeMode,
    /// How long to wait for each bank's lock, in seconds, when our snapshot
    /// is taken.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    lock_wait: f64,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// `--on-conflict`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ConflictArg {
    Restrictive,
    Newer,
    Ours,
    Theirs,
}

/// `--on-key-mismatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MismatchArg {
    Pending,
    Reject,
    Newer,
    Ours,
    Theirs,
}

impl Args {
    fn options(&self) -> MergeOptions {
        MergeOptions {
            on_conflict: match self.on_conflict {
                ConflictArg::Restrictive => Policy::Restrictive,
                ConflictArg::Newer => Policy::Newer,
                ConflictArg::Ours => Policy::Ours,
                ConflictArg::Theirs => Policy::Theirs,
            },
            on_key_mismatch: match self.on_key_mismatch {
                MismatchArg::Pending => KeyMismatch::Pending,
                MismatchArg::Reject => KeyMismatch::Reject,
                MismatchArg::Newer => KeyMismatch::Newer,
                MismatchArg::Ours => KeyMismatch::Ours,
                MismatchArg::Theirs => KeyMismatch::Theirs,
            },
        }
    }
}

/// Reads a snapshot from a file, or from stdin for `-`.
fn read(path: &Path) -> Result<Snapshot, CmdError> {
    if path == Path::new("-") {
        if std::io::stdin().is_terminal() {
            return Err(CmdError::usage(
                "refusing to read a snapshot from a terminal: pipe it (ssh peer keycache \
                 snapshot | keycache merge -) or give a file",
            ));
        }
        Ok(Snapshot::read_named(&mut std::io::stdin().lock(), "stdin")?)
    } else {
        Ok(Snapshot::read_file(path)?)
    }
}

/// An entry in the JSON output.
#[derive(Debug, Serialize)]
struct JsonValue {
    state: &'static str,
    /// xxh3-64 of the public key's bytes, in hex.
    key_xxh3: String,
    mtime: u64,
}

fn json_value(e: &Option<Entry>) -> Option<JsonValue> {
    e.as_ref().map(|e| JsonValue {
        state: e.state_name(),
        key_xxh3: format!("{:016x}", keycache::format::hash(&e.pub_key)),
        mtime: e.mtime,
    })
}

/// One plan entry in the JSON output.
#[derive(Debug, Serialize)]
struct JsonEntry {
    bank: &'static str,
    id: String,
    action: &'static str,
    ours: Option<JsonValue>,
    theirs: Option<JsonValue>,
    base: Option<JsonValue>,
    seen: Option<JsonValue>,
    result: Option<JsonValue>,
    reason: String,
    key_mismatch: bool,
    changes_store: bool,
}

/// The JSON output.
#[derive(Debug, Serialize)]
struct Report {
    store: String,
    dry_run: bool,
    three_way: bool,
    on_conflict: &'static str,
    on_key_mismatch: &'static str,
    entries: Vec<JsonEntry>,
    counts: PlanCounts,
    /// Entries of the store written (0 in a dry run).
    written: usize,
    /// Key files written and removed (paths), when the tree is kept.
    tree: Option<keycache::store::TreeChanges>,
    /// Where the next base was written, if it was.
    base_written: Option<String>,
}

/// A value as the text plan shows it.
fn shown(e: &Option<Entry>) -> String {
    match e {
        None => "absent".into(),
        Some(e) => e.state_name().into(),
    }
}

fn print_text(dir: &Path, plan: &MergePlan, dry_run: bool, written: usize) {
    for e in &plan.entries {
        let mut line = format!(
            "{:<8} {:<11} {}: {} -> {}",
            e.action.name(),
            e.bank.name(),
            esc(&e.id),
            shown(&e.ours),
            shown(&e.result)
        );
        if e.ours.is_some()
            && e.result.is_some()
            && e.ours.as_ref().map(|o| &o.pub_key) != e.result.as_ref().map(|r| &r.pub_key)
        {
            line.push_str(" (another key)");
        }
        if e.action == merge::Action::Conflict {
            line.push_str(&format!(": {}", esc(&e.reason)));
        }
        outln!("{line}");
    }
    let c = plan.counts();
    outln!(
        "{} {}: {} added, {} changed, {} deleted, {} conflicts ({} key mismatches); {} {}",
        if dry_run {
            "would merge into"
        } else {
            "merged into"
        },
        esc_path(dir),
        c.added,
        c.changed,
        c.deleted,
        c.conflicts,
        c.key_mismatches,
        if dry_run { c.store_changes } else { written },
        if dry_run {
            "entries to write"
        } else {
            "entries written"
        },
    );
}

/// Runs `keycache merge`: exit code 0 when merged (or planned, with
/// --dry-run), 1 when it was, but a key mismatch (one id, two public keys)
/// was reported, 2 on errors (nothing is written then).
pub(crate) fn run(a: Args) -> CmdResult {
    let (store_dir, theirs_path) = match a.paths.as_slice() {
        [t] => (PathBuf::new(), t.clone()),
        [s, t] => (s.clone(), t.clone()),
        _ => return Err(CmdError::usage("give [STORE] THEIRS")),
    };
    let stdin = Path::new("-");
    if theirs_path == stdin && a.base.as_deref() == Some(stdin) {
        return Err(CmdError::usage(
            "THEIRS and --base cannot both be read from stdin (-)",
        ));
    }
    let snap_opts = lock_wait(a.lock_wait)?;
    let opts = a.options();
    let theirs = read(&theirs_path)?;
    let base = match a.base.as_deref() {
        // The first run of a timer: no base yet.
        Some(p) if p != stdin && !p.exists() => {
            errln!(
                "keycache: no base {} yet: merging as a union (adds, never deletes)",
                esc_path(p)
            );
            None
        }
        p => p.map(read).transpose()?,
    };
    let mut store = a.layout.open(&store_dir)?;
    store.set_tree(a.tree.sync(store.dir()));
    let (plan, report) = if a.dry_run {
        let ours = keycache::snapshot::take(&store, &snap_opts)?;
        (
            merge::plan(&ours, &theirs, base.as_ref(), &opts),
            merge::MergeReport::default(),
        )
    } else {
        announce_lock_wait(store.dir());
        merge::merge(&store, &theirs, base.as_ref(), &opts, &snap_opts)?
    };
    let mut base_written = None;
    if let (Some(path), false) = (&a.write_base, a.dry_run) {
        let next = Snapshot {
            seen: None,
            ..theirs.clone()
        };
        next.write_file(path)?;
        base_written = Some(path.to_string_lossy().into_owned());
    }
    let counts = plan.counts();
    if a.json.json {
        let entries = plan
            .entries
            .iter()
            .map(|e| JsonEntry {
                bank: e.bank.name(),
                id: e.id.clone(),
                action: e.action.name(),
                ours: json_value(&e.ours),
                theirs: json_value(&e.theirs),
                base: json_value(&e.base),
                seen: json_value(&e.seen),
                result: json_value(&e.result),
                reason: e.reason.clone(),
                key_mismatch: e.key_mismatch,
                changes_store: e.changes_store(),
            })
            .collect();
        print_json(&Report {
            store: store.dir().to_string_lossy().into_owned(),
            dry_run: a.dry_run,
            three_way: plan.three_way,
            on_conflict: opts.on_conflict.name(),
            on_key_mismatch: opts.on_key_mismatch.name(),
            entries,
            counts,
            written: report.written,
            tree: store.tree().is_on().then(|| report.tree.clone()),
            base_written,
        });
    } else {
        print_text(store.dir(), &plan, a.dry_run, report.written);
        let rel = |p: &PathBuf| esc_path(p.strip_prefix(store.dir()).unwrap_or(p));
        for p in &report.tree.written {
            outln!("Key tree: wrote {}.", rel(p));
        }
        for p in &report.tree.removed {
            outln!("Key tree: removed {}.", rel(p));
        }
    }
    if counts.key_mismatches > 0 {
        errln!(
            "keycache: {} id(s) hold different public keys on the two peers: see the plan \
             (key mismatch); with --on-key-mismatch {} none was accepted",
            counts.key_mismatches,
            opts.on_key_mismatch.name()
        );
    }
    Ok(exit(counts.key_mismatches == 0))
}
