//! A hybrid logical clock (Kulkarni et al., 2014): the stamps that order
//! the versions of an entry across peers ([`crate::history`]).
//!
//! A stamp is a `u64` of nanoseconds since the Unix epoch. A clock issues
//! `max(wall, last + 1)`, so its stamps grow even when the wall clock
//! steps back, and [`Hlc::receive`] moves it past every stamp a peer sent:
//! a change made after a merge is stamped after everything the merge took
//! in (causality), whatever the two wall clocks say. Between changes that
//! did not see each other, stamps follow the wall clocks: a master whose
//! clock runs ahead by `s` wins such races within `s`. Merges refuse a peer
//! whose clock is ahead by more than a bound ([`crate::merge::MergeOptions::max_skew`]).

use std::sync::Arc;

/// Where a clock reads the wall time: unix nanoseconds. The default is the
/// system clock; tests and simulations give their own.
#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl WallClock {
    /// A wall clock that calls `f`.
    pub fn new(f: impl Fn() -> u64 + Send + Sync + 'static) -> WallClock {
        WallClock(Arc::new(f))
    }

    /// The wall time now, in unix nanoseconds.
    pub fn now(&self) -> u64 {
        (self.0)()
    }
}

impl Default for WallClock {
    fn default() -> WallClock {
        WallClock::new(keycache::files::now_ns)
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WallClock")
    }
}

/// A hybrid logical clock: the last stamp issued or received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hlc {
    /// The last stamp issued or received.
    pub last: u64,
}

impl Hlc {
    /// A new stamp: the wall time, or one past the last stamp when the wall
    /// clock is behind it.
    pub fn tick(&mut self, wall: &WallClock) -> u64 {
        self.last = wall.now().max(self.last.saturating_add(1));
        self.last
    }

    /// Takes in a stamp from a peer: later stamps issued here come after it.
    pub fn receive(&mut self, stamp: u64) {
        self.last = self.last.max(stamp);
    }
}

/// A stamp as a person reads it: UTC, to the millisecond.
pub use keycache::clock::show_ns as show;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn stamps_grow_when_the_wall_clock_steps_back() {
        let t = Arc::new(AtomicU64::new(1_000));
        let t2 = t.clone();
        let wall = WallClock::new(move || t2.load(Ordering::SeqCst));
        let mut c = Hlc::default();
        assert_eq!(c.tick(&wall), 1_000);
        t.store(500, Ordering::SeqCst);
        assert_eq!(c.tick(&wall), 1_001);
        c.receive(5_000);
        assert_eq!(c.tick(&wall), 5_001);
        t.store(9_000, Ordering::SeqCst);
        assert_eq!(c.tick(&wall), 9_000);
    }

    #[test]
    fn shows_utc() {
        assert_eq!(show(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(show(1_764_000_000_123_000_000), "2025-11-24T16:00:00.123Z");
    }
}
