//! `keycache merge` keeps the key tree in step, checked with the real Salt
//! 3008.5 `ReqServerChannel.validate_token` (which reads
//! `<pki_dir>/minions/<id>` on every request of a minion, whatever the key
//! cache driver): a key accepted on the peer passes on this master after
//! the merge, a key the peer deleted or rejected stops passing, and an id
//! given two different keys on the two masters ends with the same one on
//! both (the later version), the other passing on neither.

use crate::common;
use crate::common::{
    check_ok, keycache_1009, ok, open, pki_master, s, size_1009, sized, stdout, timer_pull,
    vt_keygen, vt_passing,
};

use std::path::Path;

use keycache::tree;

/// The ids among `ids` that pass Salt's validate_token on `pki` with the
/// private keys in `keys`.
fn passing(keys: &Path, pki: &Path, ids: &[&str]) -> Vec<String> {
    vt_passing(keys, &[pki], ids).remove(0)
}

/// `a` merges `b`'s snapshot by the timer recipe; its exit code (0: the
/// recipe must merge) and text output.
fn pull(t: &Path, a: &Path, b: &Path) -> String {
    let out = timer_pull(&common::cli(), t, a, b, &size_1009(), &[]);
    check_ok("merge", &out);
    stdout(&out)
}

fn same(a: &Path, b: &Path) {
    let d = keycache_1009(&["diff", s(a), s(b)]);
    check_ok("keycache diff", &d);
}

#[test]
fn merged_keys_pass_or_fail_salts_validate_token_as_the_peer_decided() {
    let t = tempfile::tempdir().unwrap();
    let t = t.path();
    let ids = ["web-1", "web-2", "web-3"];
    let keys = t.join("keys");
    let pubs = vt_keygen(&keys, &ids);
    let kcli = common::cli();
    let a = pki_master(&kcli, t, "a", &pubs, &size_1009());
    let b = pki_master(&kcli, t, "b", &pubs, &size_1009());
    // The first exchange: the same pending keys both ways, nothing to change.
    for out in [pull(t, &a, &b), pull(t, &b, &a)] {
        assert!(out.contains("0 entries written"), "{out}");
    }
    assert!(passing(&keys, &a, &ids).is_empty());

    // salt-key on b only: accepted there, never applied on a by Salt.
    ok(&keycache_1009(&["accept", s(&b), "web-1", "web-2"]));
    ok(&keycache_1009(&["reject", s(&b), "web-3"]));
    assert_eq!(passing(&keys, &b, &ids), ["web-1", "web-2"]);
    assert!(passing(&keys, &a, &ids).is_empty());
    let out = pull(t, &a, &b);
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
    ok(&keycache_1009(&["delete", s(&b), "web-1"]));
    ok(&keycache_1009(&["reject", s(&a), "web-2", "--include-all"]));
    let out = pull(t, &a, &b);
    assert!(
        out.contains("deleted  keys        web-1: accepted -> absent"),
        "{out}"
    );
    let out = pull(t, &b, &a);
    assert!(
        out.contains("changed  keys        web-2: accepted -> rejected"),
        "{out}"
    );
    assert!(passing(&keys, &a, &ids).is_empty());
    assert!(passing(&keys, &b, &ids).is_empty());
    assert!(!a.join("minions/web-1").exists() && !b.join("minions/web-2").exists());
    same(&a, &b);

    // One id, two keys (a minion re-keyed on one master, another on the
    // other), each accepted where it was made. The later version wins on
    // both: b's accept, since an accept is stamped with its master's last
    // observation and b's (its merge above) came after a's (the snapshot
    // that merge read). a's key then passes nowhere.
    let (ka, kb) = (t.join("keys-a"), t.join("keys-b"));
    let pa = vt_keygen(&ka, &["db-1"]);
    let pb = vt_keygen(&kb, &["db-1"]);
    std::fs::write(a.join("minions_pre/db-1"), &pa[0].1).unwrap();
    std::fs::write(b.join("minions_pre/db-1"), &pb[0].1).unwrap();
    ok(&keycache_1009(&["migrate", s(&a)]));
    ok(&keycache_1009(&["migrate", s(&b)]));
    ok(&keycache_1009(&["accept", s(&a), "db-1"]));
    ok(&keycache_1009(&["accept", s(&b), "db-1"]));
    assert_eq!(passing(&ka, &a, &["db-1"]), ["db-1"]);
    assert_eq!(passing(&kb, &b, &["db-1"]), ["db-1"]);
    let out = pull(t, &a, &b);
    assert!(
        out.contains("changed  keys        db-1: accepted -> accepted (another key)"),
        "{out}"
    );
    let out = pull(t, &b, &a);
    assert!(out.contains("0 entries written"), "{out}");
    assert_eq!(
        vt_passing(&kb, &[&a, &b], &["db-1"]),
        [vec!["db-1".to_owned()], vec!["db-1".to_owned()]],
        "b's key passes on both masters"
    );
    assert_eq!(
        vt_passing(&ka, &[&a, &b], &["db-1"]),
        [Vec::<String>::new(), Vec::new()],
        "a's key, replaced by the later accept, passes nowhere"
    );
    same(&a, &b);
    for pki in [&a, &b] {
        assert_eq!(
            tree::check(&open(pki, &sized(1009))).unwrap(),
            vec![],
            "{}",
            pki.display()
        );
    }
}
