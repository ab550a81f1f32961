//! Applying a merge plan: one atomic rebuild of both banks under their
//! locks (see [`crate::rebuild`]), with the key tree kept in step.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};

use super::{MergePlan, PlanEntry};
use crate::error::{Error, Result};
use crate::id::MinionId;
use crate::image::Image;
use crate::key::{decode_key_value, encode_key_value, KeyState};
use crate::rebuild::replace_then;
use crate::snapshot::{Bank, Entry};
use crate::store::{Store, TreeChanges};
use crate::table::Table;
use crate::tree::{want_of, Sync, Want};

/// What [`apply`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MergeReport {
    /// Entries of the store written or removed (0: the plan changed
    /// nothing, and nothing was rebuilt).
    pub written: usize,
    /// What was done to the key tree (nothing when the store's tree is off,
    /// see [`Store::set_tree`]).
    pub tree: TreeChanges,
}

/// What the tree must hold for each id of a plan.
type Wants = Vec<(MinionId, Want)>;

/// What an id of the plan holds in both banks once the plan is applied.
type Finals = BTreeMap<String, (Option<(KeyState, Vec<u8>)>, Option<Vec<u8>>)>;

/// Applies `plan` to `store` in one atomic commit: both banks are locked
/// (`keys` first) and rebuilt with the plan's results (every other entry
/// copied as it is, with its mtime; each result with the mtime of the side
/// it came from), through one journal, so that a crash leaves the old state
/// or the new one, whole, and the next writer or open finishes an
/// interrupted commit.
///
/// Under the locks, every entry the plan changes must still hold what the
/// plan took as ours; otherwise nothing is written and the error is
/// [`Error::StalePlan`] (plan again from a new snapshot: [`super::merge`]
/// does). With the store's tree on ([`Store::set_tree`]), the
/// `localfs_key` tree of every id the plan changes is brought in step in
/// the order of [`crate::tree`]: files the store will no longer vouch for
/// are removed before the commit, new ones written after it, under the
/// same locks.
pub fn apply(store: &Store, plan: &MergePlan) -> Result<MergeReport> {
    let changes: Vec<&PlanEntry> = plan.entries.iter().filter(|e| e.changes_store()).collect();
    if changes.is_empty() {
        return Ok(MergeReport::default());
    }
    let mut ids = HashSet::new();
    for e in &changes {
        MinionId::new(e.id.clone())?;
        store.keys_table().check_id(e.id.as_bytes())?;
        if let Some(r) = &e.result {
            if crate::pem::holds_private_key(&r.pub_key) {
                return Err(Error::BadSnapshot {
                    source_name: "merge plan".into(),
                    why: format!("{:?}: the result holds a PRIVATE KEY block", e.id),
                });
            }
        }
        ids.insert(e.id.as_str());
    }
    let (kt, dt) = (store.keys_table(), store.denied_table());
    let sync: RefCell<Option<(Sync, Wants)>> = RefCell::new(None);
    let tree = RefCell::new(TreeChanges::default());
    let done = replace_then(
        &[kt, dt],
        || {
            let mut finals: Finals = BTreeMap::new();
            let k = rebuild_bank(store, kt, Bank::Keys, &changes, &ids, &mut finals)?;
            let d = rebuild_bank(store, dt, Bank::Denied, &changes, &ids, &mut finals)?;
            if store.tree().is_on() {
                let wants = finals
                    .into_iter()
                    .map(|(id, (k, d))| Ok((MinionId::new(id)?, want_of(k, d))))
                    .collect::<Result<Vec<_>>>()?;
                let mut s = Sync::plan(store, &wants)?;
                s.before()?;
                *sync.borrow_mut() = Some((s, wants));
            }
            Ok(vec![k, d])
        },
        || {
            if let Some((s, wants)) = sync.borrow_mut().take() {
                *tree.borrow_mut() = s.after(&wants)?;
            }
            Ok(())
        },
    );
    if let Err(e) = done {
        // The tree's early removals ran but the banks did not change: the
        // tree is brought back in step with what the store holds.
        if let Some((s, wants)) = sync.borrow_mut().take() {
            let now: Result<Vec<(MinionId, Want)>> = wants
                .into_iter()
                .map(|(id, _)| {
                    let k = store.get(&id)?.map(|e| (e.state, e.public_key));
                    let d = store.denied(&id)?;
                    Ok((id, want_of(k, d)))
                })
                .collect();
            if let Ok(now) = now {
                let _ = s.after(&now);
            }
        }
        return Err(e);
    }
    Ok(MergeReport {
        written: changes.len(),
        tree: tree.into_inner(),
    })
}

/// What a bank's stored value holds, as a snapshot entry compares it:
/// (state, key) for `keys`, (None, key without trailing NULs) for denied.
fn held(t: &Table, bank: Bank, id: &str, value: &[u8]) -> Result<(Option<KeyState>, Vec<u8>)> {
    match bank {
        Bank::Keys => match decode_key_value(value) {
            Some((s, pem)) => Ok((Some(s), pem.to_vec())),
            None => Err(Error::Corrupt {
                path: t.path().into(),
                id: Some(id.to_owned()),
                why: format!(
                    "value of {} bytes is not [state 1..3][public key]",
                    value.len()
                ),
            }),
        },
        Bank::Denied => {
            let mut v = value.to_vec();
            while v.last() == Some(&0) {
                v.pop();
            }
            Ok((None, v))
        }
    }
}

/// The stored value of a result entry.
fn value_of(e: &Entry) -> Vec<u8> {
    match e.state {
        Some(s) => encode_key_value(s, &e.pub_key),
        None => e.pub_key.clone(),
    }
}

/// Records what `id` holds in `bank` after the merge, for the tree.
fn note(finals: &mut Finals, bank: Bank, id: &str, held: Option<(Option<KeyState>, Vec<u8>)>) {
    let f = finals.entry(id.to_owned()).or_default();
    match bank {
        Bank::Keys => f.0 = held.and_then(|(s, k)| s.map(|s| (s, k))),
        Bank::Denied => f.1 = held.map(|(_, k)| k),
    }
}

/// The image of `t` (the bank `bank`) with the plan's changes made; the
/// caller holds its lock. Every entry the plan changes is checked against
/// what the plan took as ours.
fn rebuild_bank(
    store: &Store,
    t: &Table,
    bank: Bank,
    changes: &[&PlanEntry],
    ids: &HashSet<&str>,
    finals: &mut Finals,
) -> Result<Image> {
    let mine: HashMap<&str, &PlanEntry> = changes
        .iter()
        .filter(|e| e.bank == bank)
        .map(|e| (e.id.as_str(), *e))
        .collect();
    let stale = |id: &str, why: String| Error::StalePlan {
        dir: store.dir().into(),
        bank: bank.name(),
        id: id.to_owned(),
        why,
    };
    let describe = |h: Option<&(Option<KeyState>, Vec<u8>)>| match h {
        None => "absent".to_owned(),
        Some((s, k)) => format!(
            "{} with key {:016x}",
            s.map_or("denied", KeyState::name),
            crate::format::hash(k)
        ),
    };
    let mut image = Image::new(*t.params())?;
    let mut seen = HashSet::new();
    for r in t.iter()? {
        let r = r?;
        let id = std::str::from_utf8(&r.id).ok();
        match id.and_then(|i| mine.get(i).map(|e| (i, *e))) {
            Some((id, pe)) => {
                let now = held(t, bank, id, &r.value)?;
                let expected = pe.ours.as_ref().map(|o| (o.state, o.pub_key.clone()));
                if expected.as_ref() != Some(&now) {
                    return Err(stale(
                        id,
                        format!(
                            "the plan took it as {}, the store holds it {}",
                            describe(expected.as_ref()),
                            describe(Some(&now))
                        ),
                    ));
                }
                seen.insert(pe.id.as_str());
                match &pe.result {
                    Some(e) => image.insert(&r.id, &value_of(e), e.mtime, t.path())?,
                    None => image.allow_dropping(&r.id),
                }
                note(
                    finals,
                    bank,
                    id,
                    pe.result.as_ref().map(|e| (e.state, e.pub_key.clone())),
                );
            }
            None => {
                image.insert(&r.id, &r.value, r.mtime, t.path())?;
                if let Some(id) = id.filter(|i| ids.contains(i)) {
                    note(finals, bank, id, Some(held(t, bank, id, &r.value)?));
                }
            }
        }
    }
    for pe in changes.iter().filter(|e| e.bank == bank) {
        if seen.contains(pe.id.as_str()) {
            continue;
        }
        if let Some(o) = &pe.ours {
            return Err(stale(
                &pe.id,
                format!(
                    "the plan took it as {}, the store no longer holds it",
                    describe(Some(&(o.state, o.pub_key.clone())))
                ),
            ));
        }
        if let Some(e) = &pe.result {
            image.insert(pe.id.as_bytes(), &value_of(e), e.mtime, t.path())?;
        }
        note(
            finals,
            bank,
            &pe.id,
            pe.result.as_ref().map(|e| (e.state, e.pub_key.clone())),
        );
    }
    Ok(image)
}
