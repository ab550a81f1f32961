//! The readers' clock: a cheap monotonic time for their staleness checks.

use rustix::time::{clock_gettime, ClockId};

/// A cheap monotonic clock in nanoseconds (CLOCK_MONOTONIC_COARSE, a few
/// milliseconds of resolution, read through the vDSO), for the readers'
/// staleness checks.
#[inline]
pub(crate) fn coarse_now_ns() -> u64 {
    let ts = clock_gettime(ClockId::MonotonicCoarse);
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_moves_forward_and_counts_nanoseconds() {
        let a = coarse_now_ns();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = coarse_now_ns();
        assert!(a > 0 && b > a, "{a} {b}");
        // coarse: a few milliseconds of resolution, but nanoseconds as unit
        assert!(b - a >= 10_000_000 && b - a < 10_000_000_000, "{}", b - a);
    }
}
