//! Helpers of the crate's unit tests.

use std::path::Path;

use keycache::{OpenOptions, Store};

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
