//! The master's own keys across the commands that rebuild or fill a store,
//! judged by Salt 3008.5's real `MasterKeys`
//! under `mmap_key` (the test kit's `py/master_keys.py`): a compaction into
//! another size moves the `master_keys` bank with the key banks; a
//! migration finds the master's pair by the config's `id` and refuses when
//! it cannot; a migration run again never replaces a newer pair that Salt
//! wrote into the bank unless asked.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::salt_master::{
    assert_bank_private, check_served, crypto_scratch, state_dirs, Master,
};
use crate::common::{check_fails, keycache_ok_texts, small, stderr, Params, ParamsExt};
use keycache::master_keys::{self, MasterKeyOptions};
use serde_json::{json, Value};

const SIZE: u64 = 1009;

fn layout(size: u64) -> Params {
    small(size, 1 << 30)
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
    let Some(t) = crypto_scratch("compact_to_size_moves_the_master_keys_bank") else {
        return;
    };
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
    keycache_ok_texts(&["migrate", &pki, "--size", &SIZE.to_string()]);
    // Salt's MmapCache creates bank files with its umask.
    let heap = m.pki.join(".mmap_master.idx.heap");
    std::fs::set_permissions(&heap, std::fs::Permissions::from_mode(0o644)).unwrap();

    let (out, _) = keycache_ok_texts(&[
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
    let (out, _) = keycache_ok_texts(&["list", &pki, "--size", "2003", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["minions"], json!(["web-1"]), "{v}");
}

/// A store that an earlier `compact --to-size` left with `master_keys` at
/// the old size (the key banks alone rebuilt, as before the fix) is mended
/// by `compact` without `--to-size`: the bank moves to the key banks' size
/// and Salt serves the master's keys again.
#[test]
fn compact_mends_a_master_keys_bank_left_at_the_old_size() {
    let Some(t) = crypto_scratch("compact_mends_a_master_keys_bank_left_at_the_old_size") else {
        return;
    };
    let mut m = Master::new(t.path(), "m1_master", layout(SIZE));
    let before = m.setup(false);
    state_dirs(&m.pki);
    let pki = m.pki.display().to_string();
    keycache_ok_texts(&["migrate", &pki, "--size", &SIZE.to_string()]);
    // The key banks alone into 2003 slots, as the command did before.
    let store = keycache::Store::open_with(&m.pki, &layout(SIZE).options()).unwrap();
    keycache::rebuild::compact(store.keys_table(), Some(2003)).unwrap();
    keycache::rebuild::compact(store.denied_table(), Some(2003)).unwrap();
    drop(store);
    m.layout = layout(2003);
    let broken = m.try_run("mmap_key", &["serve"]);
    assert!(!broken.status.success(), "Salt read a bank of another size");

    keycache_ok_texts(&["compact", &pki, "--size", "2003"]);
    let files = files_of(&m.pki, None, "m1_master");
    check_served(&m.serve(&files), &before, &files);
    let len = std::fs::metadata(m.pki.join(".mmap_master.idx"))
        .unwrap()
        .len();
    assert_eq!(len, 2003 * 96);
    assert_bank_private(&m.pki);
}

/// Runs the keycache binary in `cwd`.
fn keycache_in(cwd: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_keycache"))
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .output()
        .expect("run keycache")
}

/// Asserts that `o` failed with exit code 2; returns its stderr.
fn refused(o: &std::process::Output) -> String {
    check_fails("keycache", o, 2);
    stderr(o)
}

/// Every regular file under `dir`, with its bytes and mode, to show that a
/// refused command wrote nothing.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                let bytes = if m.is_file() {
                    std::fs::read(e.path()).unwrap()
                } else {
                    Vec::new()
                };
                out.push((
                    e.path().display().to_string(),
                    bytes,
                    m.permissions().mode(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// A cluster peer with id `id` (as its config sets it), its pki_dir and
/// cluster_pki_dir under `root`, whose keys Salt's MasterKeys created under
/// localfs_key; a minion key in its pki_dir's tree, and a master config
/// (`root/etc/master`) that Salt would read: mmap_key, the cluster, the id.
fn cluster_peer(root: &Path, id: &str) -> (Master, Value) {
    let cluster = common::salt_master::private_dir(&root.join("cluster"));
    let mut m = Master::new(root, id, layout(SIZE));
    m.cluster = Some(("c1".into(), cluster.clone()));
    let before = m.setup(false);
    assert!(cluster
        .join(format!("peers/{}.pub", id.trim_end_matches("_master")))
        .exists());
    // The minion tree in both directories: `migrate -c` with cluster_id
    // reads cluster_pki_dir's (as Salt's rebuild_from_localfs does),
    // `migrate PKI_DIR --out` reads PKI_DIR's.
    for d in [&m.pki, &cluster] {
        state_dirs(d);
        std::fs::write(d.join("minions/web-1"), common::pem("web-1", 5).as_bytes()).unwrap();
    }
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(
        root.join("etc/master"),
        format!(
            "pki_dir: {}\ncluster_id: c1\ncluster_pki_dir: {}\nid: {id}\n\
             keys.cache_driver: mmap_key\nmmap_key_size: {SIZE}\n",
            m.pki.display(),
            cluster.display()
        ),
    )
    .unwrap();
    (m, before)
}

/// Item 7: a cluster peer migrated with a relative PKI_DIR and its master
/// config: the master's pair is found by the config's `id` (as Salt's
/// MasterKeys derives its names), so Salt under mmap_key serves the same
/// master and cluster keys; before the fix the id was guessed from the
/// `master.pem` link compared with the path as typed, the pair was left
/// out, and Salt generated a new one and stopped ("Shared key does not
/// match").
#[test]
fn cluster_peer_with_a_relative_pki_dir_keeps_its_pair_by_the_config_id() {
    let Some(t) =
        crypto_scratch("cluster_peer_with_a_relative_pki_dir_keeps_its_pair_by_the_config_id")
    else {
        return;
    };
    let (m, before) = cluster_peer(t.path(), "m1");
    let o = keycache_in(t.path(), &["migrate", "-c", "etc", "pki"]);
    let out = common::ok(&o);
    let cluster = m.cluster.as_ref().unwrap().1.clone();
    let files = files_of(&m.pki, Some(&cluster), "m1");
    assert!(files.iter().any(|(n, _)| n == "m1.pem"), "{files:?}");
    check_served(&m.serve(&files), &before, &files);
    assert!(out.contains("master id m1, from id, "), "{out}");
}

/// Item 7, without a master config: the id is read off the `master.pem`
/// link (absolute, as Salt writes it) compared with a relative PKI_DIR
/// resolved, so `migrate pki --out cluster` keeps the peer's pair.
#[test]
fn a_relative_pki_dir_matches_the_master_pem_link_resolved() {
    let Some(t) = crypto_scratch("a_relative_pki_dir_matches_the_master_pem_link_resolved") else {
        return;
    };
    let (m, before) = cluster_peer(t.path(), "m1_master");
    let o = keycache_in(
        t.path(),
        &[
            "migrate",
            "pki",
            "--out",
            "cluster",
            "--size",
            &SIZE.to_string(),
        ],
    );
    let out = common::ok(&o);
    let cluster = m.cluster.as_ref().unwrap().1.clone();
    let files = files_of(&m.pki, Some(&cluster), "m1_master");
    check_served(&m.serve(&files), &before, &files);
    assert!(
        out.contains("master id m1_master, from the master.pem symlink"),
        "{out}"
    );
}

/// Item 7: when the master's pair is not found under the names Salt looks
/// for (here an `id` that is not the one the keys were made under), the
/// migration refuses, exit 2, and writes nothing; `--no-master-keys`
/// migrates the key banks and leaves the master_keys bank alone.
#[test]
fn migrate_refuses_when_the_masters_pair_is_not_found() {
    let Some(t) = crypto_scratch("migrate_refuses_when_the_masters_pair_is_not_found") else {
        return;
    };
    let (m, _) = cluster_peer(t.path(), "m1");
    let conf = t.path().join("etc/master");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, text.replace("id: m1\n", "id: m9\n")).unwrap();
    let all = snapshot(t.path());
    for dry in [false, true] {
        let mut args = vec!["migrate", "-c", "etc", "pki"];
        if dry {
            args.push("--dry-run");
        }
        let err = refused(&keycache_in(t.path(), &args));
        assert!(
            err.contains("m9.pem")
                && err.contains("master.pem")
                && err.contains("--no-master-keys"),
            "{err}"
        );
        assert!(err.contains("nothing was written"), "{err}");
        assert_eq!(snapshot(t.path()), all, "a refused migration wrote");
    }
    let o = keycache_in(
        t.path(),
        &["migrate", "-c", "etc", "pki", "--no-master-keys"],
    );
    common::ok(&o);
    let cluster = &m.cluster.as_ref().unwrap().1;
    assert!(cluster.join(".mmap_keys.idx").exists());
    assert!(!cluster.join(".mmap_master.idx").exists());
}

/// Salt's MasterKeys writes a key pair made elsewhere (another master's
/// setup with the same id) into `m`'s master_keys bank, as Salt itself
/// stores a key it generates or rotates: the bank now holds a newer pair
/// than the files. Returns the newer pair's public keys as Salt serves
/// them.
fn newer_pair_into_the_bank(m: &Master) -> Value {
    let other_root = m.root.join("other");
    std::fs::create_dir_all(&other_root).unwrap();
    let other = Master::new(&other_root, &m.id, m.layout);
    let newer = other.setup(false);
    let mid = m.id.trim_end_matches("_master");
    for ext in ["pem", "pub"] {
        let bytes = std::fs::read(other.pki.join(format!("{mid}.{ext}"))).unwrap();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        m.run(
            "mmap_key",
            &[
                "store",
                "--name",
                &format!("{mid}.{ext}"),
                "--value-hex",
                &hex,
                "--as",
                "str",
            ],
        );
    }
    let served = m.serve(&[]);
    assert_eq!(served["generated"], json!([]), "{served}");
    assert_eq!(served["keys"]["master_pub"], newer["master_pub"]);
    newer
}

/// Item 8: a migration run again after Salt wrote a newer master pair into
/// the bank refuses by default (exit 2, nothing written: neither the key
/// banks nor master_keys), so Salt keeps serving the newer key; with
/// `--no-master-keys` the key banks are migrated and the bank left alone;
/// `--replace-master-keys` puts the files' pair back. Before the fix the
/// run replaced the newer private key ("replaced (the bank held other
/// bytes)") and exited 0.
#[test]
fn migrate_again_never_replaces_a_newer_master_pair_unless_asked() {
    let Some(t) = crypto_scratch("migrate_again_never_replaces_a_newer_master_pair_unless_asked")
    else {
        return;
    };
    let m = Master::new(t.path(), "m1_master", layout(SIZE));
    let before = m.setup(false);
    state_dirs(&m.pki);
    let pki = m.pki.display().to_string();
    let size = SIZE.to_string();
    keycache_ok_texts(&["migrate", &pki, "--size", &size]);
    let newer = newer_pair_into_the_bank(&m);
    assert_ne!(newer["master_pub"], before["master_pub"]);
    // A new minion key since, which a refused run must not migrate either.
    std::fs::write(
        m.pki.join("minions_pre/web-2"),
        common::pem("web-2", 5).as_bytes(),
    )
    .unwrap();

    let all = snapshot(&m.pki);
    for dry in [false, true] {
        let mut args = vec!["migrate", pki.as_str(), "--size", &size];
        if dry {
            args.push("--dry-run");
        }
        let err = refused(&common::keycache(&args));
        assert!(
            err.contains("m1.pem") && err.contains("--replace-master-keys"),
            "{err}"
        );
        assert_eq!(snapshot(&m.pki), all, "a refused migration wrote");
    }
    let served = m.serve(&[]);
    assert_eq!(served["generated"], json!([]));
    assert_eq!(served["keys"]["master_pub"], newer["master_pub"]);

    keycache_ok_texts(&["migrate", &pki, "--size", &size, "--no-master-keys"]);
    let served = m.serve(&[]);
    assert_eq!(served["keys"]["master_pub"], newer["master_pub"]);
    let (out, _) = keycache_ok_texts(&["list", &pki, "--size", &size, "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["minions_pre"], json!(["web-2"]), "{v}");

    let (out, _) = keycache_ok_texts(&["migrate", &pki, "--size", &size, "--replace-master-keys"]);
    assert!(out.contains("replaced (--replace-master-keys"), "{out}");
    let files = files_of(&m.pki, None, "m1_master");
    check_served(&m.serve(&files), &before, &files);
    assert_bank_private(&m.pki);
}
