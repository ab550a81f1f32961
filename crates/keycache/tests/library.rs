//! The library's behaviour on small tables: puts, state changes, denies,
//! removes, probing with wrap-around, deleted-slot reuse, segment rolls,
//! roster order and tombstones, compaction, refusals.

use std::path::Path;
use std::time::Duration;

use keycache::format::{self, Params};
use keycache::format::{DENIED_INDEX, KEYS_INDEX};
use keycache::{Error, KeyState, MinionId, OpenOptions, Store};

fn id(s: &str) -> MinionId {
    MinionId::new(s).unwrap()
}

fn small(size: u64, seg: u64) -> OpenOptions {
    OpenOptions {
        params: Params {
            size,
            max_segment_bytes: seg,
            ..Params::default()
        },
        refresh: Duration::from_millis(0),
        ownership: None,
        ..OpenOptions::default()
    }
}

fn pem(n: usize) -> Vec<u8> {
    format!("-----BEGIN PUBLIC KEY-----\nkey{n:04}\n-----END PUBLIC KEY-----\n").into_bytes()
}

fn roster(dir: &Path, index: &str) -> Vec<u32> {
    std::fs::read(dir.join(format!("{index}.roster")))
        .unwrap_or_default()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn put_get_state_deny_remove() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(17, 1 << 20)).unwrap();
    assert_eq!(s.get(&id("a")).unwrap(), None);
    assert!(!d.path().join(KEYS_INDEX).exists(), "reads create nothing");
    s.put(&id("a"), KeyState::Pending, &pem(1)).unwrap();
    let e = s.get(&id("a")).unwrap().unwrap();
    assert_eq!((e.state, e.public_key.clone()), (KeyState::Pending, pem(1)));
    assert!(e.mtime > 0);
    assert!(s.set_state(&id("a"), KeyState::Accepted).unwrap());
    assert_eq!(s.get(&id("a")).unwrap().unwrap().state, KeyState::Accepted);
    assert!(!s.set_state(&id("zz"), KeyState::Accepted).unwrap());
    s.deny(&id("a"), &pem(2)).unwrap();
    assert_eq!(s.denied(&id("a")).unwrap(), Some(pem(2)));
    assert_eq!(s.get(&id("a")).unwrap().unwrap().public_key, pem(1));
    let c = s.counts().unwrap();
    assert_eq!((c.accepted, c.pending, c.rejected, c.denied), (1, 0, 0, 1));
    assert!(s.remove(&id("a")).unwrap());
    assert!(!s.remove(&id("a")).unwrap());
    assert_eq!(s.get(&id("a")).unwrap(), None);
    assert!(s.is_denied(&id("a")).unwrap());
    assert!(s.remove_denied(&id("a")).unwrap());
    assert!(!s.is_denied(&id("a")).unwrap());
    let st = s.stats().unwrap();
    assert_eq!((st.keys.occupied, st.keys.deleted), (0, 1));
    assert_eq!((st.denied_keys.occupied, st.denied_keys.deleted), (0, 1));
    // Salt's header magic is stamped.
    assert_eq!(std::fs::read(d.path().join(KEYS_INDEX)).unwrap()[0], 0xAB);
    assert_eq!(
        std::fs::metadata(d.path().join(DENIED_INDEX))
            .unwrap()
            .len(),
        17 * 96
    );
}

#[test]
fn probing_wraps_and_deleted_slots_are_reused() {
    let d = tempfile::tempdir().unwrap();
    let p = Params {
        size: 5,
        ..Params::default()
    };
    let s = Store::open_with(d.path(), &small(5, 1 << 20)).unwrap();
    let ids: Vec<MinionId> = (0..4).map(|i| id(&format!("m{i}"))).collect();
    for (i, m) in ids.iter().enumerate() {
        s.put(m, KeyState::Accepted, &pem(i)).unwrap();
    }
    // Four data slots, all full: one more is refused, nothing changes.
    let err = s
        .put(&id("extra"), KeyState::Accepted, &pem(9))
        .unwrap_err();
    assert!(matches!(err, Error::TableFull { .. }), "{err}");
    for (i, m) in ids.iter().enumerate() {
        assert_eq!(s.get(m).unwrap().unwrap().public_key, pem(i));
    }
    // Some id's chain must wrap past the last slot.
    let homes: Vec<u64> = ids.iter().map(|m| p.home(m.as_str().as_bytes())).collect();
    assert!(homes.iter().any(|&h| h > 1), "{homes:?}");
    // Remove one: its slot becomes DELETED and the next insert takes it.
    s.remove(&ids[2]).unwrap();
    assert_eq!(s.stats().unwrap().keys.deleted, 1);
    s.put(&id("extra"), KeyState::Rejected, &pem(9)).unwrap();
    let st = s.stats().unwrap().keys;
    assert_eq!((st.occupied, st.deleted), (4, 0));
    assert_eq!(
        s.get(&id("extra")).unwrap().unwrap().state,
        KeyState::Rejected
    );
    for (i, m) in ids.iter().enumerate().filter(|(i, _)| *i != 2) {
        assert_eq!(s.get(m).unwrap().unwrap().public_key, pem(i));
    }
    // Roster: the removed id's entry is a tombstone, the new one appended.
    let r = roster(d.path(), KEYS_INDEX);
    assert_eq!(r.len(), 5);
    assert_eq!(r[2], format::ROSTER_TOMBSTONE);
    let order: Vec<String> = s.keys(None).unwrap().map(|e| e.unwrap().0).collect();
    assert_eq!(order, vec!["m0", "m1", "m3", "extra"]);
}

#[test]
fn segments_roll_at_the_cap_and_stay_readable() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(101, 200)).unwrap();
    for i in 0..20 {
        s.put(&id(&format!("m{i}")), KeyState::Accepted, &pem(i))
            .unwrap();
    }
    let st = s.stats().unwrap().keys;
    assert!(st.segments >= 10, "{st:?}");
    assert!(d.path().join(format!("{KEYS_INDEX}.heap.3")).exists());
    for i in 0..20 {
        assert_eq!(
            s.get(&id(&format!("m{i}"))).unwrap().unwrap().public_key,
            pem(i)
        );
    }
    // A second handle opened before the growth sees the new segments too.
    let s2 = Store::open_with(d.path(), &small(101, 200)).unwrap();
    s.put(&id("late"), KeyState::Pending, &pem(99)).unwrap();
    assert_eq!(s2.get(&id("late")).unwrap().unwrap().public_key, pem(99));
}

#[test]
fn overwrites_append_and_compaction_drops_garbage() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(31, 1 << 20)).unwrap();
    for i in 0..10 {
        s.put(&id(&format!("m{i}")), KeyState::Pending, &pem(i))
            .unwrap();
    }
    for i in 0..10 {
        s.set_state(&id(&format!("m{i}")), KeyState::Accepted)
            .unwrap();
    }
    s.remove(&id("m3")).unwrap();
    let before = s.stats().unwrap().keys;
    assert!(
        before.heap_total_bytes >= 2 * before.heap_live_bytes,
        "{before:?}"
    );
    let order_before: Vec<_> = s.keys(None).unwrap().map(|e| e.unwrap()).collect();
    s.compact(None).unwrap();
    let after = s.stats().unwrap().keys;
    assert_eq!(after.heap_total_bytes, after.heap_live_bytes);
    assert_eq!((after.occupied, after.deleted), (9, 0));
    let order_after: Vec<_> = s.keys(None).unwrap().map(|e| e.unwrap()).collect();
    assert_eq!(order_before, order_after, "order, keys and mtimes survive");
    // No temporary files or journal are left behind.
    for e in std::fs::read_dir(d.path()).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        assert!(n.starts_with(".mmap_"), "stray file {n}");
    }
    // Compaction into a bigger table.
    s.compact(Some(61)).unwrap();
    let s61 = Store::open_with(d.path(), &small(61, 1 << 20)).unwrap();
    let order61: Vec<_> = s61.keys(None).unwrap().map(|e| e.unwrap()).collect();
    assert_eq!(order_before, order61);
    let err = Store::open_with(d.path(), &small(31, 1 << 20)).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(KEYS_INDEX) && msg.contains("2976") && msg.contains("5856"),
        "{msg}"
    );
}

#[test]
fn ids_are_checked_never_truncated() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(17, 1 << 20)).unwrap();
    let exact = "x".repeat(64);
    s.put(&id(&exact), KeyState::Accepted, &pem(1)).unwrap();
    assert_eq!(s.get(&id(&exact)).unwrap().unwrap().public_key, pem(1));
    let long = format!("{exact}y");
    let err = s.put(&id(&long), KeyState::Accepted, &pem(2)).unwrap_err();
    assert!(matches!(err, Error::IdTooLong { len: 65, .. }), "{err}");
    assert!(err.to_string().contains("mmap_key_id_size"), "{err}");
    assert!(s.get(&id(&long)).is_err());
    assert_eq!(s.get(&id(&exact)).unwrap().unwrap().public_key, pem(1));
    let utf8 = "nœud-é";
    s.put(&id(utf8), KeyState::Pending, &pem(3)).unwrap();
    assert_eq!(s.get(&id(utf8)).unwrap().unwrap().state, KeyState::Pending);
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b"] {
        assert!(MinionId::new(bad).is_err(), "{bad:?}");
    }
    assert!(s.put(&id("empty-key"), KeyState::Accepted, b"").is_err());
}

#[test]
fn batches_apply_together() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(101, 1 << 20)).unwrap();
    let (_, applied) = s
        .batch(|b| {
            for i in 0..50 {
                b.put(&id(&format!("m{i}")), KeyState::Pending, &pem(i))?;
            }
            b.set_state(&id("m7"), KeyState::Accepted)?;
            b.deny(&id("m8"), &pem(800))?;
            b.remove(&id("m9"))
        })
        .unwrap();
    assert_eq!(applied.inserted, 49 + 1);
    let c = s.counts().unwrap();
    assert_eq!((c.accepted, c.pending, c.denied), (1, 48, 1));
    // A batch that fails writes nothing.
    let err = s.batch(|b| {
        b.put(&id("ok"), KeyState::Accepted, &pem(1))?;
        b.put(&id(&"z".repeat(80)), KeyState::Accepted, &pem(1))
    });
    assert!(err.is_err());
    assert_eq!(s.get(&id("ok")).unwrap(), None);
}

#[test]
fn mismatched_files_are_refused_with_names() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join(KEYS_INDEX), vec![0u8; 1000]).unwrap();
    let msg = Store::open(d.path()).unwrap_err().to_string();
    assert!(
        msg.contains(KEYS_INDEX) && msg.contains("96000000") && msg.contains("1000"),
        "{msg}"
    );
    let bad = OpenOptions {
        params: Params {
            slot_size: 50,
            ..Params::default()
        },
        ..OpenOptions::default()
    };
    let msg = Store::open_with(d.path(), &bad).unwrap_err().to_string();
    assert!(msg.contains("slot size 50") && msg.contains("85"), "{msg}");
    // Symlinked and directory bank files are refused.
    let d2 = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc/passwd", d2.path().join(KEYS_INDEX)).unwrap();
    let msg = Store::open(d2.path()).unwrap_err().to_string();
    assert!(msg.contains("symlink"), "{msg}");
    let d3 = tempfile::tempdir().unwrap();
    std::fs::create_dir(d3.path().join(DENIED_INDEX)).unwrap();
    let msg = Store::open(d3.path()).unwrap_err().to_string();
    assert!(msg.contains("directory"), "{msg}");
}

#[test]
fn new_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(17, 1 << 20)).unwrap();
    s.put(&id("a"), KeyState::Accepted, &pem(1)).unwrap();
    s.deny(&id("a"), &pem(2)).unwrap();
    s.compact(None).unwrap();
    for e in std::fs::read_dir(d.path()).unwrap() {
        let e = e.unwrap();
        let mode = e.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{:?}", e.file_name());
    }
}

#[test]
fn a_reader_sees_another_handles_writes_and_rebuilds() {
    let d = tempfile::tempdir().unwrap();
    let opts = OpenOptions {
        refresh: Duration::from_millis(20),
        ..small(31, 1 << 20)
    };
    let reader = Store::open_with(d.path(), &opts).unwrap();
    let writer = Store::open_with(d.path(), &opts).unwrap();
    writer.put(&id("a"), KeyState::Pending, &pem(1)).unwrap();
    // A bank created after the reader opened: visible within the refresh bound.
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(
        reader.get(&id("a")).unwrap().unwrap().state,
        KeyState::Pending
    );
    // In-place changes: at once.
    writer.set_state(&id("a"), KeyState::Accepted).unwrap();
    assert_eq!(
        reader.get(&id("a")).unwrap().unwrap().state,
        KeyState::Accepted
    );
    // A compaction that swaps the files: within the bound.
    writer.put(&id("b"), KeyState::Pending, &pem(2)).unwrap();
    writer.compact(None).unwrap();
    writer.put(&id("c"), KeyState::Pending, &pem(3)).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(reader.get(&id("c")).unwrap().unwrap().public_key, pem(3));
    assert_eq!(reader.get(&id("b")).unwrap().unwrap().public_key, pem(2));
}

#[test]
fn buffered_lookups_match_owned_ones() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(101, 1 << 20)).unwrap();
    let states = [KeyState::Accepted, KeyState::Pending, KeyState::Rejected];
    for n in 0..40 {
        s.put(&id(&format!("m-{n:02}")), states[n % 3], &pem(n))
            .unwrap();
    }
    // Present and absent ids, some twice, in no particular order.
    let ids: Vec<MinionId> = [7, 45, 0, 39, 7, 50, 13, 21, 99, 2]
        .iter()
        .map(|n| id(&format!("m-{n:02}")))
        .collect();
    let owned = s.get_many(&ids).unwrap();
    assert_eq!(owned.iter().filter(|e| e.is_none()).count(), 3);

    // One buffer for every lookup, starting dirty.
    let mut buf = b"left over".to_vec();
    for (i, e) in ids.iter().zip(&owned) {
        let got = s.get_in(i, &mut buf).unwrap().map(|r| r.to_entry());
        assert_eq!(got.as_ref(), e.as_ref(), "get_in({i})");
        assert_eq!(got, s.get(i).unwrap());
    }

    // One batch for two batches; the second is shorter and replaces the first.
    let mut batch = keycache::KeyBatch::new();
    s.get_many_in(&ids, &mut batch).unwrap();
    assert_eq!(batch.len(), ids.len());
    for (n, e) in owned.iter().enumerate() {
        assert_eq!(batch.get(n).map(|r| r.to_entry()).as_ref(), e.as_ref());
    }
    let all: Vec<_> = batch.iter().map(|r| r.map(|r| r.to_entry())).collect();
    assert_eq!(all, owned);
    assert_eq!(batch.get(ids.len()), None);
    s.get_many_in(&ids[5..8], &mut batch).unwrap();
    assert_eq!(batch.len(), 3);
    assert_eq!(batch.get(0), None, "m-50 is absent");
    assert_eq!(batch.get(1).map(|r| r.to_entry()), owned[6]);
    s.get_many_in(&[], &mut batch).unwrap();
    assert!(batch.is_empty());

    // A value that is not [state][key]: every form refuses it, naming it.
    s.keys_table().put(b"m-07", b"\x09not a key").unwrap();
    for e in [
        s.get(&ids[0]).unwrap_err(),
        s.get_in(&ids[0], &mut buf).unwrap_err(),
        s.get_many(&ids).unwrap_err(),
        s.get_many_in(&ids, &mut batch).unwrap_err(),
    ] {
        assert!(e.is_corrupt() && e.to_string().contains("m-07"), "{e}");
    }
    assert!(batch.is_empty(), "a refused batch holds nothing");

    // The table's forms append after what the buffer holds.
    let t = s.keys_table();
    let mut buf = b"head".to_vec();
    let f = t.get_into(b"m-13", &mut buf).unwrap().unwrap();
    assert_eq!(&buf[..4], b"head");
    assert_eq!(f.start, 4);
    assert_eq!(f.value(&buf)[1..], pem(13));
    assert_eq!(t.get_into(b"m-77", &mut buf).unwrap(), None);
    assert_eq!(buf.len(), 4 + f.len, "an absent id appends nothing");
    let (mut buf, mut found) = (Vec::new(), Vec::new());
    t.get_many_into(&[&b"m-01"[..], b"m-88", b"m-02"], &mut buf, &mut found)
        .unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(found[1], None);
    assert_eq!(found[0].unwrap().value(&buf)[1..], pem(1));
    assert_eq!(found[2].unwrap().value(&buf)[1..], pem(2));
    assert!(t.get_into(b"", &mut buf).is_err(), "ids are checked");
}

/// A `Reader` answers as the store does, follows its writes and
/// compactions, and lets go of replaced files at its next lookup.
#[test]
fn a_reader_answers_as_the_store_and_follows_it() {
    // One per thread: it may be moved to the thread that uses it.
    fn send<T: Send>() {}
    send::<keycache::Reader<'static>>();
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &small(101, 1024)).unwrap();
    let states = [KeyState::Accepted, KeyState::Pending, KeyState::Rejected];
    for n in 0..30 {
        s.put(&id(&format!("m-{n:02}")), states[n % 3], &pem(n))
            .unwrap();
    }
    s.deny(&id("m-03"), b"denied key").unwrap();
    let ids: Vec<MinionId> = (0..40).map(|n| id(&format!("m-{n:02}"))).collect();
    let mut r = s.reader();
    let mut buf = Vec::new();
    let same = |r: &mut keycache::Reader<'_>, buf: &mut Vec<u8>, when: &str| {
        for i in &ids {
            let want = s.get(i).unwrap();
            assert_eq!(r.get(i).unwrap(), want, "{when}: get({i})");
            let got = r.get_in(i, buf).unwrap().map(|e| e.to_entry());
            assert_eq!(got, want, "{when}: get_in({i})");
            assert_eq!(
                r.denied(i).unwrap(),
                s.denied(i).unwrap(),
                "{when}: denied({i})"
            );
        }
    };
    same(&mut r, &mut buf, "fresh");
    assert_eq!(
        r.denied(&ids[3]).unwrap().as_deref(),
        Some(&b"denied key"[..])
    );

    // Writes, enough of them to roll heap segments of 1 KiB.
    for (n, i) in ids.iter().enumerate().take(30) {
        if n % 4 == 0 {
            s.remove(i).unwrap();
        } else {
            s.put(i, KeyState::Rejected, &pem(100 + n)).unwrap();
        }
    }
    s.put(&ids[35], KeyState::Pending, &pem(35)).unwrap();
    assert!(s.stats().unwrap().keys.segments > 1);
    same(&mut r, &mut buf, "after writes");
    assert_eq!(r.get(&ids[0]).unwrap(), None);
    assert_eq!(
        r.get(&ids[35]).unwrap().map(|e| e.state),
        Some(KeyState::Pending)
    );

    // A compaction replaces the files: the reader follows, and stops
    // holding the old ones (mapped, deleted) at its next lookup.
    let replaced = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&*d.path().to_string_lossy()) && l.ends_with("(deleted)"))
            .count()
    };
    s.compact(None).unwrap();
    assert!(replaced() > 0, "the reader still holds the old files");
    r.get(&ids[1]).unwrap();
    r.denied(&ids[1]).unwrap();
    assert_eq!(replaced(), 0, "the old files are released");
    same(&mut r, &mut buf, "after a compaction");
    s.put(&ids[36], KeyState::Accepted, &pem(36)).unwrap();
    same(&mut r, &mut buf, "after a write after the compaction");

    // Invalid ids and corrupt values are refused as by the store.
    s.keys_table().put(b"m-07", b"\x09not a key").unwrap();
    let e = r.get_in(&ids[7], &mut buf).unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("m-07"), "{e}");
    assert!(r.get(&ids[7]).unwrap_err().is_corrupt());
}

/// A reader that loads its view while a rebuild renames new heap segments
/// under the old index (the index is marked retired first) never answers
/// from that mix: the old slot's offset and length can name another id's
/// record in the new heap, whose checksum holds. It waits for the new
/// index, or reports the unfinished rebuild; then it reads the new files.
#[test]
fn a_reader_never_pairs_an_old_index_with_a_new_heap() {
    use keycache::table::{Table, RETIRED_MAGIC};
    let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let opts = OpenOptions {
        read_retry: Duration::ZERO,
        ..small(31, 1 << 20)
    };
    let open = |d: &Path| Table::open(d.join(KEYS_INDEX), &opts).unwrap();
    // Same lengths, other order: x's record in the old heap sits where y's
    // sits in the new one.
    let a = open(old.path());
    a.put(b"x", b"x-old").unwrap();
    a.put(b"y", b"y-old").unwrap();
    let b = open(new.path());
    b.put(b"y", b"y-new").unwrap();
    b.put(b"x", b"x-new").unwrap();
    drop((a, b));
    let seg = |d: &Path| format::segment_path(&d.join(KEYS_INDEX), 0);
    // The journal's first steps: mark the old index, rename the segment.
    let index = old.path().join(KEYS_INDEX);
    let mut bytes = std::fs::read(&index).unwrap();
    bytes[0] = RETIRED_MAGIC;
    std::fs::write(&index, &bytes).unwrap();
    // The test's premise: the old slot of x names y's record in the new heap.
    let at = |d: &Path, v: &[u8]| {
        let heap = std::fs::read(seg(d)).unwrap();
        heap.windows(v.len()).position(|w| w == v).unwrap()
    };
    assert_eq!(at(old.path(), b"x-old"), at(new.path(), b"y-new"));
    std::fs::rename(seg(new.path()), seg(old.path())).unwrap();

    let reader = open(old.path());
    for id in [&b"x"[..], b"y"] {
        match reader.get(id) {
            Err(Error::Corrupt { why, .. }) => {
                assert!(why.contains("journal is unfinished"), "{why}")
            }
            other => panic!("{}: {other:?}", String::from_utf8_lossy(id)),
        }
    }
    // The index renamed into place: the same handle reads the new files.
    let new_index = new.path().join(KEYS_INDEX);
    std::fs::rename(&new_index, &index).unwrap();
    assert_eq!(reader.get(b"x").unwrap().unwrap().value, b"x-new");
    assert_eq!(reader.get(b"y").unwrap().unwrap().value, b"y-new");
}
