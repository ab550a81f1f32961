//! The audit trail in etcd mode under kills: a `keycache replicate` killed
//! with SIGKILL at random moments while changes with their audit records
//! go through etcd from another master logs, once it runs again and has
//! caught up, every record etcd holds exactly once, in revision order.
//!
//! The kills are at random moments of a seeded generator
//! (`KEYCACHE_AUDIT_SEED` replays one); some restarts lose the replica's
//! state file first, so that the replicator lists etcd again (a list's
//! records, those the log already holds passed over).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keycache::audit::{Actor, Record};
use keycache::store::KeyState;
use keycache::Bank;
use keycache::MinionId;
use keycache_etcd::write::{Decision, Writer};
use keycache_etcd::{block_on, Settings, Value};
use keycache_testkit::etcd::Cluster;
use keycache_testkit::rng::Rng;

use crate::common::etcd::{kill_child, master_of, seed_from_env, spawn_logged, wait_revision};
use crate::common::{kc, pem, s};

const PREFIX: &str = "/keycache/audit/";

/// Kills of the replicator.
const ROUNDS: u64 = 24;

/// The seed unless `KEYCACHE_AUDIT_SEED` says another.
const DEFAULT_SEED: u64 = 0x5eed_a0d1;

/// Ids the writer changes.
const IDS: u64 = 24;

/// A master: its store directory and its config directory.
struct Master {
    t: tempfile::TempDir,
    pki: PathBuf,
    conf: PathBuf,
    started: u32,
}

impl Master {
    fn new(c: &Cluster) -> Master {
        let (t, pki, conf) = master_of(c, PREFIX, "  write_timeout: 5\n");
        Master {
            t,
            pki,
            conf,
            started: 0,
        }
    }

    /// Starts `keycache replicate -c CONF`, its stderr in a log of its own.
    fn replicate(&mut self) -> Child {
        self.started += 1;
        let log = self
            .t
            .path()
            .join(format!("replicate-{}.log", self.started));
        spawn_logged(
            kc().args(["replicate", "-c", s(&self.conf)]),
            &log,
            Stdio::null(),
        )
    }

    /// What every replicator of this master said.
    fn logs(&self) -> String {
        (1..=self.started)
            .map(|n| {
                let p = self.t.path().join(format!("replicate-{n}.log"));
                format!(
                    "--- replicator {n}\n{}",
                    std::fs::read_to_string(p).unwrap_or_default()
                )
            })
            .collect()
    }

    /// The revision the replica records (0: none).
    fn revision(&self) -> i64 {
        keycache_etcd::ReplicaState::read(&self.pki)
            .ok()
            .flatten()
            .map_or(0, |s| s.revision)
    }

    /// Waits (at most 30 s) until the replica records `revision`.
    fn wait_for(&self, revision: i64) {
        wait_revision(
            revision,
            || self.revision(),
            || format!("its replicators said:\n{}", self.logs()),
        );
    }
}

/// The records of the log of the store in `dir` that came from etcd (a
/// revision), and the torn lines.
fn logged(dir: &Path) -> (Vec<Record>, usize) {
    let (records, torn) = keycache::audit::read(dir).expect("read the log");
    (
        records
            .into_iter()
            .filter(|r| r.revision.is_some())
            .collect(),
        torn,
    )
}

/// Every record of etcd's audit keys, each with its key's revision, in
/// revision order.
fn in_etcd(st: &Settings) -> Vec<Record> {
    let mut kvs = block_on(async {
        let mut cl = st.connect().await?;
        Ok(keycache_etcd::list::list(&mut cl, st).await?.audit)
    })
    .expect("audit keys");
    kvs.sort_by_key(|k| k.0);
    kvs.iter()
        .flat_map(|(rev, v)| keycache_etcd::audit::records(v, *rev))
        .collect()
}

/// The next state of an id in the writer's cycle: absent, pending,
/// accepted, rejected, absent again.
fn next(id: &MinionId, cur: &keycache_etcd::write::Current) -> Decision {
    let key = |s| Some(Value::Key(s, pem(id.as_str(), 100).into_bytes()));
    Decision::Write(match &cur.key {
        None => vec![(Bank::Keys, key(KeyState::Pending))],
        Some((KeyState::Pending, _)) => vec![(Bank::Keys, key(KeyState::Accepted))],
        Some((KeyState::Accepted, _)) => vec![(Bank::Keys, key(KeyState::Rejected))],
        Some((KeyState::Rejected, _)) => vec![(Bank::Keys, None), (Bank::Denied, None)],
    })
}

fn seed() -> u64 {
    seed_from_env("KEYCACHE_AUDIT_SEED", DEFAULT_SEED)
}

#[test]
fn a_replicator_killed_at_random_moments_logs_every_record_once_in_revision_order() {
    let seed = seed();
    eprintln!("etcd_audit: seed {seed} (replay with KEYCACHE_AUDIT_SEED={seed})");
    let mut rng = Rng::new(seed);
    let c = Cluster::start(1);
    let st = Settings::plain(c.endpoints(), PREFIX).expect("settings");
    let (mut a, mut b) = (Master::new(&c), Master::new(&c));
    let mut rb = b.replicate();
    let mut ra = a.replicate();
    let at = c.revision();
    a.wait_for(at);
    b.wait_for(at);

    // The writer: changes through master B, each with its records, one to
    // four ids a transaction, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (st, dir, stop) = (st.clone(), b.pki.clone(), stop.clone());
        let mut rng = Rng::new(seed ^ 0x77);
        std::thread::spawn(move || {
            block_on(async move {
                let mut w = Writer::connect(st, &dir).await?;
                w.set_actor(Some(Actor {
                    user: Some("root".into()),
                    sudo_user: Some("alice".into()),
                    program: "keycache".into(),
                    master: Some("b".into()),
                    reason: Some("kill test".into()),
                    action: None,
                }));
                let (mut last, mut writes) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let n = rng.range(1, 5);
                    let ids: Vec<MinionId> = (0..n)
                        .map(|_| MinionId::new(format!("m{}", rng.below(IDS))).expect("id"))
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let done = w.update(&ids, next).await?;
                    last = last.max(done.revision);
                    writes += 1;
                }
                Ok((last, writes))
            })
        })
    };

    let mut relists = 0;
    for _ in 0..ROUNDS {
        std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
        kill_child(&mut ra);
        if rng.one_in(4) {
            // The state lost: the next replicator lists etcd again.
            let _ = std::fs::remove_file(a.pki.join(".keycache-etcd"));
            relists += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.range(0, 50)));
        ra = a.replicate();
    }
    stop.store(true, Ordering::Relaxed);
    let (last, writes) = writer
        .join()
        .expect("the writer")
        .unwrap_or_else(|e| panic!("the writer failed: {e}\nB said:\n{}", b.logs()));
    a.wait_for(last);

    let want = in_etcd(&st);
    assert!(
        want.len() as u64 > ROUNDS,
        "only {} records in {writes} writes",
        want.len()
    );
    let (got, torn) = logged(&a.pki);
    eprintln!(
        "etcd_audit: {writes} writes, {} records, {ROUNDS} kills ({relists} with the state \
         lost), {torn} torn lines",
        want.len()
    );
    if got != want {
        let dup = got.windows(2).find(|w| w[0] == w[1]);
        let at = got.iter().zip(&want).position(|(g, w)| g != w);
        let near = |v: &[Record]| {
            let i = at.unwrap_or(v.len().min(want.len())).saturating_sub(2);
            v.iter()
                .skip(i)
                .take(5)
                .map(|r| format!("{:?} {} {}\n", r.revision, r.id, r.action))
                .collect::<String>()
        };
        panic!(
            "A's log holds {} records, etcd {}; first repeated: {dup:?}; first difference at \
             {at:?}\nA's log there:\n{}etcd's:\n{}A said:\n{}",
            got.len(),
            want.len(),
            near(&got),
            near(&want),
            a.logs()
        );
    }
    assert!(
        got.windows(2)
            .all(|w| w[0].revision.unwrap_or(0) <= w[1].revision.unwrap_or(0)),
        "not in revision order"
    );
    // B, never killed, holds the same.
    b.wait_for(last);
    assert_eq!(logged(&b.pki).0, want);
    kill_child(&mut ra);
    kill_child(&mut rb);
}
