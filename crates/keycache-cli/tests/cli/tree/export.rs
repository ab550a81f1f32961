//! `keycache export` into a tree exported earlier makes the tree equal to
//! the store: files of ids no longer in a state are
//! removed, `--dry-run` shows it first, an entry export can neither replace
//! nor remove (a symlink, a directory, a FIFO) is an error before anything
//! is written, Salt's `.key_cache`, keycache's own `.keycache-*` files and
//! names that are not minion ids are left alone (a dot-id such as `.m` is
//! an id), and private key material is never written.

use crate::common::{
    export, keycache_ok, ok, open, pem, s, sized, stderr, stdout, strings, TREE_DIRS,
};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use keycache::{KeyState, MinionId, Store};

/// A store with `n` ids in each of the four states: `{state}-{i}`.
/// A new temporary directory with a [`store_with`] `n` keys per state in
/// `store/`, exported to `tree/`: the directory, both paths and the store.
fn exported(n: usize) -> (tempfile::TempDir, PathBuf, PathBuf, Store) {
    let t = tempfile::tempdir().unwrap();
    let sd = t.path().join("store");
    let tree = t.path().join("tree");
    let st = store_with(&sd, n);
    export(&sd, &tree).ok();
    (t, sd, tree, st)
}

fn store_with(dir: &Path, n: usize) -> Store {
    std::fs::create_dir_all(dir).unwrap();
    let st = open(dir, &sized(1009));
    for i in 0..n {
        for (state, tag) in [
            (KeyState::Accepted, "acc"),
            (KeyState::Pending, "pre"),
            (KeyState::Rejected, "rej"),
        ] {
            let id = MinionId::new(format!("{tag}-{i}")).unwrap();
            st.put(&id, state, pem(&format!("{tag}{i}"), 200).as_bytes())
                .unwrap();
        }
        let id = MinionId::new(format!("den-{i}")).unwrap();
        st.deny(&id, pem(&format!("den{i}"), 200).as_bytes())
            .unwrap();
    }
    st
}

/// Everything in the tree's state directories: `dir/name` -> content
/// (`symlink -> target`, `<dir>`, `<other>` for what is not a file).
fn snapshot(tree: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for d in TREE_DIRS {
        let Ok(rd) = std::fs::read_dir(tree.join(d)) else {
            continue;
        };
        for e in rd {
            let e = e.unwrap();
            let name = format!("{d}/{}", e.file_name().to_string_lossy());
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let v = if md.file_type().is_symlink() {
                format!(
                    "symlink -> {}",
                    std::fs::read_link(e.path()).unwrap().display()
                )
                .into_bytes()
            } else if md.is_dir() {
                b"<dir>".to_vec()
            } else if md.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                b"<other>".to_vec()
            };
            m.insert(name, v);
        }
    }
    m
}

/// The tree the store should give: `dir/id` -> key.
fn expected(st: &Store) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for r in st.keys(None).unwrap() {
        let (id, e) = r.unwrap();
        m.insert(format!("{}/{id}", e.state.dir_name()), e.public_key);
    }
    for r in st.denied_keys().unwrap() {
        let (id, k) = r.unwrap();
        m.insert(format!("minions_denied/{id}"), k);
    }
    m
}

#[test]
fn export_follows_every_change_in_every_state() {
    let (t, sd, tree, st) = exported(3);
    assert_eq!(snapshot(&tree), expected(&st));

    // Every kind of change, in every state.
    let id = |s: &str| MinionId::new(s).unwrap();
    st.remove(&id("acc-0")).unwrap(); // delete an accepted key
    st.remove(&id("pre-0")).unwrap(); // a pending one
    st.remove(&id("rej-0")).unwrap(); // a rejected one
    st.remove_denied(&id("den-0")).unwrap(); // a denied one
    st.set_state(&id("pre-1"), KeyState::Accepted).unwrap(); // accept
    st.set_state(&id("pre-2"), KeyState::Rejected).unwrap(); // reject
    st.set_state(&id("acc-1"), KeyState::Rejected).unwrap(); // reject an accepted key
    st.set_state(&id("rej-1"), KeyState::Accepted).unwrap(); // accept a rejected key
    st.set_state(&id("acc-2"), KeyState::Pending).unwrap(); // back to pending
    st.deny(&id("acc-2"), pem("acc2-denied", 200).as_bytes())
        .unwrap(); // deny beside a key
    st.put(
        &id("rej-2"),
        KeyState::Rejected,
        pem("new-rej2", 210).as_bytes(),
    )
    .unwrap(); // re-put with another key, same state
    st.put(
        &id("den-1"),
        KeyState::Pending,
        pem("den1-pending", 200).as_bytes(),
    )
    .unwrap(); // a denied id also pending
    st.put(
        &id("fresh"),
        KeyState::Accepted,
        pem("fresh", 200).as_bytes(),
    )
    .unwrap();

    let before = snapshot(&tree);
    let want = expected(&st);
    let stale: Vec<String> = before
        .keys()
        .filter(|k| !want.contains_key(*k))
        .map(|k| s(&tree.join(k)).to_owned())
        .collect();
    assert_eq!(stale.len(), 9, "{stale:?}");

    // --dry-run shows the removals first and changes nothing.
    let (o, v) = export(&sd, &tree)
        .args(["--dry-run", "--json"])
        .output_json();
    assert_eq!(o.status.code(), Some(1), "rej-2 differs: {}", stderr(&o));
    assert_eq!(v["dry_run"], true);
    let removed: Vec<String> = v["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_owned())
        .collect();
    let mut sorted = stale.clone();
    sorted.sort();
    assert_eq!(removed, sorted);
    assert_eq!(
        v["conflicts"],
        serde_json::json!([s(&tree.join("minions_rejected/rej-2"))])
    );
    assert_eq!(snapshot(&tree), before, "a dry run wrote");
    let o = export(&sd, &tree).args(["--dry-run"]).output();
    let text = stdout(&o);
    assert!(text.starts_with("would export to "), "{text}");
    for p in &stale {
        assert!(
            text.contains(&format!("would remove: {p}\n")),
            "{p}: {text}"
        );
    }
    assert_eq!(snapshot(&tree), before, "a dry run wrote");

    // Without --force the changed key is a conflict (exit 1), the rest is done.
    let o = export(&sd, &tree).fails_output(1);
    assert!(stderr(&o).contains("rej-2: exists with different content"));
    let text = stdout(&o);
    for p in &stale {
        assert!(text.contains(&format!("removed: {p}\n")), "{p}: {text}");
    }
    let mut got = snapshot(&tree);
    assert_eq!(
        got.remove("minions_rejected/rej-2").unwrap(),
        pem("rej2", 200).into_bytes()
    );
    let mut want_but_rej2 = want.clone();
    want_but_rej2.remove("minions_rejected/rej-2");
    assert_eq!(got, want_but_rej2);

    // --force: the tree is the store.
    let v = export(&sd, &tree).args(["--force", "--json"]).json();
    assert_eq!(v["written"], 1);
    assert_eq!(v["removed"], serde_json::json!([]));
    assert_eq!(snapshot(&tree), want);

    // A Salt master reading the tree sees the store: the round trip is equal.
    let back = t.path().join("back");
    keycache_ok(&["migrate", s(&tree), "--out", s(&back), "--size", "1009"]);
    keycache_ok(&["diff", s(&sd), s(&back), "--size", "1009"]);

    // Deleting everything leaves empty state directories.
    let ids: Vec<String> = st.keys(None).unwrap().map(|r| r.unwrap().0).collect();
    for i in &ids {
        st.remove(&id(i)).unwrap();
    }
    let ids: Vec<String> = st.denied_keys().unwrap().map(|r| r.unwrap().0).collect();
    for i in &ids {
        st.remove_denied(&id(i)).unwrap();
    }
    let v = export(&sd, &tree).args(["--json"]).json();
    assert_eq!(v["removed"].as_array().unwrap().len(), want.len());
    assert!(snapshot(&tree).is_empty());
    for d in TREE_DIRS {
        assert!(tree.join(d).is_dir(), "{d} kept");
    }
}

#[test]
fn export_refuses_what_it_can_neither_replace_nor_remove_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let sd = t.path().join("store");
    let st = store_with(&sd, 2);
    let outside = t.path().join("outside");
    std::fs::write(&outside, b"not yours").unwrap();
    // Each form: what is planted, under which name.
    type Plant = fn(&Path, &Path);
    let forms: [(&str, &str, Plant); 6] = [
        // a symlink in place of a key file the store holds
        ("minions/acc-0", "symlink", |p, o| {
            std::os::unix::fs::symlink(o, p).unwrap()
        }),
        // a symlink under an id the store no longer holds (to remove)
        ("minions/gone", "symlink", |p, o| {
            std::os::unix::fs::symlink(o, p).unwrap()
        }),
        // a dangling symlink under a denied id
        ("minions_denied/den-1", "symlink", |p, _| {
            std::os::unix::fs::symlink("/nonexistent/key", p).unwrap()
        }),
        // a directory in place of a key file
        ("minions_pre/pre-1", "directory", |p, _| {
            std::fs::create_dir(p).unwrap()
        }),
        // a directory under a stale id
        ("minions_rejected/old", "directory", |p, _| {
            std::fs::create_dir(p).unwrap()
        }),
        // a FIFO under a key's name (never opened: it would block)
        ("minions_rejected/rej-0", "regular file", |p, _| {
            let st = Command::new("mkfifo").arg(p).status().unwrap();
            assert!(st.success());
        }),
    ];
    for (i, (name, what, plant)) in forms.iter().enumerate() {
        let tree = t.path().join(format!("tree{i}"));
        export(&sd, &tree).ok();
        // The store changes (so export has writes and removals to make)...
        st.put(
            &MinionId::new(format!("new-{i}")).unwrap(),
            KeyState::Accepted,
            pem(&format!("new{i}"), 200).as_bytes(),
        )
        .unwrap();
        let gone = MinionId::new("acc-1").unwrap();
        let gone_entry = st.get(&gone).unwrap();
        st.remove(&gone).unwrap();
        // ...and the tree gets something export must not touch.
        let p = tree.join(name);
        let _ = std::fs::remove_file(&p);
        plant(&p, &outside);
        let before = snapshot(&tree);
        for extra in [
            &[][..],
            &["--force"][..],
            &["--dry-run"][..],
            &["--json"][..],
        ] {
            let o = export(&sd, &tree).args(extra).output();
            assert_eq!(o.status.code(), Some(2), "{name} {extra:?}: {}", stderr(&o));
            let e = stderr(&o);
            assert!(e.contains(s(&p)), "{name}: the message names the file: {e}");
            assert!(
                e.contains(what) || e.contains("not a regular file"),
                "{name}: {e}"
            );
            assert!(!e.contains("panicked"), "{e}");
            assert_eq!(
                snapshot(&tree),
                before,
                "{name} {extra:?}: the tree changed"
            );
            assert_eq!(std::fs::read(&outside).unwrap(), b"not yours");
        }
        // Restore the store for the next form.
        let e = gone_entry.unwrap();
        st.put(&gone, e.state, &e.public_key).unwrap();
    }
    // The pki dir itself a symlink: refused.
    let real = t.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let o = export(&sd, &link).fails_output(2);
    assert!(stderr(&o).contains(s(&link)));
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
    // A state directory that is a symlink: refused.
    let tree = t.path().join("tree-dirlink");
    std::fs::create_dir(&tree).unwrap();
    std::os::unix::fs::symlink(&real, tree.join("minions")).unwrap();
    let o = export(&sd, &tree).fails_output(2);
    assert!(
        stderr(&o).contains(s(&tree.join("minions"))),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
}

#[test]
fn export_leaves_salts_and_its_own_files_and_names_that_are_not_ids_alone() {
    let (_t, sd, tree, _st) = exported(1);
    // A dot-id is an id: a key file the store does not hold, removed.
    let dot_id = tree.join("minions_pre/.hidden-minion");
    std::fs::write(&dot_id, pem("hidden", 200)).unwrap();
    let planted: [(&str, &[u8]); 4] = [
        ("minions/.key_cache", b"salt's cache"),
        ("minions_pre/.keycache-tree.1.x", b"a tree temporary"),
        ("minions/back\\slash", b"not a valid id"),
        (
            "minions_denied/.keycache-export.1.x",
            b"an old temporary file",
        ),
    ];
    for (name, bytes) in planted {
        std::fs::write(tree.join(name), bytes).unwrap();
    }
    // A name that is not UTF-8.
    let bad = tree.join("minions_pre").join(OsStr::from_bytes(b"caf\xe9"));
    std::fs::write(&bad, b"latin-1 name").unwrap();
    let mut before = snapshot(&tree);
    before.remove("minions_pre/.hidden-minion").unwrap();

    let v = export(&sd, &tree).args(["--json"]).json();
    assert_eq!(v["removed"], serde_json::json!([s(&dot_id)]));
    assert!(!dot_id.exists());
    let ignored: Vec<&str> = strings(&v["ignored"]);
    let backslash = tree.join("minions/back\\slash");
    assert_eq!(ignored.len(), 2, "{ignored:?}");
    assert!(ignored.contains(&s(&backslash)), "{ignored:?}");
    assert!(
        ignored.iter().any(|p| p.contains("minions_pre/caf")),
        "{ignored:?}"
    );
    assert_eq!(
        snapshot(&tree),
        before,
        "the dot-id removed, nothing else changed"
    );
    let o = export(&sd, &tree).ok_output();
    let text = stdout(&o);
    assert!(
        text.contains(&format!("left alone: {} (not a minion id)", s(&backslash))),
        "{text}"
    );
    assert!(
        !text.contains(".key_cache") && !text.contains(".keycache-"),
        "Salt's and keycache's files are not reported: {text}"
    );
    assert_eq!(snapshot(&tree), before);
}

#[test]
fn export_into_a_bare_relative_name() {
    let t = tempfile::tempdir().unwrap();
    let sd = t.path().join("store");
    let st = store_with(&sd, 1);
    for _ in 0..2 {
        let o = Command::new(env!("CARGO_BIN_EXE_keycache"))
            .args(["export", s(&sd), "--to", "out", "--size", "1009"])
            .current_dir(t.path())
            .output()
            .unwrap();
        ok(&o);
        assert!(!stderr(&o).contains(": stat"), "{}", stderr(&o));
        assert_eq!(snapshot(&t.path().join("out")), expected(&st));
    }
    assert_eq!(
        std::fs::metadata(t.path().join("out"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
}

/// A PEM public key followed by a private key block.
fn with_private(tag: &str) -> Vec<u8> {
    format!(
        "{}-----BEGIN RSA PRIVATE KEY-----\nU0VDUkVUU0VDUkVU{tag}\n-----END RSA PRIVATE KEY-----\n",
        pem(tag, 100)
    )
    .into_bytes()
}

#[test]
fn export_withholds_private_key_material() {
    let (_t, sd, tree, st) = exported(1);
    // The library refuses such values; write them at the table level.
    st.keys_table()
        .put(
            b"leaky",
            &keycache::store::encode_key_value(KeyState::Accepted, &with_private("leaky")),
        )
        .unwrap();
    st.keys_table()
        .put(
            b"acc-0",
            &keycache::store::encode_key_value(KeyState::Accepted, &with_private("acc0")),
        )
        .unwrap();
    st.denied_table()
        .put(b"den-0", &with_private("den0"))
        .unwrap();
    let before_acc0 = std::fs::read(tree.join("minions/acc-0")).unwrap();
    let o = export(&sd, &tree).args(["--dry-run"]).fails_output(2);
    assert!(
        stdout(&o).contains(&format!("would remove: {}", s(&tree.join("minions/acc-0")))),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        std::fs::read(tree.join("minions/acc-0")).unwrap(),
        before_acc0
    );
    for extra in [&[][..], &["--force"][..], &["--json"][..]] {
        let o = export(&sd, &tree).args(extra).output();
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        let e = stderr(&o);
        for id in ["leaky", "acc-0", "den-0"] {
            assert!(
                e.contains(&format!("keycache: {id}: withheld")),
                "{id}: {e}"
            );
        }
        for (dir, id) in [
            ("minions", "leaky"),
            ("minions", "acc-0"),
            ("minions_denied", "den-0"),
        ] {
            let f = tree.join(dir).join(id);
            if let Ok(b) = std::fs::read(&f) {
                assert!(
                    !String::from_utf8_lossy(&b).contains("PRIVATE KEY"),
                    "{} holds private key material",
                    f.display()
                );
            }
        }
        assert!(!tree.join("minions/leaky").exists());
        // A file already there for a withheld id is left as it was, except
        // in minions/: the store does not vouch for its key.
        assert!(!tree.join("minions/acc-0").exists());
        assert!(tree.join("minions_denied/den-0").exists());
        assert!(!stdout(&o).contains("PRIVATE"));
    }
}

#[test]
fn export_json_and_text_report_the_same_plan() {
    let (_t, sd, tree, st) = exported(2);
    st.remove(&MinionId::new("pre-1").unwrap()).unwrap();
    let v = export(&sd, &tree).args(["--dry-run", "--json"]).json();
    assert_eq!(
        v,
        serde_json::json!({
            "conflicts": [],
            "dry_run": true,
            "ignored": [],
            "removed": [s(&tree.join("minions_pre/pre-1"))],
            "replaced": [],
            "unchanged": 7,
            "withheld": [],
            "written": 0,
        })
    );
    let o = export(&sd, &tree).output();
    assert_eq!(
        stdout(&o),
        format!(
            "exported to {}: 0 written, 7 unchanged, 1 removed\nremoved: {}\n",
            s(&tree),
            s(&tree.join("minions_pre/pre-1"))
        )
    );
    assert!(!tree.join("minions_pre/pre-1").exists());
}
