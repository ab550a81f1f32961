//! `keycache merge` keeps the key tree in step, checked with the real Salt
//! 3008.5 `ReqServerChannel.validate_token` (which reads
//! `<pki_dir>/minions/<id>` on every request of a minion, whatever the key
//! cache driver): a key accepted on the peer passes on this master after
//! the merge, a key the peer deleted or rejected stops passing, and an id
//! that holds two different keys on the two masters passes with neither.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{keycache, ok};
use keycache::tree;
use keycache::{OpenOptions, Params, Store};
use serde_json::Value;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn kc(args: &[&str]) -> Output {
    let mut a = args.to_vec();
    a.extend_from_slice(&["--size", "1009"]);
    keycache(&a)
}

fn vt(args: &[&str]) -> Value {
    common::run_py("validate_token.py", args, None)
}

/// Salt key pairs for `ids` in `keys/`: id -> public PEM.
fn keygen(keys: &Path, ids: &[&str]) -> Vec<(String, String)> {
    let v = vt(&["keygen", "--out", s(keys), "--ids", &ids.join(",")]);
    ids.iter()
        .map(|id| (id.to_string(), v["pubs"][id].as_str().unwrap().to_owned()))
        .collect()
}

/// The ids among `ids` that pass Salt's validate_token on `pki` with the
/// private keys in `keys`.
fn passing(keys: &Path, pki: &Path, ids: &[&str]) -> Vec<String> {
    let v = vt(&[
        "check",
        "--keys",
        s(keys),
        "--pki-dir",
        s(pki),
        "--ids",
        &ids.join(","),
    ]);
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["valid"].as_bool().unwrap())
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

/// A migrated master in `t/name`: the given (id, PEM) pending in its tree,
/// migrated into its banks (the tree stays, as after Salt's migration).
fn master(t: &Path, name: &str, pending: &[(String, String)]) -> PathBuf {
    let pki = t.join(name);
    for d in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        std::fs::create_dir_all(pki.join(d)).unwrap();
    }
    std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (id, pem) in pending {
        std::fs::write(pki.join("minions_pre").join(id), pem).unwrap();
    }
    ok(&kc(&["migrate", s(&pki)]));
    pki
}

/// `a` merges `b`'s snapshot (with the bases of the timer recipe); its
/// exit code and text output.
fn pull(t: &Path, a: &Path, b: &Path) -> (Option<i32>, String) {
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let snap = t.join(format!("{}.snap", name(b)));
    let seen = t.join(format!("base-{}-from-{}.snap", name(b), name(a)));
    let base = t.join(format!("base-{}-from-{}.snap", name(a), name(b)));
    ok(&kc(&["snapshot", s(b), "-o", s(&snap), "--seen", s(&seen)]));
    let out = kc(&[
        "merge",
        s(a),
        s(&snap),
        "--base",
        s(&base),
        "--write-base",
        s(&base),
    ]);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "merge: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn open(pki: &Path) -> Store {
    let opts = OpenOptions {
        params: Params {
            size: 1009,
            ..Params::default()
        },
        ..OpenOptions::default()
    };
    Store::open_with(pki, &opts).unwrap()
}

#[test]
fn merged_keys_pass_or_fail_salts_validate_token_as_the_peer_decided() {
    let t = tempfile::tempdir().unwrap();
    let t = t.path();
    let ids = ["web-1", "web-2", "web-3"];
    let keys = t.join("keys");
    let pubs = keygen(&keys, &ids);
    let a = master(t, "a", &pubs);
    let b = master(t, "b", &pubs);
    // The first exchange: a union both ways, nothing to change.
    assert_eq!(pull(t, &a, &b).0, Some(0));
    assert_eq!(pull(t, &b, &a).0, Some(0));
    assert!(passing(&keys, &a, &ids).is_empty());

    // salt-key on b only: accepted there, never applied on a by Salt.
    ok(&kc(&["accept", s(&b), "web-1", "web-2"]));
    ok(&kc(&["reject", s(&b), "web-3"]));
    assert_eq!(passing(&keys, &b, &ids), ["web-1", "web-2"]);
    assert!(passing(&keys, &a, &ids).is_empty());
    let (code, out) = pull(t, &a, &b);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("changed  keys        web-1: pending -> accepted"),
        "{out}"
    );
    assert!(out.contains("Key tree: wrote minions/web-1."), "{out}");
    assert!(
        out.contains("Key tree: removed minions_pre/web-3."),
        "{out}"
    );
    assert_eq!(passing(&keys, &a, &ids), ["web-1", "web-2"]);
    assert!(a.join("minions_rejected/web-3").exists());

    // b deletes web-1, a rejects web-2: each merge revokes on the other.
    ok(&kc(&["delete", s(&b), "web-1"]));
    ok(&kc(&["reject", s(&a), "web-2", "--include-all"]));
    pull(t, &a, &b);
    pull(t, &b, &a);
    assert!(passing(&keys, &a, &ids).is_empty());
    assert!(passing(&keys, &b, &ids).is_empty());
    assert!(!a.join("minions/web-1").exists() && !b.join("minions/web-2").exists());
    let d = kc(&["diff", s(&a), s(&b)]);
    assert_eq!(
        d.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&d.stdout)
    );

    // One id, two keys (a minion re-keyed on one master, another on the
    // other), each accepted where it was made: after the merges neither
    // key passes on either master; the merge that meets the mismatch exits 1.
    let (ka, kb) = (t.join("keys-a"), t.join("keys-b"));
    let pa = keygen(&ka, &["db-1"]);
    let pb = keygen(&kb, &["db-1"]);
    std::fs::write(a.join("minions_pre/db-1"), &pa[0].1).unwrap();
    std::fs::write(b.join("minions_pre/db-1"), &pb[0].1).unwrap();
    ok(&kc(&["migrate", s(&a)]));
    ok(&kc(&["migrate", s(&b)]));
    ok(&kc(&["accept", s(&a), "db-1"]));
    ok(&kc(&["accept", s(&b), "db-1"]));
    assert_eq!(passing(&ka, &a, &["db-1"]), ["db-1"]);
    let (code, out) = pull(t, &a, &b);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("key mismatch"), "{out}");
    // b takes a's settlement as a's change (a merged b's accepted key).
    let (code, out) = pull(t, &b, &a);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("db-1: accepted -> pending"), "{out}");
    for (keys, who) in [(&ka, "a's key"), (&kb, "b's key")] {
        for pki in [&a, &b] {
            assert!(
                passing(keys, pki, &["db-1"]).is_empty(),
                "{who} passes on {}",
                pki.display()
            );
        }
    }
    pull(t, &a, &b);
    pull(t, &b, &a);
    let d = kc(&["diff", s(&a), s(&b)]);
    assert_eq!(
        d.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&d.stdout)
    );
    for pki in [&a, &b] {
        assert_eq!(
            tree::check(&open(pki)).unwrap(),
            vec![],
            "{}",
            pki.display()
        );
    }
}
