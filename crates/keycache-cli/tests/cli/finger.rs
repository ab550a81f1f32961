//! Fingerprint-guarded changes: `keycache get` shows the key's fingerprint
//! exactly as Salt 3008.5's `salt.utils.crypt.pem_finger` (what `salt-key
//! -f` prints) computes it; `accept`, `reject`, `deny` and `delete` with
//! `--finger` change the key only if it is that key (a wrong fingerprint,
//! or a key replaced by another sign-in between the look and the accept,
//! exits 2 and writes nothing, naming both fingerprints); `delete --state`
//! removes one entry of an id and keeps the other bank's. Salt's own
//! `mmap_key` reads every result.

use std::path::Path;
use std::process::Command;

use crate::common::{
    files, files_changed, keycache_exits, keycache_ok, keycache_ok_json, s, salt, sized, SIZE_1009,
};
use keycache::{KeyState, MinionId};

/// Salt 3008.5's `pem_finger` of `pem`, as `salt-key -f` computes it for a
/// key of the key cache.
fn salt_finger(pem: &str) -> String {
    let o = Command::new(crate::common::python())
        .args([
            "-c",
            "import sys, salt.utils.crypt as c; print(c.pem_finger(key=sys.stdin.read().encode()))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(pem.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim().to_owned()
}

fn with_size<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(SIZE_1009);
    v
}

/// Salt's own `mmap_key` view: (state of `id` in keys, its denied keys).
fn salt_view(dir: &Path, id: &str) -> (Option<String>, Vec<String>) {
    let d = salt(dir, &sized(1009), &["dump"], None);
    let state = d["keys"][id]["state"].as_str().map(str::to_owned);
    let denied = d["denied_keys"][id]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    (state, denied)
}

#[test]
fn changes_guarded_by_a_fingerprint_take_only_the_key_looked_at() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let st = crate::common::open(&dir, &sized(1009));
    let (a, b) = (
        crate::common::pem("web-1 first key", 400),
        crate::common::pem("web-1 second key", 400),
    );
    let id = MinionId::new("web-1").unwrap();
    st.put(&id, KeyState::Pending, a.as_bytes()).unwrap();
    let d = s(&dir);

    // `get` shows Salt's fingerprint.
    let v = keycache_ok_json(&with_size(&["get", d, "web-1", "--json"]));
    let fa = salt_finger(&a);
    assert_eq!(v["finger"], fa);
    assert_eq!(fa.len(), 95, "{fa}");
    let text = crate::common::stdout(&keycache_ok(&with_size(&["get", d, "web-1"])));
    assert!(text.contains(&format!("finger: {fa}")), "{text}");

    // A wrong fingerprint: exit 2, both named, nothing written.
    let fb = salt_finger(&b);
    let before = files(&dir);
    let o = keycache_exits(&with_size(&["accept", d, "web-1", "--finger", &fb]), 2);
    let err = crate::common::stderr(&o);
    assert!(err.contains(&fa) && err.contains(&fb), "{err}");
    assert_eq!(files_changed(&before, &files(&dir)), Vec::<String>::new());
    assert_eq!(salt_view(&dir, "web-1").0.as_deref(), Some("pending"));
    // Not a fingerprint, or more than one id: refused before anything.
    keycache_exits(&with_size(&["accept", d, "web-1", "--finger", "ab:cd"]), 2);
    keycache_exits(
        &with_size(&["accept", d, "web-1", "web-2", "--finger", &fa]),
        2,
    );

    // The operator looked at key a; another sign-in replaced it with b
    // (the minion deleted and back with another key) before the accept.
    st.remove(&id).unwrap();
    st.put(&id, KeyState::Pending, b.as_bytes()).unwrap();
    let before = files(&dir);
    let o = keycache_exits(&with_size(&["accept", d, "web-1", "--finger", &fa]), 2);
    assert!(crate::common::stderr(&o).contains(&fb));
    assert_eq!(files_changed(&before, &files(&dir)), Vec::<String>::new());
    assert_eq!(salt_view(&dir, "web-1").0.as_deref(), Some("pending"));

    // The right one (without colons, upper case: the same digits).
    let plain = fb.replace(':', "").to_uppercase();
    keycache_ok(&with_size(&["accept", d, "web-1", "--finger", &plain]));
    assert_eq!(salt_view(&dir, "web-1").0.as_deref(), Some("accepted"));

    // An accepted key and a denied key (another key presented under the
    // id): delete --state accepted keeps the denied one.
    st.deny(&id, a.as_bytes()).unwrap();
    keycache_exits(
        &with_size(&["delete", d, "web-1", "--state", "accepted", "--finger", &fa]),
        2,
    );
    keycache_ok(&with_size(&[
        "delete", d, "web-1", "--state", "accepted", "--finger", &fb,
    ]));
    let (state, denied) = salt_view(&dir, "web-1");
    assert_eq!(state, None, "the accepted key is gone");
    assert_eq!(denied, vec![a.clone()], "the denied key is kept");
    // --state denied, guarded by the denied key's fingerprint.
    keycache_ok(&with_size(&[
        "delete", d, "web-1", "--state", "denied", "--finger", &fa,
    ]));
    assert_eq!(salt_view(&dir, "web-1"), (None, vec![]));
    // --state is for delete only.
    keycache_exits(&with_size(&["accept", d, "web-1", "--state", "pending"]), 2);
}
