//! The versions of a store's entries in memory: one vector of records in
//! (bank, id) order, their ids in one arena, the bank slot each was last
//! seen in, and a hash index built only when needed.
//!
//! Built for the two walks a merge makes over a million entries, so that
//! neither hashes an id. A snapshot's entries come in (bank, id) order:
//! the read filter walks the records beside them with a cursor
//! ([`Versions::find_from`]). An observation walks the banks in slot
//! order: each record remembers its slot, so the record of the entry in a
//! slot is found through a vector indexed by slot
//! ([`Versions::entry_at`]), checked by its id. Only an entry that is new
//! or moved (a compaction) is looked up by hash, and the index is built
//! at the first such lookup.

use std::cell::OnceCell;
use std::collections::HashMap;

use super::Record;
use keycache::key::Bank;

/// A hasher for keys that are hashes already.
#[derive(Debug, Default, Clone, Copy)]
struct Pass(u64);

impl std::hash::Hasher for Pass {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

const NONE: u32 = u32::MAX;

/// No slot known (a record read from a version 1 file, or never seen in
/// the banks).
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// Slot hints past this are not kept (the vector indexed by slot would be
/// too large); those entries are looked up by hash.
const MAX_HINTED_SLOT: u32 = 1 << 26;

#[derive(Debug, Clone, Copy)]
struct Slot {
    bank: Bank,
    id_at: usize,
    id_len: usize,
    /// The bank slot the entry was last seen in.
    slot: u32,
    rec: Record,
}

/// Records by hash of (bank, id): the first of each hash, and for each
/// record the next with the same hash.
#[derive(Debug, Clone, Default)]
struct Index {
    heads: HashMap<u64, u32, std::hash::BuildHasherDefault<Pass>>,
    next: Vec<u32>,
}

impl Index {
    fn add(&mut self, h: u64, i: usize) {
        let head = self.heads.entry(h).or_insert(NONE);
        self.next.push(*head);
        *head = u32::try_from(i).unwrap_or(NONE);
    }
}

/// The records of both banks.
#[derive(Debug, Clone)]
pub(crate) struct Versions {
    slots: Vec<Slot>,
    ids: String,
    /// Per bank (`keys`, `denied_keys`), the record last seen in each slot.
    by_slot: [Vec<u32>; 2],
    index: OnceCell<Index>,
    /// Whether `slots` is in (bank, id) order.
    sorted: bool,
}

impl Default for Versions {
    fn default() -> Versions {
        Versions::with_capacity(0)
    }
}

fn hash(b: Bank, id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), bank_no(b) as u64 + 1)
}

fn bank_no(b: Bank) -> usize {
    match b {
        Bank::Keys => 0,
        Bank::Denied => 1,
    }
}

impl Versions {
    pub(crate) fn with_capacity(n: usize) -> Versions {
        Versions {
            slots: Vec::with_capacity(n),
            ids: String::with_capacity(n.saturating_mul(24)),
            by_slot: [Vec::new(), Vec::new()],
            index: OnceCell::new(),
            sorted: true,
        }
    }

    fn id(&self, s: &Slot) -> &str {
        self.ids.get(s.id_at..s.id_at + s.id_len).unwrap_or("")
    }

    fn index(&self) -> &Index {
        self.index.get_or_init(|| {
            let mut ix = Index {
                heads: HashMap::with_capacity_and_hasher(self.slots.len(), Default::default()),
                next: Vec::with_capacity(self.slots.len()),
            };
            for (i, s) in self.slots.iter().enumerate() {
                ix.add(hash(s.bank, self.id(s)), i);
            }
            ix
        })
    }

    fn find(&self, b: Bank, id: &str) -> Option<usize> {
        let ix = self.index();
        let mut i = *ix.heads.get(&hash(b, id))?;
        while i != NONE {
            let s = &self.slots[i as usize];
            if s.bank == b && self.id(s) == id {
                return Some(i as usize);
            }
            i = ix.next[i as usize];
        }
        None
    }

    /// Records that record `i` was seen in bank slot `slot`.
    fn hint(&mut self, i: usize, slot: u32) {
        let s = &mut self.slots[i];
        s.slot = slot;
        if slot < MAX_HINTED_SLOT {
            let v = &mut self.by_slot[bank_no(s.bank)];
            if v.len() <= slot as usize {
                v.resize(slot as usize + 1, NONE);
            }
            v[slot as usize] = u32::try_from(i).unwrap_or(NONE);
        }
    }

    fn push(&mut self, b: Bank, id: &str, rec: Record, slot: u32) -> usize {
        let n = self.slots.len();
        if self.sorted {
            if let Some(last) = self.slots.last() {
                self.sorted = (last.bank, self.id(last)) < (b, id);
            }
        }
        if let Some(ix) = self.index.get_mut() {
            ix.add(hash(b, id), n);
        }
        self.slots.push(Slot {
            bank: b,
            id_at: self.ids.len(),
            id_len: id.len(),
            slot: NO_SLOT,
            rec,
        });
        self.ids.push_str(id);
        if slot != NO_SLOT {
            self.hint(n, slot);
        }
        n
    }

    pub(crate) fn get(&self, b: Bank, id: &str) -> Option<&Record> {
        self.find(b, id).map(|i| &self.slots[i].rec)
    }

    /// The record of (`b`, `id`), inserted as "never seen" when missing.
    pub(crate) fn entry(&mut self, b: Bank, id: &str) -> &mut Record {
        let i = match self.find(b, id) {
            Some(i) => i,
            None => self.push(b, id, Record::unseen(), NO_SLOT),
        };
        &mut self.slots[i].rec
    }

    /// The record of (`b`, `id`), seen in bank slot `slot` (inserted as
    /// "never seen" when missing): found through the slot when it was
    /// there before. Also says whether the slot is a new one for it (the
    /// history file is then rewritten, to keep the hint).
    pub(crate) fn entry_at(&mut self, b: Bank, id: &str, slot: u64) -> (&mut Record, bool) {
        let slot = u32::try_from(slot).unwrap_or(NO_SLOT);
        let hinted = match self.by_slot[bank_no(b)].get(slot as usize) {
            Some(&i) if i != NONE => {
                let s = &self.slots[i as usize];
                (s.slot == slot && s.bank == b && self.id(s) == id).then_some(i as usize)
            }
            _ => None,
        };
        let (i, moved) = match hinted {
            Some(i) => (i, false),
            None => {
                let i = match self.find(b, id) {
                    Some(i) => i,
                    None => self.push(b, id, Record::unseen(), NO_SLOT),
                };
                let moved = self.slots[i].slot != slot;
                if moved {
                    self.hint(i, slot);
                }
                (i, moved)
            }
        };
        (&mut self.slots[i].rec, moved)
    }

    /// The bank slot record `i` was last seen in.
    #[cfg(test)]
    fn slot_of(&self, i: usize) -> u32 {
        self.slots.get(i).map_or(NO_SLOT, |s| s.slot)
    }

    /// Inserts a record last seen in `slot`; false when (`b`, `id`) was
    /// there already.
    pub(crate) fn insert(&mut self, b: Bank, id: &str, r: Record, slot: u32) -> bool {
        // After the last of records in order (a history file read back):
        // new, without a lookup.
        let after_last = self.sorted
            && self
                .slots
                .last()
                .is_none_or(|last| (last.bank, self.id(last)) < (b, id));
        if !after_last && self.find(b, id).is_some() {
            return false;
        }
        self.push(b, id, r, slot);
        true
    }

    /// The record of (`b`, `id`), for lookups made in (bank, id) order
    /// (a snapshot's entries): `cursor` (0 at first) remembers where the
    /// last one was, and the next is searched from there, galloping. Out
    /// of order, or before [`Versions::sort`], it is a plain lookup.
    pub(crate) fn find_from(&self, cursor: &mut usize, b: Bank, id: &str) -> Option<&Record> {
        if !self.sorted {
            return self.get(b, id);
        }
        let want = (b, id);
        let key = |i: usize| {
            let s = &self.slots[i];
            (s.bank, self.id(s))
        };
        let len = self.slots.len();
        let mut lo = (*cursor).min(len);
        if lo < len && key(lo) > want {
            lo = 0;
        }
        // Gallop: the first index at or after `want` is in [lo, hi].
        let mut step = 1;
        let mut hi = lo;
        while hi < len && key(hi) < want {
            lo = hi + 1;
            hi = hi.saturating_add(step).min(len);
            step *= 2;
        }
        let at = lo + self.slots[lo..hi].partition_point(|s| (s.bank, self.id(s)) < want);
        *cursor = at;
        (at < len && key(at) == want).then(|| &self.slots[at].rec)
    }

    /// Whether the records are in (bank, id) order.
    pub(crate) fn is_sorted(&self) -> bool {
        self.sorted
    }

    /// Puts the records in (bank, id) order (the history file's order).
    pub(crate) fn sort(&mut self) {
        if self.sorted {
            return;
        }
        let mut slots = std::mem::take(&mut self.slots);
        slots.sort_unstable_by(|a, b| (a.bank, self.id(a)).cmp(&(b.bank, self.id(b))));
        self.rebuild(slots);
    }

    fn rebuild(&mut self, slots: Vec<Slot>) {
        let old = std::mem::take(&mut self.ids);
        let n = slots.len();
        self.index = OnceCell::new();
        self.by_slot = [Vec::new(), Vec::new()];
        self.slots = Vec::with_capacity(n);
        self.ids = String::with_capacity(old.len());
        self.sorted = true;
        for s in slots {
            let id = old.get(s.id_at..s.id_at + s.id_len).unwrap_or("");
            self.push(s.bank, id, s.rec, s.slot);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Every record with its bank slot, in (bank, id) order once sorted.
    pub(crate) fn iter_slots(&self) -> impl Iterator<Item = (Bank, &str, &Record, u32)> + '_ {
        self.slots
            .iter()
            .map(|s| (s.bank, self.id(s), &s.rec, s.slot))
    }

    /// Every record, in (bank, id) order once sorted.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Bank, &str, &Record)> + '_ {
        self.slots.iter().map(|s| (s.bank, self.id(s), &s.rec))
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (Bank, &str, &mut Record)> + '_ {
        let ids = &self.ids;
        self.slots.iter_mut().map(move |s| {
            let id = ids.get(s.id_at..s.id_at + s.id_len).unwrap_or("");
            (s.bank, id, &mut s.rec)
        })
    }

    pub(crate) fn retain(&mut self, mut f: impl FnMut(&Record) -> bool) {
        if self.slots.iter().all(|s| f(&s.rec)) {
            return;
        }
        let slots: Vec<Slot> = std::mem::take(&mut self.slots)
            .into_iter()
            .filter(|s| f(&s.rec))
            .collect();
        self.rebuild(slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Kind, Version};

    fn rec(stamp: u64) -> Record {
        Record {
            cur: Version {
                stamp,
                kind: Kind::Accepted,
                hash: 1,
            },
            prev: None,
            mark: 0,
        }
    }

    #[test]
    fn lookups_agree_in_and_out_of_order() {
        let mut v = Versions::default();
        let ids: Vec<String> = (0..300).map(|i| format!("m{:03}", (i * 7) % 300)).collect();
        for (n, id) in ids.iter().enumerate() {
            assert!(v.insert(Bank::Keys, id, rec(n as u64), NO_SLOT));
        }
        assert!(
            !v.insert(Bank::Keys, "m000", rec(9), NO_SLOT),
            "no duplicate"
        );
        v.insert(Bank::Denied, "m005", rec(1000), NO_SLOT);
        assert!(!v.sorted);
        v.sort();
        assert!(v.sorted);
        let all: Vec<(Bank, String)> = v.iter().map(|(b, i, _)| (b, i.to_owned())).collect();
        let mut want = all.clone();
        want.sort();
        assert_eq!(all, want);
        // In order, with gaps, then out of order and missing ids.
        let mut c = 0;
        for i in (0..300).step_by(3) {
            let id = format!("m{i:03}");
            assert_eq!(v.find_from(&mut c, Bank::Keys, &id), v.get(Bank::Keys, &id));
            assert!(v.get(Bank::Keys, &id).is_some());
        }
        assert_eq!(
            v.find_from(&mut c, Bank::Denied, "m005")
                .map(|r| r.cur.stamp),
            Some(1000)
        );
        for id in ["m100", "m000", "zz", "m1000", "", "m299"] {
            assert_eq!(v.find_from(&mut c, Bank::Keys, id), v.get(Bank::Keys, id));
        }
        assert!(v.find_from(&mut c, Bank::Denied, "m006").is_none());
        // Retain rebuilds the index.
        v.retain(|r| r.cur.stamp % 2 == 0);
        assert_eq!(v.len(), 151);
        assert!(v.get(Bank::Keys, "m000").is_some());
        for (_, _, r) in v.iter() {
            assert_eq!(r.cur.stamp % 2, 0);
        }
    }

    #[test]
    fn ids_with_the_same_hash_are_told_apart() {
        // The index chains records with one hash: force a chain by hand.
        let mut v = Versions::default();
        v.insert(Bank::Keys, "a", rec(1), NO_SLOT);
        v.insert(Bank::Denied, "a", rec(2), NO_SLOT);
        assert_eq!(v.get(Bank::Keys, "a").map(|r| r.cur.stamp), Some(1));
        assert_eq!(v.get(Bank::Denied, "a").map(|r| r.cur.stamp), Some(2));
        let h = hash(Bank::Keys, "a");
        let b = v.push(Bank::Keys, "b", rec(3), NO_SLOT);
        // Re-link "b" under "a"'s hash, as a collision would.
        let ix = v.index.get_mut().expect("built by the lookups");
        ix.heads.remove(&hash(Bank::Keys, "b"));
        ix.next[b] = ix.heads[&h];
        ix.heads.insert(h, b as u32);
        assert_eq!(v.find(Bank::Keys, "a"), Some(0));
        assert_eq!(v.find(Bank::Keys, "b"), None, "its own hash is gone");
    }

    #[test]
    fn slots_find_records_and_are_checked_by_id() {
        let mut v = Versions::default();
        for (n, id) in ["a", "b", "c"].iter().enumerate() {
            v.insert(Bank::Keys, id, rec(n as u64), 10 + n as u32);
        }
        v.insert(Bank::Denied, "a", rec(9), 10);
        // Found through the slot, nothing moved, no index built.
        let (r, moved) = v.entry_at(Bank::Keys, "b", 11);
        assert_eq!((r.cur.stamp, moved), (1, false));
        let (r, moved) = v.entry_at(Bank::Denied, "a", 10);
        assert_eq!((r.cur.stamp, moved), (9, false));
        assert!(v.index.get().is_none());
        // Another id in a slot (a compaction moved them): by id, moved.
        let (r, moved) = v.entry_at(Bank::Keys, "a", 11);
        assert_eq!((r.cur.stamp, moved), (0, true));
        assert_eq!(v.slot_of(0), 11);
        let (r, moved) = v.entry_at(Bank::Keys, "b", 5);
        assert_eq!((r.cur.stamp, moved), (1, true));
        // "a" now holds slot 11; "b" slot 5; a new id is inserted unseen.
        assert!(!v.entry_at(Bank::Keys, "a", 11).1);
        let (r, moved) = v.entry_at(Bank::Keys, "d", 12);
        assert_eq!((r.cur.kind, moved), (Kind::Absent, true));
        assert_eq!(v.len(), 5);
        // A slot too large for a hint still works, by hash.
        let (r, _) = v.entry_at(Bank::Keys, "c", u64::from(MAX_HINTED_SLOT) + 7);
        assert_eq!(r.cur.stamp, 2);
        assert!(
            !v.entry_at(Bank::Keys, "c", u64::from(MAX_HINTED_SLOT) + 7)
                .1
        );
        // Sorting keeps the hints.
        v.sort();
        assert!(!v.entry_at(Bank::Keys, "d", 12).1);
    }
}
