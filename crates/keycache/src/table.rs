//! The generic table: one bank (index, heap segments, roster, lock file) of
//! Salt's `MmapCache`, with lock-free readers and a crash-safe writer.
//!
//! Nothing here knows about minion keys: ids and values are bytes. The key
//! banks are built on top of it in [`crate::store`].
//!
//! # Readers
//!
//! A reader loads the current [`Generation`] (the mapped index and heap
//! segments) from an `ArcSwap`, which takes no lock, and probes the index
//! through atomic loads. It copies the slot, reads the record, re-copies the
//! slot and checks the value's xxh3: a mismatch means a writer was busy on
//! that entry (or the data is damaged), so it retries a bounded number of
//! times, then reports the entry as corrupt. Every [`OpenOptions::refresh`]
//! (250 ms by default, as Salt's own readers) a reader stats the index file
//! and, when it was replaced (a rebuild renamed new files into place), maps
//! the new files. In-place changes and heap growth need no refresh: the
//! mappings are shared and reserve address space for growth.
//!
//! # Writers
//!
//! A write holds a mutex (against this process's other writers) and `flock`
//! on the bank's `.lock` file (against other processes, Salt's included).
//! It appends records to the heap and fsyncs them, then points slots at them
//! (status byte last, with release ordering), updates the header, tombstones
//! and appends roster entries and fsyncs the roster, and finally msyncs the
//! index. A live record is never rewritten in place.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::files::{self, Ownership};
use crate::format::{self, Header, Params, SlotFields, DELETED, EMPTY, HEADER_MAGIC, OCCUPIED};
use crate::heap::{self, Read, Segment};
use crate::map::{self, Mapping};
use crate::roster;

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
    fn new(table: &'t Table) -> Self {
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
            let recent =
                last != 0 && map::coarse_now_ns().saturating_sub(last) < GAVE_UP_COOLDOWN_NS;
            now + if recent {
                Duration::ZERO
            } else {
                self.table.read_retry
            }
        });
        if now >= deadline {
            self.table
                .gave_up_at
                .store(map::coarse_now_ns().max(1), Ordering::Relaxed);
            return Ok(false);
        }
        let shift = (self.attempt - READ_ATTEMPTS).min(5);
        std::thread::sleep(Duration::from_micros(50 << shift).min(deadline - now));
        self.table.refresh(true)?;
        Ok(true)
    }
}

/// Options of [`Table::open`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Layout parameters; they must match the files.
    pub params: Params,
    /// How often readers check whether the files were replaced.
    pub refresh: Duration,
    /// Owner and mode of files this handle creates.
    pub ownership: Option<Ownership>,
    /// How long, in all, a lookup keeps re-reading an entry that fails its
    /// checksum before reporting it corrupt (see [`DEFAULT_READ_RETRY`]);
    /// zero keeps only the quick rounds (damaged stores, fuzzing).
    pub read_retry: Duration,
    /// How long a rebuild keeps its banks locked after renaming new files
    /// into place while other processes map the old ones (see
    /// [`crate::rebuild::DEFAULT_SETTLE`]); zero where no Salt writer shares
    /// the store.
    pub rebuild_settle: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            params: Params::default(),
            refresh: Duration::from_millis(250),
            ownership: None,
            read_retry: DEFAULT_READ_RETRY,
            rebuild_settle: crate::rebuild::DEFAULT_SETTLE,
        }
    }
}

/// The value of an id, as a lookup returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value, checksum verified.
    pub value: Vec<u8>,
    /// Unix nanoseconds of the last write.
    pub mtime: u64,
    /// The data slot that holds it.
    pub slot: u64,
}

/// Where [`Table::get_into`] put a value: `buf[start..start + len]` of the
/// caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Offset of the value in the buffer.
    pub start: usize,
    /// Length of the value.
    pub len: usize,
    /// Unix nanoseconds of the last write.
    pub mtime: u64,
    /// The data slot that holds it.
    pub slot: u64,
}

impl Found {
    /// The value, in the buffer it was read into.
    ///
    /// # Panics
    ///
    /// When `buf` is shorter than that buffer was (another buffer, or the
    /// same one truncated since).
    pub fn value<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.start..self.start + self.len]
    }
}

/// One live entry of a table, with its id, as iteration returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The id as stored.
    pub id: Vec<u8>,
    /// The value, checksum verified.
    pub value: Vec<u8>,
    /// Unix nanoseconds of the last write.
    pub mtime: u64,
    /// The data slot that holds it.
    pub slot: u64,
}

/// The mapped index file.
#[derive(Debug)]
pub(crate) struct Index {
    pub(crate) map: Mapping,
    pub(crate) dev_ino: (u64, u64),
}

/// A consistent view of the bank's files: the index and the heap segments
/// that were in place when it was loaded. Files replaced later stay mapped
/// (and readable) through this view until readers move on.
#[derive(Debug)]
pub(crate) struct Generation {
    pub(crate) index: Option<Arc<Index>>,
    pub(crate) segments: Vec<Arc<Segment>>,
}

/// A reader's own handle on a table's current [`Generation`]. Holding it
/// costs a lookup no atomic read-modify-write: the view is checked against
/// the table's generation number (a plain load) and reloaded only when that
/// changed. The files of the view it holds stay mapped until it moves on.
#[derive(Debug, Clone)]
pub(crate) struct View {
    no: u64,
    gen: Arc<Generation>,
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
struct Shared;

impl Views for Shared {
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
        Ok(&self.gen)
    }
}

/// A bank: index file plus companions.
#[derive(Debug)]
pub struct Table {
    path: PathBuf,
    dir: PathBuf,
    params: Params,
    refresh_ns: u64,
    ownership: Ownership,
    gen: ArcSwap<Generation>,
    /// Bumped after every store into `gen`: a [`View`] compares it with the
    /// number it last saw instead of loading `gen` on every lookup.
    gen_no: AtomicU64,
    next_check: AtomicU64,
    /// When a read last gave up on an entry (coarse clock, ns; 0: never).
    gave_up_at: AtomicU64,
    read_retry: Duration,
    rebuild_settle: Duration,
    writer: Mutex<WriterState>,
}

/// What a write changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// New ids.
    pub inserted: u64,
    /// Existing ids given a new value.
    pub updated: u64,
    /// Ids removed.
    pub removed: u64,
}

/// Header counters and sizes of a table.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TableStats {
    /// Data slots.
    pub capacity: u64,
    /// Header: occupied slots.
    pub occupied: u64,
    /// Header: deleted slots (tombstones still on probe chains).
    pub deleted: u64,
    /// Header: highest data slot ever written.
    pub high_water: u64,
    /// `(occupied + deleted) / capacity`, what probing pays for.
    pub load_factor: f64,
    /// Bytes of heap records that live entries point at.
    pub heap_live_bytes: u64,
    /// Bytes of all heap segments.
    pub heap_total_bytes: u64,
    /// Number of heap segments.
    pub segments: u64,
}

/// The writer's lock file and mapping, reused while the index is not
/// replaced nor written by another process.
#[derive(Debug, Default)]
struct WriterState {
    lock: Option<File>,
    index: Option<Index>,
    /// The index's (dev, ino, mtime, mtime_nsec) after this process's last write.
    seen: Option<(u64, u64, i64, i64)>,
}

/// (dev, ino, mtime) of the index: changes when anyone writes or replaces it.
fn index_stamp(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
}

fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// Starts loading the heap record that slot fields `f` point at.
#[inline]
fn prefetch_record(g: &Generation, f: &SlotFields) {
    let (seg, off) = format::unpack_offset(f.offset);
    if let Some(s) = g.segments.get(usize::from(seg)) {
        s.prefetch_record(off, f.len);
    }
}

fn corrupt(path: &Path, id: Option<&[u8]>, why: String) -> Error {
    Error::Corrupt {
        path: path.into(),
        id: id.map(|i| String::from_utf8_lossy(i).into_owned()),
        why,
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
    /// Opens the bank whose index file is `path`. Nothing is created until
    /// the first write; a bank without files reads as empty.
    pub fn open(path: impl Into<PathBuf>, opts: &OpenOptions) -> Result<Table> {
        let path: PathBuf = path.into();
        opts.params.validate()?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let ownership = match opts.ownership {
            Some(o) => o,
            None => Ownership::for_dir(&dir)?,
        };
        let gen = load_generation(&path, &opts.params, None)?;
        Ok(Table {
            path,
            dir,
            params: opts.params,
            refresh_ns: opts.refresh.as_nanos().min(u128::from(u64::MAX)) as u64,
            ownership,
            gen: ArcSwap::from_pointee(gen),
            gen_no: AtomicU64::new(0),
            next_check: AtomicU64::new(
                map::coarse_now_ns().saturating_add(opts.refresh.as_nanos() as u64),
            ),
            gave_up_at: AtomicU64::new(0),
            read_retry: opts.read_retry,
            rebuild_settle: opts.rebuild_settle,
            writer: Mutex::new(WriterState::default()),
        })
    }

    /// The index file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The layout parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Checks an id against what the layout can hold exactly.
    pub fn check_id(&self, id: &[u8]) -> Result<()> {
        let lossy = || String::from_utf8_lossy(id).into_owned();
        if id.is_empty() {
            return Err(Error::InvalidId {
                id: lossy(),
                why: "it is empty",
            });
        }
        if id.contains(&0) {
            return Err(Error::InvalidId {
                id: lossy(),
                why: "it contains NUL",
            });
        }
        self.check_len(id)
    }

    /// The part of [`Table::check_id`] that a [`crate::MinionId`] (never
    /// empty, never with a NUL) still needs: the id fits the id field.
    #[inline]
    fn check_len(&self, id: &[u8]) -> Result<()> {
        if id.len() > self.params.id_size {
            return Err(Error::IdTooLong {
                id: String::from_utf8_lossy(id).into_owned(),
                len: id.len(),
                id_size: self.params.id_size,
                slot: format::min_slot_size(id.len()).max(self.params.slot_size),
            });
        }
        Ok(())
    }

    /// The current view, refreshed when the refresh interval has passed and
    /// the index file was replaced.
    fn current(&self) -> Result<arc_swap::Guard<Arc<Generation>>> {
        self.check_due()?;
        Ok(self.gen.load())
    }

    /// Re-stats the index when the refresh interval has passed.
    #[inline]
    fn check_due(&self) -> Result<()> {
        let now = map::coarse_now_ns();
        if now >= self.next_check.load(Ordering::Relaxed) {
            self.next_check
                .store(now.saturating_add(self.refresh_ns), Ordering::Relaxed);
            self.refresh(false)?;
        }
        Ok(())
    }

    /// A reader's own copy of the current view of the files (see [`View`]).
    pub(crate) fn view(&self) -> View {
        View {
            no: self.gen_no.load(Ordering::Acquire),
            gen: self.gen.load_full(),
        }
    }

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

    /// Re-stats the index and maps the files again when it was replaced (or
    /// always, with `force`, to pick up new segments).
    pub(crate) fn refresh(&self, force: bool) -> Result<()> {
        let cur = self.gen.load_full();
        let mapped = cur.index.as_ref().map(|i| i.dev_ino);
        if files::file_id(&self.path) != mapped {
            self.gen
                .store(Arc::new(load_generation(&self.path, &self.params, None)?));
        } else if force {
            self.gen.store(Arc::new(load_generation(
                &self.path,
                &self.params,
                Some(&cur),
            )?));
        } else {
            return Ok(());
        }
        self.gen_no.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Reads the entry for `id`, or `None` when there is none.
    pub fn get(&self, id: &[u8]) -> Result<Option<Entry>> {
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
    pub(crate) fn get_valid(&self, id: &[u8]) -> Result<Option<Entry>> {
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
    fn owned(&self, id: &[u8]) -> Result<Option<Entry>> {
        let mut value = Vec::new();
        Ok(self.get_checked(id, &mut value)?.map(|f| Entry {
            value,
            mtime: f.mtime,
            slot: f.slot,
        }))
    }

    /// The lookup of an id already checked, with the readers' retry policy.
    fn get_checked(&self, id: &[u8], buf: &mut Vec<u8>) -> Result<Option<Found>> {
        self.get_checked_by(&mut Shared, id, buf)
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
    pub fn get_many<I: AsRef<[u8]>>(&self, ids: &[I]) -> Result<Vec<Option<Entry>>> {
        let mut out = Vec::with_capacity(ids.len());
        self.many(ids, Table::check_id, &mut Vec::new(), |f, buf| {
            out.push(f.map(|f| Entry {
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
                    match self.read_entry(&g, ix, slot, &f, copy, buf)? {
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
            return self.read_entry(g, ix, slot, &f, buf, out);
        }
        Ok(Attempt::Absent)
    }

    /// Reads the record of the slot whose copy is `buf` (decoded: `f`) and
    /// appends its value to `out`, then validates that the slot did not
    /// change meanwhile. `out` is left as it was unless the entry is found.
    fn read_entry(
        &self,
        g: &Generation,
        ix: &Index,
        slot: u64,
        f: &SlotFields,
        buf: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Attempt> {
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
                Read::Value => {}
                Read::Mismatch => {
                    return Ok(Attempt::Retry {
                        refresh: false,
                        why: format!(
                            "{}: record at offset {off} ({} bytes) fails its xxh3 checksum",
                            seg.path.display(),
                            f.len
                        ),
                    })
                }
                Read::Remap => {
                    return Ok(Attempt::Retry {
                        refresh: true,
                        why: format!("{}: record at offset {off} not mapped", seg.path.display()),
                    })
                }
                Read::PastEnd { file_len } => {
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
        let p = &self.params;
        if slot == 0 || slot >= p.size {
            return Ok(None);
        }
        let mut buf = vec![0u8; p.slot_used()];
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
            ix.map.copy_out(off, &mut buf);
            let id = format::slot_id(p, &buf).to_vec();
            let mut value = Vec::new();
            match self.read_entry(&g, ix, slot, &SlotFields::decode(p, &buf), &buf, &mut value)? {
                Attempt::Found(f) => {
                    return Ok(Some(Record {
                        id,
                        value,
                        mtime: f.mtime,
                        slot,
                    }))
                }
                Attempt::Empty(f) => {
                    if !retry.again(false)? {
                        return Ok(Some(Record {
                            id,
                            value,
                            mtime: f.mtime,
                            slot,
                        }));
                    }
                }
                Attempt::Absent => return Ok(None),
                Attempt::Retry { refresh, why } => {
                    if !retry.again(refresh)? {
                        return Err(corrupt(&self.path, Some(&id), why));
                    }
                }
            }
        }
    }

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

    /// The roster's entries as stored, tombstones included.
    pub fn roster(&self) -> Result<Vec<u32>> {
        roster::read(&format::roster_path(&self.path))
    }

    /// Reads the entry in data slot `slot` (checksum verified), if it is occupied.
    pub fn entry_at(&self, slot: u64) -> Result<Option<Record>> {
        self.read_slot(slot)
    }

    /// Replaces the bank by `image` atomically, under the bank's lock, with
    /// `check` run first under the lock (to read what the image is built from).
    pub fn replace_with(
        &self,
        build: impl FnOnce(&Table) -> Result<crate::rebuild::Image>,
    ) -> Result<()> {
        crate::rebuild::replace(&[self], || Ok(vec![build(self)?]))
    }

    /// The live entries in roster order, as Salt lists them: tombstones,
    /// slot 0, slots past the table and slots not OCCUPIED are skipped, and a
    /// slot listed twice is yielded once. An entry that cannot be read back
    /// intact is yielded as an error, and iteration goes on.
    pub fn iter(&self) -> Result<Iter<'_>> {
        self.refresh(false)?;
        let entries = roster::read(&format::roster_path(&self.path))?;
        Ok(Iter {
            table: self,
            entries,
            pos: 0,
            seen: vec![0u64; (self.params.size as usize).div_ceil(64)],
        })
    }

    /// Header counters and heap sizes.
    pub fn stats(&self) -> Result<TableStats> {
        self.refresh(true)?;
        let g = self.gen.load();
        let p = &self.params;
        let mut s = TableStats {
            capacity: p.capacity(),
            ..TableStats::default()
        };
        if let Some(ix) = g.index.as_deref() {
            let h = read_header(&ix.map);
            s.occupied = h.occupied;
            s.deleted = h.deleted;
            s.high_water = h.high_water;
        }
        s.load_factor = s.occupied.saturating_add(s.deleted) as f64 / p.capacity() as f64;
        for seg in &g.segments {
            s.heap_total_bytes += seg.file_len()?;
        }
        s.segments = g.segments.len() as u64;
        for r in self.iter()?.flatten() {
            s.heap_live_bytes += format::record_len(r.value.len());
        }
        Ok(s)
    }

    // ------------------------------------------------------------------
    // Writing
    // ------------------------------------------------------------------


    /// Ownership of new files.
    pub(crate) fn ownership(&self) -> Ownership {
        self.ownership
    }

    /// How long a rebuild of this bank keeps its lock after the renames
    /// ([`OpenOptions::rebuild_settle`]).
    pub(crate) fn rebuild_settle(&self) -> Duration {
        self.rebuild_settle
    }

    /// Runs `f` holding the bank's write lock (this process's mutex, then
    /// `flock` on the `.lock` file). `f` gets the index mapped for writing,
    /// (re)opened on the current file, creating the bank when `create`.
    fn with_lock<T>(&self, create: bool, f: impl FnOnce(Option<&Index>) -> Result<T>) -> Result<T> {
        self.locked(|ws| {
            let r = self
                .open_writer(&mut ws.index, &mut ws.seen, create)
                .and_then(|()| f(ws.index.as_ref()));
            if ws.index.is_some() {
                ws.seen = index_stamp(&self.path);
            }
            r
        })
    }

    /// Runs `f` holding this process's writer mutex and `flock` on the
    /// bank's `.lock` file. A rebuild that a crash interrupted is finished
    /// first.
    fn locked<T>(&self, f: impl FnOnce(&mut WriterState) -> Result<T>) -> Result<T> {
        let mut guard = self.writer.lock();
        let ws = &mut *guard;
        if ws.lock.is_none() {
            ws.lock = Some(self.open_lock_file()?);
        }
        let lock_path = || format::lock_path(&self.path);
        let Some(lock) = ws.lock.take() else {
            return Err(Error::io(
                lock_path(),
                "open",
                std::io::ErrorKind::NotFound.into(),
            ));
        };
        lock.lock()
            .map_err(|e| Error::io(lock_path(), "flock", e))?;
        let result =
            crate::rebuild::roll_forward(&self.dir, Some(&lock_path()), self.rebuild_settle)
                .and_then(|()| f(ws));
        let unlock = lock
            .unlock()
            .map_err(|e| Error::io(lock_path(), "unlock", e));
        ws.lock = Some(lock);
        let out = result?;
        unlock?;
        Ok(out)
    }

    /// Runs `f` under the bank's write lock with the writer's cached mapping
    /// dropped (the files are about to be replaced); readers are moved to
    /// the new files afterwards.
    pub(crate) fn exclusive<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let r = self.locked(|ws| {
            ws.index = None;
            ws.seen = None;
            f()
        });
        // After a compaction into another size this handle no longer
        // matches the files; its readers keep the old view until reopened.
        let _ = self.refresh(true);
        r
    }

    /// Finishes a rebuild that a crash interrupted, if any.
    pub(crate) fn finish_interrupted(&self) -> Result<()> {
        self.locked(|_| Ok(()))
    }

    fn open_lock_file(&self) -> Result<File> {
        let path = format::lock_path(&self.path);
        match files::open_regular(&path, true) {
            Ok(f) => Ok(f),
            Err(e) if is_not_found(&e) => match files::create_new(&path, &self.ownership) {
                Ok(f) => Ok(f),
                // Another process created it meanwhile.
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    files::open_regular(&path, true)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Under the lock: maps the current index for writing (creating the
    /// bank when `create`), stamps the magic, and, when another process
    /// wrote since this one last did, repairs a roster that a crash left
    /// behind (as Salt's writers do on open).
    fn open_writer(
        &self,
        cached: &mut Option<Index>,
        seen: &mut Option<(u64, u64, i64, i64)>,
        create: bool,
    ) -> Result<()> {
        let p = &self.params;
        let on_disk = files::file_id(&self.path);
        if on_disk.is_none() {
            *cached = None;
            if !create {
                return Ok(());
            }
            self.create_bank()?;
        }
        let stamp = index_stamp(&self.path);
        if let Some(ix) = cached.as_ref() {
            if Some(ix.dev_ino) == files::file_id(&self.path) && stamp == *seen {
                return Ok(());
            }
        }
        let file = files::open_regular(&self.path, true)?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(&self.path, "stat", e))?;
        check_index_len(&self.path, p, meta.len())?;
        let dev_ino = (meta.dev(), meta.ino());
        let map = Mapping::read_write(&file, meta.len() as usize)
            .map_err(|e| Error::io(&self.path, "mmap", e))?;
        let index = Index { map, dev_ino };
        if index.map.load_u8(0) != Some(HEADER_MAGIC) {
            index.map.store_u8(0, HEADER_MAGIC);
            index
                .map
                .flush_range(0, p.slot_size)
                .map_err(|e| Error::io(&self.path, "msync", e))?;
        }
        self.recover_roster(&index)?;
        *cached = Some(index);
        if self.gen.load().index.as_ref().map(|i| i.dev_ino) != Some(dev_ino) {
            self.refresh(true)?;
        }
        Ok(())
    }

    /// Creates a zero-filled index (magic stamped) and an empty heap, through
    /// a temporary name so that no one ever sees a short index.
    fn create_bank(&self) -> Result<()> {
        let p = &self.params;
        let heap0 = heap::segment_path(&self.path, 0);
        if files::file_id(&heap0).is_none() {
            let f = files::create_new(&heap0, &self.ownership)?;
            files::sync_data(&f, &heap0)?;
        }
        let tmp = files::with_suffix(&self.path, &format!(".keycache-new.{}", std::process::id()));
        files::remove_if_exists(&tmp)?;
        let f = files::create_new(&tmp, &self.ownership)?;
        let len = p.index_len().unwrap_or(0);
        files::allocate(&f, &tmp, len)?;
        f.write_all_at(&[HEADER_MAGIC], 0)
            .map_err(|e| Error::io(&tmp, "write", e))?;
        files::sync_data(&f, &tmp)?;
        files::rename(&tmp, &self.path)?;
        files::sync_dir(&self.dir)
    }

    /// Salt's `_roster_recover`: when the roster's live count differs from
    /// the header's occupied count, rebuild the roster from the slots.
    fn recover_roster(&self, ix: &Index) -> Result<()> {
        let p = &self.params;
        let rpath = format::roster_path(&self.path);
        let entries = roster::read(&rpath)?;
        let header = read_header(&ix.map);
        if roster::live_count(&entries) as u64 == header.occupied {
            return Ok(());
        }
        let end = header.high_water.saturating_add(2).min(p.size);
        let mut slots = Vec::new();
        for s in 1..end {
            if ix.map.load_u8(p.slot_offset(s)) == Some(OCCUPIED) {
                slots.push(s as u32);
            }
        }
        // Patched in place, not rewritten: the entries it has right keep
        // their order and their byte offsets. A Salt writer remembers the
        // offset of every entry it appended and tombstones it there later,
        // through a descriptor it keeps open while the index looks unchanged
        // to it (its staleness check runs at most every 0.25 s): a roster
        // replaced under it would take that tombstone (or its next append)
        // into the old, unlinked file.
        let live: HashSet<u32> = slots.iter().copied().collect();
        let mut seen = HashSet::new();
        let mut dead = Vec::new();
        for (i, s) in entries.iter().enumerate() {
            if *s != format::ROSTER_TOMBSTONE && !(live.contains(s) && seen.insert(*s)) {
                dead.push(i);
            }
        }
        let missing: Vec<u32> = slots
            .iter()
            .copied()
            .filter(|s| !seen.contains(s))
            .collect();
        let rf = match files::open_regular(&rpath, true) {
            Ok(f) => f,
            Err(e) if is_not_found(&e) => files::create_new(&rpath, &self.ownership)?,
            Err(e) => return Err(e),
        };
        roster::patch(&rpath, &rf, &dead, &missing)?;
        files::sync_data(&rf, &rpath)?;
        let header = Header {
            occupied: slots.len() as u64,
            ..header
        };
        ix.map
            .copy_in(format::HDR_OCCUPIED, &header.encode_counters());
        ix.map
            .flush_range(0, p.slot_size)
            .map_err(|e| Error::io(&self.path, "msync", e))
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
    /// fsynced; removals mark their slots DELETED; new entries get their
    /// fields, then (after an msync of the two pages of each slot that spans
    /// two, so that a power loss never keeps a status byte without the
    /// fields it vouches for) their status; then the header, the roster
    /// (fsynced) and the index (msync).
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
        let mut applied = Applied::default();
        let Header {
            occupied: mut occ,
            deleted: mut del,
            high_water: mut hwm,
        } = read_header(&ix.map);
        let mut removed_slots = Vec::new();
        let mut inserted_slots = Vec::new();
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        // New entries whose slot spans two pages (about one in 43 with
        // 96-byte slots): their fields are made durable before their status.
        let mut spanning = Vec::new();
        // 2. Removals (placed first by the plan): status DELETED.
        for w in writes.iter().filter(|w| w.value.is_none()) {
            let off = p.slot_offset(w.slot);
            lo = lo.min(off);
            hi = hi.max(off + p.slot_size);
            ix.map.store_u8(off, DELETED);
            occ = occ.saturating_sub(1);
            del = del.saturating_add(1);
            removed_slots.push(w.slot as u32);
            applied.removed += 1;
        }
        // 3. Fields of every put; an existing entry's slot is repointed at
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
            hwm = hwm.max(w.slot);
            if w.insert {
                if off / PAGE != (off + p.slot_size - 1) / PAGE {
                    spanning.push(off);
                }
                new_slots.push(off);
                occ = occ.saturating_add(1);
                if w.was_deleted {
                    del = del.saturating_sub(1);
                }
                inserted_slots.push(w.slot as u32);
                applied.inserted += 1;
            } else {
                applied.updated += 1;
            }
        }
        // Only those two pages each: the other dirty pages of the batch are
        // written once, by the msync at the end.
        for off in spanning {
            ix.map
                .flush_range(off, p.slot_size)
                .map_err(|e| Error::io(&self.path, "msync", e))?;
        }
        // 4. Status bytes of new entries, then the header.
        for off in new_slots {
            ix.map.store_u8(off, OCCUPIED);
        }
        let header = Header {
            occupied: occ,
            deleted: del,
            high_water: hwm,
        };
        ix.map
            .copy_in(format::HDR_OCCUPIED, &header.encode_counters());
        // 5. Roster, then the index.
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
    fn open(table: &'a Table) -> Result<Appender<'a>> {
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

    fn finish(mut self) -> Result<()> {
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

/// Iterator over a table's live entries in roster order.
pub struct Iter<'a> {
    table: &'a Table,
    entries: Vec<u32>,
    pos: usize,
    seen: Vec<u64>,
}

impl Iterator for Iter<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
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

/// Reads the header's counters.
pub(crate) fn read_header(m: &Mapping) -> Header {
    let mut h = [0u8; format::HDR_LEN];
    m.copy_out(0, &mut h);
    Header::decode(&h)
}

/// Refuses an index whose length does not match the parameters.
pub(crate) fn check_index_len(path: &Path, p: &Params, len: u64) -> Result<()> {
    let expected = p.index_len().unwrap_or(0);
    if len != expected {
        let hint = if len.is_multiple_of(p.slot_size as u64) {
            format!(
                " (that is {} slots of {} bytes: set mmap_key_size/--size to match)",
                len / p.slot_size as u64,
                p.slot_size
            )
        } else {
            String::new()
        };
        return Err(Error::Mismatch {
            path: path.into(),
            what: "index length (size x slot size)",
            expected: format!("{expected} bytes ({} x {})", p.size, p.slot_size),
            found: format!("{len} bytes{hint}"),
        });
    }
    Ok(())
}

/// Maps the bank's current files read-only, reusing the mappings of `prev`
/// for files that were not replaced.
pub(crate) fn load_generation(
    path: &Path,
    p: &Params,
    prev: Option<&Generation>,
) -> Result<Generation> {
    let file = match files::open_regular(path, false) {
        Ok(f) => f,
        Err(e) if is_not_found(&e) => {
            return Ok(Generation {
                index: None,
                segments: Vec::new(),
            })
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
    let dev_ino = (meta.dev(), meta.ino());
    let index = match prev.and_then(|g| g.index.clone()) {
        Some(ix) if ix.dev_ino == dev_ino => ix,
        _ => {
            check_index_len(path, p, meta.len())?;
            let map = Mapping::read_only(&file, meta.len() as usize)
                .map_err(|e| Error::io(path, "mmap", e))?;
            map.advise_huge();
            Arc::new(Index { map, dev_ino })
        }
    };
    let reuse = prev.filter(|g| g.index.as_ref().map(|i| i.dev_ino) == Some(dev_ino));
    let mut segments = Vec::new();
    for (n, sp) in heap::discover(path).into_iter().enumerate() {
        if let Some(old) = reuse.and_then(|g| g.segments.get(n)) {
            let same = std::fs::symlink_metadata(&sp)
                .map(|m| m.ino() == old.ino && m.len() <= old.reserved());
            if matches!(same, Ok(true)) {
                segments.push(old.clone());
                continue;
            }
        }
        match Segment::open(&sp, p.max_segment_bytes, 0) {
            Ok(s) => segments.push(Arc::new(s)),
            // A segment that vanished between discovery and open (a rebuild
            // in progress): stop there; readers retry.
            Err(e) if is_not_found(&e) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(Generation {
        index: Some(index),
        segments,
    })
}
