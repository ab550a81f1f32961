//! The master config on the command line:
//!
//! - like `salt-key`, `get`, `accept`, `reject`, `delete` and `verify` take
//!   `-c DIR` (or `--master-config FILE`) and the ids alone: the store
//!   directory is then the config's, every argument an id (but a first one
//!   holding a `/`, which no id holds: the store directory, as before);
//!   the old `DIR ID...` form keeps working without `-c`;
//! - `migrate` says where its store directory came from (never "DIR
//!   given" when none was), and with a cluster config it reads the same
//!   minion tree whether the config's `pki_dir` is named or left out: the
//!   one Salt's own `pki.migrate_to_mmap` (`mmap_key.rebuild_from_localfs`)
//!   reads, which is the judge.

use crate::common::{
    keycache, keycache_exits, keycache_json, keycache_ok, keycache_ok_json, ok, open, pem, s,
    sized, stderr,
};

use std::path::{Path, PathBuf};

use keycache::{KeyState, MinionId, Store};
use serde_json::{json, Value};

fn id(s: &str) -> MinionId {
    MinionId::new(s).unwrap()
}

/// A config directory `etc` whose `master` names `pki` as pki_dir (and the
/// store's size); `pki` holds a store with `ids` pending.
fn configured(t: &Path, ids: &[&str]) -> (PathBuf, PathBuf, Store) {
    crate::common::configured_store(t, "", ids, |i| pem(i, 100))
}

fn state(st: &Store, i: &str) -> Option<KeyState> {
    st.get(&id(i)).unwrap().map(|e| e.state)
}

/// Each command with `-c DIR` and ids alone, and with `--master-config
/// FILE`: the config's store, every argument an id.
#[test]
fn every_command_takes_the_config_and_the_ids_alone() {
    let t = tempfile::tempdir().unwrap();
    let (etc, _pki, st) = configured(t.path(), &["m1", "m2", "m3", "m4", "m5"]);
    let file = etc.join("master");
    let c = s(&etc);
    let f = s(&file);

    let out = ok(&keycache(&["get", "-c", c, "m1"]));
    assert!(out.contains("id: m1\nstate: pending\n"), "{out}");
    let v = keycache_ok_json(&["get", "--master-config", f, "m2", "--json"]);
    assert_eq!(v["state"], "pending");

    ok(&keycache(&["accept", "-c", c, "m1", "m2", "m3"]));
    for i in ["m1", "m2", "m3"] {
        assert_eq!(state(&st, i), Some(KeyState::Accepted), "{i}");
    }
    ok(&keycache(&[
        "reject",
        "--master-config",
        f,
        "m3",
        "--include-all",
    ]));
    assert_eq!(state(&st, "m3"), Some(KeyState::Rejected));
    ok(&keycache(&["reject", "-c", c, "m4"]));
    assert_eq!(state(&st, "m4"), Some(KeyState::Rejected));

    // The example: `delete -c /etc/salt m1 m2`.
    ok(&keycache(&["delete", "-c", c, "m1", "m2"]));
    assert_eq!((state(&st, "m1"), state(&st, "m2")), (None, None));
    ok(&keycache(&["delete", "--master-config", f, "m3"]));
    assert_eq!(state(&st, "m3"), None);

    let out = ok(&keycache(&["verify", "-c", c]));
    assert!(out.contains("clean"), "{out}");
    let v = keycache_ok_json(&["verify", "--master-config", f, "--json"]);
    assert_eq!(v["clean"], true);

    ok(&keycache(&["delete", "-c", c, "--all", "-y"]));
    assert_eq!(st.counts().unwrap(), keycache::Counts::default());
}

/// Without `-c`, the first argument is the store directory, as before.
#[test]
fn the_dir_and_ids_form_keeps_working_without_the_config() {
    let t = tempfile::tempdir().unwrap();
    let (_etc, pki, st) = configured(t.path(), &["a", "b", "c"]);
    let p = s(&pki);
    let size = ["--size", "1009"];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(size.iter())
            .map(|x| x.to_string())
            .collect()
    };
    let run = |args: &[&str]| {
        let a = with(args);
        keycache(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let out = ok(&run(&["get", p, "a"]));
    assert!(out.contains("state: pending"), "{out}");
    ok(&run(&["accept", p, "a", "b"]));
    ok(&run(&["reject", p, "b", "--include-all"]));
    ok(&run(&["delete", p, "c"]));
    assert_eq!(state(&st, "a"), Some(KeyState::Accepted));
    assert_eq!(state(&st, "b"), Some(KeyState::Rejected));
    assert_eq!(state(&st, "c"), None);
    // A store made without a key tree: the tree is left out of the check.
    assert!(ok(&run(&["verify", p, "--tree", "never"])).contains("clean"));
    // `get DIR` without an id, `get DIR A B`: refused.
    for args in [vec!["get", p], vec!["get", p, "a", "b"]] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains("give one minion id"), "{}", stderr(&o));
    }
}

/// With `-c`, a first argument holding a `/` (which no minion id holds) is
/// still the store directory, overriding the config's (`-c DIR ID...`, as
/// the driver's tests and `list -c DIR` use it); any other is an id.
#[test]
fn with_the_config_a_path_first_is_the_store_directory_else_an_id() {
    let t = tempfile::tempdir().unwrap();
    let (etc, pki, st) = configured(t.path(), &["x1", "x2"]);
    // Another store than the config's, with its own x1.
    let other = t.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let st2 = open(&other, &sized(1009));
    st2.put(&id("x1"), KeyState::Pending, pem("o", 100).as_bytes())
        .unwrap();
    let c = s(&etc);
    let out = ok(&keycache(&["get", "-c", c, s(&other), "x1"]));
    assert!(out.contains("state: pending"), "{out}");
    ok(&keycache(&["accept", "-c", c, s(&other), "x1"]));
    assert_eq!(state(&st2, "x1"), Some(KeyState::Accepted));
    assert_eq!(
        state(&st, "x1"),
        Some(KeyState::Pending),
        "the config's store"
    );
    // A relative path with a slash is a directory too.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_keycache"))
        .args(["reject", "-c", c, "./pki", "x2"])
        .current_dir(t.path())
        .output()
        .unwrap();
    ok(&o);
    assert_eq!(state(&st, "x2"), Some(KeyState::Rejected));
    // Without a slash it is an id: `pki` is no key of the config's store.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_keycache"))
        .args(["delete", "-c", c, "pki", "x1"])
        .current_dir(t.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("keycache: pki: no such key"),
        "{}",
        stderr(&o)
    );
    assert_eq!(state(&st, "x1"), None, "x1 of {} deleted", s(&pki));
    let o = keycache_exits(&["get", "-c", c], 2);
    assert!(stderr(&o).contains("give one minion id"), "{}", stderr(&o));
    let o = keycache_exits(&["delete", "-c", c], 2);
    assert!(
        stderr(&o).contains("give minion ids or --all"),
        "{}",
        stderr(&o)
    );
}

/// `migrate -c` names where its store came from: the config's option, or
/// the argument that gave it; never "DIR given" when no DIR was.
#[test]
fn migrate_says_where_the_store_came_from() {
    let t = tempfile::tempdir().unwrap();
    let (etc, pki, _st) = configured(t.path(), &[]);
    std::fs::create_dir(pki.join("minions")).unwrap();
    let c = s(&etc);
    let o = keycache_ok(&["migrate", "-c", c, "--dry-run"]);
    let e = stderr(&o);
    assert!(
        e.contains(&format!("store: {} (pki_dir in master:1)", s(&pki))),
        "{e}"
    );
    assert!(!e.contains("given"), "{e}");
    let o = keycache(&["migrate", "-c", c, s(&pki), "--dry-run"]);
    assert!(
        stderr(&o).contains(&format!("store: {} (PKI_DIR given)", s(&pki))),
        "{}",
        stderr(&o)
    );
    let out = t.path().join("out");
    let o = keycache(&["migrate", "-c", c, "--out", s(&out), "--dry-run"]);
    assert!(
        stderr(&o).contains(&format!("store: {} (--out given)", s(&out))),
        "{}",
        stderr(&o)
    );
}

/// Salt's own migration (`mmap_key.rebuild_from_localfs`, what `salt-run
/// pki.migrate_to_mmap` runs) on a copy of the master: the counts of each
/// state it migrated.
fn salt_migrates(etc: &Path) -> Value {
    let script = "import json, sys\n\
                  import salt.config, salt.cache.mmap_key as mk\n\
                  opts = salt.config.master_config(sys.argv[1])\n\
                  mk.__opts__ = opts\n\
                  print(json.dumps(mk.rebuild_from_localfs(opts)))\n";
    let o = std::process::Command::new(keycache_testkit::common::python())
        .args(["-B", "-c", script, s(&etc.join("master"))])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("SALT_CONFIG_DIR")
        .env_remove("SALT_MASTER_CONFIG")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "Salt's migration failed: {}",
        stderr(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A cluster peer's config: `migrate -c` and `migrate -c PKI_DIR` (the
/// config's own pki_dir named) read the same tree, the one Salt's
/// migration reads (cluster_pki_dir), and write the same banks; with
/// cluster_pki_dir unset (Salt falls back to pki_dir), both read pki_dir.
#[test]
fn migrate_with_a_cluster_config_reads_the_tree_salt_reads_named_or_not() {
    for with_cluster_dir in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let etc = t.path().join("etc");
        let pki = t.path().join("pki");
        let cluster = t.path().join("cluster");
        std::fs::create_dir_all(&etc).unwrap();
        // Different trees in pki_dir and cluster_pki_dir.
        for (dir, sub, ids) in [
            (&pki, "minions", &["p-1", "p-2"][..]),
            (&cluster, "minions_pre", &["c-1"][..]),
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            for i in ids {
                std::fs::write(dir.join(sub).join(i), pem(i, 100)).unwrap();
            }
        }
        let mut conf = format!(
            "id: kc-test\npki_dir: {}\ncluster_id: c1\nmmap_key_size: 1009\n",
            pki.display()
        );
        if with_cluster_dir {
            conf += &format!("cluster_pki_dir: {}\n", cluster.display());
        }
        std::fs::write(etc.join("master"), conf).unwrap();
        let tree = if with_cluster_dir { &cluster } else { &pki };
        let mut reports = Vec::new();
        for named in [false, true] {
            let mut args = vec!["migrate", "-c", s(&etc), "--dry-run", "--json"];
            if named {
                args.push(s(&pki));
            }
            let (o, v) = keycache_json(&args);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            assert_eq!(v["pki_dir"], json!(s(tree)), "{args:?}: {v}");
            assert_eq!(v["target"], json!(s(tree)), "{args:?}: {v}");
            reports.push(v["migrated"].clone());
        }
        assert_eq!(reports[0], reports[1], "named or not");
        // Salt's migration, last: it writes the banks.
        let salt = salt_migrates(&etc);
        assert_eq!(reports[0], salt, "cluster_pki_dir set: {with_cluster_dir}");
        assert!(tree.join(".mmap_keys.idx").exists());
    }
}

/// The files of `pki`'s key tree, sorted.
fn tree_files(pki: &Path) -> Vec<String> {
    crate::common::tree_files(pki).into_iter().collect()
}

/// `keycache_tree` in the master config is what the commands keep in step
/// when `--tree` is not given: `accepted`, `minions/` alone (a reject then
/// writes no `minions_rejected/` file, and verify compares `minions/`
/// alone), `false` nothing; `--tree` overrides it; a value that is not
/// true, false or accepted is refused, naming the file and line, before
/// anything is written.
#[test]
fn the_configs_keycache_tree_is_the_commands_default() {
    let t = tempfile::tempdir().unwrap();
    let (etc, pki, st) = configured(t.path(), &["a", "b", "c", "d"]);
    let c = s(&etc);
    let master = std::fs::read_to_string(etc.join("master")).unwrap();
    let set = |tree: &str| {
        std::fs::write(
            etc.join("master"),
            format!("{master}keycache_tree: {tree}\n"),
        )
        .unwrap()
    };
    set("accepted");
    ok(&keycache(&["accept", "-c", c, "a", "b"]));
    ok(&keycache(&["reject", "-c", c, "b", "c", "--include-all"]));
    assert_eq!(tree_files(&pki), ["minions/a"]);
    let out = ok(&keycache(&["verify", "-c", c]));
    assert!(out.contains("clean"), "{out}");
    // The whole tree, asked for: b and c have no rejected files, d no
    // pending one.
    let (_, v) = keycache_json(&["verify", "-c", c, "--tree", "always", "--json"]);
    let found = v["tree"]["disagreements"]
        .as_array()
        .expect("tree checked")
        .len();
    assert_eq!(found, 3, "{v}");
    // A stray minions/ file is still found, and mended.
    std::fs::write(pki.join("minions/b"), pem("b", 100)).unwrap();
    let (_, v) = keycache_json(&["verify", "-c", c, "--json"]);
    assert_eq!(v["tree"]["disagreements"][0]["dir"], "minions", "{v}");
    assert_eq!(v["tree"]["disagreements"][0]["problem"], "stray", "{v}");
    // Never `clean` beside a finding of the tree.
    assert_eq!(v["clean"], false, "{v}");
    ok(&keycache(&["verify", "-c", c, "--repair"]));
    assert_eq!(tree_files(&pki), ["minions/a"]);
    // false: nothing written.
    set("false");
    ok(&keycache(&["accept", "-c", c, "d"]));
    assert_eq!(tree_files(&pki), ["minions/a"]);
    // --tree overrides the config.
    ok(&keycache(&["delete", "-c", c, "d", "--tree", "always"]));
    ok(&keycache(&[
        "accept",
        "-c",
        c,
        "c",
        "--include-all",
        "--tree",
        "always",
    ]));
    assert_eq!(tree_files(&pki), ["minions/a", "minions/c"]);
    // Anything else is refused before a write.
    set("accepted-only");
    let o = keycache(&["delete", "-c", c, "a"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("keycache_tree") && err.contains("master"),
        "{err}"
    );
    assert_eq!(state(&st, "a"), Some(KeyState::Accepted));
    assert_eq!(tree_files(&pki), ["minions/a", "minions/c"]);
}
