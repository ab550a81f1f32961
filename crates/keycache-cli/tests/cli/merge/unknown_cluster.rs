//! A merge refuses a store or a snapshot that names no cluster (neither
//! `cluster.pub` nor `master.pub`): a real master always has its key pair,
//! and without one a merge cannot tell another cluster's keys from a
//! peer's. Exit 2, the message names the missing files (this store's
//! directory, or the snapshot's file) and the flag, and every file of the
//! store directory (banks, history, tree) and the base file is what it
//! was; `--allow-unknown-cluster` merges all the same.

use std::path::{Path, PathBuf};

use crate::common::{files, files_changed, kc, pem, small, stderr, Params, ParamsExt};
use keycache::{KeyState, MinionId, Store};

fn layout() -> Params {
    small(1009, 16 * 1024)
}

/// The cluster's public key, as both masters hold it.
fn master_pub() -> String {
    pem("the-cluster", 451)
}

/// A store in `root/name` holding `ids` accepted, with the cluster's
/// `master.pub`, and a key tree (`minions/`).
fn store(root: &Path, name: &str, ids: &[&str]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("minions")).unwrap();
    std::fs::write(dir.join("master.pub"), master_pub()).unwrap();
    let st = Store::open_with(&dir, &layout().options()).unwrap();
    for id in ids {
        let key = pem(id, 451);
        st.put(
            &MinionId::new(*id).unwrap(),
            KeyState::Accepted,
            key.as_bytes(),
        )
        .unwrap();
        std::fs::write(dir.join("minions").join(id), key).unwrap();
    }
    dir
}

/// `keycache snapshot DIR -o OUT`.
fn snapshot(dir: &Path, out: &Path) {
    kc().arg("snapshot")
        .arg(dir)
        .arg("-o")
        .arg(out)
        .layout(&layout())
        .no_settle()
        .ok();
}

/// `keycache merge DIR SNAP --base BASE --write-base BASE MORE`.
fn merge(dir: &Path, snap: &Path, base: &Path, more: &[&str]) -> std::process::Output {
    kc().arg("merge")
        .arg(dir)
        .arg(snap)
        .arg("--base")
        .arg(base)
        .arg("--write-base")
        .arg(base)
        .args(more)
        .layout(&layout())
        .no_settle()
        .output()
}

fn accepted(dir: &Path, id: &str) -> bool {
    let st = Store::open_with(dir, &layout().options()).unwrap();
    st.get(&MinionId::new(id).unwrap())
        .unwrap()
        .is_some_and(|e| e.state == KeyState::Accepted)
}

/// Asserts a refusal: exit 2, the message holds every one of `words`, and
/// nothing under `root` changed (the store, its tree, the base file).
fn refused(out: &std::process::Output, root: &Path, before: &crate::common::Files, words: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for w in words {
        assert!(err.contains(w), "the message does not say {w:?}: {err}");
    }
    assert_eq!(
        files_changed(before, &files(root)),
        Vec::<String>::new(),
        "a refused merge changed files"
    );
}

#[test]
fn a_store_or_snapshot_without_a_cluster_key_is_refused_unless_allowed() {
    let t = tempfile::tempdir().unwrap();
    let a = store(t.path(), "a", &["web-1"]);
    let b = store(t.path(), "b", &["peer-1"]);
    let snaps = t.path().join("snaps");
    std::fs::create_dir(&snaps).unwrap();
    let snap = snaps.join("b.snap");
    let base = a.join("b.base");

    // This store's directory has no key.
    snapshot(&b, &snap);
    std::fs::remove_file(a.join("master.pub")).unwrap();
    let before = files(&a);
    let out = merge(&a, &snap, &base, &[]);
    let cluster_pub = a.join("cluster.pub").display().to_string();
    let own_pub = a.join("master.pub").display().to_string();
    refused(
        &out,
        &a,
        &before,
        &[
            "this store's directory",
            &cluster_pub,
            &own_pub,
            "--allow-unknown-cluster",
        ],
    );
    // The dry run refuses the same.
    let out = merge(&a, &snap, &base, &["--dry-run"]);
    refused(&out, &a, &before, &["this store's directory", &own_pub]);
    assert!(!accepted(&a, "peer-1"));

    // The snapshot names none: its store had no key when it was taken.
    std::fs::write(a.join("master.pub"), master_pub()).unwrap();
    std::fs::remove_file(b.join("master.pub")).unwrap();
    snapshot(&b, &snap);
    let before = files(&a);
    let out = merge(&a, &snap, &base, &[]);
    let shown = snap.display().to_string();
    refused(
        &out,
        &a,
        &before,
        &[
            "the snapshot",
            &shown,
            "master.pub",
            "--allow-unknown-cluster",
        ],
    );
    assert!(!accepted(&a, "peer-1"));

    // Allowed: it merges, the key tree in step.
    let out = merge(&a, &snap, &base, &["--allow-unknown-cluster"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(accepted(&a, "peer-1"));
    assert!(a.join("minions/peer-1").is_file());
    assert!(base.is_file());
}
