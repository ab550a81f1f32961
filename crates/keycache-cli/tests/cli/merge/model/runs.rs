//! Whole runs: peers set up (empty, one a copy of another, or two stores
//! migrated from one tree), operations and merges in phases, then rounds
//! until they agree.

use keycache::Bank;

use crate::common::{s, Rng};

use super::peers::{Event, Peers, IDS, TREE};
use super::store::{kc, ok, read};

/// The seeds to run: `fixed`, then as many more as
/// `KEYCACHE_MERGE_MODEL_SEEDS` says (a longer soak; 0 by default).
pub(super) fn seeds(fixed: &[u64]) -> Vec<u64> {
    let more = std::env::var("KEYCACHE_MERGE_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    fixed
        .iter()
        .copied()
        .chain((0..more).map(|n| 1000 + n))
        .collect()
}

/// One run: returns (merges, revocations that won, keys replaced).
pub(super) fn run(peers: usize, seed: u64, phases: usize) -> (usize, usize, usize) {
    let mut rng = Rng::new(seed);
    let mut p = Peers::new(peers);
    for i in 0..peers {
        p.random_ops(&mut rng, i, 8);
    }
    run_from(p, rng, phases)
}

/// Copies every regular file of peer `from`'s store into peer `to`'s (empty)
/// directory, as an operator copies a pki dir to set up a second master: the
/// copy holds what the original held, its history included.
fn copy_peer(p: &mut Peers, from: usize, to: usize) {
    for f in std::fs::read_dir(&p.dirs[from]).expect("ls") {
        let f = f.expect("entry");
        if f.file_type().expect("type").is_file() {
            std::fs::copy(f.path(), p.dirs[to].join(f.file_name())).expect("copy");
        }
    }
    p.models[to] = p.models[from].clone();
    p.known[to] = p.known[from].clone();
    p.knows[to] = p.knows[from].clone();
    p.last_obs[to] = p.last_obs[from];
    p.made[to] = p.made[from];
}

/// A second master set up as a copy of the first's store (made by `keycache
/// compact`, which begins its history), then operators' accepts, rejects and
/// deletes on both before the first merge.
pub(super) fn run_copied(seed: u64, phases: usize) -> (usize, usize, usize) {
    let mut rng = Rng::new(seed);
    let mut p = Peers::new(2);
    p.random_ops(&mut rng, 0, 12);
    ok(&kc(&["compact", s(&p.dirs[0])]), "keycache compact");
    p.made_now(0);
    copy_peer(&mut p, 0, 1);
    for i in 0..2 {
        p.random_ops(&mut rng, i, 10);
    }
    run_from(p, rng, phases)
}

/// Two stores made by migrating one `localfs_key` tree twice (peer 1 after
/// peer 0 got operators' changes), then changes on both before the first
/// merge.
pub(super) fn run_migrated_twice(seed: u64, phases: usize) -> (usize, usize, usize) {
    let mut rng = Rng::new(seed);
    let mut p = Peers::new(2);
    let tree = p.root.join("tree");
    for sub in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        std::fs::create_dir_all(tree.join(sub)).expect("mkdir");
    }
    for id in IDS {
        let key = p.fresh_key(id);
        let (sub, ev, result) = match rng.below(4) {
            0 => (
                "minions",
                Event::Accept(key.clone()),
                Some(("accepted", key.clone())),
            ),
            1 => (
                "minions_rejected",
                Event::Revoke,
                Some(("rejected", key.clone())),
            ),
            2 => continue,
            _ => ("minions_pre", Event::Write, Some(("pending", key.clone()))),
        };
        std::fs::write(tree.join(sub).join(id), &key).expect("write");
        p.event(TREE, id, ev, result);
    }
    for i in 0..2 {
        ok(
            &kc(&["migrate", s(&tree), "--out", s(&p.dirs[i])]),
            "keycache migrate",
        );
        p.made_now(i);
        p.models[i] = read(&p.dirs[i]);
        p.random_ops(&mut rng, i, 10);
    }
    p.random_ops(&mut rng, 0, 6);
    run_from(p, rng, phases)
}

/// The rest of a run: the peers join, then phases of changes and merges,
/// then rounds until they agree.
fn run_from(mut p: Peers, mut rng: Rng, phases: usize) -> (usize, usize, usize) {
    let peers = p.dirs.len();
    p.join(&mut rng);
    for phase in 0..phases {
        for i in 0..peers {
            p.random_ops(&mut rng, i, 8);
        }
        // A few random pairwise merges: partial, uneven exchange.
        for _ in 0..peers + phase {
            let i = rng.below(peers as u64) as usize;
            let j = (i + 1 + rng.below(peers as u64 - 1) as usize) % peers;
            p.merge(i, j, rng.one_in(2));
        }
    }
    // Quiet: rounds of every ordered pair.
    p.converge(&mut rng, 3);
    p.check_end();
    // Local changes after convergence travel too, deletions included.
    let id = IDS[0];
    if p.models[0].contains_key(&(Bank::Keys, id.into())) {
        ok(&kc(&["delete", s(&p.dirs[0]), id]), "delete");
        p.event(0, id, Event::Revoke, None);
        p.models[0].remove(&(Bank::Keys, id.into()));
        p.models[0].remove(&(Bank::Denied, id.into()));
        p.converge(&mut rng, 2);
        assert!(p
            .models
            .iter()
            .all(|m| !m.contains_key(&(Bank::Keys, id.into()))));
        p.check_end();
    }
    (p.merges, p.revoked, p.rekeyed)
}
