//! Helpers of the library's unit tests.

use std::cell::Cell;
use std::path::Path;

use crate::{OpenOptions, Store};

/// A PEM-shaped public key, distinct per `tag`.
pub(crate) fn pem(tag: &str) -> Vec<u8> {
    format!("-----BEGIN PUBLIC KEY-----\n{tag}AAAA\n-----END PUBLIC KEY-----\n").into_bytes()
}

/// A store in `dir` with a small table (1009 slots).
pub(crate) fn small_store(dir: &Path) -> Store {
    let mut opts = OpenOptions::default();
    opts.params.size = 1009;
    Store::open_with(dir, &opts).expect("open a small store")
}

thread_local! {
    /// The stop point at which this thread's next write stops ([`stop_at`]).
    static STOP_AT: Cell<Option<u32>> = const { Cell::new(None) };
    /// Stop points passed since [`stop_at`].
    static PASSED: Cell<u32> = const { Cell::new(0) };
}

/// Makes this thread's writes stop, as a writer killed there would, at stop
/// point `at` (counted from 0, from now on), or never (`None`); resets the
/// count of [`stop_points_passed`].
pub(crate) fn stop_at(at: Option<u32>) {
    STOP_AT.set(at);
    PASSED.set(0);
}

/// How many stop points this thread passed since [`stop_at`].
pub(crate) fn stop_points_passed() -> u32 {
    PASSED.get()
}

/// A stop point: true when the writer is to stop here ([`stop_at`]).
pub(crate) fn stop_here() -> bool {
    let n = PASSED.get();
    PASSED.set(n + 1);
    STOP_AT.get() == Some(n)
}
