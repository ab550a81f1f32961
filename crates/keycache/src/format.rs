//! Salt 3008's `mmap_key` layout: every byte of it, in one place. Nothing
//! else in the crate encodes or decodes a field, names a bank file, or
//! computes a checksum; offsets are derived from the field widths below.
//!
//! A bank is an index file `I` (`.mmap_keys.idx`, `.mmap_denied.idx`,
//! `.mmap_master.idx`), heap segments `I.heap`, `I.heap.1`, ..., a roster
//! `I.roster` and a lock file `I.lock` (`flock`ed by every writer, Salt's
//! included); [`bank_files`] lists them. keycache adds `I.keycache-lost`
//! (what a repair could not keep, [`lost_path`]) and creates a new index
//! as `I.keycache-new.<pid>` ([`new_index_path`]). All integers are
//! little-endian.
//!
//! ```text
//! index file: size * slot_size bytes
//!
//! slot 0 (header)               data slot i (1 <= i < size), at i * slot_size
//! +--------+------------------+ +--------+------------+--------+--------+--------+---------+
//! | 0      | magic 0xAB       | | 0      | 1 .. 1+K   | 1+K    | 9+K    | 13+K   | 21+K .. |
//! | 1..9   | occupied, u64    | | status | id, UTF-8, | packed | value  | mtime  | zero    |
//! | 9..17  | deleted, u64     | | 0/1/2  | NUL-padded | heap   | length | unix   | padding |
//! | 17..25 | high-water, u64  | |  u8    |  K bytes   | offset | u32    | ns u64 |         |
//! | 25..   | reserved, zero   | +--------+------------+--------+--------+--------+---------+
//! +--------+------------------+   K = id_size; packed offset = segment << 48 | byte offset
//!
//! heap record:  [xxh3(value): u64][value]      (a zero-length value writes nothing)
//! roster:       [slot: u32]*  in insertion order, 0xFFFF_FFFF = tombstone
//! ```
//!
//! Home slot of an id: `xxh3(id) % (size - 1) + 1`; probe step `j` visits
//! `(home - 1 + j) % (size - 1) + 1`, wrapping over data slots only.
//!
//! The values of the key banks (`[state byte][PEM]` in `keys`, the PEM in
//! `denied_keys`) are encoded in [`crate::store`]: they are keycache's
//! reading of Salt's driver, not part of the table layout.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Index file of the `keys` bank (accepted, pending and rejected keys).
pub const KEYS_INDEX: &str = ".mmap_keys.idx";
/// Index file of the `denied_keys` bank.
pub const DENIED_INDEX: &str = ".mmap_denied.idx";
/// Index file of the `master_keys` bank (the master's own key files).
pub const MASTER_INDEX: &str = ".mmap_master.idx";
/// Suffix of heap segment 0; segment `n > 0` adds `.n`.
pub const HEAP_SUFFIX: &str = ".heap";
/// Suffix of the roster file.
pub const ROSTER_SUFFIX: &str = ".roster";
/// Suffix of the lock file.
pub const LOCK_SUFFIX: &str = ".lock";
/// Suffix of keycache's lost-entries file (Salt ignores it).
pub const LOST_SUFFIX: &str = ".keycache-lost";
/// Suffix (before `.<pid>`) of a new index file while it is created.
pub const NEW_INDEX_SUFFIX: &str = ".keycache-new";

/// The history's versions file, keycache's own, in the store directory
/// (drawn in `docs/format.md`, "History files"; keycache-merge's `history`).
pub const HISTORY_FILE: &str = ".keycache-history";
/// The history's identity file, in the store directory: a store that has
/// one takes part in merges.
pub const IDENTITY_FILE: &str = ".keycache-identity";
/// The removal log, in the store directory ([`crate::removals`]).
pub const REMOVALS_FILE: &str = ".keycache-removed";
/// The replica's state, in the store directory of a master whose store is
/// a replica of etcd (the `keycache-etcd` crate): the etcd cluster and
/// prefix, and the revision the store holds.
pub const REPLICA_FILE: &str = ".keycache-etcd";

/// The revision the etcd replicator is applying, beside [`REPLICA_FILE`]:
/// 8 bytes, little-endian, written in place before each batch.
pub const APPLYING_FILE: &str = ".keycache-etcd-applying";

/// The etcd replicator's lock, beside [`REPLICA_FILE`]: held (`flock`,
/// exclusive) for the replicator's lifetime, so that one replicator at a
/// time writes a store; it holds the holder's pid, for the message.
pub const REPLICATOR_LOCK_FILE: &str = ".keycache-etcd.lock";

/// The intent record of the key tree's writes, in the store directory
/// (`crate::tree`'s `intent` module): the ids a write is about to change in
/// the tree, durable before the banks are written, cleared once the tree
/// is in step; the next writer finishes what a killed one left.
pub const TREE_INTENT_FILE: &str = ".keycache-tree-intent";
/// The audit trail, in the store directory ([`crate::audit`]): one JSON
/// record a line, rotated to `<name>.1` .. `<name>.4`.
pub const AUDIT_LOG_FILE: &str = ".keycache-audit.log";

/// The roll-forward journal of a rebuild, in the store directory
/// (`crate::journal`).
pub const JOURNAL: &str = ".keycache-journal";
/// Prefix of a journal being written (before `<pid>`).
pub const JOURNAL_TMP_PREFIX: &str = ".keycache-journal.new.";
/// Prefix of the temporary files of a rebuild in progress.
pub const TMP_PREFIX: &str = ".keycache-tmp.";
/// Prefix of the temporary files a key tree write creates in a state
/// directory (`crate::tree`).
pub const TREE_TEMP_PREFIX: &str = ".keycache-tree.";
/// Prefix of every file keycache creates (in the store directory, beside
/// key files in the tree, in an export): never a key.
pub const KEYCACHE_PREFIX: &str = ".keycache-";

/// Byte 0 of an index that a keycache rebuild replaced (or is about to
/// replace: the mark is written when its journal is finished, right before
/// the renames): readers that still map it stat the index path before their
/// next lookup instead of waiting for [`crate::OpenOptions::refresh`]. Salt's
/// readers never read byte 0 (slot 0 is the header; probing covers slots
/// 1 and up). Until the renames the marked index is still the bank's, and
/// lookups cost a `stat` each; a writer finishes an interrupted journal
/// before it writes, so no writer ever writes to a marked index.
pub const RETIRED_MAGIC: u8 = 0x52;

/// Width of a slot's status byte.
pub const STATUS_LEN: usize = 1;
/// Width of a slot's packed heap offset.
pub const OFFSET_LEN: usize = 8;
/// Width of a slot's value length.
pub const LENGTH_LEN: usize = 4;
/// Width of a slot's mtime.
pub const MTIME_LEN: usize = 8;
/// Width of each header counter.
pub const COUNTER_LEN: usize = 8;
/// Bytes of checksum in front of every heap record.
pub const CHECKSUM_LEN: usize = 8;
/// Width of a roster entry.
pub const ROSTER_ENTRY_LEN: usize = 4;

/// Header magic in byte 0 of slot 0, stamped when a writer first opens the file.
pub const HEADER_MAGIC: u8 = 0xAB;
/// Slot status: never used.
pub const EMPTY: u8 = 0;
/// Slot status: holds a live entry.
pub const OCCUPIED: u8 = 1;
/// Slot status: held an entry that was removed; probing continues past it.
pub const DELETED: u8 = 2;

/// Header field: occupied count, u64 (after the magic byte).
pub const HDR_OCCUPIED: usize = 1;
/// Header field: deleted count, u64.
pub const HDR_DELETED: usize = HDR_OCCUPIED + COUNTER_LEN;
/// Header field: high-water mark (highest data slot ever written), u64.
pub const HDR_HWM: usize = HDR_DELETED + COUNTER_LEN;
/// Bytes of slot 0 that the header uses.
pub const HDR_LEN: usize = HDR_HWM + COUNTER_LEN;

/// Status byte, and the three pointer fields: the fixed part of a slot
/// (the id comes on top).
pub const SLOT_FIXED: usize = STATUS_LEN + OFFSET_LEN + LENGTH_LEN + MTIME_LEN;
/// Bits of a packed heap offset that hold the byte offset; the segment is above.
pub const SEGMENT_SHIFT: u32 = 48;
/// Mask of the byte-offset part of a packed heap offset.
pub const OFFSET_MASK: u64 = (1 << SEGMENT_SHIFT) - 1;
/// Roster entry of a removed id.
pub const ROSTER_TOMBSTONE: u32 = u32::MAX;

/// Salt's default `mmap_key_size`.
pub const DEFAULT_SIZE: u64 = 1_000_000;
/// Salt's default `mmap_key_slot_size`.
pub const DEFAULT_SLOT_SIZE: usize = 96;
/// Salt's default `mmap_key_id_size`.
pub const DEFAULT_ID_SIZE: usize = 64;
/// Salt's default heap segment cap (1 GiB).
pub const DEFAULT_MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// The smallest slot that holds an id of `id_size` bytes (Salt's `_min_slot_size`).
pub const fn min_slot_size(id_size: usize) -> usize {
    let s = SLOT_FIXED + id_size;
    if s > HDR_LEN {
        s
    } else {
        HDR_LEN
    }
}

/// The parameters of a table. They live in the Salt master config, not in the
/// files, so a reader must be told them; Salt's defaults unless given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Params {
    /// Slots in the index, slot 0 (the header) included (`mmap_key_size`).
    pub size: u64,
    /// Bytes per slot (`mmap_key_slot_size`).
    pub slot_size: usize,
    /// Bytes of minion id per slot (`mmap_key_id_size`).
    pub id_size: usize,
    /// Cap of one heap segment (`mmap_key_max_segment_bytes`).
    pub max_segment_bytes: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            size: DEFAULT_SIZE,
            slot_size: DEFAULT_SLOT_SIZE,
            id_size: DEFAULT_ID_SIZE,
            max_segment_bytes: DEFAULT_MAX_SEGMENT_BYTES,
        }
    }
}

impl Params {
    /// Checks that the parameters describe a table Salt can open.
    pub fn validate(&self) -> Result<()> {
        if self.size < 2 {
            return Err(Error::InvalidParams(format!(
                "size {} leaves no data slot (slot 0 is the header); use at least 2",
                self.size
            )));
        }
        if self.size > u64::from(u32::MAX) {
            return Err(Error::InvalidParams(format!(
                "size {} does not fit the roster's u32 slot numbers",
                self.size
            )));
        }
        if self.id_size == 0 {
            return Err(Error::InvalidParams("id size 0 holds no id".into()));
        }
        let min = min_slot_size(self.id_size);
        if self.slot_size < min {
            return Err(Error::InvalidParams(format!(
                "slot size {} is too small for id size {}; the minimum is {}",
                self.slot_size, self.id_size, min
            )));
        }
        if self.index_len().is_none() {
            return Err(Error::InvalidParams(format!(
                "size {} x slot size {} overflows",
                self.size, self.slot_size
            )));
        }
        if self.max_segment_bytes == 0 || self.max_segment_bytes > OFFSET_MASK {
            return Err(Error::InvalidParams(format!(
                "segment cap {} must be between 1 and {}",
                self.max_segment_bytes, OFFSET_MASK
            )));
        }
        Ok(())
    }

    /// Length in bytes of the index file, `size * slot_size`.
    pub fn index_len(&self) -> Option<u64> {
        self.size.checked_mul(self.slot_size as u64)
    }

    /// Number of data slots, `size - 1`.
    pub fn capacity(&self) -> u64 {
        self.size - 1
    }

    /// The home slot of an id.
    #[inline]
    pub fn home(&self, id: &[u8]) -> u64 {
        hash(id) % (self.size - 1) + 1
    }

    /// The slot visited at probe step `step` from `home`.
    #[inline]
    pub fn probe(&self, home: u64, step: u64) -> u64 {
        (home - 1 + step) % (self.size - 1) + 1
    }

    /// Byte offset of slot `slot` in the index file.
    #[inline]
    pub fn slot_offset(&self, slot: u64) -> usize {
        slot as usize * self.slot_size
    }

    /// Offset of the id field within a slot.
    #[inline]
    pub const fn id_field(&self) -> usize {
        STATUS_LEN
    }

    /// Offset of the packed heap offset within a slot.
    #[inline]
    pub const fn offset_field(&self) -> usize {
        STATUS_LEN + self.id_size
    }

    /// Offset of the value length within a slot.
    #[inline]
    pub const fn length_field(&self) -> usize {
        self.offset_field() + OFFSET_LEN
    }

    /// Offset of the mtime within a slot.
    #[inline]
    pub const fn mtime_field(&self) -> usize {
        self.length_field() + LENGTH_LEN
    }

    /// Bytes of a slot that carry data (status, id, pointer fields).
    #[inline]
    pub const fn slot_used(&self) -> usize {
        SLOT_FIXED + self.id_size
    }

    /// The table size to use for `entries` live ids at most `load` full,
    /// header slot included.
    pub fn size_for(entries: u64, load: f64) -> u64 {
        ((entries as f64 / load).ceil() as u64).max(1) + 1
    }
}

/// XXH3-64 with seed 0: the hash of ids and the checksum of values.
///
/// One function, two implementations, each where it is cheaper (callgrind):
/// inputs past 240 bytes (values: public keys) take XXH3's long path, which
/// `twox-hash` runs with AVX2 when the CPU has it (detected at run time:
/// about 280 instructions for a 452-byte key, against 435 on xxhash-rust's
/// SSE2 path); shorter ones (ids) go through `xxhash-rust` (33 instructions
/// for a 27-byte id, against 42). The tests check that they agree.
#[inline]
pub fn hash(bytes: &[u8]) -> u64 {
    if bytes.len() > 240 {
        twox_hash::XxHash3_64::oneshot(bytes)
    } else {
        xxhash_rust::xxh3::xxh3_64(bytes)
    }
}

/// Packs a segment number and a byte offset into the slot's offset field.
#[inline]
pub fn pack_offset(segment: u16, offset: u64) -> u64 {
    (u64::from(segment) << SEGMENT_SHIFT) | (offset & OFFSET_MASK)
}

/// Splits a packed heap offset into segment number and byte offset.
#[inline]
pub fn unpack_offset(packed: u64) -> (u16, u64) {
    ((packed >> SEGMENT_SHIFT) as u16, packed & OFFSET_MASK)
}

/// The fields of one data slot, decoded from a copy of its bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SlotFields {
    /// Status byte.
    pub status: u8,
    /// Packed heap offset.
    pub offset: u64,
    /// Value length.
    pub len: u32,
    /// Unix nanoseconds of the last write.
    pub mtime: u64,
}

impl SlotFields {
    /// Decodes the pointer fields from a copy of a slot's first `slot_used` bytes.
    pub fn decode(p: &Params, slot: &[u8]) -> SlotFields {
        SlotFields {
            status: slot[0],
            offset: le_u64(&slot[p.offset_field()..]),
            len: le_u32(&slot[p.length_field()..]),
            mtime: le_u64(&slot[p.mtime_field()..]),
        }
    }

    /// Encodes `id` (NUL-padded to the id size) and the pointer fields into
    /// `body`, a slot's bytes after the status byte (`slot_used - 1` bytes
    /// at least). The status byte is the caller's: a new entry's is stored
    /// last, once the fields it vouches for are in place.
    pub fn encode_body(&self, p: &Params, id: &[u8], body: &mut [u8]) {
        let at = |field: usize| field - STATUS_LEN;
        body[..p.id_size].fill(0);
        body[..id.len()].copy_from_slice(id);
        body[at(p.offset_field())..at(p.offset_field()) + OFFSET_LEN]
            .copy_from_slice(&self.offset.to_le_bytes());
        body[at(p.length_field())..at(p.length_field()) + LENGTH_LEN]
            .copy_from_slice(&self.len.to_le_bytes());
        body[at(p.mtime_field())..at(p.mtime_field()) + MTIME_LEN]
            .copy_from_slice(&self.mtime.to_le_bytes());
    }
}

/// The counters of slot 0.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Occupied data slots.
    pub occupied: u64,
    /// Deleted data slots (tombstones on probe chains).
    pub deleted: u64,
    /// Highest data slot ever written.
    pub high_water: u64,
}

impl Header {
    /// Decodes the counters from a copy of the header's first [`HDR_LEN`] bytes.
    pub fn decode(h: &[u8; HDR_LEN]) -> Header {
        Header {
            occupied: le_u64(&h[HDR_OCCUPIED..]),
            deleted: le_u64(&h[HDR_DELETED..]),
            high_water: le_u64(&h[HDR_HWM..]),
        }
    }

    /// The header's first [`HDR_LEN`] bytes: the magic and the counters.
    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut h = [0u8; HDR_LEN];
        h[0] = HEADER_MAGIC;
        h[HDR_OCCUPIED..HDR_OCCUPIED + COUNTER_LEN].copy_from_slice(&self.occupied.to_le_bytes());
        h[HDR_DELETED..HDR_DELETED + COUNTER_LEN].copy_from_slice(&self.deleted.to_le_bytes());
        h[HDR_HWM..HDR_HWM + COUNTER_LEN].copy_from_slice(&self.high_water.to_le_bytes());
        h
    }

    /// The counters' bytes (the header without its magic byte), to be
    /// stored at [`HDR_OCCUPIED`] of a live index whose magic is in place.
    pub fn encode_counters(&self) -> [u8; HDR_LEN - HDR_OCCUPIED] {
        let mut c = [0u8; HDR_LEN - HDR_OCCUPIED];
        c.copy_from_slice(&self.encode()[HDR_OCCUPIED..]);
        c
    }
}

/// The id stored in a copy of a slot, cut at the first NUL.
pub fn slot_id<'a>(p: &Params, slot: &'a [u8]) -> &'a [u8] {
    let raw = &slot[p.id_field()..p.id_field() + p.id_size];
    match raw.iter().position(|&b| b == 0) {
        Some(n) => &raw[..n],
        None => raw,
    }
}

/// Whether the id in a copy of a slot is exactly `id` (which is at most `id_size` bytes).
#[inline]
pub fn slot_id_eq(p: &Params, slot: &[u8], id: &[u8]) -> bool {
    let f = p.id_field();
    slot[f..f + id.len()] == *id && (id.len() == p.id_size || slot[f + id.len()] == 0)
}

/// Reads a little-endian u64 from the first 8 bytes.
#[inline]
pub fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Reads a little-endian u32 from the first 4 bytes.
#[inline]
pub fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// Encodes a heap record: checksum then value. Empty for an empty value.
pub fn encode_record(value: &[u8], out: &mut Vec<u8>) {
    if value.is_empty() {
        return;
    }
    out.extend_from_slice(&record_checksum(value));
    out.extend_from_slice(value);
}

/// The checksum bytes that precede a value's record.
#[inline]
pub fn record_checksum(value: &[u8]) -> [u8; CHECKSUM_LEN] {
    hash(value).to_le_bytes()
}

/// Whether `value` matches the checksum bytes stored in front of it.
#[inline]
pub fn record_matches(checksum: &[u8; CHECKSUM_LEN], value: &[u8]) -> bool {
    hash(value) == u64::from_le_bytes(*checksum)
}

/// Length on the heap of a value's record.
#[inline]
pub fn record_len(value_len: usize) -> u64 {
    if value_len == 0 {
        0
    } else {
        (value_len + CHECKSUM_LEN) as u64
    }
}

/// Decodes roster bytes into entries, tombstones included; a trailing
/// partial entry (a torn append) is ignored, as Salt ignores it.
pub fn decode_roster(buf: &[u8]) -> Vec<u32> {
    buf.chunks_exact(ROSTER_ENTRY_LEN)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Encodes roster entries.
pub fn encode_roster(slots: &[u32]) -> Vec<u8> {
    slots.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// The bytes of a roster tombstone.
pub const ROSTER_TOMBSTONE_BYTES: [u8; ROSTER_ENTRY_LEN] = ROSTER_TOMBSTONE.to_le_bytes();

/// `index` with `suffix` appended to its file name.
fn companion(index: &Path, suffix: &str) -> PathBuf {
    let mut s = index.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The file-name suffix of heap segment `n` (`.heap`, `.heap.1`, ...).
pub fn segment_suffix(n: u16) -> String {
    if n == 0 {
        HEAP_SUFFIX.to_owned()
    } else {
        format!("{HEAP_SUFFIX}.{n}")
    }
}

/// Path of heap segment `n` of the bank whose index is `index`.
pub fn segment_path(index: &Path, n: u16) -> PathBuf {
    companion(index, &segment_suffix(n))
}

/// Path of the roster of the bank whose index is `index`.
pub fn roster_path(index: &Path) -> PathBuf {
    companion(index, ROSTER_SUFFIX)
}

/// Path of the lock file of the bank whose index is `index`.
pub fn lock_path(index: &Path) -> PathBuf {
    companion(index, LOCK_SUFFIX)
}

/// Path of keycache's lost-entries file of the bank whose index is `index`
/// (see [`crate::verify::lost_path`]).
pub fn lost_path(index: &Path) -> PathBuf {
    companion(index, LOST_SUFFIX)
}

/// Path under which process `pid` creates a new index file `index` before
/// renaming it into place.
pub fn new_index_path(index: &Path, pid: u32) -> PathBuf {
    companion(index, &format!("{NEW_INDEX_SUFFIX}.{pid}"))
}

/// The segment paths of a bank, by segment number: `.heap`, `.heap.1`, ...
/// as far as they go without a gap (Salt's own rule), then on to the
/// highest-numbered regular segment file past a missing one. A segment
/// missing below that one is listed too, so that the list is indexed by
/// segment number (opening its path fails). Salt stops at the first gap;
/// keycache reads the segments past one, so that a lost segment costs only
/// its own records, and a rebuild replaces or removes them. Past the gap
/// only regular files count (Salt never reads them), and a directory ends
/// the list: a rebuild removes the files listed past its new heap.
pub(crate) fn discover(index: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = (0..=u16::MAX)
        .map(|n| segment_path(index, n))
        .take_while(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    let prefix = out.len();
    if let Some(h) = highest_past(index, prefix) {
        out.extend(
            (prefix..=usize::from(h))
                .filter_map(|n| u16::try_from(n).ok().map(|n| segment_path(index, n))),
        );
    }
    out
}

/// The highest segment number past `prefix` (the first missing one) whose
/// file is regular, below any directory with a segment's name; `None` when
/// there is none or the directory cannot be listed.
fn highest_past(index: &Path, prefix: usize) -> Option<u16> {
    let dir = match index.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let base = index.file_name()?.as_bytes();
    let (mut regular, mut dir_at) = (Vec::new(), u16::MAX);
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name();
        let Some(n) = segment_number(base, name.as_bytes()) else {
            continue;
        };
        if usize::from(n) <= prefix {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_file() => regular.push(n),
            Ok(t) if t.is_dir() => dir_at = dir_at.min(n),
            _ => {}
        }
    }
    regular.into_iter().filter(|&n| n < dir_at).max()
}

/// The segment number of file `name` in the bank whose index file is named
/// `base`: `base.heap` is 0, `base.heap.N` is N (decimal, no leading zero,
/// 1 to 65535, as [`segment_path`] spells it).
pub(crate) fn segment_number(base: &[u8], name: &[u8]) -> Option<u16> {
    let rest = name
        .strip_prefix(base)?
        .strip_prefix(HEAP_SUFFIX.as_bytes())?;
    if rest.is_empty() {
        return Some(0);
    }
    let digits = rest.strip_prefix(b".")?;
    if digits.is_empty()
        || digits.len() > 5
        || digits[0] == b'0'
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let n: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    u16::try_from(n).ok().filter(|&n| n > 0)
}

/// The files of the bank whose index is `index`, as Salt's `flush(bank)`
/// removes them: the index, every heap segment (by number, past a missing
/// one too: `heap`'s discovery; a missing one below the highest is
/// listed), the roster and the lock file. The index, segment 0, the
/// roster and the lock are listed whether or not they exist. keycache's own
/// companions ([`lost_path`]) are not the bank's: they are not listed.
pub fn bank_files(index: &Path) -> Vec<PathBuf> {
    let mut v = vec![index.to_path_buf()];
    let segments = discover(index);
    if segments.is_empty() {
        v.push(segment_path(index, 0));
    }
    v.extend(segments);
    v.push(roster_path(index));
    v.push(lock_path(index));
    v
}

#[cfg(test)]
mod tests;
