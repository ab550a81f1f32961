//! keycache's measurement kit: what `keycache bench`, the criterion benches
//! (`benches/`) and the comparison tool (`examples/compare.rs`) share: a
//! seeded generator ([`Rng`]), what a caller does with a found key
//! ([`touch`]), and the lookup-throughput measurement of `keycache bench`
//! ([`bench_store`], reporting a [`BenchReport`]).

use std::fmt;
use std::time::{Duration, Instant};

use keycache::store::{KeyBatch, Store};
use keycache::MinionId;

/// A small xorshift generator: deterministic data and shuffles without a
/// dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`, mixed (multiplied by the golden
    /// ratio) so that neighbouring seeds give unrelated sequences.
    pub fn new(seed: u64) -> Rng {
        Rng::with_state(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A generator whose state is `state` as given (zero, which xorshift
    /// never leaves, taken as one).
    pub fn with_state(state: u64) -> Rng {
        Rng(state.max(1))
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (below 1 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Shuffles `v` (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// Reads every byte of a found key, as a caller would: sums it as
/// little-endian 8-byte words (vector adds; a byte-at-a-time sum would cost
/// more than the lookup's own work and measure the caller).
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
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Rate {
    /// Lookups per second, all threads together.
    pub lookups_per_s: f64,
    /// Wall-clock nanoseconds per lookup and thread.
    pub ns_per_lookup: f64,
}

/// Why a measurement could not be made.
#[derive(Debug)]
pub enum BenchError {
    /// The store could not be read.
    Store(keycache::Error),
    /// The store's `keys` bank holds no entry to look up; the store's
    /// directory.
    Empty(std::path::PathBuf),
    /// A measuring thread panicked (a rate without it would be wrong).
    Panicked,
    /// An argument out of its range (see [`check_args`]): what is wrong.
    InvalidArgument(String),
}

/// The longest measurement [`measure`] makes, in seconds (an hour).
pub const MAX_SECONDS: f64 = 3600.0;

/// The most threads [`measure`] runs.
pub const MAX_THREADS: usize = 256;

/// Checks the arguments of a measurement: `seconds` finite, above 0 and at
/// most [`MAX_SECONDS`]; `threads` from 1 to [`MAX_THREADS`].
pub fn check_args(threads: usize, seconds: f64) -> Result<(), BenchError> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_SECONDS) {
        return Err(BenchError::InvalidArgument(format!(
            "seconds {seconds}: give a number above 0 and at most {MAX_SECONDS}"
        )));
    }
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(BenchError::InvalidArgument(format!(
            "threads {threads}: give 1 to {MAX_THREADS}"
        )));
    }
    Ok(())
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Store(e) => e.fmt(f),
            BenchError::Empty(dir) => write!(
                f,
                "{}: the keys bank is empty; nothing to look up",
                dir.display()
            ),
            BenchError::Panicked => f.write_str("a benchmark thread panicked"),
            BenchError::InvalidArgument(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<keycache::Error> for BenchError {
    fn from(e: keycache::Error) -> BenchError {
        BenchError::Store(e)
    }
}

/// Runs `threads` threads for `seconds`, each calling `f(thread, i)` for
/// i = 0, 1, ... in rounds of 64 calls of `per_call` lookups each, with an
/// `f` of its own from `make` (its buffers); returns the rate and the sum
/// of what the calls returned, [`BenchError::Panicked`], or
/// [`BenchError::InvalidArgument`] for arguments [`check_args`] refuses.
pub fn measure<F: FnMut(usize, usize) -> u64>(
    threads: usize,
    seconds: f64,
    per_call: usize,
    make: &(dyn Fn() -> F + Sync),
) -> Result<(Rate, u64), BenchError> {
    check_args(threads, seconds)?;
    let deadline = Duration::try_from_secs_f64(seconds)
        .map_err(|e| BenchError::InvalidArgument(format!("seconds {seconds}: {e}")))?;
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
    let results = results.ok_or(BenchError::Panicked)?;
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

/// The lookup throughput of a store ([`bench_store`]), per kind of lookup.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BenchReport {
    /// Reader threads.
    pub threads: usize,
    /// Ids of the `keys` bank looked up.
    pub keys: usize,
    /// Ids per `get_many` call.
    pub batch: usize,
    /// `Store::get` of present ids.
    pub hit: Rate,
    /// `Store::get` of absent ids.
    pub miss: Rate,
    /// `Store::get_many`.
    pub get_many: Rate,
    /// `Store::get_in` of present ids.
    pub get_in: Rate,
    /// `Reader::get_in` of present ids, a `Reader` per thread.
    pub reader_get_in: Rate,
    /// `Store::get_many_in`.
    pub get_many_in: Rate,
    /// The sum of every key read (keeps the reads from being optimised
    /// away).
    pub checksum: u64,
}

/// Measures, for `seconds` each with `threads` threads (at least one), the
/// lookups of the ids of `store`'s `keys` bank in a seeded random order:
/// `get` of present and of absent ids, `get_many`, `get_in`, a `Reader`'s
/// `get_in`, and `get_many_in`, after one warm-up pass over every entry.
/// Arguments out of range ([`check_args`]) are refused before the store is
/// read.
pub fn bench_store(store: &Store, threads: usize, seconds: f64) -> Result<BenchReport, BenchError> {
    let threads = threads.max(1);
    check_args(threads, seconds)?;
    let mut ids: Vec<MinionId> = Vec::new();
    for r in store.keys(None)? {
        let (id, _) = r?;
        if let Ok(m) = MinionId::new(id) {
            ids.push(m);
        }
    }
    if ids.is_empty() {
        return Err(BenchError::Empty(store.dir().to_path_buf()));
    }
    let mut rng = Rng::with_state(0x5eed);
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
    let checksum = check.wrapping_add(warm);
    let (m, _) = measure(threads, seconds, 1, &miss)?;
    let (hi, _) = measure(threads, seconds, 1, &hit_in)?;
    let (ri, _) = measure(threads, seconds, 1, &reader_in)?;
    let (b, _) = measure(threads, seconds, batch_len, &many)?;
    let (bi, _) = measure(threads, seconds, batch_len, &many_in)?;
    Ok(BenchReport {
        threads,
        keys: n,
        batch: batch_len,
        hit: h,
        miss: m,
        get_many: b,
        get_in: hi,
        reader_get_in: ri,
        get_many_in: bi,
        checksum,
    })
}

#[cfg(test)]
mod arg_tests {
    use super::*;

    #[test]
    fn measure_refuses_out_of_range_arguments_instead_of_panicking() {
        let make = || |_: usize, _: usize| 0u64;
        for secs in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1e300, MAX_SECONDS + 1.0] {
            assert!(
                matches!(
                    measure(1, secs, 1, &make),
                    Err(BenchError::InvalidArgument(_))
                ),
                "{secs}"
            );
        }
        for threads in [0, MAX_THREADS + 1, usize::MAX] {
            assert!(
                matches!(
                    measure(threads, 0.01, 1, &make),
                    Err(BenchError::InvalidArgument(_))
                ),
                "{threads}"
            );
        }
        let (rate, _) = measure(2, 0.01, 1, &make).expect("in range");
        assert!(rate.lookups_per_s > 0.0);
    }
}
