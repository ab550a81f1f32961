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
        self.refresh(false)?;
        let entries = roster::read(&format::roster_path(&self.path))?;
        if self.gen.load().index.is_none() {
            let live = roster::live_count(&entries);
            if live > 0 {
                return Err(corrupt(
                    &self.path,
                    None,
                    format!("the index file is missing while the roster lists {live} entries"),
                ));
            }
        }
        Ok(Iter {
            table: self,
            entries,
            pos: 0,
            seen: vec![0u64; (self.params.size as usize).div_ceil(64)],
            buf: Vec::new(),
            index: self.gen.load().index.clone(),
        })
    }
}

/// Iterator over a table's live entries in roster order.
pub struct Iter<'a> {
    table: &'a Table,
    entries: Vec<u32>,
    pos: usize,
    seen: Vec<u64>,
    /// The slot copy of [`Iter::next_into`], reused.
    buf: Vec<u8>,
    /// The index mapped when the walk began, for prefetching slots ahead
    /// (reads go through the table's current view).
    index: Option<Arc<Index>>,
}

/// How many roster entries ahead a walk starts loading slots: the slots of
/// a large bank are spread over its index, one cache miss each.
const PREFETCH_AHEAD: usize = 12;

impl Iter<'_> {
    /// The next roster slot to read: tombstones, slot 0, slots past the
    /// table and slots already yielded are skipped.
    fn next_slot(&mut self) -> Option<u64> {
        if let (Some(ix), Some(&ahead)) = (&self.index, self.entries.get(self.pos + PREFETCH_AHEAD))
        {
            let slot = u64::from(ahead);
            if slot != 0 && slot < self.table.params.size {
                ix.map.prefetch(self.table.params.slot_offset(slot));
            }
        }
        while self.pos < self.entries.len() {
            let s = self.entries[self.pos];
            self.pos += 1;
            let slot = u64::from(s);
            if s == format::ROSTER_TOMBSTONE || slot == 0 || slot >= self.table.params.size {
                continue;
            }
            let (w, b) = ((slot / 64) as usize, slot % 64);
            if self.seen[w] & (1 << b) != 0 {
                continue;
            }
            self.seen[w] |= 1 << b;
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
            match self.table.read_slot_into(slot, &mut self.buf, id, value) {
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
