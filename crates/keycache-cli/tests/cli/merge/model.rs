//! The merges' model test: isolated peers converge on one key state
//! through `keycache snapshot` and `keycache merge` (docs/install.md's timer
//! recipe: `--seen`, `--base` and `--write-base` given as the timers give
//! them), and no revoked key comes back.
//!
//! Two and three peers (stores in separate directories) get random
//! operations: new pending keys and denied keys written by Salt 3008.5's own
//! `mmap_key` writer (`salt_driver.py apply`, as a master's sign-in and
//! `salt-key` do), accepts through Salt's writer too, and `keycache
//! accept`, `reject` and `delete`; ids are shared between peers, so the same
//! id gets different keys on two peers. The peers first join one cluster
//! (peer 1 and peer 0 merge each other, every other peer merges peer 0
//! first, then peer 0 it); between phases, random pairwise merges (`keycache
//! snapshot` of one peer into `keycache merge` of another, by file and by
//! pipe); then rounds of merges of every ordered pair.
//!
//! Before each merge the merging peer's own snapshot is taken too, so that
//! both sides' versions (stamps, kinds, tombstones) are known; after the
//! merge the store equals what the model says: per (bank, id), the value
//! of the version that wins by the documented order (the later stamp, then
//! the more restrictive kind: absent, denied, rejected, pending, accepted;
//! then the greater hash), written with exit 0 and as many entries written
//! as values changed. At the end every pair of peers is identical
//! (`keycache diff` exits 0), and every key accepted was accepted by an
//! operation on some peer after the last revocation (reject or delete) of
//! its id on any peer: no revoked key comes back.
//!
//! The parts: [`store`] (a store as the model sees it), [`rule`] (the merge
//! rule), [`peers`] (the peers and what happened on them), [`ops`] (random
//! operations), [`merges`] (merges checked against the model), [`runs`]
//! (whole runs); the tests are here.

mod merges;
mod ops;
mod peers;
mod rule;
mod runs;
mod store;

use crate::common::Rng;

use peers::Peers;
use runs::{run, run_copied, run_migrated_twice, seeds};

#[test]
fn two_peers_converge_on_the_model() {
    let mut merges = 0;
    for seed in seeds(&[1, 2]) {
        merges += run(2, seed, 3).0;
    }
    assert!(merges >= 10, "{merges} merges");
}

#[test]
fn three_peers_converge_on_the_model() {
    let (mut merges, mut revoked, mut rekeyed) = (0, 0, 0);
    for seed in seeds(&[11, 12]) {
        let (m, r, k) = run(3, seed, 3);
        merges += m;
        revoked += r;
        rekeyed += k;
    }
    // The same ids get keys and revocations on several peers: merges must
    // take accepted keys out of accepted, and replace keys, for the test
    // to exercise the order of versions.
    assert!(
        revoked > 0 && rekeyed > 0,
        "in {merges} merges: {revoked} revocations taken, {rekeyed} keys replaced"
    );
}

#[test]
fn a_store_copied_from_another_and_a_tree_migrated_twice_keep_every_action() {
    // "No operator action undone by a peer that never saw a later one" is
    // asserted in every merge (`Peers::check_not_undone`).
    let mut merges = 0;
    for seed in seeds(&[21, 22, 23]) {
        merges += run_copied(seed, 2).0;
        merges += run_migrated_twice(seed + 100, 2).0;
    }
    assert!(merges >= 20, "{merges} merges");
}

#[test]
fn a_new_peer_catches_up_then_merges_like_the_others() {
    let mut rng = Rng::new(99);
    let mut p = Peers::new(3);
    for i in 0..2 {
        p.random_ops(&mut rng, i, 10);
    }
    // Peers 0 and 1 agree first; peer 2 is new and empty.
    p.merge(1, 0, false);
    p.merge(0, 1, false);
    p.merge(1, 0, false);
    assert!(p.models[0] == p.models[1]);
    // The new peer's first merge takes everything.
    p.merge(2, 0, true);
    assert_eq!(p.models[2], p.models[0]);
    p.random_ops(&mut rng, 2, 6);
    p.converge(&mut rng, 3);
    p.check_end();
}
