//! The layout's offsets and sizes against docs/format.md, hashing and
//! probing, record encoding, file names and heap segment discovery.

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
    assert_eq!(
        (HDR_OCCUPIED, HDR_DELETED, HDR_HWM, HDR_LEN),
        (1, 9, 17, 25)
    );
    assert_eq!(SLOT_FIXED, 21);
    assert_eq!(min_slot_size(1), 25);
}

#[test]
fn slot_bodies_and_headers_round_trip() {
    let p = Params::default();
    let f = SlotFields {
        status: OCCUPIED,
        offset: pack_offset(2, 77),
        len: 451,
        mtime: 1_700_000_000_123_456_789,
    };
    let mut slot = vec![0xEEu8; p.slot_size];
    slot[0] = OCCUPIED;
    f.encode_body(&p, b"web-01", &mut slot[1..p.slot_used()]);
    assert_eq!(SlotFields::decode(&p, &slot), f);
    assert_eq!(slot_id(&p, &slot), b"web-01");
    assert!(
        slot[p.slot_used()..].iter().all(|&b| b == 0xEE),
        "wrote past the fields"
    );
    let h = Header {
        occupied: 3,
        deleted: 1,
        high_water: 9,
    };
    let bytes = h.encode();
    assert_eq!(bytes[0], HEADER_MAGIC);
    assert_eq!(Header::decode(&bytes), h);
    assert_eq!(&bytes[HDR_OCCUPIED..], &h.encode_counters()[..]);
    assert_eq!(
        decode_roster(&encode_roster(&[5, ROSTER_TOMBSTONE, 7])),
        [5, ROSTER_TOMBSTONE, 7]
    );
    assert_eq!(
        decode_roster(&[1, 0, 0, 0, 9]),
        [1],
        "a torn entry is ignored"
    );
    assert_eq!(
        segment_path(Path::new("/d/.mmap_keys.idx"), 0),
        Path::new("/d/.mmap_keys.idx.heap")
    );
    assert_eq!(
        segment_path(Path::new("/d/.mmap_keys.idx"), 2),
        Path::new("/d/.mmap_keys.idx.heap.2")
    );
    assert_eq!(roster_path(Path::new("/d/x")), Path::new("/d/x.roster"));
    assert_eq!(
        lost_path(Path::new("/d/x")),
        Path::new("/d/x.keycache-lost")
    );
    assert_eq!(
        new_index_path(Path::new("/d/x"), 42),
        Path::new("/d/x.keycache-new.42")
    );
    assert_eq!(lock_path(Path::new("/d/x")), Path::new("/d/x.lock"));
}

#[test]
fn bank_files_list_segments_past_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join(KEYS_INDEX);
    let names = |v: Vec<PathBuf>| -> Vec<String> {
        v.iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    let none = [
        ".mmap_keys.idx",
        ".mmap_keys.idx.heap",
        ".mmap_keys.idx.roster",
        ".mmap_keys.idx.lock",
    ];
    assert_eq!(names(bank_files(&idx)), none);
    for n in [0u16, 2] {
        std::fs::write(segment_path(&idx, n), b"").unwrap();
    }
    assert_eq!(
        names(bank_files(&idx)),
        [
            ".mmap_keys.idx",
            ".mmap_keys.idx.heap",
            ".mmap_keys.idx.heap.1",
            ".mmap_keys.idx.heap.2",
            ".mmap_keys.idx.roster",
            ".mmap_keys.idx.lock",
        ]
    );
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

#[test]
fn discovery_lists_segments_past_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join(".mmap_keys.idx");
    assert!(discover(&idx).is_empty());
    for n in [0u16, 1, 3] {
        std::fs::write(segment_path(&idx, n), b"").unwrap();
    }
    // Past the gap only regular files count, and a directory ends
    // the list.
    std::os::unix::fs::symlink("/nonexistent", segment_path(&idx, 9)).unwrap();
    std::fs::create_dir(segment_path(&idx, 5)).unwrap();
    std::fs::write(segment_path(&idx, 6), b"").unwrap();
    // Not segments: another bank's, a leading zero, out of range.
    for other in [
        ".mmap_keys.idx.heap.07",
        ".mmap_keys.idx.heap.65536",
        ".mmap_keys.idx.heap.x",
        ".mmap_denied.idx.heap.9",
        ".mmap_keys.idx.heapx",
    ] {
        std::fs::write(dir.path().join(other), b"").unwrap();
    }
    let want: Vec<PathBuf> = (0..=3).map(|n| segment_path(&idx, n)).collect();
    assert_eq!(discover(&idx), want);
    let b = b".mmap_keys.idx".as_slice();
    assert_eq!(segment_number(b, b".mmap_keys.idx.heap"), Some(0));
    assert_eq!(segment_number(b, b".mmap_keys.idx.heap.65535"), Some(65535));
    assert_eq!(segment_number(b, b".mmap_keys.idx.heap.0"), None);
    assert_eq!(segment_number(b, b".mmap_keys.idx.heap."), None);
    assert_eq!(segment_number(b, b".mmap_keys.idx.roster"), None);
}
