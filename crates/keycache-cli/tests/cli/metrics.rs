//! `keycache replicate`'s metrics, health and readiness
//! (`keycache_etcd: {metrics: ADDR}`: `/metrics`, `/healthz`, `/readyz`)
//! and systemd's notify protocol (`NOTIFY_SOCKET`), against a real etcd
//! member (as [`crate::etcd`]); each HTTP request a plain HTTP/1.0 GET.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use keycache_testkit::etcd::{free_port, Cluster};
use serde_json::Value;

use crate::common::etcd::{master_dirs, write_master_config, Replicating};
use crate::common::{kc, s, sample_pki};

const PREFIX: &str = "/keycache/metrics/";

/// Every metric the replicator exposes.
const NAMES: [&str; 12] = [
    "keycache_replica_revision",
    "keycache_etcd_revision",
    "keycache_replica_lag_revisions",
    "keycache_replica_last_contact_age_seconds",
    "keycache_replica_stale",
    "keycache_replica_ready",
    "keycache_relists_total",
    "keycache_apply_seconds",
    "keycache_watch_events_total",
    "keycache_keys",
    "keycache_not_held_total",
    "keycache_consistency_checks_total",
];

/// A master (store `pki`, config in `etc`) replicating `PREFIX` of `c`;
/// `extra` is appended to its `keycache_etcd` mapping.
struct Master {
    t: tempfile::TempDir,
    pki: PathBuf,
    conf: PathBuf,
}

impl Master {
    fn new(endpoints: &str, extra: &str) -> Master {
        let (t, pki, conf) = master_dirs();
        write_master_config(
            &conf,
            &pki,
            endpoints,
            PREFIX,
            &format!("  write_timeout: 3\n{extra}"),
        );
        Master { t, pki, conf }
    }

    fn c(&self) -> &str {
        s(&self.conf)
    }

    /// The replica's state file (`None`: not written yet).
    fn state(&self) -> Option<Value> {
        let b = std::fs::read(self.pki.join(".keycache-etcd")).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// Keys per state, as `keycache list --json` shows the store.
    fn counts(&self) -> [(&'static str, u64); 4] {
        let l = kc().args(["list", "-c", self.c(), "--json"]).json();
        let n = |k: &str| l[k].as_array().expect("a list").len() as u64;
        [
            ("accepted", n("minions")),
            ("pending", n("minions_pre")),
            ("rejected", n("minions_rejected")),
            ("denied", n("minions_denied")),
        ]
    }

    /// `keycache replicate -c CONF` with `env` (NOTIFY_SOCKET removed
    /// unless given), stderr into a log.
    fn replicate(&self, env: &[(&str, &str)]) -> Replicating {
        let log = self.t.path().join(format!(
            "replicate-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("time")
                .as_nanos()
        ));
        let mut c = kc();
        c.args(["replicate", "-c", self.c()]);
        let cmd = c.cmd();
        cmd.env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Replicating::spawn(&mut c, log, Stdio::null())
    }
}

/// What the metrics tests do with a replicator they started.
impl Replicating {
    fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().expect("running").id();
        let pid = i32::try_from(pid).expect("a pid");
        keycache_testkit::sys::kill(pid, signal).expect("signal the replicator");
    }

    /// Waits (up to `limit`) for it to end.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        let c = self.child.as_mut().expect("running");
        loop {
            if let Some(st) = c.try_wait().expect("wait") {
                self.child = None;
                return st;
            }
            assert!(
                start.elapsed() < limit,
                "still running after {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `GET path` at `port` (HTTP/1.0): the status and the body; `None` when
/// nothing listens (yet).
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The value of the sample `series` (name and labels, as exposed).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Polls `f` every 50 ms until it holds, for up to `limit`.
fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool, log: &Replicating) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}; replicate said:\n{}",
            log.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A seeded prefix: the sample tree in etcd, its revision.
/// Accepts one of the master's pending keys, through etcd.
fn accept_a_pending_key(m: &Master) {
    let l = kc().args(["list", "-c", m.c(), "--json"]).json();
    let pending = l["minions_pre"][0]
        .as_str()
        .expect("a pending id")
        .to_owned();
    kc().args(["accept", "-c", m.c(), &pending]).ok();
}

fn seed(m: &Master) -> i64 {
    kc().args(["etcd", "seed", "-c", m.c(), "--json", "--from"])
        .arg(sample_pki())
        .json()["revision"]
        .as_i64()
        .expect("revision")
}

#[test]
fn metrics_health_and_readiness_follow_the_replica() {
    let c = Cluster::start(1);
    let port = free_port();
    let m = Master::new(
        &c.endpoints().join(", "),
        &format!("  stale_after: 2\n  metrics: 127.0.0.1:{port}\n"),
    );
    let seeded = seed(&m);
    let mut r = m.replicate(&[]);
    until(
        Duration::from_secs(30),
        "/readyz 200",
        || get(port, "/readyz").is_some_and(|(st, _)| st == 200),
        &r,
    );
    assert!(
        m.state()
            .is_some_and(|s| s["revision"].as_i64() >= Some(seeded)),
        "ready only once the list is applied"
    );
    let (st, text) = get(port, "/metrics").expect("/metrics");
    assert_eq!(st, 200, "{text}");
    for name in NAMES {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{text}"
        );
    }
    assert_eq!(value(&text, "keycache_replica_ready"), Some(1.0), "{text}");
    assert_eq!(value(&text, "keycache_replica_stale"), Some(0.0), "{text}");
    assert_eq!(
        value(&text, "keycache_relists_total{reason=\"start\"}"),
        Some(1.0),
        "{text}"
    );
    // The key counts are the store's, after a list and after a change
    // through etcd.
    let keys = |text: &str| {
        ["accepted", "pending", "rejected", "denied"].map(|s| {
            (
                s,
                value(text, &format!("keycache_keys{{state=\"{s}\"}}")).map(|v| v as u64),
            )
        })
    };
    let want = |m: &Master| m.counts().map(|(s, n)| (s, Some(n)));
    let before = want(&m);
    assert!(before.iter().all(|(_, n)| n.is_some_and(|n| n > 0)));
    until(
        Duration::from_secs(10),
        "the key counts after the list",
        || keys(&get(port, "/metrics").expect("/metrics").1) == before,
        &r,
    );
    accept_a_pending_key(&m);
    let after = want(&m);
    assert_ne!(after, before);
    until(
        Duration::from_secs(10),
        "the key counts after an accept",
        || keys(&get(port, "/metrics").expect("/metrics").1) == after,
        &r,
    );
    let (_, text) = get(port, "/metrics").expect("/metrics");
    assert!(
        value(&text, "keycache_watch_events_total").is_some_and(|v| v >= 1.0)
            && value(&text, "keycache_apply_seconds_count").is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        value(&text, "keycache_replica_revision") > Some(seeded as f64)
            && value(&text, "keycache_etcd_revision") >= value(&text, "keycache_replica_revision"),
        "{text}"
    );
    // No label holds a minion id.
    let l = kc().args(["list", "-c", m.c(), "--json"]).json();
    for state in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        for id in l[state].as_array().expect("ids") {
            let id = id.as_str().expect("id");
            assert!(
                !text.contains(&format!("\"{id}\"")),
                "{id} in the metrics:\n{text}"
            );
        }
    }
    let (st, body) = get(port, "/healthz").expect("/healthz");
    assert_eq!(st, 200, "{body}");
    assert_eq!(get(port, "/nothing").map(|r| r.0), Some(404));
    // etcd stops answering: stale past stale_after, so not ready; the
    // loop keeps stepping (it retries), so healthy.
    c.pause_member(0);
    until(
        Duration::from_secs(20),
        "stale once etcd stopped answering",
        || {
            get(port, "/metrics").is_some_and(|(_, t)| {
                value(&t, "keycache_replica_stale") == Some(1.0)
                    && value(&t, "keycache_replica_ready") == Some(0.0)
                    && value(&t, "keycache_replica_last_contact_age_seconds")
                        .is_some_and(|a| a > 2.0)
            })
        },
        &r,
    );
    let (st, body) = get(port, "/readyz").expect("/readyz");
    assert_eq!(st, 503, "{body}");
    assert!(
        body.contains("stale") && body.contains("stale_after is 2 s"),
        "{body}"
    );
    // Healthy all along, for longer than a probe would wait.
    for _ in 0..8 {
        let (st, body) = get(port, "/healthz").expect("/healthz");
        assert_eq!(st, 200, "{body}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let age = |t: &str| value(t, "keycache_replica_last_contact_age_seconds");
    let (_, t1) = get(port, "/metrics").expect("/metrics");
    std::thread::sleep(Duration::from_millis(1100));
    let (_, t2) = get(port, "/metrics").expect("/metrics");
    assert!(age(&t2) > age(&t1), "the age moves at each scrape");
    c.resume_member(0);
    until(
        Duration::from_secs(30),
        "ready again once etcd answers",
        || get(port, "/readyz").is_some_and(|(st, _)| st == 200),
        &r,
    );
    // Without NOTIFY_SOCKET, SIGTERM kills as it always did.
    r.signal(libc::SIGTERM);
    let st = r.wait(Duration::from_secs(10));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGTERM),
        "{st:?}"
    );
}

/// The messages `sock` receives within `limit`, until `done` holds for
/// one (returned last).
fn receive(
    sock: &UnixDatagram,
    limit: Duration,
    mut done: impl FnMut(&str) -> bool,
    r: &Replicating,
) -> Vec<String> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        assert!(
            start.elapsed() < limit,
            "not within {limit:?}; received {out:?}; replicate said:\n{}",
            r.log()
        );
        match sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let stop = done(&msg);
                out.push(msg);
                if stop {
                    return out;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut
                    || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
}

/// Sends `signal` to `r`, then waits (at most 10 s) for its STOPPING=1 on
/// `sock`.
fn stop(r: &Replicating, sock: &UnixDatagram, signal: i32) {
    r.signal(signal);
    receive(sock, Duration::from_secs(10), |msg| msg == "STOPPING=1", r);
}

fn notify_socket(path: &Path) -> UnixDatagram {
    let sock = UnixDatagram::bind(path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    sock
}

#[test]
fn replicate_speaks_systemds_notify_protocol() {
    let c = Cluster::start(1);
    let m = Master::new(&c.endpoints().join(", "), "");
    let seeded = seed(&m);
    let path = m.t.path().join("notify.sock");
    let sock = notify_socket(&path);
    let mut r = m.replicate(&[
        ("NOTIFY_SOCKET", s(&path)),
        // Pings every 150 ms.
        ("WATCHDOG_USEC", "300000"),
    ]);
    // READY=1 only once the state file shows the list applied.
    let mut listed = 0;
    let got = receive(
        &sock,
        Duration::from_secs(30),
        |msg| {
            if msg.lines().any(|l| l == "READY=1") {
                let st = m.state().expect("the state file, before READY=1");
                listed = st["listed_at"].as_i64().expect("listed_at");
                assert!(
                    st["revision"].as_i64() >= Some(seeded) && listed >= seeded,
                    "READY=1 before the list was applied: {st}"
                );
                return true;
            }
            false
        },
        &r,
    );
    let ready = got.last().expect("READY=1");
    assert!(
        ready.contains(&format!("STATUS=revision {listed}, lag ")),
        "{ready}"
    );
    // The watchdog's pings, while the loop is healthy.
    let mut pings = 0;
    receive(
        &sock,
        Duration::from_secs(10),
        |msg| {
            pings += usize::from(msg == "WATCHDOG=1");
            pings >= 5
        },
        &r,
    );
    // A change moves the status.
    accept_a_pending_key(&m);
    let revision = m.state().expect("state")["revision"]
        .as_i64()
        .expect("revision");
    assert!(revision > seeded);
    receive(
        &sock,
        Duration::from_secs(10),
        |msg| msg.starts_with(&format!("STATUS=revision {revision}, lag ")),
        &r,
    );
    // SIGTERM: STOPPING=1, then a clean exit.
    stop(&r, &sock, libc::SIGTERM);
    let st = r.wait(Duration::from_secs(10));
    assert!(st.success(), "{st:?}\n{}", r.log());
    // A restart resumes: READY=1 once it proved the replica current,
    // through an abstract socket (`@name`) this time.
    let name = format!("keycache-test-{}-{}", std::process::id(), free_port());
    let abstract_sock = {
        use std::os::linux::net::SocketAddrExt;
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("abstract name");
        let sock = UnixDatagram::bind_addr(&a).expect("bind the abstract socket");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        sock
    };
    let before = m.state().expect("state");
    let mut r = m.replicate(&[("NOTIFY_SOCKET", &format!("@{name}"))]);
    receive(
        &abstract_sock,
        Duration::from_secs(30),
        |msg| msg.lines().any(|l| l == "READY=1"),
        &r,
    );
    let after = m.state().expect("state");
    assert_eq!(
        after["listed_at"], before["listed_at"],
        "resumed, not listed again"
    );
    assert_ne!(after["pid"], before["pid"], "proven by the new replicator");
    stop(&r, &abstract_sock, libc::SIGINT);
    assert!(r.wait(Duration::from_secs(10)).success());
}

#[test]
fn a_bad_metrics_option_or_address_is_refused_naming_it() {
    let m = Master::new("127.0.0.1:1", "  metrics: 0\n");
    let err = kc().args(["replicate", "-c", m.c()]).fails(2);
    assert!(
        err.contains("keycache_etcd.metrics") && err.contains("a port from 1 to 65535"),
        "{err}"
    );
    // An address taken by another: refused before anything is replicated.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let m = Master::new("127.0.0.1:1", &format!("  metrics: {port}\n"));
    let err = kc().args(["replicate", "-c", m.c()]).fails(2);
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}"))
            && err.contains("keycache_etcd.metrics"),
        "{err}"
    );
    assert!(m.state().is_none());
}
