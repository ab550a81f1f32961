//! A snapshot taken straight into a file ([`take_to_file`]): the entries
//! are written from the banks, in order, as they are read, so the memory
//! of a snapshot of a million keys is that of its history, not of a copy
//! of every key.

use std::path::Path;

use super::codec::{check_entry, Writer};
use super::{prepare_file_with, Bank, EntryRef, SnapshotOptions};
use crate::error::Result;
use crate::history::{History, Kind};
use keycache::key::decode_key_value;
use keycache::store::Store;

/// Takes a snapshot of `store` as [`super::take`] does, written to the file
/// `path` (atomically: a temporary file beside it, renamed once complete
/// and fsynced). Under both banks' locks the store is observed, the
/// entries are written in (bank, id) order, each value read from its bank
/// slot, and the history saved; the locks are released before the file is
/// fsynced and renamed. Returns the number of entries written. Nothing is
/// saved or renamed when an entry is refused.
pub fn take_to_file(store: &Store, opts: &SnapshotOptions, path: &Path) -> Result<u64> {
    let (k, d) = (store.keys_table(), store.denied_table());
    let (w, h) = (opts.lock_wait, &opts.history);
    let cluster = crate::history::cluster_of(store)?;
    let name = path.display().to_string();
    let mut count = 0u64;
    let prepared = prepare_file_with(path, |out| {
        k.read_locked(w, || {
            d.read_locked(w, || {
                let mut hist = History::load(store.dir(), h)?;
                hist.observe(store, h, false, |bank, id, _state, pem, _ver| {
                    super::refuse_private(store, bank, id, pem)
                })?;
                let cutoff = crate::history::horizon_cutoff(h);
                hist.entries.sort();
                let wanted = |kind: Kind, stamp: u64| kind != Kind::Absent || stamp >= cutoff;
                count = hist
                    .entries
                    .iter()
                    .filter(|(_, _, r)| wanted(r.cur.kind, r.cur.stamp))
                    .count() as u64;
                let generation = hist.identity.clock.tick(&h.wall);
                let mut wr = Writer::new(out);
                wr.header_parts(cluster, hist.identity.store, generation, count)?;
                let (mut buf, mut idb, mut value) = (Vec::new(), Vec::new(), Vec::new());
                for (n, (bank, id, r, slot)) in hist.entries.iter_slots().enumerate() {
                    if !wanted(r.cur.kind, r.cur.stamp) {
                        continue;
                    }
                    let table = match bank {
                        Bank::Keys => k,
                        Bank::Denied => d,
                    };
                    let pem: &[u8] = if r.cur.kind == Kind::Absent {
                        &[]
                    } else {
                        value_of(table, id, slot, bank, &mut buf, &mut idb, &mut value)?
                    };
                    let e = EntryRef {
                        bank,
                        id,
                        kind: r.cur.kind,
                        stamp: r.cur.stamp,
                        public_key: pem,
                    };
                    check_entry(&e, n as u64, &name)?;
                    wr.entry_ref(&e)?;
                }
                wr.finish()?;
                hist.save(store.dir(), h)
            })
        })
    })?;
    prepared.commit()?;
    Ok(count)
}

/// The public key of live entry `id` of `table`, read from `slot` (where
/// the observation just saw it; by id when the slot is not known).
fn value_of<'v>(
    table: &keycache::table::Table,
    id: &str,
    slot: u32,
    bank: Bank,
    buf: &mut Vec<u8>,
    idb: &mut Vec<u8>,
    value: &'v mut Vec<u8>,
) -> Result<&'v [u8]> {
    let found = match table.read_slot_into(u64::from(slot), buf, idb, value)? {
        Some(_) if idb.as_slice() == id.as_bytes() => true,
        _ => match table.get(id.as_bytes())? {
            Some(s) => {
                *value = s.value;
                true
            }
            None => false,
        },
    };
    let corrupt = |why: &str| keycache::Error::Corrupt {
        path: table.path().into(),
        id: Some(id.to_owned()),
        why: why.into(),
    };
    if !found {
        return Err(corrupt("gone from its bank during the snapshot, under its lock").into());
    }
    Ok(match bank {
        Bank::Keys => decode_key_value(value)
            .map(|(_, pem)| pem)
            .ok_or_else(|| corrupt("the value is not [state 1..3][public key]"))?,
        Bank::Denied => {
            let mut end = value.len();
            while end > 0 && value[end - 1] == 0 {
                end -= 1;
            }
            &value[..end]
        }
    })
}
