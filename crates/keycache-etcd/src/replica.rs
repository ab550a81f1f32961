//! Applying etcd's key state to the local store: a full list (the store
//! made equal to it) and the changes of a watch response, each one batch
//! under the banks' locks with the key tree in step (Salt's
//! `validate_token` reads `minions/<id>`).
//!
//! A value in etcd that the store cannot hold (not a key value, a private
//! key block, an id that is not a minion id or too long) grants nothing:
//! its id is removed from that bank locally, and it is reported, so that one
//! bad write cannot stall every master's replica.

use std::collections::BTreeMap;

use keycache::snapshot::Bank;
use keycache::store::{Batch, Store};
use keycache::MinionId;

use crate::error::Result;
use crate::layout::{Layout, Value};

/// One change of the key state: the new value of (bank, id), or its
/// removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The bank.
    pub bank: Bank,
    /// The minion.
    pub id: MinionId,
    /// The new value; `None`: removed.
    pub value: Option<Value>,
}

/// What an apply did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Entries written.
    pub written: u64,
    /// Entries removed.
    pub removed: u64,
    /// etcd keys under the prefix that were passed over or removed
    /// locally, and why.
    pub refused: Vec<(String, String)>,
}

/// Decodes one etcd (key, value) under `layout` into a change; what cannot
/// be held is reported in `applied` and becomes a removal when its id is
/// valid.
pub fn decode(
    layout: &Layout,
    key: &[u8],
    value: Option<&[u8]>,
    applied: &mut Applied,
) -> Option<Change> {
    let shown = || String::from_utf8_lossy(key).into_owned();
    let Some((bank, id)) = layout.parse(key) else {
        applied.refused.push((
            shown(),
            "not <prefix>keys/<minion id> or <prefix>denied_keys/<minion id>".into(),
        ));
        return None;
    };
    let value = match value.map(|v| Value::decode(bank, v)) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(why)) => {
            applied
                .refused
                .push((shown(), format!("{why}: removed here, grants nothing")));
            None
        }
    };
    Some(Change { bank, id, value })
}

fn stage(b: &mut Batch<'_, '_>, c: &Change, applied: &mut Applied) -> keycache::Result<()> {
    match (&c.value, c.bank) {
        (Some(Value::Key(s, pem)), _) => b.put(&c.id, *s, pem)?,
        (Some(Value::Denied(pem)), _) => b.deny(&c.id, pem)?,
        (None, Bank::Keys) => {
            b.remove(&c.id)?;
            applied.removed += 1;
            return Ok(());
        }
        (None, Bank::Denied) => {
            b.remove_denied(&c.id)?;
            applied.removed += 1;
            return Ok(());
        }
    }
    applied.written += 1;
    Ok(())
}

/// Whether the store can hold `c` (the id fits the table); else it is
/// reported and dropped from the batch, which would fail whole.
fn fits(store: &Store, c: &Change, applied: &mut Applied) -> bool {
    match store.keys_table().check_id(c.id.as_str().as_bytes()) {
        Ok(()) => true,
        Err(e) => {
            applied.refused.push((c.id.to_string(), e.to_string()));
            false
        }
    }
}

/// Applies `changes` (in order, the later change of an id winning) in one
/// batch.
pub fn apply_changes(store: &Store, changes: &[Change]) -> Result<Applied> {
    let mut applied = Applied::default();
    store.batch(|b| {
        for c in changes {
            if fits(store, c, &mut applied) {
                stage(b, c, &mut applied)?;
            }
        }
        Ok(())
    })?;
    Ok(applied)
}

/// [`apply_list`]'s rebuild: the listed entries that the store can hold,
/// as its whole contents.
fn rebuild(
    store: &Store,
    listed: &BTreeMap<(Bank, MinionId), Value>,
    had: usize,
) -> Result<Applied> {
    let mut applied = Applied::default();
    let mut c = keycache::store::Contents::default();
    for ((bank, id), v) in listed {
        let ch = Change {
            bank: *bank,
            id: id.clone(),
            value: Some(v.clone()),
        };
        if !fits(store, &ch, &mut applied) {
            continue;
        }
        match v {
            Value::Key(s, pem) => {
                c.keys.insert(id.clone(), (*s, pem.clone()));
            }
            Value::Denied(pem) => {
                c.denied.insert(id.clone(), pem.clone());
            }
        }
    }
    store.replace_all(&c)?;
    applied.written = (c.keys.len() + c.denied.len()) as u64;
    applied.removed = had.saturating_sub(c.keys.len() + c.denied.len()) as u64;
    Ok(applied)
}

/// Every entry of both banks of `store`, as etcd would hold it.
pub fn local_entries(store: &Store) -> keycache::Result<Vec<(Bank, String, Value)>> {
    let mut out = Vec::new();
    for r in store.keys(None)? {
        let (id, e) = r?;
        out.push((Bank::Keys, id, Value::Key(e.state, e.public_key)));
    }
    for r in store.denied_keys()? {
        let (id, pem) = r?;
        out.push((Bank::Denied, id, Value::Denied(pem)));
    }
    Ok(out)
}

/// Changes from which [`apply_list`] rebuilds the store instead of
/// writing a batch, when they are also a tenth of the entries or more.
pub const REBUILD_FROM: usize = 1_000;

/// Makes the store equal to `listed` (every entry etcd holds under the
/// prefix). Many changes (a new replica, one far behind: [`REBUILD_FROM`]
/// and a tenth of the entries) are one atomic rebuild of both banks
/// ([`Store::replace_all`]: readers and crashes see the old store or the
/// new one); a few are one batch under both banks' locks, in which entries
/// that differ are written, entries etcd lacks removed, equal ones left
/// alone. The key tree is kept in step either way.
pub fn apply_list(store: &Store, listed: &BTreeMap<(Bank, MinionId), Value>) -> Result<Applied> {
    let local = local_entries(store)?;
    let differ = local
        .iter()
        .filter(|(b, id, have)| {
            MinionId::new(id.clone()).map_or(true, |mid| listed.get(&(*b, mid)) != Some(have))
        })
        .count();
    let missing = listed
        .len()
        .saturating_sub(local.len() - differ.min(local.len()));
    let changes = differ + missing;
    if changes >= REBUILD_FROM && changes * 10 >= listed.len().max(local.len()) {
        return rebuild(store, listed, local.len());
    }
    let mut applied = Applied::default();
    store.batch_locked(
        |b| {
            let mut seen = std::collections::HashSet::new();
            let mut changes = Vec::new();
            for (bank, id, have) in local_entries(store)? {
                let Ok(mid) = MinionId::new(id) else { continue };
                match listed.get(&(bank, mid.clone())) {
                    Some(v) if *v == have => {}
                    v => changes.push(Change {
                        bank,
                        id: mid.clone(),
                        value: v.cloned(),
                    }),
                }
                seen.insert((bank, mid));
            }
            for ((bank, id), v) in listed {
                if !seen.contains(&(*bank, id.clone())) {
                    changes.push(Change {
                        bank: *bank,
                        id: id.clone(),
                        value: Some(v.clone()),
                    });
                }
            }
            for c in &changes {
                if fits(store, c, &mut applied) {
                    stage(b, c, &mut applied)?;
                }
            }
            Ok(())
        },
        || Ok(()),
    )?;
    Ok(applied)
}
