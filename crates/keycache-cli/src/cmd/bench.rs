//! `keycache bench`: lookup throughput of an existing store on this
//! machine, with the measuring loop of the library
//! ([`keycache_bench::measure::measure`]) that the comparison tool of
//! `keycache-bench` uses too.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use keycache::store::{KeyBatch, Store};
use keycache::MinionId;
use keycache_bench::measure::{measure, touch, Measured, Rate};

use crate::args::{ConfiguredStore, Json, StoreArgs};
use crate::output::{outln, print_json, CmdError, CmdResult};

/// The longest measurement, in seconds (an hour).
const MAX_SECONDS: f64 = 3600.0;

/// The most reader threads.
const MAX_THREADS: usize = 256;

/// The arguments of `keycache bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// Reader threads (1 to 256).
    #[arg(long, default_value_t = 1, value_parser = threads)]
    threads: usize,
    /// Seconds per measurement (above 0, at most 3600).
    #[arg(long, default_value_t = 2.0, value_parser = seconds)]
    seconds: f64,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// `--threads`: 1 to [`MAX_THREADS`].
fn threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!("give a whole number from 1 to {MAX_THREADS}")),
    }
}

/// `--seconds`: finite, above 0, at most [`MAX_SECONDS`].
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= MAX_SECONDS => Ok(x),
        _ => Err(format!("give a number above 0 and at most {MAX_SECONDS}")),
    }
}

/// Runs `keycache bench`.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir())?;
    // Both in range: checked by the argument parsers.
    let r = bench_store(&store, a.threads, Duration::from_secs_f64(a.seconds))?;
    if a.json.json {
        print_json(&r);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{} keys, {} thread(s), {} s per measurement",
        r.keys,
        r.threads,
        a.seconds
    );
    outln!("{:<14} {:>16} {:>14}", "lookup", "lookups/s", "ns/lookup");
    for (name, rate) in [
        ("hit", r.hit),
        ("miss", r.miss),
        ("get_many", r.get_many),
        ("get_in", r.get_in),
        ("reader_get_in", r.reader_get_in),
        ("get_many_in", r.get_many_in),
    ] {
        outln!(
            "{:<14} {:>16.0} {:>14.1}",
            name,
            rate.lookups_per_s,
            rate.ns_per_lookup
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The lookup throughput of a store ([`bench_store`]), per kind of lookup
/// (the JSON of `keycache bench --json`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
struct BenchReport {
    /// Reader threads.
    threads: usize,
    /// Ids of the `keys` bank looked up.
    keys: usize,
    /// Ids per `get_many` call.
    batch: usize,
    /// `Store::get` of present ids.
    hit: Rate,
    /// `Store::get` of absent ids.
    miss: Rate,
    /// `Store::get_many`.
    get_many: Rate,
    /// `Store::get_in` of present ids.
    get_in: Rate,
    /// `Reader::get_in` of present ids, a `Reader` per thread.
    reader_get_in: Rate,
    /// `Store::get_many_in`.
    get_many_in: Rate,
    /// The sum of every key read (keeps the reads from being optimised
    /// away).
    checksum: u64,
}

/// The order ids are looked up in: the order of their xxh3 (the hash that
/// places them in the index) passed through splitmix64's finalizer, so
/// that neighbours in the order are neither neighbours in the index nor in
/// the listing, and every run looks them up in the same order.
fn lookup_order(id: &MinionId) -> u64 {
    let mut z = keycache::format::hash(id.as_str().as_bytes()) ^ 0x5eed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One measurement; a panic of a measuring thread is exit code 1.
fn rate<M, F>(
    threads: usize,
    time: Duration,
    units: usize,
    per_unit: usize,
    make: M,
) -> Result<Measured, CmdError>
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(usize) -> u64,
{
    measure(threads, time, units, per_unit, make).map_err(|_| CmdError {
        code: 1,
        message: "a benchmark thread panicked".into(),
    })
}

/// Measures, for `time` each with `threads` threads, the lookups of the
/// ids of `store`'s `keys` bank in a fixed scrambled order
/// ([`lookup_order`]): `get` of present and of absent ids, `get_many`,
/// `get_in`, a `Reader`'s `get_in`, and `get_many_in`, after one warm-up
/// pass over every entry. An empty `keys` bank is an error naming the
/// store.
fn bench_store(store: &Store, threads: usize, time: Duration) -> Result<BenchReport, CmdError> {
    let mut ids: Vec<MinionId> = Vec::new();
    for r in store.keys(None)? {
        let (id, _) = r?;
        if let Ok(m) = MinionId::new(id) {
            ids.push(m);
        }
    }
    if ids.is_empty() {
        return Err(empty(store.dir()));
    }
    ids.sort_by_cached_key(lookup_order);
    let id_size = store.keys_table().params().id_size;
    let misses: Vec<MinionId> = ids
        .iter()
        .enumerate()
        .filter_map(|(n, i)| {
            let s = format!("{}.absent{n}", i.as_str());
            let s = if s.len() > id_size {
                format!("absent-{n}")
            } else {
                s
            };
            MinionId::new(s).ok()
        })
        .collect();
    let n = ids.len();
    let hit = |_: usize| {
        |i: usize| -> u64 {
            match store.get(&ids[i]) {
                Ok(Some(e)) => touch(&e.public_key),
                _ => 0,
            }
        }
    };
    let hit_in = |_: usize| {
        let mut buf = Vec::new();
        let ids = &ids;
        move |i: usize| -> u64 {
            match store.get_in(&ids[i], &mut buf) {
                Ok(Some(e)) => touch(e.public_key),
                _ => 0,
            }
        }
    };
    // A Reader per thread, as a daemon's worker threads would keep.
    let reader_in = |_: usize| {
        let (ids, mut buf, mut r) = (&ids, Vec::new(), store.reader());
        move |i: usize| -> u64 {
            match r.get_in(&ids[i], &mut buf) {
                Ok(Some(e)) => touch(e.public_key),
                _ => 0,
            }
        }
    };
    let miss =
        |_: usize| |i: usize| -> u64 { u64::from(matches!(store.get(&misses[i]), Ok(None))) };
    // Batches of 64, or of every id when the store holds fewer (`ids` is
    // not empty: checked above).
    let batch_len = 64.min(n);
    let batches: Vec<&[MinionId]> = ids.chunks_exact(batch_len).collect();
    let many = |_: usize| {
        |i: usize| -> u64 {
            match store.get_many(batches[i]) {
                Ok(v) => v
                    .iter()
                    .flatten()
                    .fold(0, |s, e| s.wrapping_add(touch(&e.public_key))),
                _ => 0,
            }
        }
    };
    let many_in = |_: usize| {
        let (batches, mut batch) = (&batches, KeyBatch::new());
        move |i: usize| -> u64 {
            match store.get_many_in(batches[i], &mut batch) {
                Ok(()) => batch
                    .iter()
                    .flatten()
                    .fold(0, |s, e| s.wrapping_add(touch(e.public_key))),
                _ => 0,
            }
        }
    };
    // Warm up: touch every entry once, so the page tables are filled and
    // what is measured is the steady state of a running master.
    let mut warm_f = hit(0);
    let warm: u64 = (0..n).map(&mut warm_f).fold(0, u64::wrapping_add);
    let h = rate(threads, time, n, 1, hit)?;
    let m = rate(threads, time, misses.len(), 1, miss)?;
    let hi = rate(threads, time, n, 1, hit_in)?;
    let ri = rate(threads, time, n, 1, reader_in)?;
    let b = rate(threads, time, batches.len(), batch_len, many)?;
    let bi = rate(threads, time, batches.len(), batch_len, many_in)?;
    Ok(BenchReport {
        threads: threads.max(1),
        keys: n,
        batch: batch_len,
        hit: h.rate,
        miss: m.rate,
        get_many: b.rate,
        get_in: hi.rate,
        reader_get_in: ri.rate,
        get_many_in: bi.rate,
        checksum: h.checksum.wrapping_add(warm),
    })
}

/// The error of a store whose `keys` bank holds nothing to look up.
fn empty(dir: &Path) -> CmdError {
    CmdError::usage(format!(
        "{}: the keys bank is empty; nothing to look up",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keycache::{KeyState, OpenOptions, Params};

    fn store(dir: &Path) -> Store {
        let opts = OpenOptions {
            params: Params {
                size: 31,
                ..Params::default()
            },
            ..OpenOptions::default()
        };
        Store::open_with(dir, &opts).expect("open")
    }

    #[test]
    fn an_empty_keys_bank_is_refused_naming_the_store() {
        let t = tempfile::tempdir().expect("tempdir");
        let e = bench_store(&store(t.path()), 1, Duration::from_millis(1)).expect_err("empty");
        assert_eq!(e.code, 2);
        assert!(
            e.message.contains(&t.path().display().to_string()),
            "{}",
            e.message
        );
        assert!(e.message.contains("empty"), "{}", e.message);
    }

    #[test]
    fn every_kind_of_lookup_is_measured_and_the_hits_find_their_keys() {
        let t = tempfile::tempdir().expect("tempdir");
        let s = store(t.path());
        let pem = b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n";
        for n in 0..5 {
            let id = MinionId::new(format!("web-{n}")).expect("id");
            s.put(&id, KeyState::Accepted, pem).expect("put");
        }
        let r = bench_store(&s, 2, Duration::from_millis(5)).expect("bench");
        assert_eq!((r.threads, r.keys, r.batch), (2, 5, 5));
        for rate in [
            r.hit,
            r.miss,
            r.get_many,
            r.get_in,
            r.reader_get_in,
            r.get_many_in,
        ] {
            assert!(
                rate.lookups_per_s > 0.0 && rate.ns_per_lookup > 0.0,
                "{rate:?}"
            );
        }
        // The keys were read (a lookup that finds nothing adds 0).
        assert_ne!(r.checksum, 0);
    }
}
