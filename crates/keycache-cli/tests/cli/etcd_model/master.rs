//! A master of the model test: its store directory, its master config,
//! its `keycache replicate` child, killed and restarted at will, and its
//! Salt driver (`key_ops.py`: `salt.cache.Cache` on the same config).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keycache_etcd::{ReplicaState, Settings};
use keycache_testkit::etcd::Cluster;
use serde_json::Value;

use super::{PREFIX, WRITE_TIMEOUT};
use crate::common::etcd::{kill_child, master_of, spawn_logged};
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
    /// Its `key_ops.py`, started on first use.
    pub driver: Mutex<Option<KeyOps>>,
}

/// A `key_ops.py` process: one request line in, one answer line out.
pub struct KeyOps {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    log: PathBuf,
}

impl KeyOps {
    /// Sends `req`; the answer, or `None` when the process is gone.
    fn ask(&mut self, req: &Value) -> Option<Value> {
        writeln!(self.input, "{req}").ok()?;
        self.input.flush().ok()?;
        let mut line = String::new();
        match self.output.read_line(&mut line) {
            Ok(n) if n > 0 => Some(serde_json::from_str(&line).expect("key_ops.py's answer")),
            _ => None,
        }
    }
}

impl Drop for Master {
    /// No replicator outlives the test: its etcd is gone with the test's
    /// cluster, and it would try to reach it forever.
    fn drop(&mut self) {
        if let Ok(r) = self.repl.get_mut() {
            if let Some(mut c) = r.child.take() {
                kill_child(&mut c);
            }
        }
        if let Ok(Some(k)) = self.driver.get_mut() {
            let _ = k.child.kill();
            let _ = k.child.wait();
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
        let (t, pki, conf) = master_of(c, PREFIX, &format!("  write_timeout: {WRITE_TIMEOUT}\n"));
        let mut settings = Settings::plain(c.endpoints(), PREFIX).expect("settings");
        settings.write_timeout = Duration::from_secs(WRITE_TIMEOUT);
        Master {
            idx,
            t,
            pki,
            conf,
            settings,
            repl: Mutex::new(Repl::default()),
            driver: Mutex::new(None),
        }
    }

    /// Runs one of Salt's key operations (a request of `key_ops.py`)
    /// through this master's driver; its answer.
    pub fn key_op(&self, req: &Value) -> Value {
        let mut d = self.driver.lock().expect("lock");
        let k = d.get_or_insert_with(|| self.start_key_ops());
        match k.ask(req) {
            Some(answer) => answer,
            None => {
                let log = std::fs::read_to_string(&k.log).unwrap_or_default();
                ensure!(
                    false,
                    "master {}'s key_ops.py died on {req}:\n{log}",
                    self.idx
                );
                unreachable!()
            }
        }
    }

    fn start_key_ops(&self) -> KeyOps {
        let log = self.t.path().join("key_ops.log");
        let mut child = std::process::Command::new(keycache_testkit::common::python())
            .arg(keycache_testkit::common::py_dir().join("key_ops.py"))
            .arg(self.conf.join("master"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start key_ops.py");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut k = KeyOps {
            child,
            input,
            output,
            log,
        };
        let mut line = String::new();
        let ready = k.output.read_line(&mut line).is_ok_and(|n| n > 0);
        ensure!(
            ready && line.contains("ready"),
            "master {}'s key_ops.py did not start: {line}\n{}",
            self.idx,
            std::fs::read_to_string(&k.log).unwrap_or_default()
        );
        k
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
        let child = spawn_logged(
            kc().args(["replicate", "-c", self.c()]),
            &r.log,
            Stdio::null(),
        );
        r.child = Some(child);
    }

    /// Kills its replicator (SIGKILL) and waits for it.
    pub fn kill(&self) {
        let mut r = self.repl.lock().expect("lock");
        if let Some(mut c) = r.child.take() {
            r.killed.push(c.id());
            kill_child(&mut c);
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
