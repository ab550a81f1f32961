//! The etcd replica under faults: the promise is that **a key revoked on
//! one master is revoked on every master, or that master says it is stale**
//! (`keycache etcd status -c CONF` exits 1), and that once the faults heal
//! every replica equals etcd again.
//!
//! Each test runs real etcd members (`keycache_testkit::etcd::Cluster`) and
//! two or more masters, each with its store, its config (`stale_after: 2`,
//! `write_timeout: 3`) and its `keycache replicate`; it revokes a key
//! through one master (`keycache delete -c B ID` exiting 0) during or
//! around one fault, then checks the invariant by polling every 50 ms
//! ([`hold_revoked`]): from [`BOUND`] after the revocation was
//! acknowledged, every master has dropped the key (no `minions/<id>`, not
//! listed as accepted) or its `etcd status` exits 1. After the fault heals,
//! `keycache etcd diff -c X --json` says `same` for every master
//! ([`wait_same`]).
//!
//! - [`restore`]: etcd restored from a backup, with the same cluster token
//!   (the same cluster id, the revision going back) and with a new one;
//! - [`store`]: two replicators on one store, a store copied from a live
//!   replica, a replica changed behind its replicator's back (the
//!   consistency check), a value in etcd that is not a key;
//! - [`clock`]: a replicator whose clock runs ahead, or behind;
//! - [`stall`]: a member whose disk stalls (fsfreeze of a loop-mounted
//!   ext4), a member and a replicator stopped (SIGSTOP), compaction and
//!   defragmentation;
//! - [`partition`]: a member cut off from its peers (iptables in network
//!   namespaces).

mod clock;
mod guards;
mod partition;
mod restore;
mod stall;
mod store;

use std::cell::Cell;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use keycache_testkit::cmd::TestCommand;
use keycache_testkit::etcd::Cluster;
use serde_json::Value;

use crate::common::etcd::{etcd_put, etcd_value, master_dirs, write_master_config, Replicating};
use crate::common::{s, sample_pki, BIN};

/// The etcd prefix of every test here.
const PREFIX: &str = "/keycache/faults/";

/// `stale_after` of every master, seconds.
const STALE_AFTER: u64 = 2;

/// How long after a revocation is acknowledged every master must have
/// dropped the key or say it is stale: `stale_after` plus 3 s.
const BOUND: Duration = Duration::from_secs(STALE_AFTER + 3);

/// How often the invariant is checked.
const POLL: Duration = Duration::from_millis(50);

/// A master: its store directory (`pki`), its config directory and the
/// endpoints its config names.
struct Master {
    name: &'static str,
    t: tempfile::TempDir,
    pki: PathBuf,
    conf: PathBuf,
    endpoints: Vec<String>,
    /// A command prefix its commands run under (`ip netns exec NS`).
    wrap: Vec<String>,
    /// Replicators started, for their log files' names.
    started: Cell<u32>,
}

impl Master {
    /// A master with an empty store, on every member of `c`.
    fn new(name: &'static str, c: &Cluster) -> Master {
        Master::on(name, c.endpoints(), Vec::new())
    }

    /// A master with an empty store whose config names `endpoints`, its
    /// commands run under `wrap`.
    fn on(name: &'static str, endpoints: Vec<String>, wrap: Vec<String>) -> Master {
        let (t, pki, conf) = master_dirs();
        let m = Master {
            name,
            t,
            pki,
            conf,
            endpoints,
            wrap,
            started: Cell::new(0),
        };
        m.write_config("");
        m
    }

    /// Writes the master config; `extra` is appended to the
    /// `keycache_etcd` mapping (indented lines).
    fn write_config(&self, extra: &str) {
        write_master_config(
            &self.conf,
            &self.pki,
            &self.endpoints.join(", "),
            PREFIX,
            &format!("  write_timeout: 3\n  stale_after: {STALE_AFTER}\n{extra}"),
        );
    }

    /// The keycache binary, under this master's command prefix.
    fn kc(&self) -> TestCommand {
        match self.wrap.split_first() {
            None => TestCommand::new(BIN),
            Some((first, rest)) => {
                let mut c = TestCommand::new(first);
                c.args(rest).arg(BIN);
                c
            }
        }
    }

    fn c(&self) -> &str {
        s(&self.conf)
    }

    /// `keycache etcd seed --from` the sample tree; the revision.
    fn seed_from_sample(&self) -> i64 {
        let v = self
            .kc()
            .args(["etcd", "seed", "-c", self.c(), "--json", "--from"])
            .arg(sample_pki())
            .json();
        v["revision"].as_i64().expect("the seed's revision")
    }

    /// `keycache list -c CONF --json`.
    fn list(&self) -> Value {
        self.kc().args(["list", "-c", self.c(), "--json"]).json()
    }

    /// The ids of `state` (`minions`, `minions_pre`, ...) in the listing.
    fn ids(&self, state: &str) -> Vec<String> {
        self.list()[state]
            .as_array()
            .expect("a list")
            .iter()
            .map(|v| v.as_str().expect("an id").to_owned())
            .collect()
    }

    /// Whether this master still lets `id` in: `minions/<id>` (what Salt's
    /// validate_token reads) or the listing's accepted keys.
    fn holds_accepted(&self, id: &str) -> bool {
        self.pki.join("minions").join(id).exists() || self.ids("minions").iter().any(|x| x == id)
    }

    /// `keycache etcd status -c CONF --json`: its exit code and what it
    /// printed.
    fn status(&self) -> (Option<i32>, String) {
        let (code, _, text) = self.status_json();
        (code, text)
    }

    /// `keycache etcd status -c CONF --json`: its exit code, its JSON
    /// (`Null` when it printed none) and what it printed.
    fn status_json(&self) -> (Option<i32>, Value, String) {
        self.etcd_json("status")
    }

    /// `keycache etcd diff -c CONF --json`: its exit code and JSON (`Null`
    /// when it printed none), and what it printed.
    fn diff(&self) -> (Option<i32>, Value, String) {
        self.etcd_json("diff")
    }

    /// `keycache etcd SUB -c CONF --json`: its exit code, its JSON (`Null`
    /// when it printed none) and what it printed.
    fn etcd_json(&self, sub: &str) -> (Option<i32>, Value, String) {
        let out = self
            .kc()
            .args(["etcd", sub, "-c", self.c(), "--json"])
            .output();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), v, text)
    }

    /// The replica's state file, when there is one that parses.
    fn state(&self) -> Option<Value> {
        let b = std::fs::read(self.pki.join(".keycache-etcd")).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// The revision the replica records (0: none).
    fn revision(&self) -> i64 {
        self.state()
            .and_then(|v| v["revision"].as_i64())
            .unwrap_or(0)
    }

    /// Waits (at most 20 s) until the replica records `revision`.
    fn wait_for(&self, revision: i64) {
        let every = Duration::from_millis(20);
        poll(Duration::from_secs(20), every, || {
            (self.revision() >= revision).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "master {}: replica stuck at {} < {revision}; its replicators said:\n{}",
                self.name,
                self.revision(),
                self.logs()
            )
        });
    }

    /// Starts `keycache replicate -c CONF`.
    fn replicate(&self) -> Replicating {
        self.replicate_env(&[])
    }

    /// Starts `keycache replicate -c CONF` with more environment.
    fn replicate_env(&self, env: &[(&str, &str)]) -> Replicating {
        let n = self.started.get() + 1;
        self.started.set(n);
        let log = self.t.path().join(format!("replicate-{n}.log"));
        let mut c = self.kc();
        c.args(["replicate", "-c", self.c()]);
        for (k, v) in env {
            c.env(k, v);
        }
        Replicating::spawn(&mut c, log, Stdio::null())
    }

    /// What every replicator of this master wrote on stderr.
    fn logs(&self) -> String {
        let mut out = String::new();
        for n in 1..=self.started.get() {
            let p = self.t.path().join(format!("replicate-{n}.log"));
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            out.push_str(&format!("--- {} replicator {n}\n{text}", self.name));
        }
        out
    }

    /// `keycache ACTION -c CONF ID --json [more]` through etcd, which must
    /// succeed: the instant it returned (the change acknowledged).
    fn write(&self, action: &str, id: &str, more: &[&str]) -> Instant {
        self.kc()
            .args([action, "-c", self.c(), id, "--json"])
            .args(more)
            .json();
        Instant::now()
    }

    /// Revokes `id` (`keycache delete -c CONF ID`); when it was
    /// acknowledged.
    fn revoke(&self, id: &str) -> Instant {
        self.write("delete", id, &[])
    }

    /// The member of `c` that `pid` (a replicator of this master) holds a
    /// connection to, waiting for one (at most 10 s).
    fn member_of(&self, c: &Cluster, r: &Replicating) -> usize {
        let mut found = Vec::new();
        poll(Duration::from_secs(10), Duration::from_millis(50), || {
            found = guards::connected_members(r.pid(), c);
            match found[..] {
                [one] => Some(one),
                _ => None,
            }
        })
        .unwrap_or_else(|| {
            panic!(
                "master {}: its replicator holds connections to members {found:?}, not one; \
                 it said:\n{}",
                self.name,
                self.logs()
            )
        })
    }
}

/// What the fault tests do with a [`Master`]'s `keycache replicate`.
impl Replicating {
    /// SIGSTOP (`true`) or SIGCONT.
    fn pause(&self, stop: bool) {
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        let pid = i32::try_from(self.pid()).expect("a pid");
        keycache_testkit::sys::kill(pid, sig).expect("signal the replicator");
    }

    /// Its exit status if it exits within `limit`.
    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let c = self.child.as_mut()?;
        let st = poll(limit, Duration::from_millis(50), || {
            c.try_wait().ok().flatten()
        })?;
        self.child = None;
        Some(st)
    }

    /// Whether it still runs.
    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

/// Whether master `m` breaks the promise for `id` now: it holds the key
/// accepted and its `etcd status` does not exit 1 (and it still held the
/// key after the status answered). `Some(what it showed)` when it does.
fn violation(m: &Master, id: &str) -> Option<String> {
    if !m.holds_accepted(id) {
        return None;
    }
    let (code, status) = m.status();
    if code == Some(1) || !m.holds_accepted(id) {
        return None;
    }
    Some(format!(
        "master {} holds {id} accepted (minions/{id}: {}) and `keycache etcd status` exits \
         {code:?}, not 1:\n{status}",
        m.name,
        if m.pki.join("minions").join(id).exists() {
            "present"
        } else {
            "absent"
        }
    ))
}

/// Checks the promise for the revoked `ids` every [`POLL`] until `until`:
/// from `ack` + [`BOUND`] on, each of `masters` has dropped each id or says
/// it is stale. At least one check happens after the bound.
fn hold_revoked(
    masters: &[&Master],
    ids: &[&str],
    ack: Instant,
    until: Instant,
) -> Result<(), String> {
    let due = ack + BOUND;
    assert!(until > due, "the check must reach past the bound");
    let check = || {
        let now = Instant::now();
        if now < due {
            return None;
        }
        for m in masters {
            for id in ids {
                if let Some(v) = violation(m, id) {
                    return Some(format!(
                        "{:.1} s after the revocation of {id} was acknowledged (bound \
                         {BOUND:?}): {v}\n{}",
                        now.duration_since(ack).as_secs_f64(),
                        m.logs()
                    ));
                }
            }
        }
        None
    };
    let limit = until.saturating_duration_since(Instant::now());
    if let Some(e) = poll(limit, POLL, &check) {
        return Err(e);
    }
    // One check past the bound, whatever the polls saw.
    std::thread::sleep(due.saturating_duration_since(Instant::now()));
    check().map_or(Ok(()), Err)
}

/// Waits (at most `limit`) until `keycache etcd diff -c X --json` says the
/// replica equals etcd.
fn wait_same(m: &Master, limit: Duration) -> Result<(), String> {
    let mut last = (None, String::new());
    let same = poll(limit, Duration::from_millis(100), || {
        let (code, v, text) = m.diff();
        last = (code, text);
        (code == Some(0) && v["same"] == true).then_some(())
    });
    same.ok_or_else(|| {
        format!(
            "master {}: its replica does not equal etcd {limit:?} after the faults healed \
             (diff exits {:?}):\n{}\n{}",
            m.name,
            last.0,
            last.1,
            m.logs()
        )
    })
}

/// Waits until `m`'s replicator logged a line containing `what` (at most
/// `limit`).
fn wait_log(m: &Master, what: &str, limit: Duration) -> Result<(), String> {
    poll(limit, Duration::from_millis(50), || {
        m.logs().contains(what).then_some(())
    })
    .ok_or_else(|| {
        format!(
            "master {}: no line with {what:?} from its replicator in {limit:?}:\n{}",
            m.name,
            m.logs()
        )
    })
}

/// Calls `f` every `every` until it answers `Some`, at most `limit` (and
/// as many times as `limit` holds `every`, plus one); `None` when it never
/// did.
fn poll<T>(limit: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    let tries = limit.as_millis() / every.as_millis().max(1) + 1;
    for _ in 0..tries {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= limit {
            break;
        }
        std::thread::sleep(every);
    }
    None
}

/// The failed checks of a test that goes on after a failure, so that its
/// report names every broken promise, not only the first.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    fn note(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
            self.0.push(e);
        }
    }

    /// Notes [`hold_revoked`] for `ids` until `grace` past the bound,
    /// counted from `back` when that is later than `ack` (a replicator
    /// started or continued after the revocation).
    fn hold(
        &mut self,
        masters: &[&Master],
        ids: &[&str],
        ack: Instant,
        back: Instant,
        grace: Duration,
    ) {
        self.note(hold_revoked(
            masters,
            ids,
            ack,
            back.max(ack) + BOUND + grace,
        ));
    }

    /// Notes [`wait_same`] for each of `masters`, once the faults healed.
    fn same(&mut self, masters: &[&Master], limit: Duration) {
        for m in masters {
            self.note(wait_same(m, limit));
        }
    }

    /// Fails the test with every finding.
    fn finish(self) {
        assert!(
            self.0.is_empty(),
            "{} finding(s):\n\n{}",
            self.0.len(),
            self.0.join("\n\n")
        );
    }
}

/// Puts keys outside the prefix until etcd's revision is past `revision`
/// (at most 2,000 puts).
fn fill_past(c: &Cluster, revision: i64) {
    let start = Instant::now();
    let mut now = c.revision();
    for n in 0..2000 {
        if now > revision {
            return;
        }
        if start.elapsed() > Duration::from_secs(60) {
            break;
        }
        now = etcd_put(c, &format!("/faults-filler/{n}"), "x");
    }
    panic!("etcd's revision {now} did not pass {revision}");
}

/// Waits (at most 20 s) until a write through members other than `x`
/// commits: the others have a leader.
fn wait_quorum_without(c: &Cluster, x: usize) {
    let j = (x + 1) % c.members.len();
    let mut why = String::new();
    poll(
        Duration::from_secs(20),
        Duration::from_millis(100),
        || match c.etcdctl_at(j, &["put", "/faults-probe", "ok"]) {
            Ok(_) => Some(()),
            Err(e) => {
                why = e;
                None
            }
        },
    )
    .unwrap_or_else(|| panic!("the members but {x} did not commit a write: {why}"));
}

/// Every endpoint of `c` but member `x`'s.
fn endpoints_but(c: &Cluster, x: usize) -> Vec<String> {
    (0..c.members.len())
        .filter(|&i| i != x)
        .map(|i| c.members[i].endpoint())
        .collect()
}

/// Masters `names` on every member of `c`, the first seeding the prefix
/// from the sample tree; each with its replicator running and holding the
/// seed.
fn replicated(c: &Cluster, names: &[&'static str]) -> (Vec<Master>, Vec<Replicating>) {
    let masters: Vec<Master> = names.iter().map(|n| Master::new(n, c)).collect();
    let seeded = masters[0].seed_from_sample();
    let reps: Vec<Replicating> = masters.iter().map(Master::replicate).collect();
    for m in &masters {
        m.wait_for(seeded);
    }
    (masters, reps)
}

/// Two masters, their commands under `wrap`: A on every member of `c`, B
/// on every member but `x`, the one A's replicator watches; both replicas
/// hold the sample seed. `k` is an id they hold accepted.
struct Watched {
    a: Master,
    b: Master,
    x: usize,
    k: String,
    _replicators: [Replicating; 2],
}

impl Watched {
    fn start(c: &Cluster, wrap: Vec<String>) -> Watched {
        let a = Master::on("a", c.endpoints(), wrap.clone());
        let seeded = a.seed_from_sample();
        let ra = a.replicate();
        a.wait_for(seeded);
        let x = a.member_of(c, &ra);
        let b = Master::on("b", endpoints_but(c, x), wrap);
        let rb = b.replicate();
        b.wait_for(seeded);
        let k = a.ids("minions")[0].clone();
        Watched {
            a,
            b,
            x,
            k,
            _replicators: [ra, rb],
        }
    }

    /// With a fault on member `x` in place: revokes K through B once the
    /// other members have a leader and checks the promise until `grace`
    /// past the bound; `heal` ends the fault, and then both replicas must
    /// equal etcd within `settle`.
    fn revoke_across_fault(
        &self,
        c: &Cluster,
        grace: Duration,
        heal: impl FnOnce(),
        settle: Duration,
    ) {
        let (a, b, k) = (&self.a, &self.b, &self.k);
        let mut f = Findings::default();
        wait_quorum_without(c, self.x);
        let ack = b.revoke(k);
        f.hold(&[a, b], &[k], ack, ack, grace);
        heal();
        f.same(&[a, b], settle);
        f.finish();
    }
}
