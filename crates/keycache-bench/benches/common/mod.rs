//! What the criterion benches share (a module, not a bench target).

use std::time::Duration;

use criterion::Criterion;

/// Criterion's settings for a bench: `samples` per benchmark, `warm_up` and
/// `measure` time (ms, s).
pub fn criterion(samples: usize, warm_up_ms: u64, measure_s: u64) -> Criterion {
    Criterion::default()
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(warm_up_ms))
        .measurement_time(Duration::from_secs(measure_s))
}
