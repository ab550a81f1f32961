//! The crash tests' shared pieces: the child writer's random operations
//! and the model they are checked against, the writer's log, the checks
//! run on a store after a kill or a power loss, the copies of stores read
//! by the real Salt at the end of a test, and the kill-at-every-step
//! driver of the CLI's rebuilds.
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
/// after each. The body of the CLI test binary's `#[ignore]`d
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

// ---------------------------------------------------------------------------
// Checking a crashed store
// ---------------------------------------------------------------------------

/// What a crash between writing the index and the roster may leave: header
/// counters and roster entries out of step with the slots.
pub fn legit_after_crash(f: &Finding) -> bool {
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

/// `verify`'s findings on a store.
pub fn findings(store: &Store) -> Vec<Finding> {
    verify::verify_store(store).unwrap()
}

/// The model as a store lists it.
pub fn listing(store: &Store) -> Model {
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
pub struct Tally {
    /// Stores checked.
    pub checked: u64,
    /// With an op in flight.
    pub in_flight: u64,
    /// With the op in flight (partly) applied.
    pub in_flight_applied: u64,
    /// With `verify` findings.
    pub with_findings: u64,
    /// Mended: by the next writer to open the banks after a kill, by
    /// `keycache verify --repair` after a power loss.
    pub repaired: u64,
}

/// A failed check: the id concerned, when one is, and what is wrong.
pub type Problem = (Option<String>, String);

/// Reads every id of the pool; a failed read is a problem for that id.
pub fn read_model(store: &Store) -> Result<Model, Problem> {
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

/// `got`, the value of `bank[id]` after a crash, is the acknowledged one
/// (`before`) or the one in flight (`after`); else what is wrong.
fn one_of<V: PartialEq + std::fmt::Debug>(
    bank: &str,
    id: &str,
    got: Option<&V>,
    before: Option<&V>,
    after: Option<&V>,
) -> Result<(), String> {
    if got == before || got == after {
        Ok(())
    } else {
        Err(format!(
            "{bank}[{id}] is {got:?}; acknowledged {before:?}, in flight {after:?}"
        ))
    }
}

/// How the writer of a checked store stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// Killed (SIGKILL): every store it made to the mapping and every
    /// write(2) it finished reached the files. The next writer to open a
    /// bank mends what the kill left between the slots, the roster and the
    /// header's counters, as Salt's writers do on open: no `verify
    /// --repair` needed.
    Killed,
    /// Power lost: only what was synced is certain. `keycache verify
    /// --repair` mends the roster and the counters.
    PowerLoss,
}

/// Opens every bank of the store in `dir` that exists as the next writer
/// would (an empty transaction), which mends the roster and the counters
/// when they are out of step with the slots.
fn open_writers(dir: &Path) -> Result<(), Problem> {
    let store = Store::open_with(dir, &opts()).map_err(|e| (None, format!("reopen: {e}")))?;
    for t in [store.keys_table(), store.denied_table()] {
        if t.path().exists() {
            t.transaction(|_| Ok(())).map_err(|e| {
                (
                    None,
                    format!("open {} for writing: {e}", t.path().display()),
                )
            })?;
        }
    }
    Ok(())
}

/// Checks a store after a crash: every id holds its value before or after
/// the op in flight; findings are only what a crash between index and
/// roster leaves, and the next writer ([`Crash::Killed`]) or `keycache
/// verify --repair` ([`Crash::PowerLoss`]) mends them. Returns what the
/// store holds.
pub fn try_check_crashed(
    kc: &Cli,
    dir: &Path,
    before: &Model,
    after: &Model,
    tally: &mut Tally,
    crash: Crash,
) -> Result<Model, Problem> {
    let store = Store::open_with(dir, &opts()).map_err(|e| (None, format!("reopen: {e}")))?;
    let got = read_model(&store)?;
    for id in ids() {
        let [g, b, a] = [&got, before, after].map(|m| m.keys.get(&id));
        one_of("keys", &id, g, b, a).map_err(|e| (Some(id.clone()), e))?;
        let [g, b, a] = [&got, before, after].map(|m| m.denied.get(&id));
        one_of("denied", &id, g, b, a).map_err(|e| (Some(id.clone()), e))?;
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
        if crash == Crash::Killed {
            open_writers(dir)?;
            let store = Store::open_with(dir, &opts()).unwrap();
            let left = findings(&store);
            if !left.is_empty() {
                return Err((
                    None,
                    format!("the next writer to open the banks left findings: {left:?}"),
                ));
            }
            if Model::read(&store) != got || listing(&store) != got {
                return Err((None, "the next writer changed what the store holds".into()));
            }
            tally.repaired += 1;
            return Ok(got);
        }
        // The banks: a crashed store here has no key tree.
        let out = kc.run(dir, &["verify", "--repair", "--json", "--tree", "never"]);
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

/// [`try_check_crashed`] of a store whose writer was killed
/// ([`Crash::Killed`]), panicking with `ctx` and the problem.
pub fn check_crashed(
    kc: &Cli,
    dir: &Path,
    before: &Model,
    after: &Model,
    ctx: &str,
    tally: &mut Tally,
) -> Model {
    try_check_crashed(kc, dir, before, after, tally, Crash::Killed)
        .unwrap_or_else(|(_, msg)| panic!("{ctx}: {msg}"))
}

/// Copies the regular files of `from` into `to`.
pub fn copy_dir(from: &Path, to: &Path) {
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
pub struct SaltCheck {
    dirs: Vec<PathBuf>,
    want: Vec<Value>,
}

impl SaltCheck {
    /// Copies `dir` to `to` and notes what keycache reads there.
    pub fn add(&mut self, dir: &Path, to: PathBuf) {
        copy_dir(dir, &to);
        self.want.push(common::kc_dump(&to, &layout()));
        self.dirs.push(to);
    }

    /// Salt reads every copy: no error, no log line, the same entries as
    /// keycache. Returns how many copies.
    pub fn run(self, ctx: &str) -> usize {
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

/// What rebuilds leave behind in `dir`: temporaries and journals.
pub fn temp_files(dir: &Path) -> Vec<String> {
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

/// Lines the tracee writes to its stdout, gathered at write(1) entries.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn stdout_of(s: &tracer::Stop, text: &mut String) -> bool {
    if s.entry && s.nr == libc::SYS_write && s.args[0] == 1 {
        let b = tracer::read_mem(s.pid, s.args[1], s.args[2] as usize);
        text.push_str(&String::from_utf8_lossy(&b));
        return true;
    }
    false
}

// ---------------------------------------------------------------------------
// Stores with history, and the CLI killed at every step
// ---------------------------------------------------------------------------

/// A store with history: entries in both banks, overwrites, removals and
/// several heap segments.
pub fn history_store(dir: &Path, rng: &mut Rng) -> Value {
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
pub fn kill_everywhere(
    name: &str,
    template: &Path,
    work: &Path,
    max_kills: u64,
    make: &dyn Fn(&Path) -> Command,
    check: &mut dyn FnMut(&Path, &str),
) -> (u64, u64, u64) {
    let mut rng = Rng::new(0x4242 ^ name.len() as u64);
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
        let end = tracer::kill_at(make(&dir), Duration::from_secs(120), k, |_| true);
        if end.killed {
            kills += 1;
        }
        check(
            &dir.join("store"),
            &format!("{name}: killed at syscall {k} of {total}"),
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    (total, kills, images)
}

/// `cp -a from to`.
pub fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Panics with `ctx` unless `verify` finds nothing in the store at `dir`.
pub fn assert_clean(dir: &Path, ctx: &str) {
    let store = Store::open_with(dir, &opts()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let f = findings(&store);
    assert!(f.is_empty(), "{ctx}: {f:?}");
}
