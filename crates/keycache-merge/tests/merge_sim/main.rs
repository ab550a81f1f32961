//! Simulation of 2 to 4 peers of a cluster exchanging snapshots by the
//! docs/install.md's timer recipe (`snapshot` piped into `merge --base F
//! --write-base F`, in process), with operator actions (accept, reject,
//! delete, deny, re-key, new minions) made on the banks directly, as Salt's
//! own writers make them (the history finds them), and the events that
//! used to undo revocations: new peers, peers restored from older copies of
//! their store directory, wiped peers, lost and unreadable bases, replayed
//! older snapshots, another cluster's snapshots and a peer's own.
//!
//! Two peers may also start as one store twice, the way that used to undo
//! the accepts made before their first merge: a store made (its history
//! begun by `begin_if_missing`, as the Salt driver's first write does) and
//! copied file by file into another directory (`cp -a`), or one
//! `localfs_key` tree migrated into two stores, the second later. Operators
//! accept, reject and delete keys on both before the first merge between
//! them. A new peer may also be a copy of a running one.
//!
//! Asserted at every merge:
//!
//! - no revoked key comes back: a merge never makes an id accepted with a
//!   key unless an operator accepted that key after the id's last
//!   revocation (deletion or rejection of the id, or the key denied) that
//!   the receiving peer knows of; refused merges write nothing;
//! - no operator action is undone by a peer that never saw a later one:
//!   each peer knows the writes it made and those it merged (as of the
//!   snapshots); when the latest write of an entry that the receiving peer
//!   knows of after the merge is an operator's accept, rejection or
//!   deletion, and it is later than every other write of the entry known,
//!   the peer holds what that action left. "Later" is the design's order,
//!   not only the sim's (see `Sim::check_kept`).
//!
//! After the events stop, rounds of merges between all pairs make every
//! peer equal, and what they hold passes both rules.
//!
//! One global logical clock drives every peer (each action and merge a
//! tick), so "after" is exact. `KEYCACHE_MERGE_SIMS` sets the number of
//! runs (1500 by default); `KEYCACHE_MERGE_SEED` the first seed.
//!
//! The parts: [`model`] (what the sim records), [`sim`] (the stores on one
//! clock), [`actions`] (writes on a peer's banks), [`checks`] (the two
//! invariants), [`run`] (a run's steps and its end); the tests are here.

mod actions;
mod checks;
mod model;
mod run;
mod sim;

use keycache::KeyState;

use model::{pem, Op, Setup, Tree, IDS};
use sim::Sim;

/// Runs `runs` sims from `KEYCACHE_MERGE_SEED` (or `seed0`) on, their first
/// two peers started as `setup` says; returns how many times the second
/// invariant applied.
fn sims(runs: u64, seed0: u64, setup: Option<Setup>) -> u64 {
    let seed0: u64 = std::env::var("KEYCACHE_MERGE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(seed0);
    let mut checks = 0;
    for seed in seed0..seed0 + runs {
        let r = std::panic::catch_unwind(|| {
            let mut s = Sim::new(seed, setup);
            s.run(40);
            s.kept_checks.get()
        });
        match r {
            Ok(n) => checks += n,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                let how = setup.map_or_else(|| "setup drawn".into(), |s| format!("{s:?}"));
                panic!(
                    "seed {seed} ({how}; KEYCACHE_MERGE_SEED={seed} KEYCACHE_MERGE_SIMS=1): {msg}"
                );
            }
        }
    }
    checks
}

fn runs(default: u64) -> u64 {
    std::env::var("KEYCACHE_MERGE_SIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn peers_converge_and_never_undo_a_revocation() {
    let runs = runs(1500);
    let checks = sims(runs, 0, None);
    eprintln!("{runs} runs: the second invariant applied {checks} times");
    assert!(
        runs < 100 || checks > 0,
        "the second invariant never applied"
    );
}

/// A tree for the scripted runs: m1 to web-2 pending, db-1 accepted,
/// .dot rejected and a key of it denied.
fn script_tree(s: &mut Sim) -> Tree {
    let mut entries = Vec::new();
    for i in 0..IDS.len() {
        let state = match i {
            4 => KeyState::Accepted,
            5 => KeyState::Rejected,
            _ => KeyState::Pending,
        };
        s.next_key += 1;
        entries.push(s.tree_entry(0, i, (Some(state), pem(i, s.next_key))));
    }
    s.next_key += 1;
    entries.push(s.tree_entry(1, 5, (None, pem(5, s.next_key))));
    Tree {
        entries,
        acts: None,
    }
}

/// Operators at work on peers 0 and 1 before their first merge, each
/// action followed by the timer's snapshot: each accepts a pending key and
/// rejects one, each deletes a key (one the other rejected), one accepts a
/// key the other rejected before, one deletes a rejected id and its denied
/// key; then the peers merge (`first_pull` first) until they agree.
fn script(s: &mut Sim, first_pull: (usize, usize)) {
    for (p, i, op) in [
        (1, 0, Op::Accept),
        (0, 1, Op::Accept),
        (1, 2, Op::Reject),
        (0, 3, Op::Reject),
        (1, 4, Op::Delete),
        (0, 2, Op::Delete),
        (1, 3, Op::Accept),
        (0, 5, Op::Delete),
    ] {
        s.apply(p, i, op);
        s.snap_of(&s.peers[p].clone());
    }
    s.pull(first_pull.0, first_pull.1);
    s.settle();
    let held = s.state(&s.peers[0]);
    let want = [
        Some(KeyState::Accepted),
        Some(KeyState::Accepted),
        None,
        Some(KeyState::Accepted),
        None,
        None,
    ];
    for (i, w) in want.into_iter().enumerate() {
        let got = held.get(&(0, i)).map(|v| v.0);
        assert_eq!(got, w.map(Some), "{} after the merges", IDS[i]);
    }
    assert_eq!(held.get(&(1, 5)), None, "the denied key of .dot");
    assert!(
        s.kept_checks.get() > 0,
        "the second invariant never applied"
    );
}

#[test]
fn actions_on_a_copied_store_before_its_first_merge_stand() {
    for first_pull in [(0, 1), (1, 0)] {
        let mut s = Sim::bare(1);
        let mut tree = script_tree(&mut s);
        let a = s.made_from(&mut tree, false);
        s.copy_peer(a);
        script(&mut s, first_pull);
    }
    sims(runs(100).div_ceil(5), 1_000_000, Some(Setup::Copied));
}

#[test]
fn actions_on_a_tree_migrated_twice_stand() {
    for first_pull in [(0, 1), (1, 0)] {
        let mut s = Sim::bare(2);
        let mut tree = script_tree(&mut s);
        s.made_from(&mut tree, true);
        // An accept on the first store before the second is made.
        s.apply(0, 1, Op::Accept);
        s.tick();
        s.made_from(&mut tree, true);
        script(&mut s, first_pull);
    }
    sims(runs(100).div_ceil(5), 2_000_000, Some(Setup::MigratedTwice));
}
