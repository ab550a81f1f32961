//! The crash tests' shared pieces: here the child writer's random
//! operations and the model they are checked against, and the writer's
//! log; in `check` the checks run on a store after a kill or a power loss
//! and the copies of stores read by the real Salt at the end of a test; in
//! `steps` the kill-at-every-step driver of the CLI's rebuilds.
//!
//! The crash tests (`crates/keycache-cli/tests/cli/crash/`) re-execute
//! their own test binary as the child writer: its `#[ignore]`d
//! `child_writer` test, at the root of the binary (`tests/cli/main.rs`, so
//! that `--exact child_writer` names it), calls [`child_writer_main`], and
//! [`writer_command`] runs it with `--ignored --exact child_writer`.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use keycache::verify::{self, Finding};
use keycache::{KeyState, MinionId, Store};
use serde_json::{json, Value};

mod check;
mod steps;

pub use check::*;
pub use steps::*;

use crate::common::{self, pem, Params, ParamsExt};
use crate::rng::Rng;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
use crate::{disk, tracer};

/// The store layout of the crash tests.
pub fn layout() -> Params {
    Params {
        size: 127,
        max_segment_bytes: 4096,
        id_size: 64,
        slot_size: 96,
    }
}

/// The pool of ids the writers use.
pub fn ids() -> Vec<String> {
    (0..40).map(|i| format!("m{i:02}.crash.example")).collect()
}

/// An integer from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Timed kills of the writer; the other crash counts scale with it.
pub fn kills() -> u64 {
    env_u64("KEYCACHE_CRASH_KILLS", 300)
}

/// CLI arguments `extra[0] DIR extra[1..] <layout>`.
pub fn args_of(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    a.insert(1, dir.to_string_lossy().into_owned());
    a.extend(layout().args());
    a
}

/// The keycache CLI binary the checks run (the test kit cannot name it:
/// only the tests of `keycache-cli` know `CARGO_BIN_EXE_keycache`).
#[derive(Debug, Clone)]
pub struct Cli(PathBuf);

impl Cli {
    /// The binary at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Cli {
        Cli(path.into())
    }

    /// Where the binary is.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The binary, without the wait for Salt's writers after rebuilds
    /// (nothing of Salt writes here; see keycache::rebuild::DEFAULT_SETTLE).
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.0);
        c.env("KEYCACHE_REBUILD_SETTLE_MS", "0")
            .env("NO_COLOR", "1");
        c
    }

    /// Runs `keycache extra[0] DIR extra[1..] <layout>`.
    pub fn run(&self, dir: &Path, extra: &[&str]) -> Output {
        self.cmd().args(args_of(dir, extra)).output().unwrap()
    }

    /// A copy of the binary in `dir` (which is made 0755, as is the copy),
    /// for running it as another user: the checkout may sit where that
    /// user cannot reach it (a clone under `mktemp -d` is 0700).
    pub fn copied_to(&self, dir: &Path) -> Cli {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let to = dir.join("keycache");
        std::fs::copy(&self.0, &to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", self.0.display(), to.display()));
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        Cli(to)
    }
}

/// Open options of the crash tests: rebuilds in this process do not wait
/// for Salt's writers either (nothing of Salt writes to these stores).
pub fn opts() -> keycache::OpenOptions {
    layout().options_with(keycache::table::DEFAULT_READ_RETRY, Duration::ZERO)
}

// ---------------------------------------------------------------------------
// Operations, the child writer and the model
// ---------------------------------------------------------------------------

/// The key states, by name.
pub const STATES: [&str; 3] = ["accepted", "pending", "rejected"];

/// A random op (a batch of ops when `depth` is 0), as JSON.
pub fn random_op(rng: &mut Rng, seq: u64, depth: u32) -> Value {
    let ids = ids();
    let id = rng.pick(&ids).clone();
    let st = *rng.pick(&STATES);
    let value =
        |rng: &mut Rng, tag: &str| pem(&format!("{id}-{seq}-{tag}"), 60 + rng.below(400) as usize);
    match rng.below(if depth == 0 { 40 } else { 30 }) {
        0..=9 => json!({"k": "put", "id": id, "st": st, "pem": value(rng, "p")}),
        10..=15 => json!({"k": "state", "id": id, "st": st}),
        16..=20 => json!({"k": "deny", "id": id, "pem": value(rng, "d")}),
        21..=25 => json!({"k": "remove", "id": id}),
        26..=29 => json!({"k": "undeny", "id": id}),
        30..=37 => {
            let n = 2 + rng.below(6);
            let ops: Vec<Value> = (0..n)
                .map(|j| random_op(rng, seq * 100 + j, depth + 1))
                .collect();
            json!({"k": "batch", "ops": ops})
        }
        _ => json!({"k": "compact"}),
    }
}

/// The state named `s`.
pub fn state(s: &str) -> KeyState {
    s.parse().unwrap()
}

/// The id of an op.
pub fn mid(op: &Value) -> MinionId {
    MinionId::new(op["id"].as_str().unwrap()).unwrap()
}

/// Runs an op on the store.
pub fn apply(store: &Store, op: &Value) -> keycache::Result<()> {
    let s = |k: &str| op[k].as_str().unwrap();
    match s("k") {
        "put" => store.put(&mid(op), state(s("st")), s("pem").as_bytes()),
        "state" => store.set_state(&mid(op), state(s("st"))).map(|_| ()),
        "deny" => store.deny(&mid(op), s("pem").as_bytes()),
        "remove" => store.remove(&mid(op)).map(|_| ()),
        "undeny" => store.remove_denied(&mid(op)).map(|_| ()),
        "compact" => store.compact(None),
        "batch" => store
            .batch(|b| {
                for o in op["ops"].as_array().unwrap() {
                    let s = |k: &str| o[k].as_str().unwrap();
                    match s("k") {
                        "put" => b.put(&mid(o), state(s("st")), s("pem").as_bytes())?,
                        "state" => {
                            b.set_state(&mid(o), state(s("st")))?;
                        }
                        "deny" => b.deny(&mid(o), s("pem").as_bytes())?,
                        "remove" => b.remove(&mid(o))?,
                        "undeny" => b.remove_denied(&mid(o))?,
                        _ => {}
                    }
                }
                Ok(())
            })
            .map(|_| ()),
        k => panic!("unknown op {k}"),
    }
}

/// What the store should hold: keys id -> (state, pem), denied id -> pem.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Model {
    /// keys: id -> (state, pem).
    pub keys: BTreeMap<String, (String, String)>,
    /// denied_keys: id -> pem.
    pub denied: BTreeMap<String, String>,
}

impl Model {
    /// The model after `op`.
    pub fn apply(&mut self, op: &Value) {
        let s = |k: &str| op[k].as_str().unwrap().to_owned();
        match op["k"].as_str().unwrap() {
            "put" => {
                self.keys.insert(s("id"), (s("st"), s("pem")));
            }
            "state" => {
                if let Some(e) = self.keys.get_mut(&s("id")) {
                    e.0 = s("st");
                }
            }
            "deny" => {
                self.denied.insert(s("id"), s("pem"));
            }
            "remove" => {
                self.keys.remove(&s("id"));
            }
            "undeny" => {
                self.denied.remove(&s("id"));
            }
            "batch" => {
                for o in op["ops"].as_array().unwrap() {
                    self.apply(o);
                }
            }
            _ => {}
        }
    }

    /// The model as keycache reads a store.
    pub fn read(store: &Store) -> Model {
        let mut m = Model::default();
        for id in ids() {
            let i = MinionId::new(id.clone()).unwrap();
            if let Some(e) = store
                .get(&i)
                .unwrap_or_else(|e| panic!("get {id} after a crash: {e}"))
            {
                m.keys.insert(
                    id.clone(),
                    (
                        e.state.name().to_owned(),
                        String::from_utf8(e.public_key).unwrap(),
                    ),
                );
            }
            if let Some(d) = store
                .denied(&i)
                .unwrap_or_else(|e| panic!("denied {id} after a crash: {e}"))
            {
                m.denied.insert(id, String::from_utf8(d).unwrap());
            }
        }
        m
    }
}

/// The child writer: runs random ops on `KEYCACHE_CRASH_DIR` until killed
/// (or `KEYCACHE_CRASH_OPS` ops), printing `@@B seq op` before and `@@A seq`
/// after each; with `KEYCACHE_CRASH_TREE` set, the whole key tree kept in
/// step. The body of the CLI test binary's `#[ignore]`d
/// `child_writer` test, which only [`writer_command`] runs.
pub fn child_writer_main() {
    let Some(dir) = std::env::var_os("KEYCACHE_CRASH_DIR") else {
        panic!(
            "child_writer is the crash tests' child process: their parent test runs it \
             (with KEYCACHE_CRASH_DIR set), not cargo test"
        );
    };
    let dir = PathBuf::from(dir);
    let mut rng = Rng::new(env_u64("KEYCACHE_CRASH_SEED", 1));
    let seq0 = env_u64("KEYCACHE_CRASH_SEQ", 0);
    let max = env_u64("KEYCACHE_CRASH_OPS", u64::MAX);
    let mut store = Store::open_with(&dir, &opts()).unwrap();
    if std::env::var_os("KEYCACHE_CRASH_TREE").is_some() {
        store = store.with_tree(keycache::tree::TreeSync::On);
    }
    println!("@@READY");
    for seq in seq0..seq0.saturating_add(max) {
        let op = random_op(&mut rng, seq, 0);
        println!("@@B {seq} {op}");
        if let Err(e) = apply(&store, &op) {
            println!("@@E {seq} {e}");
            std::process::exit(3);
        }
        println!("@@A {seq}");
    }
    println!("@@DONE");
}

/// This test binary re-executed as the child writer, on `dir`, with a seed,
/// the first op's sequence number and at most `ops` ops.
pub fn writer_command(dir: &Path, seed: u64, seq: u64, ops: Option<u64>) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        "child_writer",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("KEYCACHE_CRASH_DIR", dir)
    .env("KEYCACHE_CRASH_SEED", seed.to_string())
    .env("KEYCACHE_CRASH_SEQ", seq.to_string())
    .stdin(Stdio::null())
    .stderr(Stdio::null());
    if let Some(n) = ops {
        c.env("KEYCACHE_CRASH_OPS", n.to_string());
    }
    c
}

/// The ops a writer's output shows: (begun in order, acknowledged seqs,
/// next seq).
pub struct Log {
    /// The ops begun, in order.
    pub begun: Vec<(u64, Value)>,
    /// The seqs acknowledged.
    pub acked: HashSet<u64>,
    /// The seq of the next op.
    pub next_seq: u64,
    /// An op's error, when one failed.
    pub error: Option<String>,
}

/// The log of a writer's output, its first op being `seq0`.
pub fn parse_log(text: &str, seq0: u64) -> Log {
    let mut log = Log {
        begun: Vec::new(),
        acked: Default::default(),
        next_seq: seq0,
        error: None,
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("@@B ") {
            let (seq, op) = rest.split_once(' ').unwrap();
            let seq: u64 = seq.parse().unwrap();
            // A line cut by the kill is not an op that started.
            if let Ok(op) = serde_json::from_str(op) {
                log.begun.push((seq, op));
                log.next_seq = seq + 1;
            }
        } else if let Some(rest) = line.strip_prefix("@@A ") {
            if let Ok(seq) = rest.trim().parse() {
                log.acked.insert(seq);
            }
        } else if let Some(rest) = line.strip_prefix("@@E ") {
            log.error = Some(rest.to_owned());
        }
    }
    log
}

/// The model after the acknowledged ops, and after the op in flight too.
pub fn models(base: &Model, log: &Log) -> (Model, Model, bool) {
    let mut before = base.clone();
    let mut in_flight = None;
    for (seq, op) in &log.begun {
        if log.acked.contains(seq) {
            assert!(in_flight.is_none(), "ops run one at a time");
            before.apply(op);
        } else {
            in_flight = Some(op.clone());
        }
    }
    let mut after = before.clone();
    if let Some(op) = &in_flight {
        after.apply(op);
    }
    (before, after, in_flight.is_some())
}
