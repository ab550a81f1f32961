//! Helpers of the crate's unit tests.

use std::path::Path;

use keycache::{OpenOptions, Params, Store};

/// A PEM-shaped public key whose body is `tag`: distinct per tag.
pub(crate) fn pem(tag: &str) -> Vec<u8> {
    let body = format!("{tag}AAAA");
    format!("-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n").into_bytes()
}

/// A store in `dir` of Salt's default layout but a small table (1009
/// slots).
pub(crate) fn small_store(dir: &Path) -> Store {
    let params = Params {
        size: 1009,
        ..Params::default()
    };
    let opts = OpenOptions {
        params,
        ..OpenOptions::default()
    };
    Store::open_with(dir, &opts).expect("open a small store")
}
