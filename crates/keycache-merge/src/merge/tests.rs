//! Merges take the winning version per entry, refuse what the module
//! lists with nothing written, check values, hold old unknown accepts
//! pending, and plan again when a writer got in between.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;
use crate::history::cluster_of;
use crate::hlc::WallClock;
use crate::snapshot::{self, SnapshotOptions};
use crate::test_util::{pem, small_store};
use keycache::key::KeyState;
use keycache::MinionId;

fn id(s: &str) -> MinionId {
    MinionId::new(s).expect("id")
}

/// Options on one clock the test moves, for both sides.
fn clocked() -> (Arc<AtomicU64>, MergeOptions, SnapshotOptions) {
    let t = Arc::new(AtomicU64::new(1_700_000_000_000_000_000));
    let t2 = t.clone();
    let h = HistoryOptions {
        wall: WallClock::new(move || t2.fetch_add(1_000, Ordering::SeqCst)),
        ..HistoryOptions::default()
    };
    let mo = MergeOptions {
        history: h.clone(),
        ..MergeOptions::default()
    };
    let so = SnapshotOptions {
        history: h,
        ..SnapshotOptions::default()
    };
    (t, mo, so)
}

struct Two {
    _d: [tempfile::TempDir; 2],
    a: Store,
    b: Store,
    mo: MergeOptions,
    so: SnapshotOptions,
    t: Arc<AtomicU64>,
}

/// `mid` put in `state` with the key of `tag`.
fn put(store: &Store, mid: &str, state: KeyState, tag: &str) {
    store.put(&id(mid), state, &pem(tag)).expect("put");
}

/// A small store in `dir` of the tests' one cluster (its `master.pub`).
fn member(dir: &std::path::Path) -> Store {
    std::fs::write(dir.join("master.pub"), pem("cluster")).expect("master.pub");
    small_store(dir)
}

fn two() -> Two {
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, b) = (member(da.path()), member(db.path()));
    let (t, mo, so) = clocked();
    Two {
        _d: [da, db],
        a,
        b,
        mo,
        so,
        t,
    }
}

/// [`two`] stores that hold `m0` (accepted on A) and have merged both ways.
fn two_in_step() -> Two {
    let t = two();
    put(&t.a, "m0", KeyState::Accepted, "k0");
    t.pull_b_from_a().expect("merge");
    t.pull_a_from_b().expect("merge");
    t
}

impl Two {
    fn snap(&self, s: &Store) -> Snapshot {
        let bytes = snapshot::take(s, &self.so)
            .expect("take")
            .to_bytes()
            .expect("bytes");
        Snapshot::from_bytes(&bytes, "peer").expect("read")
    }
    fn pull_a_from_b(&self) -> Result<MergePlan> {
        let s = self.snap(&self.b);
        merge(&self.a, &s, &self.mo).map(|(p, _)| p)
    }
    fn pull_b_from_a(&self) -> Result<MergePlan> {
        let s = self.snap(&self.a);
        merge(&self.b, &s, &self.mo).map(|(p, _)| p)
    }
}

fn state(s: &Store, i: &str) -> Option<KeyState> {
    s.get(&id(i)).expect("get").map(|e| e.state)
}

#[test]
fn changes_and_deletions_travel_and_stay() {
    let t = two();
    put(&t.a, "m1", KeyState::Accepted, "k1");
    put(&t.a, "m2", KeyState::Pending, "k2");
    assert_eq!(t.pull_b_from_a().expect("merge").counts().added, 2);
    t.a.remove(&id("m1")).expect("delete");
    t.b.set_state(&id("m2"), KeyState::Accepted)
        .expect("accept");
    let p = t.pull_b_from_a().expect("merge");
    assert_eq!((p.counts().deleted, p.counts().revoked), (1, 1));
    assert_eq!(state(&t.b, "m1"), None);
    assert_eq!(
        state(&t.b, "m2"),
        Some(KeyState::Accepted),
        "their older pending lost"
    );
    t.pull_a_from_b().expect("merge");
    assert_eq!(state(&t.a, "m1"), None);
    assert_eq!(state(&t.a, "m2"), Some(KeyState::Accepted));
    // Converged: both merges are now no-ops, any number of times.
    assert!(t.pull_a_from_b().expect("merge").is_noop());
    assert!(t.pull_b_from_a().expect("merge").is_noop());
}

#[test]
fn a_deletion_seen_later_still_beats_an_earlier_accept() {
    let t = two();
    put(&t.a, "m1", KeyState::Pending, "k1");
    t.pull_b_from_a().expect("merge");
    // b accepts, then a deletes; b's accept is seen only after a's deletion.
    t.b.set_state(&id("m1"), KeyState::Accepted)
        .expect("accept");
    t.a.remove(&id("m1")).expect("delete");
    t.pull_b_from_a().expect("merge");
    assert_eq!(state(&t.b, "m1"), None);
    t.pull_a_from_b().expect("merge");
    assert_eq!(
        state(&t.a, "m1"),
        None,
        "the earlier accept does not come back"
    );
}

#[test]
fn an_entry_added_and_deleted_between_two_observations_leaves_a_tombstone() {
    // The removal log: A (with a history) accepts and deletes m1 between
    // two merges; B accepted m1 before A's deletion. A's next merge from B
    // must not take B's accept back, and B's next merge from A deletes it.
    let t = two_in_step();
    put(&t.b, "m1", KeyState::Accepted, "k1");
    let old_b = t.snap(&t.b);
    put(&t.a, "m1", KeyState::Accepted, "k1");
    t.a.remove(&id("m1")).expect("delete");
    let log = t.a.dir().join(keycache::format::REMOVALS_FILE);
    assert!(
        std::fs::metadata(&log).expect("the log").len() > 0,
        "the removal is logged"
    );
    merge(&t.a, &old_b, &t.mo).expect("merge");
    assert_eq!(state(&t.a, "m1"), None, "the deleted key stays deleted");
    assert_eq!(
        std::fs::metadata(&log).expect("the log").len(),
        0,
        "the merge consumed the log"
    );
    t.pull_b_from_a().expect("merge");
    assert_eq!(state(&t.b, "m1"), None, "the deletion travels");
    // The same for a denied key.
    t.b.deny(&id("m2"), &pem("k2")).expect("deny");
    let snap_b = t.snap(&t.b);
    t.a.deny(&id("m2"), &pem("k2")).expect("deny");
    assert!(t.a.remove_denied(&id("m2")).expect("remove"));
    merge(&t.a, &snap_b, &t.mo).expect("merge");
    assert!(t.a.denied(&id("m2")).expect("denied").is_none());
    // A re-add of the same key after a deletion is an accept after it: it
    // wins over a revocation made before it.
    t.pull_b_from_a().expect("merge");
    t.b.remove(&id("m0")).expect("delete");
    t.pull_a_from_b().expect("merge");
    put(&t.a, "m0", KeyState::Accepted, "k0");
    t.a.remove(&id("m0")).expect("delete");
    t.a.put(&id("m0"), KeyState::Accepted, &pem("k0"))
        .expect("accept again");
    t.pull_b_from_a().expect("merge");
    assert_eq!(
        state(&t.b, "m0"),
        Some(KeyState::Accepted),
        "an accept after the revocation is kept"
    );
}

#[test]
fn a_minion_pending_on_both_masters_is_accepted_on_both_by_one_accept() {
    // A multi-master minion signs in to A and B; the operator accepts it on
    // A; B noticed its pending key after A's last observation. B's pending
    // key (a first sign-in) revokes nothing: A's accept travels to B and
    // stays on A, whichever way the merges run first.
    let t = two_in_step();
    t.a.put(&id("m1"), KeyState::Pending, &pem("k1"))
        .expect("sign-in on a");
    t.b.put(&id("m1"), KeyState::Pending, &pem("k1"))
        .expect("sign-in on b");
    t.pull_b_from_a().expect("merge: a's pending seen");
    t.a.set_state(&id("m1"), KeyState::Accepted)
        .expect("accept on a");
    // B observes (a snapshot of B) before A does.
    let snap_b = t.snap(&t.b);
    merge(&t.a, &snap_b, &t.mo).expect("merge");
    assert_eq!(
        state(&t.a, "m1"),
        Some(KeyState::Accepted),
        "a's accept kept"
    );
    t.pull_b_from_a().expect("merge");
    assert_eq!(
        state(&t.b, "m1"),
        Some(KeyState::Accepted),
        "and taken by b"
    );
    // A revocation still wins over an older accept: B rejects, A deletes.
    t.b.set_state(&id("m1"), KeyState::Rejected)
        .expect("reject on b");
    t.pull_a_from_b().expect("merge");
    assert_eq!(state(&t.a, "m1"), Some(KeyState::Rejected));
    // A pending key after a revocation is no first sign-in: it wins over
    // the accept made before the revocation.
    t.a.remove(&id("m1")).expect("delete on a");
    t.a.put(&id("m1"), KeyState::Pending, &pem("k1"))
        .expect("sign-in again on a");
    t.pull_b_from_a().expect("merge");
    assert_eq!(state(&t.b, "m1"), Some(KeyState::Pending));
}

#[test]
fn a_store_that_never_merged_logs_no_removal() {
    let t = two();
    put(&t.a, "m1", KeyState::Accepted, "k1");
    t.a.remove(&id("m1")).expect("delete");
    assert!(!t.a.dir().join(keycache::format::REMOVALS_FILE).exists());
}

#[test]
fn tombstones_of_absent_entries_are_recorded_for_later_merges() {
    // A and B hold m1; A deletes it; C (new) merges A first, then B.
    let t = two();
    let dc = tempfile::tempdir().expect("dir");
    let c = member(dc.path());
    put(&t.a, "m1", KeyState::Accepted, "k1");
    t.pull_b_from_a().expect("merge");
    t.a.remove(&id("m1")).expect("delete");
    let from_a = t.snap(&t.a);
    let p = merge(&c, &from_a, &t.mo).expect("merge").0;
    assert_eq!(p.counts().recorded, 1, "the tombstone, recorded");
    let from_b = t.snap(&t.b);
    merge(&c, &from_b, &t.mo).expect("merge");
    assert_eq!(state(&c, "m1"), None);
}

#[test]
fn own_and_foreign_snapshots_are_refused_and_write_nothing() {
    let t = two();
    put(&t.a, "m1", KeyState::Accepted, "k1");
    let own = t.snap(&t.a);
    let e = merge(&t.a, &own, &t.mo).expect_err("own");
    assert!(
        matches!(&e, Error::MergeRefused { why } if why.contains("own")),
        "{e}"
    );
    std::fs::write(t.a.dir().join("master.pub"), pem("clusterA")).expect("key");
    std::fs::write(t.b.dir().join("master.pub"), pem("clusterB")).expect("key");
    put(&t.b, "x1", KeyState::Accepted, "x1");
    let e = t.pull_a_from_b().expect_err("foreign");
    assert!(
        matches!(&e, Error::MergeRefused { why } if why.contains("another cluster")),
        "{e}"
    );
    assert_eq!(state(&t.a, "x1"), None);
    std::fs::write(t.b.dir().join("master.pub"), pem("clusterA")).expect("key");
    t.pull_a_from_b().expect("same cluster");
    assert_eq!(state(&t.a, "x1"), Some(KeyState::Accepted));
}

/// Bytes of every file under `dir`, by path.
fn files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push((p.clone(), std::fs::read(&p).expect("read")));
        }
    }
    out.sort();
    out
}

/// For [`Error::UnknownCluster`], whether the side that names no cluster
/// is the snapshot; `None` for any other error.
fn unknown_side(e: &Error) -> Option<bool> {
    match e {
        Error::UnknownCluster { snapshot, .. } => Some(*snapshot),
        _ => None,
    }
}

#[test]
fn a_side_without_a_cluster_key_is_refused_unless_allowed() {
    let t = two();
    put(&t.b, "x1", KeyState::Accepted, "x1");
    // This store's directory has no key: refused, naming the files looked for.
    std::fs::remove_file(t.a.dir().join("master.pub")).expect("rm");
    let before = files(t.a.dir());
    let e = t.pull_a_from_b().expect_err("no key here");
    let dir = t.a.dir().display().to_string();
    assert_eq!(unknown_side(&e), Some(false), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("this store's directory {dir}")),
        "{msg}"
    );
    assert!(
        msg.contains("master.pub") && msg.contains("cluster.pub"),
        "{msg}"
    );
    let s = t.snap(&t.b);
    let e = dry_run(&t.a, &s, &t.mo).expect_err("dry run too");
    assert_eq!(unknown_side(&e), Some(false), "{e}");
    assert_eq!(files(t.a.dir()), before, "nothing written");
    assert_eq!(state(&t.a, "x1"), None);
    // The snapshot names none: refused the same, naming its side.
    std::fs::write(t.a.dir().join("master.pub"), pem("cluster")).expect("key");
    std::fs::remove_file(t.b.dir().join("master.pub")).expect("rm");
    let before = files(t.a.dir());
    let e = t.pull_a_from_b().expect_err("no key there");
    assert_eq!(unknown_side(&e), Some(true), "{e}");
    assert!(e.to_string().contains("the snapshot"), "{e}");
    assert!(e.to_string().contains("master.pub"), "{e}");
    assert_eq!(files(t.a.dir()), before, "nothing written");
    assert_eq!(state(&t.a, "x1"), None);
    // Allowed: both ways merge.
    let allowed = MergeOptions {
        allow_unknown_cluster: true,
        ..t.mo.clone()
    };
    merge(&t.a, &t.snap(&t.b), &allowed).expect("allowed");
    assert_eq!(state(&t.a, "x1"), Some(KeyState::Accepted));
    std::fs::remove_file(t.a.dir().join("master.pub")).expect("rm");
    put(&t.b, "x2", KeyState::Accepted, "x2");
    merge(&t.a, &t.snap(&t.b), &allowed).expect("allowed");
    assert_eq!(state(&t.a, "x2"), Some(KeyState::Accepted));
}

#[test]
fn older_snapshots_of_a_peer_are_refused() {
    let t = two();
    put(&t.b, "m1", KeyState::Accepted, "k1");
    let old = t.snap(&t.b);
    t.b.remove(&id("m1")).expect("delete");
    let new = t.snap(&t.b);
    merge(&t.a, &new, &t.mo).expect("merge");
    let e = merge(&t.a, &old, &t.mo).expect_err("replay");
    assert!(
        matches!(&e, Error::MergeRefused { why } if why.contains("older")),
        "{e}"
    );
    // The base file says the same, for a store that lost its history.
    let base = Base::of(&new);
    assert!(base.check(&old).is_err());
    assert!(base.check(&new).is_ok());
}

#[test]
fn clocks_too_far_ahead_and_snapshots_past_the_horizon_are_refused() {
    let t = two();
    let mut s = t.snap(&t.b);
    s.generation = t.t.load(Ordering::SeqCst) + 3_600_000_000_000;
    let e = merge(&t.a, &s, &t.mo).expect_err("ahead");
    assert!(e.to_string().contains("ahead"), "{e}");
    s.generation = 1;
    let e = merge(&t.a, &s, &t.mo).expect_err("old");
    assert!(e.to_string().contains("horizon"), "{e}");
}

#[test]
fn a_mass_revocation_is_refused_unless_allowed() {
    let t = two();
    for n in 0..30 {
        put(&t.a, &format!("m{n}"), KeyState::Accepted, &format!("k{n}"));
    }
    t.pull_b_from_a().expect("merge");
    for n in 0..24 {
        t.a.remove(&id(&format!("m{n}"))).expect("delete");
    }
    let e = t.pull_b_from_a().expect_err("mass");
    assert!(e.to_string().contains("24 of this store's 30"), "{e}");
    assert_eq!(
        state(&t.b, "m0"),
        Some(KeyState::Accepted),
        "nothing written"
    );
    let mo = MergeOptions {
        allow_mass_revoke: true,
        ..t.mo.clone()
    };
    let s = t.snap(&t.a);
    merge(&t.b, &s, &mo).expect("allowed");
    assert_eq!(state(&t.b, "m0"), None);
    // Under the floor, any share may go.
    let u = two();
    for n in 0..4 {
        put(&u.a, &format!("m{n}"), KeyState::Accepted, &format!("k{n}"));
    }
    u.pull_b_from_a().expect("merge");
    for n in 0..4 {
        u.a.remove(&id(&format!("m{n}"))).expect("delete");
    }
    u.pull_b_from_a().expect("4 of 4, under the floor");
}

#[test]
fn values_that_are_not_public_keys_refuse_the_merge_naming_the_id() {
    let t = two();
    put(&t.a, "good", KeyState::Accepted, "ok");
    let mut s = t.snap(&t.a);
    for (key, what) in [
        (b"not a key at all".to_vec(), "not a public key"),
        (vec![b'A'; 70_000], "bytes"),
    ] {
        s.entries.push(Entry {
            bank: Bank::Keys,
            id: "zzjunk".into(),
            kind: Kind::Accepted,
            stamp: s.generation - 1,
            public_key: key,
        });
        let e = merge(&t.b, &s, &t.mo).expect_err("junk");
        assert!(
            e.to_string().contains("zzjunk") && e.to_string().contains(what),
            "{e}"
        );
        assert_eq!(state(&t.b, "good"), None, "nothing written");
        s.entries.pop();
    }
}

#[test]
fn an_old_accept_unknown_to_an_old_store_is_held_pending() {
    let t = two();
    // b's history began long ago.
    t.snap(&t.b);
    let mut s = t.snap(&t.a);
    let day = 86_400_000_000_000u64;
    t.t.fetch_add(40 * day, Ordering::SeqCst);
    s.generation = t.t.load(Ordering::SeqCst);
    s.entries.push(Entry {
        bank: Bank::Keys,
        id: "old1".into(),
        kind: Kind::Accepted,
        stamp: s.generation - 35 * day,
        public_key: pem("old"),
    });
    let p = merge(&t.b, &s, &t.mo).expect("merge").0;
    assert_eq!(p.counts().held, 1);
    assert_eq!(state(&t.b, "old1"), Some(KeyState::Pending));
}

#[test]
fn a_writer_in_between_makes_the_plan_stale_and_merge_plans_again() {
    let t = two();
    put(&t.a, "m1", KeyState::Accepted, "k1");
    t.pull_b_from_a().expect("merge");
    t.a.remove(&id("m1")).expect("delete");
    let s = t.snap(&t.a);
    let mut h = History::load(t.b.dir(), &t.mo.history).expect("load");
    h.observe(&t.b, &t.mo.history, true, |_, _, _, _, _| Ok(()))
        .expect("observe");
    let p = plan(&h, cluster_of(&t.b).expect("cluster"), &s, &t.mo).expect("plan");
    // Salt rejects m1 on b before the commit.
    t.b.set_state(&id("m1"), KeyState::Rejected)
        .expect("reject");
    let e = apply::commit(&t.b, &mut h, &p, &[], &t.mo).expect_err("stale");
    assert!(matches!(e, Error::StalePlan { .. }), "{e}");
    assert_eq!(
        state(&t.b, "m1"),
        Some(KeyState::Rejected),
        "nothing written"
    );
    // merge() observes again: b's rejection is newer than a's deletion.
    merge(&t.b, &s, &t.mo).expect("merge");
    assert_eq!(state(&t.b, "m1"), Some(KeyState::Rejected));
}

#[test]
fn merges_commute_over_random_histories() {
    use keycache_testkit::common::Rng;
    for seed in 0..40 {
        let mut rng = Rng::new(seed);
        let t = two();
        let dc = tempfile::tempdir().expect("dir");
        let c = member(dc.path());
        let stores = [&t.a, &t.b, &c];
        for _ in 0..30 {
            let s = stores[rng.below(3) as usize];
            let i = id(&format!("m{}", rng.below(4)));
            match rng.below(4) {
                0 => s
                    .put(&i, KeyState::Pending, &pem(&format!("k{}", rng.below(3))))
                    .map(drop),
                1 => s.set_state(&i, KeyState::Accepted).map(drop),
                2 => s.set_state(&i, KeyState::Rejected).map(drop),
                _ => s.remove(&i).map(drop),
            }
            .expect("op");
            if rng.one_in(3) {
                let (x, y) = (rng.below(3) as usize, rng.below(3) as usize);
                if x != y {
                    let snap = t.snap(stores[x]);
                    merge(stores[y], &snap, &t.mo).expect("merge");
                }
            }
        }
        for _ in 0..2 {
            for x in 0..3 {
                for y in 0..3 {
                    if x != y {
                        let snap = t.snap(stores[x]);
                        merge(stores[y], &snap, &t.mo).expect("merge");
                    }
                }
            }
        }
        let view = |s: &Store| {
            (0..4)
                .map(|n| {
                    s.get(&id(&format!("m{n}")))
                        .expect("get")
                        .map(|e| (e.state, e.public_key))
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(view(&t.a), view(&t.b), "seed {seed}");
        assert_eq!(view(&t.a), view(&c), "seed {seed}");
    }
}

/// Every regular file of `from` copied into `to`: a store copied as an
/// operator copies a pki dir (`cp -a`).
fn copy_store_files(from: &std::path::Path, to: &std::path::Path) {
    for f in std::fs::read_dir(from).expect("ls") {
        let f = f.expect("entry");
        if f.file_type().expect("type").is_file() {
            std::fs::copy(f.path(), to.join(f.file_name())).expect("copy");
        }
    }
}

/// Both ways, twice: every merge of the first round.
fn merge_rounds(t: &Two) {
    for _ in 0..2 {
        t.pull_a_from_b().expect("merge");
        t.pull_b_from_a().expect("merge");
    }
}

#[test]
fn a_copied_store_and_its_original_keep_every_operator_action() {
    // A second master set up as a copy of the first's store: each accepts,
    // rejects and deletes before the first merge round. Without a history
    // begun when A's store was made, both stamp at their first observation
    // and the peer's pending value ties with (and undoes) every accept.
    let t = two();
    for n in 1..=6 {
        put(&t.a, &format!("p{n}"), KeyState::Pending, &format!("kp{n}"));
    }
    put(&t.a, "a1", KeyState::Accepted, "ka1");
    put(&t.a, "a2", KeyState::Accepted, "ka2");
    crate::history::begin_if_missing(&t.a, &t.mo.history, None).expect("begin");
    copy_store_files(t.a.dir(), t.b.dir());
    let b = small_store(t.b.dir());
    let t = Two { b, ..t };
    // A: accept p1, reject p2, delete a1. B: accept p3, reject p4, delete a2.
    t.a.set_state(&id("p1"), KeyState::Accepted)
        .expect("accept");
    t.a.set_state(&id("p2"), KeyState::Rejected)
        .expect("reject");
    t.a.remove(&id("a1")).expect("delete");
    t.b.set_state(&id("p3"), KeyState::Accepted)
        .expect("accept");
    t.b.set_state(&id("p4"), KeyState::Rejected)
        .expect("reject");
    t.b.remove(&id("a2")).expect("delete");
    // An accept on both sides of one id, and a deletion of a pending key.
    t.a.set_state(&id("p5"), KeyState::Accepted)
        .expect("accept");
    t.b.remove(&id("p6")).expect("delete");
    merge_rounds(&t);
    for s in [&t.a, &t.b] {
        let on = s.dir().display().to_string();
        assert_eq!(state(s, "p1"), Some(KeyState::Accepted), "{on}");
        assert_eq!(state(s, "p3"), Some(KeyState::Accepted), "{on}");
        assert_eq!(state(s, "p5"), Some(KeyState::Accepted), "{on}");
        assert_eq!(state(s, "p2"), Some(KeyState::Rejected), "{on}");
        assert_eq!(state(s, "p4"), Some(KeyState::Rejected), "{on}");
        assert_eq!(state(s, "a1"), None, "{on}");
        assert_eq!(state(s, "a2"), None, "{on}");
        assert_eq!(state(s, "p6"), None, "{on}");
    }
    // Two stores, told apart: their snapshots name different stores.
    assert_ne!(t.snap(&t.a).store, t.snap(&t.b).store);
}

#[test]
fn accepts_on_a_tree_migrated_twice_survive_the_first_merge() {
    // Two stores made from the same contents (a tree migrated twice): A
    // first, B later. An accept on A before B was made, one after, and one
    // on B, all beat the other store's creation-time pending key.
    let t = two();
    for s in [&t.a, &t.b] {
        for n in 1..=4 {
            put(s, &format!("p{n}"), KeyState::Pending, &format!("kp{n}"));
        }
        put(s, "r1", KeyState::Rejected, "kr1");
    }
    crate::history::begin_if_missing(&t.a, &t.mo.history, None).expect("begin");
    t.a.set_state(&id("p1"), KeyState::Accepted)
        .expect("accept before B");
    // A is observed (a snapshot, say) before B is made.
    t.snap(&t.a);
    t.t.fetch_add(1_000_000, Ordering::SeqCst);
    crate::history::begin_if_missing(&t.b, &t.mo.history, None).expect("begin");
    t.t.fetch_add(1_000_000, Ordering::SeqCst);
    t.a.set_state(&id("p2"), KeyState::Accepted)
        .expect("accept after B");
    t.b.set_state(&id("p3"), KeyState::Accepted)
        .expect("accept on B");
    t.b.remove(&id("p4")).expect("delete on B");
    merge_rounds(&t);
    for s in [&t.a, &t.b] {
        let on = s.dir().display().to_string();
        for p in ["p1", "p2", "p3"] {
            assert_eq!(state(s, p), Some(KeyState::Accepted), "{p} on {on}");
        }
        assert_eq!(state(s, "p4"), None, "{on}");
        assert_eq!(state(s, "r1"), Some(KeyState::Rejected), "{on}");
    }
    assert_ne!(t.snap(&t.a).store, t.snap(&t.b).store);
}
