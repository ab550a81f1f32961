//! A migration into another directory than the tree (`--out`, a cluster
//! peer's `cluster_pki_dir`) writes the `localfs_key` tree there too, and
//! `verify` reports a live store without one, judged by
//! Salt 3008.5's real `ReqServerChannel.validate_token`
//! (salt/channel/server.py, run by the test kit's `py/validate_token.py`),
//! which reads `<cluster_pki_dir>/minions/<id>` from disk on every request
//! of a signed-in minion of a cluster peer.

use super::{keygen, keys_and_pki, verdicts};
use crate::common;
use crate::common::{finding_whats, keycache_1009, ok, s, sized, ParamsExt, TREE_DIRS};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use keycache::{KeyState, MinionId, OpenOptions, Store};
use serde_json::Value;

/// The ids among `ids` that pass Salt's validate_token on a cluster peer
/// whose `cluster_pki_dir` is `cluster` (its `pki_dir` is `pki`).
fn passing(keys: &Path, pki: &Path, cluster: &Path, ids: &[&str]) -> Vec<String> {
    let v = common::run_py(
        "validate_token.py",
        &[
            "check",
            "--keys",
            s(keys),
            "--pki-dir",
            s(pki),
            "--cluster-pki-dir",
            s(cluster),
            "--ids",
            &ids.join(","),
        ],
        None,
    );
    verdicts(&v)
        .into_iter()
        .filter(|(_, ok)| *ok)
        .map(|(id, _)| id)
        .collect()
}

/// A master's pki_dir under `t` with key files of Salt key pairs (made in
/// `t/keys`): `accepted` in `minions/`, `pending` in `minions_pre/`;
/// returns (keys, pki, cluster) where `cluster` (not created) is where the
/// banks are to go.
fn master(t: &Path, accepted: &[&str], pending: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let keys = t.join("keys");
    let pki = t.join("pki");
    for d in TREE_DIRS {
        std::fs::create_dir_all(pki.join(d)).unwrap();
    }
    std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o700)).unwrap();
    let all: Vec<&str> = accepted.iter().chain(pending).copied().collect();
    for (id, pem) in keygen(&keys, &all) {
        let dir = if accepted.contains(&id.as_str()) {
            "minions"
        } else {
            "minions_pre"
        };
        std::fs::write(pki.join(dir).join(&id), pem).unwrap();
    }
    (keys, pki, t.join("cluster"))
}

fn exit_code(o: &Output) -> Option<i32> {
    o.status.code()
}

/// `migrate PKI --out CLUSTER` leaves a store Salt's validate_token
/// accepts the accepted minions of, and keeps in step: a later accept
/// passes, `verify` is clean. Before the fix no tree was written: every
/// accepted minion was refused, and later accepts kept none.
#[test]
fn migrate_out_writes_the_tree_where_salt_reads_it() {
    let t = tempfile::tempdir().unwrap();
    let (keys, pki, cluster) = master(t.path(), &["web-1", "web-2"], &["web-3"]);
    let ids = ["web-1", "web-2", "web-3"];
    let out = ok(&keycache_1009(&["migrate", s(&pki), "--out", s(&cluster)]));
    assert_eq!(passing(&keys, &pki, &cluster, &ids), ["web-1", "web-2"]);
    assert!(
        out.contains(&format!(
            "key tree (minions/, ...) written into {}: 3 files written, 0 removed",
            cluster.display()
        )),
        "{out}"
    );
    for d in TREE_DIRS {
        assert!(cluster.join(d).is_dir(), "{d}");
    }
    let mode = std::fs::metadata(cluster.join("minions/web-1"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    ok(&keycache_1009(&["accept", s(&cluster), "web-3"]));
    assert_eq!(passing(&keys, &pki, &cluster, &ids), ids);
    ok(&keycache_1009(&[
        "reject",
        s(&cluster),
        "web-2",
        "--include-all",
    ]));
    assert_eq!(passing(&keys, &pki, &cluster, &ids), ["web-1", "web-3"]);
    ok(&keycache_1009(&["verify", s(&cluster)]));

    // Migrated again: its files are older than the store's accept and
    // rejection, refused (nothing written) unless asked; then the tree
    // migrated wins (web-2 accepted, web-3 pending there), in the banks and
    // in the key tree alike.
    let o = keycache_1009(&["migrate", s(&pki), "--out", s(&cluster)]);
    assert_eq!(exit_code(&o), Some(2), "{}", common::stderr(&o));
    assert_eq!(passing(&keys, &pki, &cluster, &ids), ["web-1", "web-3"]);
    ok(&keycache_1009(&[
        "migrate",
        s(&pki),
        "--out",
        s(&cluster),
        "--replace-states",
    ]));
    assert_eq!(passing(&keys, &pki, &cluster, &ids), ["web-1", "web-2"]);
    ok(&keycache_1009(&["verify", s(&cluster)]));
}

/// The store directory's own tree holds a key for an id that neither the
/// tree migrated nor the banks hold: writing the migrated store's tree
/// would remove it, so the migration refuses (exit 2, nothing written)
/// unless `--replace`, which drops it from the tree as from the banks.
/// An entry that is not a regular file there is refused before anything is
/// written.
#[test]
fn migrate_out_never_drops_a_key_of_the_target_tree_unasked() {
    let t = tempfile::tempdir().unwrap();
    let (keys, pki, cluster) = master(t.path(), &["web-1"], &[]);
    let extra = t.path().join("extra");
    let other = keygen(&extra, &["db-1", ".db"]);
    std::fs::create_dir_all(cluster.join("minions")).unwrap();
    std::fs::write(cluster.join("minions/db-1"), &other[0].1).unwrap();
    // A dot-id's key file is a key file too (validate_token reads it).
    std::fs::write(cluster.join("minions/.db"), &other[1].1).unwrap();
    let o = keycache_1009(&["migrate", s(&pki), "--out", s(&cluster)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(exit_code(&o), Some(2), "{err}");
    assert!(
        err.contains("db-1") && err.contains(".db") && err.contains("--replace"),
        "{err}"
    );
    assert!(!cluster.join(".mmap_keys.idx").exists(), "banks written");
    assert!(!cluster.join("minions/web-1").exists(), "tree written");
    assert_eq!(
        passing(&extra, &pki, &cluster, &["db-1", ".db"]),
        ["db-1", ".db"],
        "the target's keys are still there"
    );

    ok(&keycache_1009(&[
        "migrate",
        s(&pki),
        "--out",
        s(&cluster),
        "--replace",
    ]));
    assert_eq!(passing(&keys, &pki, &cluster, &["web-1"]), ["web-1"]);
    assert!(passing(&extra, &pki, &cluster, &["db-1", ".db"]).is_empty());
    assert!(!cluster.join("minions/.db").exists());

    // A symlink under an id's name in the target's tree: refused, by name.
    let outside = t.path().join("outside");
    std::fs::write(&outside, &other[0].1).unwrap();
    std::fs::create_dir_all(pki.join("minions_pre")).unwrap();
    std::os::unix::fs::symlink(&outside, cluster.join("minions_pre/web-1")).unwrap();
    let before = std::fs::read(cluster.join(".mmap_keys.idx")).unwrap();
    let o = keycache_1009(&["migrate", s(&pki), "--out", s(&cluster)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(exit_code(&o), Some(2), "{err}");
    assert!(err.contains("minions_pre/web-1"), "{err}");
    assert_eq!(
        std::fs::read(cluster.join(".mmap_keys.idx")).unwrap(),
        before
    );
}

/// `verify` reports a store with accepted keys and no `minions` tree as a
/// finding (exit 1), which Salt's validate_token confirms (every accepted
/// minion refused); `--tree never` leaves the tree out; `--repair` writes
/// it, and the minions pass. Before the fix verify said clean.
#[test]
fn verify_reports_a_live_store_without_a_key_tree() {
    let (t, keys, pki) = keys_and_pki();
    let cluster = t.path().join("cluster");
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::create_dir_all(&cluster).unwrap();
    let pairs = keygen(&keys, &["web-1", "web-2"]);
    let store = Store::open_with(
        &cluster,
        &OpenOptions {
            rebuild_settle: std::time::Duration::ZERO,
            ..sized(1009).options()
        },
    )
    .unwrap();
    for (id, state, (_, pem)) in [
        ("web-1", KeyState::Accepted, &pairs[0]),
        ("web-2", KeyState::Pending, &pairs[1]),
    ] {
        store
            .put(&MinionId::new(id).unwrap(), state, pem.as_bytes())
            .unwrap();
    }
    drop(store);
    assert!(passing(&keys, &pki, &cluster, &["web-1"]).is_empty());

    let o = keycache_1009(&["verify", s(&cluster), "--json"]);
    assert_eq!(
        exit_code(&o),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let what = finding_whats(&v);
    assert_eq!(what.len(), 1, "{what:?}");
    assert!(
        what[0].contains("no key tree") && what[0].contains("1 accepted"),
        "{what:?}"
    );
    let text =
        String::from_utf8_lossy(&keycache_1009(&["verify", s(&cluster)]).stdout).into_owned();
    assert!(text.contains("validate_token"), "{text}");
    ok(&keycache_1009(&["verify", s(&cluster), "--tree", "never"]));

    let out = ok(&keycache_1009(&["verify", s(&cluster), "--repair"]));
    assert!(out.contains("tree: wrote"), "{out}");
    assert_eq!(
        passing(&keys, &pki, &cluster, &["web-1", "web-2"]),
        ["web-1"]
    );
    ok(&keycache_1009(&["verify", s(&cluster)]));
}
