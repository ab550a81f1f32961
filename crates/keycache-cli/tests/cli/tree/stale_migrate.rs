//! A second `keycache migrate -c DIR` into an existing store never changes
//! a key's state silently. Between two migrations the store moves on (an
//! accept, a rejection) while the tree keeps files from before the first
//! (with `keycache_tree: accepted` or `false`, `minions_pre/<id>` is never
//! removed): read again, such a file would take an accepted key back to
//! pending while its `minions/<id>` stays (Salt's validate_token keeps
//! admitting the minion), and a rejected key back to pending.
//!
//! In each `keycache_tree` mode (the one the accept and the rejection kept
//! the tree with): the migration refuses (exit 2) changes out of accepted
//! or rejected made by files older than the store's entries, naming the
//! ids and files, with every file of the pki_dir byte for byte what it
//! was; its dry run lists the changes; `--replace-states` makes them, and
//! afterwards no `minions/<id>` exists for an id the store does not hold
//! accepted. The minions have real key pairs: at each step Salt 3008.5's
//! own `validate_token` lets in exactly the ids the store holds accepted.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::common::{
    files, files_changed, kc, open, sized, stderr, stdout, validate_token, vt_keygen, TREE_DIRS,
};
use keycache::{KeyState, MinionId};
use serde_json::Value;

const IDS: [&str; 3] = ["web-1", "web-2", "web-3"];

/// Real key pairs of [`IDS`], made once per test: (their directory, the
/// public keys).
fn keypairs(t: &Path) -> (PathBuf, std::collections::BTreeMap<String, String>) {
    let dir = t.join("keypairs");
    let pubs = vt_keygen(&dir, &IDS).into_iter().collect();
    (dir, pubs)
}

/// Salt's `validate_token` lets in exactly the ids the store holds accepted.
fn judge(keys: &Path, pki: &Path, ctx: &str) {
    for (id, valid) in validate_token::check(keys, pki, &IDS) {
        let id = id.as_str();
        assert_eq!(
            valid,
            Some(state(pki, id) == Some(KeyState::Accepted)),
            "{ctx}: validate_token({id}) against the store's {:?}",
            state(pki, id)
        );
    }
}

thread_local! {
    static PUBS: std::cell::RefCell<std::collections::BTreeMap<String, String>> =
        Default::default();
}

fn pem(id: &str, _len: usize) -> String {
    PUBS.with(|p| p.borrow()[id].clone())
}

/// A file's mtime set an hour back: written before the store's entries.
fn age(path: &Path) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
}

/// Writes the key file `dir/id` (the key of `id`), an hour old.
fn plant(pki: &Path, dir: &str, id: &str) {
    let p = pki.join(dir).join(id);
    std::fs::write(&p, pem(id, 100)).unwrap();
    age(&p);
}

/// A master config in `t/etc` for the pki_dir `t/pki` with `keycache_tree:
/// tree`, and that pki_dir's tree: web-1 and web-2 pending, web-3
/// accepted, every file an hour old. Returns (etc, pki).
fn master(t: &Path, tree: &str) -> (PathBuf, PathBuf) {
    let etc = t.join("etc");
    let pki = t.join("pki");
    std::fs::create_dir_all(&etc).unwrap();
    for d in TREE_DIRS {
        std::fs::create_dir_all(pki.join(d)).unwrap();
    }
    std::fs::write(
        etc.join("master"),
        format!(
            "pki_dir: {}\nmmap_key_size: 1009\nkeys.cache_driver: mmap_key\nkeycache_tree: {tree}\n",
            pki.display()
        ),
    )
    .unwrap();
    plant(&pki, "minions_pre", "web-1");
    plant(&pki, "minions_pre", "web-2");
    plant(&pki, "minions", "web-3");
    (etc, pki)
}

/// `keycache migrate -c ETC --no-master-keys MORE`.
fn migrate(etc: &Path, more: &[&str]) -> std::process::Output {
    kc().arg("migrate")
        .arg("-c")
        .arg(etc)
        .arg("--no-master-keys")
        .args(more)
        .no_settle()
        .output()
}

/// The store's state of `id`.
fn state(pki: &Path, id: &str) -> Option<KeyState> {
    open(pki, &sized(1009))
        .get(&MinionId::new(id).unwrap())
        .unwrap()
        .map(|e| e.state)
}

/// The `changes` of a migration's JSON report: (id, from, to, file, stale).
fn changes(v: &Value) -> Vec<(String, String, String, String, bool)> {
    v["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no changes in {v}"))
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["from"].as_str().unwrap().to_owned(),
                c["to"].as_str().unwrap_or("absent").to_owned(),
                c["file"].as_str().unwrap_or_default().to_owned(),
                c["stale"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Asserts that every `minions/<id>` file of `pki` is of an id the store
/// holds accepted.
fn minions_only_accepted(pki: &Path, ctx: &str) {
    for e in std::fs::read_dir(pki.join("minions")).unwrap() {
        let id = e.unwrap().file_name().to_string_lossy().into_owned();
        assert_eq!(
            state(pki, &id),
            Some(KeyState::Accepted),
            "{ctx}: minions/{id} left for a key the store does not hold accepted"
        );
    }
}

#[test]
fn a_second_migration_never_changes_a_keys_state_silently() {
    let kt = tempfile::tempdir().unwrap();
    let (keys, pubs) = keypairs(kt.path());
    PUBS.with(|p| *p.borrow_mut() = pubs);
    for tree in ["true", "accepted", "false"] {
        let t = tempfile::tempdir().unwrap();
        let (etc, pki) = master(t.path(), tree);
        let c = etc.to_str().unwrap();
        let out = migrate(&etc, &[]);
        assert_eq!(out.status.code(), Some(0), "{tree}: {}", stderr(&out));
        // The store moves on: web-1 accepted, web-2 rejected, the tree
        // kept as keycache_tree says.
        kc().args(["accept", "-c", c, "web-1"]).no_settle().ok();
        kc().args(["reject", "-c", c, "web-2", "--include-all"])
            .no_settle()
            .ok();
        assert_eq!(state(&pki, "web-1"), Some(KeyState::Accepted));
        assert_eq!(state(&pki, "web-2"), Some(KeyState::Rejected));
        // The files left from before the first migration, as a tree not
        // kept whole has them: minions_pre/web-1 beside minions/web-1,
        // minions_pre/web-2 with no rejected file.
        plant(&pki, "minions_pre", "web-1");
        plant(&pki, "minions_pre", "web-2");
        if !pki.join("minions/web-1").exists() {
            plant(&pki, "minions", "web-1");
        }
        let _ = std::fs::remove_file(pki.join("minions_rejected/web-2"));
        judge(&keys, &pki, &format!("{tree}: before"));
        let before = files(t.path());

        // Refused, naming the ids and files; nothing written.
        let out = migrate(&etc, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{tree}: {err}");
        for w in [
            "\"web-1\": store accepted",
            "\"web-2\": store rejected",
            &pki.join("minions_pre/web-1").display().to_string(),
            &pki.join("minions_pre/web-2").display().to_string(),
            "--replace-states",
        ] {
            assert!(
                err.contains(w),
                "{tree}: the refusal does not say {w:?}: {err}"
            );
        }
        assert_eq!(
            files_changed(&before, &files(t.path())),
            Vec::<String>::new(),
            "{tree}: a refused migration changed files"
        );
        judge(&keys, &pki, &format!("{tree}: refused"));

        // The dry run lists the changes and writes nothing.
        let out = migrate(&etc, &["--dry-run", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{tree}: {}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let pre = |id: &str| pki.join("minions_pre").join(id).display().to_string();
        let want = vec![
            (
                "web-1".into(),
                "accepted".into(),
                "pending".into(),
                pre("web-1"),
                true,
            ),
            (
                "web-2".into(),
                "rejected".into(),
                "pending".into(),
                pre("web-2"),
                true,
            ),
        ];
        let mut got = changes(&v);
        got.sort();
        assert_eq!(got, want, "{tree}: {v}");
        assert_eq!(
            v["minions_removed"],
            serde_json::json!([pki.join("minions/web-1")]),
            "{tree}: {v}"
        );
        assert!(stderr(&out).contains("--replace-states"), "{tree}");
        let text = stdout(&migrate(&etc, &["--dry-run"]));
        assert!(
            text.contains(&format!(
                "would change: web-1 accepted -> pending by {}",
                pre("web-1")
            )),
            "{tree}: {text}"
        );
        assert_eq!(
            files_changed(&before, &files(t.path())),
            Vec::<String>::new(),
            "{tree}: a dry run changed files"
        );

        // Asked for: the changes are made, reported, and minions/web-1 goes.
        let out = migrate(&etc, &["--replace-states", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{tree}: {}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut got = changes(&v);
        got.sort();
        assert_eq!(got, want, "{tree}: {v}");
        assert_eq!(state(&pki, "web-1"), Some(KeyState::Pending), "{tree}");
        assert_eq!(state(&pki, "web-2"), Some(KeyState::Pending), "{tree}");
        assert_eq!(state(&pki, "web-3"), Some(KeyState::Accepted), "{tree}");
        assert!(!pki.join("minions/web-1").exists(), "{tree}");
        assert!(pki.join("minions/web-3").is_file(), "{tree}");
        minions_only_accepted(&pki, tree);
        judge(&keys, &pki, &format!("{tree}: replaced"));
    }
}
