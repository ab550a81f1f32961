//! Observations stamp changes on the safe side, the files round-trip and
//! refuse damage, a merge in flight is undone or settled, a wiped store
//! begins a new history, tombstones go at the horizon.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;
use crate::test_util::{pem, small_store};
use keycache::format::{HISTORY_FILE, IDENTITY_FILE};
use keycache::MinionId;

fn id(s: &str) -> MinionId {
    MinionId::new(s).expect("id")
}

/// History options on a clock the test moves.
fn clocked(start: u64) -> (Arc<AtomicU64>, HistoryOptions) {
    let t = Arc::new(AtomicU64::new(start));
    let t2 = t.clone();
    let o = HistoryOptions {
        wall: WallClock::new(move || t2.load(Ordering::SeqCst)),
        ..HistoryOptions::default()
    };
    (t, o)
}

fn observe(h: &mut History, store: &Store, o: &HistoryOptions) -> Observed {
    h.observe(store, o, true, |_, _, _, _, _| Ok(()))
        .expect("observe")
}

/// A small store in a new directory, and history options on a clock at 1000.
fn fresh() -> (tempfile::TempDir, Store, Arc<AtomicU64>, HistoryOptions) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = small_store(dir.path());
    let (t, o) = clocked(1_000);
    (dir, store, t, o)
}

/// `mid` put in `state` with the key of `tag`.
fn put(store: &Store, mid: &str, state: KeyState, tag: &str) {
    store.put(&id(mid), state, &pem(tag)).expect("put");
}

/// The history of the store in `dir`, loaded and brought up to date.
fn observed(dir: &std::path::Path, store: &Store, o: &HistoryOptions) -> History {
    let mut h = History::load(dir, o).expect("load");
    observe(&mut h, store, o);
    h
}

#[test]
fn accepts_take_the_last_observation_and_revocations_now() {
    let (dir, store, t, o) = fresh();
    let mut h = History::load(dir.path(), &o).expect("load");
    put(&store, "m1", KeyState::Pending, "k1");
    t.store(2_000, Ordering::SeqCst);
    assert_eq!(observe(&mut h, &store, &o).changed, 1);
    let pending = h.get(Bank::Keys, "m1").expect("recorded");
    // A first sign-in revokes nothing: the first stamp there is.
    assert_eq!(
        (pending.kind, pending.stamp),
        (Kind::Pending, FRESH_PENDING)
    );
    // Accepted at 5000, seen at 9000: stamped at the last observation
    // (the earliest it can have happened), after the pending version.
    t.store(5_000, Ordering::SeqCst);
    store
        .set_state(&id("m1"), KeyState::Accepted)
        .expect("accept");
    t.store(9_000, Ordering::SeqCst);
    observe(&mut h, &store, &o);
    let acc = h.get(Bank::Keys, "m1").expect("recorded");
    assert_eq!(acc.kind, Kind::Accepted);
    assert!(acc.stamp > pending.stamp && acc.stamp <= 5_000, "{acc:?}");
    // Deleted at 10000, seen at 20000: stamped at 20000 (the latest).
    t.store(10_000, Ordering::SeqCst);
    store.remove(&id("m1")).expect("remove");
    t.store(20_000, Ordering::SeqCst);
    assert_eq!(observe(&mut h, &store, &o).changed, 1);
    assert_eq!(h.get(Bank::Keys, "m1"), Some(Version::absent(20_000)));
    // Nothing changed: nothing stamped.
    t.store(30_000, Ordering::SeqCst);
    assert_eq!(observe(&mut h, &store, &o).changed, 0);
    assert_eq!(h.get(Bank::Keys, "m1"), Some(Version::absent(20_000)));
}

#[test]
fn the_files_round_trip_and_damage_is_named() {
    let (dir, store, _t, o) = fresh();
    put(&store, "m1", KeyState::Accepted, "k1");
    store.deny(&id("m2"), &pem("k2")).expect("deny");
    let mut h = observed(dir.path(), &store, &o);
    h.set_in_flight(
        Bank::Keys,
        "m3",
        Version {
            stamp: 5,
            kind: Kind::Pending,
            hash: 9,
        },
    );
    h.identity.peers.insert(
        [3; 16],
        Peer {
            generation: 44,
            merged_at: 55,
        },
    );
    h.save(dir.path(), &o).expect("save");
    let back = History::load(dir.path(), &o).expect("load");
    assert_eq!(back.identity, h.identity);
    assert_eq!(back.entries.len(), 3);
    for (bank, id, r) in h.entries.iter() {
        let b = back.entries.get(bank, id).expect("kept");
        assert_eq!((b.cur, b.prev), (r.cur, r.prev), "{bank} {id}");
    }
    for name in [HISTORY_FILE, IDENTITY_FILE] {
        let p = dir.path().join(name);
        let good = std::fs::read(&p).expect("read");
        let mut bad = good.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x10;
        std::fs::write(&p, &bad).expect("write");
        let e = History::load(dir.path(), &o).expect_err("damaged");
        assert!(
            e.to_string().contains(name) && e.to_string().contains("checksum"),
            "{e}"
        );
        std::fs::write(&p, &good[..good.len() - 3]).expect("write");
        assert!(History::load(dir.path(), &o).is_err());
        std::fs::write(&p, &good).expect("restore");
    }
}

#[test]
fn a_merge_in_flight_is_undone_when_the_banks_kept_the_old_value() {
    let (dir, store, t, o) = fresh();
    put(&store, "m1", KeyState::Accepted, "old");
    let mut h = observed(dir.path(), &store, &o);
    let old = h.get(Bank::Keys, "m1").expect("recorded");
    // A merge recorded a tombstone, then died before its bank writes.
    h.set_in_flight(Bank::Keys, "m1", Version::absent(5_000));
    h.set_in_flight(
        Bank::Keys,
        "m9",
        Version {
            stamp: 5_000,
            kind: Kind::Accepted,
            hash: 77,
        },
    );
    h.save(dir.path(), &o).expect("save");
    t.store(6_000, Ordering::SeqCst);
    let mut h = History::load(dir.path(), &o).expect("load");
    let seen = observe(&mut h, &store, &o);
    assert_eq!(seen.changed, 0, "not read as local changes");
    assert_eq!(h.get(Bank::Keys, "m1"), Some(old));
    assert_eq!(h.get(Bank::Keys, "m9"), Some(Version::absent(0)));
    assert_eq!(seen.settled.len(), 2);
}

#[test]
fn a_merge_in_flight_is_settled_when_the_banks_took_the_new_value() {
    let (dir, store, t, o) = fresh();
    put(&store, "m1", KeyState::Accepted, "old");
    let mut h = observed(dir.path(), &store, &o);
    h.set_in_flight(Bank::Keys, "m1", Version::absent(5_000));
    h.save(dir.path(), &o).expect("save");
    // The merge's bank write (a merge's batch logs no removal).
    store
        .batch_locked(|b| b.remove(&id("m1")), || Ok(()))
        .expect("the merge's bank write");
    t.store(6_000, Ordering::SeqCst);
    let mut h = History::load(dir.path(), &o).expect("load");
    // Without settling (a snapshot), the merge stays in flight.
    let seen = h
        .observe(&store, &o, false, |_, _, _, _, _| Ok(()))
        .expect("observe");
    assert!(seen.settled.is_empty());
    let seen = observe(&mut h, &store, &o);
    assert_eq!(seen.changed, 0);
    assert_eq!(
        h.get(Bank::Keys, "m1"),
        Some(Version::absent(5_000)),
        "the merge's stamp, not now"
    );
    assert_eq!(seen.settled, vec![(Bank::Keys, "m1".to_owned())]);
}

/// A merge that accepts `ids` (each with the key of the same tag) at 4000:
/// saved in flight, then the banks written for `written` of them (a
/// merge's batch logs no removal), its settling save lost.
fn merge_left_in_flight(
    dir: &std::path::Path,
    store: &Store,
    o: &HistoryOptions,
    h: &mut History,
    ids: &[(&str, &str)],
    written: usize,
) {
    for (mid, tag) in ids {
        h.set_in_flight(Bank::Keys, mid, accepted_at_4000(tag));
    }
    h.save(dir, o).expect("save");
    store
        .batch_locked(
            |b| -> keycache::Result<()> {
                for (mid, tag) in &ids[..written] {
                    b.put(&id(mid), KeyState::Accepted, &pem(tag))?;
                }
                Ok(())
            },
            || Ok(()),
        )
        .expect("the merge's bank write");
}

/// A peer's accept of the key of `tag` at 4000.
fn accepted_at_4000(tag: &str) -> Version {
    Version {
        stamp: 4_000,
        kind: Kind::Accepted,
        hash: value_hash(Kind::Accepted, &pem(tag)),
    }
}

/// A merge in flight whose bank writes were made (its final save lost),
/// then revocations by the operator before the next merge. A removal that
/// keycache's writer logged, and a value that is neither the merge's nor
/// the one before it, are local changes stamped now, not the merge undone:
/// the in-flight record is over, and a later return to the old value is a
/// change too. Read as the merge undone, each went back to its old stamp,
/// and the peer's accept won at the next merge (a revoked key accepted
/// again).
#[test]
fn a_revocation_after_a_merge_left_in_flight_is_a_change_not_the_merge_undone() {
    let (dir, store, t, o) = fresh();
    put(&store, "m4", KeyState::Rejected, "k4");
    let mut h = observed(dir.path(), &store, &o);
    let rejected = h.get(Bank::Keys, "m4").expect("recorded");
    // The merge: m2 (never seen here) and m4 accepted, both written.
    merge_left_in_flight(
        dir.path(),
        &store,
        &o,
        &mut h,
        &[("m2", "k2"), ("m4", "k4")],
        2,
    );
    // The operator, at 8000: m2 deleted (logged), m4 back to pending with
    // another key.
    t.store(8_000, Ordering::SeqCst);
    assert!(store.remove(&id("m2")).expect("delete"));
    put(&store, "m4", KeyState::Pending, "other");
    let mut h = History::load(dir.path(), &o).expect("load");
    let seen = observe(&mut h, &store, &o);
    assert_eq!(seen.changed, 2, "{seen:?}");
    let m2 = h.get(Bank::Keys, "m2").expect("m2");
    assert_eq!(m2.kind, Kind::Absent);
    assert!(
        m2.stamp >= 8_000,
        "a tombstone now, not the old absence: {m2:?}"
    );
    let m4 = h.get(Bank::Keys, "m4").expect("m4");
    assert_eq!(
        (m4.kind, m4.stamp >= 8_000),
        (Kind::Pending, true),
        "{m4:?}"
    );
    h.save(dir.path(), &o).expect("save");
    // At 10000, m4 rejected again with its first key: the value before the
    // merge, now a change of its own.
    t.store(10_000, Ordering::SeqCst);
    put(&store, "m4", KeyState::Rejected, "k4");
    let mut h = History::load(dir.path(), &o).expect("load");
    observe(&mut h, &store, &o);
    let m4 = h.get(Bank::Keys, "m4").expect("m4");
    assert_eq!(m4.kind, Kind::Rejected);
    assert_ne!(m4, rejected, "not the old rejection's stamp");
    assert!(m4.stamp >= 10_000, "{m4:?}");
    assert!(m4.stamp > accepted_at_4000("k4").stamp && m2.stamp > accepted_at_4000("k2").stamp);
}

/// The same revocation with the very bytes the banks held before the
/// merge (`salt-key -r` of the key the merge accepted): a value written
/// after the in-flight save is the operator's, stamped now; the value
/// left from before the save (the merge died before writing) is the merge
/// undone, with its old stamp.
#[test]
fn the_old_value_written_again_after_a_merge_left_in_flight_is_a_change() {
    let (dir, store, t, o) = fresh();
    put(&store, "m1", KeyState::Rejected, "k1");
    put(&store, "m5", KeyState::Rejected, "k5");
    let mut h = observed(dir.path(), &store, &o);
    let (m1_before, m5_before) = (h.get(Bank::Keys, "m1"), h.get(Bank::Keys, "m5"));
    // The merge wrote m1 and died before m5; later (past the file times'
    // margin) the operator rejects m1 again, its key unchanged.
    merge_left_in_flight(
        dir.path(),
        &store,
        &o,
        &mut h,
        &[("m1", "k1"), ("m5", "k5")],
        1,
    );
    std::thread::sleep(std::time::Duration::from_millis(250));
    t.store(10_000, Ordering::SeqCst);
    put(&store, "m1", KeyState::Rejected, "k1");
    let mut h = History::load(dir.path(), &o).expect("load");
    let seen = observe(&mut h, &store, &o);
    assert_eq!(seen.changed, 1, "{seen:?}");
    let m1 = h.get(Bank::Keys, "m1").expect("m1");
    assert_eq!(m1.kind, Kind::Rejected);
    assert_ne!(Some(m1), m1_before, "not the old rejection's stamp");
    assert!(
        m1.stamp >= 10_000 && m1.stamp > accepted_at_4000("k1").stamp,
        "{m1:?}"
    );
    assert_eq!(h.get(Bank::Keys, "m5"), m5_before, "the merge undone");
}

#[test]
fn a_wiped_store_begins_a_new_history_and_deletes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_t, o) = clocked(1_000);
    {
        let store = small_store(dir.path());
        put(&store, "m1", KeyState::Accepted, "k1");
        let mut h = observed(dir.path(), &store, &o);
        h.save(dir.path(), &o).expect("save");
    }
    let first = History::load(dir.path(), &o).expect("load").identity.store;
    for f in std::fs::read_dir(dir.path()).expect("ls") {
        let f = f.expect("entry");
        if f.file_name().to_string_lossy().starts_with(".mmap_") {
            std::fs::remove_file(f.path()).expect("rm");
        }
    }
    let store = small_store(dir.path());
    let mut h = History::load(dir.path(), &o).expect("load");
    assert_ne!(h.identity.store, first, "a new store");
    observe(&mut h, &store, &o);
    assert!(
        h.iter().all(|(_, _, v)| v.kind != Kind::Absent),
        "no tombstone"
    );
}

#[test]
fn tombstones_older_than_the_horizon_are_forgotten() {
    let (dir, store, t, mut o) = fresh();
    o.horizon = std::time::Duration::from_nanos(10_000);
    put(&store, "m1", KeyState::Pending, "k1");
    let mut h = observed(dir.path(), &store, &o);
    store.remove(&id("m1")).expect("remove");
    t.store(2_000, Ordering::SeqCst);
    observe(&mut h, &store, &o);
    h.save(dir.path(), &o).expect("save");
    assert_eq!(History::load(dir.path(), &o).expect("load").len(), 1);
    t.store(20_000, Ordering::SeqCst);
    h.dirty = true;
    h.save(dir.path(), &o).expect("save");
    assert!(History::load(dir.path(), &o).expect("load").is_empty());
}

#[test]
fn versions_are_ordered_by_stamp_then_restrictiveness_then_hash() {
    let v = |stamp, kind, hash| Version { stamp, kind, hash };
    assert!(v(2, Kind::Accepted, 1).beats(&v(1, Kind::Absent, 0)));
    assert!(v(1, Kind::Absent, 0).beats(&v(1, Kind::Accepted, 5)));
    assert!(v(1, Kind::Rejected, 1).beats(&v(1, Kind::Pending, 9)));
    assert!(v(1, Kind::Pending, 9).beats(&v(1, Kind::Pending, 8)));
    assert!(!v(1, Kind::Pending, 8).beats(&v(1, Kind::Pending, 8)));
}

/// A version 2 versions file written back as version 1 (no slots).
fn as_version_1(v2: &[u8]) -> Vec<u8> {
    let body = &v2[..v2.len() - 8];
    let mut out = body[..32].to_vec();
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    let count = u64::from_le_bytes(body[24..32].try_into().expect("count"));
    let mut o = 32;
    for _ in 0..count {
        let prev = body[o + 2] != 0xFF;
        let id_len = u16::from_le_bytes([body[o + 4], body[o + 5]]) as usize;
        out.extend_from_slice(&body[o..o + 6]);
        let rest = 16 + if prev { 16 } else { 0 } + id_len;
        out.extend_from_slice(&body[o + 10..o + 10 + rest]);
        o += 10 + rest;
    }
    assert_eq!(o, body.len());
    let sum = keycache::format::hash(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

#[test]
fn slots_are_kept_and_a_version_1_file_is_still_read() {
    let (dir, store, t, o) = fresh();
    for i in 0..5 {
        store
            .put(
                &id(&format!("m{i}")),
                KeyState::Accepted,
                &pem(&format!("k{i}")),
            )
            .expect("put");
    }
    store.deny(&id("m9"), &pem("k9")).expect("deny");
    let mut h = observed(dir.path(), &store, &o);
    h.save(dir.path(), &o).expect("save");
    let before: Vec<(Bank, String, Version)> =
        h.iter().map(|(b, i, v)| (b, i.to_owned(), v)).collect();
    // Read back, a second observation finds every entry where it was: the
    // versions stay clean (no rewrite).
    let mut back = History::load(dir.path(), &o).expect("load");
    t.store(2_000, Ordering::SeqCst);
    assert_eq!(observe(&mut back, &store, &o).changed, 0);
    assert!(!back.dirty, "every slot hint held");
    // The same file as version 1: read, the same versions, and the slots
    // learnt again (the file is then rewritten).
    let p = dir.path().join(HISTORY_FILE);
    let v1 = as_version_1(&std::fs::read(&p).expect("read"));
    std::fs::write(&p, &v1).expect("write");
    let mut old = History::load(dir.path(), &o).expect("a version 1 file");
    let got: Vec<(Bank, String, Version)> =
        old.iter().map(|(b, i, v)| (b, i.to_owned(), v)).collect();
    assert_eq!(got, before);
    assert_eq!(observe(&mut old, &store, &o).changed, 0);
    assert!(old.dirty, "the slots are new: written again");
}

/// Every regular file of `from` copied into `to` (a new directory): a
/// store copied as an operator copies a pki dir (`cp -a`).
fn copy_store_files(from: &std::path::Path, to: &std::path::Path) {
    for f in std::fs::read_dir(from).expect("ls") {
        let f = f.expect("entry");
        if f.file_type().expect("type").is_file() {
            std::fs::copy(f.path(), to.join(f.file_name())).expect("copy");
        }
    }
}

#[test]
fn a_store_made_begins_its_history_with_creation_stamps() {
    let (dir, store, t, o) = fresh();
    put(&store, "acc", KeyState::Accepted, "k1");
    put(&store, "pend", KeyState::Pending, "k2");
    put(&store, "rej", KeyState::Rejected, "k3");
    store.deny(&id("den"), &pem("k4")).expect("deny");
    store.deny(&id("late"), &pem("k5")).expect("deny");
    t.store(50_000, Ordering::SeqCst);
    let since = |bank: Bank, mid: &str| match (bank, mid) {
        (Bank::Denied, "den") => Some(700),
        // A time after the creation is clamped to it.
        (Bank::Denied, "late") => Some(90_000),
        _ => None,
    };
    assert!(begin_if_missing(&store, &o, Some(&since)).expect("begin"));
    let h = History::load(dir.path(), &o).expect("load");
    let at = |bank, mid| h.get(bank, mid).expect("recorded");
    assert_eq!(at(Bank::Keys, "acc").stamp, FRESH_PENDING);
    assert_eq!(at(Bank::Keys, "pend").stamp, FRESH_PENDING);
    assert_eq!(at(Bank::Keys, "rej").stamp, h.identity.scanned);
    assert_eq!(at(Bank::Denied, "den").stamp, 700);
    assert_eq!(at(Bank::Denied, "late").stamp, h.identity.scanned);
    assert!(h.identity.scanned >= 50_000, "{:?}", h.identity);
    // Begun once: the second call only looks.
    let before = std::fs::read(dir.path().join(IDENTITY_FILE)).expect("identity");
    assert!(!begin_if_missing(&store, &o, None).expect("again"));
    assert_eq!(
        std::fs::read(dir.path().join(IDENTITY_FILE)).expect("identity"),
        before
    );
    // An accept made after the creation is stamped after every creation
    // value: it wins over a peer's creation-time pending key.
    store
        .set_state(&id("pend"), KeyState::Accepted)
        .expect("accept");
    t.store(60_000, Ordering::SeqCst);
    let h = observed(dir.path(), &store, &o);
    assert!(h.get(Bank::Keys, "pend").expect("recorded").stamp >= 50_000);
}

#[test]
fn a_copied_store_gets_a_new_id_and_an_unbound_identity_keeps_its_own() {
    let (dir, store, _t, o) = fresh();
    put(&store, "m1", KeyState::Accepted, "k1");
    assert!(begin_if_missing(&store, &o, None).expect("begin"));
    let orig = History::load(dir.path(), &o).expect("load");
    let copy_dir = tempfile::tempdir().expect("tempdir");
    copy_store_files(dir.path(), copy_dir.path());
    let mut copy = History::load(copy_dir.path(), &o).expect("load the copy");
    assert_ne!(
        copy.identity.store, orig.identity.store,
        "a copy is a new store"
    );
    assert_eq!(
        (
            copy.identity.clock,
            copy.identity.scanned,
            copy.identity.created
        ),
        (
            orig.identity.clock,
            orig.identity.scanned,
            orig.identity.created
        ),
        "the copy keeps the clock"
    );
    assert_eq!(copy.get(Bank::Keys, "m1"), orig.get(Bank::Keys, "m1"));
    // The copy's new id is kept from its first save; the original keeps its.
    copy.save(copy_dir.path(), &o).expect("save");
    let again = History::load(copy_dir.path(), &o).expect("load");
    assert_eq!(again.identity.store, copy.identity.store);
    assert_eq!(
        History::load(dir.path(), &o).expect("load").identity.store,
        orig.identity.store
    );
    // An identity file of an older keycache (version 1, no binding) keeps
    // its id, and is bound by the next save.
    let p = dir.path().join(IDENTITY_FILE);
    std::fs::write(&p, as_identity_version_1(&std::fs::read(&p).expect("read"))).expect("write");
    let mut old = History::load(dir.path(), &o).expect("a version 1 identity");
    assert_eq!(old.identity.store, orig.identity.store);
    old.save(dir.path(), &o).expect("save");
    let bound = std::fs::read(&p).expect("read");
    assert_eq!(u32::from_le_bytes(bound[8..12].try_into().expect("4")), 2);
    assert_eq!(
        History::load(dir.path(), &o).expect("load").identity.store,
        orig.identity.store
    );
}

/// A version 2 identity file written back as version 1 (no binding).
fn as_identity_version_1(v2: &[u8]) -> Vec<u8> {
    let body = &v2[..v2.len() - 8];
    // magic, version, flags, store, created, clock, scanned: 56 bytes;
    // then the binding (16), left out.
    let mut out = body[..56].to_vec();
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    out[12..16].copy_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&body[72..]);
    let sum = keycache::format::hash(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}
