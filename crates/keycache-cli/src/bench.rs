//! `keycache bench`: lookup throughput of an existing store on this machine.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;

use keycache::store::{KeyBatch, Store};
use keycache::MinionId;

/// A small xorshift generator: deterministic shuffles without a dependency.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Reads every byte of a found key, as a caller would: sums it as
/// little-endian 8-byte words (vector adds; a byte-at-a-time sum would cost
/// more than the lookup's own work and measure the caller).
/// The benches and the comparison tool use it too.
#[inline]
pub fn touch(key: &[u8]) -> u64 {
    let mut words = key.chunks_exact(8);
    let mut s = 0u64;
    for w in &mut words {
        s = s.wrapping_add(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
    }
    words
        .remainder()
        .iter()
        .fold(s, |s, &b| s.wrapping_add(u64::from(b)))
}

/// Throughput of one kind of lookup.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Rate {
    /// Lookups per second, all threads together.
    pub lookups_per_s: f64,
    /// Wall-clock nanoseconds per lookup and thread.
    pub ns_per_lookup: f64,
}

/// Runs `threads` threads for `seconds`, each calling `f(thread, i)` for
/// i = 0, 1, ... in batches of `per_call` lookups, with an `f` of its own
/// from `make` (its buffers); returns the rate, or an error when a thread
/// panicked (a rate without it would be wrong).
fn measure<F: FnMut(usize, usize) -> u64>(
    threads: usize,
    seconds: f64,
    per_call: usize,
    make: &(dyn Fn() -> F + Sync),
) -> Result<(Rate, u64), crate::cli::Fail> {
    let deadline = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let results: Option<Vec<(u64, u64, f64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut f = make();
                    let t0 = Instant::now();
                    let (mut n, mut sum, mut i) = (0u64, 0u64, 0usize);
                    while t0.elapsed() < deadline {
                        for _ in 0..64 {
                            sum = sum.wrapping_add(f(t, i));
                            i += 1;
                            n += per_call as u64;
                        }
                    }
                    (n, sum, t0.elapsed().as_secs_f64())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().ok()).collect()
    });
    let results =
        results.ok_or_else(|| crate::cli::Fail(1, "a benchmark thread panicked".into()))?;
    let wall = start.elapsed().as_secs_f64();
    let n: u64 = results.iter().map(|r| r.0).sum();
    let per_thread_ns = results
        .iter()
        .map(|r| r.2 * 1e9 / r.0.max(1) as f64)
        .sum::<f64>()
        / threads as f64;
    Ok((
        Rate {
            lookups_per_s: n as f64 / wall,
            ns_per_lookup: per_thread_ns,
        },
        results.iter().fold(0, |a, r| a.wrapping_add(r.1)),
    ))
}

pub(crate) fn cmd_bench(
    store: &Store,
    threads: usize,
    seconds: f64,
    json_out: bool,
) -> Result<ExitCode, crate::cli::Fail> {
    let threads = threads.max(1);
    let mut ids: Vec<MinionId> = Vec::new();
    for r in store.keys(None)? {
        let (id, _) = r?;
        if let Ok(m) = MinionId::new(id) {
            ids.push(m);
        }
    }
    if ids.is_empty() {
        return Err(crate::cli::Fail(
            2,
            format!(
                "{}: the keys bank is empty; nothing to look up",
                store.dir().display()
            ),
        ));
    }
    let mut rng = Rng::new(0x5eed);
    rng.shuffle(&mut ids);
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
    let hit = || {
        |t: usize, i: usize| -> u64 {
            let id = &ids[(i * threads + t) % n];
            match store.get(id) {
                Ok(Some(e)) => touch(&e.public_key),
                _ => 0,
            }
        }
    };
    let hit_in = || {
        let (ids, mut buf) = (&ids, Vec::new());
        move |t: usize, i: usize| -> u64 {
            let id = &ids[(i * threads + t) % n];
            match store.get_in(id, &mut buf) {
                Ok(Some(e)) => touch(e.public_key),
                _ => 0,
            }
        }
    };
    // A Reader per thread, as a daemon's worker threads would keep.
    let reader_in = || {
        let (ids, mut buf, mut r) = (&ids, Vec::new(), store.reader());
        move |t: usize, i: usize| -> u64 {
            let id = &ids[(i * threads + t) % n];
            match r.get_in(id, &mut buf) {
                Ok(Some(e)) => touch(e.public_key),
                _ => 0,
            }
        }
    };
    let miss = || {
        |t: usize, i: usize| -> u64 {
            let id = &misses[(i * threads + t) % misses.len()];
            u64::from(matches!(store.get(id), Ok(None)))
        }
    };
    // Batches of 64, or of every id when the store holds fewer (`ids` is
    // not empty: checked above).
    let batch_len = 64.min(n);
    let batches: Vec<&[MinionId]> = ids.chunks_exact(batch_len).collect();
    let many = || {
        |t: usize, i: usize| -> u64 {
            let b = batches[(i * threads + t) % batches.len()];
            match store.get_many(b) {
                Ok(v) => v
                    .iter()
                    .flatten()
                    .fold(0, |s, e| s.wrapping_add(touch(&e.public_key))),
                _ => 0,
            }
        }
    };
    let many_in = || {
        let (batches, mut batch) = (&batches, KeyBatch::new());
        move |t: usize, i: usize| -> u64 {
            let b = batches[(i * threads + t) % batches.len()];
            match store.get_many_in(b, &mut batch) {
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
    let warm_f = hit();
    let warm: u64 = (0..n).map(|i| warm_f(0, i)).fold(0, u64::wrapping_add);
    let (h, check) = measure(threads, seconds, 1, &hit)?;
    let check = check.wrapping_add(warm);
    let (m, _) = measure(threads, seconds, 1, &miss)?;
    let (hi, _) = measure(threads, seconds, 1, &hit_in)?;
    let (ri, _) = measure(threads, seconds, 1, &reader_in)?;
    let (b, _) = measure(threads, seconds, batch_len, &many)?;
    let (bi, _) = measure(threads, seconds, batch_len, &many_in)?;
    let v = json!({
        "threads": threads,
        "keys": n,
        "batch": batch_len,
        "hit": h,
        "miss": m,
        "get_many": b,
        "get_in": hi,
        "reader_get_in": ri,
        "get_many_in": bi,
        "checksum": check,
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "{} keys, {threads} thread(s), {seconds} s per measurement",
            n
        );
        println!("{:<14} {:>16} {:>14}", "lookup", "lookups/s", "ns/lookup");
        for (name, r) in [
            ("hit", h),
            ("miss", m),
            ("get_many", b),
            ("get_in", hi),
            ("reader_get_in", ri),
            ("get_many_in", bi),
        ] {
            println!(
                "{:<14} {:>16.0} {:>14.1}",
                name, r.lookups_per_s, r.ns_per_lookup
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
