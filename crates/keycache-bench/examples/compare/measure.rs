//! The measuring loop (`keycache_bench::measure::measure`, each thread
//! pinned to a CPU), the samples of the rounds and the run's settings.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value as Json};

use crate::util::{die, median};

/// Runs `threads` threads for `seconds` with the library's measuring loop
/// ([`keycache_bench::measure::measure`]), each thread pinned to a CPU before it
/// makes its closure: thread `t` calls `f(i)` on units i = start_t,
/// start_t+1, ... (wrapping at `units`, thread starts spread evenly), each
/// unit being `per_unit` lookups. Returns lookups per second, all threads
/// together.
pub(crate) fn measure<M, F>(
    threads: usize,
    seconds: f64,
    units: usize,
    per_unit: usize,
    make: M,
) -> f64
where
    M: Fn() -> F + Sync,
    F: FnMut(usize) -> u64,
{
    measure_cpu(threads, seconds, units, per_unit, make).0
}

/// [`measure`], and the share of a CPU each thread ran on meanwhile (the
/// mean; NaN where the kernel does not say).
pub(crate) fn measure_cpu<M, F>(
    threads: usize,
    seconds: f64,
    units: usize,
    per_unit: usize,
    make: M,
) -> (f64, f64)
where
    M: Fn() -> F + Sync,
    F: FnMut(usize) -> u64,
{
    let time = Duration::from_secs_f64(seconds);
    let m = keycache_bench::measure::measure(threads, time, units, per_unit, |t| {
        pin_to_cpu(t);
        make()
    })
    .unwrap_or_else(|_| die("a measuring thread panicked"));
    black_box(m.checksum);
    (m.rate.lookups_per_s, m.cpu_share.unwrap_or(f64::NAN))
}

/// Pins the calling thread to CPU `cpu` (modulo the CPUs there are): on a
/// small VM an unpinned lone thread gets moved between vCPUs and measures
/// slower than it is.
pub(crate) fn pin_to_cpu(cpu: usize) {
    keycache_testkit::sys::pin_to_cpu(cpu);
}

/// Samples: contender -> measurement key -> values.
#[derive(Default)]
pub(crate) struct Samples(pub(crate) BTreeMap<String, BTreeMap<String, Vec<f64>>>);

impl Samples {
    pub(crate) fn add(&mut self, contender: &str, key: &str, v: f64) {
        self.0
            .entry(contender.to_string())
            .or_default()
            .entry(key.to_string())
            .or_default()
            .push(v);
    }
    pub(crate) fn med(&self, contender: &str, key: &str) -> f64 {
        self.0
            .get(contender)
            .and_then(|m| m.get(key))
            .map_or(f64::NAN, |v| median(v))
    }
    /// The contenders of `order` that were measured, in that order.
    pub(crate) fn present<'a>(
        &'a self,
        order: impl IntoIterator<Item = &'a str> + 'a,
    ) -> impl Iterator<Item = &'a str> + 'a {
        order.into_iter().filter(|c| self.0.contains_key(*c))
    }
    pub(crate) fn to_json(&self) -> Json {
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

pub(crate) struct Cfg {
    pub(crate) rounds: usize,
    pub(crate) seconds: f64,
    pub(crate) salt_seconds: f64,
    pub(crate) python: Option<PathBuf>,
    pub(crate) salt: bool,
    pub(crate) lmdb: bool,
    pub(crate) maps: bool,
}
