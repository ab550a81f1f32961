//! Merging a peer's snapshot into a store: how the masters of a cluster
//! with isolated filesystems converge on one key state, without ever
//! undoing a revocation.
//!
//! Every entry has a version ([`crate::history`]): a hybrid-logical-clock
//! stamp, the kind of value (a tombstone for a deletion) and a hash. A
//! merge takes, per (bank, id), the version that wins ([`Version::beats`]:
//! the later stamp, then the more restrictive kind, then the greater hash).
//! That order is total, so merges in any order, any number of times, reach
//! the same state on every peer (the state of last-writer-wins registers),
//! and no base or third snapshot is needed: a new peer, a restored one or
//! one that lost its base files merges like any other.
//!
//! ```
//! use keycache_merge::history::History;
//! use keycache_merge::merge::{self, MergeOptions};
//! use keycache_merge::snapshot::{self, Snapshot, SnapshotOptions};
//! use keycache::{KeyState, MinionId, OpenOptions, Params, Store};
//!
//! # fn main() -> keycache::Result<()> {
//! # let da = tempfile::tempdir().expect("dir");
//! # let db = tempfile::tempdir().expect("dir");
//! let params = Params { size: 1009, ..Params::default() };
//! let opts = OpenOptions { params, ..OpenOptions::default() };
//! let a = Store::open_with(da.path(), &opts)?;
//! let b = Store::open_with(db.path(), &opts)?;
//! // Both masters of the cluster hold its public key.
//! # let master_pub = b"-----BEGIN PUBLIC KEY-----\nMIIC\n-----END PUBLIC KEY-----\n";
//! std::fs::write(da.path().join("master.pub"), master_pub).expect("key");
//! std::fs::write(db.path().join("master.pub"), master_pub).expect("key");
//! let pem = b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n";
//! b.put(&MinionId::new("web-1")?, KeyState::Accepted, pem)?; // salt-key -a on b
//!
//! // b's snapshot, sent over the daemon's transport, merged into a.
//! let mut wire = Vec::new();
//! snapshot::take(&b, &SnapshotOptions::default())?.write_to(&mut wire)?;
//! let mo = MergeOptions::default();
//! let history = History::load(a.dir(), &mo.history)?;
//! let theirs = merge::read_snapshot(&history, &mut &wire[..], "b")?;
//! let (plan, _report) = merge::merge_with(&a, history, &theirs, &mo)?;
//! assert_eq!(plan.counts().added, 1);
//! assert_eq!(a.get(&MinionId::new("web-1")?)?.map(|e| e.state), Some(KeyState::Accepted));
//! # Ok(())
//! # }
//! ```
//!
//! # What a merge refuses
//!
//! Nothing is written ([`Error::MergeRefused`]) when:
//!
//! - the snapshot is this store's own;
//! - it comes from another cluster: both name their cluster
//!   ([`crate::history::cluster_of`], a hash of the cluster's or master's
//!   public key) and the names differ;
//! - this store or the snapshot names no cluster (neither `cluster.pub`
//!   nor `master.pub`: [`Error::UnknownCluster`]), unless
//!   [`MergeOptions::allow_unknown_cluster`]: such a side cannot tell
//!   another cluster's keys from a peer's, and a real master always has
//!   its key pair;
//! - it is older than the last snapshot merged from the same store (a
//!   replay), taken more than the tombstone horizon ago, or stamped by a
//!   clock more than [`MergeOptions::max_skew`] ahead of ours;
//! - it would take more than [`MergeOptions::max_revoke_percent`] of the
//!   store's keys out of accepted or delete them (and more than
//!   [`REVOKE_FLOOR`]), unless [`MergeOptions::allow_mass_revoke`];
//! - an entry it would write is not a PEM public key within
//!   [`crate::snapshot::MAX_KEY_BYTES`] (the checks of `migrate`), or an
//!   id does not fit the layout ([`Error::BadSnapshot`], naming the id).
//!
//! # The security invariant
//!
//! A merge writes only versions some peer made: never an accepted state
//! for a key that no observation found accepted. A revocation (deletion,
//! rejection) is stamped no earlier than it happened and an accept no
//! later ([`crate::history`]), so an accept wins over a revocation only
//! when it was made after it, within the clock skew between the masters.
//! An accepted entry older than the horizon that this store has no version
//! of, while it was in the cluster at that time (its tombstone may have
//! been forgotten), is taken pending ([`Action::Held`]).

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::history::{show_ident, History, HistoryOptions, Ident, Kind, Version};
use crate::snapshot::{Entry, Snapshot};
use keycache::key::Bank;
use keycache::store::Store;

mod apply;
mod base;

pub use apply::MergeReport;
pub use base::{Base, BaseFile};

/// Revocations a merge may always make, whatever the share.
pub const REVOKE_FLOOR: usize = 10;

/// How merges check and order what they take.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// The tombstone horizon and the wall clock.
    pub history: HistoryOptions,
    /// How long to wait for each bank's lock. Default 10 s.
    pub lock_wait: Duration,
    /// How far ahead of ours a peer's clock may be. Default 10 minutes.
    pub max_skew: Duration,
    /// The share of the store's live `keys` entries, in percent, that one
    /// merge may delete or take out of accepted. Default 50.
    pub max_revoke_percent: u32,
    /// Take a merge past that share all the same.
    pub allow_mass_revoke: bool,
    /// Merge even when this store or the snapshot names no cluster
    /// ([`Error::UnknownCluster`]): the merge then cannot refuse another
    /// cluster's snapshot. Default false.
    pub allow_unknown_cluster: bool,
}

impl Default for MergeOptions {
    fn default() -> MergeOptions {
        MergeOptions {
            history: HistoryOptions::default(),
            lock_wait: Duration::from_secs(10),
            max_skew: Duration::from_secs(600),
            max_revoke_percent: 50,
            allow_mass_revoke: false,
            allow_unknown_cluster: false,
        }
    }
}

/// What a plan does to one (bank, id) of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Action {
    /// Added: the store does not hold it.
    Added,
    /// Changed to their state or key.
    Changed,
    /// Deleted: their version is a tombstone.
    Deleted,
    /// Their accepted entry, older than the horizon and unknown here, taken
    /// pending (see the module's documentation).
    Held,
}

impl Action {
    /// The action's name: `added`, `changed`, `deleted`, `held`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Added => "added",
            Action::Changed => "changed",
            Action::Deleted => "deleted",
            Action::Held => "held",
        }
    }
}

/// One change of the store a plan makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEntry {
    /// What happens.
    pub action: Action,
    /// Our version (`None`: the store never had the entry).
    pub ours: Option<Version>,
    /// Their entry.
    pub theirs: Entry,
    /// What the store holds afterwards, with its version.
    pub result: Entry,
}

impl PlanEntry {
    /// The bank.
    pub fn bank(&self) -> Bank {
        self.theirs.bank
    }

    /// The minion id.
    pub fn id(&self) -> &str {
        &self.theirs.id
    }
}

/// Counts of a plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PlanCounts {
    /// Entries added.
    pub added: usize,
    /// Entries changed.
    pub changed: usize,
    /// Entries deleted.
    pub deleted: usize,
    /// Entries taken pending (past the horizon).
    pub held: usize,
    /// Accepted keys the plan deletes or takes out of accepted.
    pub revoked: usize,
    /// Versions recorded without a change of the store (their tombstones
    /// of entries we do not hold, later stamps of the values we hold).
    pub recorded: usize,
    /// Entries of the store the plan changes.
    pub store_changes: usize,
}

/// What a merge does ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergePlan {
    /// The changes of the store, sorted by (bank, id).
    pub entries: Vec<PlanEntry>,
    /// Versions taken without a change of the store.
    pub recorded: Vec<Entry>,
    /// Their store.
    pub their_store: Ident,
    /// Their generation.
    pub their_generation: u64,
}

impl MergePlan {
    /// The counts of the plan.
    pub fn counts(&self) -> PlanCounts {
        let mut c = PlanCounts {
            recorded: self.recorded.len(),
            store_changes: self.entries.len(),
            ..PlanCounts::default()
        };
        for e in &self.entries {
            match e.action {
                Action::Added => c.added += 1,
                Action::Changed => c.changed += 1,
                Action::Deleted => c.deleted += 1,
                Action::Held => c.held += 1,
            }
            c.revoked += usize::from(revokes(e));
        }
        c
    }

    /// Whether applying the plan changes nothing in the store.
    pub fn is_noop(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Whether a change deletes an entry of `keys` or takes it out of accepted.
fn revokes(e: &PlanEntry) -> bool {
    e.theirs.bank == Bank::Keys
        && e.ours.is_some_and(|o| o.kind == Kind::Accepted)
        && e.result.kind != Kind::Accepted
}

fn refused(why: String) -> Error {
    Error::MergeRefused { why }
}

/// Refuses, unless [`MergeOptions::allow_unknown_cluster`], a merge into
/// a store of cluster `cluster` (its directory `dir`, when known) when
/// that store or `theirs` names no cluster ([`Error::UnknownCluster`]).
pub fn check_cluster_known(
    dir: Option<&Path>,
    cluster: Option<Ident>,
    theirs: &Snapshot,
    opts: &MergeOptions,
) -> Result<()> {
    if opts.allow_unknown_cluster {
        return Ok(());
    }
    let [cluster_pub, master_pub] = crate::history::CLUSTER_KEYS;
    let allow = "or allow the merge of an unknown cluster";
    if cluster.is_none() {
        let (side, missing) = match dir {
            Some(d) => (
                format!("this store's directory {}", d.display()),
                format!(
                    "neither {} nor {} exists (nor is in its master_keys bank)",
                    d.join(cluster_pub).display(),
                    d.join(master_pub).display()
                ),
            ),
            None => (
                "this store".to_owned(),
                format!(
                    "its directory holds neither {cluster_pub} nor {master_pub} (nor its \
                     master_keys bank)"
                ),
            ),
        };
        return Err(Error::UnknownCluster {
            side,
            snapshot: false,
            why: format!(
                "{missing}. Copy the master's public key ({master_pub}) into the store's \
                 directory, {allow}"
            ),
        });
    }
    if theirs.cluster.is_none() {
        return Err(Error::UnknownCluster {
            side: format!("the snapshot (of store {})", show_ident(&theirs.store)),
            snapshot: true,
            why: format!(
                "the directory of the store it was taken from held neither {cluster_pub} nor \
                 {master_pub} (nor its master_keys bank). Copy the master's public key \
                 ({master_pub}) into that store's directory and take the snapshot again, {allow}"
            ),
        });
    }
    Ok(())
}

/// Checks that `theirs` may be merged into a store of cluster `cluster`
/// with history `h`: not its own, both naming a cluster (unless allowed)
/// and the same one, not a replay, not too old, not from a clock too far
/// ahead.
pub fn check_identity(
    h: &History,
    cluster: Option<Ident>,
    theirs: &Snapshot,
    opts: &MergeOptions,
) -> Result<()> {
    let me = &h.identity;
    let ts = show_ident(&theirs.store);
    if theirs.store == me.store {
        return Err(refused(format!(
            "the snapshot is this store's own (store {ts}): merge a peer's snapshot"
        )));
    }
    check_cluster_known(None, cluster, theirs, opts)?;
    if let (Some(ours), Some(t)) = (cluster, theirs.cluster) {
        if ours != t {
            return Err(refused(format!(
                "the snapshot comes from another cluster (store {ts}, cluster key {}); this \
                 store's cluster key is {}",
                show_ident(&t),
                show_ident(&ours)
            )));
        }
    }
    if let Some(p) = me.peers.get(&theirs.store) {
        if theirs.generation < p.generation {
            return Err(refused(format!(
                "the snapshot of store {ts} is older (generation {}) than the one merged from it \
                 last ({}): a replayed or stale snapshot",
                crate::hlc::show(theirs.generation),
                crate::hlc::show(p.generation)
            )));
        }
    }
    let now = opts.history.wall.now();
    let nanos = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
    if theirs.generation > now.saturating_add(nanos(opts.max_skew)) {
        return Err(refused(format!(
            "the snapshot of store {ts} was taken at {}, more than {:?} ahead of this clock ({}): \
             fix the clocks (NTP) first",
            crate::hlc::show(theirs.generation),
            opts.max_skew,
            crate::hlc::show(now)
        )));
    }
    if theirs.generation < now.saturating_sub(nanos(opts.history.horizon)) {
        return Err(refused(format!(
            "the snapshot of store {ts} was taken at {}, longer ago than the tombstone horizon \
             ({:?}): take a new one",
            crate::hlc::show(theirs.generation),
            opts.history.horizon
        )));
    }
    Ok(())
}

/// Checks a value the store would get: a PEM public key (as `migrate`
/// reads key files), naming the id.
fn check_value(e: &Entry) -> Result<()> {
    if e.kind == Kind::Absent {
        return Ok(());
    }
    let bad = |why: String| Error::BadSnapshot {
        source_name: "merge".into(),
        why: format!("{} entry {:?}: {why}; nothing was written", e.bank, e.id),
    };
    keycache::id::validate(&e.id).map_err(|err| bad(err.to_string()))?;
    if e.public_key.len() > crate::snapshot::MAX_KEY_BYTES {
        return Err(bad(format!("a public key of {} bytes", e.public_key.len())));
    }
    keycache::pem::check_public_key(&e.public_key)
        .map_err(|p| bad(format!("not a public key: {p}")))
}

/// Plans the merge of `theirs` into a store of cluster `cluster` whose
/// history (observed) is `h`: per (bank, id), their version when it beats
/// ours. Pure but for the wall clock of `opts`. Refuses what the module's
/// documentation lists.
pub fn plan(
    h: &History,
    cluster: Option<Ident>,
    theirs: &Snapshot,
    opts: &MergeOptions,
) -> Result<MergePlan> {
    check_identity(h, cluster, theirs, opts)?;
    let now = opts.history.wall.now();
    let horizon = crate::history::horizon_cutoff(&opts.history);
    let me = &h.identity;
    let mut entries = Vec::new();
    let mut recorded = Vec::new();
    let mut clock = me.clock;
    for t in &theirs.entries {
        let tv = t.version();
        let ours = h.get(t.bank, &t.id);
        if ours.is_some_and(|o| !tv.beats(&o)) {
            continue;
        }
        let our_hash = ours.map_or(0, |o| o.hash);
        if our_hash == tv.hash {
            // The same value (or both absent) with a later stamp.
            recorded.push(t.clone());
            continue;
        }
        let mut result = t.clone();
        let mut action = match (our_hash, t.kind) {
            (0, _) => Action::Added,
            (_, Kind::Absent) => Action::Deleted,
            _ => Action::Changed,
        };
        // Accepted, older than the horizon, unknown here although this
        // store's history had begun then: its tombstone may be forgotten.
        if t.kind == Kind::Accepted && ours.is_none() && me.created <= t.stamp && t.stamp < horizon
        {
            clock.receive(now);
            result.kind = Kind::Pending;
            result.stamp = clock.tick(&opts.history.wall);
            action = Action::Held;
        }
        check_value(&result)?;
        entries.push(PlanEntry {
            action,
            ours,
            theirs: t.clone(),
            result,
        });
    }
    let plan = MergePlan {
        entries,
        recorded,
        their_store: theirs.store,
        their_generation: theirs.generation,
    };
    let revoked = plan.counts().revoked;
    let live = h
        .iter()
        .filter(|(b, _, v)| *b == Bank::Keys && v.kind != Kind::Absent)
        .count();
    if !opts.allow_mass_revoke
        && revoked > REVOKE_FLOOR
        && revoked as u128 * 100 > live as u128 * u128::from(opts.max_revoke_percent)
    {
        return Err(refused(format!(
            "the snapshot of store {} would delete or take out of accepted {revoked} of this \
             store's {live} keys, more than {}%: a wiped or damaged peer, or a mass deletion. \
             Check the peer; merge with the mass revocation allowed to take it all the same",
            show_ident(&theirs.store),
            opts.max_revoke_percent
        )));
    }
    Ok(plan)
}

/// Reads a peer's snapshot for a merge into the store whose history is
/// `h` ([`History::load`]), keeping only the entries whose version the
/// store does not hold already (every entry is still read and checked): a
/// merge's memory follows the difference.
pub fn read_snapshot(h: &History, r: &mut impl Read, name: &str) -> Result<Snapshot> {
    let mut cursor = 0;
    Snapshot::read_filtered(r, name, |e| {
        match h.get_with_prev_from(&mut cursor, e.bank, e.id) {
            // An entry a killed merge had in flight may not be in the banks:
            // the observation decides, the plan needs their entry.
            Some((_, Some(_))) => true,
            Some((v, None)) => !(v.stamp == e.stamp && v.kind == e.kind && v == e.version()),
            None => true,
        }
    })
}

/// Plans the merge of `theirs` into `store` and writes nothing (the store
/// is observed, its history not saved).
pub fn dry_run(store: &Store, theirs: &Snapshot, opts: &MergeOptions) -> Result<MergePlan> {
    dry_run_with(
        store,
        History::load(store.dir(), &opts.history)?,
        theirs,
        opts,
    )
}

/// [`dry_run`], with the store's history already loaded.
pub fn dry_run_with(
    store: &Store,
    mut h: History,
    theirs: &Snapshot,
    opts: &MergeOptions,
) -> Result<MergePlan> {
    let cluster = crate::history::cluster_of(store)?;
    check_cluster_known(Some(store.dir()), cluster, theirs, opts)?;
    h.observe(store, &opts.history, false, |_, _, _, _, _| Ok(()))?;
    plan(&h, cluster, theirs, opts)
}

/// Merges `theirs` into `store`: observes the store, plans ([`plan`]) and
/// commits the plan (the history first, then the banks
/// and the key tree, under both banks' locks); when another writer changed
/// an entry the plan replaces, or another process saved the history, in
/// between ([`Error::StalePlan`]), observes and plans again (up to five
/// times). Returns the plan applied and what was written.
pub fn merge(
    store: &Store,
    theirs: &Snapshot,
    opts: &MergeOptions,
) -> Result<(MergePlan, MergeReport)> {
    let h = History::load(store.dir(), &opts.history)?;
    merge_with(store, h, theirs, opts)
}

/// [`merge`], with the store's history already loaded (the one
/// [`read_snapshot`] filtered with): the first try uses it.
pub fn merge_with(
    store: &Store,
    h: History,
    theirs: &Snapshot,
    opts: &MergeOptions,
) -> Result<(MergePlan, MergeReport)> {
    let cluster = crate::history::cluster_of(store)?;
    check_cluster_known(Some(store.dir()), cluster, theirs, opts)?;
    let mut tries = 0;
    let mut loaded = Some(h);
    loop {
        let mut h = match loaded.take() {
            Some(h) => h,
            None => History::load(store.dir(), &opts.history)?,
        };
        let seen = h.observe(store, &opts.history, true, |_, _, _, _, _| Ok(()))?;
        let p = plan(&h, cluster, theirs, opts)?;
        match apply::commit(store, &mut h, &p, &seen.settled, opts) {
            Ok(r) => return Ok((p, r)),
            Err(Error::StalePlan { .. }) if tries < 4 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
