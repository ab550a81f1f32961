//! The etcd replica's model test: a real 3-member etcd
//! cluster and three masters (three stores, each with its master config
//! and its own `keycache replicate`); random operations from several
//! threads at once against random masters while replicators are killed
//! (SIGKILL) and restarted at random; one etcd member stopped (writes go
//! on), then two (writes fail cleanly, reads go on, no replica changes);
//! etcd compacted past a stopped replicator's revision (it lists again).
//! After quiescence every replica equals etcd key for key, `keycache
//! verify` is clean with the key tree, and every value in etcd and every
//! accepted key of a replica is explained by the operations' outcomes
//! ([`model`]).
//!
//! Seeded: the seed is printed, and in every failure;
//! `KEYCACHE_MODEL_SEED=N` replays the operations it chose (the threads'
//! interleaving is the machine's). An operation is a [`Kind`] run by
//! [`execute`]: the CLI's accept/reject/delete, sign-ins and denied keys
//! made as the Salt driver makes them in etcd mode (`Writer::put_if`,
//! through keycache_etcd), and, on the same ids at the same time, Salt's
//! own code paths through `salt.cache.Cache` with `keys.cache_driver:
//! keycache` (a sign-in, a denied key, salt-key -a/-r, the two flushes of
//! salt-key -d: `key_ops.py`, one process per master), each ordered by
//! the etcd revision the driver reports it took effect at.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use keycache::store::KeyState;
use keycache::Bank;
use keycache::MinionId;
use keycache_etcd::write::Writer;
use keycache_etcd::Value as EtcdValue;
use keycache_testkit::etcd::Cluster;
use keycache_testkit::rng::Rng;
use serde_json::Value;

use crate::common::etcd::seed_from_env;
use crate::common::{kc, sample_pki};
use checks::{final_checks, ids_in, summary};
use master::Master;
use model::{Kind, Model, Outcome, Rec, Target, B};

const PREFIX: &str = "/keycache/model/";
/// Ids the operations draw from: few, so that they collide.
const IDS: usize = 16;
/// Threads issuing operations at once.
const WORKERS: usize = 4;
const DEFAULT_SEED: u64 = 2111;
/// Seconds a write waits for etcd and for its replica (`write_timeout`).
const WRITE_TIMEOUT: u64 = 3;

static SEED: OnceLock<u64> = OnceLock::new();
static T0: OnceLock<Instant> = OnceLock::new();

/// Panics with the seed to replay in the message.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            panic!(
                "KEYCACHE_MODEL_SEED={} replays this: {}",
                $crate::etcd_model::SEED.get().copied().unwrap_or(0),
                format!($($fmt)+)
            );
        }
    };
}

mod checks;
mod master;
mod model;

/// Prints the seed again when the test panics anywhere (a helper's check).
struct SeedOnPanic;

impl Drop for SeedOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "etcd_model failed: replay with KEYCACHE_MODEL_SEED={}",
                SEED.get().copied().unwrap_or(0)
            );
        }
    }
}

fn elapsed() -> Duration {
    T0.get_or_init(Instant::now).elapsed()
}

/// One operation to run.
#[derive(Debug, Clone)]
struct Op {
    kind: Kind,
    /// Through the master's Salt driver (`key_ops.py`).
    driver: bool,
    target: Target,
    include_all: bool,
    /// Which public key a sign-in or a denied key carries.
    pem: usize,
}

/// A random operation on the ids of `universe`.
fn gen(rng: &mut Rng, universe: &[String]) -> Op {
    let (kind, all) = match rng.below(100) {
        0..=29 => (Kind::SignIn, false),
        30..=35 => (Kind::Deny, false),
        36..=61 => (Kind::Accept, false),
        62..=75 => (Kind::Reject, false),
        76..=87 => (Kind::Delete, false),
        88..=91 => (Kind::FlushKeys, false),
        92..=93 => (Kind::FlushDenied, false),
        94..=96 => (Kind::Accept, true),
        97..=98 => (Kind::Reject, true),
        _ => (Kind::Delete, true),
    };
    // Half of the single-id operations go through Salt's driver; the
    // flushes only through it (salt-key -d's two halves).
    let driver = match kind {
        Kind::FlushKeys | Kind::FlushDenied => true,
        Kind::Delete => false,
        _ => !all && rng.one_in(2),
    };
    let target = if all {
        Target::All
    } else {
        let n = if driver || matches!(kind, Kind::SignIn | Kind::Deny) {
            1
        } else {
            1 + rng.below(3)
        };
        let mut ids: Vec<String> = Vec::new();
        while ids.len() < n as usize {
            let id = rng.pick(universe).clone();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Target::Ids(ids)
    };
    Op {
        kind,
        driver,
        include_all: matches!(kind, Kind::Accept | Kind::Reject) && rng.one_in(3),
        target,
        pem: rng.below(3) as usize,
    }
}

/// Runs `op` on master `m`: what came of it, and the failure's text.
fn execute(m: &Master, op: &Op, pems: &[Vec<u8>]) -> (Outcome, String) {
    if op.driver {
        return through_driver(m, op, pems);
    }
    let (verb, done) = match op.kind {
        Kind::SignIn => return put_if(m, op, B::Keys, pems),
        Kind::Deny => return put_if(m, op, B::Denied, pems),
        Kind::Accept => ("accept", "accepted"),
        Kind::Reject => ("reject", "rejected"),
        Kind::Delete => ("delete", "deleted"),
        Kind::FlushKeys | Kind::FlushDenied => panic!("{op:?}: only through the driver"),
    };
    let mut cmd = kc();
    cmd.args([verb, "-c", m.c(), "--json"]);
    match &op.target {
        Target::All if op.kind == Kind::Delete => cmd.args(["--all", "-y"]),
        Target::All => cmd.arg("--all"),
        Target::Ids(ids) => cmd.args(ids),
    };
    if op.include_all {
        cmd.arg("--include-all");
    }
    let out = cmd.output();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0 | 1) => {
            let v: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{}: {e}: {:?}\n{err}", cmd.line(), out.stdout));
            let ids: Vec<String> = v[done]
                .as_array()
                .unwrap_or_else(|| panic!("{}: {v}", cmd.line()))
                .iter()
                .map(|i| i.as_str().expect("id").to_owned())
                .collect();
            let revision = v["etcd_revision"].as_i64().expect("etcd_revision");
            ensure!(
                ids.is_empty() == (revision == 0),
                "{}: done {ids:?} at revision {revision}",
                cmd.line()
            );
            (Outcome::Done { ids, revision }, String::new())
        }
        Some(2) => match committed_revision(&err) {
            Some(revision) => (Outcome::Committed { revision }, err),
            None => (unknown_or_not_written(&err), err),
        },
        _ => panic!("{}: {:?}\n{err}", cmd.line(), out.status),
    }
}

/// The revision of a commit whose replica did not apply it in time, from
/// the failure's text.
fn committed_revision(why: &str) -> Option<i64> {
    why.split_once("etcd committed the change (revision ")
        .and_then(|(_, r)| r.split(')').next())
        .and_then(|r| r.parse().ok())
}

/// One of Salt's key operations through master `m`'s driver (see
/// `key_ops.py`): done at the revision the driver reports, skipped (Salt's
/// code decided on the replica that there was nothing to write), or failed
/// with the driver's `SaltCacheError`.
fn through_driver(m: &Master, op: &Op, pems: &[Vec<u8>]) -> (Outcome, String) {
    let Target::Ids(ids) = &op.target else {
        panic!("{op:?}: one id")
    };
    let name = match op.kind {
        Kind::SignIn => "signin",
        Kind::Deny => "deny",
        Kind::Accept => "accept",
        Kind::Reject => "reject",
        Kind::FlushKeys => "flush_keys",
        Kind::FlushDenied => "flush_denied",
        Kind::Delete => panic!("{op:?}: salt-key -d through the driver is its two flushes"),
    };
    let pem = String::from_utf8(pems[op.pem].clone()).expect("a PEM");
    let answer = m.key_op(&serde_json::json!({
        "op": name,
        "id": ids[0],
        "pub": pem,
        "include_all": op.include_all,
    }));
    if let Some(err) = answer["error"].as_str() {
        let err = err.to_owned();
        let outcome = if let Some(revision) = committed_revision(&err) {
            Outcome::Committed { revision }
        } else if err.contains("was changed elsewhere") {
            Outcome::Refused
        } else if err.contains("nothing was written") {
            // Refused before etcd was asked (the replica stale or absent).
            Outcome::NotWritten
        } else {
            unknown_or_not_written(&err)
        };
        return (outcome, err);
    }
    let revision = answer["revision"].as_i64().expect("revision");
    let done = answer["done"].as_bool().expect("done") && revision > 0;
    let outcome = Outcome::Done {
        ids: if done { ids.clone() } else { Vec::new() },
        revision: if done { revision } else { 0 },
    };
    (outcome, String::new())
}

/// A failed write: not written when no connection could be made (the
/// request never left) or when the read that decides it failed (each
/// command here is one transaction, as it names fewer ids than
/// `IDS_PER_TXN`: its read precedes its only write, or follows a write
/// whose compare failed), else unknown.
fn unknown_or_not_written(why: &str) -> Outcome {
    if why.contains("tcp connect error") || why.contains("txn (read) failed") {
        Outcome::NotWritten
    } else {
        Outcome::Unknown
    }
}

/// A write of one entry as the Salt driver makes it in etcd mode: put
/// only if etcd does not hold the id in that bank, then wait for the
/// replica.
fn put_if(m: &Master, op: &Op, bank: B, pems: &[Vec<u8>]) -> (Outcome, String) {
    let Target::Ids(ids) = &op.target else {
        panic!("{op:?}: one id")
    };
    let id = MinionId::new(ids[0].clone()).expect("a minion id");
    let pem = pems[op.pem].clone();
    let (bank, value) = match bank {
        B::Keys => (Bank::Keys, EtcdValue::Key(KeyState::Pending, pem)),
        B::Denied => (Bank::Denied, EtcdValue::Denied(pem)),
    };
    let r = keycache_etcd::block_on(async {
        let mut w = Writer::connect(m.settings.clone(), &m.pki).await?;
        w.put_if(bank, &id, None, Some(value)).await
    });
    let done = |revision| Outcome::Done {
        ids: ids.clone(),
        revision,
    };
    match r {
        Ok(revision) => (done(revision), String::new()),
        // Committed; its replica was not there to apply it in time.
        Err(e @ keycache_etcd::Error::NotApplied { revision, .. }) => {
            (done(revision), e.to_string())
        }
        Err(e @ keycache_etcd::Error::Changed { .. }) => (Outcome::Refused, e.to_string()),
        Err(e) => (unknown_or_not_written(&e.to_string()), e.to_string()),
    }
}

/// What every phase shares.
struct World {
    seed: u64,
    masters: Vec<Master>,
    universe: Vec<String>,
    pems: Vec<Vec<u8>>,
    recs: Mutex<Vec<Rec>>,
    kills: AtomicUsize,
}

impl World {
    /// Runs `op` on master `m` and records it.
    fn run(&self, phase: &'static str, worker: usize, m: usize, op: &Op) -> Outcome {
        let at = elapsed();
        let (outcome, why) = execute(&self.masters[m], op, &self.pems);
        self.recs.lock().expect("lock").push(Rec {
            phase,
            worker,
            master: m,
            kind: op.kind,
            driver: op.driver,
            target: op.target.clone(),
            include_all: op.include_all,
            outcome: outcome.clone(),
            at,
            took: elapsed() - at,
            why,
        });
        outcome
    }

    /// `WORKERS` threads of random operations on random masters for
    /// `length`, while replicators other than `held`'s are killed and
    /// restarted at random.
    fn phase(&self, phase: &'static str, n: u64, length: Duration, held: Option<usize>) {
        let stop = AtomicBool::new(false);
        let deadline = Instant::now() + length;
        std::thread::scope(|sc| {
            for w in 0..WORKERS {
                let stop = &stop;
                sc.spawn(move || {
                    let mut rng = Rng::new(self.seed ^ (n << 32) ^ w as u64);
                    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                        let m = rng.below(3) as usize;
                        let op = gen(&mut rng, &self.universe);
                        self.run(phase, w, m, &op);
                    }
                });
            }
            let mut rng = Rng::new(self.seed ^ (n << 32) ^ 0xc4a05);
            while Instant::now() < deadline {
                sleep_until(Duration::from_millis(rng.range(150, 700)), deadline);
                let i = rng.below(3) as usize;
                if Some(i) == held || Instant::now() >= deadline {
                    continue;
                }
                self.masters[i].kill();
                self.kills.fetch_add(1, Ordering::Relaxed);
                sleep_until(Duration::from_millis(rng.range(50, 600)), deadline);
                self.masters[i].start();
            }
            stop.store(true, Ordering::Relaxed);
        });
    }

    /// A write through master `m` (a denied key of a new id) whose revision
    /// every running replica then reaches: everything before it is applied.
    fn barrier(&self, m: usize) -> i64 {
        let mut tries = 0;
        let revision = loop {
            let n = self.recs.lock().expect("lock").len();
            let op = Op {
                kind: Kind::Deny,
                driver: false,
                target: Target::Ids(vec![format!("barrier-{n}")]),
                include_all: false,
                pem: 0,
            };
            tries += 1;
            match self.run(model::BARRIER, 99, m, &op) {
                Outcome::Done { revision, .. } => break revision,
                other => {
                    let recs = self.recs.lock().expect("lock");
                    let last = recs.last().expect("a record");
                    ensure!(
                        tries < 10,
                        "barrier write through master {m} failed: {other:?}: {last}"
                    );
                    drop(recs);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        for m in self.masters.iter().filter(|m| m.running()) {
            m.wait_for(revision);
        }
        revision
    }
}

fn sleep_until(d: Duration, deadline: Instant) {
    let until = (Instant::now() + d).min(deadline);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn seed() -> u64 {
    seed_from_env("KEYCACHE_MODEL_SEED", DEFAULT_SEED)
}

#[test]
fn replicas_follow_etcd_through_kills_member_losses_and_compaction() {
    let seed = *SEED.get_or_init(seed);
    let _guard = SeedOnPanic;
    elapsed();
    eprintln!("etcd_model: seed {seed} (replay with KEYCACHE_MODEL_SEED={seed})");
    let mut rng = Rng::new(seed);
    let mut c = Cluster::start(3);
    let pems = [
        "app-01.dc1.example.com",
        "app-02.dc1.example.com",
        "db-01.dc1.example.com",
    ]
    .map(|f| std::fs::read(sample_pki().join("minions").join(f)).expect("a sample key"))
    .to_vec();
    let w = World {
        seed,
        masters: (0..3).map(|i| Master::new(i, &c)).collect(),
        universe: (0..IDS).map(|i| format!("minion-{i:02}")).collect(),
        pems,
        recs: Mutex::new(Vec::new()),
        kills: AtomicUsize::new(0),
    };
    for m in &w.masters {
        m.start();
    }
    for m in &w.masters {
        m.wait_for(1);
    }
    // Salt's driver in each master's config, loaded before the clock runs.
    for m in &w.masters {
        m.key_op(&serde_json::json!({"op": "flush_denied", "id": "nobody"}));
    }

    // Everything up.
    w.phase("all up", 1, Duration::from_secs(12), None);
    w.barrier(0);

    // One member down: writes go on.
    let down1 = rng.below(3) as usize;
    c.stop_member(down1);
    let before = w.recs.lock().expect("lock").len();
    w.phase("one member down", 2, Duration::from_secs(8), None);
    let went_on = w.recs.lock().expect("lock")[before..]
        .iter()
        .filter(|r| matches!(&r.outcome, Outcome::Done { revision, .. } if *revision > 0))
        .count();
    ensure!(
        went_on > 0,
        "no write committed with one etcd member of three down"
    );
    // A write may meet the election that follows, if the stopped member
    // was the leader; none may fail on the stopped member itself (the
    // client connects to a member that answers); a commit whose replica
    // was late is a write that went on; a driver write on a master whose
    // replicator the model had just killed is refused before anything is
    // written (no replicator holds that store).
    let stopped = format!("127.0.0.1:{}", c.members[down1].client);
    for r in &w.recs.lock().expect("lock")[before..] {
        let election = r.why.contains("leader changed") || r.why.contains("no leader");
        let no_replicator =
            matches!(r.outcome, Outcome::NotWritten) && r.why.contains("no replicator runs");
        ensure!(
            matches!(
                r.outcome,
                Outcome::Done { .. } | Outcome::Committed { .. } | Outcome::Refused
            ) || election
                || no_replicator,
            "with one etcd member of three down ({stopped}): {r}"
        );
    }

    // Two down: a replicator stopped first (it is the one compaction
    // passes later), the others caught up; then writes fail cleanly and no
    // replica changes.
    let x = rng.below(3) as usize;
    w.masters[x].kill();
    w.barrier((x + 1) % 3);
    let down2 = (down1 + 1 + rng.below(2) as usize) % 3;
    c.stop_member(down2);
    two_members_down(&w, x);
    c.start_member(down1);
    c.start_member(down2);
    c.wait_healthy(Duration::from_secs(30));
    w.barrier((x + 2) % 3);

    // The stopped replicator falls behind; etcd is compacted past it.
    w.phase("replicator down", 3, Duration::from_secs(5), Some(x));
    w.barrier((x + 1) % 3);
    let behind = w.masters[x].revision();
    let now = c.revision();
    ensure!(now > behind, "etcd at {now}, stopped replica at {behind}");
    c.compact(now);
    w.masters[x].start();
    let start = Instant::now();
    loop {
        let log = w.masters[x].log();
        let relisted = log
            .split_once("listing again")
            .is_some_and(|(_, after)| after.contains("replicate: listed"));
        if relisted {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "master {x}'s replicator, restarted at revision {behind} after a compaction to {now}, \
             did not list again:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    w.phase("after compaction", 4, Duration::from_secs(5), None);

    // Quiescence: every replicator runs and reaches the last write.
    for m in &w.masters {
        m.start();
    }
    w.barrier(rng.below(3) as usize);
    final_checks(&w, &c);
    summary(&w.recs.lock().expect("lock"));
    eprintln!(
        "etcd_model: seed {seed}: {} operations, {} replicator kills, {:.1}s",
        w.recs.lock().expect("lock").len(),
        w.kills.load(Ordering::Relaxed),
        elapsed().as_secs_f64()
    );
}

/// With two of three members down: every write fails with exit 2 (an
/// error from the writer) and commits nothing, reads go on, and no
/// replica changes. Master `killed`'s replicator was stopped with SIGKILL
/// just before: its store may be a batch ahead of the revision it
/// recorded (killed between the two), up to the last commit, and that
/// batch's key tree unfinished; the next writer of the store finishes it
/// (a write refused for want of a quorum opens the store first), so there
/// the tree may come in step with banks and a revision that do not
/// change.
fn two_members_down(w: &World, killed: usize) {
    let before: Vec<_> = w.masters.iter().map(Master::snapshot).collect();
    std::thread::scope(|sc| {
        for m in 0..3 {
            sc.spawn(move || {
                let mut rng = Rng::new(w.seed ^ 0x2d0 ^ m as u64);
                for kind in [Kind::Accept, Kind::SignIn, Kind::Delete, Kind::Reject] {
                    let op = Op {
                        kind,
                        driver: false,
                        target: Target::Ids(vec![rng.pick(&w.universe).clone()]),
                        include_all: true,
                        pem: 0,
                    };
                    let outcome = w.run("two members down", 10 + m, m, &op);
                    let recs = w.recs.lock().expect("lock");
                    let rec = recs.last().expect("a record");
                    ensure!(
                        matches!(outcome, Outcome::Unknown | Outcome::NotWritten)
                            && rec.why.contains("etcd ("),
                        "a write with two etcd members of three down: {rec}"
                    );
                }
            });
        }
    });
    // Reads go on.
    for (m, (listing, _, _)) in w.masters.iter().zip(&before) {
        ensure!(
            &m.list() == listing,
            "master {}'s listing changed with etcd down",
            m.idx
        );
        if let Some(id) = listing["minions_pre"][0].as_str() {
            kc().args(["get", "-c", m.c(), id]).ok();
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let model_recs = w.recs.lock().expect("lock").clone();
    let model = Model::new(&model_recs, &w.universe);
    for (m, b) in w.masters.iter().zip(&before) {
        let after = m.snapshot();
        let finished =
            m.idx == killed && after.0 == b.0 && after.2 == b.2 && after.1 == checks::tree_of(&b.0);
        ensure!(
            &after == b || finished,
            "master {}'s replica changed while etcd had no quorum: {b:?} -> {after:?}",
            m.idx
        );
        let accepted = ids_in(&b.0, "minions");
        let bad = if m.idx == killed {
            model.check_accepted_within(&accepted, b.2, model.max_revision())
        } else {
            model.check_accepted(&accepted, b.2)
        };
        ensure!(bad.is_empty(), "master {}:\n{}", m.idx, bad.join("\n"));
    }
}
