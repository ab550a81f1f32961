//! A bank built in memory: what a rebuild (compaction, migration, repair)
//! writes. Only occupied slots are held, so building and writing an image
//! costs in proportion to its entries, not to the table size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{self, Header, Params, SlotFields, HDR_LEN, OCCUPIED};

/// Bytes of a segment written by one call: a writer that syncs early (see
/// `rebuild::syncing_early`) hears of progress at least this often.
const WRITE_CHUNK: usize = 8 << 20;

/// A bank built in memory: the occupied slots of its index, heap segments
/// and roster. Only occupied slots are held (the index is mostly zeros), so
/// building and writing an image costs in proportion to its entries, not to
/// the table size.
#[derive(Debug)]
pub struct Image {
    pub(crate) params: Params,
    /// For each slot: 0 when empty, else 1 + the number of the entry in it.
    occupant: Vec<u32>,
    /// The slot bytes of entry `e` at `e * slot_size`; entry `e` lives in
    /// slot `roster[e]`.
    slots: Vec<u8>,
    pub(crate) segments: Vec<SegmentImage>,
    /// Buffers holding records that segments refer to instead of copying
    /// them (see [`Image::insert_record`]).
    pub(crate) shared: SharedBuffers,
    pub(crate) roster: Vec<u32>,
    occupied: u64,
    hwm: u64,
    /// Ids of the bank being replaced that the caller means to leave out
    /// (see [`Image::allow_dropping`]).
    drops: std::collections::HashSet<Vec<u8>>,
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
            segments: vec![SegmentImage::default()],
            shared: SharedBuffers::default(),
            roster: Vec::new(),
            occupied: 0,
            hwm: 0,
            drops: Default::default(),
        })
    }

    /// An empty image whose records may lie in `shared` buffers (see
    /// [`Image::insert_record`]): they are written from there, not copied.
    pub(crate) fn with_shared(params: Params, shared: Vec<Arc<Vec<u8>>>) -> Result<Image> {
        let mut image = Image::new(params)?;
        image.shared = SharedBuffers(shared);
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

    /// Names `id`, an entry of the bank this image replaces, as one the
    /// caller means to leave out. A rebuild refuses to drop any live entry
    /// of the bank it replaces that the image neither holds nor names here.
    pub fn allow_dropping(&mut self, id: &[u8]) {
        self.drops.insert(id.to_vec());
    }

    /// Whether the image holds `id` or names it as dropped on purpose.
    pub(crate) fn accounts_for(&self, id: &[u8]) -> bool {
        self.drops.contains(id) || self.find(id).is_some_and(|(_, e)| e.is_some())
    }

    /// The slot where `id` is or would go, and its entry number when it is
    /// there; `None` when the table is full.
    fn find(&self, id: &[u8]) -> Option<(u64, Option<u32>)> {
        let p = self.params;
        let home = p.home(id);
        for step in 0..p.capacity() {
            let slot = p.probe(home, step);
            let e = self.occupant[slot as usize];
            if e == 0 {
                return Some((slot, None));
            }
            let off = (e - 1) as usize * p.slot_size;
            if format::slot_id_eq(&p, &self.slots[off..off + p.slot_used()], id) {
                return Some((slot, Some(e - 1)));
            }
        }
        None
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
        append: impl FnOnce(&mut SegmentImage),
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
        let Some((slot, existing)) = self.find(id) else {
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
            self.segments.push(SegmentImage::default());
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
    pub(crate) fn write_index(
        &self,
        f: &File,
        path: &Path,
        written: &mut dyn FnMut(u64),
    ) -> Result<()> {
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
pub(crate) struct SharedBuffers(Vec<Arc<Vec<u8>>>);

impl std::fmt::Debug for SharedBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|b| b.len()))
            .finish()
    }
}

/// One heap segment of an image: its records, in order, as runs of bytes
/// of its own buffer or of the image's shared buffers.
#[derive(Debug, Default)]
pub(crate) struct SegmentImage {
    /// Records inserted by value.
    owned: Vec<u8>,
    /// (None: `owned`, or Some(shared buffer), start, end), in file order.
    runs: Vec<(Option<usize>, usize, usize)>,
    /// Bytes of the segment.
    pub(crate) len: u64,
}

impl SegmentImage {
    /// Appends bytes `start..end` of `buf` to the segment, extending the last
    /// run when they follow it.
    fn push_run(&mut self, buf: Option<usize>, start: usize, end: usize) {
        match self.runs.last_mut() {
            Some(r) if r.0 == buf && r.2 == start => r.2 = end,
            _ => self.runs.push((buf, start, end)),
        }
    }

    /// Writes the segment at the start of `f`.
    pub(crate) fn write(
        &self,
        shared: &SharedBuffers,
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
            for piece in src.chunks(WRITE_CHUNK) {
                f.write_all_at(piece, at)
                    .map_err(|e| Error::io(path, "write", e))?;
                at += piece.len() as u64;
                written(piece.len() as u64);
            }
        }
        Ok(())
    }
}
