//! Salt's own `ReqServerChannel.validate_token`, run by the test kit's
//! `py/validate_token.py`, as the tests that judge a key tree ask it.

use std::path::Path;

use keycache_testkit::common::run_py;

/// Whether Salt's validate_token lets each of `ids` in, the minions'
/// private keys in `keys` and the master's pki_dir `pki`: (id, its
/// `valid`, `None` when missing) in the script's order.
pub fn check(keys: &Path, pki: &Path, ids: &[&str]) -> Vec<(String, Option<bool>)> {
    let v = run_py(
        "validate_token.py",
        &[
            "check",
            "--keys",
            &keys.to_string_lossy(),
            "--pki-dir",
            &pki.to_string_lossy(),
            "--ids",
            &ids.join(","),
        ],
        None,
    );
    v["results"]
        .as_array()
        .expect("validate_token.py's results")
        .iter()
        .map(|r| {
            let id = r["id"].as_str().expect("an id").to_owned();
            (id, r["valid"].as_bool())
        })
        .collect()
}
