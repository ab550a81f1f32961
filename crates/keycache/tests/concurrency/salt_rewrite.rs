//! c) Salt rewriting a record in place from another file handle: a reader
//! never gets a wrong value.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keycache::format::KEYS_INDEX;
use keycache::format::{self, Params};
use keycache::store::encode_key_value;
use keycache::{Error, KeyState, MinionId, Store};

use super::*;

#[test]
fn salt_style_in_place_rewrites_never_yield_a_wrong_value() {
    const RUN: Duration = Duration::from_millis(1000);
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &opts(17, 1 << 20, 250)).unwrap();
    let target = MinionId::new("target").unwrap();
    let pem_a = value("target", "v", 1, 700);
    let pem_b = value("target", "v", 2, 700);
    let va = encode_key_value(KeyState::Accepted, &pem_a);
    let vb = encode_key_value(KeyState::Rejected, &pem_b);
    assert_eq!(va.len(), vb.len());
    s.put(&target, KeyState::Accepted, &pem_a).unwrap();
    let rec = |v: &[u8]| {
        let mut r = Vec::new();
        format::encode_record(v, &mut r);
        r
    };
    let (rec_a, rec_b) = (rec(&va), rec(&vb));

    // Find the slot and check it points at offset 0 of the heap.
    let (p, index_path, heap_path, index) = keys_bank(d.path());
    let slot = (1..p.size)
        .find(|&i| {
            let b = &index[p.slot_offset(i)..p.slot_offset(i) + p.slot_used()];
            b[0] == format::OCCUPIED && format::slot_id(&p, b) == b"target"
        })
        .expect("slot of target");
    let so = p.slot_offset(slot);
    assert_eq!(format::le_u64(&index[so + p.offset_field()..]), 0);
    assert_eq!(
        format::le_u32(&index[so + p.length_field()..]) as usize,
        va.len()
    );
    assert_eq!(std::fs::read(&heap_path).unwrap(), rec_a);

    let heap = File::options().write(true).open(&heap_path).unwrap();
    let idx = File::options().write(true).open(&index_path).unwrap();
    let stop = AtomicBool::new(false);
    let rewrites = AtomicU64::new(0);
    let (ok_a, ok_b, corrupt, wrong) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let problems = Problems::default();
    std::thread::scope(|sc| {
        // Salt's writer: rewrite checksum + value in place, then the slot's
        // mtime; in bursts of ~2 ms separated by ~3 ms pauses. The record is
        // written in several ways, so readers meet every kind of torn record.
        sc.spawn(|| {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < RUN {
                let burst = Instant::now();
                while burst.elapsed() < Duration::from_millis(2) {
                    let r = if n.is_multiple_of(2) { &rec_b } else { &rec_a };
                    match n % 3 {
                        // One write of the whole record (Salt's slice assignment).
                        0 => heap.write_all_at(r, 0).unwrap(),
                        // Value first, then checksum.
                        1 => {
                            heap.write_all_at(&r[8..], 8).unwrap();
                            heap.write_all_at(&r[..8], 0).unwrap();
                        }
                        // In small pieces, front to back.
                        _ => {
                            for (k, c) in r.chunks(64).enumerate() {
                                heap.write_all_at(c, (k * 64) as u64).unwrap();
                            }
                        }
                    }
                    let mtime = (n + 1).to_le_bytes();
                    idx.write_all_at(&mtime, (so + p.mtime_field()) as u64)
                        .unwrap();
                    n += 1;
                }
                // Leave it consistent (either value) while pausing.
                std::thread::sleep(Duration::from_millis(3));
            }
            rewrites.store(n, Ordering::Relaxed);
            stop.store(true, Ordering::Release);
        });
        for _ in 0..3 {
            sc.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    match s.get(&target) {
                        Ok(Some(e)) => {
                            let v = encode_key_value(e.state, &e.public_key);
                            if v == va {
                                ok_a.fetch_add(1, Ordering::Relaxed);
                            } else if v == vb {
                                ok_b.fetch_add(1, Ordering::Relaxed);
                            } else {
                                wrong.fetch_add(1, Ordering::Relaxed);
                                problems.add(format!(
                                    "wrong value: {} {:?}",
                                    e.state,
                                    String::from_utf8_lossy(&e.public_key)
                                ));
                            }
                        }
                        Ok(None) => {
                            wrong.fetch_add(1, Ordering::Relaxed);
                            problems.add("the entry vanished".into());
                        }
                        Err(Error::Corrupt { .. }) => {
                            corrupt.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            wrong.fetch_add(1, Ordering::Relaxed);
                            problems.add(format!("unexpected error: {e}"));
                        }
                    }
                }
            });
        }
    });
    let (a, b, c, w) = (
        ok_a.load(Ordering::Relaxed),
        ok_b.load(Ordering::Relaxed),
        corrupt.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
    );
    let total = a + b + c + w;
    eprintln!(
        "{} in-place rewrites; reads: {a} saw A, {b} saw B, {c} corrupt (gave up), {w} wrong",
        rewrites.load(Ordering::Relaxed)
    );
    problems.assert_none();
    assert_eq!(w, 0);
    assert!(a > 0 && b > 0, "both values must have been read");
    assert!(
        (a + b) * 10 >= total * 9,
        "only {} of {total} reads succeeded",
        a + b
    );
}

/// A writer that stores a slot's length one byte at a time (Salt's
/// `struct.pack_into` does) and is preempted between two of them leaves,
/// when a length under 256 grows to a multiple of 256, a length of zero:
/// a record of no bytes, which has no checksum to fail. Readers meeting it
/// must wait for the writer to finish, not report an empty or corrupt key.
#[test]
fn a_length_caught_between_its_byte_stores_is_read_again() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &opts(17, 1 << 20, 250)).unwrap();
    let target = MinionId::new("target").unwrap();
    let old = value("target", "v", 1, 199);
    let new = value("target", "v", 2, 255);
    s.put(&target, KeyState::Accepted, &old).unwrap();
    let vb = encode_key_value(KeyState::Rejected, &new);
    assert_eq!(vb.len(), 256);
    let (p, index_path, heap_path, index) = keys_bank(d.path());
    let slot = (1..p.size)
        .find(|&i| format::slot_id(&p, &index[p.slot_offset(i)..]) == b"target")
        .expect("slot of target");
    let so = p.slot_offset(slot);
    assert_eq!(format::le_u32(&index[so + p.length_field()..]), 200);

    // Salt's append path, stopped half-way through the length: record
    // appended, offset repointed, low byte of 256 (0x00) stored, the high
    // byte (0x01) not yet.
    let heap = File::options().write(true).open(&heap_path).unwrap();
    let at = heap.metadata().unwrap().len();
    let mut rec = Vec::new();
    format::encode_record(&vb, &mut rec);
    heap.write_all_at(&rec, at).unwrap();
    let idx = File::options().write(true).open(&index_path).unwrap();
    idx.write_all_at(&at.to_le_bytes(), (so + p.offset_field()) as u64)
        .unwrap();
    idx.write_all_at(&[0], (so + p.length_field()) as u64)
        .unwrap();
    assert_eq!(
        format::le_u32(&std::fs::read(&index_path).unwrap()[so + p.length_field()..]),
        0,
        "the torn length reads as zero"
    );

    let started = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for r in 0..3 {
            let (s, target, started, results) = (&s, &target, &started, &results);
            sc.spawn(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let got: std::result::Result<Option<(KeyState, Vec<u8>)>, String> = match r {
                    0 => s
                        .get(target)
                        .map(|e| e.map(|e| (e.state, e.public_key)))
                        .map_err(|e| e.to_string()),
                    1 => s
                        .get_many(std::slice::from_ref(target))
                        .map(|mut v| v.remove(0).map(|e| (e.state, e.public_key)))
                        .map_err(|e| e.to_string()),
                    _ => s
                        .keys(None)
                        .unwrap()
                        .next()
                        .transpose()
                        .map(|e| e.map(|(_, e)| (e.state, e.public_key)))
                        .map_err(|e| e.to_string()),
                };
                results.lock().unwrap().push((r, got));
            });
        }
        while started.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        // The writer is "preempted" for 100 ms, then finishes the length.
        std::thread::sleep(Duration::from_millis(100));
        idx.write_all_at(&[1], (so + p.length_field() + 1) as u64)
            .unwrap();
    });
    let results = results.into_inner().unwrap();
    assert_eq!(results.len(), 3);
    for (r, got) in results {
        let reader = ["get", "get_many", "keys"][r];
        assert_eq!(
            got,
            Ok(Some((KeyState::Rejected, new.clone()))),
            "{reader} must wait for the length to be finished"
        );
    }
}

/// The layout of these stores (17 slots), the paths of the keys bank's
/// index and first heap segment, and the index's bytes.
fn keys_bank(dir: &Path) -> (Params, PathBuf, PathBuf, Vec<u8>) {
    let p = Params {
        size: 17,
        ..Params::default()
    };
    let index_path = dir.join(KEYS_INDEX);
    let heap_path = dir.join(format!("{KEYS_INDEX}.heap"));
    let index = std::fs::read(&index_path).unwrap();
    (p, index_path, heap_path, index)
}
