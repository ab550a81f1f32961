//! Section `scaling`: lookups (hits) per second on 1, 2, 4, ... threads,
//! each contender with a writer beside its readers, and how close N threads
//! come to N times one thread; its report tables and its target.
//!
//! keycache's readers (a `Reader` per thread) and LMDB's (a read
//! transaction per lookup) run while a writer in another process
//! ([`crate::writer`]) changes existing keys of the same store at a bounded
//! rate; hashbrown behind a `parking_lot::RwLock` (a read lock per lookup)
//! runs while a thread of this process takes the write lock at that rate;
//! hashbrown without a lock and without writes is the ceiling. Only lookups
//! that found their key (and read every byte of it) count.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keycache::{KeyState, MinionId, Store};
use keycache_bench::{entries_of, hashbrown_map, open_lmdb, open_options, touch, Value};
use parking_lot::RwLock;

use crate::contenders::Lmdb;
use crate::data::{read_ids, Data, Prepared};
use crate::measure::{measure_cpu, Cfg, Samples};
use crate::report::Report;
use crate::util::{fmt_rate, log, size_label};
use crate::writer::{alternate_keys, pace, WriterProc};

/// keycache, a `Reader` per thread, a writer process beside.
pub(crate) const SC_KC: &str = "keycache Reader::get_in (handle per thread), writer process";
/// LMDB, a read transaction per lookup, a writer process beside.
pub(crate) const SC_LMDB: &str = "LMDB/heed, txn per lookup, writer process";
/// hashbrown behind a read-write lock, a writer thread beside.
pub(crate) const SC_RW: &str =
    "hashbrown in parking_lot RwLock (read lock per lookup), writer thread";
/// hashbrown without a lock or writes: the ceiling.
pub(crate) const SC_HB: &str = "hashbrown, no lock, read-only (ceiling)";

/// The contenders of the section, in the report's order.
const ORDER: [&str; 4] = [SC_KC, SC_LMDB, SC_RW, SC_HB];

/// The least scaling efficiency the target asks of keycache.
const TARGET_EFFICIENCY: f64 = 0.85;

/// The ids a writer changes at most.
const WRITER_IDS: usize = 65_536;

/// Lookups made and found by the measuring threads, all together.
#[derive(Default)]
struct Totals {
    calls: AtomicU64,
    found: AtomicU64,
}

/// One measuring thread's counts, added to its [`Totals`] when the
/// thread's lookup closure is dropped (after the timed loop).
struct Tally<'a> {
    calls: u64,
    found: u64,
    into: &'a Totals,
}

impl Tally<'_> {
    /// Counts one lookup (a method, so that a closure captures the whole
    /// tally and drops it at its end, not copies of its fields).
    fn count(&mut self, found: bool) -> u64 {
        self.calls += 1;
        self.found += u64::from(found);
        u64::from(found)
    }
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        self.into.calls.fetch_add(self.calls, Ordering::Relaxed);
        self.into.found.fetch_add(self.found, Ordering::Relaxed);
    }
}

/// Measures `threads` threads looking up units `0..units`, each thread's
/// lookup made by `make`: `Some(sum of the key)` when it found the key,
/// None when it did not or failed. Returns the lookups per second that
/// found their key, how many did not, and the share of a CPU each thread
/// ran on (the mean).
fn counted<M, F>(threads: usize, seconds: f64, units: usize, make: M) -> (f64, u64, f64)
where
    M: Fn() -> F + Sync,
    F: FnMut(usize) -> Option<u64>,
{
    let totals = Totals::default();
    let (rate, share) = measure_cpu(threads, seconds, units, 1, || {
        let mut f = make();
        let mut tally = Tally {
            calls: 0,
            found: 0,
            into: &totals,
        };
        move |i| match f(i) {
            Some(v) => {
                black_box(v);
                tally.count(true)
            }
            None => tally.count(false),
        }
    });
    let calls = totals.calls.load(Ordering::Relaxed);
    let found = totals.found.load(Ordering::Relaxed);
    (
        rate * found as f64 / calls.max(1) as f64,
        calls - found,
        share,
    )
}

/// Records one measurement: its rate, failed lookups, the readers' share
/// of a CPU each and the writer's writes per second, under `hit/`,
/// `failed/`, `cpu/` and `writes/` keys.
fn record(
    s: &mut Samples,
    c: &str,
    threads: usize,
    (rate, failed, share): (f64, u64, f64),
    writes: f64,
) {
    s.add(c, &format!("hit/{threads}t"), rate);
    s.add(c, &format!("failed/{threads}t"), failed as f64);
    if share.is_finite() {
        s.add(c, &format!("cpu/{threads}t"), share);
    }
    if writes.is_finite() {
        s.add(c, &format!("writes/{threads}t"), writes);
    }
}

/// Runs `measure` with the writer process `w` writing, and returns what it
/// returned and the writer's writes per second meanwhile. The writer is
/// ended (killed, waited for) when this returns, or on a panic.
fn with_writer<T>(mut w: WriterProc, measure: impl FnOnce() -> T) -> (T, f64) {
    let (w0, t0) = (w.writes(), Instant::now());
    let out = measure();
    let (w1, secs) = (w.writes(), t0.elapsed().as_secs_f64());
    drop(w);
    (out, w1.saturating_sub(w0) as f64 / secs)
}

/// The ids among `hits` (the first [`WRITER_IDS`]) whose state in `map` is
/// accepted: the ones the writer thread changes.
fn writer_ids(hits: &[MinionId], map: &hashbrown::HashMap<String, Value>) -> Vec<String> {
    let accepted = KeyState::Accepted.byte();
    hits.iter()
        .take(WRITER_IDS)
        .filter(|id| map.get(id.as_str()).is_some_and(|v| v.0 == accepted))
        .map(|id| id.as_str().to_string())
        .collect()
}

/// The section at one store size: every contender at every thread count of
/// `threads`, round after round, with writers at `rate` writes a second.
pub(crate) fn section_scaling(
    cfg: &Cfg,
    data: &Data,
    p: &Prepared,
    threads: &[usize],
    rate: u64,
) -> Samples {
    let mut s = Samples::default();
    let store = Store::open_with(&p.store, &open_options(p.size)).expect("open the store");
    let hits = read_ids(&p.hits_file);
    let entries = if cfg.maps || cfg.lmdb {
        entries_of(&store)
    } else {
        Vec::new()
    };
    let lmdb_dir = cfg.lmdb.then(|| data.lmdb(p, &entries));
    let lmdb: Option<Lmdb> = lmdb_dir.as_deref().map(open_lmdb);
    let hb = cfg.maps.then(|| hashbrown_map(&entries));
    let rw = cfg.maps.then(|| RwLock::new(hashbrown_map(&entries)));
    drop(entries);
    let rw_ids = rw.as_ref().map(|m| writer_ids(&hits, &m.read()));
    let keys = alternate_keys();
    // Warm-up: every entry once, through keycache and LMDB.
    let mut warm = 0u64;
    let mut reader = store.reader();
    let mut buf = Vec::new();
    for id in &hits {
        if let Ok(Some(e)) = reader.get_in(id, &mut buf) {
            warm = warm.wrapping_add(touch(e.state.byte(), e.public_key));
        }
    }
    if let Some((env, db)) = &lmdb {
        let t = env.read_txn().expect("lmdb read txn");
        for id in &hits {
            if let Ok(Some(v)) = db.get(&t, id.as_str()) {
                warm = warm.wrapping_add(touch(v[0], &v[1..]));
            }
        }
    }
    black_box(warm);
    let n = hits.len();
    let sec = cfg.seconds;
    log(&format!(
        "scaling at {}: {n} keys, threads {threads:?}, writers at {rate}/s",
        size_label(p.n)
    ));
    for round in 0..cfg.rounds {
        for &t in threads {
            let w = WriterProc::start(Some((&p.store, p.size)), None, &p.hits_file, rate);
            let (r, writes) = with_writer(w, || {
                counted(t, sec, n, || {
                    let (mut reader, mut buf) = (store.reader(), Vec::new());
                    let hits = &hits;
                    move |i| match reader.get_in(&hits[i], &mut buf) {
                        Ok(Some(e)) => Some(touch(e.state.byte(), e.public_key)),
                        Ok(None) | Err(_) => None,
                    }
                })
            });
            record(&mut s, SC_KC, t, r, writes);
            if let (Some((env, db)), Some(dir)) = (&lmdb, &lmdb_dir) {
                let w = WriterProc::start(None, Some(dir), &p.hits_file, rate);
                let (r, writes) = with_writer(w, || {
                    counted(t, sec, n, || {
                        |i| {
                            let txn = env.read_txn().ok()?;
                            let v = db.get(&txn, hits[i].as_str()).ok()??;
                            Some(touch(*v.first()?, v.get(1..)?))
                        }
                    })
                });
                record(&mut s, SC_LMDB, t, r, writes);
            }
            if let (Some(m), Some(ids)) = (&rw, &rw_ids) {
                let (r, writes) = with_writer_thread(m, ids, &keys, rate, || {
                    counted(t, sec, n, || {
                        |i| {
                            let g = m.read();
                            let (st, key) = g.get(hits[i].as_str())?;
                            Some(touch(*st, key))
                        }
                    })
                });
                record(&mut s, SC_RW, t, r, writes);
            }
            if let Some(m) = &hb {
                let r = counted(t, sec, n, || {
                    |i| {
                        let (st, key) = m.get(hits[i].as_str())?;
                        Some(touch(*st, key))
                    }
                });
                record(&mut s, SC_HB, t, r, f64::NAN);
            }
        }
        let last = |t: usize| {
            let v = s.0[SC_KC].get(&format!("hit/{t}t"));
            fmt_rate(v.and_then(|v| v.last().copied()).unwrap_or(f64::NAN))
        };
        let (lo, hi) = (threads[0], threads[threads.len() - 1]);
        log(&format!(
            "  round {}/{}: keycache with a writer process {} ({lo}t), {} ({hi}t)",
            round + 1,
            cfg.rounds,
            last(lo),
            last(hi),
        ));
    }
    s
}

/// Runs `measure` while a thread of this process changes the values of
/// `ids` in `map` (write lock, value replaced by one of `keys` of the same
/// length) at `rate` writes a second; returns what `measure` returned and
/// the writes per second meanwhile. The thread stops when `measure`
/// returns, or after an hour at most.
fn with_writer_thread<T>(
    map: &RwLock<hashbrown::HashMap<String, Value>>,
    ids: &[String],
    keys: &[Vec<u8>; 2],
    rate: u64,
    measure: impl FnOnce() -> T,
) -> (T, f64) {
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let end = Instant::now() + Duration::from_secs(3600);
            let (mut start, mut tick, mut k) = (Instant::now(), 0u64, 0usize);
            while !ids.is_empty() && !stop.load(Ordering::Relaxed) && Instant::now() < end {
                let which = (k / ids.len()) % 2;
                {
                    let mut g = map.write();
                    if let Some(v) = g.get_mut(&ids[k % ids.len()]) {
                        if v.1.len() == keys[which].len() {
                            v.1.copy_from_slice(&keys[which]);
                        }
                    }
                }
                writes.fetch_add(1, Ordering::Relaxed);
                k += 1;
                pace(&mut start, &mut tick, rate);
            }
        });
        // Let the writer make its first write before the readers start.
        let ready = Instant::now() + Duration::from_secs(5);
        while writes.load(Ordering::Relaxed) == 0 && !ids.is_empty() && Instant::now() < ready {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (w0, m0) = (writes.load(Ordering::Relaxed), Instant::now());
        let out = measure();
        let w1 = writes.load(Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        (out, (w1 - w0) as f64 / m0.elapsed().as_secs_f64())
    })
}

/// The rows of a table of one column a thread count: one a size and
/// contender that `keep` keeps, its cells from `cell` (samples, contender,
/// threads).
fn rows(
    r: &mut Report,
    all: &[(u64, Samples)],
    threads: &[usize],
    keep: impl Fn(&Samples, &str) -> bool,
    cell: impl Fn(&Samples, &str, usize) -> String,
) {
    for (n, s) in all {
        for c in s.present(ORDER).filter(|c| keep(s, c)) {
            let cells: Vec<String> = threads.iter().map(|&t| cell(s, c, t)).collect();
            r.line(&format!(
                "| {} | {c} | {} |",
                size_label(*n),
                cells.join(" | ")
            ));
        }
    }
}

/// The section's report: the table of rates and efficiencies, the writers'
/// rates, failed lookups, and the target at the largest size.
pub(crate) fn report_scaling(r: &mut Report, all: &[(u64, Samples)], threads: &[usize], rate: u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cols: Vec<String> = threads
        .iter()
        .map(|&t| format!("{t} thread{}", if t == 1 { "" } else { "s" }))
        .collect();
    let align = "---:|".repeat(threads.len());
    r.line(&format!(
        "### Lookups across threads (hits per second, all threads together; in brackets N threads ÷ (N × 1 thread); median of the rounds)\n\n| store | contender | {} |\n|---|---|{align}",
        cols.join(" | ")
    ));
    let one = threads.first().copied().unwrap_or(1);
    let eff = |s: &Samples, c: &str, t: usize| {
        s.med(c, &format!("hit/{t}t")) / (t as f64 / one as f64 * s.med(c, &format!("hit/{one}t")))
    };
    // The same, each rate over the CPU share its threads got.
    let cpu_eff = |s: &Samples, c: &str, t: usize| {
        let per_cpu = |t: usize| s.med(c, &format!("hit/{t}t")) / s.med(c, &format!("cpu/{t}t"));
        per_cpu(t) / (t as f64 / one as f64 * per_cpu(one))
    };
    rows(
        r,
        all,
        threads,
        |_, _| true,
        |s, c, t| {
            let v = fmt_rate(s.med(c, &format!("hit/{t}t")));
            if t == one {
                v
            } else {
                format!("{v} ({:.2})", eff(s, c, t))
            }
        },
    );
    r.line("");
    r.line(&format!(
        "The writers beside the readers, asked for {rate} writes/s: keycache's a `compare writer` process (`Store::put` of existing accepted ids, two alternating 451-byte keys, each put durable), LMDB's a process committing a write transaction a change; the RwLock's a thread taking the write lock a change. Writes per second they made during the measurements (median of the rounds):"
    ));
    r.line("");
    r.line(&format!(
        "| store | writer beside | {} |\n|---|---|{align}",
        cols.join(" | ")
    ));
    rows(
        r,
        all,
        threads,
        |s, c| s.0[c].keys().any(|k| k.starts_with("writes/")),
        |s, c, t| format!("{:.0}/s", s.med(c, &format!("writes/{t}t"))),
    );
    r.line("");
    r.line("The share of a CPU each reader thread ran on (its CPU time over its wall-clock time, from `/proc/thread-self/schedstat`; the mean over the threads, median of the rounds) and, in brackets, the efficiency per CPU second: (N threads' rate ÷ (N × their share)) ÷ (1 thread's rate ÷ its share), how close N threads come to N times one when each is counted for the CPU it got. Where the readers and the writer together are more threads than the machine has CPUs, the readers cannot each have one, and this is the floor the target is restated against:");
    r.line("");
    r.line(&format!(
        "| store | contender | {} |\n|---|---|{align}",
        cols.join(" | ")
    ));
    rows(
        r,
        all,
        threads,
        |s, c| s.0[c].keys().any(|k| k.starts_with("cpu/")),
        |s, c, t| {
            let v = format!("{:.2}", s.med(c, &format!("cpu/{t}t")));
            if t == one {
                v
            } else {
                format!("{v} ({:.2})", cpu_eff(s, c, t))
            }
        },
    );
    r.line("");
    let mut failed = Vec::new();
    for (n, s) in all {
        for (c, m) in &s.0 {
            let sum: f64 = m
                .iter()
                .filter(|(k, _)| k.starts_with("failed/"))
                .flat_map(|(_, v)| v.iter())
                .sum();
            if sum > 0.0 {
                failed.push(format!("{} {c}: {sum:.0}", size_label(*n)));
            }
        }
    }
    if failed.is_empty() {
        r.line("Every lookup found its key and read all of it (lookups that find nothing or fail would not count).");
    } else {
        r.line(&format!(
            "**Lookups that found nothing or failed** (not counted in the rates): {}.",
            failed.join("; ")
        ));
    }
    let over: Vec<String> = threads
        .iter()
        .filter(|&&t| t > cpus)
        .map(|t| t.to_string())
        .collect();
    if !over.is_empty() {
        r.line(&format!(
            "This process may use {cpus} CPUs: at {} threads, threads share CPUs.",
            over.join(", ")
        ));
    }
    r.line("");
    // The target: keycache at the largest size, every N > 1 up to the CPUs.
    let Some((n, s)) = all.last() else { return };
    if !s.0.contains_key(SC_KC) || one != 1 {
        return;
    }
    let at = size_label(*n);
    let one_rate = s.med(SC_KC, "hit/1t");
    for &t in threads.iter().filter(|&&t| t > 1 && t <= cpus) {
        let v = s.med(SC_KC, &format!("hit/{t}t"));
        let e = eff(s, SC_KC, t);
        let what = format!(
            "keycache Reader::get_in at {at} with a writer process: {t} threads >= {TARGET_EFFICIENCY} x {t} x 1 thread"
        );
        let figures = format!(
            "{} vs {t} x {} (efficiency {e:.2})",
            fmt_rate(v),
            fmt_rate(one_rate)
        );
        let met = e >= TARGET_EFFICIENCY;
        r.line(&format!(
            "Target: {what}: {} ({figures}).",
            if met { "met" } else { "**not met**" }
        ));
        r.target(&what, figures, met);
        // Restated against the CPU the readers got: on a machine whose
        // CPUs the readers share with the writer process, N threads cannot
        // each have one.
        let ce = cpu_eff(s, SC_KC, t);
        if ce.is_finite() {
            let what = format!(
                "keycache Reader::get_in at {at} with a writer process, per CPU second the readers got: {t} threads >= {TARGET_EFFICIENCY} x {t} x 1 thread"
            );
            let figures = format!(
                "efficiency per CPU second {ce:.2}; each thread ran on {:.2} of a CPU ({t} threads) and {:.2} (1 thread)",
                s.med(SC_KC, &format!("cpu/{t}t")),
                s.med(SC_KC, "cpu/1t")
            );
            let met = ce >= TARGET_EFFICIENCY;
            r.line(&format!(
                "Target restated: {what}: {} ({figures}).",
                if met { "met" } else { "**not met**" }
            ));
            r.target(&what, figures, met);
        }
    }
    r.line("");
}
