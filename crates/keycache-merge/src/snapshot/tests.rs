//! Snapshots: taken from a store (versions, tombstones, identity), written,
//! read back; every damage to the file is an error that names what is
//! wrong; a filtered read still checks everything.

use super::*;
use crate::test_util::{pem, small_store};
use keycache::id::MinionId;

fn id(s: &str) -> MinionId {
    MinionId::new(s).expect("id")
}

fn sample_store(dir: &Path) -> Store {
    let store = small_store(dir);
    store
        .put(&id("web2"), KeyState::Accepted, &pem("w2"))
        .expect("put");
    store
        .put(&id("web1"), KeyState::Pending, &pem("w1"))
        .expect("put");
    store
        .put(&id("db1"), KeyState::Rejected, &pem("d1"))
        .expect("put");
    store.deny(&id("web2"), &pem("w2other")).expect("deny");
    store
}

fn sample() -> Snapshot {
    let dir = tempfile::tempdir().expect("tempdir");
    take(&sample_store(dir.path()), &SnapshotOptions::default()).expect("take")
}

#[test]
fn take_copies_both_banks_sorted_with_kinds_and_versions() {
    let s = sample();
    let got: Vec<(Bank, &str, &str)> = s
        .entries
        .iter()
        .map(|e| (e.bank, e.id.as_str(), e.kind.name()))
        .collect();
    assert_eq!(
        got,
        [
            (Bank::Keys, "db1", "rejected"),
            (Bank::Keys, "web1", "pending"),
            (Bank::Keys, "web2", "accepted"),
            (Bank::Denied, "web2", "denied"),
        ]
    );
    assert!(s.entries.iter().all(|e| e.stamp > 0));
    assert_eq!(
        s.get(Bank::Denied, "web2").map(|e| e.public_key.clone()),
        Some(pem("w2other"))
    );
    assert_eq!(s.cluster, None, "no cluster or master key in the directory");
}

#[test]
fn deletions_travel_as_tombstones_and_generations_grow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sample_store(dir.path());
    let o = SnapshotOptions::default();
    let first = take(&store, &o).expect("take");
    store.remove(&id("web1")).expect("remove");
    let second = take(&store, &o).expect("take");
    assert_eq!(first.store, second.store, "one identity per store");
    assert!(second.generation > first.generation);
    let t = second.get(Bank::Keys, "web1").expect("a tombstone");
    assert_eq!((t.kind, t.public_key.len()), (Kind::Absent, 0));
    assert!(t.stamp > first.get(Bank::Keys, "web1").expect("was there").stamp);
    // Unchanged entries keep their versions.
    assert_eq!(
        first.get(Bank::Keys, "web2"),
        second.get(Bank::Keys, "web2")
    );
}

#[test]
fn the_cluster_is_named_by_the_cluster_or_master_public_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sample_store(dir.path());
    let o = SnapshotOptions::default();
    std::fs::write(dir.path().join("master.pub"), pem("masterkey")).expect("write");
    let m = take(&store, &o).expect("take").cluster.expect("named");
    std::fs::write(dir.path().join("cluster.pub"), pem("clusterkey")).expect("write");
    let c = take(&store, &o).expect("take").cluster.expect("named");
    assert_ne!(m, c, "cluster.pub comes first");
    let other = tempfile::tempdir().expect("tempdir");
    let s2 = small_store(other.path());
    std::fs::write(other.path().join("cluster.pub"), pem("clusterkey")).expect("write");
    assert_eq!(take(&s2, &o).expect("take").cluster, Some(c));
}

#[test]
fn round_trip_through_bytes_and_files() {
    let s = sample();
    let b = s.to_bytes().expect("bytes");
    assert_eq!(&b[..8], &MAGIC);
    assert_eq!(Snapshot::from_bytes(&b, "x").expect("read"), s);
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
}

#[test]
fn a_filtered_read_keeps_what_is_asked_and_still_checks_the_checksum() {
    let s = sample();
    let b = s.to_bytes().expect("bytes");
    let only = Snapshot::read_filtered(&mut &b[..], "x", |e| e.bank == Bank::Denied).expect("read");
    assert_eq!(only.entries.len(), 1);
    let mut c = b.clone();
    let n = c.len();
    c[n - 12] ^= 1; // inside the last entry's key
    let e = Snapshot::read_filtered(&mut &c[..], "x", |_| false).expect_err("damaged");
    assert!(e.to_string().contains("checksum"), "{e}");
}

fn why(b: &[u8]) -> String {
    match Snapshot::from_bytes(b, "peer.snap") {
        Ok(_) => "read".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_truncation_and_every_flipped_byte_is_refused() {
    let b = sample().to_bytes().expect("bytes");
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
fn wrong_magic_and_versions_are_named() {
    let b = sample().to_bytes().expect("bytes");
    let mut m = b.clone();
    m[0] = b'X';
    assert!(why(&m).contains("wrong magic"));
    let mut v = b.clone();
    v[8] = 1;
    let n = v.len() - TRAILER_LEN;
    let sum = keycache::format::hash(&v[..n]);
    v[n..].copy_from_slice(&sum.to_le_bytes());
    assert!(
        why(&v).contains("format version 1") && why(&v).contains("older keycache"),
        "{}",
        why(&v)
    );
    assert!(why(b"{\"keys\": []}").contains("wrong magic"));
}

/// `entries` written with a valid checksum, bypassing the writer's checks.
fn forged(entries: Vec<Entry>) -> Vec<u8> {
    let s = Snapshot {
        cluster: None,
        store: [7; 16],
        generation: 1,
        entries,
    };
    let mut b = Vec::new();
    let mut w = Writer::new(&mut b);
    w.header(&s).expect("header");
    for e in &s.entries {
        w.entry(e).expect("entry");
    }
    w.finish().expect("finish");
    b
}

fn entry(bank: Bank, id: &str, kind: Kind, key: &[u8]) -> Entry {
    Entry {
        bank,
        id: id.into(),
        kind,
        stamp: 7,
        public_key: key.to_vec(),
    }
}

#[test]
fn invalid_entries_are_refused_naming_the_id_even_with_a_valid_checksum() {
    let k = pem("k");
    let a = Kind::Accepted;
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
    let empty = forged(vec![entry(Bank::Keys, "m1", a, b"")]);
    assert!(
        why(&empty).contains("\"m1\"") && why(&empty).contains("empty public key"),
        "{}",
        why(&empty)
    );
    let big = forged(vec![entry(Bank::Keys, "m2", a, &vec![b'A'; 2 << 20])]);
    assert!(
        why(&big).contains("\"m2\"") && why(&big).contains("2097152 bytes"),
        "{}",
        why(&big)
    );
    let tomb_key = forged(vec![entry(Bank::Keys, "m3", Kind::Absent, &k)]);
    assert!(why(&tomb_key).contains("tombstone with a key"));
    let denied_in_keys = forged(vec![entry(Bank::Keys, "m4", Kind::Denied, &k)]);
    assert!(why(&denied_in_keys).contains("kind denied"));
    let private = b"-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----\n";
    let p = forged(vec![entry(Bank::Denied, "a", Kind::Denied, private)]);
    assert!(why(&p).contains("PRIVATE KEY"));
    // The writer refuses what the reader would.
    let s = Snapshot {
        cluster: None,
        store: [1; 16],
        generation: 1,
        entries: vec![entry(Bank::Keys, "a", a, b"")],
    };
    assert!(s.to_bytes().is_err());
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
            &keycache::key::encode_key_value(KeyState::Accepted, private),
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
    let lock =
        std::fs::File::open(keycache::format::lock_path(store.keys_table().path())).expect("lock");
    lock.lock().expect("flock");
    let t0 = std::time::Instant::now();
    let opts = SnapshotOptions {
        lock_wait: Duration::from_millis(200),
        ..SnapshotOptions::default()
    };
    // flock locks are per open file description: this process's other
    // descriptor conflicts with the held one.
    let e = take(&store, &opts).expect_err("busy");
    assert!(
        matches!(e, Error::Store(keycache::Error::Busy { .. })),
        "{e}"
    );
    assert!(t0.elapsed() >= Duration::from_millis(200));
    lock.unlock().expect("unlock");
    assert_eq!(take(&store, &opts).expect("take").entries.len(), 1);
}

#[test]
fn a_snapshot_taken_into_a_file_holds_what_take_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sample_store(dir.path());
    let o = SnapshotOptions::default();
    take(&store, &o).expect("the history begins");
    store.remove(&id("db1")).expect("delete");
    store.deny(&id("db2"), &pem("d2\0\0")).expect("deny");
    let out = tempfile::tempdir().expect("out");
    let path = out.path().join("s.snap");
    let n = take_to_file(&store, &o, &path).expect("take into a file");
    let streamed = Snapshot::read_file(&path).expect("read back");
    let taken = take(&store, &o).expect("take");
    assert_eq!(n, streamed.entries.len() as u64);
    assert_eq!(
        streamed.entries, taken.entries,
        "the same entries, tombstone included"
    );
    assert!(streamed
        .entries
        .iter()
        .any(|e| e.id == "db1" && e.kind == Kind::Absent));
    assert_eq!(
        (streamed.store, streamed.cluster),
        (taken.store, taken.cluster)
    );
    assert!(streamed.generation < taken.generation);
    // A value holding a private key refuses it, and no file is left.
    store
        .put(
            &id("bad"),
            KeyState::Accepted,
            b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
        )
        .expect_err("the store itself refuses private keys");
    std::fs::remove_file(&path).expect("rm");
    let before = std::fs::read(dir.path().join(keycache::format::HISTORY_FILE)).expect("history");
    let err = take_to_file(
        &store,
        &SnapshotOptions {
            lock_wait: Duration::ZERO,
            ..SnapshotOptions::default()
        },
        &out.path().join("missing-dir").join("s.snap"),
    )
    .expect_err("no directory to write in");
    assert!(err.to_string().contains("s.snap"), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join(keycache::format::HISTORY_FILE)).expect("history"),
        before,
        "nothing saved"
    );
    assert_eq!(std::fs::read_dir(out.path()).expect("ls").count(), 0);
}
