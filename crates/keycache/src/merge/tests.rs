//! The merge rules (one-sided changes, unions, conflicts, key mismatches),
//! their symmetry and the security invariant over random inputs, and
//! `apply` against a store.

use super::*;
use crate::key::KeyState;
use crate::store::TreeSync;
use crate::test_util::{pem, small_store};
use crate::{Error, MinionId};
use keycache_testkit::common::Rng;

const A: Option<KeyState> = Some(KeyState::Accepted);
const P: Option<KeyState> = Some(KeyState::Pending);
const R: Option<KeyState> = Some(KeyState::Rejected);

fn e(bank: Bank, id: &str, state: Option<KeyState>, key: &str, mtime: u64) -> Entry {
    Entry {
        bank,
        id: id.into(),
        state,
        pub_key: pem(key),
        mtime,
    }
}

fn k(id: &str, state: Option<KeyState>, key: &str) -> Entry {
    e(Bank::Keys, id, state, key, 1)
}

fn snap(entries: Vec<Entry>) -> Snapshot {
    Snapshot::from_entries(entries).expect("a valid snapshot")
}

/// (bank, id, state, key) of every entry: what peers must agree on.
fn values(s: &Snapshot) -> Vec<(Bank, String, &'static str, Vec<u8>)> {
    s.entries
        .iter()
        .map(|e| (e.bank, e.id.clone(), e.state_name(), e.pub_key.clone()))
        .collect()
}

fn state_of(s: &Snapshot, id: &str) -> Option<(Option<KeyState>, Vec<u8>)> {
    s.get(Bank::Keys, id).map(|e| (e.state, e.pub_key.clone()))
}

#[test]
fn one_sided_changes_win_deletions_included() {
    let base = snap(vec![
        k("a", P, "a"),
        k("b", P, "b"),
        k("c", A, "c"),
        k("d", P, "d"),
    ]);
    // Ours accepted d; theirs accepted a, deleted b, added e.
    let ours = snap(vec![
        k("a", P, "a"),
        k("b", P, "b"),
        k("c", A, "c"),
        k("d", A, "d"),
    ]);
    let theirs = snap(vec![
        k("a", A, "a"),
        k("c", A, "c"),
        k("d", P, "d"),
        k("e", P, "e"),
    ]);
    let p = plan(&ours, &theirs, Some(&base), &MergeOptions::default());
    let acts: Vec<(&str, Action)> = p
        .entries
        .iter()
        .map(|e| (e.id.as_str(), e.action))
        .collect();
    assert_eq!(
        acts,
        [
            ("a", Action::Changed),
            ("b", Action::Deleted),
            ("e", Action::Added)
        ]
    );
    assert_eq!(state_of(&p.result, "a"), Some((A, pem("a"))));
    assert_eq!(state_of(&p.result, "b"), None);
    assert_eq!(
        state_of(&p.result, "d"),
        Some((A, pem("d"))),
        "ours-only change stays"
    );
    assert_eq!(p.counts().store_changes, 3);
    assert!(p.three_way);
}

#[test]
fn a_union_adds_and_never_deletes() {
    let ours = snap(vec![k("a", P, "a"), k("only-ours", R, "o")]);
    let theirs = snap(vec![k("a", P, "a"), k("only-theirs", A, "t")]);
    let p = plan(&ours, &theirs, None, &MergeOptions::default());
    assert!(!p.three_way);
    assert_eq!(p.entries.len(), 1);
    assert_eq!(p.entries[0].action, Action::Added);
    assert_eq!(state_of(&p.result, "only-ours"), Some((R, pem("o"))));
    assert_eq!(state_of(&p.result, "only-theirs"), Some((A, pem("t"))));
    // Their missing entry is never a deletion without a base, whatever the policy.
    for on_conflict in [
        Policy::Restrictive,
        Policy::Newer,
        Policy::Ours,
        Policy::Theirs,
    ] {
        let o = MergeOptions {
            on_conflict,
            ..MergeOptions::default()
        };
        let p = plan(&ours, &snap(vec![]), None, &o);
        assert!(p.entries.is_empty() && p.is_noop());
    }
}

#[test]
fn restrictive_conflicts_and_deletion_against_change() {
    let base = snap(vec![k("s", P, "s"), k("d", P, "d")]);
    let ours = snap(vec![k("s", A, "s"), k("d", A, "d")]);
    let theirs = snap(vec![k("s", R, "s")]);
    let p = plan(&ours, &theirs, Some(&base), &MergeOptions::default());
    assert!(p.entries.iter().all(|e| e.action == Action::Conflict));
    assert_eq!(state_of(&p.result, "s"), Some((R, pem("s"))));
    assert_eq!(state_of(&p.result, "d"), None, "the deletion wins");
    let ours_p = plan(
        &ours,
        &theirs,
        Some(&base),
        &MergeOptions {
            on_conflict: Policy::Ours,
            ..MergeOptions::default()
        },
    );
    assert_eq!(state_of(&ours_p.result, "s"), Some((A, pem("s"))));
    assert_eq!(state_of(&ours_p.result, "d"), Some((A, pem("d"))));
}

#[test]
fn newer_takes_the_later_mtime_and_ties_as_restrictive() {
    let base = snap(vec![k("x", P, "x")]);
    let ours = snap(vec![e(Bank::Keys, "x", A, "x", 20)]);
    let theirs = snap(vec![e(Bank::Keys, "x", R, "x", 10)]);
    let o = MergeOptions {
        on_conflict: Policy::Newer,
        ..MergeOptions::default()
    };
    assert_eq!(
        state_of(&plan(&ours, &theirs, Some(&base), &o).result, "x"),
        Some((A, pem("x")))
    );
    let theirs = snap(vec![e(Bank::Keys, "x", R, "x", 20)]);
    assert_eq!(
        state_of(&plan(&ours, &theirs, Some(&base), &o).result, "x"),
        Some((R, pem("x")))
    );
}

#[test]
fn a_key_mismatch_is_never_settled_into_accepted_unless_asked() {
    let ours = snap(vec![k("m", A, "k1")]);
    let theirs = snap(vec![k("m", A, "k2")]);
    let p = plan(&ours, &theirs, None, &MergeOptions::default());
    assert_eq!(p.entries.len(), 1);
    let pe = &p.entries[0];
    assert!(pe.key_mismatch && pe.action == Action::Conflict, "{pe:?}");
    assert!(pe.reason.contains("key mismatch"), "{}", pe.reason);
    let greater = pem("k1").max(pem("k2"));
    assert_eq!(state_of(&p.result, "m"), Some((P, greater.clone())));
    assert_eq!(p.counts().key_mismatches, 1);
    let with = |m| MergeOptions {
        on_key_mismatch: m,
        ..MergeOptions::default()
    };
    let r = plan(&ours, &theirs, None, &with(KeyMismatch::Reject));
    assert_eq!(state_of(&r.result, "m"), Some((R, greater)));
    let t = plan(&ours, &theirs, None, &with(KeyMismatch::Theirs));
    assert_eq!(state_of(&t.result, "m"), Some((A, pem("k2"))));
    // Even under --on-conflict theirs, a mismatch follows its own policy.
    let o = MergeOptions {
        on_conflict: Policy::Theirs,
        ..MergeOptions::default()
    };
    assert_eq!(
        state_of(&plan(&ours, &theirs, None, &o).result, "m").map(|v| v.0),
        Some(P)
    );
}

#[test]
fn a_settlement_equal_to_the_base_is_raised() {
    // Pending with k2 agreed; one side accepted k2, the other re-keyed to
    // k1 and accepted it: held pending with the greater key is the base's
    // own value, which the other peer would read as "no change".
    let (k1, k2) = if pem("k1") < pem("k2") {
        ("k1", "k2")
    } else {
        ("k2", "k1")
    };
    let base = snap(vec![k("m", P, k2)]);
    let ours = snap(vec![k("m", A, k1)]);
    let theirs = snap(vec![k("m", A, k2)]);
    let p = plan(&ours, &theirs, Some(&base), &MergeOptions::default());
    assert_eq!(state_of(&p.result, "m"), Some((R, pem(k2))));
    assert!(
        p.entries[0].reason.contains("raised"),
        "{}",
        p.entries[0].reason
    );
}

/// A random snapshot over a few ids and keys, both banks.
fn random_snap(rng: &mut Rng) -> Snapshot {
    let mut v = Vec::new();
    for id in ["a", "b", "c", "d"] {
        let key = *rng.pick(&["k1", "k2", "k3"]);
        match rng.below(4) {
            0 => {}
            1 => v.push(e(Bank::Keys, id, A, key, rng.below(3))),
            2 => v.push(e(Bank::Keys, id, P, key, rng.below(3))),
            _ => v.push(e(Bank::Keys, id, R, key, rng.below(3))),
        }
        if rng.one_in(3) {
            let key = *rng.pick(&["k1", "k2", "k3"]);
            v.push(e(Bank::Denied, id, None, key, rng.below(3)));
        }
    }
    snap(v)
}

/// A snapshot derived from `base` by a few random changes (or unrelated).
fn mutate(rng: &mut Rng, base: &Snapshot) -> Snapshot {
    if rng.one_in(4) {
        return random_snap(rng);
    }
    let other = random_snap(rng);
    let mut v: Vec<Entry> = Vec::new();
    for id in ["a", "b", "c", "d"] {
        for bank in [Bank::Keys, Bank::Denied] {
            let from = if rng.one_in(3) { &other } else { base };
            if let Some(x) = from.get(bank, id) {
                v.push(x.clone());
            }
        }
    }
    snap(v)
}

const ALL_POLICIES: [Policy; 4] = [
    Policy::Restrictive,
    Policy::Newer,
    Policy::Ours,
    Policy::Theirs,
];
const ALL_MISMATCH: [KeyMismatch; 5] = [
    KeyMismatch::Pending,
    KeyMismatch::Reject,
    KeyMismatch::Newer,
    KeyMismatch::Ours,
    KeyMismatch::Theirs,
];

#[test]
fn property_no_key_is_accepted_that_no_side_accepted() {
    let mut rng = Rng::new(0x5eed_0001);
    for _ in 0..3000 {
        let base = random_snap(&mut rng);
        let (a, b) = (mutate(&mut rng, &base), mutate(&mut rng, &base));
        for on_conflict in ALL_POLICIES {
            for on_key_mismatch in ALL_MISMATCH {
                let o = MergeOptions {
                    on_conflict,
                    on_key_mismatch,
                };
                for bs in [Some(&base), None] {
                    let p = plan(&a, &b, bs, &o);
                    for r in p.result.entries.iter().filter(|e| e.state == A) {
                        let held = |s: &Snapshot| {
                            s.get(Bank::Keys, &r.id)
                                .is_some_and(|x| x.state == A && x.pub_key == r.pub_key)
                        };
                        assert!(held(&a) || held(&b), "{o:?} {r:?}\nA {a:?}\nB {b:?}");
                    }
                    // Without a base nothing is deleted.
                    if bs.is_none() {
                        for x in &a.entries {
                            assert!(p.result.get(x.bank, &x.id).is_some());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn property_the_default_is_symmetric_and_the_other_side_converges() {
    let mut rng = Rng::new(0x5eed_0002);
    for policy in [Policy::Restrictive, Policy::Newer] {
        let o = MergeOptions {
            on_conflict: policy,
            ..MergeOptions::default()
        };
        for _ in 0..5000 {
            let base = random_snap(&mut rng);
            let (a, b) = (mutate(&mut rng, &base), mutate(&mut rng, &base));
            for bs in [Some(&base), None] {
                let ab = plan(&a, &b, bs, &o);
                let ba = plan(&b, &a, bs, &o);
                assert_eq!(
                    values(&ab.result),
                    values(&ba.result),
                    "{policy:?}\n{a:?}\n{b:?}\n{bs:?}"
                );
                // B then merges A's new state with the same base: no change
                // to A's result (the settlement composes).
                if policy == Policy::Restrictive {
                    let b2 = plan(&b, &ab.result, bs, &o);
                    assert_eq!(
                        values(&b2.result),
                        values(&ab.result),
                        "{a:?}\n{b:?}\n{bs:?}"
                    );
                    // And A, merging B's new state with B's old one as base:
                    let a2 = plan(&ab.result, &b2.result, Some(&b), &o);
                    assert!(a2.is_noop(), "{a2:?}");
                }
            }
        }
    }
}

fn id(s: &str) -> MinionId {
    MinionId::new(s).expect("id")
}

#[test]
fn apply_writes_the_result_and_refuses_a_stale_plan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = small_store(dir.path());
    store
        .put(&id("a"), KeyState::Pending, &pem("a"))
        .expect("put");
    store
        .put(&id("b"), KeyState::Accepted, &pem("b"))
        .expect("put");
    store
        .put(&id("keep"), KeyState::Rejected, &pem("keep"))
        .expect("put");
    let so = SnapshotOptions::default();
    let ours = snapshot::take(&store, &so).expect("take");
    let base = ours.clone();
    let theirs = snap(vec![
        k("a", A, "a"),
        k("keep", R, "keep"),
        k("new", P, "new"),
        e(Bank::Denied, "a", None, "a-other", 3),
    ]);
    let p = plan(&ours, &theirs, Some(&base), &MergeOptions::default());
    assert_eq!(p.counts().store_changes, 4, "{p:?}");
    // A writer changes b meanwhile: the plan is stale, nothing is written.
    store.set_state(&id("b"), KeyState::Rejected).expect("set");
    match apply(&store, &p) {
        Err(Error::StalePlan { id, bank, .. }) => assert_eq!((id.as_str(), bank), ("b", "keys")),
        other => panic!("expected StalePlan, got {other:?}"),
    }
    assert_eq!(
        store.get(&id("a")).expect("get").map(|e| e.state),
        Some(KeyState::Pending)
    );
    // merge() plans again from a new snapshot.
    let (p2, r) =
        merge(&store, &theirs, Some(&base), &MergeOptions::default(), &so).expect("merge");
    assert_eq!(r.written, 4);
    let after = snapshot::take(&store, &so).expect("take");
    assert_eq!(values(&after), values(&p2.result));
    assert_eq!(state_of(&after, "b"), None, "b was deleted on their side");
    assert_eq!(
        after.get(Bank::Denied, "a").map(|e| e.mtime),
        Some(3),
        "their mtime kept"
    );
    let keep = after.get(Bank::Keys, "keep").expect("keep");
    assert_eq!(
        Some(keep.mtime),
        ours.get(Bank::Keys, "keep").map(|e| e.mtime)
    );
    // Applying a no-op rebuilds nothing.
    let again = plan(&after, &theirs, Some(&theirs), &MergeOptions::default());
    assert!(again.is_noop());
    assert_eq!(apply(&store, &again).expect("apply").written, 0);
}

#[test]
fn apply_keeps_the_tree_in_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = small_store(dir.path());
    store.set_tree(TreeSync::On);
    store
        .put(&id("gone"), KeyState::Accepted, &pem("gone"))
        .expect("put");
    store
        .put(&id("up"), KeyState::Pending, &pem("up"))
        .expect("put");
    assert!(dir.path().join("minions/gone").exists());
    let so = SnapshotOptions::default();
    let ours = snapshot::take(&store, &so).expect("take");
    let theirs = snap(vec![k("up", A, "up")]);
    let (_, r) = merge(&store, &theirs, Some(&ours), &MergeOptions::default(), &so).expect("merge");
    assert_eq!(r.written, 2);
    assert!(!dir.path().join("minions/gone").exists());
    assert_eq!(
        std::fs::read(dir.path().join("minions/up")).expect("read"),
        pem("up")
    );
    assert!(!dir.path().join("minions_pre/up").exists());
    assert_eq!(crate::tree::check(&store).expect("check"), vec![]);
}

#[test]
fn their_seen_section_tells_a_deletion_from_never_having_had_it() {
    // We accepted x; they merged our snapshot (so they saw x), then
    // deleted it. Our base for them predates x.
    let base = snap(vec![]);
    let ours = snap(vec![k("x", A, "x")]);
    let mut theirs = snap(vec![]);
    let p = plan(&ours, &theirs, Some(&base), &MergeOptions::default());
    assert!(
        p.is_noop(),
        "without their seen section x looks new on our side"
    );
    theirs.seen = Some(ours.entries.clone());
    let p = plan(&ours, &theirs, Some(&base), &MergeOptions::default());
    // Both sides hold a value the other had (theirs is also our base's):
    // settled as a conflict, where the deletion wins.
    assert_eq!(p.entries.len(), 1);
    assert_eq!(p.entries[0].seen.as_ref().map(|e| e.state), Some(A));
    assert_eq!(state_of(&p.result, "x"), None);
    // Their seen section alone makes the merge three-way.
    let p = plan(&ours, &theirs, None, &MergeOptions::default());
    assert!(p.three_way && state_of(&p.result, "x").is_none());
}

#[test]
fn crossed_merges_settle_symmetrically() {
    // Each side took the other's old value: both see the other's value as
    // one they already had, and both settle it the same way.
    let a_old = snap(vec![k("x", P, "x")]);
    let b_old = snap(vec![k("x", R, "x")]);
    let mut a = b_old.clone();
    a.seen = Some(b_old.entries.clone());
    let mut b = a_old.clone();
    b.seen = Some(a_old.entries.clone());
    let pa = plan(
        &snap(b_old.entries.clone()),
        &b,
        Some(&b_old),
        &MergeOptions::default(),
    );
    let pb = plan(
        &snap(a_old.entries.clone()),
        &a,
        Some(&a_old),
        &MergeOptions::default(),
    );
    assert_eq!(values(&pa.result), values(&pb.result));
    assert_eq!(state_of(&pa.result, "x"), Some((R, pem("x"))));
}

#[test]
fn their_seen_section_alone_takes_their_deletion() {
    // A new peer's first merge from us (no base here): they merged our x
    // and deleted it; our seen-less view would keep x.
    let ours = snap(vec![k("x", A, "x"), k("y", P, "y")]);
    let mut theirs = snap(vec![k("y", P, "y")]);
    theirs.seen = Some(ours.entries.clone());
    let p = plan(&ours, &theirs, None, &MergeOptions::default());
    assert_eq!(p.entries.len(), 1);
    assert_eq!(p.entries[0].action, Action::Deleted);
    assert_eq!(state_of(&p.result, "x"), None);
}

/// One random local operation on a peer's snapshot: a new key (pending),
/// accept, reject, delete, deny; accepted (id, key) pairs are recorded.
fn local_op(
    rng: &mut Rng,
    s: &Snapshot,
    n: u64,
    accepted: &mut Vec<(String, Vec<u8>)>,
) -> Snapshot {
    let mut v = s.entries.clone();
    let id = *rng.pick(&["a", "b", "c", "d", "e"]);
    let pos = |v: &[Entry], bank: Bank| v.iter().position(|e| e.bank == bank && e.id == id);
    match (rng.below(5), pos(&v, Bank::Keys)) {
        (0, None) => v.push(e(Bank::Keys, id, P, &format!("{id}{n}"), n)),
        (1, Some(i)) if v[i].state == P => {
            v[i].state = A;
            accepted.push((id.to_owned(), v[i].pub_key.clone()));
        }
        (2, Some(i)) => v[i].state = R,
        (3, _) => v.retain(|x| x.id != id),
        (4, _) => {
            v.retain(|x| !(x.id == id && x.bank == Bank::Denied));
            v.push(e(Bank::Denied, id, None, &format!("{id}d{n}"), n));
        }
        _ => {}
    }
    snap(v)
}

#[test]
fn property_peers_converge_with_bases_and_seen_sections() {
    let mut rng = Rng::new(0x5eed_0003);
    let o = MergeOptions::default();
    let sims: u64 = std::env::var("KEYCACHE_MERGE_SIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    for _ in 0..sims {
        let n = 2 + rng.below(3) as usize;
        let mut peers = vec![snap(vec![]); n];
        // bases[i][j]: j's snapshot that i merged last.
        let mut bases: Vec<Vec<Option<Snapshot>>> = vec![vec![None; n]; n];
        let mut accepted = Vec::new();
        let mut tick = 0;
        let merge_into = |peers: &mut Vec<Snapshot>,
                          bases: &mut Vec<Vec<Option<Snapshot>>>,
                          i: usize,
                          j: usize| {
            let mut theirs = peers[j].clone();
            theirs.seen = bases[j][i].as_ref().map(|b| b.entries.clone());
            let p = plan(&peers[i], &theirs, bases[i][j].as_ref(), &o);
            bases[i][j] = Some(peers[j].clone());
            peers[i] = p.result;
        };
        for _ in 0..12 {
            for _ in 0..rng.below(4) {
                let p = rng.below(n as u64) as usize;
                tick += 1;
                peers[p] = local_op(&mut rng, &peers[p], tick, &mut accepted);
            }
            for _ in 0..rng.below(3) {
                let i = rng.below(n as u64) as usize;
                let j = (i + 1 + rng.below(n as u64 - 1) as usize) % n;
                merge_into(&mut peers, &mut bases, i, j);
            }
        }
        let mut rounds = 0;
        while peers.windows(2).any(|w| values(&w[0]) != values(&w[1])) {
            rounds += 1;
            assert!(rounds <= 4, "no convergence: {peers:#?}");
            for i in 0..n {
                for j in 0..n {
                    if i != j {
                        merge_into(&mut peers, &mut bases, i, j);
                    }
                }
            }
        }
        for x in peers[0].entries.iter().filter(|x| x.state == A) {
            assert!(
                accepted.contains(&(x.id.clone(), x.pub_key.clone())),
                "{x:?}"
            );
        }
    }
}
