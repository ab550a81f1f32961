//! `keycache deny` on a local store: Salt's `Key.change_state(...,
//! "minions_denied")`, checked against the same change made by Salt's own
//! `mmap_key` driver on a copy of the store (the etcd path is in `etcd`).

use serde_json::json;

use crate::common::{keycache, keycache_ok, keycache_ok_json, s, salt, sample_store_dir, small};
use keycache_testkit::crash::copy_tree;

#[test]
fn deny_moves_a_key_to_denied_keys_as_salt_does() {
    let (t, st) = sample_store_dir();
    let d = s(&st);
    let layout = small(1009, 1 << 30);
    let id = "laptop-jdoe";
    let before = keycache_ok_json(&["get", d, id, "--json"]);
    assert_eq!(before["state"], "pending");
    let pem = before["pub"].as_str().expect("pub").to_owned();
    // What salt/key.py's change_state does to move a key to DEN, through
    // Salt's own driver, on a copy: flush `keys`, store `denied_keys` [pub].
    let by_salt = t.path().join("by-salt");
    copy_tree(&st, &by_salt);
    salt(
        &by_salt,
        &layout,
        &["apply"],
        Some(&json!([
            {"op": "flush", "bank": "keys", "id": id},
            {"op": "store", "bank": "denied_keys", "id": id, "pub": pem},
        ])),
    );

    let out = keycache_ok(&["deny", d, id]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "Key for minion {id} denied.\n\
             Key tree: wrote minions_denied/{id}.\n\
             Key tree: removed minions_pre/{id}.\n"
        )
    );
    // The banks equal what Salt's driver made.
    let diff = keycache(&["diff", d, s(&by_salt)]);
    assert_eq!(
        diff.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    // Salt reads it as denied, and no longer as a key.
    let v = salt(&st, &layout, &["dump"], None);
    assert!(v["keys"].get(id).is_none(), "{v}");
    assert!(v["denied_keys"].get(id).is_some(), "{v}");
    let after = keycache_ok_json(&["get", d, id, "--json"]);
    assert_eq!(after["denied_pub"], pem.as_str(), "{after}");

    // An accepted key needs --include-all; then its file leaves minions/.
    let acc = "db-01.dc1.example.com";
    let refused = keycache(&["deny", d, acc]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains(&format!("{acc}: is accepted; add --include-all to deny it")),
        "{refused:?}"
    );
    assert!(st.join("minions").join(acc).is_file());
    keycache_ok(&["deny", d, acc, "--include-all"]);
    assert!(!st.join("minions").join(acc).exists());
    assert!(st.join("minions_denied").join(acc).is_file());

    // Absent: exit 1. --all: every pending key, and nothing else.
    assert_eq!(keycache(&["deny", d, "nobody"]).status.code(), Some(1));
    let (_, listed) = crate::common::keycache_json(&["list", d, "--json"]);
    let pending = listed["minions_pre"].as_array().expect("pending").clone();
    let accepted = listed["minions"].as_array().expect("accepted").len();
    assert!(!pending.is_empty());
    let v = keycache_ok_json(&["deny", d, "--all", "--json"]);
    let sorted = |v: &serde_json::Value| {
        let mut ids: Vec<String> = v
            .as_array()
            .expect("ids")
            .iter()
            .map(|i| i.as_str().expect("id").to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(sorted(&v["denied"]), sorted(&json!(pending)), "{v}");
    let (_, listed) = crate::common::keycache_json(&["list", d, "--json"]);
    assert_eq!(listed["minions_pre"], json!([]));
    assert_eq!(
        listed["minions"].as_array().expect("accepted").len(),
        accepted
    );
}
