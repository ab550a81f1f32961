//! What the tests against a real etcd share: a master's scratch
//! directories and config, its `keycache replicate` child, etcdctl's put
//! and get, and a seed read from the environment.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use keycache_testkit::cmd::TestCommand;
use keycache_testkit::etcd::Cluster;
use serde_json::Value;

/// A master's scratch directory with an empty store directory (`pki`)
/// and an empty config directory (`etc`) in it.
pub fn master_dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().expect("scratch");
    let (pki, conf) = (t.path().join("pki"), t.path().join("etc"));
    std::fs::create_dir(&pki).expect("pki");
    std::fs::create_dir(&conf).expect("etc");
    (t, pki, conf)
}

/// Writes `conf/master`: the store `pki` (1009 slots, keycache as the keys
/// driver) replicating `prefix` of `endpoints` (comma-separated); `more`
/// is appended to the `keycache_etcd` mapping (indented lines).
pub fn write_master_config(conf: &Path, pki: &Path, endpoints: &str, prefix: &str, more: &str) {
    let text = format!(
        "pki_dir: {}\nmmap_key_size: 1009\nkeys.cache_driver: keycache\nkeycache_etcd:\n  \
         endpoints: [{endpoints}]\n  prefix: {prefix}\n{more}",
        pki.display()
    );
    std::fs::write(conf.join("master"), text).expect("master config");
}

/// Starts `c` (a `keycache replicate`): stdin closed, stdout into `out`,
/// stderr into a new file `log`.
pub fn spawn_logged(c: &mut TestCommand, log: &Path, out: Stdio) -> Child {
    let err = std::fs::File::create(log).expect("log");
    c.cmd()
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start keycache replicate")
}

/// SIGKILL, and wait.
pub fn kill_child(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// A `keycache replicate` this test started and the file its stderr goes
/// to; killed when dropped, so that none outlives the test's etcd.
pub struct Replicating {
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Replicating {
    /// Starts `c` as [`spawn_logged`] does.
    pub fn spawn(c: &mut TestCommand, log: PathBuf, out: Stdio) -> Replicating {
        let child = spawn_logged(c, &log, out);
        Replicating {
            child: Some(child),
            log,
        }
    }

    /// Its pid (0 once it was reaped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// What it wrote on stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, and wait.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_child(&mut c);
        }
    }
}

impl Drop for Replicating {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits (at most 30 s) until `current()`, the revision a replica records,
/// reaches `revision`; fails naming `said()`, what its replicators wrote.
pub fn wait_revision(revision: i64, current: impl Fn() -> i64, said: impl Fn() -> String) {
    let start = Instant::now();
    while current() < revision {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "replica stuck at {} < {revision}; {}",
            current(),
            said()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`master_dirs`] with a config ([`write_master_config`]) naming every
/// member of `c`.
pub fn master_of(c: &Cluster, prefix: &str, more: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (t, pki, conf) = master_dirs();
    write_master_config(&conf, &pki, &c.endpoints().join(", "), prefix, more);
    (t, pki, conf)
}

/// `etcdctl put -- KEY VALUE`; the revision it committed.
pub fn etcd_put(c: &Cluster, key: &str, value: &str) -> i64 {
    let out = c
        .etcdctl(&["put", "-w", "json", "--", key, value])
        .expect("etcdctl put");
    serde_json::from_str::<Value>(&out).expect("json")["header"]["revision"]
        .as_i64()
        .expect("revision")
}

/// What etcd holds for `key` (`None`: absent).
pub fn etcd_value(c: &Cluster, key: &str) -> Option<String> {
    let out = c
        .etcdctl(&["get", key, "--print-value-only"])
        .expect("etcdctl get");
    out.strip_suffix('\n').map(str::to_owned)
}

/// A randomized test's seed: the environment variable `var`, which must be
/// a number when set, else `default`.
pub fn seed_from_env(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) => v.parse().unwrap_or_else(|e| panic!("{var}={v:?}: {e}")),
        Err(_) => default,
    }
}
