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

use keycache::store::{Batch, Store};
use keycache::Bank;
use keycache::MinionId;

use crate::error::{Error, Result};
use crate::prefix::{Prefix, Value};

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
/// valid. The audit trail's keys ([`Prefix::is_audit`]) are no key state:
/// passed over silently (the replicator logs them: [`crate::audit`]).
pub fn decode(
    layout: &Prefix,
    key: &[u8],
    value: Option<&[u8]>,
    applied: &mut Applied,
) -> Option<Change> {
    if layout.is_audit(key) {
        return None;
    }
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
///
/// When the banks have no room for every id new to them
/// ([`keycache::Error::TableFull`]: etcd holds more minions than
/// `mmap_key_size` slots), the changes and removals of entries the store
/// holds are applied first, in a batch of their own, and the new ids after
/// them while they fit; those that do not are refused (reported, and held
/// nowhere here, so they grant nothing). A revocation is never held up by
/// a flood of new sign-ins filling the table.
pub fn apply_changes(store: &Store, changes: &[Change]) -> Result<Applied> {
    match apply_batch(store, changes) {
        Err(Error::Store(keycache::Error::TableFull { .. })) => apply_split(store, changes),
        r => r,
    }
}

/// Whether the store holds an entry for `id` in `bank`.
fn holds(store: &Store, bank: Bank, id: &MinionId) -> keycache::Result<bool> {
    match bank {
        Bank::Keys => Ok(store.get(id)?.is_some()),
        Bank::Denied => store.is_denied(id),
    }
}

/// [`apply_changes`] on banks too full for the whole batch: what the
/// store holds first, then each bank's new ids in chunks that halve on
/// [`keycache::Error::TableFull`] down to one id, after which the bank's
/// remaining new ids are refused.
fn apply_split(store: &Store, changes: &[Change]) -> Result<Applied> {
    let (mut held, mut new) = (Vec::new(), [Vec::new(), Vec::new()]);
    // An id's changes stay together and in order; ids keep their order.
    let mut groups: std::collections::HashMap<(Bank, &MinionId), usize> = Default::default();
    for c in changes {
        if holds(store, c.bank, &c.id)? {
            held.push(c.clone());
            continue;
        }
        let b = usize::from(c.bank == Bank::Denied);
        let i = *groups.entry((c.bank, &c.id)).or_insert_with(|| {
            new[b].push(Vec::new());
            new[b].len() - 1
        });
        new[b][i].push(c.clone());
    }
    let mut applied = apply_batch(store, &held)?;
    for ids in &new {
        let mut at = 0;
        let mut chunk = ids.len();
        while at < ids.len() {
            let end = (at + chunk).min(ids.len());
            let part: Vec<Change> = ids[at..end].iter().flatten().cloned().collect();
            match apply_batch(store, &part) {
                Ok(a) => {
                    applied.written += a.written;
                    applied.removed += a.removed;
                    applied.refused.extend(a.refused);
                    at = end;
                }
                Err(Error::Store(keycache::Error::TableFull { path, capacity })) if chunk == 1 => {
                    for group in &ids[at..] {
                        applied
                            .refused
                            .push((group[0].id.to_string(), full(&path, capacity)));
                    }
                    break;
                }
                Err(Error::Store(keycache::Error::TableFull { .. })) => chunk = chunk.div_ceil(2),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(applied)
}

/// Why an entry a full bank has no slot for is refused.
fn full(index: &std::path::Path, capacity: u64) -> String {
    format!(
        "{}: the table is full ({capacity} data slots): not held by this master, so it \
         grants nothing here; raise mmap_key_size and compact (keycache compact --to-size N)",
        index.display()
    )
}

/// Applies `changes` in one batch (see [`apply_changes`]).
fn apply_batch(store: &Store, changes: &[Change]) -> Result<Applied> {
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
///
/// When a bank cannot hold every entry listed for it (more than its
/// `mmap_key_size - 1` data slots), the entries it holds already are kept
/// first and the others while they fit; the rest are refused (reported,
/// held nowhere here). Removals always go in.
pub fn apply_list(store: &Store, listed: &BTreeMap<(Bank, MinionId), Value>) -> Result<Applied> {
    match apply_list_once(store, listed) {
        Err(Error::Store(keycache::Error::TableFull { .. })) => {
            let (fitting, refused) = fit(store, listed)?;
            let mut applied = apply_list_once(store, &fitting)?;
            applied.refused.extend(refused);
            Ok(applied)
        }
        r => r,
    }
}

/// The entries of `listed` that each bank has data slots for: those the
/// store holds first, then the others in order; and the refused rest,
/// with why.
#[allow(clippy::type_complexity)]
fn fit(
    store: &Store,
    listed: &BTreeMap<(Bank, MinionId), Value>,
) -> Result<(BTreeMap<(Bank, MinionId), Value>, Vec<(String, String)>)> {
    let mut fitting = BTreeMap::new();
    let mut refused = Vec::new();
    for bank in [Bank::Keys, Bank::Denied] {
        let table = match bank {
            Bank::Keys => store.keys_table(),
            Bank::Denied => store.denied_table(),
        };
        let capacity = table.params().size.saturating_sub(1);
        let mut room = capacity;
        let entries: Vec<(&(Bank, MinionId), &Value)> =
            listed.iter().filter(|((b, _), _)| *b == bank).collect();
        let mut held = Vec::with_capacity(entries.len());
        for (k, _) in &entries {
            held.push(holds(store, bank, &k.1)?);
        }
        for first in [true, false] {
            for ((k, v), h) in entries.iter().zip(&held) {
                if *h != first {
                    continue;
                }
                if room > 0 {
                    room -= 1;
                    fitting.insert((*k).clone(), (*v).clone());
                } else {
                    refused.push((k.1.to_string(), full(table.path(), capacity)));
                }
            }
        }
    }
    Ok((fitting, refused))
}

/// [`apply_list`] on the banks as they are.
fn apply_list_once(store: &Store, listed: &BTreeMap<(Bank, MinionId), Value>) -> Result<Applied> {
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
        |b| -> keycache::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use keycache::tree::TreeSync;
    use keycache::{KeyState, OpenOptions, Params};

    /// A store of 10 data slots a bank, with the whole key tree.
    fn small(dir: &std::path::Path) -> Store {
        let opts = OpenOptions {
            params: Params {
                size: 11,
                ..Params::default()
            },
            ..OpenOptions::default()
        };
        Store::open_with(dir, &opts)
            .expect("store")
            .with_tree(TreeSync::On)
    }

    fn id(s: &str) -> MinionId {
        MinionId::new(s).expect("id")
    }

    fn pem(s: &str) -> Vec<u8> {
        format!("-----BEGIN PUBLIC KEY-----\n{s}\n-----END PUBLIC KEY-----\n").into_bytes()
    }

    /// Every slot of `keys` taken: nine pending keys and `victim` accepted.
    fn full_store(dir: &std::path::Path) -> Store {
        let store = small(dir);
        let mut changes: Vec<Change> = (0..9)
            .map(|i| Change {
                bank: Bank::Keys,
                id: id(&format!("old-{i}")),
                value: Some(Value::Key(KeyState::Pending, pem("old"))),
            })
            .collect();
        changes.push(Change {
            bank: Bank::Keys,
            id: id("victim"),
            value: Some(Value::Key(KeyState::Accepted, pem("victim"))),
        });
        apply_changes(&store, &changes).expect("fill");
        assert!(dir.join("minions/victim").is_file());
        store
    }

    fn new_pending(n: usize) -> impl Iterator<Item = Change> {
        (0..n).map(|i| Change {
            bank: Bank::Keys,
            id: id(&format!("new-{i}")),
            value: Some(Value::Key(KeyState::Pending, pem("new"))),
        })
    }

    fn held(store: &Store) -> Vec<String> {
        let mut ids: Vec<String> = local_entries(store)
            .expect("entries")
            .into_iter()
            .map(|(_, id, _)| id)
            .collect();
        ids.sort();
        ids
    }

    /// A watch batch that brings more new ids than the full bank has slots
    /// for, and a revocation among them: the revocation is applied (its
    /// tree file first), the new ids that fit after it go in, the others
    /// are refused and reported; the batch does not fail whole (which
    /// would stop every later change from reaching this master).
    #[test]
    fn a_full_bank_never_holds_up_a_revocation_in_a_watch_batch() {
        let t = tempfile::tempdir().expect("dir");
        let store = full_store(t.path());
        let mut changes: Vec<Change> = new_pending(3).collect();
        changes.insert(
            1,
            Change {
                bank: Bank::Keys,
                id: id("victim"),
                value: None,
            },
        );
        let a = apply_changes(&store, &changes).expect("applied despite the full bank");
        assert!(!t.path().join("minions/victim").exists());
        assert_eq!(store.get(&id("victim")).expect("get"), None);
        assert_eq!((a.written, a.removed), (1, 1), "{a:?}");
        let refused: Vec<&str> = a.refused.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(refused, ["new-1", "new-2"], "{a:?}");
        assert!(
            a.refused[0].1.contains("the table is full (10 data slots)"),
            "{a:?}"
        );
        let mut want: Vec<String> = (0..9).map(|i| format!("old-{i}")).collect();
        want.push("new-0".into());
        want.sort();
        assert_eq!(held(&store), want);
        assert!(t.path().join("minions_pre/new-0").is_file());
        assert!(!t.path().join("minions_pre/new-1").exists());
    }

    /// The audit trail's keys are no key state: no change, no report,
    /// whatever their value.
    #[test]
    fn audit_keys_decode_to_nothing_and_are_not_reported() {
        let l = Prefix::new("/kc/").expect("prefix");
        let mut a = Applied::default();
        let k = l.audit_key(std::time::SystemTime::now(), 1);
        assert_eq!(decode(&l, &k, Some(b"{}\n"), &mut a), None);
        assert_eq!(decode(&l, &k, None, &mut a), None);
        assert_eq!(decode(&l, b"/kc/audit/x", Some(b"garbage"), &mut a), None);
        assert!(a.refused.is_empty(), "{a:?}");
        // Anything else under the prefix is still reported.
        assert_eq!(decode(&l, b"/kc/auditx/y", Some(b"garbage"), &mut a), None);
        assert_eq!(a.refused.len(), 1);
    }

    /// A list with more entries than the full bank has slots for: what etcd
    /// lacks is removed, what the store holds is kept, new entries go in
    /// while they fit, the rest are refused; both the batch and the rebuild
    /// of [`apply_list`] take that path.
    #[test]
    fn a_list_larger_than_the_bank_keeps_what_is_held_and_removes_what_etcd_lacks() {
        for new in [3, 1_500] {
            let t = tempfile::tempdir().expect("dir");
            let store = full_store(t.path());
            let mut listed = BTreeMap::new();
            for i in 0..9 {
                listed.insert(
                    (Bank::Keys, id(&format!("old-{i}"))),
                    Value::Key(KeyState::Pending, pem("old")),
                );
            }
            for c in new_pending(new) {
                listed.insert((c.bank, c.id), c.value.expect("value"));
            }
            let a = apply_list(&store, &listed).expect("applied despite the full bank");
            assert!(!t.path().join("minions/victim").exists(), "{new}");
            assert_eq!(store.get(&id("victim")).expect("get"), None);
            assert_eq!(a.refused.len(), new - 1, "{new}: {:?}", &a.refused[..1]);
            let held = held(&store);
            assert_eq!(held.len(), 10, "{new}: {held:?}");
            for i in 0..9 {
                assert!(held.contains(&format!("old-{i}")), "{new}: {held:?}");
            }
        }
    }
}
