//! The Salt 3008 `mmap_key` layout: constants, field offsets, parameters,
//! hashing and probing, all in one place.
//!
//! A bank is an index file `I`, heap segments `I.heap`, `I.heap.1`, ...,
//! a roster `I.roster` and a lock file `I.lock`. All integers little-endian.
//!
//! ```text
//! index file: size * slot_size bytes
//!
//! slot 0 (header)               data slot i (1 <= i < size), at i * slot_size
//! +--------+------------------+ +--------+------------+--------+--------+--------+---------+
//! | 0      | magic 0xAB       | | 0      | 1 .. 1+K   | 1+K    | 9+K    | 13+K   | 21+K .. |
//! | 1..9   | occupied, u64    | | status | id, UTF-8, | packed | value  | mtime  | zero    |
//! | 9..17  | deleted, u64     | | 0/1/2  | NUL-padded | heap   | length | unix   | padding |
//! | 17..25 | high-water, u64  | |        |            | offset | u32    | ns u64 |         |
//! | 25..   | reserved, zero   | +--------+------------+--------+--------+--------+---------+
//! +--------+------------------+   K = id_size; packed offset = segment << 48 | byte offset
//!
//! heap record:  [xxh3(value): u64][value]      (a zero-length value writes nothing)
//! roster:       [slot: u32]*  in insertion order, 0xFFFF_FFFF = tombstone
//! ```
//!
//! Home slot of an id: `xxh3(id) % (size - 1) + 1`; probe step `j` visits
//! `(home - 1 + j) % (size - 1) + 1`, wrapping over data slots only.

use crate::error::{Error, Result};

/// Header magic in byte 0 of slot 0, stamped when a writer first opens the file.
pub const HEADER_MAGIC: u8 = 0xAB;
/// Slot status: never used.
pub const EMPTY: u8 = 0;
/// Slot status: holds a live entry.
pub const OCCUPIED: u8 = 1;
/// Slot status: held an entry that was removed; probing continues past it.
pub const DELETED: u8 = 2;

/// Header field: occupied count, u64.
pub const HDR_OCCUPIED: usize = 1;
/// Header field: deleted count, u64.
pub const HDR_DELETED: usize = 9;
/// Header field: high-water mark (highest data slot ever written), u64.
pub const HDR_HWM: usize = 17;
/// Bytes of slot 0 that the header uses.
pub const HDR_LEN: usize = 25;

/// Status byte, id and the three pointer fields: the fixed part of a slot.
pub const SLOT_FIXED: usize = 1 + 8 + 4 + 8;
/// Bytes of checksum in front of every heap record.
pub const CHECKSUM_LEN: usize = 8;
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
        1
    }

    /// Offset of the packed heap offset within a slot.
    #[inline]
    pub const fn offset_field(&self) -> usize {
        1 + self.id_size
    }

    /// Offset of the value length within a slot.
    #[inline]
    pub const fn length_field(&self) -> usize {
        9 + self.id_size
    }

    /// Offset of the mtime within a slot.
    #[inline]
    pub const fn mtime_field(&self) -> usize {
        13 + self.id_size
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
    out.extend_from_slice(&hash(value).to_le_bytes());
    out.extend_from_slice(value);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets_match_format_md() {
        let p = Params::default();
        assert_eq!(p.id_field(), 1);
        assert_eq!(p.offset_field(), 65);
        assert_eq!(p.length_field(), 73);
        assert_eq!(p.mtime_field(), 77);
        assert_eq!(p.slot_used(), 85);
        assert_eq!(p.index_len(), Some(96_000_000));
        assert_eq!(min_slot_size(64), 85);
        assert_eq!(min_slot_size(1), 25);
    }

    #[test]
    fn hash_is_xxh3_seed_0() {
        // Reference values of XXH3-64 (seed 0), as python-xxhash's
        // xxh3_64_intdigest gives them.
        assert_eq!(hash(b""), 0x2d06800538d394c2);
        assert_eq!(hash(b"a"), 0xe6c632b61e964e1f);
        // Both implementations are the same function, on every path of it
        // (0-16, 17-128, 129-240 bytes, then stripes, blocks and tails).
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in (0..600).chain([1023, 1024, 1025, 2048, 4999]) {
            let b = &data[len % 7..len % 7 + len];
            assert_eq!(
                twox_hash::XxHash3_64::oneshot(b),
                xxhash_rust::xxh3::xxh3_64(b),
                "length {len}"
            );
        }
    }

    #[test]
    fn probing_wraps_over_data_slots_only() {
        let p = Params {
            size: 5,
            ..Params::default()
        };
        let visited: Vec<u64> = (0..6).map(|j| p.probe(3, j)).collect();
        assert_eq!(visited, vec![3, 4, 1, 2, 3, 4]);
        for id in [&b"x"[..], b"web-01", b"db-02.example.com"] {
            let h = p.home(id);
            assert!((1..5).contains(&h));
        }
    }

    #[test]
    fn offsets_pack_segment_in_top_16_bits() {
        let packed = pack_offset(3, 0x1234);
        assert_eq!(packed, (3u64 << 48) | 0x1234);
        assert_eq!(unpack_offset(packed), (3, 0x1234));
        assert_eq!(
            unpack_offset(pack_offset(u16::MAX, OFFSET_MASK)),
            (u16::MAX, OFFSET_MASK)
        );
    }

    #[test]
    fn params_are_validated() {
        let bad = [
            Params {
                size: 1,
                ..Params::default()
            },
            Params {
                slot_size: 84,
                ..Params::default()
            },
            Params {
                id_size: 0,
                ..Params::default()
            },
            Params {
                max_segment_bytes: 0,
                ..Params::default()
            },
            Params {
                size: u64::from(u32::MAX) + 1,
                ..Params::default()
            },
        ];
        for p in bad {
            assert!(p.validate().is_err(), "{p:?} accepted");
        }
        Params::default().validate().unwrap();
        Params {
            slot_size: 85,
            ..Params::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn slot_id_cut_at_nul_and_exact_compare() {
        let p = Params {
            id_size: 4,
            slot_size: 25,
            ..Params::default()
        };
        let mut slot = vec![0u8; 25];
        slot[1..4].copy_from_slice(b"abc");
        assert_eq!(slot_id(&p, &slot), b"abc");
        assert!(slot_id_eq(&p, &slot, b"abc"));
        assert!(!slot_id_eq(&p, &slot, b"ab"));
        assert!(!slot_id_eq(&p, &slot, b"abcd"));
        slot[1..5].copy_from_slice(b"abcd");
        assert_eq!(slot_id(&p, &slot), b"abcd");
        assert!(slot_id_eq(&p, &slot, b"abcd"));
    }

    #[test]
    fn records_carry_checksum_and_empty_values_write_nothing() {
        let mut out = Vec::new();
        encode_record(b"", &mut out);
        assert!(out.is_empty());
        encode_record(b"pem", &mut out);
        assert_eq!(out.len(), 11);
        assert_eq!(le_u64(&out), hash(b"pem"));
        assert_eq!(&out[8..], b"pem");
        assert_eq!(record_len(3), 11);
        assert_eq!(record_len(0), 0);
    }
}
