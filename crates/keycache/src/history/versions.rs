//! The versions of a store's entries in memory: one vector of records in
//! (bank, id) order, their ids in one arena, and a hash index.
//!
//! Built for the two walks a merge makes over a million entries. A
//! snapshot's entries come in (bank, id) order, so the read filter walks
//! the records with a cursor ([`Versions::find_from`]), never hashing; an
//! observation walks the banks in slot order and looks each id up in the
//! index. No allocation per entry: a `HashMap<Box<str>, _>` made one per
//! id, and its lookups were half of a no-op merge.

use std::collections::HashMap;

use super::Record;
use crate::snapshot::Bank;

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

#[derive(Debug, Clone, Copy)]
struct Slot {
    bank: Bank,
    id_at: usize,
    id_len: usize,
    /// The next record whose (bank, id) has the same hash.
    next: u32,
    rec: Record,
}

/// The records of both banks.
#[derive(Debug, Clone)]
pub(crate) struct Versions {
    slots: Vec<Slot>,
    ids: String,
    index: HashMap<u64, u32, std::hash::BuildHasherDefault<Pass>>,
    /// Whether `slots` is in (bank, id) order.
    sorted: bool,
}

impl Default for Versions {
    fn default() -> Versions {
        Versions::with_capacity(0)
    }
}

fn hash(b: Bank, id: &str) -> u64 {
    let seed = match b {
        Bank::Keys => 1,
        Bank::Denied => 2,
    };
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), seed)
}

impl Versions {
    pub(crate) fn with_capacity(n: usize) -> Versions {
        Versions {
            slots: Vec::with_capacity(n),
            ids: String::with_capacity(n.saturating_mul(24)),
            index: HashMap::with_capacity_and_hasher(n, Default::default()),
            sorted: true,
        }
    }

    fn id(&self, s: &Slot) -> &str {
        self.ids.get(s.id_at..s.id_at + s.id_len).unwrap_or("")
    }

    fn find(&self, b: Bank, id: &str) -> Option<usize> {
        let mut i = *self.index.get(&hash(b, id))?;
        while i != NONE {
            let s = &self.slots[i as usize];
            if s.bank == b && self.id(s) == id {
                return Some(i as usize);
            }
            i = s.next;
        }
        None
    }

    fn push(&mut self, b: Bank, id: &str, rec: Record) -> usize {
        let n = self.slots.len();
        if self.sorted {
            if let Some(last) = self.slots.last() {
                self.sorted = (last.bank, self.id(last)) < (b, id);
            }
        }
        let head = self.index.entry(hash(b, id)).or_insert(NONE);
        let next = *head;
        *head = u32::try_from(n).unwrap_or(NONE);
        self.slots.push(Slot {
            bank: b,
            id_at: self.ids.len(),
            id_len: id.len(),
            next,
            rec,
        });
        self.ids.push_str(id);
        n
    }

    pub(crate) fn get(&self, b: Bank, id: &str) -> Option<&Record> {
        self.find(b, id).map(|i| &self.slots[i].rec)
    }

    /// The record of (`b`, `id`), inserted as "never seen" when missing.
    pub(crate) fn entry(&mut self, b: Bank, id: &str) -> &mut Record {
        let i = match self.find(b, id) {
            Some(i) => i,
            None => self.push(b, id, Record::unseen()),
        };
        &mut self.slots[i].rec
    }

    /// Inserts a record; false when (`b`, `id`) was there already.
    pub(crate) fn insert(&mut self, b: Bank, id: &str, r: Record) -> bool {
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
        self.push(b, id, r);
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
        self.index = HashMap::with_capacity_and_hasher(n, Default::default());
        self.slots = Vec::with_capacity(n);
        self.ids = String::with_capacity(old.len());
        self.sorted = true;
        for s in slots {
            let id = old.get(s.id_at..s.id_at + s.id_len).unwrap_or("");
            self.push(s.bank, id, s.rec);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
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
            assert!(v.insert(Bank::Keys, id, rec(n as u64)));
        }
        assert!(!v.insert(Bank::Keys, "m000", rec(9)), "no duplicate");
        v.insert(Bank::Denied, "m005", rec(1000));
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
        v.insert(Bank::Keys, "a", rec(1));
        v.insert(Bank::Denied, "a", rec(2));
        assert_eq!(v.get(Bank::Keys, "a").map(|r| r.cur.stamp), Some(1));
        assert_eq!(v.get(Bank::Denied, "a").map(|r| r.cur.stamp), Some(2));
        let h = hash(Bank::Keys, "a");
        let b = v.push(Bank::Keys, "b", rec(3));
        // Re-link "b" under "a"'s hash, as a collision would.
        v.index.remove(&hash(Bank::Keys, "b"));
        v.slots[b].next = v.index[&h];
        v.index.insert(h, b as u32);
        assert_eq!(v.find(Bank::Keys, "a"), Some(0));
        assert_eq!(v.slots[v.index[&h] as usize].rec.cur.stamp, 3);
    }
}
