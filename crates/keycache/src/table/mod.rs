//! The generic table: one bank (index, heap segments, roster, lock file) of
//! Salt's `MmapCache`, with lock-free readers and a crash-safe writer.
//!
//! Nothing here knows about minion keys: ids and values are bytes. The key
//! banks are built on top of it in [`crate::store`].
//!
//! # Readers
//!
//! A reader loads the current `Generation` (the mapped index and heap
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
//! A keycache rebuild does not wait for that interval: before its renames
//! (when its journal is finished) it marks the index it replaces as retired
//! ([`RETIRED_MAGIC`] in byte 0, a byte Salt's readers never read), and a
//! lookup that finds the mark in the index it maps stats the file at once
//! and moves to the new files (or fails, when they do not match its
//! layout). The check is a load of a byte already mapped: no system call
//! per lookup.
//!
//! # Writers
//!
//! A write holds a mutex (against this process's other writers) and `flock`
//! on the bank's `.lock` file (against other processes, Salt's included).
//! It appends records to the heap and fsyncs them, then points slots at them
//! (status byte last, with release ordering), updates the header, tombstones
//! and appends roster entries and fsyncs the roster, and finally msyncs the
//! index. A live record is never rewritten in place.
//!
//! The table is split by path: `read` (lookups and their retry policy),
//! `write` (transactions: plan, apply, append), `lock` (the writer's
//! locks, bank creation, roster recovery) and `iter` (listing, scans).

mod iter;
mod lock;
mod read;
mod write;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::files::{self, Ownership};
use crate::format::{self, Header, Params, SlotFields, DELETED, EMPTY, HEADER_MAGIC, OCCUPIED};
use crate::heap::{self, RecordRead, Segment};
use crate::map::Mapping;
use crate::roster;

pub use iter::{Iter, IterScratch, Scan, ScannedSlot};
pub use read::DEFAULT_READ_RETRY;
pub use write::Txn;

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
    /// [`crate::journal::DEFAULT_SETTLE`]); zero where no Salt writer shares
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
            rebuild_settle: crate::journal::DEFAULT_SETTLE,
        }
    }
}

pub use crate::format::RETIRED_MAGIC;

/// The value of an id, as a lookup returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
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
    /// By segment number; a segment whose file is missing is a hole.
    pub(crate) segments: heap::Segments,
    /// The index was already marked retired when this view was loaded: a
    /// rebuild's renames may have been under way, so the segments, opened
    /// by path, may be the new image's under the old index, whose slots
    /// would then point at other ids' records (a record's checksum cannot
    /// tell: it covers the value, not the id). Nothing is read through such
    /// a view; lookups load another until the new index is in place.
    pub(crate) torn: bool,
}

impl Generation {
    /// Whether a rebuild marked this view's index as retired
    /// ([`RETIRED_MAGIC`]): the path may name new files.
    #[inline]
    pub(crate) fn retired(&self) -> bool {
        self.index
            .as_ref()
            .is_some_and(|ix| ix.map.load_u8(0) == Some(RETIRED_MAGIC))
    }
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
    /// Whether `gen` has no index (the bank's files are missing): lookups
    /// then look for the file every time.
    unmapped: std::sync::atomic::AtomicBool,
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

/// An error for a damaged entry or file.
fn corrupt(path: &Path, id: Option<&[u8]>, why: String) -> Error {
    Error::Corrupt {
        path: path.into(),
        id: id.map(|i| String::from_utf8_lossy(i).into_owned()),
        why,
    }
}

impl Table {
    /// Opens the bank whose index file is `path`. Nothing is created until
    /// the first write; a bank without files reads as empty.
    ///
    /// A layout that the files do not fit, while they fit another one, is
    /// refused with [`Error::LayoutMismatch`], which names the file and the
    /// layout they look like (see [`crate::fit::check_for_reading`]); the
    /// check waits while an interrupted rebuild's journal is there (the
    /// files are then half old, half new until it is finished). Writers
    /// check again, strictly, before their first write.
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
        if gen.index.is_some() && !dir.join(crate::format::JOURNAL).exists() {
            crate::fit::check_for_reading(&path, &opts.params)?;
        }
        let unmapped = std::sync::atomic::AtomicBool::new(gen.index.is_none());
        Ok(Table {
            unmapped,
            path,
            dir,
            params: opts.params,
            refresh_ns: opts.refresh.as_nanos().min(u128::from(u64::MAX)) as u64,
            ownership,
            gen: ArcSwap::from_pointee(gen),
            gen_no: AtomicU64::new(0),
            next_check: AtomicU64::new(
                crate::clock::coarse_now_ns().saturating_add(opts.refresh.as_nanos() as u64),
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
    /// the index file was replaced, or at once when a rebuild marked the
    /// mapped index as retired.
    fn current(&self) -> Result<arc_swap::Guard<Arc<Generation>>> {
        self.check_due()?;
        let g = self.gen.load();
        if !g.retired() {
            return Ok(g);
        }
        drop(g);
        self.refresh_retired()?;
        Ok(self.gen.load())
    }

    /// The view's index is marked retired: stat the path and map the new
    /// files when it names another file. When it still names the marked
    /// one, its journal has not renamed it yet (it is being finished, or a
    /// crash left it to the next writer or open), so the marked files are
    /// still the bank's. An error (the new files do
    /// not fit this handle's layout) is the lookup's: a reader never
    /// answers from files a rebuild replaced.
    #[cold]
    pub(crate) fn refresh_retired(&self) -> Result<()> {
        self.next_check.store(
            crate::clock::coarse_now_ns().saturating_add(self.refresh_ns),
            Ordering::Relaxed,
        );
        self.refresh(false)
    }

    /// Re-stats the index when the refresh interval has passed, or on every
    /// lookup while the bank has no index file (as Salt's readers do: a bank
    /// another process creates is seen at once; a missing file costs one
    /// failed stat).
    #[inline]
    fn check_due(&self) -> Result<()> {
        let now = crate::clock::coarse_now_ns();
        if now >= self.next_check.load(Ordering::Relaxed) || self.unmapped.load(Ordering::Relaxed) {
            self.next_check
                .store(now.saturating_add(self.refresh_ns), Ordering::Relaxed);
            self.refresh(false)?;
        }
        Ok(())
    }

    /// Whether the bank has an index file, looked at now (one `stat`): a
    /// writer's batch asks once, where a lookup in a bank without files
    /// would cost a failed `stat` per id.
    pub(crate) fn has_index_now(&self) -> Result<bool> {
        self.refresh(false)?;
        Ok(!self.unmapped.load(Ordering::Relaxed))
    }

    /// A reader's own copy of the current view of the files (see [`View`]).
    pub(crate) fn view(&self) -> View {
        View {
            no: self.gen_no.load(Ordering::Acquire),
            gen: self.gen.load_full(),
        }
    }

    /// Re-stats the index and maps the files again when it was replaced (or
    /// always, with `force`, to pick up new segments).
    pub(crate) fn refresh(&self, force: bool) -> Result<()> {
        let cur = self.gen.load_full();
        let mapped = cur.index.as_ref().map(|i| i.dev_ino);
        let next = if files::file_id(&self.path) != mapped {
            load_generation(&self.path, &self.params, None)?
        } else if force {
            load_generation(&self.path, &self.params, Some(&cur))?
        } else {
            return Ok(());
        };
        self.unmapped.store(next.index.is_none(), Ordering::Relaxed);
        self.gen.store(Arc::new(next));
        self.gen_no.fetch_add(1, Ordering::Release);
        Ok(())
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
        for seg in g.segments.iter() {
            s.heap_total_bytes += seg.file_len()?;
        }
        s.segments = g.segments.iter().count() as u64;
        for r in self.iter()?.flatten() {
            s.heap_live_bytes += format::record_len(r.value.len());
        }
        Ok(s)
    }

    /// Checks that this handle's layout is the layout of the bank's files
    /// (see [`crate::fit`]); a bank without files fits any layout. Every
    /// write checks it when it first meets an index file; a tool that reads
    /// calls it first, so that a wrong layout is refused rather than read as
    /// an empty or damaged bank.
    pub fn check_layout(&self) -> Result<()> {
        crate::fit::check(&self.path, &self.params)
    }

    /// Ownership of new files.
    pub(crate) fn ownership(&self) -> Ownership {
        self.ownership
    }

    /// How long a rebuild of this bank keeps its lock after the renames
    /// ([`OpenOptions::rebuild_settle`]).
    pub(crate) fn rebuild_settle(&self) -> Duration {
        self.rebuild_settle
    }
}

/// Reads the header's counters.
pub(crate) fn read_header(m: &Mapping) -> Header {
    let mut h = [0u8; format::HDR_LEN];
    m.copy_out(0, &mut h);
    Header::decode(&h)
}

/// What an [`Error::Mismatch`] of an index whose length is not
/// `size x slot_size` checked.
pub const INDEX_LENGTH: &str = "index length (size x slot size)";

/// Refuses an index whose length does not match the parameters.
pub(crate) fn check_index_len(path: &Path, p: &Params, len: u64) -> Result<()> {
    let expected = p.index_len().unwrap_or(0);
    if len != expected {
        let hint = if len.is_multiple_of(p.slot_size as u64) {
            format!(
                " (that is {} slots of {} bytes: set mmap_key_size to match)",
                len / p.slot_size as u64,
                p.slot_size
            )
        } else {
            String::new()
        };
        return Err(Error::Mismatch {
            path: path.into(),
            what: INDEX_LENGTH,
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
        Err(e) if e.is_not_found() => {
            return Ok(Generation {
                index: None,
                segments: heap::Segments::default(),
                torn: false,
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
    // Every segment up to the highest present: one missing in the middle
    // (damage) is a hole, and the records past it stay readable.
    let mut segments = heap::Segments::default();
    let mut past_gap = false;
    for (n, sp) in heap::discover(path).into_iter().enumerate() {
        if let Some(old) = reuse.and_then(|g| g.segments.get(n)) {
            let same = std::fs::symlink_metadata(&sp)
                .map(|m| m.ino() == old.ino && m.len() <= old.reserved());
            if matches!(same, Ok(true)) {
                segments.push(Some(old.clone()));
                continue;
            }
        }
        match Segment::open(&sp, p.max_segment_bytes, 0) {
            Ok(s) => segments.push(Some(Arc::new(s))),
            // Missing (a gap), or vanished between discovery and open (a
            // rebuild in progress: readers retry with a fresh view).
            Err(e) if e.is_not_found() => {
                past_gap = true;
                segments.push(None);
            }
            // Past a gap Salt reads nothing: a file there that is not a
            // regular file is not used (verify reports it), not refused.
            Err(Error::NotARegularFile { .. }) if past_gap => segments.push(None),
            Err(e) => return Err(e),
        }
    }
    // Checked after the segments were opened: a journal marks the index
    // before its first rename, so a segment renamed into place before it
    // was opened here shows as the mark now.
    let torn = index.map.load_u8(0) == Some(RETIRED_MAGIC);
    Ok(Generation {
        index: Some(index),
        segments,
        torn,
    })
}
