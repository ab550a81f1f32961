//! One-shot, atomic migration of a `localfs_key` tree into a store: what
//! `salt-run pki.migrate_to_mmap` does, as one pass with no fsync per key.
//!
//! The four directories are read in parallel; every entry Salt would skip
//! (and a few it would choke on) is skipped with a reason; an id found in
//! several states gets the state Salt gives it (rejected, then pending, then
//! accepted). Both banks are then built in memory, merged with what the
//! target banks already hold (unless `replace`), written under temporary
//! names and renamed into place through [`crate::rebuild`]'s journal, under
//! the banks' locks. When the banks go to another directory than the tree
//! (`out`), the tree is written there too, in the same commit (see
//! `tree.rs`): Salt's `validate_token` reads it there.
//!
//! # Into an existing store
//!
//! The tree wins over the store for every id it holds. A tree read again
//! after an earlier migration may hold files left from before it (a store
//! whose tree is kept in `minions/` alone, or not at all, never removes
//! `minions_pre/<id>` when Salt accepts or rejects the key): every entry
//! whose state the migration changes is listed in the report
//! ([`Report::changes`]), and a change out of accepted or rejected made by
//! a file older than the store's entry is refused
//! ([`Error::StaleTreeFiles`]) unless [`MigrateOptions::replace_states`].
//! No migration leaves `minions/<id>` (what Salt's `validate_token` admits
//! a minion by) for a key it does not hold accepted: one it takes out of
//! accepted, or an id also found in `minions_pre/` or `minions_rejected/`
//! (Salt's precedence makes it pending or rejected; Salt's own migration
//! leaves its `minions/` file). In the tree migrated into its own
//! directory, those files are removed with the banks' commit, with the
//! tree writer of [`crate::tree`]; the rest of the tree is left as it is.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::format::Params;
use crate::format::{DENIED_INDEX, KEYS_INDEX};
use crate::key::KeyState;
use crate::rebuild::{self, Image};
use crate::store::Counts;
use crate::store::Store;
use crate::table::OpenOptions;
use crate::tree::TreeDir;

mod plan;
mod scan;
mod tree;
use scan::{scan_tree, state_bytes, Span, SUM};
pub use tree::would_drop_tree_keys;

/// The highest share of data slots a migration fills before it refuses and
/// asks for a bigger table: linear probing degrades quickly past it.
pub const MAX_LOAD_FACTOR: f64 = 0.8;

/// Largest file accepted as a public key (a 16384-bit RSA key in PEM is
/// under 3 KiB).
pub use crate::pem::MAX_KEY_BYTES;

/// Options of [`migrate`].
#[derive(Clone)]
pub struct MigrateOptions {
    /// Layout of the target banks.
    pub params: Params,
    /// Where to write the banks (a `cluster_pki_dir`); the tree itself when `None`.
    pub out: Option<PathBuf>,
    /// Count and report, write nothing.
    pub dry_run: bool,
    /// Drop entries of the target banks that the tree does not have.
    pub replace: bool,
    /// Take changes out of accepted or rejected that tree files older than
    /// the store's entries make, instead of refusing them
    /// ([`Error::StaleTreeFiles`]).
    pub replace_states: bool,
    /// Skip ids longer than the id size instead of refusing the tree.
    pub skip_long_ids: bool,
    /// Owner and mode of new files (default: those of the target directory, 0600).
    pub ownership: Option<Ownership>,
    /// [`OpenOptions::rebuild_settle`] of the rebuild that swaps the banks in.
    pub rebuild_settle: std::time::Duration,
    /// Called once the store is made, before [`migrate`] returns (not on a
    /// dry run): the peer merge begins the store's history here.
    pub made: Option<Made>,
}

/// A hook of [`MigrateOptions::made`]: the store just made, and the tree it
/// was made from.
pub type Made = std::sync::Arc<dyn Fn(&Store, &Path) -> Result<()> + Send + Sync>;

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            params: Params::default(),
            out: None,
            dry_run: false,
            replace: false,
            replace_states: false,
            skip_long_ids: false,
            ownership: None,
            rebuild_settle: crate::rebuild::DEFAULT_SETTLE,
            made: None,
        }
    }
}

/// Why an entry of the tree was not migrated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum SkipReason {
    /// A symlink: never followed.
    Symlink,
    /// A directory, socket, device...
    NotARegularFile,
    /// A name starting with `.` (Salt's `.key_cache` and the like).
    DotFile,
    /// Salt's `valid_id` refuses the name.
    InvalidId,
    /// Longer than the id size (only with `skip_long_ids`).
    IdTooLong,
    /// The file name is not UTF-8.
    NonUtf8Name,
    /// The file could not be read.
    Unreadable,
    /// The file is empty.
    Empty,
    /// The content is not exactly one PEM public key block with nothing but
    /// whitespace around it (see [`crate::pem`]).
    NotAPublicKey,
    /// The content holds a private key block: never stored, never printed.
    PrivateKey,
    /// Larger than [`MAX_KEY_BYTES`].
    TooLarge,
}

/// One skipped entry.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Skipped {
    /// The path in the tree (lossily decoded when not UTF-8).
    pub path: String,
    /// Why.
    pub reason: SkipReason,
    /// Details (the OS error, the rule broken).
    pub detail: String,
}

/// An id found in several of `minions`, `minions_pre`, `minions_rejected`.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Duplicate {
    /// The id.
    pub id: String,
    /// The states it was found in, in scan order.
    pub found_in: Vec<KeyState>,
    /// The state it got.
    pub state: KeyState,
}

/// An entry of the target's `keys` bank whose state the migration changes
/// (or, dry, would change).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StateChange {
    /// The id.
    pub id: String,
    /// Its state in the store.
    pub from: KeyState,
    /// Its state afterwards: the file's; `None` when dropped (`replace`).
    pub to: Option<KeyState>,
    /// The tree's file that makes the change (the one Salt's precedence
    /// picks); `None` for a drop.
    pub file: Option<PathBuf>,
    /// The file's mtime, Unix nanoseconds.
    pub file_mtime: Option<u64>,
    /// When the store's entry was last written, Unix nanoseconds.
    pub store_mtime: u64,
    /// A change out of accepted or rejected by a file older than the
    /// store's entry: refused unless [`MigrateOptions::replace_states`].
    pub stale: bool,
}

/// What a migration did (or, dry, would do).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Report {
    /// The tree.
    pub pki_dir: PathBuf,
    /// Where the banks were written.
    pub target: PathBuf,
    /// Whether nothing was written.
    pub dry_run: bool,
    /// Key files found per state, as Salt's runner counts them.
    pub found: Counts,
    /// Entries of the tree migrated, per state after precedence.
    pub migrated: Counts,
    /// Entries already in the target banks that the tree lacks, kept.
    pub kept: Counts,
    /// Entries of the target banks dropped by `replace`.
    pub dropped: u64,
    /// Entries of the banks afterwards.
    pub total: Counts,
    /// Ids found in several states.
    pub duplicates: Vec<Duplicate>,
    /// Entries skipped.
    pub skipped: Vec<Skipped>,
    /// Table size (`mmap_key_size`).
    pub size: u64,
    /// Share of the `keys` table's data slots filled afterwards.
    pub load_factor: f64,
    /// Seconds spent.
    pub seconds: f64,
    /// Where the `localfs_key` tree of the migrated store was written (or,
    /// dry, would be): the target, when it is not the tree migrated (Salt's
    /// `validate_token` reads `minions/<id>` there); `None` otherwise.
    pub tree_dir: Option<PathBuf>,
    /// Key files written into that tree.
    pub tree_written: u64,
    /// Key files removed from it.
    pub tree_removed: u64,
    /// Entries of the target's `keys` bank whose state changes, in bank
    /// order.
    pub changes: Vec<StateChange>,
    /// `minions/<id>` files of the tree migrated into its own directory
    /// removed (or, dry, to remove): the keys the migration takes out of
    /// accepted ([`Report::changes`]).
    pub minions_removed: Vec<PathBuf>,
}

/// A key of the tree that is migrated.
struct TreeKey {
    dir: TreeDir,
    /// xxh3 of the id, taken while the reader has it at hand.
    idh: u64,
    /// Where the id is in its part's ids ([`Tree::id`]).
    id: (usize, usize),
    part: usize,
    span: Span,
}

/// Where an entry of a new bank comes from.
#[derive(Clone, Copy)]
enum Src {
    /// `tree[i]`.
    Tree(usize),
    /// `kept[i]`: an entry of the target bank that the tree lacks.
    Kept(usize),
}

/// An entry of the target's `keys` bank whose state the plan changes.
struct PlanChange {
    id: String,
    from: KeyState,
    /// The tree's entry (index in `found`) that replaces it; `None` when
    /// dropped.
    tree: Option<usize>,
    store_mtime: u64,
}

/// An entry of a target bank that is kept: id, value, mtime.
type KeptEntry = (String, Vec<u8>, u64);

/// The contents of both new banks, in insertion (roster) order.
#[derive(Default)]
struct MigrationPlan {
    keys: Vec<Src>,
    denied: Vec<Src>,
    kept_keys: Vec<KeptEntry>,
    kept_denied: Vec<KeptEntry>,
    kept: Counts,
    dropped: u64,
    /// Ids of the target banks that `replace` drops.
    dropped_keys: Vec<String>,
    dropped_denied: Vec<String>,
    total: Counts,
    load_factor: f64,
    /// Entries of the `keys` bank whose state changes.
    changes: Vec<PlanChange>,
}

/// What was read from the tree, after Salt's precedence.
struct Tree {
    /// The readers' buffers, shared with the images that write from them.
    parts: Vec<Arc<Vec<u8>>>,
    /// The ids of each part's keys.
    ids: Vec<String>,
    /// Every key file read, in scan order.
    found: Vec<TreeKey>,
    /// `keys` bank entries (indices in `found`), in first-seen order.
    keys: Vec<usize>,
    /// `denied_keys` bank entries (indices in `found`).
    denied: Vec<usize>,
}

impl Tree {
    /// The id of entry `i`.
    fn id(&self, i: usize) -> &str {
        let k = &self.found[i];
        self.ids
            .get(k.part)
            .and_then(|s| s.get(k.id.0..k.id.0 + k.id.1))
            .unwrap_or_default()
    }

    /// Length of the value of entry `i` (of its bank).
    fn value_len(&self, i: usize) -> usize {
        let k = &self.found[i];
        state_bytes(k.dir) + k.span.len
    }

    /// Where the heap record of entry `i` is: (buffer, range).
    fn record(&self, i: usize) -> (usize, std::ops::Range<usize>) {
        let k = &self.found[i];
        (k.part, k.span.off..k.span.off + SUM + self.value_len(i))
    }

    fn state(&self, i: usize) -> KeyState {
        self.found[i].dir.state().unwrap_or(KeyState::Accepted)
    }
}

/// Migrates the `localfs_key` tree at `pki_dir`. `progress(done, total)` is
/// called as files are read.
pub fn migrate(
    pki_dir: &Path,
    opts: &MigrateOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Report> {
    let start = std::time::Instant::now();
    opts.params.validate()?;
    let target = opts.out.clone().unwrap_or_else(|| pki_dir.to_path_buf());
    if let Err(e) = std::fs::symlink_metadata(pki_dir) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Err(Error::PkiDir {
                path: pki_dir.into(),
                why: "it does not exist".into(),
            });
        }
    }
    let parts = scan_tree(pki_dir, opts, progress)?;

    let mut found = Counts::default();
    let mut skipped = Vec::new();
    let mut keys_found = Vec::new();
    let mut bufs = Vec::with_capacity(parts.len());
    let mut ids = Vec::with_capacity(parts.len());
    for (n, mut p) in parts.into_iter().enumerate() {
        for k in &mut p.keys {
            k.part = n;
        }
        found.accepted += p.found.accepted;
        found.pending += p.found.pending;
        found.rejected += p.found.rejected;
        found.denied += p.found.denied;
        if keys_found.is_empty() {
            keys_found = p.keys;
        } else {
            keys_found.extend(p.keys);
        }
        skipped.extend(p.skipped);
        bufs.push(Arc::new(p.buf));
        ids.push(p.ids);
    }
    let mut tree = Tree {
        parts: bufs,
        ids,
        found: keys_found,
        keys: Vec::new(),
        denied: Vec::new(),
    };

    // Precedence: the last directory scanned wins (rejected > pending >
    // accepted); an id keeps the place where it was first seen. Ids are
    // matched by their hash first (no string is touched for the many ids
    // found in one directory only), then by their bytes.
    let mut dirs_of: HashMap<u64, u8, IdHash> = HashMap::default();
    for k in tree
        .found
        .iter()
        .filter(|k| matches!(k.dir, TreeDir::MinionsPre | TreeDir::MinionsRejected))
    {
        *dirs_of.entry(k.idh).or_default() |= 1 << k.dir.index();
    }
    for k in tree.found.iter().filter(|k| k.dir == TreeDir::Minions) {
        if let Some(m) = dirs_of.get_mut(&k.idh) {
            *m |= 1;
        }
    }
    // Hashes of ids (maybe) in several directories -> (found index,
    // position in `keys`) of the first entry of each such id.
    let mut first: HashMap<u64, Vec<(usize, usize)>, IdHash> = HashMap::default();
    let mut seen: Vec<u8> = Vec::new(); // position in `keys` -> directories (bits)
    for i in 0..tree.found.len() {
        let k = &tree.found[i];
        let d = k.dir;
        if d == TreeDir::MinionsDenied {
            tree.denied.push(i);
            continue;
        }
        let shared = dirs_of.get(&k.idh).is_some_and(|m| m.count_ones() > 1);
        let earlier = if shared {
            first.get(&k.idh).and_then(|v| {
                v.iter()
                    .find(|&&(j, _)| tree.id(j) == tree.id(i))
                    .map(|&(_, pos)| pos)
            })
        } else {
            None
        };
        let pos = match earlier {
            Some(pos) => {
                tree.keys[pos] = i;
                pos
            }
            None => {
                tree.keys.push(i);
                seen.push(0);
                let pos = tree.keys.len() - 1;
                if shared {
                    first.entry(k.idh).or_default().push((i, pos));
                }
                pos
            }
        };
        seen[pos] |= 1 << d.index();
    }
    let duplicates: Vec<Duplicate> = tree
        .keys
        .iter()
        .zip(&seen)
        .filter(|(_, s)| s.count_ones() > 1)
        .map(|(&i, s)| Duplicate {
            id: tree.id(i).to_owned(),
            found_in: TreeDir::ALL
                .into_iter()
                .filter(|d| s & (1 << d.index()) != 0)
                .filter_map(TreeDir::state)
                .collect(),
            state: tree.state(i),
        })
        .collect();
    let mut migrated = Counts::default();
    for &i in &tree.keys {
        bump(&mut migrated, tree.found[i].dir);
    }
    migrated.denied = tree.denied.len() as u64;

    let mut report = Report {
        pki_dir: pki_dir.into(),
        target: target.clone(),
        dry_run: opts.dry_run,
        found,
        migrated,
        kept: Counts::default(),
        dropped: 0,
        total: Counts::default(),
        duplicates,
        skipped,
        size: opts.params.size,
        load_factor: 0.0,
        seconds: 0.0,
        tree_dir: None,
        tree_written: 0,
        tree_removed: 0,
        changes: Vec::new(),
        minions_removed: Vec::new(),
    };
    // The banks go elsewhere than the tree: the tree goes with them.
    let write_tree = !tree::same_dir(pki_dir, &target);
    let topts = OpenOptions {
        params: opts.params,
        ownership: opts.ownership,
        rebuild_settle: opts.rebuild_settle,
        ..OpenOptions::default()
    };
    let store = if target.is_dir() {
        let store = Store::open_with(&target, &topts)?;
        // The existing banks are read for the plan (a dry run's too): with
        // a layout that is not theirs, they would be misread.
        store.check_layout()?;
        Some(store)
    } else {
        None
    };
    // Validate (ids, load factor) before taking any lock or creating a file
    // or directory: a refused migration leaves no trace; the images are
    // built once, under the locks.
    let mut plan = tree.plan(store.as_ref(), &target, opts)?;
    // A dry run lists the changes it would refuse ([`StateChange::stale`]).
    if !opts.dry_run {
        tree.check_stale(&plan, pki_dir, opts)?;
    }
    if opts.dry_run && !write_tree {
        report.minions_removed = unaccepted(&plan, &report.duplicates)
            .iter()
            .map(|(id, _)| pki_dir.join(TreeDir::Minions.name()).join(id.as_str()))
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .collect();
    }
    if write_tree {
        if store.is_some() {
            tree.wants(&plan, &target, opts.replace)?;
        }
        report.tree_dir = Some(target.clone());
    }
    let mut store = match (store, opts.dry_run) {
        (Some(s), _) => Some(s),
        (None, true) => None,
        (None, false) => {
            create_target(&target, opts.ownership.as_ref())?;
            Some(Store::open_with(&target, &topts)?)
        }
    };
    if let (Some(s), false) = (store.as_mut(), write_tree) {
        // The tree writer then looks at `minions/` alone.
        s.set_tree(crate::tree::TreeSync::Accepted);
    }
    if let (Some(store), false) = (&store, opts.dry_run) {
        let kt = store.keys_table();
        let dt = store.denied_table();
        let sync = RefCell::new(None);
        let changes = RefCell::new(crate::tree::TreeChanges::default());
        let done = rebuild::replace_then(
            &[kt, dt],
            || {
                plan = tree.plan(Some(store), &target, opts)?;
                tree.check_stale(&plan, pki_dir, opts)?;
                if write_tree {
                    let wants = tree.wants(&plan, &target, opts.replace)?;
                    *sync.borrow_mut() = Some((tree::before(store, &wants)?, wants));
                } else {
                    // Migrated into its own directory, the tree is not
                    // rewritten; but the `minions/<id>` files of the keys
                    // taken out of accepted go, so that Salt's
                    // validate_token no longer admits those minions.
                    let wants = unaccepted(&plan, &report.duplicates);
                    if !wants.is_empty() {
                        *sync.borrow_mut() = Some((tree::before(store, &wants)?, wants));
                    }
                }
                let (kimg, dimg) = tree.images(&plan, &target, opts.params)?;
                Ok(vec![kimg, dimg])
            },
            || {
                if let Some((s, wants)) = sync.borrow_mut().take() {
                    *changes.borrow_mut() = tree::after(store, s, &wants)?;
                }
                Ok(())
            },
        );
        if let Err(e) = done {
            if let Some((s, wants)) = sync.borrow_mut().take() {
                tree::restore(store, s, &wants);
            }
            return Err(e);
        }
        let changes = changes.into_inner();
        if write_tree {
            report.tree_written = changes.written.len() as u64;
            report.tree_removed = changes.removed.len() as u64;
        } else {
            report.minions_removed = changes.removed;
        }
        if let Some(made) = &opts.made {
            made(store, pki_dir)?;
        }
    }
    report.changes = tree.changes(&plan, pki_dir);
    report.kept = plan.kept;
    report.dropped = plan.dropped;
    report.total = plan.total;
    report.load_factor = plan.load_factor;
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// The ids `plan` takes out of accepted, each wanting no `minions/` file
/// (the tree writer of a store that keeps `minions/` alone in step then
/// removes it).
///
/// And the ids found in `minions/` and in another state directory that
/// Salt's precedence gives a less trusted state (`duplicates`): their
/// `minions/<id>` would let Salt's `validate_token` admit a minion the
/// store holds pending or rejected. Salt's own `pki.migrate_to_mmap`
/// leaves that file; keycache removes it.
fn unaccepted(plan: &MigrationPlan, duplicates: &[Duplicate]) -> tree::Wants {
    let mut ids: std::collections::BTreeSet<&str> = plan
        .changes
        .iter()
        .filter(|c| c.from == KeyState::Accepted)
        .map(|c| c.id.as_str())
        .collect();
    ids.extend(
        duplicates
            .iter()
            .filter(|d| d.state != KeyState::Accepted && d.found_in.contains(&KeyState::Accepted))
            .map(|d| d.id.as_str()),
    );
    ids.into_iter()
        .filter_map(|id| crate::id::MinionId::new(id).ok())
        .map(|id| (id, Default::default()))
        .collect()
}

/// Creates the target directory (and missing parents) with mode 0700, as
/// Salt makes its pki dirs, whatever the umask; the directory itself goes
/// to the explicit owner (`--user`), so that the master's user can enter it.
fn create_target(target: &Path, own: Option<&Ownership>) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(target)
        .map_err(|e| Error::io(target, "create directory", e))?;
    if let Some(Ownership {
        owner: Some((uid, gid)),
        explicit: true,
        ..
    }) = own
    {
        match std::os::unix::fs::chown(target, Some(*uid), Some(*gid)) {
            Ok(()) => {}
            // Not root: the directory stays ours, as the files will.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            Err(e) => return Err(Error::io(target, "chown", e)),
        }
    }
    Ok(())
}

/// Hasher of [`TreeKey::idh`]s, which are already hashes.
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type IdHash = std::hash::BuildHasherDefault<IdHasher>;

fn bump(c: &mut Counts, dir: TreeDir) {
    match dir {
        TreeDir::Minions => c.accepted += 1,
        TreeDir::MinionsPre => c.pending += 1,
        TreeDir::MinionsRejected => c.rejected += 1,
        TreeDir::MinionsDenied => c.denied += 1,
    }
}

/// Refuses a bank that would be filled past [`MAX_LOAD_FACTOR`].
fn check_load(path: &Path, entries: u64, p: &Params) -> Result<()> {
    let load = entries as f64 / p.capacity() as f64;
    if load > MAX_LOAD_FACTOR {
        return Err(Error::Overfull {
            path: path.into(),
            entries,
            size: p.size,
            load,
            max_load: MAX_LOAD_FACTOR,
            suggested: suggest_size(entries),
        });
    }
    Ok(())
}

/// A table size that holds `entries` at most half full, rounded up to a
/// readable number.
pub fn suggest_size(entries: u64) -> u64 {
    let need = Params::size_for(entries, 0.5);
    let step = 10u64
        .pow((need as f64).log10().floor().max(1.0) as u32 - 1)
        .max(1);
    need.div_ceil(step) * step
}
