//! The read path: lookups (one, many, into a caller's buffer, through a
//! reader's own view), each checked against its xxh3 and re-read under a
//! bounded retry policy while a writer is busy on the entry.

use super::*;

/// How many times a reader re-reads an entry that fails its checks, yielding
/// in between (half-way it forces a refresh of its view of the files),
/// before it starts waiting for a writer to finish (see [`DEFAULT_READ_RETRY`]).
const READ_ATTEMPTS: u32 = 64;

/// How long, in all, a lookup keeps re-reading an entry that still fails its
/// checksum after the quick rounds, before reporting it corrupt, unless set
/// otherwise ([`OpenOptions::read_retry`]).
///
/// Salt's writer rewrites a record in place and fsyncs the heap *before* it
/// stores the record's new length in the slot: for the length of that fsync
/// (milliseconds, more on a slow disk) the entry fails its checksum. A
/// reader that meets it waits, sleeping 50 µs to 1.6 ms between re-reads;
/// it never takes a lock. After a lookup has given up on an entry, other
/// reads of the same handle report corruption after the quick rounds only,
/// for ten seconds, so that a damaged store is listed or verified at full
/// speed. A zero-length value is re-read the same way before it is returned
/// (see `Attempt::Empty`): a genuinely empty value costs this wait, once per
/// handle every ten seconds.
pub const DEFAULT_READ_RETRY: Duration = Duration::from_secs(1);

/// How long after a lookup gave up other reads skip the wait.
const GAVE_UP_COOLDOWN_NS: u64 = 10_000_000_000;

/// The retry policy of one read: quick rounds, then a bounded wait.
struct Retry<'t> {
    table: &'t Table,
    attempt: u32,
    deadline: Option<std::time::Instant>,
}

impl<'t> Retry<'t> {
    pub(super) fn new(table: &'t Table) -> Self {
        Retry {
            table,
            attempt: 0,
            deadline: None,
        }
    }

    /// Called after a failed attempt: `Ok(true)` to read again, `Ok(false)`
    /// to give up and report the entry corrupt.
    fn again(&mut self, refresh: bool) -> Result<bool> {
        self.attempt += 1;
        if self.attempt < READ_ATTEMPTS {
            if refresh || self.attempt == READ_ATTEMPTS / 2 {
                self.table.refresh(true)?;
            } else {
                std::thread::yield_now();
            }
            return Ok(true);
        }
        let now = std::time::Instant::now();
        let deadline = *self.deadline.get_or_insert_with(|| {
            let last = self.table.gave_up_at.load(Ordering::Relaxed);
            let recent = last != 0
                && crate::clock::coarse_now_ns().saturating_sub(last) < GAVE_UP_COOLDOWN_NS;
            now + if recent {
                Duration::ZERO
            } else {
                self.table.read_retry
            }
        });
        if now >= deadline {
            self.table
                .gave_up_at
                .store(crate::clock::coarse_now_ns().max(1), Ordering::Relaxed);
            return Ok(false);
        }
        let shift = (self.attempt - READ_ATTEMPTS).min(5);
        std::thread::sleep(Duration::from_micros(50 << shift).min(deadline - now));
        self.table.refresh(true)?;
        Ok(true)
    }
}

/// Where a lookup gets the current view from.
trait Views {
    type Gen<'a>: std::ops::Deref<Target = Arc<Generation>>
    where
        Self: 'a;
    fn current<'a>(&'a mut self, t: &Table) -> Result<Self::Gen<'a>>;
}

/// The table's shared view: one `ArcSwap` load (two atomic
/// read-modify-writes, each a full barrier on x86) per lookup.
struct SharedView;

impl Views for SharedView {
    type Gen<'a> = arc_swap::Guard<Arc<Generation>>;
    fn current<'a>(&'a mut self, t: &Table) -> Result<Self::Gen<'a>> {
        t.current()
    }
}

impl Views for View {
    type Gen<'a> = &'a Arc<Generation>;
    #[inline]
    fn current<'a>(&'a mut self, t: &Table) -> Result<&'a Arc<Generation>> {
        t.check_due()?;
        let no = t.gen_no.load(Ordering::Acquire);
        if no != self.no {
            self.gen = t.gen.load_full();
            self.no = no;
        }
        if self.gen.retired() {
            t.refresh_retired()?;
            let no = t.gen_no.load(Ordering::Acquire);
            if no != self.no {
                self.gen = t.gen.load_full();
                self.no = no;
            }
        }
        Ok(&self.gen)
    }
}

/// Starts loading the heap record that slot fields `f` point at.
#[inline]
fn prefetch_record(g: &Generation, f: &SlotFields) {
    let (seg, off) = format::unpack_offset(f.offset);
    if let Some(s) = g.segments.get(usize::from(seg)) {
        s.prefetch_record(off, f.len);
    }
}

/// Outcome of one attempt at reading a slot's entry.
enum Attempt {
    Found(Found),
    /// A zero-length value. Nothing vouches for it: a writer that stores a
    /// slot's length one byte at a time (Salt's `struct.pack_into`, and
    /// this crate's relaxed byte stores) passes through zero when a length
    /// under 256 becomes a multiple of 256, and a record of zero bytes has
    /// no checksum to fail. Read again, like a checksum failure; taken as
    /// found only when it stays so for the whole retry policy.
    Empty(Found),
    Absent,
    /// The entry changed while it was read, or a file it needs is not (yet)
    /// mapped: try again, refreshing the view when `refresh`.
    Retry {
        refresh: bool,
        why: String,
    },
}

impl Table {
    /// [`Table::get_into`] of an id known to be non-empty and free of NUL,
    /// through the reader's own view (brought up to date first).
    pub(crate) fn get_valid_in_view(
        &self,
        view: &mut View,
        id: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<Option<Found>> {
        self.check_len(id)?;
        self.get_checked_by(view, id, buf)
    }

    /// Reads the entry for `id`, or `None` when there is none.
    pub fn get(&self, id: &[u8]) -> Result<Option<Stored>> {
        self.check_id(id)?;
        self.owned(id)
    }

    /// Reads the value of `id` into `buf`, appended after what it holds, and
    /// says where it went; `None` (and `buf` as it was) when there is no
    /// entry. A buffer reused across lookups makes them allocation-free.
    pub fn get_into(&self, id: &[u8], buf: &mut Vec<u8>) -> Result<Option<Found>> {
        self.check_id(id)?;
        self.get_checked(id, buf)
    }

    /// [`Table::get`] of an id that is known to be non-empty and free of
    /// NUL (a [`crate::MinionId`]'s bytes): only its length is checked.
    pub(crate) fn get_valid(&self, id: &[u8]) -> Result<Option<Stored>> {
        self.check_len(id)?;
        self.owned(id)
    }

    /// [`Table::get_into`] of an id known to be non-empty and free of NUL.
    pub(crate) fn get_valid_into(&self, id: &[u8], buf: &mut Vec<u8>) -> Result<Option<Found>> {
        self.check_len(id)?;
        self.get_checked(id, buf)
    }

    /// The lookup of an id already checked, into a vector of its own which
    /// becomes the entry's value (allocated once, at the value's size).
    #[inline]
    pub(super) fn owned(&self, id: &[u8]) -> Result<Option<Stored>> {
        let mut value = Vec::new();
        Ok(self.get_checked(id, &mut value)?.map(|f| Stored {
            value,
            mtime: f.mtime,
            slot: f.slot,
        }))
    }

    /// The lookup of an id already checked, with the readers' retry policy.
    fn get_checked(&self, id: &[u8], buf: &mut Vec<u8>) -> Result<Option<Found>> {
        self.get_checked_by(&mut SharedView, id, buf)
    }

    /// [`Table::get_checked`] through the views that `views` hands out.
    fn get_checked_by<V: Views>(
        &self,
        views: &mut V,
        id: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<Option<Found>> {
        let mut retry = Retry::new(self);
        loop {
            let g = views.current(self)?;
            match self.lookup_once(&g, id, buf)? {
                Attempt::Found(f) => return Ok(Some(f)),
                Attempt::Empty(f) => {
                    if !retry.again(false)? {
                        return Ok(Some(f));
                    }
                }
                Attempt::Absent => return Ok(None),
                Attempt::Retry { refresh, why } => {
                    if !retry.again(refresh)? {
                        return Err(corrupt(&self.path, Some(id), why));
                    }
                }
            }
        }
    }

    /// Looks up many ids at once, overlapping their memory accesses: the
    /// home slots of a group are prefetched before any is probed, and the
    /// heap records of the group before any is read. Same results as
    /// [`Table::get`] on each id, in order.
    pub fn get_many<I: AsRef<[u8]>>(&self, ids: &[I]) -> Result<Vec<Option<Stored>>> {
        let mut out = Vec::with_capacity(ids.len());
        self.many(ids, Table::check_id, &mut Vec::new(), |f, buf| {
            out.push(f.map(|f| Stored {
                value: std::mem::take(buf),
                mtime: f.mtime,
                slot: f.slot,
            }))
        })?;
        Ok(out)
    }

    /// [`Table::get_many`] into one buffer: the values are appended to `buf`
    /// one after another, and where each went (or `None`) to `found`, in
    /// the order of `ids`. Buffers reused across batches make them
    /// allocation-free.
    pub fn get_many_into<I: AsRef<[u8]>>(
        &self,
        ids: &[I],
        buf: &mut Vec<u8>,
        found: &mut Vec<Option<Found>>,
    ) -> Result<()> {
        found.reserve(ids.len());
        self.many(ids, Table::check_id, buf, |f, _| found.push(f))
    }

    /// [`Table::get_many`] of ids known to be non-empty and free of NUL;
    /// `emit` gets each id's outcome, in order, with the buffer its value
    /// was appended to.
    pub(crate) fn get_many_valid<I: AsRef<[u8]>>(
        &self,
        ids: &[I],
        buf: &mut Vec<u8>,
        emit: impl FnMut(Option<Found>, &mut Vec<u8>),
    ) -> Result<()> {
        self.many(ids, Table::check_len, buf, emit)
    }

    /// The batched lookup under the `get_many` family: ids in groups, each
    /// group's slots prefetched, then probed (prefetching the records), then
    /// read. Each value is appended to `buf` and handed to `emit` before
    /// the next is read.
    fn many<I: AsRef<[u8]>>(
        &self,
        ids: &[I],
        check: impl Fn(&Table, &[u8]) -> Result<()>,
        buf: &mut Vec<u8>,
        mut emit: impl FnMut(Option<Found>, &mut Vec<u8>),
    ) -> Result<()> {
        const GROUP: usize = 16;
        let p = &self.params;
        let g = self.current()?;
        let Some(ix) = g.index.as_deref() else {
            for id in ids {
                check(self, id.as_ref())?;
                emit(None, buf);
            }
            return Ok(());
        };
        let used = p.slot_used();
        let mut slots = vec![0u8; GROUP * used];
        for group in ids.chunks(GROUP) {
            let mut homes = [0u64; GROUP];
            for (i, id) in group.iter().enumerate() {
                check(self, id.as_ref())?;
                homes[i] = p.home(id.as_ref());
                let off = p.slot_offset(homes[i]);
                ix.map.prefetch(off);
                ix.map.prefetch(off + used - 1);
            }
            // Probe every id; remember where its slot is, and start loading
            // its record.
            let mut found = [(0u64, SlotFields::default()); GROUP];
            for (i, id) in group.iter().enumerate() {
                let id = id.as_ref();
                let copy = &mut slots[i * used..(i + 1) * used];
                for step in 0..p.capacity() {
                    let slot = p.probe(homes[i], step);
                    let off = p.slot_offset(slot);
                    match ix.map.load_u8(off) {
                        Some(EMPTY) | None => break,
                        Some(DELETED) => continue,
                        _ => {}
                    }
                    ix.map.copy_out(off, copy);
                    if format::slot_id_eq(p, copy, id) {
                        let f = SlotFields::decode(p, copy);
                        prefetch_record(&g, &f);
                        found[i] = (slot, f);
                        break;
                    }
                }
            }
            for (i, id) in group.iter().enumerate() {
                let (slot, f) = found[i];
                let got = if slot == 0 {
                    None
                } else {
                    let copy = &slots[i * used..(i + 1) * used];
                    match self.read_value_at(&g, ix, slot, &f, copy, buf)? {
                        Attempt::Found(f) => Some(f),
                        // Changed under us: take the careful path.
                        _ => self.get_checked(id.as_ref(), buf)?,
                    }
                };
                emit(got, buf);
            }
        }
        Ok(())
    }

    /// Whether `id` has an entry. Reads (and checks) its value, like Salt.
    pub fn contains(&self, id: &[u8]) -> Result<bool> {
        Ok(self.get(id)?.is_some())
    }

    fn lookup_once(&self, g: &Generation, id: &[u8], out: &mut Vec<u8>) -> Result<Attempt> {
        let Some(ix) = g.index.as_deref() else {
            return Ok(Attempt::Absent);
        };
        let p = &self.params;
        let home = p.home(id);
        let mut stack = [0u8; 256];
        let mut heap_buf;
        let buf: &mut [u8] = if p.slot_used() <= stack.len() {
            &mut stack[..p.slot_used()]
        } else {
            heap_buf = vec![0u8; p.slot_used()];
            &mut heap_buf
        };
        // A slot spans two cache lines: start both misses at once.
        let home_off = p.slot_offset(home);
        ix.map.prefetch(home_off + p.slot_used() - 1);
        for step in 0..p.capacity() {
            let slot = p.probe(home, step);
            let off = p.slot_offset(slot);
            let status = ix.map.load_u8(off).ok_or_else(|| {
                corrupt(
                    &self.path,
                    Some(id),
                    format!("slot {slot} lies outside the index"),
                )
            })?;
            match status {
                EMPTY => return Ok(Attempt::Absent),
                DELETED => continue,
                _ => {}
            }
            ix.map.copy_out(off, buf);
            if !format::slot_id_eq(p, buf, id) {
                continue;
            }
            let f = SlotFields::decode(p, buf);
            prefetch_record(g, &f);
            return self.read_value_at(g, ix, slot, &f, buf, out);
        }
        Ok(Attempt::Absent)
    }

    /// Reads the record of the slot whose copy is `buf` (decoded: `f`) and
    /// appends its value to `out`, then validates that the slot did not
    /// change meanwhile. `out` is left as it was unless the entry is found.
    fn read_value_at(
        &self,
        g: &Generation,
        ix: &Index,
        slot: u64,
        f: &SlotFields,
        buf: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Attempt> {
        if g.torn {
            return Ok(Attempt::Retry {
                refresh: true,
                why: "a rebuild is replacing the bank's files (its index is marked retired and \
                      its new heap segments may be in place): the rebuild's journal is \
                      unfinished; any keycache write to the store finishes it"
                    .into(),
            });
        }
        let p = &self.params;
        let (seg_no, off) = format::unpack_offset(f.offset);
        let start = out.len();
        if f.len != 0 {
            let Some(seg) = g.segments.get(usize::from(seg_no)) else {
                return Ok(Attempt::Retry {
                    refresh: true,
                    why: format!(
                        "slot {slot} points into heap segment {seg_no}, which does not exist"
                    ),
                });
            };
            match seg.read_into(off, f.len, out)? {
                RecordRead::Value => {}
                RecordRead::Mismatch => {
                    return Ok(Attempt::Retry {
                        refresh: false,
                        why: format!(
                            "{}: record at offset {off} ({} bytes) fails its xxh3 checksum",
                            seg.path.display(),
                            f.len
                        ),
                    })
                }
                RecordRead::Remap => {
                    return Ok(Attempt::Retry {
                        refresh: true,
                        why: format!("{}: record at offset {off} not mapped", seg.path.display()),
                    })
                }
                RecordRead::PastEnd { file_len } => {
                    return Ok(Attempt::Retry {
                        refresh: true,
                        why: format!(
                            "{}: record at offset {off} ({} bytes) runs past the end of the segment ({file_len} bytes)",
                            seg.path.display(),
                            f.len
                        ),
                    })
                }
            }
        }
        std::sync::atomic::fence(Ordering::Acquire);
        let mut again = [0u8; 256];
        let mut again_vec;
        let again: &mut [u8] = if buf.len() <= again.len() {
            &mut again[..buf.len()]
        } else {
            again_vec = vec![0u8; buf.len()];
            &mut again_vec
        };
        ix.map.copy_out(p.slot_offset(slot), again);
        if again != buf {
            out.truncate(start);
            return Ok(Attempt::Retry {
                refresh: false,
                why: format!("slot {slot} kept changing while it was read"),
            });
        }
        if buf[0] != OCCUPIED {
            // Salt compares ids in slots of any status but EMPTY/DELETED;
            // only OCCUPIED entries are live.
            out.truncate(start);
            return Ok(Attempt::Absent);
        }
        let found = Found {
            start,
            len: f.len as usize,
            mtime: f.mtime,
            slot,
        };
        Ok(if f.len == 0 {
            Attempt::Empty(found)
        } else {
            Attempt::Found(found)
        })
    }

    /// Reads the entry in data slot `slot`, if it is occupied.
    pub(crate) fn read_slot(&self, slot: u64) -> Result<Option<Record>> {
        let (mut buf, mut id, mut value) = (Vec::new(), Vec::new(), Vec::new());
        Ok(self
            .read_slot_into(slot, &mut buf, &mut id, &mut value)?
            .map(|(mtime, slot)| Record {
                id,
                value,
                mtime,
                slot,
            }))
    }

    /// `Table::read_slot` into buffers the caller reuses: `id` and
    /// `value` are replaced by the entry's; returns its mtime and slot.
    pub fn read_slot_into(
        &self,
        slot: u64,
        buf: &mut Vec<u8>,
        id: &mut Vec<u8>,
        value: &mut Vec<u8>,
    ) -> Result<Option<(u64, u64)>> {
        let p = &self.params;
        if slot == 0 || slot >= p.size {
            return Ok(None);
        }
        buf.resize(p.slot_used(), 0);
        let mut retry = Retry::new(self);
        loop {
            let g = self.gen.load();
            let Some(ix) = g.index.as_deref() else {
                return Ok(None);
            };
            let off = p.slot_offset(slot);
            match ix.map.load_u8(off) {
                Some(OCCUPIED) => {}
                _ => return Ok(None),
            }
            ix.map.copy_out(off, buf);
            id.clear();
            id.extend_from_slice(format::slot_id(p, buf));
            value.clear();
            match self.read_value_at(&g, ix, slot, &SlotFields::decode(p, buf), buf, value)? {
                Attempt::Found(f) => return Ok(Some((f.mtime, slot))),
                Attempt::Empty(f) => {
                    if !retry.again(false)? {
                        return Ok(Some((f.mtime, slot)));
                    }
                }
                Attempt::Absent => return Ok(None),
                Attempt::Retry { refresh, why } => {
                    if !retry.again(refresh)? {
                        return Err(corrupt(&self.path, Some(id), why));
                    }
                }
            }
        }
    }
}
