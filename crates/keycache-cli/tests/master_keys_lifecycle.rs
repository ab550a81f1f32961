//! The master's own keys across the commands that rebuild or fill a store
//! (issue 19, items 6 to 8), judged by Salt 3008.5's real `MasterKeys`
//! under `mmap_key` (the test kit's `py/master_keys.py`): a compaction into
//! another size moves the `master_keys` bank with the key banks; a
//! migration finds the master's pair by the config's `id` and refuses when
//! it cannot; a migration run again never replaces a newer pair that Salt
//! wrote into the bank unless asked.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::salt_master::{assert_bank_private, check_served, salt_crypto, state_dirs, Master};
use common::Layout;
use keycache::master_keys::{self, MasterKeyOptions};
use serde_json::{json, Value};

const SIZE: u64 = 1009;

fn layout(size: u64) -> Layout {
    Layout::small(size, 1 << 30)
}

/// Runs the keycache binary, which must succeed; returns stdout and stderr.
fn keycache_ok(args: &[&str]) -> (String, String) {
    let o = common::keycache(args);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "keycache {args:?}: {out}{err}");
    (out, err)
}

/// The files collected for `id`'s master from `pki` (and `cluster`), as
/// (name, path) for [`check_served`].
fn files_of(pki: &Path, cluster: Option<&Path>, id: &str) -> Vec<(String, std::path::PathBuf)> {
    master_keys::collect(pki, cluster, &MasterKeyOptions::new(id))
        .unwrap()
        .files
        .into_iter()
        .map(|f| (f.name, f.path))
        .collect()
}

/// Item 6: `compact --to-size N` rebuilds the `master_keys` bank into the
/// new size with the key banks, so that a master started with
/// `mmap_key_size: N` serves its own keys (before the fix Salt's
/// `MmapCache` refused the old-size index: "Index file size mismatch"), and
/// the bank's files stay 0600 even where Salt had made them 0644.
#[test]
fn compact_to_size_moves_the_master_keys_bank() {
    if !salt_crypto("compact_to_size_moves_the_master_keys_bank") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mut m = Master::new(t.path(), "m1_master", layout(SIZE));
    m.sign = true;
    let before = m.setup(true);
    state_dirs(&m.pki);
    std::fs::write(
        m.pki.join("minions/web-1"),
        common::pem("web-1", 5).as_bytes(),
    )
    .unwrap();
    let pki = m.pki.display().to_string();
    keycache_ok(&["migrate", &pki, "--size", &SIZE.to_string()]);
    // Salt's MmapCache creates bank files with its umask.
    let heap = m.pki.join(".mmap_master.idx.heap");
    std::fs::set_permissions(&heap, std::fs::Permissions::from_mode(0o644)).unwrap();

    let (out, _) = keycache_ok(&[
        "compact",
        &pki,
        "--size",
        &SIZE.to_string(),
        "--to-size",
        "2003",
    ]);
    m.layout = layout(2003);
    let files = files_of(&m.pki, None, "m1_master");
    check_served(&m.serve(&files), &before, &files);
    for idx in [".mmap_keys.idx", ".mmap_denied.idx", ".mmap_master.idx"] {
        let len = std::fs::metadata(m.pki.join(idx)).unwrap().len();
        assert_eq!(len, 2003 * 96, "{idx}");
    }
    assert!(assert_bank_private(&m.pki) >= 3);
    assert!(out.contains("master_keys"), "{out}");
    let (out, _) = keycache_ok(&["list", &pki, "--size", "2003", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["minions"], json!(["web-1"]), "{v}");
}

/// A store that an earlier `compact --to-size` left with `master_keys` at
/// the old size (the key banks alone rebuilt, as before the fix) is mended
/// by `compact` without `--to-size`: the bank moves to the key banks' size
/// and Salt serves the master's keys again.
#[test]
fn compact_mends_a_master_keys_bank_left_at_the_old_size() {
    if !salt_crypto("compact_mends_a_master_keys_bank_left_at_the_old_size") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mut m = Master::new(t.path(), "m1_master", layout(SIZE));
    let before = m.setup(false);
    state_dirs(&m.pki);
    let pki = m.pki.display().to_string();
    keycache_ok(&["migrate", &pki, "--size", &SIZE.to_string()]);
    // The key banks alone into 2003 slots, as the command did before.
    let store = keycache::Store::open_with(&m.pki, &layout(SIZE).options()).unwrap();
    keycache::rebuild::compact(store.keys_table(), Some(2003)).unwrap();
    keycache::rebuild::compact(store.denied_table(), Some(2003)).unwrap();
    drop(store);
    m.layout = layout(2003);
    let broken = m.try_run("mmap_key", &["serve"]);
    assert!(!broken.status.success(), "Salt read a bank of another size");

    keycache_ok(&["compact", &pki, "--size", "2003"]);
    let files = files_of(&m.pki, None, "m1_master");
    check_served(&m.serve(&files), &before, &files);
    let len = std::fs::metadata(m.pki.join(".mmap_master.idx"))
        .unwrap()
        .len();
    assert_eq!(len, 2003 * 96);
    assert_bank_private(&m.pki);
}
