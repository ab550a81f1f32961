//! A master of the model test: its store directory, its master config,
//! and its `keycache replicate` child, killed and restarted at will.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keycache_etcd::{ReplicaState, Settings};
use keycache_testkit::etcd::Cluster;
use serde_json::Value;

use super::{PREFIX, WRITE_TIMEOUT};
use crate::common::tree_files;
use crate::common::{kc, s};

/// A master: its store directory, its config, its replicator.
pub struct Master {
    pub idx: usize,
    pub t: tempfile::TempDir,
    pub pki: PathBuf,
    pub conf: PathBuf,
    pub settings: Settings,
    pub repl: Mutex<Repl>,
}

impl Drop for Master {
    /// No replicator outlives the test: its etcd is gone with the test's
    /// cluster, and it would try to reach it forever.
    fn drop(&mut self) {
        if let Ok(r) = self.repl.get_mut() {
            if let Some(mut c) = r.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A master's `keycache replicate` child, and the log of its latest start.
#[derive(Default)]
pub struct Repl {
    pub child: Option<Child>,
    pub starts: usize,
    pub log: PathBuf,
    /// The pids of the replicators killed.
    pub killed: Vec<u32>,
}

impl Master {
    pub fn new(idx: usize, c: &Cluster) -> Master {
        let t = tempfile::tempdir().expect("scratch");
        let (pki, conf) = (t.path().join("pki"), t.path().join("etc"));
        std::fs::create_dir(&pki).expect("pki");
        std::fs::create_dir(&conf).expect("etc");
        let text = format!(
            "pki_dir: {}\nmmap_key_size: 1009\nkeys.cache_driver: keycache\nkeycache_etcd:\n  \
             endpoints: [{}]\n  prefix: {PREFIX}\n  write_timeout: {WRITE_TIMEOUT}\n",
            pki.display(),
            c.endpoints().join(", ")
        );
        std::fs::write(conf.join("master"), text).expect("master config");
        let mut settings = Settings::plain(c.endpoints(), PREFIX).expect("settings");
        settings.write_timeout = Duration::from_secs(WRITE_TIMEOUT);
        Master {
            idx,
            t,
            pki,
            conf,
            settings,
            repl: Mutex::new(Repl::default()),
        }
    }

    pub fn c(&self) -> &str {
        s(&self.conf)
    }

    /// Starts its replicator unless it runs.
    pub fn start(&self) {
        let mut r = self.repl.lock().expect("lock");
        if r.child.is_some() {
            return;
        }
        r.starts += 1;
        r.log = self.t.path().join(format!("replicate-{}.log", r.starts));
        let err = std::fs::File::create(&r.log).expect("log");
        let child = kc()
            .args(["replicate", "-c", self.c()])
            .cmd()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start keycache replicate");
        r.child = Some(child);
    }

    /// Kills its replicator (SIGKILL) and waits for it.
    pub fn kill(&self) {
        let mut r = self.repl.lock().expect("lock");
        if let Some(mut c) = r.child.take() {
            r.killed.push(c.id());
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn running(&self) -> bool {
        self.repl.lock().expect("lock").child.is_some()
    }

    /// Its replicator's output since its latest start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.repl.lock().expect("lock").log).unwrap_or_default()
    }

    /// The revision its replica records (0: none yet).
    pub fn revision(&self) -> i64 {
        ReplicaState::read(&self.pki)
            .ok()
            .flatten()
            .map_or(0, |s| s.revision)
    }

    pub fn wait_for(&self, revision: i64) {
        let start = Instant::now();
        while self.revision() < revision {
            ensure!(
                start.elapsed() < Duration::from_secs(30),
                "master {}'s replica stuck at {} < {revision}; replicate said:\n{}",
                self.idx,
                self.revision(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn list(&self) -> Value {
        kc().args(["list", "-c", self.c(), "--json"]).json()
    }

    /// What a reader sees: the listing, the key tree's files and the
    /// recorded revision.
    pub fn snapshot(&self) -> (Value, BTreeSet<String>, i64) {
        (self.list(), tree_files(&self.pki), self.revision())
    }
}
