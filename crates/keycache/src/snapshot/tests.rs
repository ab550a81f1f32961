//! Snapshots: taken from a store, written, read back; every damage to the
//! file is an error that names what is wrong.

use super::*;
use crate::test_util::{pem, small_store};

fn id(s: &str) -> MinionId {
    MinionId::new(s).expect("id")
}

fn sample() -> Snapshot {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = small_store(dir.path());
    store
        .put(&id("web-2"), KeyState::Accepted, &pem("w2"))
        .expect("put");
    store
        .put(&id("web-1"), KeyState::Pending, &pem("w1"))
        .expect("put");
    store
        .put(&id("db-1"), KeyState::Rejected, &pem("d1"))
        .expect("put");
    store.deny(&id("web-2"), &pem("w2-other")).expect("deny");
    take(&store, &SnapshotOptions::default()).expect("take")
}

#[test]
fn take_copies_both_banks_sorted_with_states_and_mtimes() {
    let s = sample();
    let got: Vec<(Bank, &str, &str)> = s
        .entries
        .iter()
        .map(|e| (e.bank, e.id.as_str(), e.state_name()))
        .collect();
    assert_eq!(
        got,
        [
            (Bank::Keys, "db-1", "rejected"),
            (Bank::Keys, "web-1", "pending"),
            (Bank::Keys, "web-2", "accepted"),
            (Bank::Denied, "web-2", "denied"),
        ]
    );
    assert!(s.entries.iter().all(|e| e.mtime > 0));
    assert_eq!(
        s.get(Bank::Denied, "web-2").map(|e| e.pub_key.clone()),
        Some(pem("w2-other"))
    );
    assert_eq!(s.get(Bank::Denied, "web-1"), None);
}

#[test]
fn round_trip_through_bytes_and_files() {
    let s = sample();
    let b = s.to_bytes();
    assert_eq!(&b[..8], &MAGIC);
    assert_eq!(Snapshot::from_bytes(&b, "x").expect("read"), s);
    let mut out = Vec::new();
    s.write_to(&mut out).expect("write");
    assert_eq!(out, b);
    assert_eq!(Snapshot::read_from(&mut &out[..]).expect("read"), s);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("last.snap");
    s.write_file(&path).expect("write file");
    s.write_file(&path).expect("replace file");
    assert_eq!(Snapshot::read_file(&path).expect("read file"), s);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["last.snap"], "no temporary left");
    let empty = Snapshot::default();
    assert_eq!(
        Snapshot::from_bytes(&empty.to_bytes(), "x").expect("read"),
        empty
    );
}

fn why(b: &[u8]) -> String {
    match Snapshot::from_bytes(b, "peer.snap") {
        Err(Error::BadSnapshot { source_name, why }) => {
            assert_eq!(source_name, "peer.snap");
            why
        }
        other => panic!("expected BadSnapshot, got {other:?}"),
    }
}

/// The sample with a seen section (the entries of another snapshot).
fn with_seen() -> Snapshot {
    let mut s = sample();
    s.seen = Some(s.entries[1..].to_vec());
    s
}

#[test]
fn a_seen_section_round_trips_and_is_checked() {
    let s = with_seen();
    let b = s.to_bytes();
    assert_eq!(u32::from_le_bytes([b[12], b[13], b[14], b[15]]), FLAG_SEEN);
    assert_eq!(Snapshot::from_bytes(&b, "x").expect("read"), s);
    assert_ne!(b, sample().to_bytes());
    let mut dup = with_seen();
    if let Some(seen) = dup.seen.as_mut() {
        seen.push(seen[0].clone());
    }
    let w = why(&dup.to_bytes());
    assert!(
        w.contains("seen entry") && w.contains("out of order"),
        "{w}"
    );
}

#[test]
fn every_truncation_and_every_flipped_byte_is_refused() {
    let b = with_seen().to_bytes();
    for len in 0..b.len() {
        let w = why(&b[..len]);
        assert!(
            w.contains("truncated") || w.contains("magic") || w.contains("empty"),
            "{len}: {w}"
        );
    }
    for i in 0..b.len() {
        for bit in [0x01u8, 0x80] {
            let mut c = b.clone();
            c[i] ^= bit;
            assert!(
                Snapshot::from_bytes(&c, "peer.snap").is_err(),
                "byte {i} bit {bit}"
            );
        }
    }
    let mut longer = b.clone();
    longer.push(0);
    assert!(why(&longer).contains("past the checksum"));
}

#[test]
fn wrong_magic_and_version_are_named() {
    let b = sample().to_bytes();
    let mut m = b.clone();
    m[0] = b'X';
    assert!(why(&m).contains("wrong magic"));
    let mut v = b.clone();
    v[8] = 2;
    // The checksum is computed over the new version: the version is named.
    let n = v.len() - TRAILER_LEN;
    let sum = format::hash(&v[..n]);
    v[n..].copy_from_slice(&sum.to_le_bytes());
    assert!(why(&v).contains("format version 2"), "{}", why(&v));
    assert!(why(b"{\"keys\": []}").contains("wrong magic"));
}

/// `entries` written with a valid checksum, bypassing the writer's checks.
fn forged(entries: Vec<Entry>) -> Vec<u8> {
    Snapshot {
        taken: 1,
        entries,
        seen: None,
    }
    .to_bytes()
}

fn entry(bank: Bank, id: &str, state: Option<KeyState>, key: &[u8]) -> Entry {
    Entry {
        bank,
        id: id.into(),
        state,
        pub_key: key.to_vec(),
        mtime: 7,
    }
}

#[test]
fn invalid_entries_are_refused_even_with_a_valid_checksum() {
    let k = pem("k");
    let a = Some(KeyState::Accepted);
    let dup = forged(vec![
        entry(Bank::Keys, "a", a, &k),
        entry(Bank::Keys, "a", a, &k),
    ]);
    assert!(why(&dup).contains("out of order or repeated"));
    let unsorted = forged(vec![
        entry(Bank::Keys, "b", a, &k),
        entry(Bank::Keys, "a", a, &k),
    ]);
    assert!(why(&unsorted).contains("out of order"));
    let bad_id = forged(vec![entry(Bank::Keys, "../etc", a, &k)]);
    assert!(why(&bad_id).contains("../etc"));
    let stateless = forged(vec![entry(Bank::Keys, "a", None, &k)]);
    assert!(why(&stateless).contains("unknown key state 0"));
    assert!(Snapshot::from_entries(vec![entry(Bank::Keys, "a", None, &k)]).is_err());
    let private = b"-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----\n";
    let p = forged(vec![entry(Bank::Denied, "a", None, private)]);
    assert!(why(&p).contains("PRIVATE KEY"));
    assert!(Snapshot::from_entries(vec![entry(Bank::Keys, "a", a, private)]).is_err());
}

#[test]
fn take_refuses_a_store_holding_private_key_material() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = small_store(dir.path());
    let private = b"-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----\n";
    store
        .keys_table()
        .put(
            b"leaky",
            &crate::key::encode_key_value(KeyState::Accepted, private),
        )
        .expect("raw put");
    let e = take(&store, &SnapshotOptions::default()).expect_err("refused");
    assert!(
        e.to_string().contains("leaky") && e.to_string().contains("PRIVATE KEY"),
        "{e}"
    );
}

#[test]
fn a_held_lock_is_waited_for_at_most_the_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = small_store(dir.path());
    store
        .put(&id("a"), KeyState::Pending, &pem("a"))
        .expect("put");
    let lock = std::fs::File::open(format::lock_path(store.keys_table().path())).expect("lock");
    lock.lock().expect("flock");
    let t0 = std::time::Instant::now();
    let opts = SnapshotOptions {
        lock_wait: Duration::from_millis(200),
    };
    // flock locks are per open file description: this process's other
    // descriptor conflicts with the held one.
    let e = take(&store, &opts).expect_err("busy");
    assert!(matches!(e, Error::Busy { .. }), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(200));
    lock.unlock().expect("unlock");
    assert_eq!(take(&store, &opts).expect("take").entries.len(), 1);
}
