//! Committing a merge plan: under both banks' locks, every entry the plan
//! replaces is checked, the history saved (the new versions in flight),
//! then the banks written in one batch with the key tree in step.

use super::{MergeOptions, MergePlan};
use crate::error::{Error, Result};
use crate::history::{value_hash, History, Kind, Peer};
use keycache::id::MinionId;
use keycache::key::Bank;
use keycache::store::Store;
use keycache::tree::TreeChanges;

/// What [`super::merge`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MergeReport {
    /// Entries of the store written or removed.
    pub written: usize,
    /// What was done to the key tree (nothing when the store's tree is off,
    /// see [`Store::set_tree`]).
    pub tree: TreeChanges,
}

/// The hash of what the store holds for (`bank`, `id`) now; 0 when absent.
fn current(
    b: &keycache::store::Batch<'_, '_>,
    store: &Store,
    bank: Bank,
    id: &MinionId,
) -> Result<u64> {
    Ok(match bank {
        Bank::Keys => b
            .get(id)?
            .filter(|(_, p)| !p.is_empty())
            .map_or(0, |(s, p)| value_hash(Kind::of_state(s), &p)),
        Bank::Denied => store
            .denied(id)?
            .filter(|p| !p.is_empty())
            .map_or(0, |p| value_hash(Kind::Denied, &p)),
    })
}

/// Commits `plan` (made from `h`) to `store`. `settled` lists the entries a
/// merge before this one had in flight: their key tree is brought in step
/// too.
pub(super) fn commit(
    store: &Store,
    h: &mut History,
    plan: &MergePlan,
    settled: &[(Bank, String)],
    opts: &MergeOptions,
) -> Result<MergeReport> {
    let dir = store.dir().to_path_buf();
    let stale = |bank: Bank, id: &str, why: String| Error::StalePlan {
        dir: dir.clone(),
        bank: bank.name(),
        id: id.to_owned(),
        why,
    };
    let h = std::cell::RefCell::new(h);
    let ((), applied, tree) = store.batch_locked(
        |b| {
            let h = &mut *h.borrow_mut();
            if History::seq_on_disk(&dir)? != h.seq {
                return Err(stale(
                    Bank::Keys,
                    "",
                    "another keycache saved the store's history meanwhile".into(),
                ));
            }
            let mut ids = Vec::with_capacity(plan.entries.len());
            for e in &plan.entries {
                let id = MinionId::new(e.id().to_owned())?;
                store.keys_table().check_id(id.as_str().as_bytes())?;
                let want = e.ours.map_or(0, |o| o.hash);
                let got = current(b, store, e.bank(), &id)?;
                if got != want {
                    return Err(stale(e.bank(), e.id(), "its value changed".into()));
                }
                ids.push(id);
            }
            for e in &plan.entries {
                h.set_in_flight(e.bank(), e.id(), e.result.version());
            }
            for e in &plan.recorded {
                h.record(e.bank, &e.id, e.version());
            }
            let wall = &opts.history.wall;
            let me = &mut h.identity;
            me.clock.receive(plan.their_generation);
            let merged_at = me.clock.tick(wall);
            me.peers.insert(
                plan.their_store,
                Peer {
                    generation: plan.their_generation,
                    merged_at,
                },
            );
            h.save(&dir, &opts.history)?;
            for (e, id) in plan.entries.iter().zip(&ids) {
                let r = &e.result;
                match (e.bank(), r.kind.state()) {
                    (Bank::Keys, Some(s)) => b.put(id, s, &r.public_key)?,
                    (Bank::Keys, None) => b.remove(id)?,
                    (Bank::Denied, _) if r.kind == Kind::Denied => b.deny(id, &r.public_key)?,
                    (Bank::Denied, _) => b.remove_denied(id)?,
                }
            }
            for (_, id) in settled {
                if let Ok(id) = MinionId::new(id.clone()) {
                    b.touch_tree(&id);
                }
            }
            Ok(())
        },
        // The banks hold the new values: nothing is in flight any more. An
        // operator's change of one of these entries before the next merge
        // must read as a change, not as the merge undone.
        || {
            let h = &mut *h.borrow_mut();
            h.settle();
            h.save(&dir, &opts.history)
        },
    )?;
    Ok(MergeReport {
        written: (applied.inserted + applied.updated + applied.removed) as usize,
        tree,
    })
}
