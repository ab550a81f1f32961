//! The write path: transactions planned in full, then applied (records
//! appended and fsynced, slots pointed at them, status bytes last, roster,
//! msync).

use super::*;

impl Table {
    /// Removes the files of the bank whose index is `index`, as Salt's
    /// `flush(bank)` does (no lock is taken; Salt takes none): the index,
    /// every heap segment, past a missing one too, the roster and the lock
    /// file ([`format::bank_files`]). Files already gone are skipped.
    /// keycache's lost-entries file stays ([`format::lost_path`]).
    pub fn remove_files(index: &Path) -> Result<()> {
        for p in format::bank_files(index) {
            files::remove_if_exists(&p)?;
        }
        Ok(())
    }

    /// Applies `f`'s writes atomically with respect to other writers and
    /// makes them durable with one round of fsyncs at the end. When `f`
    /// fails, or the writes do not fit ([`Error::TableFull`]), nothing is
    /// written.
    pub fn transaction<T>(
        &self,
        f: impl FnOnce(&mut Txn<'_>) -> Result<T>,
    ) -> Result<(T, Applied)> {
        self.with_writer(|ix| {
            let mut tx = Txn::new(self);
            let out = f(&mut tx)?;
            let plan = self.plan(ix, tx)?;
            let applied = self.apply(ix, plan)?;
            Ok((out, applied))
        })
    }

    /// Runs `f` holding the bank's write lock, with the index mapped for
    /// writing (the bank is created if missing). For writes spanning banks:
    /// take the locks in one order (`keys`, then `denied_keys`), plan every
    /// bank's writes, then apply them.
    pub(crate) fn with_writer<T>(&self, f: impl FnOnce(&Index) -> Result<T>) -> Result<T> {
        self.with_lock(true, |w| {
            let ix =
                w.ok_or_else(|| corrupt(&self.path, None, "bank vanished while locked".into()))?;
            f(ix)
        })
    }

    /// Puts one entry, durably.
    pub fn put(&self, id: &[u8], value: &[u8]) -> Result<Applied> {
        self.transaction(|tx| tx.put(id, value)).map(|(_, a)| a)
    }

    /// Removes one entry, durably. Returns whether it existed.
    pub fn remove(&self, id: &[u8]) -> Result<bool> {
        self.check_id(id)?;
        if files::file_id(&self.path).is_none() {
            return Ok(false);
        }
        self.transaction(|tx| tx.remove(id))
            .map(|(_, a)| a.removed > 0)
    }

    /// Finds `id` in the locked index: `Ok(slot)` when present, `Err(slot)`
    /// with the slot a new entry would take (None when full). Slots in
    /// `claimed` are taken by other writes of the same plan; slots in
    /// `freed` are removed by it, and count as DELETED.
    fn find_locked(
        &self,
        ix: &Index,
        id: &[u8],
        claimed: &HashSet<u64>,
        freed: &HashSet<u64>,
    ) -> std::result::Result<u64, Option<u64>> {
        let p = &self.params;
        let home = p.home(id);
        let mut first_free = None;
        let mut buf = vec![0u8; p.slot_used()];
        for step in 0..p.capacity() {
            let slot = p.probe(home, step);
            if claimed.contains(&slot) {
                continue;
            }
            let off = p.slot_offset(slot);
            let status = if freed.contains(&slot) {
                DELETED
            } else {
                ix.map.load_u8(off).unwrap_or(EMPTY)
            };
            match status {
                OCCUPIED => {
                    ix.map.copy_out(off, &mut buf);
                    if format::slot_id_eq(p, &buf, id) {
                        return Ok(slot);
                    }
                }
                DELETED => {
                    if first_free.is_none() {
                        first_free = Some(slot);
                    }
                }
                _ => return Err(Some(first_free.unwrap_or(slot))),
            }
        }
        Err(first_free)
    }

    /// Works out, under the lock and without writing anything, where every
    /// write of `tx` goes. Removals are placed first, so that the batch's
    /// inserts may reuse the slots they free; fails with
    /// [`Error::TableFull`] when the inserts do not fit.
    pub(crate) fn plan(&self, ix: &Index, tx: Txn<'_>) -> Result<Plan> {
        let Txn {
            order, mut staged, ..
        } = tx;
        let mut claimed = HashSet::new();
        let mut freed = HashSet::new();
        let mut writes = Vec::with_capacity(order.len());
        for id in &order {
            if let Some(None) = staged.get(id) {
                if let Ok(slot) = self.find_locked(ix, id, &claimed, &freed) {
                    freed.insert(slot);
                    writes.push(Planned {
                        slot,
                        insert: false,
                        was_deleted: false,
                        value: None,
                        id: id.clone(),
                    });
                }
            }
        }
        for id in order {
            let Some(Some(value)) = staged.remove(&id) else {
                continue;
            };
            match self.find_locked(ix, &id, &claimed, &freed) {
                Ok(slot) => {
                    claimed.insert(slot);
                    writes.push(Planned {
                        slot,
                        insert: false,
                        was_deleted: false,
                        value: Some(value),
                        id,
                    });
                }
                Err(None) => {
                    return Err(Error::TableFull {
                        path: self.path.clone(),
                        capacity: self.params.capacity(),
                    });
                }
                Err(Some(slot)) => {
                    claimed.insert(slot);
                    let was_deleted = freed.contains(&slot)
                        || ix.map.load_u8(self.params.slot_offset(slot)) == Some(DELETED);
                    writes.push(Planned {
                        slot,
                        insert: true,
                        was_deleted,
                        value: Some(value),
                        id,
                    });
                }
            }
        }
        Ok(Plan { writes })
    }

    /// Performs a [`Plan`], durably: the heap records are appended and
    /// fsynced; the header takes the batch's final counters, but for an
    /// occupied count raised while the batch is in flight (below); removals
    /// mark their slots DELETED; new entries get their fields, then (after
    /// an msync of the two pages of each slot that spans two, so that a
    /// power loss never keeps a status byte without the fields it vouches
    /// for); then the removed slots' pages (msync), the roster (fsynced),
    /// the new entries' status, the true occupied count, and the index
    /// (msync).
    ///
    /// A writer killed between its first slot change and its last roster
    /// write leaves the slots, the roster and the header counters out of
    /// step (each entry old or new, but a new entry maybe not listed, the
    /// counters off). Writers (Salt's and keycache's) repair exactly that
    /// on open, from the slots, when the roster's live count differs from
    /// the header's occupied count (`Table::recover_roster`). While the
    /// batch is in flight that count reads `old + inserts + 1`, above every
    /// live count the roster passes through (from `old`, down by the
    /// tombstones, up by the appends): whatever the moment of a kill, the
    /// two differ and the next writer repairs. (This takes the roster to
    /// agree with the header when the batch begins, as the check run when
    /// this handle opened the files, or saw them changed, left them.)
    pub(crate) fn apply(&self, ix: &Index, plan: Plan) -> Result<Applied> {
        const PAGE: usize = 4096;
        let p = &self.params;
        let writes = plan.writes;
        if writes.is_empty() {
            return Ok(Applied::default());
        }
        let mtime = files::now_ns();
        // 1. Append every record and make the heap durable.
        let mut offsets = Vec::with_capacity(writes.len());
        {
            let mut app = Appender::open(self)?;
            for w in &writes {
                offsets.push(match &w.value {
                    Some(v) if !v.is_empty() => app.append(v, &w.id)?,
                    Some(_) => app.empty_offset(),
                    None => 0,
                });
            }
            app.finish()?;
        }
        // 2. The counters the batch leaves, worked out before any slot
        // changes; the header takes them, with the in-flight occupied count.
        let old = read_header(&ix.map);
        let mut done = old;
        let (mut inserts, mut removals) = (0u64, 0u64);
        for w in &writes {
            match &w.value {
                None => {
                    removals += 1;
                    done.occupied = done.occupied.saturating_sub(1);
                    done.deleted = done.deleted.saturating_add(1);
                }
                Some(_) => {
                    done.high_water = done.high_water.max(w.slot);
                    if w.insert {
                        inserts += 1;
                        done.occupied = done.occupied.saturating_add(1);
                        if w.was_deleted {
                            done.deleted = done.deleted.saturating_sub(1);
                        }
                    }
                }
            }
        }
        // A batch that removes or inserts (or raises the high-water mark)
        // marks the header in flight; pure updates leave the slot statuses,
        // the roster and the counters alone.
        let marks_header = removals + inserts > 0 || done != old;
        if marks_header {
            let in_flight = Header {
                occupied: old.occupied.saturating_add(inserts).saturating_add(1),
                ..done
            };
            ix.map
                .copy_in(format::HDR_OCCUPIED, &in_flight.encode_counters());
            stop_point!(self.path);
        }
        let mut applied = Applied::default();
        let mut removed_slots = Vec::new();
        let mut inserted_slots = Vec::new();
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        // New entries whose slot spans two pages (about one in 43 with
        // 96-byte slots): their fields are made durable before their status.
        let mut spanning = Vec::new();
        // 3. Removals (placed first by the plan): status DELETED.
        let (mut rlo, mut rhi) = (usize::MAX, 0usize);
        for w in writes.iter().filter(|w| w.value.is_none()) {
            let off = p.slot_offset(w.slot);
            lo = lo.min(off);
            hi = hi.max(off + p.slot_size);
            rlo = rlo.min(off);
            rhi = rhi.max(off + p.slot_size);
            ix.map.store_u8(off, DELETED);
            removed_slots.push(w.slot as u32);
            applied.removed += 1;
            stop_point!(self.path);
        }
        // 4. Fields of every put; an existing entry's slot is repointed at
        // once (its status stays OCCUPIED), a new entry's status waits.
        let mut new_slots = Vec::new();
        for (w, packed) in writes.iter().zip(&offsets) {
            let Some(v) = &w.value else { continue };
            let off = p.slot_offset(w.slot);
            lo = lo.min(off);
            hi = hi.max(off + p.slot_size);
            let mut body = vec![0u8; p.slot_used() - 1];
            let fields = SlotFields {
                status: OCCUPIED,
                offset: *packed,
                len: v.len() as u32,
                mtime,
            };
            fields.encode_body(p, &w.id, &mut body);
            ix.map.copy_in(off + 1, &body);
            if w.insert {
                if off / PAGE != (off + p.slot_size - 1) / PAGE {
                    spanning.push(off);
                }
                new_slots.push(off);
                inserted_slots.push(w.slot as u32);
                applied.inserted += 1;
            } else {
                applied.updated += 1;
            }
            stop_point!(self.path);
        }
        // Only those two pages each: the other dirty pages of the batch are
        // written once, by the msync at the end.
        for off in spanning {
            ix.map
                .flush_range(off, p.slot_size)
                .map_err(|e| Error::io(&self.path, "msync", e))?;
        }
        // 5. Roster, then the status bytes of new entries, the true
        // occupied count and the index. The roster is durable before a new
        // status byte is stored: the kernel may write a slot's page back
        // before the header's in-flight mark, and a power cut then keeps
        // no status without its roster entry (a roster entry whose slot
        // is not occupied reads as absent, and the next writer drops it).
        // The removed slots' DELETED status is durable before their
        // tombstones are: a power cut between the roster's fsync and the
        // index's msync would otherwise keep an entry that lookups find
        // and the roster no longer lists.
        if rhi > 0 {
            ix.map
                .flush_range(rlo, rhi - rlo)
                .map_err(|e| Error::io(&self.path, "msync", e))?;
        }
        if !removed_slots.is_empty() || !inserted_slots.is_empty() {
            let rpath = format::roster_path(&self.path);
            let rf = match files::open_regular(&rpath, true) {
                Ok(f) => f,
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    files::create_new(&rpath, &self.ownership)?
                }
                Err(e) => return Err(e),
            };
            roster::update(&rpath, &rf, &removed_slots, &inserted_slots)?;
            files::sync_data(&rf, &rpath)?;
        }
        for off in new_slots {
            ix.map.store_u8(off, OCCUPIED);
            stop_point!(self.path);
        }
        if marks_header {
            ix.map
                .copy_in(format::HDR_OCCUPIED, &done.encode_counters());
        }
        ix.map
            .flush_range(0, p.slot_size)
            .map_err(|e| Error::io(&self.path, "msync", e))?;
        ix.map
            .flush_range(lo, hi - lo)
            .map_err(|e| Error::io(&self.path, "msync", e))?;
        Ok(applied)
    }
}

/// Where the writes of a transaction go, worked out by [`Table::plan`]
/// before anything is written.
pub(crate) struct Plan {
    /// Removals first, then puts in the order they were staged.
    writes: Vec<Planned>,
}

struct Planned {
    slot: u64,
    insert: bool,
    was_deleted: bool,
    /// None: remove.
    value: Option<Vec<u8>>,
    id: Vec<u8>,
}

/// Staged writes of a [`Table::transaction`]. Reads see the staged writes.
pub struct Txn<'a> {
    table: &'a Table,
    order: Vec<Vec<u8>>,
    staged: HashMap<Vec<u8>, Option<Vec<u8>>>,
}

impl<'a> Txn<'a> {
    /// The value of `id` as this transaction would leave it.
    pub fn get(&self, id: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.staged.get(id) {
            return Ok(v.clone());
        }
        Ok(self.table.get(id)?.map(|r| r.value))
    }

    /// The table this transaction writes to.
    pub fn table(&self) -> &Table {
        self.table
    }

    /// Stages a put.
    pub fn put(&mut self, id: &[u8], value: &[u8]) -> Result<()> {
        self.table.check_id(id)?;
        if u32::try_from(value.len()).is_err() {
            return Err(Error::ValueTooLarge {
                id: String::from_utf8_lossy(id).into_owned(),
                len: value.len(),
            });
        }
        self.stage(id, Some(value.to_vec()));
        Ok(())
    }

    /// Stages a removal.
    pub fn remove(&mut self, id: &[u8]) -> Result<()> {
        self.table.check_id(id)?;
        self.stage(id, None);
        Ok(())
    }

    pub(crate) fn new(table: &'a Table) -> Txn<'a> {
        Txn {
            table,
            order: Vec::new(),
            staged: HashMap::new(),
        }
    }

    fn stage(&mut self, id: &[u8], v: Option<Vec<u8>>) {
        if self.staged.insert(id.to_vec(), v).is_none() {
            self.order.push(id.to_vec());
        }
    }

    /// Number of ids staged.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// Appends records to the active heap segment, rolling to a new one at the cap.
struct Appender<'a> {
    table: &'a Table,
    seg_no: u16,
    path: PathBuf,
    file: File,
    len: u64,
    pending: Vec<u8>,
    dirty: Vec<(PathBuf, File)>,
    new_segment: bool,
}

impl<'a> Appender<'a> {
    pub(super) fn open(table: &'a Table) -> Result<Appender<'a>> {
        let segs = heap::discover(&table.path);
        let (seg_no, path) = match segs.len() {
            0 => (0u16, heap::segment_path(&table.path, 0)),
            n => ((n - 1) as u16, segs[n - 1].clone()),
        };
        let (file, new_segment) = match files::open_regular(&path, true) {
            Ok(f) => (f, false),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                (files::create_new(&path, &table.ownership)?, true)
            }
            Err(e) => return Err(e),
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io(&path, "stat", e))?
            .len();
        Ok(Appender {
            table,
            seg_no,
            path,
            file,
            len,
            pending: Vec::new(),
            dirty: Vec::new(),
            new_segment,
        })
    }

    fn flush_pending(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            let at = self.len - self.pending.len() as u64;
            self.file
                .write_all_at(&self.pending, at)
                .map_err(|e| Error::io(&self.path, "write", e))?;
            self.pending.clear();
        }
        Ok(())
    }

    /// The packed offset Salt gives a zero-length value.
    fn empty_offset(&self) -> u64 {
        format::pack_offset(self.seg_no, self.len)
    }

    fn append(&mut self, value: &[u8], id: &[u8]) -> Result<u64> {
        let p = &self.table.params;
        let rec = format::record_len(value.len());
        if self.len > 0 && self.len + rec > p.max_segment_bytes {
            self.flush_pending()?;
            let next = self.seg_no.checked_add(1).ok_or_else(|| {
                corrupt(
                    &self.table.path,
                    Some(id),
                    "the heap has 65536 segments; compact the bank".into(),
                )
            })?;
            let path = heap::segment_path(&self.table.path, next);
            let file = files::create_new(&path, &self.table.ownership)?;
            let old_path = std::mem::replace(&mut self.path, path);
            let old_file = std::mem::replace(&mut self.file, file);
            self.dirty.push((old_path, old_file));
            self.seg_no = next;
            self.len = 0;
            self.new_segment = true;
        }
        let at = format::pack_offset(self.seg_no, self.len);
        format::encode_record(value, &mut self.pending);
        self.len += rec;
        if self.pending.len() >= 1 << 20 {
            self.flush_pending()?;
        }
        Ok(at)
    }

    pub(super) fn finish(mut self) -> Result<()> {
        self.flush_pending()?;
        for (path, f) in &self.dirty {
            files::sync_data(f, path)?;
        }
        files::sync_data(&self.file, &self.path)?;
        if self.new_segment {
            files::sync_dir(&self.table.dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer stopped at each point of a batch (as a kill leaves it: the
    /// writes before the point made, none after) that removes as many
    /// entries as it inserts, so that the roster's live count ends where it
    /// began: the next writer to open the bank (or the same handle's next
    /// write, as after a write that failed half-way) repairs it, every entry is
    /// then its old value or its new one, a listing shows exactly the
    /// entries a lookup finds, and verify (under the lock) finds nothing.
    #[test]
    fn a_batch_stopped_anywhere_is_repaired_by_the_next_writer() {
        let opts = OpenOptions {
            params: Params {
                size: 31,
                ..Params::default()
            },
            ..OpenOptions::default()
        };
        let ids: Vec<Vec<u8>> = (0..12).map(|i| format!("id-{i:02}").into_bytes()).collect();
        let fresh = |dir: &Path| {
            let t = Table::open(dir.join(format::KEYS_INDEX), &opts).unwrap();
            t.transaction(|tx| {
                for id in &ids[..8] {
                    tx.put(id, b"old")?;
                }
                Ok(())
            })
            .unwrap();
            t
        };
        // Removes 0..3, inserts 8..11, updates 3.
        let batch = |t: &Table| {
            t.transaction(|tx| {
                for id in &ids[..3] {
                    tx.remove(id)?;
                }
                for id in ids[8..11].iter().chain(&ids[3..4]) {
                    tx.put(id, b"new")?;
                }
                Ok(())
            })
        };
        let whole = tempfile::tempdir().unwrap();
        let t = fresh(whole.path());
        crate::test_util::stop_at(None);
        batch(&t).unwrap();
        let points = crate::test_util::stop_points_passed();
        // The in-flight header, 3 tombstones, 3 + 1 puts, 3 statuses.
        assert_eq!(points, 14, "stop points in the batch");
        let verify_clean = |t: &Table, ctx: &str| {
            let found = crate::verify::verify_locked(t, None).unwrap();
            assert!(found.is_empty(), "{ctx}: verify finds {found:#?}");
        };
        verify_clean(&t, "the batch run whole");

        for at in 0..points {
            let dir = tempfile::tempdir().unwrap();
            let t = fresh(dir.path());
            crate::test_util::stop_at(Some(at));
            assert!(batch(&t).is_err(), "stopped at point {at}");
            crate::test_util::stop_at(None);
            // The next writer: another process (a new handle), or, as after
            // a write that failed half-way, this handle's next write.
            let t = if at % 2 == 0 {
                drop(t);
                Table::open(dir.path().join(format::KEYS_INDEX), &opts).unwrap()
            } else {
                t
            };
            t.with_writer(|_| Ok(())).unwrap();
            let ctx = format!("stopped at point {at} of {points}");
            verify_clean(&t, &ctx);
            let mut found = std::collections::BTreeSet::new();
            for (i, id) in ids.iter().enumerate() {
                let got = t.get(id).unwrap().map(|r| r.value);
                let old: Option<&[u8]> = (i < 8).then_some(b"old");
                let new: Option<&[u8]> = match i {
                    0..=2 | 11 => None,
                    3 | 8..=10 => Some(b"new"),
                    _ => Some(b"old"),
                };
                assert!(
                    got.as_deref() == old || got.as_deref() == new,
                    "{ctx}: {} reads {got:?}",
                    String::from_utf8_lossy(id)
                );
                if got.is_some() {
                    found.insert(id.clone());
                }
            }
            let listed: std::collections::BTreeSet<Vec<u8>> =
                t.iter().unwrap().map(|r| r.unwrap().id).collect();
            assert_eq!(listed, found, "{ctx}: the listing and the lookups");
        }
    }

    /// A bank whose heap has segments 0 to 3, segment 1 lost: every file of
    /// the bank goes, the segments past the gap too; keycache's lost-entries
    /// file and another bank's files stay.
    #[test]
    fn remove_files_goes_past_a_gap_in_the_segments() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(format::KEYS_INDEX);
        let opts = OpenOptions {
            params: Params {
                size: 11,
                max_segment_bytes: 64,
                ..Params::default()
            },
            ..OpenOptions::default()
        };
        let t = Table::open(&index, &opts).unwrap();
        for n in 0..4u8 {
            t.put(&[b'a' + n], &[n; 40]).unwrap();
        }
        drop(t);
        assert!(format::segment_path(&index, 3).exists(), "four segments");
        std::fs::remove_file(format::segment_path(&index, 1)).unwrap();
        let denied = dir.path().join(format::DENIED_INDEX);
        std::fs::write(&denied, b"").unwrap();
        std::fs::write(format::segment_path(&denied, 0), b"").unwrap();
        std::fs::write(format::lost_path(&index), b"").unwrap();

        Table::remove_files(&index).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".mmap_denied.idx",
                ".mmap_denied.idx.heap",
                ".mmap_keys.idx.keycache-lost"
            ]
        );
        // Nothing left to remove: not an error.
        Table::remove_files(&index).unwrap();
    }
}
