//! Fuzz body: untrusted snapshot bytes (what `keycache merge -` reads from
//! a peer) read as `keycache merge --dry-run` reads them, then planned
//! against a store that holds keys, versions and tombstones.
//!
//! Properties: reading never panics, and a snapshot that reads is written
//! back to the same bytes (one encoding); the dry run writes nothing (the
//! store's files are byte-identical afterwards); a plan only ever writes a
//! value the snapshot holds (or holds it pending: never accepted with a
//! key no side accepted), every value it would write is a PEM public key
//! within the limits, and its counts add up.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use keycache::{KeyState, MinionId, OpenOptions, Store};
use keycache_merge::history::Kind;
use keycache_merge::merge::{self, Action, MergeOptions};
use keycache_merge::snapshot::{self, Snapshot, SnapshotOptions};

/// A store made once per process: a few keys in every state, a denied
/// key, a tombstone, and its history on disk.
fn store_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = crate::scratch::fuzz_base().join(format!("snapshot-merge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        let s = open(&d);
        let pem = |t: &str| {
            format!("-----BEGIN PUBLIC KEY-----\nMIIB{t}AQAB\n-----END PUBLIC KEY-----\n")
        };
        let id = |s: &str| MinionId::new(s).expect("id");
        s.put(&id("a"), KeyState::Accepted, pem("a").as_bytes())
            .expect("put");
        s.put(&id("b"), KeyState::Pending, pem("b").as_bytes())
            .expect("put");
        s.put(&id("c"), KeyState::Rejected, pem("c").as_bytes())
            .expect("put");
        s.put(&id("gone"), KeyState::Accepted, pem("g").as_bytes())
            .expect("put");
        s.deny(&id("a"), pem("a2").as_bytes()).expect("deny");
        snapshot::take(&s, &SnapshotOptions::default()).expect("take");
        s.remove(&id("gone")).expect("remove");
        snapshot::take(&s, &SnapshotOptions::default()).expect("take");
        d
    })
}

fn open(d: &Path) -> Store {
    let mut opts = OpenOptions::default();
    opts.params.size = 61;
    Store::open_with(d, &opts).expect("open")
}

/// Every file of `d`, with its bytes.
fn files(d: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(d)
        .expect("ls")
        .flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap_or_default()))
        .collect();
    v.sort();
    v
}

/// The fuzz body.
pub fn snapshot_merge(data: &[u8]) {
    let d = store_dir();
    let store = open(d);
    let before = files(d);
    // A fuzzed snapshot and this store may name no cluster: planned all the same.
    let opts = MergeOptions {
        allow_unknown_cluster: true,
        ..MergeOptions::default()
    };
    // As `keycache merge` reads it, and in full.
    let h = keycache_merge::history::History::load(d, &opts.history).expect("history");
    let filtered = merge::read_snapshot(&h, &mut &data[..], "fuzz");
    let full = Snapshot::from_bytes(data, "fuzz");
    assert_eq!(
        filtered.is_ok(),
        full.is_ok(),
        "a filtered read judges the bytes as a full one"
    );
    let (Ok(theirs), Ok(full)) = (filtered, full) else {
        return;
    };
    assert_eq!(
        full.to_bytes().expect("writes what it read"),
        data,
        "one encoding"
    );
    assert!(theirs.entries.len() <= full.entries.len());
    let plan = match merge::dry_run_with(&store, h, &theirs, &opts) {
        Ok(p) => p,
        Err(e) => {
            let s = e.to_string();
            assert!(!s.is_empty());
            assert_eq!(files(d), before, "a refused dry run wrote");
            return;
        }
    };
    assert_eq!(files(d), before, "a dry run wrote");
    let c = plan.counts();
    assert_eq!(c.added + c.changed + c.deleted + c.held, c.store_changes);
    for e in &plan.entries {
        let t = full
            .get(e.bank(), e.id())
            .expect("a planned entry is one of the snapshot's");
        assert_eq!(&e.theirs, t);
        match e.action {
            Action::Held => {
                assert_eq!(t.kind, Kind::Accepted);
                assert_eq!(e.result.kind, Kind::Pending);
                assert_eq!(e.result.public_key, t.public_key);
            }
            _ => assert_eq!(&e.result, t, "the plan writes their version as it is"),
        }
        if e.result.kind != Kind::Absent {
            assert!(
                keycache::pem::check_public_key(&e.result.public_key).is_ok(),
                "{:?}: not a public key",
                e.id()
            );
        }
        assert!(e.ours.is_none_or(|o| e.theirs.version().beats(&o)));
    }
}
