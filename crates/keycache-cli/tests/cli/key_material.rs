//! Private key material never enters a store and is never printed (issue
//! 15, class 4): a minion key file holds exactly one PEM public key block
//! and nothing but whitespace around it; anything else is skipped with its
//! reason, and what is kept is kept byte for byte.

use crate::common;

use std::path::Path;

use crate::common::{keycache_exits, keycache_ok_json, pem, TREE_DIRS};
use keycache::{KeyState, MinionId, Store};

const PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n";

/// (file name, content, the skip reason migrate gives, or None: kept).
fn cases() -> Vec<(&'static str, String, Option<&'static str>)> {
    let p = pem("kept", 6);
    let rsa_priv = PRIV.replace("PRIVATE KEY", "RSA PRIVATE KEY");
    let enc_priv = PRIV.replace("PRIVATE KEY", "ENCRYPTED PRIVATE KEY");
    vec![
        ("plain", p.clone(), None),
        ("crlf", p.replace('\n', "\r\n"), None),
        ("padded", format!("\n\n  {p}\n\n"), None),
        ("pkcs1", p.replace("PUBLIC KEY", "RSA PUBLIC KEY"), None),
        ("pub-then-priv", format!("{p}{PRIV}"), Some("private_key")),
        ("priv-then-pub", format!("{PRIV}{p}"), Some("private_key")),
        ("priv-only", PRIV.to_string(), Some("private_key")),
        (
            "rsa-priv-between",
            format!("{p}{rsa_priv}{p}"),
            Some("private_key"),
        ),
        (
            "encrypted-priv",
            format!("{p}\n{enc_priv}"),
            Some("private_key"),
        ),
        ("two-pubs", format!("{p}{p}"), Some("not_a_public_key")),
        (
            "comment-first",
            format!("# minion key\n{p}"),
            Some("not_a_public_key"),
        ),
        (
            "trailer",
            format!("{p}trailing text\n"),
            Some("not_a_public_key"),
        ),
        (
            "certificate",
            p.replace("PUBLIC KEY", "CERTIFICATE"),
            Some("not_a_public_key"),
        ),
        (
            "no-end",
            p.lines().take(2).collect::<Vec<_>>().join("\n"),
            Some("not_a_public_key"),
        ),
    ]
}

fn tree(root: &Path) {
    for d in TREE_DIRS {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (i, (name, content, _)) in cases().into_iter().enumerate() {
        // Spread over the state directories (denied keys too).
        let dir = TREE_DIRS[i % 4];
        std::fs::write(root.join(dir).join(name), content).unwrap();
    }
}

/// The store in `dir` opened with a table of `size` slots (the library's
/// other defaults).
fn store_of_size(dir: &std::path::Path, size: u64) -> Store {
    let mut opts = keycache::OpenOptions::default();
    opts.params.size = size;
    Store::open_with(dir, &opts).unwrap()
}

#[test]
fn migrate_keeps_public_keys_byte_for_byte_and_skips_everything_else() {
    let t = tempfile::tempdir().unwrap();
    let pki = t.path().join("pki");
    tree(&pki);
    let out = t.path().join("store");
    let p = pki.display().to_string();
    let o = out.display().to_string();
    let v = keycache_ok_json(&["migrate", &p, "--out", &o, "--size", "1009", "--json"]);
    let skipped = common::skipped_reasons(&v);
    let store = store_of_size(&out, 1009);
    for (i, (name, content, reason)) in cases().into_iter().enumerate() {
        let found = skipped
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r.as_str());
        assert_eq!(found, reason, "{name}: skip reason");
        let id = MinionId::new(name).unwrap();
        let stored = if i % 4 == 3 {
            store.denied(&id).unwrap()
        } else {
            store.get(&id).unwrap().map(|e| e.public_key)
        };
        match reason {
            None => assert_eq!(
                stored.as_deref(),
                Some(content.as_bytes()),
                "{name}: not kept byte for byte"
            ),
            Some(_) => assert_eq!(stored, None, "{name}: stored"),
        }
    }
    // Nothing of a private block anywhere in the banks' files, nor in the
    // key tree the migration wrote beside them.
    let mut files = Vec::new();
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            files.extend(std::fs::read_dir(e.path()).unwrap().flatten());
        } else {
            files.push(e);
        }
    }
    for e in files {
        let bytes = std::fs::read(e.path()).unwrap();
        assert!(
            !bytes.windows(11).any(|w| w == b"PRIVATE KEY"),
            "{} holds private key material",
            e.path().display()
        );
    }
}

#[test]
fn the_library_refuses_values_holding_a_private_block_in_every_order() {
    let t = tempfile::tempdir().unwrap();
    let store = store_of_size(t.path(), 101);
    let id = MinionId::new("m1").unwrap();
    let p = pem("m1", 4);
    for v in [format!("{p}{PRIV}"), format!("{PRIV}{p}"), PRIV.to_string()] {
        let e = store.put(&id, KeyState::Pending, v.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("private key"), "{e}");
        let e = store.deny(&id, v.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("private key"), "{e}");
        let e = store
            .batch(|b| b.put(&id, KeyState::Accepted, v.as_bytes()))
            .unwrap_err();
        assert!(e.to_string().contains("private key"), "{e}");
    }
    assert_eq!(store.get(&id).unwrap(), None);
    assert_eq!(store.denied(&id).unwrap(), None);
    // The CLI never prints one either (get on an absent id: exit 1, no bytes).
    let o = keycache_exits(
        &[
            "get",
            &t.path().display().to_string(),
            "m1",
            "--size",
            "101",
        ],
        1,
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("PRIVATE"));
}
