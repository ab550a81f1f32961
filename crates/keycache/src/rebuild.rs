//! Atomic rebuilds: a bank image built in memory, written under temporary
//! names, fsynced, then renamed into place through a roll-forward journal.
//!
//! Salt's own rebuild renames heap segments, heap, index and roster one after
//! another, so a crash in the middle leaves an old index over a new heap.
//! keycache writes the list of renames to `D/.keycache-journal` (fsynced)
//! before the first one; every keycache writer that takes a bank's lock, and
//! every `Store::open`, finishes a journal it finds, so after a crash the
//! store is the whole old state (no journal yet) or the whole new one.
//! Renames follow Salt's order (segments, heap, index, roster); heap segments
//! that the new image does not use are removed last.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::files::{self, Ownership};
use crate::format::{self, Header, Params, SlotFields, HDR_LEN, OCCUPIED};
use crate::heap;
use crate::roster;
use crate::table::Table;

/// Name of the roll-forward journal in a store directory.
pub const JOURNAL: &str = ".keycache-journal";
/// Prefix of temporary files of a rebuild in progress.
pub const TMP_PREFIX: &str = ".keycache-tmp.";

/// A bank built in memory: the occupied slots of its index, heap segments
/// and roster. Only occupied slots are held (the index is mostly zeros), so
/// building and writing an image costs in proportion to its entries, not to
/// the table size.
#[derive(Debug)]
pub struct Image {
    params: Params,
    /// For each slot: 0 when empty, else 1 + the number of the entry in it.
    occupant: Vec<u32>,
    /// The slot bytes of entry `e` at `e * slot_size`; entry `e` lives in
    /// slot `roster[e]`.
    slots: Vec<u8>,
    segments: Vec<Segment>,
    /// Buffers holding records that segments refer to instead of copying
    /// them (see [`Image::insert_record`]).
    shared: Shared,
    roster: Vec<u32>,
    occupied: u64,
    hwm: u64,
}

impl Image {
    /// An empty image for a table with `params`.
    pub fn new(params: Params) -> Result<Image> {
        params.validate()?;
        let too_big = || {
            Error::InvalidParams(format!(
                "index of {} slots does not fit in memory",
                params.size
            ))
        };
        usize::try_from(params.index_len().unwrap_or(u64::MAX)).map_err(|_| too_big())?;
        let size = usize::try_from(params.size).map_err(|_| too_big())?;
        Ok(Image {
            params,
            // Zeroed pages come from the allocator untouched: only those of
            // the slots used are ever faulted in.
            occupant: vec![0u32; size],
            slots: Vec::new(),
            segments: vec![Segment::default()],
            shared: Shared::default(),
            roster: Vec::new(),
            occupied: 0,
            hwm: 0,
        })
    }

    /// An empty image whose records may lie in `shared` buffers (see
    /// [`Image::insert_record`]): they are written from there, not copied.
    pub(crate) fn with_shared(params: Params, shared: Vec<Arc<Vec<u8>>>) -> Result<Image> {
        let mut image = Image::new(params)?;
        image.shared = Shared(shared);
        Ok(image)
    }

    /// Reserves room for `entries` more entries holding `value_bytes` bytes
    /// of values in all (a hint: inserting past it only costs reallocations).
    pub fn reserve(&mut self, entries: usize, value_bytes: usize) {
        self.reserve_slots(entries);
        let heap = value_bytes.saturating_add(entries.saturating_mul(format::CHECKSUM_LEN));
        let p = self.params;
        let last = self.segments.len() - 1;
        let room = (p.max_segment_bytes as usize).saturating_sub(self.segments[last].len as usize);
        self.segments[last].owned.reserve(heap.min(room));
    }

    /// Reserves index room for `entries` more entries.
    pub(crate) fn reserve_slots(&mut self, entries: usize) {
        let p = self.params;
        self.slots
            .reserve(entries.min(p.capacity() as usize) * p.slot_size);
        self.roster.reserve(entries);
    }

    /// Number of entries.
    pub fn len(&self) -> u64 {
        self.occupied
    }

    /// Whether the image holds no entry.
    pub fn is_empty(&self) -> bool {
        self.occupied == 0
    }

    /// Inserts (or replaces) `id` with `value`, written at `mtime`.
    pub fn insert(&mut self, id: &[u8], value: &[u8], mtime: u64, path: &Path) -> Result<()> {
        self.insert_with(id, value.len(), mtime, path, |seg| {
            let start = seg.owned.len();
            format::encode_record(value, &mut seg.owned);
            seg.push_run(None, start, seg.owned.len());
        })
    }

    /// Inserts (or replaces) `id` with a value of `value_len` bytes whose
    /// whole record (checksum, then value: what [`format::encode_record`]
    /// makes of it) is `range` of shared buffer `buf`: the heap refers to
    /// those bytes, and they are written from there.
    pub(crate) fn insert_record(
        &mut self,
        id: &[u8],
        buf: usize,
        range: std::ops::Range<usize>,
        value_len: usize,
        mtime: u64,
        path: &Path,
    ) -> Result<()> {
        let well_formed = self
            .shared
            .0
            .get(buf)
            .is_some_and(|b| range.end <= b.len() && range.start <= range.end)
            && range.len() as u64 == format::record_len(value_len);
        if !well_formed {
            return Err(Error::InvalidParams(format!(
                "record {range:?} of buffer {buf} does not hold a value of {value_len} bytes"
            )));
        }
        self.insert_with(id, value_len, mtime, path, |seg| {
            if !range.is_empty() {
                seg.push_run(Some(buf), range.start, range.end);
            }
        })
    }

    /// Places `id` (a new slot, or its existing one) and appends its record,
    /// `append` adding the record's bytes to the segment chosen.
    fn insert_with(
        &mut self,
        id: &[u8],
        value_len: usize,
        mtime: u64,
        path: &Path,
        append: impl FnOnce(&mut Segment),
    ) -> Result<()> {
        let p = self.params;
        if id.is_empty() || id.len() > p.id_size || id.contains(&0) {
            return Err(Error::IdTooLong {
                id: String::from_utf8_lossy(id).into_owned(),
                len: id.len(),
                id_size: p.id_size,
                slot: format::min_slot_size(id.len()).max(p.slot_size),
            });
        }
        let vlen = u32::try_from(value_len).map_err(|_| Error::ValueTooLarge {
            id: String::from_utf8_lossy(id).into_owned(),
            len: value_len,
        })?;
        let home = p.home(id);
        let mut target = None;
        for step in 0..p.capacity() {
            let slot = p.probe(home, step);
            let e = self.occupant[slot as usize];
            if e == 0 {
                target = Some((slot, None));
                break;
            }
            let off = (e - 1) as usize * p.slot_size;
            if format::slot_id_eq(&p, &self.slots[off..off + p.slot_used()], id) {
                target = Some((slot, Some(e - 1)));
                break;
            }
        }
        let Some((slot, existing)) = target else {
            return Err(Error::TableFull {
                path: path.into(),
                capacity: p.capacity(),
            });
        };
        // Append the record, rolling segments as Salt does.
        let rec = format::record_len(value_len);
        let mut seg = self.segments.len() - 1;
        if self.segments[seg].len != 0 && self.segments[seg].len + rec > p.max_segment_bytes {
            if seg == usize::from(u16::MAX) {
                return Err(Error::InvalidParams(
                    "more than 65536 heap segments; raise the segment cap".into(),
                ));
            }
            self.segments.push(Segment::default());
            seg += 1;
        }
        let packed = format::pack_offset(seg as u16, self.segments[seg].len);
        append(&mut self.segments[seg]);
        self.segments[seg].len += rec;
        let entry = match existing {
            Some(e) => e,
            None => {
                let e = self.roster.len() as u32;
                self.slots.resize(self.slots.len() + p.slot_size, 0);
                self.occupant[slot as usize] = e + 1;
                self.roster.push(slot as u32);
                self.occupied += 1;
                self.hwm = self.hwm.max(slot);
                e
            }
        };
        let off = entry as usize * p.slot_size;
        let s = &mut self.slots[off..off + p.slot_size];
        s[0] = OCCUPIED;
        let fields = SlotFields {
            status: OCCUPIED,
            offset: packed,
            len: vlen,
            mtime,
        };
        fields.encode_body(&p, id, &mut s[1..p.slot_used()]);
        Ok(())
    }

    /// Slot 0: magic and counters.
    fn header(&self) -> Vec<u8> {
        let mut h = vec![0u8; self.params.slot_size];
        let header = Header {
            occupied: self.occupied,
            deleted: 0,
            high_water: self.hwm,
        };
        h[..HDR_LEN].copy_from_slice(&header.encode());
        h
    }

    /// Writes the index file's bytes to `f` (already of the index's length,
    /// zero): only the pages holding an occupied slot or the header, in
    /// runs of consecutive pages.
    fn write_index(&self, f: &File, path: &Path, written: &mut dyn FnMut(u64)) -> Result<()> {
        const PAGE: u64 = 4096;
        const RUN: u64 = 1 << 20;
        const GAP: u64 = 8 * PAGE;
        let p = self.params;
        let ss = p.slot_size as u64;
        let len = p.index_len().unwrap_or(0);
        let header = self.header();
        // (slot, entry) in slot order; the header is slot 0.
        let mut order: Vec<(u32, u32)> = Vec::with_capacity(self.roster.len() + 1);
        order.push((0, u32::MAX));
        order.extend(self.roster.iter().enumerate().map(|(e, &s)| (s, e as u32)));
        order.sort_unstable();
        let bytes_of = |&(_, e): &(u32, u32)| -> &[u8] {
            if e == u32::MAX {
                &header
            } else {
                let off = e as usize * p.slot_size;
                &self.slots[off..off + p.slot_size]
            }
        };
        // Runs of pages [a, b), in bytes, at most RUN long, holding every
        // page with non-zero bytes. Gaps of up to GAP zero pages are written
        // too: a few pages of zeros cost less than splitting the writeback
        // (and the file's extents) there.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &(s, _) in &order {
            let a = u64::from(s) * ss / PAGE * PAGE;
            let b = ((u64::from(s) + 1) * ss).div_ceil(PAGE) * PAGE;
            let b = b.min(len);
            match runs.last_mut() {
                Some(r) if a <= r.1 + GAP && b - r.0 <= RUN => r.1 = r.1.max(b),
                Some(r) if a < r.1 => {
                    // Overlaps a full run: start the next where it ends.
                    let from = r.1;
                    if b > from {
                        runs.push((from, b));
                    }
                }
                _ => runs.push((a, b)),
            }
        }
        let mut buf = Vec::with_capacity(RUN as usize);
        let mut first = 0usize; // first entry of `order` that may reach the run
        for &(a, b) in &runs {
            buf.clear();
            buf.resize((b - a) as usize, 0);
            while first < order.len() && (u64::from(order[first].0) + 1) * ss <= a {
                first += 1;
            }
            for o in &order[first..] {
                let start = u64::from(o.0) * ss;
                if start >= b {
                    break;
                }
                let src = bytes_of(o);
                let from = a.max(start);
                let to = b.min(start + ss);
                buf[(from - a) as usize..(to - a) as usize]
                    .copy_from_slice(&src[(from - start) as usize..(to - start) as usize]);
            }
            f.write_all_at(&buf, a)
                .map_err(|e| Error::io(path, "write", e))?;
            written(b - a);
        }
        Ok(())
    }
}

/// Buffers shared between images (read once, referred to by several).
#[derive(Default)]
struct Shared(Vec<Arc<Vec<u8>>>);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|b| b.len()))
            .finish()
    }
}

/// One heap segment of an image: its records, in order, as runs of bytes
/// of its own buffer or of the image's shared buffers.
#[derive(Debug, Default)]
struct Segment {
    /// Records inserted by value.
    owned: Vec<u8>,
    /// (None: `owned`, or Some(shared buffer), start, end), in file order.
    runs: Vec<(Option<usize>, usize, usize)>,
    /// Bytes of the segment.
    len: u64,
}

impl Segment {
    /// Appends bytes `start..end` of `buf` to the segment, extending the last
    /// run when they follow it.
    fn push_run(&mut self, buf: Option<usize>, start: usize, end: usize) {
        match self.runs.last_mut() {
            Some(r) if r.0 == buf && r.2 == start => r.2 = end,
            _ => self.runs.push((buf, start, end)),
        }
    }

    /// Writes the segment at the start of `f`.
    fn write(
        &self,
        shared: &Shared,
        f: &File,
        path: &Path,
        written: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let mut at = 0u64;
        for &(buf, start, end) in &self.runs {
            let src = match buf {
                None => self.owned.get(start..end),
                Some(b) => shared.0.get(b).and_then(|b| b.get(start..end)),
            };
            let Some(src) = src else {
                return Err(Error::io(
                    path,
                    "write",
                    std::io::Error::other("heap run out of its buffer"),
                ));
            };
            for piece in src.chunks(EARLY_SYNC_BYTES as usize / 2) {
                f.write_all_at(piece, at)
                    .map_err(|e| Error::io(path, "write", e))?;
                at += piece.len() as u64;
                written(piece.len() as u64);
            }
        }
        Ok(())
    }
}

/// A set of bank images to swap into place together.
#[derive(Debug, Default)]
struct Commit {
    renames: Vec<(PathBuf, PathBuf)>,
    removals: Vec<PathBuf>,
    locks: Vec<PathBuf>,
    dir: Option<PathBuf>,
}

fn write_file(path: &Path, bytes: &[u8], own: &Ownership) -> Result<()> {
    let f: File = files::create_new_unsynced(path, own)?;
    f.write_all_at(bytes, 0)
        .map_err(|e| Error::io(path, "write", e))?;
    files::sync_data(&f, path)
}

/// What a temporary file of a staged image holds.
enum Body<'a> {
    Bytes(&'a [u8]),
    /// Heap segment `n` of an image.
    Heap(&'a Image, usize),
    /// The index of an image: mostly zeros. Its blocks are reserved (so
    /// later writes through a mapping, Salt's included, cannot fail for want
    /// of space, as with the zero-filled index Salt creates), and only the
    /// pages holding non-zero bytes are written.
    Index(&'a Image),
}

/// Bytes written to a file between two early syncs (see [`syncing_early`]).
const EARLY_SYNC_BYTES: u64 = 16 << 20;

/// Runs `write`, which reports the bytes it wrote through its argument,
/// while another thread syncs `f` whenever [`EARLY_SYNC_BYTES`] more were
/// written: the disk takes the first bytes of a large file while the last
/// are still being copied, instead of all of them at the final sync (which
/// the caller still makes: these syncs only start the writeback early).
/// `len` is at least what `write` writes; below twice [`EARLY_SYNC_BYTES`],
/// `write` just runs.
fn syncing_early(
    f: &File,
    path: &Path,
    len: u64,
    write: impl FnOnce(&mut dyn FnMut(u64)) -> Result<()>,
) -> Result<()> {
    if len < 2 * EARLY_SYNC_BYTES {
        return write(&mut |_| {});
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let syncer = s.spawn(move || -> Result<()> {
            while rx.recv().is_ok() {
                // Requests made during the last sync: one more covers them.
                while rx.try_recv().is_ok() {}
                files::sync_data(f, path)?;
            }
            Ok(())
        });
        let wrote = {
            let mut pending = 0u64;
            let mut report = |n: u64| {
                pending += n;
                if pending >= EARLY_SYNC_BYTES {
                    pending = 0;
                    // The syncer is gone only when a sync failed: the
                    // error comes from its join.
                    let _ = tx.send(());
                }
            };
            write(&mut report)
        };
        drop(tx);
        let synced = syncer.join().unwrap_or_else(|_| {
            Err(Error::io(
                path,
                "fsync",
                std::io::Error::other("a sync thread panicked"),
            ))
        });
        wrote.and(synced)
    })
}

/// Writes and fsyncs new files (already created), several at a time: their
/// writeback overlaps.
fn write_all(jobs: &[(PathBuf, File, Body<'_>)]) -> Result<()> {
    let write = |(path, f, body): &(PathBuf, File, Body<'_>)| -> Result<()> {
        match body {
            Body::Bytes(b) => f
                .write_all_at(b, 0)
                .map_err(|e| Error::io(path, "write", e))?,
            Body::Heap(image, n) => {
                let Some(seg) = image.segments.get(*n) else {
                    return Err(Error::io(
                        path,
                        "write",
                        std::io::Error::other("no such heap segment"),
                    ));
                };
                syncing_early(f, path, seg.len, |w| seg.write(&image.shared, f, path, w))?;
            }
            Body::Index(image) => {
                let len = image.params.index_len().unwrap_or(0);
                files::allocate(f, path, len)?;
                syncing_early(f, path, len, |w| image.write_index(f, path, w))?;
            }
        }
        files::sync_data(f, path)
    };
    let workers = jobs.len().min(4);
    if workers <= 1 {
        return jobs.iter().try_for_each(write);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else {
                            return Ok(());
                        };
                        write(job)?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::io(
                        &jobs[0].0,
                        "write",
                        std::io::Error::other("a writer thread panicked"),
                    ))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}

impl Commit {
    /// Writes the images of several banks (index path, image) under
    /// temporary names, all of them written and fsynced together, to be
    /// renamed into place by [`Commit::apply`].
    fn stage_all(&mut self, banks: Vec<(PathBuf, Image)>, own: &Ownership) -> Result<()> {
        let rosters: Vec<Vec<u8>> = banks
            .iter()
            .map(|(_, image)| roster::encode(&image.roster))
            .collect();
        // Per bank: (temporary, final name, contents), in rename order.
        let mut plans: Vec<Vec<(PathBuf, PathBuf, Body<'_>)>> = Vec::new();
        for ((index, image), roster_bytes) in banks.iter().zip(&rosters) {
            let dir = index.parent().unwrap_or(Path::new("."));
            let name = index
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let tag = format!(
                "{TMP_PREFIX}{name}.{}.{}",
                std::process::id(),
                files::now_ns()
            );
            let tmp = |suffix: &str| dir.join(format!("{tag}{suffix}"));
            let mut plan = Vec::new();
            for n in (0..image.segments.len()).rev() {
                plan.push((
                    tmp(&format::segment_suffix(n as u16)),
                    format::segment_path(index, n as u16),
                    Body::Heap(image, n),
                ));
            }
            plan.push((tmp(""), index.clone(), Body::Index(image)));
            plan.push((
                tmp(format::ROSTER_SUFFIX),
                format::roster_path(index),
                Body::Bytes(roster_bytes),
            ));
            plans.push(plan);
        }
        // Created one by one, in order; written and fsynced together.
        let mut jobs = Vec::new();
        let mut renames: Vec<Vec<(PathBuf, PathBuf)>> = Vec::new();
        for plan in plans {
            let mut r = Vec::with_capacity(plan.len());
            for (t, final_path, body) in plan {
                let f = files::create_new_unsynced(&t, &own.replacing(&final_path))?;
                jobs.push((t.clone(), f, body));
                r.push((t, final_path));
            }
            renames.push(r);
        }
        write_all(&jobs)?;
        drop(jobs);
        for ((index, image), r) in banks.iter().zip(renames) {
            // Segments of the old bank past the new image's last one.
            for old in heap::discover(index).into_iter().skip(image.segments.len()) {
                self.removals.push(old);
            }
            self.renames.extend(r);
            self.locks.push(format::lock_path(index));
            self.dir = Some(index.parent().unwrap_or(Path::new(".")).to_path_buf());
        }
        Ok(())
    }

    /// Journals the renames, performs them, removes stale segments and the
    /// journal. The caller holds the locks of every bank staged.
    ///
    /// `settle` is how long to keep the locks after the renames while other
    /// processes map the replaced files ([`DEFAULT_SETTLE`]).
    fn apply(self, settle: Duration) -> Result<()> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        files::sync_dir(&dir)?;
        // One journal per directory: rebuilds of the banks of one directory
        // (each under its own bank lock) take turns on it.
        let _journal_lock = lock_journal(&dir)?;
        // A journal a crash left half-written under its temporary name.
        remove_matching(&dir, |n| n.starts_with(JOURNAL_TMP_PREFIX))?;
        let held: Vec<String> = self.locks.iter().filter_map(|l| file_name(l)).collect();
        // A journal that a crash left for another bank of this directory.
        process_journal(&dir, &held, settle)?;
        let mut text = String::new();
        let name = |p: &Path| file_name(p).unwrap_or_default();
        for l in &self.locks {
            text.push_str(&format!("lock\t{}\n", name(l)));
        }
        for (a, b) in &self.renames {
            text.push_str(&format!("rename\t{}\t{}\n", name(a), name(b)));
        }
        for r in &self.removals {
            text.push_str(&format!("remove\t{}\n", name(r)));
        }
        text.push_str("end\n");
        let steps = parse_journal(&text).map_err(|why| Error::Corrupt {
            path: dir.join(JOURNAL),
            id: None,
            why: format!("journal about to be written is invalid: {why}"),
        })?;
        // The journal appears whole or not at all: written under a temporary
        // name, fsynced, renamed.
        let journal = dir.join(JOURNAL);
        let tmp = dir.join(format!("{JOURNAL_TMP_PREFIX}{}", std::process::id()));
        files::remove_if_exists(&tmp)?;
        write_file(&tmp, text.as_bytes(), &dir_ownership(&dir))?;
        files::rename(&tmp, &journal)?;
        files::sync_dir(&dir)?;
        finish(&dir, &steps, settle)
    }
}

/// How long a rebuild keeps its banks locked after renaming the new files
/// into place, unless set otherwise ([`crate::OpenOptions::rebuild_settle`]).
///
/// Salt 3008's writers re-check whether the index was replaced at most every
/// 0.25 s (`MmapCache.open`, `staleness_check_interval`), also under the
/// lock: a Salt writer that takes the lock within 0.25 s of its previous
/// check writes through its mapping of the old index, into the new heap by
/// path (an in-place rewrite lands on another record; an append's slot is
/// lost). Holding the lock a little longer than that interval after the
/// renames makes every Salt writer that gets it next re-check and map the
/// new files. The wait happens only when another process maps one of the
/// replaced files (found in `/proc/PID/maps`).
pub const DEFAULT_SETTLE: std::time::Duration = std::time::Duration::from_millis(300);

/// Prefix of a journal being written.
const JOURNAL_TMP_PREFIX: &str = ".keycache-journal.new.";
/// How long a roll-forward waits for the lock of another bank that its
/// journal names before giving up (the holder finishes the journal itself).
const OTHER_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn file_name(p: &Path) -> Option<String> {
    p.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Owner of the directory, mode 0600: what the journal gets, so that the
/// Salt master's user can finish a journal that root left.
fn dir_ownership(dir: &Path) -> Ownership {
    Ownership::for_dir(dir).unwrap_or(Ownership {
        owner: None,
        mode: files::DEFAULT_MODE,
        explicit: false,
    })
}

/// Takes the directory's journal lock (blocking): `flock` on the directory
/// itself, so the store holds no file beyond Salt's.
fn lock_journal(dir: &Path) -> Result<File> {
    let f = File::open(dir).map_err(|e| Error::io(dir, "open", e))?;
    f.lock().map_err(|e| Error::io(dir, "flock", e))?;
    Ok(f)
}

/// One step of a journal, with names relative to the journal's directory.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Lock(String),
    Rename(String, String),
    Remove(String),
}

/// Parses a complete journal. Every name is taken as a file of the
/// journal's own directory (journals of older versions held whole paths:
/// only their last component is used, so a moved or differently mounted
/// store still rolls forward, and no journal can reach outside it). Rename
/// sources must be rebuild temporaries; nothing may touch a journal file.
fn parse_journal(text: &str) -> std::result::Result<Vec<Step>, String> {
    let name = |s: &str| -> std::result::Result<String, String> {
        let n = Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("{s:?} names no file"))?;
        if n.starts_with(JOURNAL) {
            return Err(format!("{s:?} names a journal file"));
        }
        Ok(n)
    };
    let mut steps = Vec::new();
    let mut ended = false;
    for line in text.lines() {
        if ended {
            return Err("text after the end marker".into());
        }
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["lock", l] => steps.push(Step::Lock(name(l)?)),
            ["rename", a, b] => {
                let (a, b) = (name(a)?, name(b)?);
                if !a.starts_with(TMP_PREFIX) {
                    return Err(format!("rename source {a:?} is not a rebuild temporary"));
                }
                if b.starts_with(TMP_PREFIX) {
                    return Err(format!("rename target {b:?} is a rebuild temporary"));
                }
                steps.push(Step::Rename(a, b));
            }
            ["remove", r] => {
                let r = name(r)?;
                if r.starts_with(TMP_PREFIX) {
                    return Err(format!("removal of {r:?}, a rebuild temporary"));
                }
                steps.push(Step::Remove(r));
            }
            ["end"] => ended = true,
            _ => return Err(format!("unknown line {line:?}")),
        }
    }
    if !ended {
        return Err("no end marker".into());
    }
    Ok(steps)
}

/// Performs a journal's steps (each is idempotent) and removes it; then, if
/// files that another process maps were replaced, waits out Salt's
/// staleness interval (see [`DEFAULT_SETTLE`]) before the caller releases
/// the locks.
fn finish(dir: &Path, steps: &[Step], settle: Duration) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // The files about to be replaced, to look for them in other processes'
    // mappings afterwards.
    let replaced: Vec<(u64, u64)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Rename(a, b) if std::fs::symlink_metadata(dir.join(a)).is_ok() => {
                std::fs::symlink_metadata(dir.join(b))
                    .ok()
                    .map(|m| (m.dev(), m.ino()))
            }
            _ => None,
        })
        .collect();
    for s in steps {
        match s {
            Step::Rename(a, b) => {
                let (a, b) = (dir.join(a), dir.join(b));
                if std::fs::symlink_metadata(&a).is_ok() {
                    files::rename(&a, &b)?;
                }
            }
            Step::Remove(p) => files::remove_if_exists(&dir.join(p))?,
            Step::Lock(_) => {}
        }
    }
    files::sync_dir(dir)?;
    files::remove_if_exists(&dir.join(JOURNAL))?;
    files::sync_dir(dir)?;
    if !replaced.is_empty() && mapped_elsewhere(&replaced) {
        std::thread::sleep(settle);
    }
    Ok(())
}

/// Whether another process maps one of `files` ((dev, ino) pairs), as Salt
/// processes that used the bank do: only they can hold a stale view that
/// [`DEFAULT_SETTLE`] waits out. Processes whose maps this one may not read
/// are not seen.
fn mapped_elsewhere(files: &[(u64, u64)]) -> bool {
    // Linux's (glibc's) encoding of dev_t, as /proc/PID/maps prints it.
    let split = |dev: u64| {
        (
            ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
            (dev & 0xff) | ((dev >> 12) & !0xff),
        )
    };
    let wanted: Vec<((u64, u64), u64)> = files.iter().map(|&(d, i)| (split(d), i)).collect();
    let me = std::process::id().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str() else { continue };
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // Gone meanwhile, or not ours to read (another user's, when not
        // root: run rebuilds as root or as the master's user).
        let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) else {
            continue;
        };
        for line in maps.lines() {
            let mut f = line.split_ascii_whitespace().skip(3);
            let (Some(dev), Some(ino)) = (f.next(), f.next()) else {
                continue;
            };
            let Ok(ino) = ino.parse::<u64>() else {
                continue;
            };
            if ino == 0 {
                continue;
            }
            let Some((maj, min)) = dev.split_once(':') else {
                continue;
            };
            let (Ok(maj), Ok(min)) = (u64::from_str_radix(maj, 16), u64::from_str_radix(min, 16))
            else {
                continue;
            };
            if wanted.iter().any(|&(d, i)| d == (maj, min) && i == ino) {
                return true;
            }
        }
    }
    false
}

/// Finishes the journal of `dir`, if there is one, holding the journal lock.
/// `held` are the names of the bank lock files the caller holds; the other
/// banks' locks that the journal names are taken here (waiting at most
/// [`OTHER_LOCK_WAIT`]: their holder finishes the journal when it gets ours).
fn process_journal(dir: &Path, held: &[String], settle: Duration) -> Result<()> {
    let journal = dir.join(JOURNAL);
    let text = match files::open_regular(&journal, false) {
        Ok(mut f) => {
            let mut t = String::new();
            std::io::Read::read_to_string(&mut f, &mut t)
                .map_err(|e| Error::io(&journal, "read", e))?;
            t
        }
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    if !text.ends_with("end\n") {
        // Never completed (journals appear by a rename after their fsync, so
        // only a lost write leaves one): the renames never started. Drop it;
        // its temporaries go with the next rebuild of their bank.
        files::remove_if_exists(&journal)?;
        return files::sync_dir(dir);
    }
    let steps = parse_journal(&text).map_err(|why| Error::Corrupt {
        path: journal.clone(),
        id: None,
        why: format!("refusing to act on this journal ({why}); remove it if no keycache rebuild was interrupted"),
    })?;
    let mut locks = Vec::new();
    for s in &steps {
        let Step::Lock(l) = s else { continue };
        if held.contains(l) {
            continue;
        }
        let path = dir.join(l);
        let f = match files::open_regular(&path, true) {
            Ok(f) => f,
            // No lock file: nobody can hold it.
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                continue
            }
            Err(e) => return Err(e),
        };
        let deadline = std::time::Instant::now() + OTHER_LOCK_WAIT;
        loop {
            match f.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::io(
                        &path,
                        "flock (held by another process while an interrupted rebuild waits to be finished; retry)",
                        std::io::ErrorKind::WouldBlock.into(),
                    ))
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, "flock", e)),
            }
        }
        locks.push(f);
    }
    finish(dir, &steps, settle)?;
    drop(locks);
    Ok(())
}

/// Finishes a rebuild that a crash interrupted, if `dir` has a complete
/// journal. `held` is the lock file the caller already holds; the locks of
/// the other banks in the journal are taken here.
pub(crate) fn roll_forward(dir: &Path, held: Option<&Path>, settle: Duration) -> Result<()> {
    if std::fs::symlink_metadata(dir.join(JOURNAL)).is_err() {
        return Ok(());
    }
    let _journal_lock = lock_journal(dir)?;
    let held: Vec<String> = held.and_then(file_name).into_iter().collect();
    process_journal(dir, &held, settle)
}

/// Finishes a rebuild of a bank of `dir` that a crash interrupted, when it
/// left a complete journal (a no-op otherwise), taking the locks of the
/// banks it names. A tool that reads a store's layout off its files (the
/// table size from an index's length) calls this first: a compaction into
/// another size is half-way between the two sizes until its journal is done.
///
/// `settle` is [`crate::OpenOptions::rebuild_settle`].
pub fn finish_interrupted(dir: &Path, settle: Duration) -> Result<()> {
    roll_forward(dir, None, settle)
}

/// Removes leftovers of rebuilds killed before their journal was written,
/// and of index creations killed half-way (and roster rewrites, which
/// earlier versions made). The caller holds the lock of the banks concerned.
pub(crate) fn remove_temps_of(index: &Path) -> Result<()> {
    let dir = index.parent().unwrap_or(Path::new("."));
    let name = index
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!("{TMP_PREFIX}{name}.");
    // Also what a writer killed while creating the index left
    // (`I.keycache-new.PID`), and a roster rewrite of an earlier version
    // (`I.roster.keycache-new.PID`; roster recovery now patches in place):
    // both were made under this bank's lock, which the caller holds.
    let new_index = format!("{name}.keycache-new.");
    let new_roster = format!("{name}.roster.keycache-new.");
    remove_matching(dir, |n| {
        n.starts_with(&prefix) || n.starts_with(&new_index) || n.starts_with(&new_roster)
    })
}

fn remove_matching(dir: &Path, f: impl Fn(&str) -> bool) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "read directory", e))?;
    for e in rd.flatten() {
        let name = e.file_name();
        if let Some(n) = name.to_str() {
            if f(n) {
                files::remove_if_exists(&e.path())?;
            }
        }
    }
    Ok(())
}

/// Rebuilds `table` without garbage and tombstones, optionally into a table
/// of `size` slots, atomically. Entries keep their mtimes and roster order.
/// Refuses (changing nothing) when an entry cannot be read intact: run
/// `keycache verify --repair` first.
pub fn compact(table: &Table, size: Option<u64>) -> Result<()> {
    replace(&[table], || Ok(vec![compacted(table, size)?]))
}

/// Replaces the banks of `tables` (one or two banks of one directory, locked
/// in the order given) by the images that `build` makes under their locks,
/// in one atomic rebuild: leftovers of killed rebuilds are removed first,
/// then the images are staged under temporary names and renamed into place
/// through one journal. A failure of `build` (or a crash) changes nothing.
pub(crate) fn replace(tables: &[&Table], build: impl FnOnce() -> Result<Vec<Image>>) -> Result<()> {
    let Some(first) = tables.first() else {
        return Ok(());
    };
    let run = || -> Result<()> {
        for t in tables {
            remove_temps_of(t.path())?;
        }
        let images = build()?;
        if images.len() != tables.len() {
            return Err(Error::InvalidParams(format!(
                "a rebuild of {} banks was given {} images",
                tables.len(),
                images.len()
            )));
        }
        let banks = tables
            .iter()
            .zip(images)
            .map(|(t, image)| (t.path().to_path_buf(), image))
            .collect();
        let mut c = Commit::default();
        c.stage_all(banks, &first.ownership())?;
        c.apply(first.rebuild_settle())
    };
    match tables {
        [t] => t.exclusive(run),
        [k, d] => k.exclusive(|| d.exclusive(run)),
        _ => Err(Error::InvalidParams(
            "a rebuild replaces one or two banks".into(),
        )),
    }
}

/// The image of `table` compacted (see [`compact`]); the caller holds its
/// lock.
pub(crate) fn compacted(table: &Table, size: Option<u64>) -> Result<Image> {
    let mut params = *table.params();
    if let Some(s) = size {
        params.size = s;
    }
    let mut image = Image::new(params)?;
    for r in table.iter()? {
        let r = r?;
        image.insert(&r.id, &r.value, r.mtime, table.path())?;
    }
    Ok(image)
}
