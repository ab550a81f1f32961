//! Merging a peer's snapshot into a store: how the masters of a cluster
//! with isolated filesystems converge on one key state.
//!
//! [`plan`] compares our snapshot with theirs and decides, per (bank, id),
//! what the store should hold; it is pure. [`apply`] writes a plan into the
//! store in one atomic rebuild under both banks' locks. [`merge`] does
//! both, planning again from a new snapshot when a writer changed the
//! store in between.
//!
//! A cluster daemon runs the same exchange as `keycache snapshot | keycache
//! merge` over its own transport:
//!
//! ```
//! use keycache::merge::{self, MergeOptions};
//! use keycache::snapshot::{self, Snapshot, SnapshotOptions};
//! use keycache::{KeyState, MinionId, OpenOptions, Params, Store};
//!
//! # fn main() -> keycache::Result<()> {
//! # let da = tempfile::tempdir().expect("dir");
//! # let db = tempfile::tempdir().expect("dir");
//! let params = Params { size: 1009, ..Params::default() };
//! let opts = OpenOptions { params, ..OpenOptions::default() };
//! let a = Store::open_with(da.path(), &opts)?;
//! let b = Store::open_with(db.path(), &opts)?;
//! let pem = b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n";
//! b.put(&MinionId::new("web-1")?, KeyState::Accepted, pem)?; // salt-key -a on b
//!
//! // On b: its snapshot, with what b last merged from a (none yet) as seen.
//! let mut wire = Vec::new();
//! snapshot::take(&b, &SnapshotOptions::default())?.write_to(&mut wire)?;
//! // On a: merged with the base a keeps for b (none yet: a union).
//! let theirs = Snapshot::read_from(&mut &wire[..])?;
//! let (mo, so) = (MergeOptions::default(), SnapshotOptions::default());
//! let (plan, _report) = merge::merge(&a, &theirs, None, &mo, &so)?;
//! assert_eq!(plan.counts().added, 1);
//! let next_base = Snapshot { seen: None, ..theirs }; // keep it for the next merge from b
//! # let _ = next_base;
//! assert_eq!(a.get(&MinionId::new("web-1")?)?.map(|e| e.state), Some(KeyState::Accepted));
//! # Ok(())
//! # }
//! ```
//!
//! # What the other side is known to have had
//!
//! Two snapshots tell a three-way merge which side's value is the newer:
//!
//! - the **base**: their snapshot that we merged last (`keycache merge
//!   --base`, written by the previous merge's `--write-base`): values they
//!   had;
//! - their **seen** section ([`Snapshot::seen`]): our snapshot that they
//!   merged last, which they send along (`keycache snapshot --seen`, their
//!   own base for us): values of ours they have seen.
//!
//! Either makes the merge three-way; neither, a union. A base alone cannot
//! tell "they received our entry and deleted it" from "they never had it";
//! their seen section can.
//!
//! # The rules, per (bank, id)
//!
//! Values are compared by state and key (not mtime). In a three-way merge:
//!
//! - ours and theirs agree: nothing to do;
//! - ours is a value they are known to have had (in the base or in their
//!   seen section) and theirs is not one we had: theirs is newer and taken,
//!   an added entry, a changed one or a deletion;
//! - theirs is a value we had, ours is not one they had: ours stays;
//! - otherwise a **conflict**, settled by the policy (also when each side
//!   holds a value the other had: merges that crossed).
//!
//! A union adds the entries only theirs holds, deletes nothing, and settles
//! entries both hold with different values as conflicts.
//!
//! # The default policy: `restrictive`, and why
//!
//! The default must be symmetric and deterministic, so that peer A merging
//! B's snapshot and peer B merging A's reach identical stores, and it must
//! compose (settling a conflict again with its own result changes nothing),
//! so that pairwise merges among three or more peers converge. `restrictive`
//! is such a join:
//!
//! - the same key in two states: the more restrictive state wins, rejected
//!   over pending over accepted: a key one peer rejected is not let in
//!   because another accepted it concurrently;
//! - a deletion against a change: the deletion wins. A deleted minion can
//!   present its key again and land in pending; a kept key that one peer
//!   deleted (a decommissioned or compromised minion) would stay trusted;
//! - two different denied keys: the greater key (bytewise) wins.
//!
//! Keys are never compared by time in the default: peers' clocks differ.
//! `newer` (slot mtime, ties settled as `restrictive`), `ours` and `theirs`
//! are offered ([`Policy`]).
//!
//! # The same id with two different public keys
//!
//! A `keys` conflict between two different keys is a key mismatch, settled
//! by [`KeyMismatch`] whatever the conflict policy. The default, `pending`,
//! never settles it into accepted: the id is held as pending (or kept
//! rejected) with the greater key bytewise, so the operator compares the
//! fingerprints and accepts the right one (`salt-key -a`). `reject` holds it
//! rejected; `newer`, `ours` and `theirs` take one side's entry as it is
//! (accepted only if that side accepted that key): explicit choices.
//!
//! # Bases
//!
//! The base of the next merge from a peer is **their snapshot just merged**
//! (without its seen section), not the merged result: both stores descend
//! from it (ours merged it, theirs went on from it). The merged result holds
//! our own changes that the peer has not merged yet; taken as the base, the
//! next merge would read them as deleted by the peer and delete them here
//! (when this side merges twice before the other merges once, as
//! independent timers do). A peer keeps one base per peer it merges from,
//! and sends it as the seen section of the snapshots that peer reads.
//!
//! A settled conflict whose result is a value the other side is known to
//! have had (only a key mismatch held out of accepted can be) is raised
//! until it is not, pending to rejected to deleted: the other peer would
//! otherwise read it as no change on this side and keep its own value for
//! ever.
//!
//! # The security invariant
//!
//! A merge never gives an id the state accepted with a key that neither
//! side holds accepted with that key: one-sided changes take that side's
//! entry as it is, the `restrictive` join never raises a state, and a key
//! mismatch under the default is never accepted.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::snapshot::{self, Bank, Entry, Snapshot, SnapshotOptions};
use crate::store::Store;

mod apply;
mod settle;

pub use apply::{apply, MergeReport};
use settle::{raise, settle};

/// How a conflict (both sides changed an entry, differently) is settled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Policy {
    /// Symmetric and deterministic (the default): the more restrictive
    /// state (rejected > pending > accepted), a deletion over a change,
    /// the greater key bytewise between two denied keys.
    #[default]
    Restrictive,
    /// The entry with the later Salt slot mtime; a deletion over a change;
    /// equal mtimes as `restrictive`. Symmetric, but trusts the peers'
    /// clocks.
    Newer,
    /// Our entry (or our deletion). Not symmetric: peers that both merge
    /// with `ours` keep their own values.
    Ours,
    /// Their entry (or their deletion). Not symmetric.
    Theirs,
}

impl Policy {
    /// The policy's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Restrictive => "restrictive",
            Policy::Newer => "newer",
            Policy::Ours => "ours",
            Policy::Theirs => "theirs",
        }
    }
}

/// How a key mismatch (both sides hold the id in `keys`, with different
/// public keys, and both changed it) is settled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum KeyMismatch {
    /// The default: held out of accepted, in the more restrictive of both
    /// states and pending (so rejected stays rejected), with the greater
    /// key bytewise. Symmetric and deterministic.
    #[default]
    Pending,
    /// Held rejected, with the greater key bytewise.
    Reject,
    /// The entry with the later Salt slot mtime, as it is (accepted if that
    /// side accepted it); equal mtimes as `pending`.
    Newer,
    /// Our entry, as it is.
    Ours,
    /// Their entry, as it is.
    Theirs,
}

impl KeyMismatch {
    /// The policy's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            KeyMismatch::Pending => "pending",
            KeyMismatch::Reject => "reject",
            KeyMismatch::Newer => "newer",
            KeyMismatch::Ours => "ours",
            KeyMismatch::Theirs => "theirs",
        }
    }
}

/// How [`plan`] settles conflicts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeOptions {
    /// Conflicts between states, and between a change and a deletion.
    pub on_conflict: Policy,
    /// Conflicts between two different public keys of one id.
    pub on_key_mismatch: KeyMismatch,
}

/// What a plan does to one (bank, id) of our store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Action {
    /// Theirs added it (or, without a base, only they hold it).
    Added,
    /// Theirs changed its state or key.
    Changed,
    /// Theirs deleted it.
    Deleted,
    /// Both sides changed it, differently: settled by the policy (see
    /// [`PlanEntry::reason`]); the store changes when the result differs
    /// from ours.
    Conflict,
}

impl Action {
    /// The action's name: `added`, `changed`, `deleted`, `conflict`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Added => "added",
            Action::Changed => "changed",
            Action::Deleted => "deleted",
            Action::Conflict => "conflict",
        }
    }
}

/// One (bank, id) of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEntry {
    /// The bank.
    pub bank: Bank,
    /// The minion id.
    pub id: String,
    /// What happens.
    pub action: Action,
    /// Our entry.
    pub ours: Option<Entry>,
    /// Their entry.
    pub theirs: Option<Entry>,
    /// The base's entry (always `None` without a base).
    pub base: Option<Entry>,
    /// The entry of their seen section (our value they merged last;
    /// `None` without one).
    pub seen: Option<Entry>,
    /// What the store holds afterwards.
    pub result: Option<Entry>,
    /// Both sides hold the id in `keys` with different public keys.
    pub key_mismatch: bool,
    /// Why, in words (for a conflict: how it was settled).
    pub reason: String,
}

impl PlanEntry {
    /// Whether applying the plan changes this entry of our store.
    pub fn changes_store(&self) -> bool {
        !same(self.ours.as_ref(), self.result.as_ref())
    }
}

/// Counts of a plan's entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PlanCounts {
    /// Entries added from theirs.
    pub added: usize,
    /// Entries changed to theirs.
    pub changed: usize,
    /// Entries deleted as theirs were.
    pub deleted: usize,
    /// Conflicts (key mismatches included).
    pub conflicts: usize,
    /// Conflicts between two different keys of one id.
    pub key_mismatches: usize,
    /// Entries of our store the plan changes.
    pub store_changes: usize,
}

/// What a merge does ([`plan`]): per (bank, id), sorted, only the entries
/// where something happens or a conflict was settled; and the merged
/// result, which is also the next base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergePlan {
    /// The entries, sorted by (bank, id).
    pub entries: Vec<PlanEntry>,
    /// Whether a base or their seen section was given (a three-way merge)
    /// or neither (a union).
    pub three_way: bool,
    /// The options the conflicts were settled with.
    pub options: MergeOptions,
    /// Our snapshot with the plan applied: what the store holds afterwards
    /// (for the ids the plan names, and every other one as ours had it).
    /// Not the next base: see "Bases" in the module's documentation.
    pub result: Snapshot,
}

impl MergePlan {
    /// The counts of the plan's entries.
    pub fn counts(&self) -> PlanCounts {
        let mut c = PlanCounts::default();
        for e in &self.entries {
            match e.action {
                Action::Added => c.added += 1,
                Action::Changed => c.changed += 1,
                Action::Deleted => c.deleted += 1,
                Action::Conflict => c.conflicts += 1,
            }
            c.key_mismatches += usize::from(e.key_mismatch);
            c.store_changes += usize::from(e.changes_store());
        }
        c
    }

    /// Whether applying the plan changes nothing in our store.
    pub fn is_noop(&self) -> bool {
        !self.entries.iter().any(PlanEntry::changes_store)
    }
}

/// Two optional entries with the same state and key (mtimes aside).
fn same(a: Option<&Entry>, b: Option<&Entry>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.same_value(b),
        _ => false,
    }
}

/// Plans the merge of `theirs` into `ours`, three-way when `base` (their
/// snapshot we merged last) or `theirs.seen` is given (see the module's
/// documentation). Pure: the same inputs give the same
/// plan, and with a symmetric policy (`restrictive` and `pending`, the
/// defaults; `newer`), `plan(a, b, base)` and `plan(b, a, base)` give
/// results with the same states and keys.
pub fn plan(
    ours: &Snapshot,
    theirs: &Snapshot,
    base: Option<&Snapshot>,
    opts: &MergeOptions,
) -> MergePlan {
    type Key<'a> = (Bank, &'a str);
    fn index(s: &Snapshot) -> BTreeMap<Key<'_>, &Entry> {
        s.entries
            .iter()
            .map(|e| ((e.bank, e.id.as_str()), e))
            .collect()
    }
    fn keys_of<'a>(s: &'a Snapshot) -> impl Iterator<Item = (Bank, &'a str)> + 'a {
        s.entries.iter().map(|e| (e.bank, e.id.as_str()))
    }
    let (o, t) = (index(ours), index(theirs));
    let b = base.map(index);
    let seen: Option<BTreeMap<Key<'_>, &Entry>> = theirs
        .seen
        .as_ref()
        .map(|v| v.iter().map(|e| ((e.bank, e.id.as_str()), e)).collect());
    let three_way = base.is_some() || seen.is_some();
    let mut all: Vec<Key<'_>> = keys_of(ours).chain(keys_of(theirs)).collect();
    all.sort_unstable();
    all.dedup();
    let mut result: BTreeMap<Key<'_>, Entry> = ours
        .entries
        .iter()
        .map(|e| ((e.bank, e.id.as_str()), e.clone()))
        .collect();
    let mut entries = Vec::new();
    for k in all {
        let (oe, te) = (o.get(&k).copied(), t.get(&k).copied());
        if same(oe, te) {
            continue;
        }
        // What the base (their snapshot we merged last) and their seen
        // section (our snapshot they merged last) hold: None when not given.
        let be = b.as_ref().map(|m| m.get(&k).copied());
        let se = seen.as_ref().map(|m| m.get(&k).copied());
        let known = |x: Option<&Entry>| [be, se].iter().flatten().any(|v| same(x, *v));
        let (action, res, mismatch, reason) = if three_way {
            match (known(oe), known(te)) {
                (true, false) => (
                    match (oe, te) {
                        (None, _) => Action::Added,
                        (_, None) => Action::Deleted,
                        _ => Action::Changed,
                    },
                    te.cloned(),
                    false,
                    "changed on their side only".to_owned(),
                ),
                (false, true) => continue, // changed on our side only: ours stays
                (true, true) => {
                    // Each side holds a value the other had: merges crossed.
                    let (res, mismatch, reason) = settle(oe, te, opts);
                    let reason =
                        format!("merges crossed, each side holds the other's old value: {reason}");
                    (Action::Conflict, res, mismatch, reason)
                }
                (false, false) => {
                    let (mut res, mismatch, mut reason) = settle(oe, te, opts);
                    let mut raised = false;
                    while res.is_some() && known(res.as_ref()) {
                        res = raise(res);
                        raised = true;
                    }
                    if raised {
                        reason.push_str(&format!(
                            "; raised to {}: a value the other peer already had would read to \
                             it as no change on this side",
                            res.as_ref().map_or("deleted", Entry::state_name)
                        ));
                    }
                    (Action::Conflict, res, mismatch, reason)
                }
            }
        } else {
            match (oe, te) {
                (_, None) => continue, // a union never deletes
                (None, Some(_)) => (
                    Action::Added,
                    te.cloned(),
                    false,
                    "only their side holds it".to_owned(),
                ),
                (Some(_), Some(_)) => {
                    let (res, mismatch, reason) = settle(oe, te, opts);
                    (Action::Conflict, res, mismatch, reason)
                }
            }
        };
        match &res {
            Some(e) => {
                result.insert(k, e.clone());
            }
            None => {
                result.remove(&k);
            }
        }
        entries.push(PlanEntry {
            bank: k.0,
            id: k.1.to_owned(),
            action,
            ours: oe.cloned(),
            theirs: te.cloned(),
            base: be.flatten().cloned(),
            seen: se.flatten().cloned(),
            result: res,
            key_mismatch: mismatch,
            reason,
        });
    }
    MergePlan {
        entries,
        three_way,
        options: *opts,
        result: Snapshot {
            taken: ours.taken.max(theirs.taken),
            entries: result.into_values().collect(),
            seen: None,
        },
    }
}

/// With the store's tree on, mends the tree when it is not in step with
/// the banks: a merge killed after its commit and before its tree writes
/// left it behind, and running the merge again finds nothing to change in
/// the banks. One pass over the tree ([`crate::tree::check`]); the mend
/// ([`crate::tree::mend`]) only when it found something.
fn catch_up_tree(store: &Store, r: &mut MergeReport) -> Result<()> {
    if !store.tree().is_on() || crate::tree::check(store)?.is_empty() {
        return Ok(());
    }
    let m = crate::tree::mend(store)?;
    r.tree.written.extend(m.written);
    r.tree.removed.extend(m.removed);
    Ok(())
}

/// Merges `theirs` into `store`: takes our snapshot, plans
/// ([`plan`]) and applies ([`apply`]) the plan; when another writer changed
/// an id the plan changes in between ([`crate::Error::StalePlan`]), takes a
/// new snapshot and plans again (up to five times). With the store's tree
/// on, a tree left behind the banks (by a merge killed after its commit)
/// is then mended. Returns the plan applied and what was written.
pub fn merge(
    store: &Store,
    theirs: &Snapshot,
    base: Option<&Snapshot>,
    opts: &MergeOptions,
    snap: &SnapshotOptions,
) -> Result<(MergePlan, MergeReport)> {
    let mut tries = 0;
    loop {
        let ours = snapshot::take(store, snap)?;
        let p = plan(&ours, theirs, base, opts);
        match apply(store, &p) {
            Ok(mut r) => {
                catch_up_tree(store, &mut r)?;
                return Ok((p, r));
            }
            Err(crate::Error::StalePlan { .. }) if tries < 4 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
