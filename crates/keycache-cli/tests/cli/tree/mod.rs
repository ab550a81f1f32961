//! The `localfs_key` tree: migrate's `--out`, the tree kept in step with
//! the store, export.

mod export;
mod migrate;
mod stale_migrate;
mod sync;

use std::path::PathBuf;

// Salt key pairs for the minions: the test kit's validate_token.py keygen.
use crate::common::vt_keygen as keygen;

/// validate_token.py's verdicts in its JSON `v`: (id, passes), in its order.
fn verdicts(v: &serde_json::Value) -> Vec<(String, bool)> {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                r["valid"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A new temporary directory and the paths of its `keys/` (the minions'
/// key pairs) and `pki/` (the master's), neither made yet.
fn keys_and_pki() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (keys, pki) = (t.path().join("keys"), t.path().join("pki"));
    (t, keys, pki)
}
