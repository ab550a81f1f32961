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
//! Salt's included, and is documented in docs/design.md.)

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

    /// Loads one byte with acquire semantics (a slot's status byte).
    ///
    /// Readers map the files read-only, and std promises only relaxed loads
    /// on read-only memory (an acquire load may be compiled to a
    /// read-modify-write on some targets), so this is a relaxed load
    /// followed by an acquire fence: the fence makes the writes that came
    /// before the release store of the byte visible, as an acquire load
    /// would. On x86 and aarch64 both cost the same.
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
        let v = a.load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        Some(v)
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
        // SAFETY: `off..off + dst.len()` is inside the mapping (checked
        // above) and `dst` is valid for `dst.len()` byte writes.
        unsafe { self.copy_raw(off, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Appends the `len` bytes starting at `off` to `out`, like
    /// [`Mapping::copy_out`] but without zero-filling room for them first
    /// (a lookup's value is copied once, straight into what it returns).
    /// Returns false, and appends nothing, when the range is outside the
    /// mapping.
    #[inline]
    pub(crate) fn append_to(&self, off: usize, len: usize, out: &mut Vec<u8>) -> bool {
        if !self.in_bounds(off, len) {
            return false;
        }
        if out.capacity() == 0 {
            // A lookup's own vector: allocated once, at the value's size.
            *out = Vec::with_capacity(len);
        } else {
            out.reserve(len);
        }
        let at = out.len();
        // SAFETY: `off..off + len` is inside the mapping (checked above);
        // `reserve` left room for `len` more bytes after the `at` bytes in
        // use, and `copy_raw` writes every one of them before `set_len`
        // makes them part of the vector.
        unsafe {
            self.copy_raw(off, out.as_mut_ptr().add(at), len);
            out.set_len(at + len);
        }
        true
    }

    /// Copies `n` bytes at `off` to `dst` with relaxed atomic loads: single
    /// bytes up to the first 8-aligned address, then 32 and 8 bytes at a
    /// time as aligned `u64` loads, then the last bytes.
    ///
    /// # Safety
    ///
    /// `off + n` must not exceed the mapping's length, and `dst` must be
    /// valid for `n` byte writes and not overlap the mapping.
    #[inline(always)]
    unsafe fn copy_raw(&self, off: usize, dst: *mut u8, n: usize) {
        // SAFETY: for every access below, the caller guarantees that
        // `off..off + n` lies inside the mapping, which stays mapped as long
        // as `self` lives, and that `dst` takes `n` bytes; every index used
        // is below `n`. Loads of mapped memory are atomic (no `&AtomicU*`
        // ever aliases a non-atomic access, see `load_u8`); the `u64` loads
        // are 8-aligned because `lead` bytes were copied one by one first.
        // Stores go to `dst`, plain memory of the caller's, unaligned.
        unsafe {
            let src = self.raw.as_mut_ptr().add(off);
            let lead = (src as usize).wrapping_neg() & 7;
            let lead = lead.min(n);
            let mut i = 0;
            while i < lead {
                *dst.add(i) = AtomicU8::from_ptr(src.add(i)).load(Ordering::Relaxed);
                i += 1;
            }
            let word =
                |i: usize| AtomicU64::from_ptr(src.add(i).cast::<u64>()).load(Ordering::Relaxed);
            while i + 32 <= n {
                let (a, b, c, d) = (word(i), word(i + 8), word(i + 16), word(i + 24));
                let p = dst.add(i).cast::<u64>();
                p.write_unaligned(a);
                p.add(1).write_unaligned(b);
                p.add(2).write_unaligned(c);
                p.add(3).write_unaligned(d);
                i += 32;
            }
            while i + 8 <= n {
                dst.add(i).cast::<u64>().write_unaligned(word(i));
                i += 8;
            }
            while i < n {
                *dst.add(i) = AtomicU8::from_ptr(src.add(i)).load(Ordering::Relaxed);
                i += 1;
            }
        }
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
        // Every alignment and length around the 8- and 32-byte steps.
        for off in 0..16 {
            for n in [
                0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 451, 984,
            ] {
                let mut buf = vec![0xAAu8; n];
                assert!(m.copy_out(off, &mut buf));
                assert_eq!(buf, &data[off..off + n], "copy_out({off}, {n})");
                let mut v = b"kept".to_vec();
                assert!(m.append_to(off, n, &mut v));
                assert_eq!(&v[..4], b"kept");
                assert_eq!(&v[4..], &data[off..off + n], "append_to({off}, {n})");
            }
        }
        // A mapping whose length is not a multiple of 8: its last bytes
        // are copied without reading past it.
        let m2 = Mapping::read_write(&f, 997).unwrap();
        for off in 970..997 {
            for n in 0..=(997 - off) {
                let mut buf = vec![0xAAu8; n];
                assert!(m2.copy_out(off, &mut buf));
                assert_eq!(buf, &data[off..off + n], "997: copy_out({off}, {n})");
            }
        }
        let mut v = b"kept".to_vec();
        assert!(!m.append_to(990, 11, &mut v));
        assert!(!m.append_to(usize::MAX, 2, &mut v));
        assert_eq!(v, b"kept");
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
