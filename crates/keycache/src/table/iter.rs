//! Listing and inspection: roster-order iteration, slot scans, stats.

use super::*;

impl Table {
    /// Copies every slot's status, and the id and fields of every slot that
    /// is not EMPTY, from the current files (for verify and stats).
    pub fn scan(&self) -> Result<Scan> {
        self.refresh(true)?;
        let g = self.gen.load();
        let p = &self.params;
        let mut scan = Scan {
            status: vec![EMPTY; p.size as usize],
            slots: Vec::new(),
            header: Header::default(),
            magic: false,
            exists: g.index.is_some(),
        };
        let Some(ix) = g.index.as_deref() else {
            return Ok(scan);
        };
        scan.header = read_header(&ix.map);
        scan.magic = ix.map.load_u8(0) == Some(HEADER_MAGIC);
        let mut buf = vec![0u8; p.slot_used()];
        for slot in 1..p.size {
            let off = p.slot_offset(slot);
            let st = ix.map.load_u8(off).unwrap_or(EMPTY);
            scan.status[slot as usize] = st;
            if st != EMPTY {
                ix.map.copy_out(off, &mut buf);
                scan.slots.push(ScannedSlot {
                    slot,
                    status: st,
                    id: format::slot_id(p, &buf).to_vec(),
                    fields: SlotFields::decode(p, &buf),
                });
            }
        }
        Ok(scan)
    }

    /// The ids of the live entries, as Salt lists them (roster entries that
    /// name an occupied slot, each slot once), read from the slots alone:
    /// an entry whose record is damaged is still counted.
    pub(crate) fn live_ids(&self) -> Result<Vec<Vec<u8>>> {
        self.refresh(true)?;
        let g = self.gen.load();
        let Some(ix) = g.index.as_deref() else {
            return Ok(Vec::new());
        };
        let p = &self.params;
        let mut slots: Vec<u32> = self
            .roster()?
            .into_iter()
            .filter(|&s| s != 0 && u64::from(s) < p.size)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        let mut buf = vec![0u8; p.slot_used()];
        let mut ids = Vec::with_capacity(slots.len());
        for s in slots {
            let off = p.slot_offset(u64::from(s));
            if ix.map.load_u8(off) == Some(OCCUPIED) && ix.map.copy_out(off, &mut buf) {
                ids.push(format::slot_id(p, &buf).to_vec());
            }
        }
        Ok(ids)
    }

    /// The roster's entries as stored, tombstones included.
    pub fn roster(&self) -> Result<Vec<u32>> {
        roster::read(&format::roster_path(&self.path))
    }

    /// Reads the entry in data slot `slot` (checksum verified), if it is occupied.
    pub fn entry_at(&self, slot: u64) -> Result<Option<Record>> {
        self.read_slot(slot)
    }

    /// The live entries in roster order, as Salt lists them: tombstones,
    /// slot 0, slots past the table and slots not OCCUPIED are skipped, and a
    /// slot listed twice is yielded once. An entry that cannot be read back
    /// intact is yielded as an error, and iteration goes on.
    ///
    /// A missing index file whose roster still lists entries is an error:
    /// the bank is not empty, its ids are lost.
    pub fn iter(&self) -> Result<Iter<'_>> {
        self.iter_reusing(IterScratch::default())
    }

    /// [`Table::iter`] working in `scratch`, the memory of an earlier walk
    /// ([`Iter::into_scratch`]): a caller that walks a bank again and again
    /// allocates nothing once its scratch has grown to the bank. The walk
    /// yields what [`Table::iter`] yields, whatever `scratch` held before.
    pub fn iter_reusing(&self, mut scratch: IterScratch) -> Result<Iter<'_>> {
        self.refresh(false)?;
        roster::read_raw_into(&format::roster_path(&self.path), &mut scratch.roster)?;
        if self.gen.load().index.is_none() {
            let live = roster::raw_live_count(&scratch.roster);
            if live > 0 {
                return Err(corrupt(
                    &self.path,
                    None,
                    format!("the index file is missing while the roster lists {live} entries"),
                ));
            }
        }
        // Every bit cleared: memory already touched by an earlier walk is
        // rewritten, not allocated afresh.
        scratch.seen.clear();
        scratch
            .seen
            .resize((self.params.size as usize).div_ceil(64), 0);
        Ok(Iter {
            table: self,
            scratch,
            pos: 0,
            end: usize::MAX,
            index: self.gen.load().index.clone(),
        })
    }
}

/// The memory a walk works in: its copy of the roster, the bitmap of the
/// slots it has yielded and its copy of a slot. Taken by
/// [`Table::iter_reusing`] and given back by [`Iter::into_scratch`]; what it
/// holds between walks is overwritten when the next walk starts, so a
/// scratch may go from one table to another.
#[derive(Debug, Default)]
pub struct IterScratch {
    /// The roster file as read (whole entries).
    roster: Vec<u8>,
    /// One bit per slot: set once the slot was yielded.
    seen: Vec<u64>,
    /// The slot copy of [`Iter::next_into`].
    buf: Vec<u8>,
}

/// Iterator over a table's live entries in roster order.
pub struct Iter<'a> {
    table: &'a Table,
    scratch: IterScratch,
    /// The next roster entry to look at.
    pos: usize,
    /// The roster entry the walk stops before ([`Iter::seek`]).
    end: usize,
    /// The index mapped when the walk began, for prefetching slots ahead
    /// (reads go through the table's current view).
    index: Option<Arc<Index>>,
}

/// How many roster entries ahead a walk starts loading slots: the slots of
/// a large bank are spread over its index, one cache miss each.
const PREFETCH_AHEAD: usize = 12;

impl<'a> Iter<'a> {
    /// The walk's memory, for the next walk ([`Table::iter_reusing`]).
    pub fn into_scratch(self) -> IterScratch {
        self.scratch
    }

    /// How many entries the walk's roster has (tombstones included): the
    /// positions [`Iter::seek`] takes.
    pub fn roster_entries(&self) -> usize {
        self.scratch.roster.len() / format::ROSTER_ENTRY_LEN
    }

    /// Goes on from roster entry `start`, up to (not including) `end`: a
    /// walk shared between two threads takes ranges of one roster
    /// ([`Iter::twin`]). A walk that only goes forward still yields a slot
    /// listed twice once; one that goes back may yield it again.
    pub fn seek(&mut self, start: usize, end: usize) {
        self.pos = start;
        self.end = end;
    }

    /// A second walk of the same roster as this one (its copy, not the file
    /// read again), in `scratch`, from its start: so that two threads can
    /// each walk ranges of one listing ([`Iter::seek`]). Each walk skips the
    /// slots it has yielded itself, not those the other has.
    pub fn twin(&self, mut scratch: IterScratch) -> Iter<'a> {
        scratch.roster.clear();
        scratch.roster.extend_from_slice(&self.scratch.roster);
        scratch.seen.clear();
        scratch.seen.resize(self.scratch.seen.len(), 0);
        Iter {
            table: self.table,
            scratch,
            pos: 0,
            end: usize::MAX,
            index: self.index.clone(),
        }
    }

    /// The next roster slot to read: tombstones, slot 0, slots past the
    /// table and slots already yielded are skipped.
    fn next_slot(&mut self) -> Option<u64> {
        let size = self.table.params.size;
        let roster = &self.scratch.roster;
        if let (Some(ix), Some(ahead)) = (
            &self.index,
            roster::raw_entry(roster, self.pos + PREFETCH_AHEAD),
        ) {
            let slot = u64::from(ahead);
            if slot != 0 && slot < size {
                ix.map.prefetch(self.table.params.slot_offset(slot));
            }
        }
        while let Some(s) = roster::raw_entry(roster, self.pos).filter(|_| self.pos < self.end) {
            self.pos += 1;
            let slot = u64::from(s);
            if s == format::ROSTER_TOMBSTONE || slot == 0 || slot >= size {
                continue;
            }
            let (w, b) = ((slot / 64) as usize, slot % 64);
            let seen = &mut self.scratch.seen[w];
            if *seen & (1 << b) != 0 {
                continue;
            }
            *seen |= 1 << b;
            return Some(slot);
        }
        None
    }

    /// The next entry, as [`Iterator::next`] gives it, read into `id` and
    /// `value` (their contents replaced), with its mtime and slot: buffers
    /// reused across calls make a walk of a large bank allocation-free.
    pub fn next_into(
        &mut self,
        id: &mut Vec<u8>,
        value: &mut Vec<u8>,
    ) -> Option<Result<(u64, u64)>> {
        while let Some(slot) = self.next_slot() {
            match self
                .table
                .read_slot_into(slot, &mut self.scratch.buf, id, value)
            {
                Ok(Some(found)) => return Some(Ok(found)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

impl Iterator for Iter<'_> {
    type Item = Result<Record>;

    /// At most the roster entries not yet looked at (tombstones and slots
    /// listed twice are among them, and yield nothing).
    fn size_hint(&self) -> (usize, Option<usize>) {
        let entries = self.roster_entries().min(self.end);
        (0, Some(entries.saturating_sub(self.pos)))
    }

    fn next(&mut self) -> Option<Result<Record>> {
        while let Some(slot) = self.next_slot() {
            match self.table.read_slot(slot) {
                Ok(Some(r)) => return Some(Ok(r)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

/// A copy of a table's slots; see [`Table::scan`].
#[derive(Debug)]
pub struct Scan {
    /// Status byte of every slot (index = slot number; slot 0 unused).
    pub status: Vec<u8>,
    /// Every slot that is not EMPTY.
    pub slots: Vec<ScannedSlot>,
    /// Header: (occupied, deleted, high-water mark).
    pub header: Header,
    /// Whether the header magic is stamped.
    pub magic: bool,
    /// Whether the index file exists.
    pub exists: bool,
}

/// One non-EMPTY slot of a [`Scan`].
#[derive(Debug, Clone)]
pub struct ScannedSlot {
    /// Slot number.
    pub slot: u64,
    /// Status byte.
    pub status: u8,
    /// Stored id, cut at the first NUL.
    pub id: Vec<u8>,
    /// Pointer fields.
    pub fields: SlotFields,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(id, value)` of entries.
    type Entries = Vec<(Vec<u8>, Vec<u8>)>;

    /// Every entry a walk yields, and the walk's scratch.
    fn walk(t: &Table, scratch: IterScratch) -> (Entries, IterScratch) {
        let mut it = t.iter_reusing(scratch).unwrap();
        let (mut id, mut value, mut out) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(r) = it.next_into(&mut id, &mut value) {
            r.unwrap();
            out.push((id.clone(), value.clone()));
        }
        (out, it.into_scratch())
    }

    fn table(dir: &Path, name: &str, size: u64) -> Table {
        let opts = OpenOptions {
            params: Params {
                size,
                ..Params::default()
            },
            ..OpenOptions::default()
        };
        Table::open(dir.join(name), &opts).unwrap()
    }

    fn fresh(t: &Table) -> Entries {
        t.iter()
            .unwrap()
            .map(|r| r.map(|r| (r.id, r.value)).unwrap())
            .collect()
    }

    /// The size hint bounds what the walk still yields: the roster entries
    /// not yet looked at, a removed entry's tombstone among them.
    #[test]
    fn the_size_hint_counts_the_roster_entries_left() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path(), format::KEYS_INDEX, 101);
        for id in ["a", "b", "c"] {
            t.put(id.as_bytes(), b"v").unwrap();
        }
        t.remove(b"b").unwrap();
        let mut it = t.iter().unwrap();
        assert_eq!(it.size_hint(), (0, Some(3)));
        assert_eq!(it.next().unwrap().unwrap().id, b"a");
        assert_eq!(it.size_hint(), (0, Some(2)));
        assert_eq!(it.next().unwrap().unwrap().id, b"c");
        assert_eq!(it.size_hint(), (0, Some(0)));
        assert!(it.next().is_none());
    }

    /// A scratch reused after writes, after a walk left half done and on
    /// another table of another size yields what a fresh walk yields.
    #[test]
    fn a_reused_scratch_walks_as_a_fresh_one() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path(), format::KEYS_INDEX, 101);
        for id in ["a", "b", "c", "d"] {
            t.put(id.as_bytes(), format!("v-{id}").as_bytes()).unwrap();
        }
        let (first, scratch) = walk(&t, IterScratch::default());
        assert_eq!(first, fresh(&t));
        assert_eq!(first.len(), 4);

        // Writes between two walks: a removal, a new value, a new entry.
        t.remove(b"b").unwrap();
        t.put(b"c", b"v-c2 longer").unwrap();
        t.put(b"e", b"v-e").unwrap();
        let (second, scratch) = walk(&t, scratch);
        assert_eq!(second, fresh(&t));
        let ids: Vec<&[u8]> = second.iter().map(|(i, _)| i.as_slice()).collect();
        assert_eq!(ids, [&b"a"[..], b"c", b"d", b"e"]);
        assert!(second.contains(&(b"c".to_vec(), b"v-c2 longer".to_vec())));

        // A walk stopped after two entries leaves bits set in its scratch:
        // the next walk still yields every entry.
        let mut it = t.iter_reusing(scratch).unwrap();
        let (mut id, mut value) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            it.next_into(&mut id, &mut value).unwrap().unwrap();
        }
        let (third, mut scratch) = walk(&t, it.into_scratch());
        assert_eq!(third, second);

        // Other tables, smaller and larger than the scratch's last one.
        for (name, size) in [(format::DENIED_INDEX, 11), (".other.idx", 4099)] {
            let other = table(dir.path(), name, size);
            other.put(b"x", b"v-x").unwrap();
            let got;
            (got, scratch) = walk(&other, scratch);
            assert_eq!(got, vec![(b"x".to_vec(), b"v-x".to_vec())]);
        }
        let (back, _) = walk(&t, scratch);
        assert_eq!(back, second);
    }

    /// Every entry `it` yields from roster entry `start` up to `end`.
    fn range(it: &mut Iter<'_>, start: usize, end: usize) -> Vec<Vec<u8>> {
        it.seek(start, end);
        let (mut id, mut value, mut out) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(r) = it.next_into(&mut id, &mut value) {
            r.unwrap();
            out.push(id.clone());
        }
        out
    }

    /// A walk and its twin share one roster copy and walk any ranges of it
    /// (a listing on two threads): each range yields its entries in roster
    /// order, and each walk skips only the slots it yielded itself, so a
    /// slot listed twice comes again from the other walk (the listing
    /// drops it there) but not from the same one.
    #[test]
    fn twins_walk_ranges_of_one_roster() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path(), format::KEYS_INDEX, 101);
        for id in ["a", "b", "c", "d", "e"] {
            t.put(id.as_bytes(), b"v").unwrap();
        }
        // The slot of "b" listed again at the end (a torn roster can).
        let roster_path = format::roster_path(&t.path);
        let mut raw = std::fs::read(&roster_path).unwrap();
        let b_slot = raw[4..8].to_vec();
        raw.extend_from_slice(&b_slot);
        std::fs::write(&roster_path, &raw).unwrap();
        let ids = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(walk(&t, IterScratch::default()).0.len(), 5, "b once");

        let mut it = t.iter().unwrap();
        assert_eq!(it.roster_entries(), 6);
        let mut twin = it.twin(IterScratch::default());
        // Entries appended after the walk began are not the twin's.
        t.put(b"f", b"v").unwrap();
        assert_eq!(twin.roster_entries(), 6);
        assert_eq!(range(&mut twin, 2, 4), ids(&["c", "d"]));
        assert_eq!(
            twin.size_hint(),
            (0, Some(0)),
            "the range's end bounds the hint"
        );
        assert_eq!(range(&mut it, 0, 2), ids(&["a", "b"]));
        // "b" again at the end: yielded by the twin (it never yielded it),
        // not by `it` (it did).
        assert_eq!(range(&mut twin, 4, 6), ids(&["e", "b"]));
        assert_eq!(range(&mut it, 4, usize::MAX), ids(&["e"]));
    }
}
