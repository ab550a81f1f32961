//! The key tree stays in step with the store, checked
//! with the real Salt 3008.5: `ReqServerChannel.validate_token`
//! (salt/channel/server.py), which reads `<pki_dir>/minions/<id>` on every
//! AES request, run by `py/validate_token.py` with tokens made from the
//! minions' private keys as Salt's minion makes them.
//!
//! - a key accepted with `keycache accept` passes validate_token; after
//!   `keycache delete` or `reject` it fails;
//! - `--tree never` leaves the tree alone (and a stale file keeps passing,
//!   which `tree::check` reports and `tree::mend` fixes);
//! - `--tree auto` (the default) is off without a `minions` directory, and
//!   `--tree always` creates the state directories;
//! - a symlink under a key's name, or in place of a state directory, is
//!   refused by name before the store or the tree changes.

use super::{keygen, keys_and_pki, verdicts};
use crate::common;
use crate::common::{export, keycache_1009, ok, open, s, sized, stdout, TREE_DIRS};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use keycache::tree::TreeSync;
use keycache::tree::{self, TreeProblem};
use keycache::{KeyState, MinionId, Store};
use serde_json::Value;

/// Runs `validate_token.py ARGS`, feeding `stdin`; its JSON.
fn vt(args: &[&str], stdin: Option<&Value>) -> Value {
    common::run_py("validate_token.py", args, stdin)
}

/// Salt's validate_token for each id against `pki`: id -> passes.
fn validate(keys: &Path, pki: &Path, ids: &[&str]) -> Vec<(String, bool)> {
    let v = vt(
        &[
            "check",
            "--keys",
            s(keys),
            "--pki-dir",
            s(pki),
            "--ids",
            &ids.join(","),
        ],
        None,
    );
    eprintln!("validate_token: {}", v["mode"]);
    verdicts(&v)
}

fn passing(keys: &Path, pki: &Path, ids: &[&str]) -> Vec<String> {
    validate(keys, pki, ids)
        .into_iter()
        .filter(|(_, ok)| *ok)
        .map(|(id, _)| id)
        .collect()
}

/// Salt key pairs for `ids` in `keys/`; their public keys put pending in
/// `st`.
fn keygen_pending(st: &Store, keys: &Path, ids: &[&str]) {
    for (id, pem) in keygen(keys, ids) {
        st.put(
            &MinionId::new(id).unwrap(),
            KeyState::Pending,
            pem.as_bytes(),
        )
        .unwrap();
    }
}

/// A migrated master: `pki/minions_pre/<id>` for each id, migrated into
/// the banks of `pki` itself (the tree stays, as after Salt's own
/// migration).
fn migrated_master(t: &Path, ids: &[&str]) -> (PathBuf, PathBuf) {
    let keys = t.join("keys");
    let pki = t.join("pki");
    for d in TREE_DIRS {
        std::fs::create_dir_all(pki.join(d)).unwrap();
    }
    std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (id, pem) in keygen(&keys, ids) {
        std::fs::write(pki.join("minions_pre").join(&id), pem).unwrap();
    }
    ok(&keycache_1009(&["migrate", s(&pki)]));
    (keys, pki)
}

/// [`migrated_master`] with every one of `ids` accepted (`keycache accept`).
fn accepted_master(t: &Path, ids: &[&str]) -> (PathBuf, PathBuf) {
    let (keys, pki) = migrated_master(t, ids);
    ok(&keycache_1009(&[&["accept", s(&pki)], ids].concat()));
    (keys, pki)
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn accepted_keys_pass_validate_token_and_delete_or_reject_revokes_them() {
    let t = tempfile::tempdir().unwrap();
    let ids = ["web-1", "web-2", "web-3"];
    let (keys, pki) = migrated_master(t.path(), &ids);
    assert_eq!(passing(&keys, &pki, &ids), Vec::<String>::new());

    let out = ok(&keycache_1009(&[
        "accept",
        s(&pki),
        "web-1",
        "web-2",
        "web-3",
    ]));
    assert!(out.contains("Key tree: wrote minions/web-1."), "{out}");
    assert!(
        out.contains("Key tree: removed minions_pre/web-1."),
        "{out}"
    );
    assert_eq!(passing(&keys, &pki, &ids), ids.to_vec());
    for id in ids {
        let f = pki.join("minions").join(id);
        assert_eq!(mode(&f), 0o600, "{}", f.display());
        assert!(!pki.join("minions_pre").join(id).exists());
        assert_eq!(
            std::fs::read(&f).unwrap(),
            open(&pki, &sized(1009))
                .get(&MinionId::new(id).unwrap())
                .unwrap()
                .unwrap()
                .public_key
        );
    }

    ok(&keycache_1009(&["delete", s(&pki), "web-1"]));
    assert_eq!(passing(&keys, &pki, &ids), vec!["web-2", "web-3"]);
    assert!(!pki.join("minions/web-1").exists());

    let o = keycache_1009(&["reject", s(&pki), "web-2", "--include-all", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    ok(&o);
    assert_eq!(v["tree"]["removed"], serde_json::json!(["minions/web-2"]));
    assert_eq!(
        v["tree"]["written"],
        serde_json::json!(["minions_rejected/web-2"])
    );
    assert_eq!(passing(&keys, &pki, &ids), vec!["web-3"]);
    assert_eq!(mode(&pki.join("minions_rejected/web-2")), 0o600);

    // Accepted again: passes again.
    ok(&keycache_1009(&[
        "accept",
        s(&pki),
        "web-2",
        "--include-all",
    ]));
    assert_eq!(passing(&keys, &pki, &ids), vec!["web-2", "web-3"]);
    assert!(!pki.join("minions_rejected/web-2").exists());

    let st = open(&pki, &sized(1009));
    assert_eq!(tree::check(&st).unwrap(), vec![]);
    assert_eq!(mode(&pki), 0o700, "the pki dir's mode is left alone");

    // A cluster peer: validate_token reads cluster_pki_dir (where a peer's
    // banks, and so its tree, are) rather than pki_dir.
    let empty = t.path().join("standalone-pki");
    std::fs::create_dir(&empty).unwrap();
    let v = vt(
        &["check", "--keys", s(&keys), "--stdin"],
        Some(&serde_json::json!([
            {"pki_dir": empty, "cluster_pki_dir": pki, "ids": ids},
            {"pki_dir": pki, "cluster_pki_dir": empty, "ids": ids},
        ])),
    );
    let got = verdicts(&v);
    let want: Vec<(String, bool)> = [
        ("web-1", false),
        ("web-2", true),
        ("web-3", true),
        ("web-1", false),
        ("web-2", false),
        ("web-3", false),
    ]
    .iter()
    .map(|(i, b)| (i.to_string(), *b))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn tree_never_leaves_the_tree_alone_and_check_and_mend_follow_the_store() {
    let t = tempfile::tempdir().unwrap();
    let ids = ["a-1", "a-2"];
    let (keys, pki) = migrated_master(t.path(), &ids);
    ok(&keycache_1009(&[
        "accept",
        s(&pki),
        "a-1",
        "a-2",
        "--tree",
        "never",
    ]));
    assert_eq!(passing(&keys, &pki, &ids), Vec::<String>::new());
    assert!(pki.join("minions_pre/a-1").exists());
    let st = open(&pki, &sized(1009));
    let found = tree::check(&st).unwrap();
    let kinds: Vec<_> = found
        .iter()
        .map(|d| (d.problem, d.dir.name(), d.id.clone().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (TreeProblem::Missing, "minions", "a-1".to_owned()),
            (TreeProblem::Missing, "minions", "a-2".to_owned()),
            (TreeProblem::Stray, "minions_pre", "a-1".to_owned()),
            (TreeProblem::Stray, "minions_pre", "a-2".to_owned()),
        ]
    );
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(found.iter().all(|d| !d.grants_access()));

    let r = tree::mend(&st).unwrap();
    assert_eq!(r.written.len(), 2);
    assert_eq!(r.removed.len(), 2);
    assert!(r.refused.is_empty());
    assert_eq!(tree::check(&st).unwrap(), vec![]);
    assert_eq!(passing(&keys, &pki, &ids), ids.to_vec());

    // Deleted with --tree never: the file stays and keeps passing; check
    // says so, mend revokes it.
    ok(&keycache_1009(&[
        "delete",
        s(&pki),
        "a-1",
        "--tree",
        "never",
    ]));
    assert_eq!(passing(&keys, &pki, &ids), ids.to_vec());
    let found = tree::check(&st).unwrap();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].problem, TreeProblem::Stray);
    assert!(found[0].grants_access(), "{}", found[0]);
    assert!(found[0].to_string().contains("validate_token"));
    // A different key under an accepted id, and a leftover temporary.
    std::fs::write(
        pki.join("minions/a-2"),
        b"-----BEGIN PUBLIC KEY-----\nX\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    std::fs::write(pki.join("minions/.keycache-tree.1.a-2"), b"x").unwrap();
    let found = tree::check(&st).unwrap();
    let problems: Vec<_> = found.iter().map(|d| d.problem).collect();
    assert_eq!(
        problems,
        vec![
            TreeProblem::TempFile,
            TreeProblem::Stray,
            TreeProblem::KeyDiffers
        ],
        "{found:#?}"
    );
    let r = tree::mend(&st).unwrap();
    assert_eq!((r.written.len(), r.removed.len()), (1, 2), "{r:?}");
    assert_eq!(tree::check(&st).unwrap(), vec![]);
    assert_eq!(passing(&keys, &pki, &ids), vec!["a-2"]);
}

#[test]
fn auto_is_off_without_a_minions_dir_and_always_creates_the_tree() {
    let (_t, keys, pki) = keys_and_pki();
    std::fs::create_dir(&pki).unwrap();
    let ids = ["b-1", "b-2"];
    let st = open(&pki, &sized(1009));
    keygen_pending(&st, &keys, &ids);
    assert_eq!(TreeSync::auto(&pki), TreeSync::Off);
    let o = keycache_1009(&["accept", s(&pki), "b-1", "--json"]);
    ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v.get("tree").is_none(), "{v}");
    assert!(!pki.join("minions").exists());
    assert_eq!(passing(&keys, &pki, &ids), Vec::<String>::new());

    ok(&keycache_1009(&[
        "accept",
        s(&pki),
        "b-2",
        "--tree",
        "always",
    ]));
    assert_eq!(mode(&pki.join("minions")), 0o755);
    assert_eq!(mode(&pki.join("minions/b-2")), 0o600);
    // Only the ids the command touched are brought in step.
    assert_eq!(passing(&keys, &pki, &ids), vec!["b-2"]);
    assert_eq!(TreeSync::auto(&pki), TreeSync::On);
    // Now auto is on: b-1 gets its file when it is next changed.
    ok(&keycache_1009(&["reject", s(&pki), "b-1", "--include-all"]));
    ok(&keycache_1009(&["accept", s(&pki), "b-1", "--include-all"]));
    assert_eq!(passing(&keys, &pki, &ids), ids.to_vec());
}

#[test]
fn symlinks_in_the_tree_are_refused_before_anything_changes() {
    let t = tempfile::tempdir().unwrap();
    let ids = ["c-1", "c-2"];
    let (keys, pki) = accepted_master(t.path(), &ids);
    // A symlink under an accepted key's name.
    let elsewhere = t.path().join("elsewhere");
    std::fs::copy(pki.join("minions/c-1"), &elsewhere).unwrap();
    std::fs::remove_file(pki.join("minions/c-1")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, pki.join("minions/c-1")).unwrap();
    let o = keycache_1009(&["delete", s(&pki), "c-1", "c-2"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(s(&pki.join("minions/c-1"))), "{err}");
    assert!(err.contains("symlink"), "{err}");
    // The CLI says how to leave the tree out; the library's words do not.
    assert!(
        err.contains("--tree never leaves the key tree out"),
        "{err}"
    );
    // Nothing changed: both still accepted, c-2's file still there.
    let st = open(&pki, &sized(1009));
    for id in ids {
        let e = st.get(&MinionId::new(id).unwrap()).unwrap().unwrap();
        assert_eq!(e.state, KeyState::Accepted);
    }
    assert!(pki.join("minions/c-2").is_file());
    assert!(std::fs::symlink_metadata(pki.join("minions/c-1"))
        .unwrap()
        .file_type()
        .is_symlink());
    let found = tree::check(&st).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].problem, TreeProblem::NotAFile);
    let r = tree::mend(&st).unwrap();
    assert_eq!(r.refused.len(), 1);
    assert!(elsewhere.exists());
    std::fs::remove_file(pki.join("minions/c-1")).unwrap();

    // A state directory that is a symlink.
    let other = t.path().join("other-rejected");
    std::fs::create_dir(&other).unwrap();
    std::fs::remove_dir(pki.join("minions_rejected")).unwrap();
    std::os::unix::fs::symlink(&other, pki.join("minions_rejected")).unwrap();
    let o = keycache_1009(&["reject", s(&pki), "c-2", "--include-all"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(s(&pki.join("minions_rejected"))), "{err}");
    assert_eq!(
        st.get(&MinionId::new("c-2").unwrap())
            .unwrap()
            .unwrap()
            .state,
        KeyState::Accepted
    );
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
    assert_eq!(passing(&keys, &pki, &ids), vec!["c-2"]);
    // --tree never still works on the banks.
    ok(&keycache_1009(&[
        "reject",
        s(&pki),
        "c-2",
        "--include-all",
        "--tree",
        "never",
    ]));
}

#[test]
fn tree_files_get_the_masters_owner_and_keep_a_replaced_files_owner() {
    use std::os::unix::fs::MetadataExt;
    if !keycache_testkit::skip::needs_root("tree file ownership") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let pki = t.path().join("pki");
    std::fs::create_dir_all(pki.join("minions_pre")).unwrap();
    // The master runs as its own user, which owns the pki dir
    // (Salt's verify_env); keycache runs as root.
    let (uid, gid) = (4321, 4322);
    std::os::unix::fs::chown(&pki, Some(uid), Some(gid)).unwrap();
    let pem = |t: &str| common::pem(t, 200);
    for id in ["o-1", "o-2"] {
        std::fs::write(pki.join("minions_pre").join(id), pem(id)).unwrap();
    }
    ok(&keycache_1009(&["migrate", s(&pki)]));
    ok(&keycache_1009(&[
        "accept",
        s(&pki),
        "o-1",
        "o-2",
        "--tree",
        "always",
    ]));
    let m = std::fs::metadata(pki.join("minions")).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (uid, gid, 0o755));
    let m = std::fs::metadata(pki.join("minions/o-1")).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (uid, gid, 0o600));
    // A file replaced keeps its owner (here another one, set by hand).
    std::os::unix::fs::chown(pki.join("minions/o-2"), Some(555), Some(556)).unwrap();
    let st = open(&pki, &sized(1009));
    st.put(
        &MinionId::new("o-2").unwrap(),
        KeyState::Accepted,
        pem("o-2-new").as_bytes(),
    )
    .unwrap();
    let st = st.with_tree(TreeSync::On);
    st.put(
        &MinionId::new("o-2").unwrap(),
        KeyState::Accepted,
        pem("o-2-newer").as_bytes(),
    )
    .unwrap();
    let m = std::fs::metadata(pki.join("minions/o-2")).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (555, 556, 0o600));
    assert_eq!(
        std::fs::read_to_string(pki.join("minions/o-2")).unwrap(),
        pem("o-2-newer")
    );
}

/// `keycache verify` reports every disagreement between the tree and the
/// store (a revoked key still in `minions/` named as one validate_token
/// would accept), exits 1, and `verify --repair` makes the tree equal to
/// the store: the revoked minion no longer passes validate_token, the
/// accepted one does, and verify is clean again (JSON too).
#[test]
fn verify_reports_the_tree_and_repair_mends_it_toward_the_store() {
    let t = tempfile::tempdir().unwrap();
    let ids = ["v-1", "v-2"];
    let (keys, pki) = accepted_master(t.path(), &ids);
    ok(&keycache_1009(&[
        "delete",
        s(&pki),
        "v-1",
        "--tree",
        "never",
    ]));
    assert_eq!(
        passing(&keys, &pki, &ids),
        ids.to_vec(),
        "the revoked key still passes"
    );
    let o = keycache_1009(&["verify", s(&pki)]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("minions/v-1") && out.contains("validate_token"),
        "{out}"
    );
    let o = keycache_1009(&["verify", s(&pki), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["tree"]["disagreements"].as_array().map(Vec::len),
        Some(1),
        "{v}"
    );
    // --tree never: the tree is not looked at.
    assert_eq!(
        keycache_1009(&["verify", s(&pki), "--tree", "never"])
            .status
            .code(),
        Some(0)
    );
    let out = ok(&keycache_1009(&["verify", s(&pki), "--repair"]));
    assert!(
        out.contains("tree: removed") && out.contains("minions/v-1"),
        "{out}"
    );
    assert_eq!(passing(&keys, &pki, &ids), vec!["v-2"]);
    let out = ok(&keycache_1009(&["verify", s(&pki)]));
    assert!(out.contains("clean"), "{out}");
}

/// Every entry under `dir`, recursively, with its content (what a refused
/// command must leave as it was).
fn dir_state(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if p.is_dir() {
                stack.push(p.clone());
                out.push((rel, b"<dir>".to_vec()));
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// `verify --repair` on a pki dir that holds a
/// `localfs_key` tree but no store is refused (exit 2, naming `keycache
/// migrate`) and touches nothing, text or JSON: the accepted key keeps
/// passing Salt's validate_token. Once migrated, repair follows the store.
#[test]
fn verify_repair_refuses_a_tree_without_a_store_and_touches_nothing() {
    let (_t, keys, pki) = keys_and_pki();
    let ids = ["n-acc", "n-pre", "n-rej", "n-den"];
    let pairs = keygen(&keys, &ids);
    for ((id, pem), d) in pairs.iter().zip(TREE_DIRS) {
        std::fs::create_dir_all(pki.join(d)).unwrap();
        std::fs::write(pki.join(d).join(id), pem).unwrap();
    }
    assert_eq!(passing(&keys, &pki, &ids), vec!["n-acc"]);
    let o = keycache_1009(&["verify", s(&pki)]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(out.matches("tree: ").count(), 4, "{out}");
    let before = dir_state(&pki);
    for extra in [&[][..], &["--json"][..], &["--tree", "always"][..]] {
        let mut args = vec!["verify", s(&pki), "--repair"];
        args.extend_from_slice(extra);
        let o = keycache_1009(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains("keycache migrate"), "{err}");
        assert!(err.contains(s(&pki)), "{err}");
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("removed"),
            "{extra:?}"
        );
        assert_eq!(dir_state(&pki), before, "{extra:?}: the pki dir changed");
    }
    assert_eq!(passing(&keys, &pki, &ids), vec!["n-acc"]);
    // Migrated: the store holds what the tree holds, and repair keeps it.
    ok(&keycache_1009(&["migrate", s(&pki)]));
    let out = ok(&keycache_1009(&["verify", s(&pki), "--repair"]));
    assert!(!out.contains("tree: removed"), "{out}");
    assert_eq!(passing(&keys, &pki, &ids), vec!["n-acc"]);
}

/// An id starting with a dot is an id (Salt's
/// `valid_id` takes it and `validate_token` reads `minions/.m`): an
/// accepted `.m` is not "missing" for `verify`; once deleted behind the
/// tree's back, its file is a stray that `verify` names and `verify
/// --repair` removes, and `export` removes it from a tree exported
/// earlier; Salt's `.key_cache` and keycache's own `.keycache-*` files are
/// never taken for keys. Salt's validate_token is the judge.
#[test]
fn a_dot_id_is_an_id_for_verify_repair_and_export() {
    let (t, keys, pki) = keys_and_pki();
    let out = t.path().join("exported");
    let ids = [".m", "web"];
    std::fs::create_dir_all(pki.join("minions")).unwrap();
    let st = open(&pki, &sized(1009));
    keygen_pending(&st, &keys, &ids);
    let salts = [
        ("minions/.key_cache", &b"\x81\xa4salt's key list cache"[..]),
        (
            "minions/.keycache-export.1.web",
            &b"an old export temporary"[..],
        ),
    ];
    for (name, bytes) in salts {
        std::fs::write(pki.join(name), bytes).unwrap();
    }
    ok(&keycache_1009(&["accept", s(&pki), ".m", "web"]));
    assert_eq!(passing(&keys, &pki, &ids), ids.to_vec());
    let out_v = ok(&keycache_1009(&["verify", s(&pki)]));
    assert!(
        out_v.contains("clean"),
        "an accepted dot-id is not missing: {out_v}"
    );
    export(&pki, &out).ok();
    assert_eq!(passing(&keys, &out, &ids), ids.to_vec());

    // Deleted with --tree never: minions/.m still lets .m in.
    ok(&keycache_1009(&[
        "delete",
        s(&pki),
        ".m",
        "--tree",
        "never",
    ]));
    assert_eq!(passing(&keys, &pki, &ids), ids.to_vec());
    let o = keycache_1009(&["verify", s(&pki)]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("{}: a key file", s(&pki.join("minions/.m"))))
            && text.contains("validate_token"),
        "{text}"
    );
    assert!(
        !text.contains(".key_cache") && !text.contains(".keycache-export"),
        "{text}"
    );

    // export makes the exported tree follow: .m no longer passes there.
    let o = export(&pki, &out).output();
    let text = stdout(&o);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains(&format!("removed: {}", s(&out.join("minions/.m")))),
        "{text}"
    );
    assert_eq!(passing(&keys, &out, &ids), vec!["web"]);

    // verify --repair removes it; Salt's and keycache's files stay.
    let text = ok(&keycache_1009(&["verify", s(&pki), "--repair"]));
    assert!(
        text.contains(&format!("tree: removed {}", s(&pki.join("minions/.m")))),
        "{text}"
    );
    assert_eq!(passing(&keys, &pki, &ids), vec!["web"]);
    for (name, bytes) in salts {
        assert_eq!(std::fs::read(pki.join(name)).unwrap(), bytes, "{name}");
    }
    assert!(ok(&keycache_1009(&["verify", s(&pki)])).contains("clean"));

    // And with the tree kept in step, delete revokes a dot-id at once.
    let st = open(&pki, &sized(1009));
    st.put(
        &MinionId::new(".m").unwrap(),
        KeyState::Pending,
        keygen(&keys, &[".m"])[0].1.as_bytes(),
    )
    .unwrap();
    ok(&keycache_1009(&["accept", s(&pki), ".m"]));
    assert_eq!(passing(&keys, &pki, &ids), ids.to_vec());
    ok(&keycache_1009(&["delete", s(&pki), ".m"]));
    assert_eq!(passing(&keys, &pki, &ids), vec!["web"]);
    assert!(ok(&keycache_1009(&["verify", s(&pki)])).contains("clean"));
}

/// `export` without `--force` replaces the key file of
/// a re-keyed accepted minion with the store's key (the old key no longer
/// passes Salt's validate_token, the new one does), and says so; a
/// differing file of another state directory is still left alone and
/// reported unless `--force`.
#[test]
fn export_replaces_a_re_keyed_accepted_key_without_force() {
    let t = tempfile::tempdir().unwrap();
    let (old, new) = (t.path().join("keys-old"), t.path().join("keys-new"));
    let sd = t.path().join("store");
    let tree = t.path().join("tree");
    std::fs::create_dir(&sd).unwrap();
    let ids = ["r", "p"];
    let old_pems = keygen(&old, &ids);
    let new_pems = keygen(&new, &ids);
    let st = open(&sd, &sized(1009));
    let id = |s: &str| MinionId::new(s).unwrap();
    st.put(&id("r"), KeyState::Accepted, old_pems[0].1.as_bytes())
        .unwrap();
    st.put(&id("p"), KeyState::Pending, old_pems[1].1.as_bytes())
        .unwrap();
    export(&sd, &tree).ok();
    assert_eq!(passing(&old, &tree, &["r"]), vec!["r"]);
    // Re-keyed (deleted and accepted again with the minion's new key).
    st.put(&id("r"), KeyState::Accepted, new_pems[0].1.as_bytes())
        .unwrap();
    st.put(&id("p"), KeyState::Pending, new_pems[1].1.as_bytes())
        .unwrap();

    let o = keycache_1009(&["export", s(&sd), "--to", s(&tree), "--dry-run"]);
    let text = stdout(&o);
    let r_path = s(&tree.join("minions/r")).to_owned();
    assert!(text.contains(&format!("would replace: {r_path}")), "{text}");
    assert_eq!(passing(&old, &tree, &["r"]), vec!["r"], "a dry run wrote");

    let (o, v) = export(&sd, &tree).args(["--json"]).output_json();
    // p's pending file differs: left alone without --force (exit 1).
    assert_eq!(o.status.code(), Some(1), "{v}");
    assert_eq!(v["replaced"], serde_json::json!([r_path]));
    assert_eq!(
        v["conflicts"],
        serde_json::json!([s(&tree.join("minions_pre/p"))])
    );
    assert_eq!(passing(&old, &tree, &["r"]), Vec::<String>::new());
    assert_eq!(passing(&new, &tree, &["r"]), vec!["r"]);
    assert_eq!(
        std::fs::read_to_string(tree.join("minions_pre/p")).unwrap(),
        old_pems[1].1
    );
    assert_eq!(mode(&tree.join("minions/r")), 0o600);
    // --force: the pending file follows too.
    ok(&keycache_1009(&[
        "export",
        s(&sd),
        "--to",
        s(&tree),
        "--force",
    ]));
    assert_eq!(
        std::fs::read_to_string(tree.join("minions_pre/p")).unwrap(),
        new_pems[1].1
    );
    assert_eq!(passing(&new, &tree, &["r"]), vec!["r"]);
}
