//! The lookup-throughput measuring loop: `keycache bench` (the CLI), the
//! comparison tool of `keycache-bench` and its criterion benches measure
//! with it, so that their figures are made the same way.
//!
//! [`measure`] runs threads for a while, each calling a lookup closure over
//! a ring of work units, and reports a [`Rate`]; [`touch`] is what a caller
//! does with a found key (reads every byte), so that the work measured is a
//! real caller's. Nothing here is needed to use a store.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Throughput of one kind of lookup.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Rate {
    /// Lookups per second, all threads together (the sum of every
    /// thread's own rate).
    pub lookups_per_s: f64,
    /// Wall-clock nanoseconds per lookup and thread (the mean over the
    /// threads).
    pub ns_per_lookup: f64,
}

/// What [`measure`] found: the rate, and the wrapping sum of what the
/// lookup closures returned (use it, or the compiler may drop the reads).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Lookups per second and nanoseconds per lookup.
    pub rate: Rate,
    /// The sum of the closures' results.
    pub checksum: u64,
    /// The share of a CPU each measuring thread ran on while it measured
    /// (its CPU time over its wall-clock time, the mean over the threads):
    /// below 1 where other threads or processes took CPU from it. None where
    /// the kernel does not say (`/proc/thread-self/schedstat`).
    pub cpu_share: Option<f64>,
}

/// The CPU time the calling thread has run so far: the first field of
/// `/proc/thread-self/schedstat`, in nanoseconds.
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns = s.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Calls between two looks at the clock.
const ROUND: u64 = 32;

/// Runs `threads` threads (at least one) for `time` each. Thread `t` makes
/// its closure with `make(t)` (in the thread: a place to pin it to a CPU or
/// give it buffers of its own), waits for the others, then calls `f(i)` on
/// work units `i` = `t * units / threads`, then the next, wrapping at
/// `units` (at least one), in rounds of 32 calls between looks at the
/// clock; each unit is `per_unit` lookups.
///
/// Returns the rate and the sum of what the calls returned, or the payload
/// of the panic of a measuring thread (a rate without it would be wrong).
pub fn measure<M, F>(
    threads: usize,
    time: Duration,
    units: usize,
    per_unit: usize,
    make: M,
) -> std::thread::Result<Measured>
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(usize) -> u64,
{
    let threads = threads.max(1);
    let units = units.max(1);
    let barrier = Barrier::new(threads);
    type Run = (u64, f64, u64, Option<f64>);
    let runs: Vec<std::thread::Result<Run>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (make, barrier) = (&make, &barrier);
                s.spawn(move || {
                    let mut f = make(t);
                    let mut i = t * units / threads;
                    let (mut calls, mut sum) = (0u64, 0u64);
                    barrier.wait();
                    let cpu0 = thread_cpu();
                    let t0 = Instant::now();
                    loop {
                        for _ in 0..ROUND {
                            sum = sum.wrapping_add(f(i));
                            i += 1;
                            if i == units {
                                i = 0;
                            }
                        }
                        calls += ROUND;
                        if t0.elapsed() >= time {
                            break;
                        }
                    }
                    let secs = t0.elapsed().as_secs_f64();
                    let share = cpu0
                        .zip(thread_cpu())
                        .map(|(a, b)| b.saturating_sub(a).as_secs_f64() / secs);
                    (calls * per_unit as u64, secs, sum, share)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    let mut rate = Rate {
        lookups_per_s: 0.0,
        ns_per_lookup: 0.0,
    };
    let mut checksum = 0u64;
    let mut cpu_share = Some(0.0);
    for run in runs {
        let (lookups, secs, sum, share) = run?;
        rate.lookups_per_s += lookups as f64 / secs;
        rate.ns_per_lookup += secs * 1e9 / lookups.max(1) as f64 / threads as f64;
        checksum = checksum.wrapping_add(sum);
        cpu_share = cpu_share.zip(share).map(|(a, b)| a + b / threads as f64);
    }
    Ok(Measured {
        rate,
        checksum,
        cpu_share,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_walks_its_share_of_the_ring_and_the_rates_add_up() {
        let seen = std::sync::Mutex::new(Vec::new());
        let m = measure(3, Duration::from_millis(20), 10, 4, |t| {
            let seen = &seen;
            let mut first = true;
            move |i: usize| {
                if first {
                    seen.lock().expect("lock").push((t, i));
                    first = false;
                }
                assert!(i < 10);
                1
            }
        })
        .expect("no panic");
        let mut starts = seen.into_inner().expect("lock");
        starts.sort_unstable();
        assert_eq!(starts, vec![(0, 0), (1, 3), (2, 6)]);
        assert!(m.rate.lookups_per_s > 0.0 && m.rate.ns_per_lookup > 0.0);
        assert!(m.checksum >= 3 * ROUND, "{}", m.checksum);
    }

    #[test]
    fn the_cpu_share_is_what_the_threads_ran_not_what_they_slept() {
        // One thread busy, one asleep for most of each call: about 1 and
        // well under 1, a mean of about three quarters at most.
        let m = measure(2, Duration::from_millis(200), 1, 1, |t| {
            move |_: usize| {
                if t == 1 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                1
            }
        })
        .expect("no panic");
        let share = m.cpu_share.expect("schedstat on Linux");
        assert!(share > 0.0 && share < 0.75, "{share}");
    }

    #[test]
    fn zero_threads_and_units_are_one_and_a_panic_is_reported() {
        let m = measure(0, Duration::ZERO, 0, 1, |_| |i: usize| i as u64).expect("no panic");
        assert_eq!(m.checksum, 0, "one thread, unit 0 every time");
        let r = measure(2, Duration::ZERO, 5, 1, |t| {
            move |_: usize| -> u64 {
                if t == 1 {
                    panic!("measured closure fails");
                }
                0
            }
        });
        assert!(r.is_err());
    }

    #[test]
    fn touch_reads_every_byte() {
        assert_eq!(touch(&[]), 0);
        assert_eq!(touch(&[1, 2, 3]), 6);
        let mut nine = [0u8; 9];
        nine[0] = 1;
        nine[8] = 5;
        assert_eq!(touch(&nine), 6);
    }
}
