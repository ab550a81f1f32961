//! Crash safety.
//!
//! - A writer in a child process (this test binary re-executed in the
//!   `child_writer` role: random puts, state changes, denies, removes,
//!   batches and compactions, each op printed before it starts and after it
//!   returns, i.e. once it is durable) is killed with SIGKILL, either after a
//!   random delay (any instruction, mapped-memory stores included) or at the
//!   entry of a random system call (through ptrace). After every kill the
//!   store is reopened and checked: every acknowledged write is there, no id
//!   has a value that was never written for it (each id holds its value
//!   before or after the op in flight), `verify` is clean or finds only what
//!   a crash between the index and the roster leaves (header counters and
//!   roster entries) and `keycache verify --repair` mends it; Salt's own
//!   `mmap_key` then reads copies of the stores without error and agrees
//!   with keycache.
//! - `keycache compact` and `keycache migrate` killed at every system call
//!   (or a wide sample): the store is the whole previous state or the whole
//!   new one, and `verify` is clean.
//! - Simulated power loss: the same runs under a tracer that records, at
//!   every fsync/fdatasync/msync and every rename/unlink/create, what is
//!   durable; at random points a disk image is built from the durable state
//!   of each file (as of its last sync) with the unsynced pages of each file
//!   dropped or kept page by page (torn tails, length before or after), and
//!   a namespace that is a prefix of the directory operations since the last
//!   directory fsync. The images get the same checks.
//!
//! Scale with `KEYCACHE_CRASH_KILLS` (timed kills of the writer; the other
//! counts follow it). The tracer is x86_64 Linux only; elsewhere those tests
//! print a notice and pass.

#![allow(unsafe_code, clippy::undocumented_unsafe_blocks)] // FIXME(testkit): move into one audited module
mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{pem, Layout, Rng};
use keycache::verify::{self, Finding};
use keycache::{KeyState, MinionId, Store};
use serde_json::{json, Value};

const ROLE: &str = "KEYCACHE_CRASH_ROLE";

fn layout() -> Layout {
    Layout {
        size: 127,
        max_segment_bytes: 4096,
        id_size: 64,
        slot_size: 96,
    }
}

fn ids() -> Vec<String> {
    (0..40).map(|i| format!("m{i:02}.crash.example")).collect()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Timed kills of the writer; the other crash counts scale with it.
fn kills() -> u64 {
    env_u64("KEYCACHE_CRASH_KILLS", 300)
}

fn args_of(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    a.insert(1, dir.to_string_lossy().into_owned());
    a.extend(layout().args());
    a
}

/// The keycache CLI, without the wait for Salt's writers after rebuilds
/// (nothing of Salt writes here; see keycache::rebuild::DEFAULT_SETTLE).
fn kc_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keycache"));
    c.env("KEYCACHE_REBUILD_SETTLE_MS", "0")
        .env("NO_COLOR", "1");
    c
}

fn kc(dir: &Path, extra: &[&str]) -> std::process::Output {
    kc_cmd().args(args_of(dir, extra)).output().unwrap()
}

/// Open options of the crash tests: rebuilds in this process do not wait
/// for Salt's writers either.
fn opts() -> keycache::OpenOptions {
    layout().options_with(keycache::table::DEFAULT_READ_RETRY, Duration::ZERO)
}

/// Global tallies, printed by the tests.
static KILLS: AtomicU64 = AtomicU64::new(0);

// ---------------------------------------------------------------------------
// Operations, the child writer and the model
// ---------------------------------------------------------------------------

const STATES: [&str; 3] = ["accepted", "pending", "rejected"];

fn random_op(rng: &mut Rng, seq: u64, depth: u32) -> Value {
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

fn state(s: &str) -> KeyState {
    s.parse().unwrap()
}

fn mid(op: &Value) -> MinionId {
    MinionId::new(op["id"].as_str().unwrap()).unwrap()
}

fn apply(store: &Store, op: &Value) -> keycache::Result<()> {
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
struct Model {
    keys: BTreeMap<String, (String, String)>,
    denied: BTreeMap<String, String>,
}

impl Model {
    fn apply(&mut self, op: &Value) {
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
    fn read(store: &Store) -> Model {
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
/// after each.
#[test]
fn child_writer() {
    if std::env::var(ROLE).as_deref() != Ok("writer") {
        return;
    }
    let dir = PathBuf::from(std::env::var("KEYCACHE_CRASH_DIR").unwrap());
    let mut rng = Rng(env_u64("KEYCACHE_CRASH_SEED", 1) | 1);
    let seq0 = env_u64("KEYCACHE_CRASH_SEQ", 0);
    let max = env_u64("KEYCACHE_CRASH_OPS", u64::MAX);
    let store = Store::open_with(&dir, &opts()).unwrap();
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

fn writer_command(dir: &Path, seed: u64, seq: u64, ops: Option<u64>) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env(ROLE, "writer")
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
struct Log {
    begun: Vec<(u64, Value)>,
    acked: std::collections::HashSet<u64>,
    next_seq: u64,
    error: Option<String>,
}

fn parse_log(text: &str, seq0: u64) -> Log {
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
fn models(base: &Model, log: &Log) -> (Model, Model, bool) {
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

// ---------------------------------------------------------------------------
// Checking a crashed store
// ---------------------------------------------------------------------------

/// What a crash between writing the index and the roster may leave: header
/// counters and roster entries out of step with the slots.
fn legit_after_crash(f: &Finding) -> bool {
    f.repairable
        && (f.file.to_string_lossy().ends_with(".roster")
            || (f.slot.is_none()
                && matches!(
                    f.offset,
                    Some(o) if o == keycache::format::HDR_OCCUPIED as u64
                        || o == keycache::format::HDR_DELETED as u64
                        || o == keycache::format::HDR_HWM as u64
                )))
}

fn findings(store: &Store) -> Vec<Finding> {
    verify::verify_store(store).unwrap()
}

fn listing(store: &Store) -> Model {
    let mut m = Model::default();
    for r in store.keys(None).unwrap() {
        let (id, e) = r.unwrap();
        m.keys.insert(
            id,
            (
                e.state.name().to_owned(),
                String::from_utf8(e.public_key).unwrap(),
            ),
        );
    }
    for r in store.denied_keys().unwrap() {
        let (id, p) = r.unwrap();
        m.denied.insert(id, String::from_utf8(p).unwrap());
    }
    m
}

/// Tallies of what the checks met.
#[derive(Debug, Default)]
struct Tally {
    checked: u64,
    in_flight: u64,
    in_flight_applied: u64,
    with_findings: u64,
    repaired: u64,
}

/// A failed check: the id concerned, when one is, and what is wrong.
type Problem = (Option<String>, String);

/// Reads every id of the pool; a failed read is a problem for that id.
fn read_model(store: &Store) -> Result<Model, Problem> {
    let mut m = Model::default();
    for id in ids() {
        let i = MinionId::new(id.clone()).unwrap();
        match store.get(&i) {
            Ok(Some(e)) => {
                m.keys.insert(
                    id.clone(),
                    (
                        e.state.name().to_owned(),
                        String::from_utf8_lossy(&e.public_key).into_owned(),
                    ),
                );
            }
            Ok(None) => {}
            Err(e) => return Err((Some(id), format!("get: {e}"))),
        }
        match store.denied(&i) {
            Ok(Some(d)) => {
                m.denied
                    .insert(id.clone(), String::from_utf8_lossy(&d).into_owned());
            }
            Ok(None) => {}
            Err(e) => return Err((Some(id), format!("denied: {e}"))),
        }
    }
    Ok(m)
}

/// Checks a store after a crash: every id holds its value before or after
/// the op in flight; findings are only what a crash between index and
/// roster leaves, and `keycache verify --repair` mends them. Returns what
/// the store holds.
fn try_check_crashed(
    dir: &Path,
    before: &Model,
    after: &Model,
    tally: &mut Tally,
) -> Result<Model, Problem> {
    let store = Store::open_with(dir, &opts()).map_err(|e| (None, format!("reopen: {e}")))?;
    let got = read_model(&store)?;
    for id in ids() {
        let ok = |m: &Model| m.keys.get(&id) == got.keys.get(&id);
        if !(ok(before) || ok(after)) {
            return Err((
                Some(id.clone()),
                format!(
                    "keys[{id}] is {:?}; acknowledged {:?}, in flight {:?}",
                    got.keys.get(&id),
                    before.keys.get(&id),
                    after.keys.get(&id)
                ),
            ));
        }
        let ok = |m: &Model| m.denied.get(&id) == got.denied.get(&id);
        if !(ok(before) || ok(after)) {
            return Err((
                Some(id.clone()),
                format!(
                    "denied[{id}] is {:?}; acknowledged {:?}, in flight {:?}",
                    got.denied.get(&id),
                    before.denied.get(&id),
                    after.denied.get(&id)
                ),
            ));
        }
    }
    tally.checked += 1;
    if before != after {
        tally.in_flight += 1;
        if got != *before {
            tally.in_flight_applied += 1;
        }
    }
    let f = findings(&store);
    let listed = listing(&store);
    // What the op in flight did not touch was acknowledged whole: it is
    // listed too (Salt lists by the roster), before any repair.
    for id in ids() {
        if before.keys.get(&id) == after.keys.get(&id) && listed.keys.get(&id) != got.keys.get(&id)
        {
            return Err((
                Some(id.clone()),
                format!("acknowledged keys[{id}] is not listed"),
            ));
        }
        if before.denied.get(&id) == after.denied.get(&id)
            && listed.denied.get(&id) != got.denied.get(&id)
        {
            return Err((
                Some(id.clone()),
                format!("acknowledged denied[{id}] is not listed"),
            ));
        }
    }
    if f.is_empty() {
        if listed != got {
            return Err((None, "verify is clean but the listing differs".into()));
        }
    } else {
        tally.with_findings += 1;
        for x in &f {
            if !legit_after_crash(x) {
                return Err((
                    x.id.clone(),
                    format!("finding a crash cannot explain: {x:?}\nall: {f:?}"),
                ));
            }
        }
        drop(store);
        let out = kc(dir, &["verify", "--repair", "--json"]);
        if out.status.code() != Some(0) {
            return Err((
                None,
                format!(
                    "keycache verify --repair: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
        tally.repaired += 1;
        let store = Store::open_with(dir, &opts()).unwrap();
        assert!(findings(&store).is_empty(), "not clean after repair");
        assert_eq!(Model::read(&store), got, "repair changed entries");
        assert_eq!(listing(&store), got, "listing after repair");
    }
    Ok(got)
}

fn check_crashed(dir: &Path, before: &Model, after: &Model, ctx: &str, tally: &mut Tally) -> Model {
    try_check_crashed(dir, before, after, tally).unwrap_or_else(|(_, msg)| panic!("{ctx}: {msg}"))
}

/// Whether a slot holding `id` (whole or cut) in the image's `keys` or
/// `denied_keys` index spans two pages: a power loss can then leave its
/// status byte and id from one write and its pointer fields from another.
fn id_in_straddling_slot(dir: &Path, id: &str) -> bool {
    let l = layout();
    [".mmap_keys.idx", ".mmap_denied.idx"].iter().any(|n| {
        let ix = std::fs::read(dir.join(n)).unwrap_or_default();
        (1..l.size as usize).any(|s| {
            let off = s * l.slot_size;
            let Some(slot) = ix.get(off..off + l.slot_size) else {
                return false;
            };
            let raw = &slot[1..1 + l.id_size];
            let stored = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            let related = !stored.is_empty()
                && (stored == id.as_bytes()
                    || id.as_bytes().starts_with(stored)
                    || stored.starts_with(id.as_bytes()));
            related && off / 4096 != (off + 21 + l.id_size - 1) / 4096
        })
    })
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        if m.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Copies of checked stores, read by Salt at the end of a test.
#[derive(Default)]
struct SaltCheck {
    dirs: Vec<PathBuf>,
    want: Vec<Value>,
}

impl SaltCheck {
    fn add(&mut self, dir: &Path, to: PathBuf) {
        copy_dir(dir, &to);
        self.want.push(common::kc_dump(&to, &layout()));
        self.dirs.push(to);
    }

    fn run(self, ctx: &str) -> usize {
        let n = self.dirs.len();
        for ((dump, log), (want, dir)) in common::salt_dump_many(&self.dirs, &layout())
            .into_iter()
            .zip(self.want.iter().zip(&self.dirs))
        {
            assert!(
                dump.get("error").is_none(),
                "{ctx}: Salt failed on {}: {dump}",
                dir.display()
            );
            assert!(
                log.iter().all(|l| !l.starts_with("salt: ")),
                "{ctx}: Salt logged on {}: {log:?}",
                dir.display()
            );
            assert_eq!(dump["keys"], want["keys"], "{ctx}: {}", dir.display());
            assert_eq!(
                dump["denied_keys"],
                want["denied_keys"],
                "{ctx}: {}",
                dir.display()
            );
        }
        n
    }
}

fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.contains(".keycache-tmp.")
                || n.contains(".keycache-new.")
                || n.contains(".keycache-journal")
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The writer killed after random delays
// ---------------------------------------------------------------------------

#[test]
fn writer_killed_at_random_moments() {
    let n = kills();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let mut rng = Rng(0x1234_5678_9abc);
    let mut model = Model::default();
    let mut seq = 0;
    let mut tally = Tally::default();
    let mut salt = SaltCheck::default();
    let start = Instant::now();
    for k in 0..n {
        let mut child = writer_command(&dir, rng.next(), seq, None)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let mut r = BufReader::new(out);
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                if line.contains("@@READY") {
                    let _ = tx.send(());
                }
                text.push_str(&line);
                line.clear();
            }
            text
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the writer starts");
        // Kill within the first few ops, anywhere in them.
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success());
        KILLS.fetch_add(1, Ordering::Relaxed);
        let text = reader.join().unwrap();
        let log = parse_log(&text, seq);
        assert!(log.error.is_none(), "writer failed: {:?}", log.error);
        let (before, after, _) = models(&model, &log);
        model = check_crashed(&dir, &before, &after, &format!("kill {k}"), &mut tally);
        seq = log.next_seq;
        if k % 10 == 9 {
            salt.add(&dir, t.path().join(format!("salt-{k}")));
        }
    }
    // A compaction clears what killed rebuilds and roster repairs left.
    let out = kc(&dir, &["compact"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(temp_files(&dir), Vec::<String>::new());
    let salted = salt.run("timed kills");
    eprintln!(
        "timed kills: {n} kills, {seq} ops begun, {} in flight at the kill ({} applied), \
         {} with findings (all repaired), {salted} copies read by Salt, {:.1} s",
        tally.in_flight,
        tally.in_flight_applied,
        tally.with_findings,
        start.elapsed().as_secs_f64()
    );
    assert!(
        tally.in_flight > n / 4,
        "too few kills landed inside an op: {tally:?}"
    );
}

// ---------------------------------------------------------------------------
// ptrace: kills at a chosen system call, and power-loss images
// ---------------------------------------------------------------------------

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod tracer {
    //! A minimal ptrace tracer: stops a child (and its threads) at the entry
    //! and exit of every system call and hands each stop to a callback,
    //! which can kill the child there.

    use std::collections::HashMap;
    use std::os::unix::fs::FileExt;
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[derive(Debug, Clone, Copy)]
    pub struct Stop {
        pub pid: i32,
        pub entry: bool,
        pub nr: i64,
        pub args: [u64; 6],
        pub ret: i64,
    }

    #[derive(Debug, PartialEq, Eq)]
    pub enum Action {
        Go,
        Kill,
    }

    #[derive(Debug)]
    pub struct End {
        pub killed: bool,
        pub exit_code: Option<i32>,
        pub syscalls: u64,
    }

    fn ptrace(req: libc::c_uint, pid: i32, addr: usize, data: usize) -> libc::c_long {
        // SAFETY: ptrace requests on our own tracee with plain integer
        // arguments, or (GETREGS) a pointer to a live, correctly sized struct.
        unsafe {
            libc::ptrace(
                req,
                pid,
                addr as *mut libc::c_void,
                data as *mut libc::c_void,
            )
        }
    }

    /// Runs `cmd` under the tracer, calling `f` at every syscall stop.
    pub fn run(mut cmd: Command, timeout: Duration, mut f: impl FnMut(&Stop) -> Action) -> End {
        // SAFETY: the pre-exec hook only calls ptrace(PTRACE_TRACEME), which
        // is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::ptrace(
                    libc::PTRACE_TRACEME,
                    0,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                ) == -1
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn a traced child");
        let pid = child.id() as i32;
        std::mem::forget(child);
        let mut status = 0;
        // SAFETY: waitpid on our child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        assert_eq!(r, pid, "waitpid");
        assert!(libc::WIFSTOPPED(status), "stopped at exec");
        let opts =
            libc::PTRACE_O_TRACESYSGOOD | libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_EXITKILL;
        assert_eq!(ptrace(libc::PTRACE_SETOPTIONS, pid, 0, opts as usize), 0);
        // Watchdog.
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let watchdog = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !d2.load(Ordering::Relaxed) {
                if start.elapsed() > timeout {
                    // SAFETY: kill(2) with a pid and a signal number.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        });
        ptrace(libc::PTRACE_SYSCALL, pid, 0, 0);
        let mut in_sys: HashMap<i32, (i64, [u64; 6])> = HashMap::new();
        let mut known: std::collections::HashSet<i32> = [pid].into_iter().collect();
        let mut killed = false;
        let mut exit_code = None;
        let mut syscalls = 0;
        loop {
            let mut st = 0;
            // SAFETY: as above; __WNOTHREAD keeps us from reaping children
            // of the other test threads.
            let tid = unsafe { libc::waitpid(-1, &mut st, libc::__WALL | libc::__WNOTHREAD) };
            if tid < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break;
            }
            if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                if tid == pid && libc::WIFEXITED(st) {
                    exit_code = Some(libc::WEXITSTATUS(st));
                }
                in_sys.remove(&tid);
                continue;
            }
            if !libc::WIFSTOPPED(st) {
                continue;
            }
            let sig = libc::WSTOPSIG(st);
            let mut inject = 0;
            if sig == libc::SIGTRAP | 0x80 {
                // SAFETY: user_regs_struct is plain old data.
                let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
                if ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _ as usize) != 0 {
                    continue;
                }
                let stop = match in_sys.remove(&tid) {
                    Some((nr, args)) => Stop {
                        pid,
                        entry: false,
                        nr,
                        args,
                        ret: regs.rax as i64,
                    },
                    None => {
                        let nr = regs.orig_rax as i64;
                        let args = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9];
                        in_sys.insert(tid, (nr, args));
                        syscalls += 1;
                        Stop {
                            pid,
                            entry: true,
                            nr,
                            args,
                            ret: 0,
                        }
                    }
                };
                if !killed && f(&stop) == Action::Kill {
                    // SAFETY: kill(2).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    killed = true;
                }
            } else if sig == libc::SIGTRAP && (st >> 16) != 0 {
                // A clone event; the new thread is traced already.
            } else if sig == libc::SIGSTOP && known.insert(tid) {
                // The first stop of a new thread.
            } else {
                inject = sig as usize;
            }
            ptrace(libc::PTRACE_SYSCALL, tid, 0, inject);
        }
        done.store(true, Ordering::Relaxed);
        let timed_out = watchdog.join().unwrap();
        assert!(!timed_out, "traced child timed out");
        End {
            killed,
            exit_code,
            syscalls,
        }
    }

    /// Reads `len` bytes of the tracee's memory at `addr`.
    pub fn read_mem(pid: i32, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/mem")) {
            let n = f.read_at(&mut buf, addr).unwrap_or(0);
            buf.truncate(n);
        }
        buf
    }
}

/// The state of a store directory as a disk would hold it after power loss.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod disk {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const PAGE: usize = 4096;

    pub type Listing = BTreeMap<String, u64>;

    /// What is durable, and what the page cache holds, of one directory.
    pub struct Disk {
        pub dir: PathBuf,
        /// Names at the last directory fsync.
        pub durable_ns: Listing,
        /// Names after each namespace change since.
        pub ns_log: Vec<Listing>,
        /// Inode -> content as of its last sync.
        pub durable: HashMap<u64, Vec<u8>>,
        /// Inode -> latest content seen.
        pub latest: HashMap<u64, Vec<u8>>,
        pub syncs: u64,
    }

    pub fn listing(dir: &Path) -> Listing {
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if let Ok(m) = std::fs::symlink_metadata(e.path()) {
                if m.is_file() {
                    out.insert(e.file_name().to_string_lossy().into_owned(), m.ino());
                }
            }
        }
        out
    }

    impl Disk {
        /// Everything in `dir` is durable now.
        pub fn new(dir: &Path) -> Disk {
            let mut d = Disk {
                dir: dir.canonicalize().unwrap(),
                durable_ns: listing(dir),
                ns_log: Vec::new(),
                durable: HashMap::new(),
                latest: HashMap::new(),
                syncs: 0,
            };
            d.refresh_latest();
            d.durable = d.latest.clone();
            d
        }

        pub fn refresh_latest(&mut self) {
            for (name, ino) in listing(&self.dir) {
                if let Ok(b) = std::fs::read(self.dir.join(&name)) {
                    self.latest.insert(ino, b);
                }
            }
        }

        fn fd_target(pid: i32, fd: u64) -> Option<PathBuf> {
            std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()
        }

        /// Follows one system call exit of the tracee.
        pub fn on_exit(&mut self, s: &tracer::Stop) {
            if s.ret < 0 {
                return;
            }
            let nr = s.nr;
            if nr == libc::SYS_fsync || nr == libc::SYS_fdatasync {
                let Some(target) = Self::fd_target(s.pid, s.args[0]) else {
                    return;
                };
                if target == self.dir {
                    self.syncs += 1;
                    self.durable_ns = listing(&self.dir);
                    self.ns_log.clear();
                } else if target.parent() == Some(&self.dir) {
                    self.syncs += 1;
                    let p = format!("/proc/{}/fd/{}", s.pid, s.args[0]);
                    if let (Ok(m), Ok(b)) = (std::fs::metadata(&p), std::fs::read(&p)) {
                        self.latest.insert(m.ino(), b.clone());
                        self.durable.insert(m.ino(), b);
                    }
                }
            } else if nr == libc::SYS_msync {
                self.on_msync(s.pid, s.args[0], s.args[1]);
            } else if [
                libc::SYS_rename,
                libc::SYS_renameat,
                libc::SYS_renameat2,
                libc::SYS_unlink,
                libc::SYS_unlinkat,
                libc::SYS_link,
                libc::SYS_linkat,
                libc::SYS_creat,
            ]
            .contains(&nr)
                || ((nr == libc::SYS_openat && s.args[2] & libc::O_CREAT as u64 != 0)
                    || (nr == libc::SYS_open && s.args[1] & libc::O_CREAT as u64 != 0))
            {
                let l = listing(&self.dir);
                if self.ns_log.last().unwrap_or(&self.durable_ns) != &l {
                    self.refresh_latest();
                    self.ns_log.push(l);
                }
            }
        }

        fn on_msync(&mut self, pid: i32, addr: u64, len: u64) {
            let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
                return;
            };
            for line in maps.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 6 {
                    continue;
                }
                let (a, b) = f[0].split_once('-').unwrap();
                let (start, end) = (
                    u64::from_str_radix(a, 16).unwrap(),
                    u64::from_str_radix(b, 16).unwrap(),
                );
                if addr < start || addr >= end {
                    continue;
                }
                let off = u64::from_str_radix(f[2], 16).unwrap();
                let ino: u64 = f[4].parse().unwrap_or(0);
                let path = PathBuf::from(f[5..].join(" "));
                if path.parent() != Some(&self.dir) {
                    return;
                }
                self.syncs += 1;
                let Ok(cur) = std::fs::read(format!("/proc/{pid}/map_files/{}", f[0])) else {
                    return;
                };
                let from = (off + (addr - start)) as usize / PAGE * PAGE;
                let to = ((off + (addr - start) + len) as usize).div_ceil(PAGE) * PAGE;
                let d = self.durable.entry(ino).or_default();
                if d.len() < cur.len() {
                    d.resize(cur.len(), 0);
                }
                let to = to.min(cur.len());
                if from < to {
                    d[from..to].copy_from_slice(&cur[from..to]);
                }
                self.latest.insert(ino, cur);
                return;
            }
        }

        /// A disk image as power loss now could leave it, written to `to`.
        pub fn image(&self, rng: &mut Rng, to: &Path) {
            std::fs::create_dir_all(to).unwrap();
            let j = rng.below(self.ns_log.len() as u64 + 1) as usize;
            let names = if j == 0 {
                &self.durable_ns
            } else {
                &self.ns_log[j - 1]
            };
            let torn = rng.below(4) != 0;
            for (name, ino) in names {
                let empty = Vec::new();
                let old = self.durable.get(ino).unwrap_or(&empty);
                let new = self.latest.get(ino).unwrap_or(old);
                let len = if !torn || rng.below(2) == 0 {
                    old.len()
                } else {
                    new.len()
                };
                let mut out = vec![0u8; len];
                for p in 0..len.div_ceil(PAGE) {
                    let (a, b) = (p * PAGE, ((p + 1) * PAGE).min(len));
                    let src = if torn && old.get(a..b) != new.get(a..b) && rng.below(2) == 0 {
                        new
                    } else {
                        old
                    };
                    let have = src.len().min(b).saturating_sub(a);
                    if have > 0 {
                        out[a..a + have].copy_from_slice(&src[a..a + have]);
                    }
                }
                std::fs::write(to.join(name), out).unwrap();
            }
        }
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Lines the tracee writes to its stdout, gathered at write(1) entries.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn stdout_of(s: &tracer::Stop, text: &mut String) -> bool {
    if s.entry && s.nr == libc::SYS_write && s.args[0] == 1 {
        let b = tracer::read_mem(s.pid, s.args[1], s.args[2] as usize);
        text.push_str(&String::from_utf8_lossy(&b));
        return true;
    }
    false
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn writer_killed_at_random_syscalls() {
    let n = kills() * 2 / 3;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let mut rng = Rng(0x7777_1111_3333);
    let mut model = Model::default();
    let mut seq = 0;
    let mut tally = Tally::default();
    let mut salt = SaltCheck::default();
    let mut by_call: BTreeMap<String, u64> = BTreeMap::new();
    let start = Instant::now();
    for k in 0..n {
        let target = rng.below(600);
        let mut text = String::new();
        let mut ready = false;
        let mut count = 0u64;
        let mut last = 0i64;
        let end = tracer::run(
            {
                let mut c = writer_command(&dir, rng.next(), seq, Some(200));
                c.stdout(Stdio::null());
                c
            },
            Duration::from_secs(60),
            |s| {
                if stdout_of(s, &mut text) && text.contains("@@READY") {
                    ready = true;
                }
                if s.entry && ready {
                    count += 1;
                    if count >= target {
                        last = s.nr;
                        return tracer::Action::Kill;
                    }
                }
                tracer::Action::Go
            },
        );
        if end.killed {
            KILLS.fetch_add(1, Ordering::Relaxed);
            *by_call.entry(syscall_name(last)).or_default() += 1;
        }
        let log = parse_log(&text, seq);
        assert!(log.error.is_none(), "writer failed: {:?}", log.error);
        let (before, after, _) = models(&model, &log);
        model = check_crashed(
            &dir,
            &before,
            &after,
            &format!("syscall kill {k} at #{target}"),
            &mut tally,
        );
        seq = log.next_seq;
        if k % 10 == 9 {
            salt.add(&dir, t.path().join(format!("salt-{k}")));
        }
    }
    let salted = salt.run("syscall kills");
    eprintln!(
        "syscall kills: {n} runs, {} in flight ({} applied), {} with findings, {salted} read by Salt, \
         killed at {by_call:?}, {:.1} s",
        tally.in_flight,
        tally.in_flight_applied,
        tally.with_findings,
        start.elapsed().as_secs_f64()
    );
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn syscall_name(nr: i64) -> String {
    let names: &[(i64, &str)] = &[
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        (libc::SYS_pwrite64, "pwrite"),
        (libc::SYS_pread64, "pread"),
        (libc::SYS_openat, "openat"),
        (libc::SYS_close, "close"),
        (libc::SYS_fsync, "fsync"),
        (libc::SYS_fdatasync, "fdatasync"),
        (libc::SYS_msync, "msync"),
        (libc::SYS_rename, "rename"),
        (libc::SYS_renameat, "renameat"),
        (libc::SYS_renameat2, "renameat2"),
        (libc::SYS_unlink, "unlink"),
        (libc::SYS_unlinkat, "unlinkat"),
        (libc::SYS_flock, "flock"),
        (libc::SYS_mmap, "mmap"),
        (libc::SYS_munmap, "munmap"),
        (libc::SYS_statx, "statx"),
        (libc::SYS_newfstatat, "newfstatat"),
        (libc::SYS_fstat, "fstat"),
        (libc::SYS_ftruncate, "ftruncate"),
        (libc::SYS_fallocate, "fallocate"),
        (libc::SYS_getdents64, "getdents64"),
        (libc::SYS_fchmod, "fchmod"),
        (libc::SYS_fchown, "fchown"),
        (libc::SYS_madvise, "madvise"),
        (libc::SYS_clock_gettime, "clock_gettime"),
        (libc::SYS_futex, "futex"),
        (libc::SYS_sched_yield, "sched_yield"),
    ];
    names
        .iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("#{nr}"))
}

/// Power loss during a writer's run: images at random system calls. An
/// image whose only problem is a slot torn across two pages (see
/// `writer_power_loss_never_tears_a_slot`) is counted, not failed.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn writer_power_loss() {
    let torn = power_loss_runs((kills() / 50).max(2), 0x9999_aaaa_5555);
    eprintln!("power loss (writer): {torn} images with a slot torn across pages (known bug)");
}

/// Power loss can tear a slot that spans two pages: the status byte and id
/// from the new write, the offset, length and mtime from the old one (96-byte
/// slots straddle 4 KiB pages), so an inserted id reads as an empty value
/// (a denied key of zero bytes) or, in a reused slot, with the record of the
/// id that held the slot before.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn writer_power_loss_never_tears_a_slot() {
    let torn = power_loss_runs(8, 0x1357_2468);
    assert_eq!(torn, 0, "images with a torn slot");
}

/// Runs `runs` traced writers, checks power-loss images; returns how many
/// images failed only because of a slot torn across pages.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn power_loss_runs(runs: u64, seed: u64) -> u64 {
    let t = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let mut torn = 0u64;
    let mut tally = Tally::default();
    let mut salt = SaltCheck::default();
    let mut images = 0u64;
    let mut syncs = 0u64;
    let start = Instant::now();
    for run in 0..runs {
        let dir = t.path().join(format!("run-{run}"));
        std::fs::create_dir(&dir).unwrap();
        // A store with some history, durable before the run.
        let seed_log = {
            let store = Store::open_with(&dir, &opts()).unwrap();
            let mut m = Model::default();
            // Odd runs start from an empty directory (bank creation).
            for s in 0..(30 * (run % 2)) {
                let op = random_op(&mut rng, 1_000_000 + s, 1);
                apply(&store, &op).unwrap();
                m.apply(&op);
            }
            m
        };
        let mut disk = disk::Disk::new(&dir);
        let mut text = String::new();
        let mut ready = false;
        let mut captured: Vec<(PathBuf, String)> = Vec::new();
        let every = 12 + rng.below(10);
        let mut count = 0u64;
        tracer::run(
            {
                let mut c = writer_command(&dir, rng.next(), 0, Some(60));
                c.stdout(Stdio::null());
                c
            },
            Duration::from_secs(120),
            |s| {
                if stdout_of(s, &mut text) && text.contains("@@READY") {
                    ready = true;
                }
                if !s.entry {
                    disk.on_exit(s);
                } else if ready {
                    count += 1;
                    if count.is_multiple_of(every) {
                        disk.refresh_latest();
                        let img = t.path().join(format!("img-{run}-{count}"));
                        disk.image(&mut rng, &img);
                        captured.push((img, text.clone()));
                    }
                }
                tracer::Action::Go
            },
        );
        syncs += disk.syncs;
        for (img, text) in captured {
            let log = parse_log(&text, 0);
            assert!(log.error.is_none());
            let (before, after, _) = models(&seed_log, &log);
            match try_check_crashed(&img, &before, &after, &mut tally) {
                Ok(_) => {
                    if images.is_multiple_of(8) {
                        salt.add(&img, img.with_extension("salt"));
                    }
                }
                Err((Some(id), msg)) if id_in_straddling_slot(&img, &id) => {
                    eprintln!("power loss image {}: torn slot: {msg}", img.display());
                    torn += 1;
                }
                Err((_, msg)) => panic!("power loss image {}: {msg}", img.display()),
            }
            images += 1;
            std::fs::remove_dir_all(&img).unwrap();
        }
    }
    let salted = salt.run("power loss");
    eprintln!(
        "power loss (writer): {runs} runs, {syncs} syncs followed, {images} images, {} in flight \
         ({} applied), {} with findings (all repaired), {torn} torn slots, {salted} read by Salt, \
         {:.1} s",
        tally.in_flight,
        tally.in_flight_applied,
        tally.with_findings,
        start.elapsed().as_secs_f64()
    );
    assert!(images >= 40, "too few images: {images}");
    torn
}

// ---------------------------------------------------------------------------
// compact and migrate, killed at every step
// ---------------------------------------------------------------------------

/// A store with history: entries in both banks, overwrites, removals and
/// several heap segments.
fn history_store(dir: &Path, rng: &mut Rng) -> Value {
    std::fs::create_dir_all(dir).unwrap();
    let store = Store::open_with(dir, &opts()).unwrap();
    for s in 0..60 {
        let op = random_op(rng, 2_000_000 + s, 1);
        apply(&store, &op).unwrap();
    }
    drop(store);
    common::kc_dump(dir, &layout())
}

/// Runs `cmd` (made for a fresh copy of the template) once to count its
/// system calls, then kills it at each of (a sample of) them and checks the
/// store with `check(dir)`; also builds power-loss images from the counting
/// run. Returns (syscalls, kills, images).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn kill_everywhere(
    name: &str,
    template: &Path,
    work: &Path,
    max_kills: u64,
    make: &dyn Fn(&Path) -> Command,
    check: &mut dyn FnMut(&Path, &str),
) -> (u64, u64, u64) {
    let mut rng = Rng(0x4242 ^ name.len() as u64);
    // Counting run, with power-loss images.
    let dir = work.join("count");
    copy_tree(template, &dir);
    let store_dir = dir.join("store");
    let mut disk = disk::Disk::new(&store_dir);
    let mut imgs = Vec::new();
    let mut n = 0u64;
    let end = tracer::run(make(&dir), Duration::from_secs(120), |s| {
        if !s.entry {
            disk.on_exit(s);
        } else {
            n += 1;
            if n.is_multiple_of(3) && imgs.len() < 400 {
                disk.refresh_latest();
                let img = work.join(format!("img-{n}"));
                disk.image(&mut rng, &img.join("store"));
                imgs.push(img);
            }
        }
        tracer::Action::Go
    });
    assert_eq!(end.exit_code, Some(0), "{name} under the tracer");
    let total = end.syscalls;
    check(&store_dir, &format!("{name}: finished"));
    let images = imgs.len() as u64;
    for img in imgs {
        check(
            &img.join("store"),
            &format!("{name}: power-loss image {}", img.display()),
        );
        std::fs::remove_dir_all(&img).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
    // Kills.
    let points: Vec<u64> = if total <= max_kills {
        (1..=total).collect()
    } else {
        (0..max_kills)
            .map(|i| 1 + i * total / max_kills + rng.below(total / max_kills))
            .collect()
    };
    let mut kills = 0;
    for k in points {
        let dir = work.join(format!("kill-{k}"));
        copy_tree(template, &dir);
        let mut c = 0;
        let end = tracer::run(make(&dir), Duration::from_secs(120), |s| {
            if s.entry {
                c += 1;
                if c == k {
                    return tracer::Action::Kill;
                }
            }
            tracer::Action::Go
        });
        if end.killed {
            kills += 1;
            KILLS.fetch_add(1, Ordering::Relaxed);
        }
        check(
            &dir.join("store"),
            &format!("{name}: killed at syscall {k} of {total}"),
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    (total, kills, images)
}

fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

fn assert_clean(dir: &Path, ctx: &str) {
    let store = Store::open_with(dir, &opts()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let f = findings(&store);
    assert!(f.is_empty(), "{ctx}: {f:?}");
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn compact_killed_at_every_step() {
    let t = tempfile::tempdir().unwrap();
    let template = t.path().join("template");
    let want = history_store(&template.join("store"), &mut Rng(31337));
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let make = |d: &Path| {
        let mut c = kc_cmd();
        c.args(args_of(&d.join("store"), &["compact"]))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let mut salt = SaltCheck::default();
    let mut i = 0;
    let (total, kills, images) = kill_everywhere(
        "compact",
        &template,
        &work,
        kills(),
        &make,
        &mut |dir, ctx| {
            assert_eq!(
                common::kc_dump(dir, &layout()),
                want,
                "{ctx}: entries changed"
            );
            assert_clean(dir, ctx);
            i += 1;
            if i % 25 == 0 {
                salt.add(dir, t.path().join(format!("salt-{i}")));
            }
        },
    );
    let salted = salt.run("compact");
    eprintln!("compact: {total} syscalls, killed at {kills}, {images} power-loss images, {salted} read by Salt");
}

/// `keycache compact --to-size` killed between the two banks leaves them in
/// two sizes.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn compact_to_size_killed_at_every_step() {
    let t = tempfile::tempdir().unwrap();
    let template = t.path().join("template");
    let want = history_store(&template.join("store"), &mut Rng(4711));
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let make = |d: &Path| {
        let mut c = kc_cmd();
        c.args(args_of(&d.join("store"), &["compact", "--to-size", "211"]))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let (total, kills, images) = kill_everywhere(
        "compact --to-size",
        &template,
        &work,
        kills(),
        &make,
        &mut |dir, ctx| {
            let len = |n: &str| std::fs::metadata(dir.join(n)).map(|m| m.len()).unwrap_or(0);
            // The CLI, told no size, finishes a pending journal (which may
            // change the size) before it reads the size off the index.
            let l = layout();
            let mut a = vec!["verify".to_string(), dir.to_string_lossy().into_owned()];
            a.extend(l.args().into_iter().skip(2));
            let out = kc_cmd().args(&a).output().unwrap();
            assert!(
                out.status.success(),
                "{ctx}: keycache verify without --size: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let (k, d) = (len(".mmap_keys.idx"), len(".mmap_denied.idx"));
            assert_eq!(
                k, d,
                "{ctx}: the banks are in two sizes ({k} and {d} bytes)"
            );
            let size = k / 96;
            let l = Layout { size, ..layout() };
            let store = Store::open_with(
                dir,
                &l.options_with(keycache::table::DEFAULT_READ_RETRY, Duration::ZERO),
            )
            .unwrap();
            let f = verify::verify_store(&store).unwrap();
            assert!(f.is_empty(), "{ctx}: {f:?}");
            assert_eq!(common::kc_dump(dir, &l), want, "{ctx}: entries changed");
        },
    );
    eprintln!("compact --to-size: {total} syscalls, killed at {kills}, {images} images");
}

/// A localfs_key tree for the migration crash test.
fn make_tree(root: &Path, rng: &mut Rng) {
    for (i, d) in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ]
    .iter()
    .enumerate()
    {
        std::fs::create_dir_all(root.join(d)).unwrap();
        for n in 0..(6 + i * 2) {
            // Ids shared with the existing store's pool, and new ones.
            let id = if rng.below(2) == 0 {
                format!("m{:02}.crash.example", rng.below(40))
            } else {
                format!("tree-{i}-{n}")
            };
            std::fs::write(root.join(d).join(&id), pem(&format!("tree-{id}-{i}"), 300)).unwrap();
        }
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn migrate_killed_at_every_step() {
    let t = tempfile::tempdir().unwrap();
    let template = t.path().join("template");
    let mut rng = Rng(0xbeef);
    let before = history_store(&template.join("store"), &mut rng);
    make_tree(&template.join("pki"), &mut rng);
    let make = |d: &Path| {
        let mut c = kc_cmd();
        c.arg("migrate")
            .arg(d.join("pki"))
            .arg("--out")
            .arg(d.join("store"))
            .args(layout().args())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    // The new state, from an uninterrupted run.
    let full = t.path().join("full");
    copy_tree(&template, &full);
    assert!(make(&full).status().unwrap().success());
    let after = common::kc_dump(&full.join("store"), &layout());
    assert_ne!(before, after);
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let mut salt = SaltCheck::default();
    let (mut olds, mut news) = (0, 0);
    let mut i = 0;
    let (total, kills, images) = kill_everywhere(
        "migrate",
        &template,
        &work,
        kills(),
        &make,
        &mut |dir, ctx| {
            let got = common::kc_dump(dir, &layout());
            if got == before {
                olds += 1;
            } else if got == after {
                news += 1;
            } else {
                panic!("{ctx}: neither the previous state nor the new one: {got}");
            }
            assert_clean(dir, ctx);
            i += 1;
            if i % 25 == 0 {
                salt.add(dir, t.path().join(format!("salt-{i}")));
            }
        },
    );
    assert!(olds > 0 && news > 0, "{olds} old, {news} new");
    // Running it again after a kill finishes the job and leaves no temporaries.
    let dir = work.join("again");
    copy_tree(&template, &dir);
    let mut c = 0;
    tracer::run(make(&dir), Duration::from_secs(60), |s| {
        if s.entry {
            c += 1;
            if c == total * 3 / 4 {
                return tracer::Action::Kill;
            }
        }
        tracer::Action::Go
    });
    assert!(make(&dir).status().unwrap().success());
    assert_eq!(common::kc_dump(&dir.join("store"), &layout()), after);
    assert_eq!(temp_files(&dir.join("store")), Vec::<String>::new());
    let salted = salt.run("migrate");
    eprintln!(
        "migrate: {total} syscalls, killed at {kills} ({olds} old, {news} new states), \
         {images} power-loss images, {salted} read by Salt"
    );
}

/// A rebuild run as root and killed after its journal: the Salt master's
/// user (owner of the directory) finishes it on its next write.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn journal_left_by_root_is_finished_by_the_masters_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    if !is_root() {
        eprintln!("not root: journal ownership test skipped");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = t.path().join("store");
    let want = history_store(&dir, &mut Rng(99));
    let (uid, gid) = (65534u32, 65534u32);
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        std::os::unix::fs::lchown(e.path(), Some(uid), Some(gid)).unwrap();
    }
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    // Kill root's compaction at its first rename of a bank file.
    let mut renames = 0;
    let mut cmd = kc_cmd();
    cmd.args(args_of(&dir, &["compact"]));
    let end = tracer::run(cmd, Duration::from_secs(60), |s| {
        if s.entry && [libc::SYS_rename, libc::SYS_renameat, libc::SYS_renameat2].contains(&s.nr) {
            renames += 1;
            if renames == 2 {
                return tracer::Action::Kill;
            }
        }
        tracer::Action::Go
    });
    assert!(end.killed);
    let journal = dir.join(keycache::rebuild::JOURNAL);
    let m = std::fs::metadata(&journal).expect("the journal is left");
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (uid, gid, 0o600));
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            (uid, gid),
            "{} is not the master's",
            e.path().display()
        );
        assert!(
            m.mode() & 0o077 == 0,
            "{} mode {:o}",
            e.path().display(),
            m.mode()
        );
    }
    // The master's user writes: the journal is finished, then the write.
    let id = "m00.crash.example";
    let mut c = kc_cmd();
    c.args(args_of(&dir, &["delete", id])).uid(uid).gid(gid);
    let out = c.output().unwrap();
    let present = want["keys"].get(id).is_some() || want["denied_keys"].get(id).is_some();
    assert_eq!(
        out.status.code(),
        Some(if present { 0 } else { 1 }),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!journal.exists(), "the journal was finished");
    let mut want = want;
    want["keys"].as_object_mut().unwrap().remove(id);
    want["denied_keys"].as_object_mut().unwrap().remove(id);
    assert_eq!(common::kc_dump(&dir, &layout()), want);
    assert_clean(&dir, "after the master's user finished the journal");
}

/// A journal is found by file name in its own directory: a store moved (or
/// reached through another path) after a crash still rolls forward, and a
/// journal naming files elsewhere is refused.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn journal_of_a_moved_store_rolls_forward_and_never_reaches_outside() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("a/store");
    let want = history_store(&dir, &mut Rng(7));
    let mut renames = 0;
    let mut cmd = kc_cmd();
    // A relative path, as an operator would type it.
    cmd.current_dir(t.path().join("a"))
        .arg("compact")
        .arg("store")
        .args(layout().args());
    let end = tracer::run(cmd, Duration::from_secs(60), |s| {
        if s.entry && [libc::SYS_rename, libc::SYS_renameat, libc::SYS_renameat2].contains(&s.nr) {
            renames += 1;
            if renames == 3 {
                return tracer::Action::Kill;
            }
        }
        tracer::Action::Go
    });
    assert!(end.killed);
    let moved = t.path().join("b");
    std::fs::rename(t.path().join("a"), &moved).unwrap();
    let moved = moved.join("store");
    assert!(moved.join(keycache::rebuild::JOURNAL).exists());
    assert_eq!(common::kc_dump(&moved, &layout()), want);
    assert!(!moved.join(keycache::rebuild::JOURNAL).exists());
    assert_clean(&moved, "moved store");
    // A hostile journal: renames and removals outside the directory.
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::write(
        moved.join(keycache::rebuild::JOURNAL),
        format!(
            "rename\t{0}\t{1}/x\nremove\t{0}\nend\n",
            victim.display(),
            t.path().display()
        ),
    )
    .unwrap();
    let r = Store::open_with(&moved, &opts());
    let e = r.expect_err("a hostile journal is refused");
    assert!(e.to_string().contains("journal"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let out = kc(&moved, &["list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to act on this journal"));
}
