//! Side-by-side performance comparison of keycache against the alternatives:
//! an in-memory `HashMap` (std and hashbrown), LMDB through heed, and Salt
//! 3008.5's own Python `mmap_key` (through `tests/py/salt_driver.py`). One
//! more in-memory contender, hashbrown that also copies each value out and
//! checks its xxh3, measures what those two duties of a reader of shared
//! memory cost on their own.
//!
//! Run it through `tools/bench-compare.sh` (which builds everything, sets up
//! the Salt venv and draws the chart); directly:
//!
//! ```text
//! cargo build --release --bin keycache --example compare
//! target/release/examples/compare run [--sizes 10000,100000,1000000] [--rounds 5]
//!     [--seconds 0.5] [--salt-seconds 1] [--python PY] [--only SECTIONS]
//!     [--contenders salt,lmdb,maps] [--migrate-sizes 10000,100000]
//!     [--salt-migrate-max N] [--data DIR] [--json FILE]
//! ```
//!
//! Sections (`--only`): lookup, list, migrate, open, write, callgrind.
//! Salt's migration (one locked, fsynced insert per key: 6-13 ms a key) is
//! run on trees of at most `--salt-migrate-max` minions (default 10000);
//! for larger trees its time is extrapolated from its time per key on the
//! largest tree it ran, and the report says so.
//! Everything it needs is generated under `--data` (default
//! `target/bench-data`) on the first run and reused afterwards: realistic
//! `localfs_key` trees from `tools/gen-pki-tree.py`, stores migrated from
//! them with `keycache migrate`, LMDB environments with the same entries.
//! Contenders are measured interleaved, round after round; the tables give
//! medians over the rounds.
//!
//! Internal subcommands (run as child processes): `noop`, `open-first`,
//! `rss`, `callgrind-loop`.

#[path = "../benches/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use common::*;
use keycache::{KeyBatch, KeyState, MinionId, Reader, Store};
use serde_json::{json, Value as Json};

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

/// Side-by-side performance comparison of keycache against in-memory
/// HashMaps (std, hashbrown), LMDB through heed and Salt 3008.5's own
/// Python `mmap_key`.
///
/// Prints a Markdown report of medians and ratios; see
/// tools/bench-compare.sh. Without a subcommand it runs `run`.
#[derive(Debug, Parser)]
#[command(name = "compare", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The comparison (the default).
    Run(RunArgs),
    /// Internal: does nothing (the start-up time of a child process).
    Noop,
    /// Internal: opens a store and looks up one id; prints the times as JSON.
    OpenFirst(OpenFirstArgs),
    /// Internal: the resident memory of a contender after 10,000 lookups.
    Rss(LookupArgs),
    /// Internal: a loop of lookups for callgrind to count.
    CallgrindLoop(CallgrindArgs),
}

/// A count: digits, `_` allowed as a separator (`1_000_000`).
fn count(s: &str) -> Result<u64, String> {
    s.replace('_', "")
        .parse()
        .map_err(|e| format!("{s:?}: {e}"))
}

#[derive(Debug, Clone, clap::Args)]
struct RunArgs {
    /// Store sizes (minions).
    #[arg(long, value_delimiter = ',', value_parser = count, default_value = "10000,100000,1000000")]
    sizes: Vec<u64>,
    /// Rounds; the tables give medians over them.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per Rust measurement.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Seconds per Salt measurement.
    #[arg(long, default_value_t = 1.0)]
    salt_seconds: f64,
    /// The Salt venv's python (tools/setup-venv.sh); needed for the Salt
    /// contender.
    #[arg(long, value_name = "SALT_VENV_PYTHON")]
    python: Option<PathBuf>,
    /// Sections: lookup, list, migrate, open, write, callgrind.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lookup,list,migrate,open,write,callgrind"
    )]
    only: Vec<String>,
    /// Contenders: salt, lmdb, maps.
    #[arg(long, value_delimiter = ',', default_value = "salt,lmdb,maps")]
    contenders: Vec<String>,
    /// Tree sizes of the migration section.
    #[arg(long, value_delimiter = ',', value_parser = count, default_value = "10000,100000")]
    migrate_sizes: Vec<u64>,
    /// Largest tree Salt migrates (larger ones are extrapolated).
    #[arg(long, value_parser = count, default_value = "10000")]
    salt_migrate_max: u64,
    /// Where trees, stores and LMDB environments are kept [default:
    /// target/bench-data].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// The keycache binary [default: target/release/keycache].
    #[arg(long, value_name = "BIN")]
    keycache: Option<PathBuf>,
    /// Where to write the raw samples [default: DATA/results.json].
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// The store a child process opens.
#[derive(Debug, Clone, clap::Args)]
struct StoreArgs {
    /// The store directory.
    #[arg(long)]
    store: PathBuf,
    /// Its table size.
    #[arg(long, default_value_t = 1_000_000)]
    size: u64,
}

#[derive(Debug, Clone, clap::Args)]
struct OpenFirstArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The id to look up.
    #[arg(long)]
    id: String,
}

#[derive(Debug, Clone, clap::Args)]
struct LookupArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// A file of ids, one a line.
    #[arg(long)]
    ids: PathBuf,
    /// Who looks them up.
    #[arg(long, default_value = "keycache")]
    contender: String,
    /// The LMDB environment (contender lmdb).
    #[arg(long)]
    lmdb: Option<PathBuf>,
}

impl LookupArgs {
    fn lmdb(&self) -> &Path {
        self.lmdb
            .as_deref()
            .unwrap_or_else(|| die("contender lmdb needs --lmdb"))
    }
}

#[derive(Debug, Clone, clap::Args)]
struct CallgrindArgs {
    #[command(flatten)]
    lookup: LookupArgs,
    /// Lookups to count.
    #[arg(long, default_value_t = 20_000)]
    lookups: usize,
}

fn die(msg: &str) -> ! {
    eprintln!("compare: error: {msg}");
    std::process::exit(2)
}

fn log(msg: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?");
    eprintln!("[{} load {load}] {msg}", chrono_now());
}

fn chrono_now() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!("{:02}:{:02}:{:02}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn size_label(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn fmt_rate(r: f64) -> String {
    if !r.is_finite() {
        "—".into()
    } else if r >= 1e6 {
        format!("{:.2} M/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k/s", r / 1e3)
    } else {
        format!("{r:.0} /s")
    }
}

fn fmt_secs(s: f64) -> String {
    if !s.is_finite() {
        "—".into()
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.1} µs", s * 1e6)
    } else {
        format!("{:.0} ns", s * 1e9)
    }
}

fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        "—".into()
    } else if r >= 100.0 {
        format!("{r:.0}x")
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else {
        format!("{r:.2}x")
    }
}

// ---------------------------------------------------------------------------
// Data: trees, stores, id lists, LMDB environments
// ---------------------------------------------------------------------------

struct Data {
    dir: PathBuf,
    keycache: PathBuf,
}

struct Prepared {
    n: u64,
    size: u64,
    tree: PathBuf,
    store: PathBuf,
    hits_file: PathBuf,
    misses_file: PathBuf,
    sample_file: PathBuf,
}

impl Data {
    fn tree(&self, n: u64) -> PathBuf {
        let tree = self.dir.join(format!("tree-{n}"));
        let summary = self.dir.join(format!("tree-{n}.json"));
        if !summary.exists() {
            let _ = std::fs::remove_dir_all(&tree);
            log(&format!(
                "generating a tree of {n} minions (tools/gen-pki-tree.py)"
            ));
            let out = Command::new("python3")
                .arg(repo().join("tools/gen-pki-tree.py"))
                .arg(&tree)
                .args(["--minions", &n.to_string()])
                .stderr(Stdio::inherit())
                .output()
                .expect("run tools/gen-pki-tree.py");
            if !out.status.success() {
                die("tools/gen-pki-tree.py failed");
            }
            std::fs::write(&summary, &out.stdout).unwrap();
        }
        tree
    }

    fn prepare(&self, n: u64) -> Prepared {
        let tree = self.tree(n);
        let size = table_size_for(n);
        let store = self.dir.join(format!("store-{n}"));
        let done = store.join(".compare-complete");
        if !done.exists() {
            let _ = std::fs::remove_dir_all(&store);
            std::fs::create_dir_all(&store).unwrap();
            log(&format!("migrating tree-{n} into store-{n} (size {size})"));
            let st = Command::new(&self.keycache)
                .arg("migrate")
                .arg(&tree)
                .arg("--out")
                .arg(&store)
                .args(["--size", &size.to_string()])
                .stdout(Stdio::null())
                .status()
                .expect("run keycache migrate");
            if !st.success() {
                die("keycache migrate failed");
            }
            std::fs::write(&done, b"").unwrap();
        }
        let hits_file = self.dir.join(format!("ids-{n}-hit.txt"));
        let misses_file = self.dir.join(format!("ids-{n}-miss.txt"));
        let sample_file = self.dir.join(format!("ids-{n}-sample10k.txt"));
        if !sample_file.exists() {
            let s = Store::open_with(&store, &open_options(size)).unwrap();
            let mut hits: Vec<String> = s.keys(None).unwrap().map(|r| r.unwrap().0).collect();
            let mut rng = Rng::new(n);
            rng.shuffle(&mut hits);
            // Absent ids of the same shape: numbers past the tree's.
            let mut misses: Vec<String> = (0..hits.len() as u64)
                .map(|k| minion_id(n + 1 + k))
                .collect();
            rng.shuffle(&mut misses);
            std::fs::write(&hits_file, hits.join("\n") + "\n").unwrap();
            std::fs::write(&misses_file, misses.join("\n") + "\n").unwrap();
            let sample: Vec<&str> = hits.iter().take(10_000).map(String::as_str).collect();
            std::fs::write(&sample_file, sample.join("\n") + "\n").unwrap();
        }
        Prepared {
            n,
            size,
            tree,
            store,
            hits_file,
            misses_file,
            sample_file,
        }
    }

    fn lmdb(&self, p: &Prepared, entries: &[(String, u8, Vec<u8>)]) -> PathBuf {
        let dir = self.dir.join(format!("lmdb-{}", p.n));
        let done = self.dir.join(format!("lmdb-{}.complete", p.n));
        if !done.exists() {
            let _ = std::fs::remove_dir_all(&dir);
            log(&format!(
                "building the LMDB environment for {} minions",
                p.n
            ));
            let (env, _) = build_lmdb(&dir, entries);
            env.prepare_for_closing().wait();
            std::fs::write(&done, b"").unwrap();
        }
        dir
    }
}

fn read_ids(path: &Path) -> Vec<MinionId> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| MinionId::new(l).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------
// Measuring
// ---------------------------------------------------------------------------

/// Runs `threads` threads for `seconds`; thread `t` calls `f(i)` on units
/// i = start_t, start_t+1, ... (wrapping at `units`, thread starts spread
/// evenly), each unit being `per_unit` lookups. Returns lookups per second,
/// all threads together.
fn measure<M, F>(threads: usize, seconds: f64, units: usize, per_unit: usize, make: M) -> f64
where
    M: Fn() -> F + Sync,
    F: FnMut(usize) -> u64,
{
    let dur = Duration::from_secs_f64(seconds);
    let barrier = Barrier::new(threads);
    let rates: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (make, barrier) = (&make, &barrier);
                s.spawn(move || {
                    pin_to_cpu(t);
                    let mut f = make();
                    let mut i = t * units / threads;
                    let (mut n, mut sum) = (0u64, 0u64);
                    barrier.wait();
                    let t0 = Instant::now();
                    loop {
                        for _ in 0..32 {
                            sum = sum.wrapping_add(f(i));
                            i += 1;
                            if i == units {
                                i = 0;
                            }
                        }
                        n += 32;
                        if t0.elapsed() >= dur {
                            break;
                        }
                    }
                    black_box(sum);
                    (n * per_unit as u64) as f64 / t0.elapsed().as_secs_f64()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    rates.iter().sum()
}

/// Pins the calling thread to CPU `cpu` (modulo the CPUs there are): on a
/// small VM an unpinned lone thread gets moved between vCPUs and measures
/// slower than it is.
fn pin_to_cpu(cpu: usize) {
    keycache_testkit::sys::pin_to_cpu(cpu);
}

#[inline]
fn kc_get(store: &Store, id: &MinionId) -> u64 {
    match store.get(id).expect("keycache get") {
        Some(e) => touch(e.state.byte(), &e.public_key),
        None => 0,
    }
}

#[inline]
fn kc_get_in(store: &Store, id: &MinionId, buf: &mut Vec<u8>) -> u64 {
    match store.get_in(id, buf).expect("keycache get_in") {
        Some(e) => touch(e.state.byte(), e.public_key),
        None => 0,
    }
}

#[inline]
fn kc_reader_get_in(r: &mut Reader<'_>, id: &MinionId, buf: &mut Vec<u8>) -> u64 {
    match r.get_in(id, buf).expect("keycache Reader::get_in") {
        Some(e) => touch(e.state.byte(), e.public_key),
        None => 0,
    }
}

#[inline]
fn kc_get_many_in(store: &Store, ids: &[MinionId], batch: &mut KeyBatch) -> u64 {
    store.get_many_in(ids, batch).expect("keycache get_many_in");
    batch
        .iter()
        .flatten()
        .map(|e| touch(e.state.byte(), e.public_key))
        .fold(0u64, u64::wrapping_add)
}

#[inline]
fn kc_get_many(store: &Store, ids: &[MinionId]) -> u64 {
    store
        .get_many(ids)
        .expect("keycache get_many")
        .iter()
        .flatten()
        .map(|e| touch(e.state.byte(), &e.public_key))
        .fold(0u64, u64::wrapping_add)
}

type Lmdb = (
    heed::Env,
    heed::Database<heed::types::Str, heed::types::Bytes>,
);

#[inline]
fn lmdb_get(db: &Lmdb, txn: &heed::RoTxn, id: &MinionId) -> u64 {
    match db.1.get(txn, id.as_str()).expect("lmdb get") {
        Some(v) => touch(v[0], &v[1..]),
        None => 0,
    }
}

/// Samples: contender -> measurement key -> values.
#[derive(Default)]
struct Samples(BTreeMap<String, BTreeMap<String, Vec<f64>>>);

impl Samples {
    fn add(&mut self, contender: &str, key: &str, v: f64) {
        self.0
            .entry(contender.to_string())
            .or_default()
            .entry(key.to_string())
            .or_default()
            .push(v);
    }
    fn med(&self, contender: &str, key: &str) -> f64 {
        self.0
            .get(contender)
            .and_then(|m| m.get(key))
            .map_or(f64::NAN, |v| median(v))
    }
    fn to_json(&self) -> Json {
        let mut o = serde_json::Map::new();
        for (c, m) in &self.0 {
            let mut inner = serde_json::Map::new();
            for (k, v) in m {
                inner.insert(k.clone(), json!({"median": median(v), "samples": v}));
            }
            o.insert(c.clone(), Json::Object(inner));
        }
        Json::Object(o)
    }
}

const KC: &str = "keycache get";
const KC_MANY: &str = "keycache get_many(64)";
const KC_IN: &str = "keycache get_in (reused buffer)";
const KC_MANY_IN: &str = "keycache get_many_in(64) (reused batch)";
const KC_READER: &str = "keycache Reader::get_in (handle per thread)";
const STD: &str = "std HashMap (in memory)";
const HB: &str = "hashbrown HashMap (in memory)";
const HB_CHECKED: &str = "hashbrown + copy-out and xxh3 check (in memory)";
const LMDB_TXN: &str = "LMDB/heed, txn per lookup";
const LMDB_SHARED: &str = "LMDB/heed, one txn per thread";
const SALT: &str = "Salt 3008.5 mmap_key.fetch";

struct Cfg {
    rounds: usize,
    seconds: f64,
    salt_seconds: f64,
    python: Option<PathBuf>,
    salt: bool,
    lmdb: bool,
    maps: bool,
}

fn salt_driver() -> PathBuf {
    repo().join("crates/keycache-testkit/py/salt_driver.py")
}

fn salt_cmd(cfg: &Cfg, store: &Path, size: u64) -> Command {
    let mut c = Command::new(cfg.python.as_ref().expect("python"));
    c.arg(salt_driver())
        .arg("--dir")
        .arg(store)
        .args(["--size", &size.to_string()]);
    c.stderr(Stdio::inherit());
    c
}

fn run_json(mut c: Command) -> Json {
    let out = c.stdout(Stdio::piped()).output().expect("spawn");
    if !out.status.success() {
        die(&format!(
            "{c:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| die(&format!("{c:?}: bad JSON: {e}")))
}

/// Salt's fetch-bench in `procs` processes at once: lookups per second, all
/// together.
fn salt_fetch(cfg: &Cfg, p: &Prepared, ids: &Path, procs: usize) -> f64 {
    let children: Vec<_> = (0..procs)
        .map(|k| {
            let mut c = salt_cmd(cfg, &p.store, p.size);
            c.args(["fetch-bench", "--ids-file"])
                .arg(ids)
                .args(["--seconds", &cfg.salt_seconds.to_string()])
                .args(["--seed", &(12345 + k).to_string()])
                .stdout(Stdio::piped());
            c.spawn().expect("spawn salt driver")
        })
        .collect();
    let mut total = 0.0;
    for ch in children {
        let out = ch.wait_with_output().unwrap();
        if !out.status.success() {
            die("salt fetch-bench failed");
        }
        let j: Json = serde_json::from_slice(&out.stdout).unwrap();
        total += j["lookups"].as_f64().unwrap() / j["seconds"].as_f64().unwrap();
    }
    total
}

// ---------------------------------------------------------------------------
// Section: lookups
// ---------------------------------------------------------------------------

fn section_lookup(cfg: &Cfg, data: &Data, p: &Prepared) -> Samples {
    let mut s = Samples::default();
    let store = Store::open_with(&p.store, &open_options(p.size)).unwrap();
    let hits = read_ids(&p.hits_file);
    let misses = read_ids(&p.misses_file);
    let batches: Vec<&[MinionId]> = hits.chunks_exact(64).collect();
    let need_entries = cfg.maps || cfg.lmdb;
    let entries = if need_entries {
        entries_of(&store)
    } else {
        Vec::new()
    };
    let std_m = cfg.maps.then(|| std_map(&entries));
    let hb_m = cfg.maps.then(|| hashbrown_map(&entries));
    let hbc_m = cfg.maps.then(|| checked_map(&entries));
    let lmdb: Option<Lmdb> = cfg.lmdb.then(|| open_lmdb(&data.lmdb(p, &entries)));
    drop(entries);
    // Warm-up: every entry once, through keycache and LMDB (page cache and
    // page tables), then one pass of every kind.
    let mut warm = 0u64;
    for id in &hits {
        warm = warm.wrapping_add(kc_get(&store, id));
    }
    if let Some(db) = &lmdb {
        let t = db.0.read_txn().unwrap();
        for id in &hits {
            warm = warm.wrapping_add(lmdb_get(db, &t, id));
        }
    }
    // The checked contender hands back what plain hashbrown does (every
    // checksum holds), so it measures the checks and not an early return.
    if let (Some(h), Some(c)) = (&hb_m, &hbc_m) {
        let mut buf = Vec::new();
        for id in &hits {
            let plain = hashbrown_get(h, id.as_str());
            assert_eq!(checked_get(c, id.as_str(), &mut buf), plain, "{id}");
            warm = warm.wrapping_add(plain);
        }
    }
    black_box(warm);
    let (nh, nm, nb) = (hits.len(), misses.len(), batches.len());
    log(&format!(
        "lookups at {}: {} keys, {} absent ids",
        size_label(p.n),
        nh,
        nm
    ));
    let sec = cfg.seconds;
    for round in 0..cfg.rounds {
        for threads in [1usize, 2] {
            let k = |kind: &str| format!("{kind}/{threads}t");
            for (kind, ids, n) in [("hit", &hits, nh), ("miss", &misses, nm)] {
                let r = measure(threads, sec, n, 1, || |i| kc_get(&store, &ids[i]));
                s.add(KC, &k(kind), r);
                if kind == "hit" {
                    let r = measure(threads, sec, nb, 64, || |i| kc_get_many(&store, batches[i]));
                    s.add(KC_MANY, &k(kind), r);
                }
                let r = measure(threads, sec, n, 1, || {
                    let (store, mut buf) = (&store, Vec::new());
                    move |i| kc_get_in(store, &ids[i], &mut buf)
                });
                s.add(KC_IN, &k(kind), r);
                let r = measure(threads, sec, n, 1, || {
                    let (mut reader, mut buf) = (store.reader(), Vec::new());
                    move |i| kc_reader_get_in(&mut reader, &ids[i], &mut buf)
                });
                s.add(KC_READER, &k(kind), r);
                if kind == "hit" {
                    let r = measure(threads, sec, nb, 64, || {
                        let (store, batches, mut batch) = (&store, &batches, KeyBatch::new());
                        move |i| kc_get_many_in(store, batches[i], &mut batch)
                    });
                    s.add(KC_MANY_IN, &k(kind), r);
                }
                if let (Some(m), Some(h)) = (&std_m, &hb_m) {
                    let r = measure(threads, sec, n, 1, || {
                        |i| match m.get(ids[i].as_str()) {
                            Some((st, key)) => touch(*st, key),
                            None => 0,
                        }
                    });
                    s.add(STD, &k(kind), r);
                    let r = measure(threads, sec, n, 1, || |i| hashbrown_get(h, ids[i].as_str()));
                    s.add(HB, &k(kind), r);
                }
                if let Some(m) = &hbc_m {
                    let r = measure(threads, sec, n, 1, || {
                        let mut buf = Vec::new();
                        move |i| checked_get(m, ids[i].as_str(), &mut buf)
                    });
                    s.add(HB_CHECKED, &k(kind), r);
                }
                if let Some(db) = &lmdb {
                    let r = measure(threads, sec, n, 1, || {
                        |i| {
                            let t = db.0.read_txn().unwrap();
                            lmdb_get(db, &t, &ids[i])
                        }
                    });
                    s.add(LMDB_TXN, &k(kind), r);
                    let r = measure(threads, sec, n, 1, || {
                        let t = db.0.read_txn().unwrap();
                        move |i| lmdb_get(db, &t, &ids[i])
                    });
                    s.add(LMDB_SHARED, &k(kind), r);
                }
                if cfg.salt {
                    let f = if kind == "hit" {
                        &p.hits_file
                    } else {
                        &p.misses_file
                    };
                    s.add(SALT, &k(kind), salt_fetch(cfg, p, f, threads));
                }
            }
        }
        log(&format!(
            "  round {}/{}: keycache hit {} (1t), {} (2t), get_many {}",
            round + 1,
            cfg.rounds,
            fmt_rate(s.0[KC]["hit/1t"][round]),
            fmt_rate(s.0[KC]["hit/2t"][round]),
            fmt_rate(s.0[KC_MANY]["hit/1t"][round]),
        ));
    }
    s
}

// ---------------------------------------------------------------------------
// Section: listing
// ---------------------------------------------------------------------------

const TREE_STATE_DIRS: [(&str, u8); 3] =
    [("minions", 1), ("minions_pre", 2), ("minions_rejected", 3)];

fn walk_ids(tree: &Path) -> Vec<(String, u8)> {
    let mut out = Vec::new();
    for (d, s) in TREE_STATE_DIRS {
        for e in std::fs::read_dir(tree.join(d)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                out.push((e.file_name().into_string().unwrap(), s));
            }
        }
    }
    out
}

fn walk_keys(tree: &Path) -> Vec<(String, u8, Vec<u8>)> {
    let mut out = Vec::new();
    for (d, s) in TREE_STATE_DIRS {
        for e in std::fs::read_dir(tree.join(d)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                let key = std::fs::read(e.path()).unwrap();
                out.push((e.file_name().into_string().unwrap(), s, key));
            }
        }
    }
    out
}

const L_KC: &str = "keycache Store::keys";
const L_TREE: &str = "localfs_key tree walk (Rust, 1 thread)";
const L_SALT: &str = "Salt 3008.5 mmap_key.list_all";

fn section_list(cfg: &Cfg, p: &Prepared) -> Samples {
    let mut s = Samples::default();
    let store = Store::open_with(&p.store, &open_options(p.size)).unwrap();
    log(&format!("listing at {}", size_label(p.n)));
    let count = store.keys(None).unwrap().count();
    for round in 0..cfg.rounds {
        let t0 = Instant::now();
        let v: Vec<(String, KeyState)> = store
            .keys(None)
            .unwrap()
            .map(|r| {
                let (id, e) = r.unwrap();
                (id, e.state)
            })
            .collect();
        s.add(L_KC, "ids", t0.elapsed().as_secs_f64());
        assert_eq!(v.len(), count);
        drop(black_box(v));
        let t0 = Instant::now();
        let v: Vec<(String, keycache::KeyEntry)> =
            store.keys(None).unwrap().map(|r| r.unwrap()).collect();
        let sum = v.iter().fold(0u64, |a, (_, e)| {
            a.wrapping_add(touch(e.state.byte(), &e.public_key))
        });
        s.add(L_KC, "keys", t0.elapsed().as_secs_f64());
        black_box(sum);
        drop(v);
        let t0 = Instant::now();
        let v = walk_ids(&p.tree);
        s.add(L_TREE, "ids", t0.elapsed().as_secs_f64());
        assert_eq!(v.len(), count);
        drop(black_box(v));
        let t0 = Instant::now();
        let v = walk_keys(&p.tree);
        let sum = v
            .iter()
            .fold(0u64, |a, (_, st, k)| a.wrapping_add(touch(*st, k)));
        s.add(L_TREE, "keys", t0.elapsed().as_secs_f64());
        black_box(sum);
        drop(v);
        if cfg.salt {
            let mut c = salt_cmd(cfg, &p.store, p.size);
            c.args(["list-bench", "--repeat", "1"]);
            let j = run_json(c);
            assert_eq!(j["count"].as_u64().unwrap() as usize, count);
            s.add(L_SALT, "ids", j["median_seconds"].as_f64().unwrap());
            s.add(
                L_SALT,
                "keys",
                j["median_seconds_with_data"].as_f64().unwrap(),
            );
        }
        log(&format!(
            "  round {}/{}: keycache ids {} keys {}",
            round + 1,
            cfg.rounds,
            fmt_secs(s.0[L_KC]["ids"][round]),
            fmt_secs(s.0[L_KC]["keys"][round])
        ));
    }
    s
}

// ---------------------------------------------------------------------------
// Section: migration
// ---------------------------------------------------------------------------

const M_KC: &str = "keycache migrate (process)";
const M_READ1: &str = "read every file once (1 thread)";
const M_READ2: &str = "read every file once (2 threads)";
const M_SALT: &str = "Salt 3008.5 rebuild_from_localfs";

fn tree_files(tree: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        for e in std::fs::read_dir(tree.join(d)).unwrap() {
            v.push(e.unwrap().path());
        }
    }
    v
}

/// Lists the tree and reads every file once, in `threads` threads; bytes read.
fn read_tree(tree: &Path, threads: usize) -> u64 {
    let files = tree_files(tree);
    let chunk = files.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = files
            .chunks(chunk)
            .map(|c| {
                s.spawn(move || {
                    let mut n = 0u64;
                    for f in c {
                        let d = std::fs::read(f).unwrap();
                        n += d.len() as u64;
                        black_box(&d);
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

fn run_kc_migrate(data: &Data, tree: &Path, out: &Path, size: u64) -> (f64, f64) {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).unwrap();
    let t0 = Instant::now();
    let o = Command::new(&data.keycache)
        .arg("migrate")
        .arg(tree)
        .arg("--out")
        .arg(out)
        .args(["--size", &size.to_string(), "--json"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let wall = t0.elapsed().as_secs_f64();
    if !o.status.success() {
        die("keycache migrate failed");
    }
    let j: Json = serde_json::from_slice(&o.stdout).unwrap();
    (wall, j["seconds"].as_f64().unwrap_or(f64::NAN))
}

fn remove_banks(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".mmap_") || name.starts_with(".mmcache_") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn tree_files_total(data: &Data, n: u64) -> f64 {
    let j: Json =
        serde_json::from_slice(&std::fs::read(data.dir.join(format!("tree-{n}.json"))).unwrap())
            .unwrap();
    j["files"].as_f64().unwrap()
}

/// `salt_per_key`: Salt's seconds per key file measured on a smaller tree,
/// used (and said to be) for trees over `salt_max`.
fn section_migrate(
    cfg: &Cfg,
    data: &Data,
    n: u64,
    salt_max: u64,
    salt_per_key: &mut Option<(u64, f64)>,
) -> Samples {
    let mut s = Samples::default();
    let tree = data.tree(n);
    let size = table_size_for(n);
    let out = data.dir.join("migrate-out");
    log(&format!("migration of the {} tree", size_label(n)));
    for round in 0..cfg.rounds {
        let (wall, inner) = run_kc_migrate(data, &tree, &out, size);
        s.add(M_KC, "seconds", wall);
        s.add(M_KC, "inner", inner);
        let t0 = Instant::now();
        black_box(read_tree(&tree, 1));
        s.add(M_READ1, "seconds", t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        black_box(read_tree(&tree, 2));
        s.add(M_READ2, "seconds", t0.elapsed().as_secs_f64());
        log(&format!(
            "  round {}/{}: keycache migrate {} (inside {}), read once {} / {}",
            round + 1,
            cfg.rounds,
            fmt_secs(wall),
            fmt_secs(inner),
            fmt_secs(s.0[M_READ1]["seconds"][round]),
            fmt_secs(s.0[M_READ2]["seconds"][round]),
        ));
    }
    let _ = std::fs::remove_dir_all(&out);
    if cfg.salt && n <= salt_max {
        // Salt writes its banks beside the tree (pki_dir), one locked,
        // fsynced insert per key, at the same table size. One run: it is
        // slow and fsync-bound, so rounds would not change the picture.
        remove_banks(&tree);
        log(&format!(
            "  Salt rebuild_from_localfs on the {} tree (size {size}); about 6-13 ms per key",
            size_label(n)
        ));
        let mut c = Command::new(cfg.python.as_ref().unwrap());
        c.arg(salt_driver())
            .args(["--size", &size.to_string(), "migrate-bench", "--pki-dir"])
            .arg(&tree)
            .stderr(Stdio::inherit());
        let j = run_json(c);
        remove_banks(&tree);
        let secs = j["seconds"].as_f64().unwrap();
        let keys = j["counts"]["total"].as_f64().unwrap();
        s.add(M_SALT, "seconds", secs);
        s.add(M_SALT, "keys", keys);
        *salt_per_key = Some((n, secs / keys));
        log(&format!("  Salt: {}", fmt_secs(secs)));
    } else if let (true, Some((from, per_key))) = (cfg.salt, *salt_per_key) {
        // Salt's migration costs the same per key at any tree size (one
        // locked, fsynced insert per key), so a larger tree is extrapolated
        // from the per-key time measured on the smaller one.
        let keys = tree_files_total(data, n);
        s.add(M_SALT, "seconds", per_key * keys);
        s.add(M_SALT, "keys", keys);
        s.add(M_SALT, "extrapolated_from", from as f64);
        log(&format!(
            "  Salt: {} (extrapolated from {} per key on the {} tree)",
            fmt_secs(per_key * keys),
            fmt_secs(per_key),
            size_label(from)
        ));
    }
    s
}

// ---------------------------------------------------------------------------
// Section: opening, first lookup, resident memory (child processes)
// ---------------------------------------------------------------------------

fn self_exe() -> PathBuf {
    std::env::current_exe().unwrap()
}

fn evict(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            if let Ok(f) = std::fs::File::open(e.path()) {
                let _ = keycache_testkit::sys::evict_from_page_cache(&f);
            }
        }
    }
}

/// Runs `compare open-first` in a child process: its wall time, and the
/// open and first-lookup times it measured itself, under `label`.
fn open_first(s: &mut Samples, p: &Prepared, first: &str, label: &str) {
    let mut c = Command::new(self_exe());
    c.arg("open-first").arg("--store").arg(&p.store).args([
        "--size",
        &p.size.to_string(),
        "--id",
        first,
    ]);
    let t0 = Instant::now();
    let j = run_json(c);
    s.add(label, "wall", t0.elapsed().as_secs_f64());
    s.add(label, "open", j["open_s"].as_f64().unwrap());
    s.add(label, "first", j["first_get_s"].as_f64().unwrap());
}

fn section_open(cfg: &Cfg, data: &Data, p: &Prepared) -> Samples {
    let mut s = Samples::default();
    let first = read_ids(&p.sample_file)[0].clone();
    log(&format!("open + first lookup at {}", size_label(p.n)));
    let runs = 15 * cfg.rounds.max(1);
    for k in 0..runs {
        let t0 = Instant::now();
        let st = Command::new(self_exe()).arg("noop").status().unwrap();
        assert!(st.success());
        s.add(
            "process start-up (noop)",
            "wall",
            t0.elapsed().as_secs_f64(),
        );
        open_first(&mut s, p, first.as_str(), "open + first get (warm)");
        if k % 3 == 0 {
            // Cold: the store's files evicted from the page cache.
            evict(&p.store);
            open_first(&mut s, p, first.as_str(), "open + first get (cold)");
        }
    }
    // Resident memory of reader processes after 10k lookups.
    let mut contenders = vec!["keycache"];
    if cfg.lmdb {
        contenders.push("lmdb");
    }
    if cfg.maps {
        contenders.push("hashbrown");
    }
    for c in contenders {
        let mut cmd = Command::new(self_exe());
        cmd.arg("rss")
            .arg("--store")
            .arg(&p.store)
            .args(["--size", &p.size.to_string(), "--contender", c])
            .arg("--ids")
            .arg(&p.sample_file);
        if c == "lmdb" {
            cmd.arg("--lmdb")
                .arg(data.dir.join(format!("lmdb-{}", p.n)));
        }
        let j = run_json(cmd);
        for k in ["rss_kib", "anon_kib", "file_kib", "base_rss_kib"] {
            s.add(&format!("rss {c}"), k, j[k].as_f64().unwrap());
        }
    }
    s
}

fn cmd_open_first(a: &OpenFirstArgs) {
    let t0 = Instant::now();
    let store = Store::open_with(&a.store.store, &open_options(a.store.size)).unwrap();
    let t1 = Instant::now();
    let id = MinionId::new(a.id.as_str()).unwrap();
    let e = store.get(&id).unwrap().expect("first id present");
    let sum = touch(e.state.byte(), &e.public_key);
    let t2 = Instant::now();
    println!(
        "{}",
        json!({"open_s": (t1 - t0).as_secs_f64(), "first_get_s": (t2 - t1).as_secs_f64(), "sum": sum})
    );
}

fn proc_status_kib(field: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    for l in s.lines() {
        if let Some(v) = l.strip_prefix(field) {
            return v
                .trim_start_matches(':')
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        }
    }
    f64::NAN
}

fn cmd_rss(a: &LookupArgs) {
    let ids = read_ids(&a.ids);
    let base = proc_status_kib("VmRSS");
    let size = a.store.size;
    let store_dir = &a.store.store;
    let mut sum = 0u64;
    let keep: Box<dyn std::any::Any>;
    match a.contender.as_str() {
        "keycache" => {
            let store = Store::open_with(store_dir, &open_options(size)).unwrap();
            for id in ids.iter().take(10_000) {
                sum = sum.wrapping_add(kc_get(&store, id));
            }
            keep = Box::new(store);
        }
        "lmdb" => {
            let db = open_lmdb(a.lmdb());
            for id in ids.iter().take(10_000) {
                let t = db.0.read_txn().unwrap();
                sum = sum.wrapping_add(lmdb_get(&db, &t, id));
            }
            keep = Box::new(db);
        }
        "hashbrown" => {
            // The in-memory contender has to hold every entry.
            let store = Store::open_with(store_dir, &open_options(size)).unwrap();
            let entries = entries_of(&store);
            drop(store);
            let m = hashbrown_map(&entries);
            drop(entries);
            for id in ids.iter().take(10_000) {
                sum = sum.wrapping_add(hashbrown_get(&m, id.as_str()));
            }
            keep = Box::new(m);
        }
        c => die(&format!("unknown contender {c}")),
    }
    let out = json!({
        "rss_kib": proc_status_kib("VmRSS"),
        "anon_kib": proc_status_kib("RssAnon"),
        "file_kib": proc_status_kib("RssFile"),
        "base_rss_kib": base,
        "hwm_kib": proc_status_kib("VmHWM"),
        "sum": sum,
    });
    drop(keep);
    println!("{out}");
}

// ---------------------------------------------------------------------------
// Section: writes
// ---------------------------------------------------------------------------

const W_KC: &str = "keycache";
const W_LMDB: &str = "LMDB/heed";

fn section_write(cfg: &Cfg, data: &Data) -> Samples {
    let mut s = Samples::default();
    const BASE: u64 = 100_000;
    const SINGLE: usize = 40;
    const BATCH: u64 = 1000;
    let dir = data.dir.join("write-scratch");
    let _ = std::fs::remove_dir_all(&dir);
    log("writes: building scratch store and LMDB environment of 100k minions");
    let store = build_store(&dir.join("store"), BASE, table_size_for(BASE));
    let lmdb: Option<Lmdb> = cfg
        .lmdb
        .then(|| build_lmdb(&dir.join("lmdb"), &entries_of(&store)));
    let pems: Vec<Vec<u8>> = (0..64).map(pem).collect();
    let mut next = 10_000_000u64;
    for round in 0..cfg.rounds {
        for _ in 0..SINGLE {
            next += 1;
            let id = MinionId::new(minion_id(next)).unwrap();
            let t0 = Instant::now();
            store
                .put(&id, state(next), &pems[(next % 64) as usize])
                .unwrap();
            s.add(W_KC, "put", t0.elapsed().as_secs_f64());
            if let Some(db) = &lmdb {
                next += 1;
                let id = minion_id(next);
                let t0 = Instant::now();
                let mut v = vec![state(next).byte()];
                v.extend_from_slice(&pems[(next % 64) as usize]);
                let mut w = db.0.write_txn().unwrap();
                db.1.put(&mut w, &id, &v).unwrap();
                w.commit().unwrap();
                s.add(W_LMDB, "put", t0.elapsed().as_secs_f64());
            }
        }
        for _ in 0..3 {
            let ids: Vec<(MinionId, u64)> = (0..BATCH)
                .map(|_| {
                    next += 1;
                    (MinionId::new(minion_id(next)).unwrap(), next)
                })
                .collect();
            let t0 = Instant::now();
            store
                .batch(|b| {
                    for (id, k) in &ids {
                        b.put(id, state(*k), &pems[(k % 64) as usize])?;
                    }
                    Ok(())
                })
                .unwrap();
            s.add(W_KC, "batch", t0.elapsed().as_secs_f64());
            if let Some(db) = &lmdb {
                let ids: Vec<(String, u64)> = (0..BATCH)
                    .map(|_| {
                        next += 1;
                        (minion_id(next), next)
                    })
                    .collect();
                let t0 = Instant::now();
                let mut w = db.0.write_txn().unwrap();
                let mut v = Vec::new();
                for (id, k) in &ids {
                    v.clear();
                    v.push(state(*k).byte());
                    v.extend_from_slice(&pems[(k % 64) as usize]);
                    db.1.put(&mut w, id, &v).unwrap();
                }
                w.commit().unwrap();
                s.add(W_LMDB, "batch", t0.elapsed().as_secs_f64());
            }
        }
        log(&format!(
            "  writes round {}/{}: keycache put {} batch({BATCH}) {}",
            round + 1,
            cfg.rounds,
            fmt_secs(s.med(W_KC, "put")),
            fmt_secs(s.med(W_KC, "batch"))
        ));
    }
    drop(store);
    drop(lmdb);
    let _ = std::fs::remove_dir_all(&dir);
    s
}

// ---------------------------------------------------------------------------
// Section: instructions per lookup (callgrind)
// ---------------------------------------------------------------------------

#[inline(never)]
fn callgrind_measured(f: &mut dyn FnMut(usize) -> u64, n: usize) -> u64 {
    let mut sum = 0u64;
    for i in 0..n {
        sum = sum.wrapping_add(f(i));
    }
    sum
}

fn cmd_callgrind_loop(a: &CallgrindArgs) {
    let lookups = a.lookups;
    let a = &a.lookup;
    let store = Store::open_with(&a.store.store, &open_options(a.store.size)).unwrap();
    let ids = read_ids(&a.ids);
    let n = ids.len();
    let sum = match a.contender.as_str() {
        "keycache" => callgrind_measured(&mut |i| kc_get(&store, &ids[i % n]), lookups),
        "keycache_many" => {
            let batches: Vec<&[MinionId]> = ids.chunks_exact(64).collect();
            callgrind_measured(
                &mut |i| kc_get_many(&store, batches[i % batches.len()]),
                lookups / 64,
            )
        }
        "keycache_in" => {
            let mut buf = Vec::new();
            callgrind_measured(&mut |i| kc_get_in(&store, &ids[i % n], &mut buf), lookups)
        }
        "keycache_reader" => {
            let (mut r, mut buf) = (store.reader(), Vec::new());
            callgrind_measured(
                &mut |i| kc_reader_get_in(&mut r, &ids[i % n], &mut buf),
                lookups,
            )
        }
        "keycache_many_in" => {
            let batches: Vec<&[MinionId]> = ids.chunks_exact(64).collect();
            let mut batch = KeyBatch::new();
            callgrind_measured(
                &mut |i| kc_get_many_in(&store, batches[i % batches.len()], &mut batch),
                lookups / 64,
            )
        }
        "hashbrown_checked" => {
            let m = checked_map(&entries_of(&store));
            let mut buf = Vec::new();
            callgrind_measured(
                &mut |i| checked_get(&m, ids[i % n].as_str(), &mut buf),
                lookups,
            )
        }
        "hashbrown" | "std" => {
            let entries = entries_of(&store);
            if a.contender == "std" {
                let m = std_map(&entries);
                callgrind_measured(
                    &mut |i| m.get(ids[i % n].as_str()).map_or(0, |(s, k)| touch(*s, k)),
                    lookups,
                )
            } else {
                let m = hashbrown_map(&entries);
                callgrind_measured(&mut |i| hashbrown_get(&m, ids[i % n].as_str()), lookups)
            }
        }
        "lmdb" => {
            let db = open_lmdb(a.lmdb());
            callgrind_measured(
                &mut |i| {
                    let t = db.0.read_txn().unwrap();
                    lmdb_get(&db, &t, &ids[i % n])
                },
                lookups,
            )
        }
        c => die(&format!("unknown contender {c}")),
    };
    println!("{}", json!({"sum": sum}));
}

/// Parses a callgrind output file: total instructions collected, and the
/// number of calls to malloc/realloc/calloc and free.
fn parse_callgrind(path: &Path) -> (f64, f64, f64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut total = f64::NAN;
    let (mut allocs, mut frees) = (0.0, 0.0);
    let mut callee = String::new();
    for line in text.lines() {
        if let Some(t) = line
            .strip_prefix("totals:")
            .or_else(|| line.strip_prefix("summary:"))
        {
            total = t.split_whitespace().next().unwrap().parse().unwrap();
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            // "(id) name" defines, "(id)" refers.
            let (id, name) = match rest.split_once(' ') {
                Some((id, name)) => {
                    names.insert(id.to_string(), name.to_string());
                    (id.to_string(), name.to_string())
                }
                None => (
                    rest.to_string(),
                    names.get(rest).cloned().unwrap_or_default(),
                ),
            };
            let _ = id;
            callee = name;
        } else if let Some(rest) = line.strip_prefix("fn=") {
            if let Some((id, name)) = rest.split_once(' ') {
                names.insert(id.to_string(), name.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("calls=") {
            let c: f64 = rest.split_whitespace().next().unwrap().parse().unwrap();
            match callee.as_str() {
                "malloc" | "realloc" | "calloc" => allocs += c,
                "free" => frees += c,
                _ => {}
            }
        }
    }
    (total, allocs, frees)
}

fn section_callgrind(data: &Data, p: &Prepared, cfg: &Cfg, all: bool) -> Samples {
    let mut s = Samples::default();
    if Command::new("valgrind").arg("--version").output().is_err() {
        log("valgrind not installed: callgrind section skipped");
        return s;
    }
    let mut contenders = vec![
        "keycache",
        "keycache_many",
        "keycache_in",
        "keycache_reader",
        "keycache_many_in",
    ];
    if all && cfg.maps {
        contenders.extend(["hashbrown", "hashbrown_checked", "std"]);
    }
    if all && cfg.lmdb {
        contenders.push("lmdb");
    }
    // Two runs per contender, of L1 and L2 lookups: the differences of the
    // instruction and allocation counts, divided by L2 - L1, are per lookup
    // (set-up and tear-down cancel out).
    const L1: usize = 64 * 200;
    const L2: usize = 64 * 600;
    for (kind, ids) in [("hit", &p.hits_file), ("miss", &p.misses_file)] {
        for c in &contenders {
            if kind == "miss" && c.starts_with("keycache_many") {
                continue;
            }
            log(&format!("  callgrind: {c} {kind} at {}", size_label(p.n)));
            let mut counts = Vec::new();
            for lookups in [L1, L2] {
                let out = data
                    .dir
                    .join(format!("callgrind-{c}-{}-{kind}-{lookups}.out", p.n));
                let mut cmd = Command::new("valgrind");
                cmd.args(["--tool=callgrind", "--toggle-collect=*callgrind_measured*"])
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(self_exe())
                    .arg("callgrind-loop")
                    .arg("--store")
                    .arg(&p.store)
                    .args(["--size", &p.size.to_string(), "--contender", c])
                    .arg("--ids")
                    .arg(ids)
                    .args(["--lookups", &lookups.to_string()])
                    .stderr(Stdio::null())
                    .stdout(Stdio::null());
                if *c == "lmdb" {
                    cmd.arg("--lmdb")
                        .arg(data.dir.join(format!("lmdb-{}", p.n)));
                }
                if !cmd.status().unwrap().success() {
                    log(&format!("  callgrind run of {c} failed"));
                    break;
                }
                counts.push(parse_callgrind(&out));
            }
            if counts.len() != 2 {
                continue;
            }
            let per = (L2 - L1) as f64;
            s.add(c, &format!("ir/{kind}"), (counts[1].0 - counts[0].0) / per);
            s.add(
                c,
                &format!("allocs/{kind}"),
                (counts[1].1 - counts[0].1) / per,
            );
        }
    }
    s
}

// ---------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------

fn machine() -> Json {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.to_string()))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "memory": mem.split_whitespace().nth(1).map(|k| format!("{:.1} GiB", k.parse::<f64>().unwrap_or(0.0) / 1048576.0)),
        "kernel": kernel.trim(),
        "loadavg": load.trim(),
    })
}

struct Report {
    out: String,
    json: serde_json::Map<String, Json>,
    targets: Vec<(String, String, bool)>,
}

impl Report {
    fn line(&mut self, s: &str) {
        self.out.push_str(s);
        self.out.push('\n');
    }
    fn target(&mut self, what: &str, figures: String, met: bool) {
        self.targets.push((what.to_string(), figures, met));
    }
}

fn report_lookup(r: &mut Report, all: &[(u64, Samples)], cfg: &Cfg) {
    if all.is_empty() {
        return;
    }
    r.line("### Lookups (lookups per second, all threads together; median of the rounds)");
    r.line("");
    r.line("| store | contender | hit, 1 thread | hit, 2 threads | miss, 1 thread | miss, 2 threads | keycache get ÷ it (hit, 1t) | 2t ÷ 1t (hit) |");
    r.line("|---|---|---:|---:|---:|---:|---:|---:|");
    let order = [
        KC,
        KC_MANY,
        KC_IN,
        KC_READER,
        KC_MANY_IN,
        STD,
        HB,
        HB_CHECKED,
        LMDB_TXN,
        LMDB_SHARED,
        SALT,
    ];
    for (n, s) in all {
        let kc = s.med(KC, "hit/1t");
        for c in order {
            if !s.0.contains_key(c) {
                continue;
            }
            let h1 = s.med(c, "hit/1t");
            let h2 = s.med(c, "hit/2t");
            let ratio = if c == KC {
                "—".to_string()
            } else {
                fmt_ratio(kc / h1)
            };
            r.line(&format!(
                "| {} | {c} | {} | {} | {} | {} | {ratio} | {} |",
                size_label(*n),
                fmt_rate(h1),
                fmt_rate(h2),
                fmt_rate(s.med(c, "miss/1t")),
                fmt_rate(s.med(c, "miss/2t")),
                fmt_ratio(h2 / h1),
            ));
        }
    }
    r.line("");
    if cfg.salt {
        r.line("Salt's \"2 threads\" are two processes (the GIL serialises threads), each running its own `fetch-bench`.");
        r.line("");
    }
    // Targets at the largest size.
    let (n, s) = all.last().unwrap();
    let at = size_label(*n);
    let kc = s.med(KC, "hit/1t");
    if s.0.contains_key(HB_CHECKED) && s.0.contains_key(KC_READER) {
        let (c, hb) = (s.med(HB_CHECKED, "hit/1t"), s.med(HB, "hit/1t"));
        r.line(&format!(
            "At {at}, a hashbrown hit that also copies the value out and checks its xxh3 (what a reader of memory other processes write must add) runs at {} against hashbrown's {} ({}); keycache `get` is {} of it, `Reader::get_in` {}.",
            fmt_rate(c),
            fmt_rate(hb),
            fmt_ratio(c / hb),
            fmt_ratio(kc / c),
            fmt_ratio(s.med(KC_READER, "hit/1t") / c),
        ));
        r.line("");
    }
    if s.0.contains_key(HB) {
        let hb = s.med(HB, "hit/1t");
        r.target(
            &format!("lookup hit at {at}: no slower than hashbrown in memory"),
            format!(
                "{} vs {} ({})",
                fmt_rate(kc),
                fmt_rate(hb),
                fmt_ratio(kc / hb)
            ),
            kc >= hb,
        );
    }
    if s.0.contains_key(LMDB_TXN) {
        let l = s.med(LMDB_TXN, "hit/1t");
        let l2 = s.med(LMDB_SHARED, "hit/1t");
        r.target(
            &format!("lookup hit at {at}: >= 2x LMDB/heed (txn per lookup)"),
            format!(
                "{} vs {} ({})",
                fmt_rate(kc),
                fmt_rate(l),
                fmt_ratio(kc / l)
            ),
            kc >= 2.0 * l,
        );
        r.target(
            &format!("lookup hit at {at}: >= 2x LMDB/heed (one long read txn per thread)"),
            format!(
                "{} vs {} ({})",
                fmt_rate(kc),
                fmt_rate(l2),
                fmt_ratio(kc / l2)
            ),
            kc >= 2.0 * l2,
        );
        if s.0.contains_key(KC_READER) {
            let rd = s.med(KC_READER, "hit/1t");
            r.target(
                &format!(
                    "lookup hit at {at}, long-lived read handles on both sides: Reader::get_in >= 2x LMDB/heed one txn per thread"
                ),
                format!(
                    "{} vs {} ({})",
                    fmt_rate(rd),
                    fmt_rate(l2),
                    fmt_ratio(rd / l2)
                ),
                rd >= 2.0 * l2,
            );
        }
    }
    if s.0.contains_key(SALT) {
        let sl = s.med(SALT, "hit/1t");
        r.target(
            &format!("lookup hit at {at}: >= 200x Salt's Python fetch"),
            format!(
                "{} vs {} ({})",
                fmt_rate(kc),
                fmt_rate(sl),
                fmt_ratio(kc / sl)
            ),
            kc >= 200.0 * sl,
        );
    }
    let many = s.med(KC_MANY, "hit/1t");
    r.target(
        &format!("get_many at {at}: >= 2x the same lookups one by one"),
        format!(
            "{} vs {} ({})",
            fmt_rate(many),
            fmt_rate(kc),
            fmt_ratio(many / kc)
        ),
        many >= 2.0 * kc,
    );
    let (one, many) = (s.med(KC_IN, "hit/1t"), s.med(KC_MANY_IN, "hit/1t"));
    r.target(
        &format!("get_many_in at {at}: >= 2x the same lookups one by one (get_in)"),
        format!(
            "{} vs {} ({})",
            fmt_rate(many),
            fmt_rate(one),
            fmt_ratio(many / one)
        ),
        many >= 2.0 * one,
    );
    let kc2 = s.med(KC, "hit/2t");
    r.target(
        &format!("two reader threads at {at}: >= 1.8x one"),
        format!(
            "{} vs {} ({})",
            fmt_rate(kc2),
            fmt_rate(kc),
            fmt_ratio(kc2 / kc)
        ),
        kc2 >= 1.8 * kc,
    );
}

fn report_list(r: &mut Report, all: &[(u64, Samples)]) {
    if all.is_empty() {
        return;
    }
    r.line("### Listing the whole `keys` bank (median seconds)");
    r.line("");
    r.line("| store | contender | ids with state | ids with keys | it ÷ keycache (state) | it ÷ keycache (keys) |");
    r.line("|---|---|---:|---:|---:|---:|");
    for (n, s) in all {
        let (ki, kk) = (s.med(L_KC, "ids"), s.med(L_KC, "keys"));
        for c in [L_KC, L_TREE, L_SALT] {
            if !s.0.contains_key(c) {
                continue;
            }
            let (i, k) = (s.med(c, "ids"), s.med(c, "keys"));
            let (ri, rk) = if c == L_KC {
                ("—".into(), "—".into())
            } else {
                (fmt_ratio(i / ki), fmt_ratio(k / kk))
            };
            r.line(&format!(
                "| {} | {c} | {} | {} | {ri} | {rk} |",
                size_label(*n),
                fmt_secs(i),
                fmt_secs(k)
            ));
        }
    }
    r.line("");
}

fn report_migrate(r: &mut Report, all: &[(u64, Samples)]) {
    if all.is_empty() {
        return;
    }
    r.line("### Migrating a `localfs_key` tree (median seconds; files in the page cache)");
    r.line("");
    r.line("| tree | what | seconds | it ÷ keycache migrate | keys/s |");
    r.line("|---|---|---:|---:|---:|");
    for (n, s) in all {
        let kc = s.med(M_KC, "seconds");
        for c in [M_KC, M_READ1, M_READ2, M_SALT] {
            if !s.0.contains_key(c) {
                continue;
            }
            let v = s.med(c, "seconds");
            let ratio = if c == M_KC {
                "—".into()
            } else {
                fmt_ratio(v / kc)
            };
            let name = if c == M_KC {
                format!("{c}; inside: {}", fmt_secs(s.med(M_KC, "inner")))
            } else if c == M_SALT {
                let from = s.med(M_SALT, "extrapolated_from");
                if from.is_finite() {
                    format!(
                        "{c}: **extrapolated** from its time per key on the {} tree",
                        size_label(from as u64)
                    )
                } else {
                    format!("{c} (one run, {} keys)", s.med(M_SALT, "keys"))
                }
            } else {
                c.to_string()
            };
            r.line(&format!(
                "| {} | {name} | {} | {ratio} | {} |",
                size_label(*n),
                fmt_secs(v),
                fmt_rate(*n as f64 / v)
            ));
        }
    }
    r.line("");
    if let Some((n, s)) = all.iter().rev().find(|(n, _)| *n >= 100_000).or(all.last()) {
        let at = size_label(*n);
        let kc = s.med(M_KC, "seconds");
        if s.0.contains_key(M_SALT) {
            let sl = s.med(M_SALT, "seconds");
            r.target(
                &format!("migration of the {at} tree: >= 200x faster than Salt"),
                format!(
                    "{} vs {} ({})",
                    fmt_secs(kc),
                    fmt_secs(sl),
                    fmt_ratio(sl / kc)
                ),
                sl >= 200.0 * kc,
            );
        }
        let floor = s.med(M_READ1, "seconds").min(s.med(M_READ2, "seconds"));
        r.target(
            &format!("migration of the {at} tree: within 2x of reading every file once"),
            format!(
                "{} vs {} ({})",
                fmt_secs(kc),
                fmt_secs(floor),
                fmt_ratio(kc / floor)
            ),
            kc <= 2.0 * floor,
        );
    }
}

fn report_open(r: &mut Report, all: &[(u64, Samples)]) {
    if all.is_empty() {
        return;
    }
    r.line("### Opening a store and answering the first lookup (child processes, median)");
    r.line("");
    r.line("| store | process start-up (noop) | open + first get, wall | minus start-up | in process: open | in process: first get | cold cache: wall | cold: open | cold: first get |");
    r.line("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, s) in all {
        let noop = s.med("process start-up (noop)", "wall");
        let w = "open + first get (warm)";
        let c = "open + first get (cold)";
        r.line(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            size_label(*n),
            fmt_secs(noop),
            fmt_secs(s.med(w, "wall")),
            fmt_secs(s.med(w, "wall") - noop),
            fmt_secs(s.med(w, "open")),
            fmt_secs(s.med(w, "first")),
            fmt_secs(s.med(c, "wall")),
            fmt_secs(s.med(c, "open")),
            fmt_secs(s.med(c, "first")),
        ));
    }
    r.line("");
    r.line("Cold: the store's files were evicted from the page cache (`posix_fadvise(DONTNEED)`) before the run.");
    r.line("");
    r.line("### Resident memory of a reader process after 10k lookups");
    r.line("");
    r.line("| store | reader | VmRSS | of which anonymous | of which file-backed (mapped store) | VmRSS before opening |");
    r.line("|---|---|---:|---:|---:|---:|");
    for (n, s) in all {
        for c in ["keycache", "lmdb", "hashbrown"] {
            let k = format!("rss {c}");
            if !s.0.contains_key(&k) {
                continue;
            }
            let mib = |f: &str| format!("{:.1} MiB", s.med(&k, f) / 1024.0);
            let name = match c {
                "keycache" => "keycache Store",
                "lmdb" => "LMDB/heed",
                _ => "hashbrown HashMap (holds every entry)",
            };
            r.line(&format!(
                "| {} | {name} | {} | {} | {} | {} |",
                size_label(*n),
                mib("rss_kib"),
                mib("anon_kib"),
                mib("file_kib"),
                mib("base_rss_kib")
            ));
        }
    }
    r.line("");
    if let Some((n, s)) = all.last() {
        let noop = s.med("process start-up (noop)", "wall");
        let w = s.med("open + first get (warm)", "wall");
        r.target(
            &format!(
                "open + first lookup at {}: within 1 ms of process start-up",
                size_label(*n)
            ),
            format!(
                "{} vs {} (+{}; in process {} + {})",
                fmt_secs(w),
                fmt_secs(noop),
                fmt_secs(w - noop),
                fmt_secs(s.med("open + first get (warm)", "open")),
                fmt_secs(s.med("open + first get (warm)", "first"))
            ),
            w - noop <= 1e-3,
        );
    }
}

fn report_write(r: &mut Report, s: &Samples) {
    if s.0.is_empty() {
        return;
    }
    r.line("### Writes into a store of 100k minions (median)");
    r.line("");
    r.line("| contender | single durable put | puts/s | batch of 1000, one fsync round | per key in a batch | keys/s in batches |");
    r.line("|---|---:|---:|---:|---:|---:|");
    for c in [W_KC, W_LMDB] {
        if !s.0.contains_key(c) {
            continue;
        }
        let (p, b) = (s.med(c, "put"), s.med(c, "batch"));
        let name = if c == W_LMDB {
            "LMDB/heed (txn commit per put / per batch)"
        } else {
            "keycache put / batch"
        };
        r.line(&format!(
            "| {name} | {} | {} | {} | {} | {} |",
            fmt_secs(p),
            fmt_rate(1.0 / p),
            fmt_secs(b),
            fmt_secs(b / 1000.0),
            fmt_rate(1000.0 / b)
        ));
    }
    r.line("");
}

fn report_callgrind(r: &mut Report, all: &[(u64, Samples)]) {
    if all.iter().all(|(_, s)| s.0.is_empty()) {
        return;
    }
    r.line(
        "### Instructions per lookup (valgrind --tool=callgrind, only the lookup loop collected)",
    );
    r.line("");
    r.line("Per lookup: the difference between runs of 12,800 and 38,400 lookups, divided by 25,600. The counts include the caller's sum over the 451-byte key (8-byte words: about 70 instructions).");
    r.line("");
    r.line(
        "| store | contender | Ir per hit | Ir per miss | heap allocations per hit | per miss |",
    );
    r.line("|---|---|---:|---:|---:|---:|");
    for (n, s) in all {
        for (c, name) in [
            ("keycache", "keycache get"),
            ("keycache_many", "keycache get_many(64), per id"),
            ("keycache_in", "keycache get_in (reused buffer)"),
            (
                "keycache_reader",
                "keycache Reader::get_in (handle per thread)",
            ),
            (
                "keycache_many_in",
                "keycache get_many_in(64) (reused batch), per id",
            ),
            ("hashbrown", "hashbrown HashMap"),
            ("hashbrown_checked", "hashbrown + copy-out and xxh3 check"),
            ("std", "std HashMap"),
            ("lmdb", "LMDB/heed, txn per lookup"),
        ] {
            if !s.0.contains_key(c) {
                continue;
            }
            let f = |k: &str, d: usize| {
                let v = s.med(c, k);
                if v.is_finite() {
                    format!("{v:.d$}")
                } else {
                    "—".into()
                }
            };
            r.line(&format!(
                "| {} | {name} | {} | {} | {} | {} |",
                size_label(*n),
                f("ir/hit", 0),
                f("ir/miss", 0),
                f("allocs/hit", 2),
                f("allocs/miss", 2),
            ));
        }
    }
    r.line("");
}

fn cmd_run(a: &RunArgs) {
    let sizes = a.sizes.clone();
    let migrate_sizes = a.migrate_sizes.clone();
    let only = &a.only;
    let contenders = &a.contenders;
    let python = a.python.clone();
    let want_salt = contenders.iter().any(|c| c == "salt");
    if want_salt && python.is_none() {
        die("Salt comparisons need --python (the venv python of tools/setup-venv.sh); or --contenders lmdb,maps");
    }
    let cfg = Cfg {
        rounds: a.rounds,
        seconds: a.seconds,
        salt_seconds: a.salt_seconds,
        python,
        salt: want_salt,
        lmdb: contenders.iter().any(|c| c == "lmdb"),
        maps: contenders.iter().any(|c| c == "maps"),
    };
    let data = Data {
        dir: a
            .data
            .clone()
            .unwrap_or_else(|| repo().join("target/bench-data")),
        keycache: a
            .keycache
            .clone()
            .unwrap_or_else(|| repo().join("target/release/keycache")),
    };
    std::fs::create_dir_all(&data.dir).unwrap();
    if !data.keycache.exists() {
        die(&format!(
            "{} missing: cargo build --release --bin keycache",
            data.keycache.display()
        ));
    }
    let salt_max = a.salt_migrate_max;
    let has = |s: &str| only.iter().any(|o| o == s);
    let started = Instant::now();
    let m0 = machine();
    let mut lookups = Vec::new();
    let mut lists = Vec::new();
    let mut opens = Vec::new();
    let mut grinds = Vec::new();
    for &n in &sizes {
        let p = data.prepare(n);
        if has("lookup") {
            lookups.push((n, section_lookup(&cfg, &data, &p)));
        }
        if has("list") {
            lists.push((n, section_list(&cfg, &p)));
        }
        if has("open") {
            opens.push((n, section_open(&cfg, &data, &p)));
        }
        if has("callgrind") && (n == 100_000 || n == *sizes.last().unwrap()) {
            grinds.push((
                n,
                section_callgrind(&data, &p, &cfg, n == 100_000 || sizes.len() == 1),
            ));
        }
    }
    let mut migrates = Vec::new();
    if has("migrate") {
        let mut per_key = None;
        let mut ms = migrate_sizes.clone();
        ms.sort_unstable();
        for n in ms {
            migrates.push((n, section_migrate(&cfg, &data, n, salt_max, &mut per_key)));
        }
    }
    let writes = if has("write") {
        section_write(&cfg, &data)
    } else {
        Samples::default()
    };
    let m1 = machine();

    let mut r = Report {
        out: String::new(),
        json: serde_json::Map::new(),
        targets: Vec::new(),
    };
    let cmdline: Vec<String> = std::env::args().collect();
    r.line(&format!(
        "## keycache performance comparison\n\nMachine: {}, {} cores, {} RAM, Linux {}. Load average before: {}; after: {}.",
        m0["cpu"].as_str().unwrap_or("?"),
        m0["cores"],
        m0["memory"].as_str().unwrap_or("?"),
        m0["kernel"].as_str().unwrap_or("?"),
        m0["loadavg"].as_str().unwrap_or("?"),
        m1["loadavg"].as_str().unwrap_or("?"),
    ));
    r.line(&format!(
        "Command: `{}`; {} rounds, {} s per Rust measurement, {} s per Salt measurement; run took {:.0} s.\n",
        cmdline.join(" "),
        cfg.rounds,
        cfg.seconds,
        cfg.salt_seconds,
        started.elapsed().as_secs_f64()
    ));
    let table_sizes: Vec<String> = sizes
        .iter()
        .map(|&n| {
            format!(
                "{} minions: mmap_key_size {}",
                size_label(n),
                table_size_for(n)
            )
        })
        .collect();
    r.line(&format!(
        "Stores: `keycache migrate` of `tools/gen-pki-tree.py` trees (90% accepted, 5% pending, 3% rejected, 2% denied; 451-byte PEM keys); {}. Existing ids are the `keys` bank's, absent ids have the same shape. Every lookup hands back state and key and the caller sums every byte of the key.\n",
        table_sizes.join(", ")
    ));
    report_lookup(&mut r, &lookups, &cfg);
    report_list(&mut r, &lists);
    report_migrate(&mut r, &migrates);
    report_open(&mut r, &opens);
    report_write(&mut r, &writes);
    report_callgrind(&mut r, &grinds);
    if !r.targets.is_empty() {
        r.line("### Targets");
        r.line("");
        r.line("| target | measured | met |");
        r.line("|---|---|---|");
        let t = std::mem::take(&mut r.targets);
        for (what, fig, met) in &t {
            r.line(&format!(
                "| {what} | {fig} | {} |",
                if *met { "yes" } else { "**no**" }
            ));
        }
        r.line("");
        r.targets = t;
    }
    print!("{}", r.out);

    let to_json = |v: &[(u64, Samples)]| -> Json {
        Json::Object(
            v.iter()
                .map(|(n, s)| (n.to_string(), s.to_json()))
                .collect(),
        )
    };
    r.json.insert("machine_before".into(), m0);
    r.json.insert("machine_after".into(), m1);
    r.json.insert("command".into(), json!(cmdline));
    r.json.insert("rounds".into(), json!(cfg.rounds));
    r.json.insert("lookup".into(), to_json(&lookups));
    r.json.insert("list".into(), to_json(&lists));
    r.json.insert("migrate".into(), to_json(&migrates));
    r.json.insert("open".into(), to_json(&opens));
    r.json.insert("callgrind".into(), to_json(&grinds));
    r.json.insert("write".into(), writes.to_json());
    r.json.insert(
        "targets".into(),
        json!(r
            .targets
            .iter()
            .map(|(w, f, m)| json!({"target": w, "measured": f, "met": m}))
            .collect::<Vec<_>>()),
    );
    r.json.insert("markdown".into(), json!(r.out));
    let json_path = a
        .json
        .clone()
        .unwrap_or_else(|| data.dir.join("results.json"));
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&Json::Object(r.json)).unwrap(),
    )
    .unwrap();
    let mut tail = String::new();
    let _ = write!(tail, "results: {}", json_path.display());
    eprintln!("{tail}");
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd.unwrap_or(Cmd::Run(cli.run)) {
        Cmd::Noop => {}
        Cmd::Run(a) => cmd_run(&a),
        Cmd::OpenFirst(a) => cmd_open_first(&a),
        Cmd::Rss(a) => cmd_rss(&a),
        Cmd::CallgrindLoop(a) => cmd_callgrind_loop(&a),
    }
}
