//! Heap segments: append-only files of checksummed records.
//!
//! A reader maps each segment with address space reserved past its current
//! end (at least the segment cap), so appends by any writer become readable
//! without remapping. Before touching bytes past the length it last saw, a
//! reader re-reads the file's length, so a record that points past the end
//! of its segment is reported as corrupt instead of faulting.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
pub(crate) use crate::format::discover;
use crate::format::{self, CHECKSUM_LEN};
use crate::map::Mapping;

/// Granularity of the address space reserved for a segment.
const RESERVE_ALIGN: u64 = 1 << 20;

pub(crate) use crate::format::segment_path;

/// One mapped heap segment.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    /// Identity of the file, to notice it was replaced.
    pub(crate) ino: u64,
    map: Mapping,
    /// The file length last observed.
    known_len: AtomicU64,
}

/// What a read of a record found.
pub(crate) enum RecordRead {
    /// The record's value, checksum verified, was appended to the buffer.
    Value,
    /// The record's bytes do not match their checksum (torn or corrupt).
    Mismatch,
    /// The record lies past the reserved mapping: remap and retry.
    Remap,
    /// The record runs past the end of the file.
    PastEnd { file_len: u64 },
}

/// The most of a record that a lookup prefetches (64 cache lines); a key
/// record is about 460 bytes.
const PREFETCH_MAX: u64 = 4096;

impl Segment {
    /// Opens and maps a segment, reserving room for growth up to `cap`.
    pub(crate) fn open(path: &Path, cap: u64, need: u64) -> Result<Segment> {
        let file = crate::files::open_regular(path, false)?;
        let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
        let len = meta.len();
        let reserve = len.max(cap).max(need).max(1).div_ceil(RESERVE_ALIGN) * RESERVE_ALIGN;
        let reserve = usize::try_from(reserve).map_err(|_| Error::Corrupt {
            path: path.into(),
            id: None,
            why: format!("segment of {len} bytes cannot be mapped on this platform"),
        })?;
        let map = Mapping::read_only(&file, reserve).map_err(|e| Error::io(path, "mmap", e))?;
        map.advise_huge();
        Ok(Segment {
            path: path.into(),
            ino: std::os::unix::fs::MetadataExt::ino(&meta),
            file,
            map,
            known_len: AtomicU64::new(len),
        })
    }

    /// Bytes of address space mapped for this segment.
    pub(crate) fn reserved(&self) -> u64 {
        self.map.len() as u64
    }

    /// Current length of the segment file.
    pub(crate) fn file_len(&self) -> Result<u64> {
        let len = self
            .file
            .metadata()
            .map_err(|e| Error::io(&self.path, "stat", e))?
            .len();
        // The length as last seen, not the largest ever seen: a file cut
        // short by someone else is then noticed before its missing pages
        // are touched (which would raise SIGBUS).
        self.known_len.store(len, Ordering::Relaxed);
        Ok(len)
    }

    /// Starts loading every cache line of the record of `len` value bytes
    /// at `off`, so that their misses overlap instead of following one
    /// another as the copy walks the record. At most [`PREFETCH_MAX`] bytes,
    /// so a damaged length costs nothing here; lines past the mapping are
    /// skipped by [`Mapping::prefetch`](crate::map::Mapping::prefetch).
    #[inline]
    pub(crate) fn prefetch_record(&self, off: u64, len: u32) {
        let end = off.saturating_add(format::record_len(len as usize).min(PREFETCH_MAX));
        let mut line = off & !63;
        while line < end {
            self.map.prefetch(line as usize);
            line += 64;
        }
    }

    /// Reads the record of `len` value bytes at byte offset `off`, checks
    /// it, and appends its value to `out` (which is left as it was unless
    /// the answer is [`RecordRead::Value`]).
    pub(crate) fn read_into(&self, off: u64, len: u32, out: &mut Vec<u8>) -> Result<RecordRead> {
        if len == 0 {
            return Ok(RecordRead::Value);
        }
        let end = off.saturating_add(CHECKSUM_LEN as u64 + u64::from(len));
        if end > self.known_len.load(Ordering::Relaxed) {
            let file_len = self.file_len()?;
            if end > file_len {
                // The file may have been replaced or truncated; never touch it.
                return Ok(RecordRead::PastEnd { file_len });
            }
        }
        if end > self.reserved() {
            return Ok(RecordRead::Remap);
        }
        let off = off as usize;
        let mut sum = [0u8; CHECKSUM_LEN];
        let at = out.len();
        if !self.map.copy_out(off, &mut sum)
            || !self.map.append_to(off + CHECKSUM_LEN, len as usize, out)
        {
            return Ok(RecordRead::Remap);
        }
        if !format::record_matches(&sum, &out[at..]) {
            out.truncate(at);
            // A file truncated under us reads as zeros up to the end of its
            // last page: say so, and remember the new length.
            let file_len = self.file_len()?;
            if end > file_len {
                return Ok(RecordRead::PastEnd { file_len });
            }
            return Ok(RecordRead::Mismatch);
        }
        Ok(RecordRead::Value)
    }
}

/// The mapped heap segments of a view, by segment number; a segment whose
/// file is missing is a hole, and the segments past it are still mapped.
#[derive(Debug, Default)]
pub(crate) struct Segments(Vec<Option<Arc<Segment>>>);

impl Segments {
    /// Segment `n`, when its file was there.
    #[inline]
    pub(crate) fn get(&self, n: usize) -> Option<&Arc<Segment>> {
        self.0.get(n).and_then(Option::as_ref)
    }

    /// The segments mapped, in segment order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Segment>> {
        self.0.iter().flatten()
    }

    /// Adds the next segment number (`None`: its file is missing).
    pub(crate) fn push(&mut self, s: Option<Arc<Segment>>) {
        self.0.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn segment_names_follow_salt() {
        let i = Path::new("/d/.mmap_keys.idx");
        assert_eq!(segment_path(i, 0), Path::new("/d/.mmap_keys.idx.heap"));
        assert_eq!(segment_path(i, 2), Path::new("/d/.mmap_keys.idx.heap.2"));
    }

    #[test]
    fn reads_check_bounds_checksum_and_growth() {
        let dir = tempfile::tempdir().unwrap();
        let idx = dir.path().join("t.idx");
        let p = segment_path(&idx, 0);
        let mut f = std::fs::File::create(&p).unwrap();
        let mut rec = Vec::new();
        format::encode_record(b"hello", &mut rec);
        f.write_all(&rec).unwrap();
        let seg = Segment::open(&p, 4096, 0).unwrap();
        let read = |off, len| {
            let mut v = b"kept".to_vec();
            let r = seg.read_into(off, len, &mut v).unwrap();
            (r, v)
        };
        assert!(matches!(read(0, 5), (RecordRead::Value, v) if v == b"kepthello"));
        assert!(matches!(read(0, 4), (RecordRead::Mismatch, v) if v == b"kept"));
        assert!(matches!(
            read(1, 5),
            (RecordRead::PastEnd { file_len: 13 }, v) if v == b"kept"
        ));
        assert!(matches!(
            read(u64::MAX - 3, 5),
            (RecordRead::PastEnd { .. }, _)
        ));
        // Growth after mapping is seen without remapping.
        let mut rec2 = Vec::new();
        format::encode_record(b"world!", &mut rec2);
        f.write_all(&rec2).unwrap();
        assert!(matches!(read(13, 6), (RecordRead::Value, v) if v == b"keptworld!"));
        assert_eq!(discover(&idx), vec![p]);
    }
}
