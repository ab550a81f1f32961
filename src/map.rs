//! The memory mappings, and the only `unsafe` code in the crate.
//!
//! Mapped bank files are shared: other threads of this process, other
//! keycache processes and Salt's Python writers may change any byte at any
//! moment. So this module never turns mapped memory into a Rust reference to
//! plain bytes (`&[u8]`, `&mut [u8]`): every access is an atomic load or
//! store through a raw pointer, and readers only ever get *copies*, which the
//! callers check (status byte, id, xxh3 checksum) before trusting them.
//!
//! Every access is bounds-checked against the mapping's length, and callers
//! bound it further by the file's length, so a short or damaged file yields
//! an error rather than SIGBUS. (A file truncated by someone else *while* it
//! is mapped can still raise SIGBUS: that is true of every mmap reader,
//! Salt's included, and is documented in README.)

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use memmap2::{MmapOptions, MmapRaw};

/// A shared mapping of a file, read (and for writers, written) only through
/// atomic operations.
pub(crate) struct Mapping {
    raw: MmapRaw,
    writable: bool,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("len", &self.raw.len())
            .field("writable", &self.writable)
            .finish()
    }
}

impl Mapping {
    /// Maps `len` bytes of `file` for reading. `len` may exceed the file's
    /// current length (address space reserved for growth); callers must not
    /// read past the file's length.
    pub(crate) fn read_only(file: &File, len: usize) -> io::Result<Mapping> {
        let raw = MmapOptions::new().len(len).map_raw_read_only(file)?;
        Ok(Mapping {
            raw,
            writable: false,
        })
    }

    /// Asks the kernel to back the mapping with huge pages where it can
    /// (file-backed large folios): lookups in a table of a million slots
    /// spend most of their time in TLB misses otherwise. Best effort.
    pub(crate) fn advise_huge(&self) {
        let _ = self.raw.advise(memmap2::Advice::HugePage);
    }

    /// Maps `len` bytes of `file` for reading and writing; the file must be
    /// opened read-write and be at least `len` bytes long.
    pub(crate) fn read_write(file: &File, len: usize) -> io::Result<Mapping> {
        let raw = MmapOptions::new().len(len).map_raw(file)?;
        Ok(Mapping {
            raw,
            writable: true,
        })
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether `off..off + n` lies inside the mapping.
    #[inline]
    fn in_bounds(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.raw.len())
    }

    /// Loads one byte with acquire ordering (a slot's status byte).
    #[inline]
    pub(crate) fn load_u8(&self, off: usize) -> Option<u8> {
        if !self.in_bounds(off, 1) {
            return None;
        }
        // SAFETY: `off` is inside the mapping (checked above), which stays
        // mapped as long as `self` lives; a byte has no alignment to meet;
        // every access to mapped memory in this process is atomic, so the
        // `&AtomicU8` never aliases a non-atomic access.
        let a = unsafe { AtomicU8::from_ptr(self.raw.as_mut_ptr().add(off)) };
        Some(a.load(Ordering::Acquire))
    }

    /// Copies `dst.len()` bytes starting at `off` into `dst`, with relaxed
    /// atomic loads (8 bytes at a time where aligned). Returns false, and
    /// copies nothing, when the range is outside the mapping.
    ///
    /// The copy may mix bytes from before and after a concurrent write:
    /// callers validate it (checksum, re-read of the slot).
    #[inline]
    pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.in_bounds(off, dst.len()) {
            return false;
        }
        let base = self.raw.as_mut_ptr();
        let mut i = 0;
        let n = dst.len();
        // Leading bytes up to the first 8-aligned address.
        while i < n && !(base as usize + off + i).is_multiple_of(8) {
            // SAFETY: `off + i < off + n <= len`: inside the mapping; bytes
            // need no alignment; all accesses are atomic (see `load_u8`).
            let a = unsafe { AtomicU8::from_ptr(base.add(off + i)) };
            dst[i] = a.load(Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= n {
            // SAFETY: `off + i + 8 <= off + n <= len`: inside the mapping;
            // the loop above made `base + off + i` 8-aligned and it stays so
            // in steps of 8; all accesses are atomic (see `load_u8`).
            let a = unsafe { AtomicU64::from_ptr(base.add(off + i).cast::<u64>()) };
            dst[i..i + 8].copy_from_slice(&a.load(Ordering::Relaxed).to_ne_bytes());
            i += 8;
        }
        while i < n {
            // SAFETY: as for the leading bytes.
            let a = unsafe { AtomicU8::from_ptr(base.add(off + i)) };
            dst[i] = a.load(Ordering::Relaxed);
            i += 1;
        }
        true
    }

    /// Hints the CPU to start loading the cache line at `off` (no effect
    /// out of bounds or on other architectures).
    #[inline]
    pub(crate) fn prefetch(&self, off: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.in_bounds(off, 1) {
            // SAFETY: a prefetch reads nothing into the program and cannot
            // fault; the address is inside the mapping anyway (checked).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    self.raw.as_ptr().add(off).cast::<i8>(),
                )
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    /// Stores one byte with release ordering (a slot's status byte, set last).
    pub(crate) fn store_u8(&self, off: usize, v: u8) -> bool {
        if !self.writable || !self.in_bounds(off, 1) {
            return false;
        }
        // SAFETY: inside a writable mapping (checked above); bytes need no
        // alignment; all accesses are atomic (see `load_u8`).
        let a = unsafe { AtomicU8::from_ptr(self.raw.as_mut_ptr().add(off)) };
        a.store(v, Ordering::Release);
        true
    }

    /// Copies `src` into the mapping at `off` with relaxed atomic byte
    /// stores. Returns false, and writes nothing, when out of bounds or
    /// read-only.
    pub(crate) fn copy_in(&self, off: usize, src: &[u8]) -> bool {
        if !self.writable || !self.in_bounds(off, src.len()) {
            return false;
        }
        let base = self.raw.as_mut_ptr();
        for (i, &b) in src.iter().enumerate() {
            // SAFETY: `off + i < off + src.len() <= len`, inside a writable
            // mapping; bytes need no alignment; all accesses are atomic.
            let a = unsafe { AtomicU8::from_ptr(base.add(off + i)) };
            a.store(b, Ordering::Relaxed);
        }
        true
    }

    /// Writes back the pages covering `off..off + len` and waits for them
    /// (msync with MS_SYNC).
    pub(crate) fn flush_range(&self, off: usize, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = off.saturating_add(len).min(self.raw.len());
        if off >= end {
            return Ok(());
        }
        self.raw.flush_range(off, end - off)
    }
}

/// `posix_fallocate(f, 0, len)`: returns 0 or an errno value.
pub(crate) fn fallocate(f: &File, len: libc::off_t) -> i32 {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fallocate takes a file descriptor and two integers and
    // touches no memory of ours; the descriptor is open for the borrow of `f`.
    unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len) }
}

/// A cheap monotonic clock in nanoseconds (CLOCK_MONOTONIC_COARSE, a few
/// milliseconds of resolution), for the readers' staleness checks.
#[inline]
pub(crate) fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one `timespec` into `ts`, which is a
    // valid, exclusively borrowed local.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn copies_are_bounds_checked_and_exact() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        f.write_all(&data).unwrap();
        let m = Mapping::read_write(&f, 1000).unwrap();
        for (off, n) in [(0, 0), (0, 1000), (3, 17), (7, 9), (8, 16), (999, 1)] {
            let mut buf = vec![0u8; n];
            assert!(m.copy_out(off, &mut buf));
            assert_eq!(buf, &data[off..off + n]);
        }
        let mut buf = [0u8; 2];
        assert!(!m.copy_out(999, &mut buf));
        assert!(!m.copy_out(usize::MAX, &mut buf));
        assert_eq!(m.load_u8(1000), None);
        assert!(m.copy_in(5, b"hello"));
        assert!(!m.copy_in(998, b"abc"));
        assert!(m.store_u8(0, 7));
        assert_eq!(m.load_u8(0), Some(7));
        let mut out = [0u8; 5];
        assert!(m.copy_out(5, &mut out));
        assert_eq!(&out, b"hello");
    }

    #[test]
    fn read_only_mappings_refuse_writes() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[1, 2, 3, 4]).unwrap();
        let m = Mapping::read_only(&f, 4).unwrap();
        assert!(!m.store_u8(0, 9));
        assert!(!m.copy_in(0, &[9]));
        assert_eq!(m.load_u8(0), Some(1));
    }
}
