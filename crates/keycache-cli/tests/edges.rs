//! The CLI's edges (issue 15, classes 1, 4 and 6): layouts that are not the
//! files' refused by every command, private key material never printed,
//! a closed stdout, bench arguments, unreadable stores, compact's load
//! limit, `--user`, migrate's target directory, accept/delete arguments and
//! confirmation, the notice of a wait for a bank's lock, and escaped ids.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{keycache, keycache_json, pem, salt, small};
use keycache::{KeyState, MinionId, OpenOptions, Params, Store};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_keycache");

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn sample() -> PathBuf {
    common::repo().join("tools/sample-pki")
}

/// The sample tree migrated into `dir` (table size 1009).
fn sample_store(dir: &Path) {
    let o = keycache(&["migrate", s(&sample()), "--out", s(dir), "--size", "1009"]);
    assert!(o.status.success(), "{}", err(&o));
}

fn open(dir: &Path, size: u64) -> Store {
    let opts = OpenOptions {
        params: Params {
            size,
            ..Params::default()
        },
        ..OpenOptions::default()
    };
    Store::open_with(dir, &opts).unwrap()
}

/// Every file of a directory (not recursive), by name: the store's bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap_or_default(),
                )
            })
            .collect()
        })
        .unwrap_or_default()
}

fn no_panic(o: &Output, what: &str) {
    assert!(
        !err(o).contains("panicked") && o.status.code() != Some(101),
        "{what}: {}",
        err(o)
    );
}

// ---- class 1: a layout that is not the files' -----------------------------

#[test]
fn every_command_refuses_a_layout_that_is_not_the_files_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    let before = files(&st);
    let tree = t.path().join("tree");
    let sample = sample();
    // A smaller segment cap is not among them: it fits any files (writes
    // roll to a new segment, as Salt's do).
    let layouts: [&[&str]; 3] = [
        &["--size", "1009", "--id-size", "32"],
        &["--size", "1009", "--slot-size", "128"],
        &["--size", "2003"],
    ];
    let commands: Vec<Vec<&str>> = vec![
        vec!["list", s(&st)],
        vec!["list", s(&st), "--include-pub", "--json"],
        vec!["get", s(&st), "laptop-jdoe"],
        vec!["stats", s(&st)],
        vec!["diff", s(&st), s(&st)],
        vec!["export", s(&st), "--to", s(&tree)],
        vec!["bench", s(&st), "--seconds", "0.01"],
        vec!["accept", s(&st), "--all"],
        vec!["reject", s(&st), "laptop-jdoe"],
        vec!["delete", s(&st), "--all", "-y"],
        vec!["compact", s(&st)],
        vec!["compact", s(&st), "--to-size", "4001"],
        vec!["verify", s(&st)],
        vec!["verify", s(&st), "--repair"],
        vec!["migrate", s(&sample), "--out", s(&st)],
        vec!["migrate", s(&sample), "--out", s(&st), "--replace"],
        vec!["migrate", s(&sample), "--out", s(&st), "--dry-run"],
    ];
    for layout in layouts {
        for c in &commands {
            let mut args = c.clone();
            args.extend_from_slice(layout);
            let o = keycache(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
            no_panic(&o, &format!("{args:?}"));
            assert!(
                err(&o).contains(".mmap_"),
                "{args:?} names the file: {}",
                err(&o)
            );
            assert_eq!(files(&st), before, "{args:?} changed the store");
            assert!(!tree.exists(), "{args:?} exported");
        }
    }
    // With the right layout (given or inferred) every one works.
    for c in [
        vec!["list", s(&st)],
        vec!["stats", s(&st), "--size", "1009"],
        vec!["verify", s(&st)],
    ] {
        let o = keycache(&c);
        assert!(o.status.success(), "{c:?}: {}", err(&o));
    }
}

#[test]
fn verify_still_reads_a_damaged_store_with_its_layout() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    // Flip a byte inside a record's value: damage, not another layout.
    let heap = st.join(".mmap_keys.idx.heap");
    let mut b = std::fs::read(&heap).unwrap();
    b[200] ^= 0x55;
    std::fs::write(&heap, &b).unwrap();
    let o = Command::new(BIN)
        .args(["verify", s(&st)])
        .env("KEYCACHE_READ_RETRY_MS", "0")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "findings, not a refusal: {}",
        err(&o)
    );
    assert!(stdout(&o).contains("keys:"), "{}", stdout(&o));
    let o = Command::new(BIN)
        .args(["verify", s(&st), "--id-size", "32"])
        .env("KEYCACHE_READ_RETRY_MS", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
}

// ---- class 4: private key material is never printed -----------------------

const SECRET: &str = "U0VDUkVUUFJJVkFURUJJVFM";

fn with_private(tag: &str, private_first: bool) -> String {
    let private =
        format!("-----BEGIN RSA PRIVATE KEY-----\n{SECRET}{tag}\n-----END RSA PRIVATE KEY-----\n");
    if private_first {
        format!("{private}{}", pem(tag, 100))
    } else {
        format!("{}{private}", pem(tag, 100))
    }
}

fn assert_withheld(o: &Output, ids: &[&str], what: &str) {
    assert_eq!(o.status.code(), Some(2), "{what}: {}", err(o));
    let out = stdout(o);
    assert!(!out.contains("PRIVATE KEY"), "{what}: {out}");
    assert!(!out.contains(SECRET), "{what}: {out}");
    assert!(!err(o).contains(SECRET), "{what}: {}", err(o));
    for id in ids {
        assert!(
            err(o).contains(&format!("{id}: withheld")),
            "{what}: {id}: {}",
            err(o)
        );
    }
}

#[test]
fn get_and_list_withhold_values_holding_a_private_key() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    std::fs::create_dir(&st).unwrap();
    // Salt's own writer stores whatever it is given.
    let layout = small(1009, keycache::format::DEFAULT_MAX_SEGMENT_BYTES);
    salt(
        &st,
        &layout,
        &["apply"],
        Some(&json!([
            {"op": "store", "bank": "keys", "id": "salty", "state": "accepted",
             "pub": with_private("salty", false)},
            {"op": "store", "bank": "keys", "id": "clean", "state": "pending",
             "pub": pem("clean", 100)},
            {"op": "store", "bank": "denied_keys", "id": "clean",
             "pub": with_private("cleandenied", true)},
        ])),
    );
    // And the table level (the library's Store::put refuses such values).
    let store = open(&st, 1009);
    store
        .keys_table()
        .put(
            b"tabled",
            &keycache::store::encode_key_value(
                KeyState::Rejected,
                with_private("t", true).as_bytes(),
            ),
        )
        .unwrap();
    drop(store);
    let d = s(&st);
    assert_withheld(&keycache(&["get", d, "salty"]), &["salty"], "get text");
    assert_withheld(
        &keycache(&["get", d, "tabled", "--json"]),
        &["tabled"],
        "get json",
    );
    let o = keycache(&["get", d, "clean"]);
    assert_withheld(
        &o,
        &["clean"],
        "get of a clean key with a private denied key",
    );
    assert!(
        stdout(&o).contains(&pem("clean", 100)),
        "the clean key is shown"
    );
    let (o, v) = keycache_json(&["get", d, "salty", "--json"]);
    assert_withheld(&o, &["salty"], "get json");
    assert_eq!(v["state"], "accepted");
    assert!(v["pub"].is_null());
    for args in [
        vec!["list", d, "--include-pub"],
        vec!["list", d, "--include-pub", "--json"],
        vec!["list", d, "--include-pub", "--state", "accepted"],
    ] {
        let ids: &[&str] = if args.contains(&"--state") {
            &["salty"]
        } else {
            &["salty", "tabled", "clean"]
        };
        assert_withheld(&keycache(&args), ids, &format!("{args:?}"));
    }
    let (o, v) = keycache_json(&["list", d, "--include-pub", "--json"]);
    assert!(v["minions"]["salty"].is_null());
    assert_eq!(v["minions_pre"]["clean"], pem("clean", 100));
    assert_eq!(o.status.code(), Some(2));
    // Without the keys, nothing is withheld: the ids are listed.
    let (o, v) = keycache_json(&["list", d, "--json"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(v["minions"], json!(["salty"]));
    assert_eq!(v["minions_rejected"], json!(["tabled"]));
}

// ---- class 6: a closed stdout ---------------------------------------------

/// Runs keycache with its stdout a pipe whose reader is already gone.
fn closed_stdout(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .env("KEYCACHE_REBUILD_SETTLE_MS", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_stdout_ends_the_output_not_the_command() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    let b = t.path().join("b");
    sample_store(&a);
    sample_store(&b);
    assert!(keycache(&["delete", s(&b), "rogue-host"]).status.success());
    let tree = t.path().join("tree");
    let c = t.path().join("c");
    let sample = sample();
    let cases: Vec<(Vec<&str>, i32)> = vec![
        (vec!["list", s(&a)], 0),
        (vec!["list", s(&a), "--json", "--include-pub"], 0),
        (vec!["stats", s(&a)], 0),
        (vec!["stats", s(&a), "--json"], 0),
        (vec!["diff", s(&a), s(&b)], 1),
        (vec!["diff", s(&a), s(&a), "--json"], 0),
        (vec!["get", s(&a), "laptop-jdoe"], 0),
        (vec!["verify", s(&a), "--json"], 0),
        (vec!["export", s(&a), "--to", s(&tree)], 0),
        (
            vec!["migrate", s(&sample), "--out", s(&c), "--size", "1009"],
            0,
        ),
        (vec!["compact", s(&c)], 0),
        (vec!["bench", s(&a), "--seconds", "0.01"], 0),
        (vec!["accept", s(&b), "--all"], 0),
        (vec!["delete", s(&b), "--all", "-y"], 0),
    ];
    for (args, code) in cases {
        let o = closed_stdout(&args);
        no_panic(&o, &format!("{args:?}"));
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", err(&o));
    }
    // The work was done.
    assert!(tree.join("minions/web-01.dc1.example.com").is_file());
    assert!(c.join(".mmap_keys.idx").is_file());
    let (_, v) = keycache_json(&["list", s(&b), "--json"]);
    for g in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        assert_eq!(v[g], json!([]), "{g}");
    }
}

#[test]
fn delete_all_into_head_exits_0_with_everything_deleted() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    std::fs::create_dir(&st).unwrap();
    let store = open(&st, 10007);
    // More output than a pipe holds, so the writer meets EPIPE.
    store
        .batch(|b| {
            for n in 0..3000 {
                let id = MinionId::new(format!("minion-with-a-long-name-{n:05}.example.com"))?;
                b.put(&id, KeyState::Accepted, pem("k", 60).as_bytes())?;
            }
            Ok(())
        })
        .unwrap();
    drop(store);
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "\"{BIN}\" delete \"{}\" --all -y | head -1; echo \"status ${{PIPESTATUS[0]}}\"",
            s(&st)
        ))
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(out.starts_with("Key for minion "), "{out}");
    assert!(out.ends_with("status 0\n"), "{out} {}", err(&o));
    no_panic(&o, "delete | head");
    let store = open(&st, 10007);
    assert_eq!(store.counts().unwrap().accepted, 0);
}

// ---- class 6: bench arguments ---------------------------------------------

#[test]
fn bench_refuses_out_of_range_arguments() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    for secs in ["nan", "NaN", "inf", "-inf", "-1", "0", "1e300", "3601", "x"] {
        let o = keycache(&["bench", s(&st), &format!("--seconds={secs}")]);
        no_panic(&o, secs);
        assert_eq!(o.status.code(), Some(2), "--seconds {secs}: {}", err(&o));
        assert!(err(&o).contains("--seconds"), "{}", err(&o));
    }
    for n in ["0", "257", "-1", "100000000000", "1.5"] {
        let o = keycache(&[
            "bench",
            s(&st),
            &format!("--threads={n}"),
            "--seconds",
            "0.01",
        ]);
        no_panic(&o, n);
        assert_eq!(o.status.code(), Some(2), "--threads {n}: {}", err(&o));
        assert!(err(&o).contains("--threads"), "{}", err(&o));
    }
    let (o, v) = keycache_json(&[
        "bench",
        s(&st),
        "--seconds",
        "0.01",
        "--threads",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(v["threads"], 2);
}

// ---- class 6: stores that cannot be read in full ---------------------------

#[test]
fn list_of_a_store_it_cannot_read_in_full_exits_2() {
    let t = tempfile::tempdir().unwrap();
    let run = |dir: &Path, json: bool| {
        let mut c = Command::new(BIN);
        c.args(["list", s(dir)]).env("KEYCACHE_READ_RETRY_MS", "0");
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    // Control: intact.
    let ok = t.path().join("ok");
    sample_store(&ok);
    assert!(run(&ok, false).status.success());
    // The keys heap truncated to nothing.
    let trunc = t.path().join("trunc");
    sample_store(&trunc);
    std::fs::write(trunc.join(".mmap_keys.idx.heap"), b"").unwrap();
    // The keys index missing while its roster lists entries.
    let noidx = t.path().join("noidx");
    sample_store(&noidx);
    std::fs::remove_file(noidx.join(".mmap_keys.idx")).unwrap();
    // Half of the heap gone.
    let half = t.path().join("half");
    sample_store(&half);
    let h = std::fs::read(half.join(".mmap_keys.idx.heap")).unwrap();
    std::fs::write(half.join(".mmap_keys.idx.heap"), &h[..h.len() / 2]).unwrap();
    for dir in [&trunc, &noidx, &half] {
        for json in [false, true] {
            let o = run(dir, json);
            no_panic(&o, s(dir));
            assert_eq!(
                o.status.code(),
                Some(2),
                "{} json {json}: {}",
                s(dir),
                err(&o)
            );
            assert!(err(&o).contains("run keycache verify"), "{}", err(&o));
            // What could be read is still listed: the denied bank is intact.
            assert!(stdout(&o).contains("kiosk-3.example.net"), "{}", stdout(&o));
        }
    }
    assert!(err(&run(&noidx, false)).contains("the index file is missing"));
}

// ---- class 6: compact's load limit ----------------------------------------

#[test]
fn compact_to_size_refuses_what_migrate_refuses_and_names_to_size() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st); // 33 keys, 3 denied
    let before = files(&st);
    let (_, listed) = keycache_json(&["list", s(&st), "--json"]);
    // 33 keys in 41 data slots is 80.5%.
    for size in ["42", "40", "34", "20"] {
        let o = keycache(&["compact", s(&st), "--to-size", size]);
        assert_eq!(o.status.code(), Some(2), "--to-size {size}: {}", err(&o));
        let e = err(&o);
        assert!(e.contains("use --to-size 67 "), "{e}");
        assert!(!e.contains("--size"), "{e}");
        assert!(e.contains("refuses above 80%"), "{e}");
        assert_eq!(files(&st), before, "--to-size {size} wrote");
        // migrate refuses the same size.
        let o = keycache(&[
            "migrate",
            s(&sample()),
            "--out",
            s(&t.path().join(format!("m{size}"))),
            "--size",
            size,
        ]);
        assert_eq!(o.status.code(), Some(2), "migrate --size {size}");
    }
    for size in ["0", "1"] {
        let o = keycache(&["compact", s(&st), "--to-size", size]);
        assert_eq!(o.status.code(), Some(2), "{}", err(&o));
        assert_eq!(files(&st), before);
    }
    // 33 in 42 data slots is 78.6%: allowed, as migrate allows it.
    let m = t.path().join("m43");
    let o = keycache(&["migrate", s(&sample()), "--out", s(&m), "--size", "43"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = keycache(&["compact", s(&st), "--to-size", "43"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(stdout(&o).contains("mmap_key_size: 43"));
    let (o, v) = keycache_json(&["list", s(&st), "--json"]);
    assert!(o.status.success());
    assert_eq!(v, listed);
}

// ---- class 6: --user ------------------------------------------------------

#[test]
fn user_errors_are_their_own_and_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    let before = files(&st);
    for user in [
        "4294967295",
        "0:4294967295",
        "4294967295:0",
        "no-such-user-keycache",
        "root:no-such-group-keycache",
        "",
        ":0",
        "root:",
    ] {
        let o = keycache(&["compact", s(&st), "--user", user]);
        assert_eq!(o.status.code(), Some(2), "--user {user:?}: {}", err(&o));
        let e = err(&o);
        assert!(e.starts_with("keycache: --user \""), "{e}");
        assert!(!e.contains("layout"), "{e}");
        assert_eq!(files(&st), before);
        let out = t.path().join("out");
        let o = keycache(&["migrate", s(&sample()), "--out", s(&out), "--user", user]);
        assert_eq!(o.status.code(), Some(2), "{}", err(&o));
        assert!(err(&o).starts_with("keycache: --user \""), "{}", err(&o));
        assert!(!out.exists());
    }
    assert!(err(&keycache(&["compact", s(&st), "--user", "4294967295"])).contains("no change"));
    // Names resolve through the user database; numbers are taken as given.
    let me = keycache_testkit::sys::euid();
    let name = uzers_name(me);
    for user in [
        name.clone(),
        format!("{me}"),
        format!("{me}:{me}"),
        format!("{name}:{me}"),
    ] {
        let o = Command::new(BIN)
            .args(["compact", s(&st), "--user", &user])
            .env("KEYCACHE_REBUILD_SETTLE_MS", "0")
            .output()
            .unwrap();
        assert!(o.status.success(), "--user {user}: {}", err(&o));
    }
}

/// The name of user `uid` from `id -un` (the test does not link uzers).
fn uzers_name(uid: u32) -> String {
    let o = Command::new("id")
        .args(["-un", &uid.to_string()])
        .output()
        .unwrap();
    String::from_utf8(o.stdout).unwrap().trim().to_owned()
}

// ---- class 6: migrate's tree and target -----------------------------------

#[test]
fn migrate_of_a_missing_tree_says_it_does_not_exist() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("nonexistent");
    let out = t.path().join("out");
    for extra in [&[][..], &["--dry-run"][..], &["--out", s(&out)][..]] {
        let mut args = vec!["migrate", s(&missing)];
        args.extend_from_slice(extra);
        let o = keycache(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(err(&o).contains("does not exist"), "{}", err(&o));
        assert!(!err(&o).contains("has none of"), "{}", err(&o));
        assert!(!out.exists() && !missing.exists());
    }
    // An existing directory that is not a pki dir still says what it lacks.
    let o = keycache(&["migrate", s(t.path()), "--dry-run"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("none of"), "{}", err(&o));
}

#[test]
fn a_refused_migration_leaves_no_out_directory_and_out_is_0700() {
    let t = tempfile::tempdir().unwrap();
    // A tree with an id longer than the id size.
    let long = t.path().join("long");
    std::fs::create_dir_all(long.join("minions")).unwrap();
    std::fs::write(long.join("minions").join("x".repeat(100)), pem("long", 100)).unwrap();
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (sample(), vec!["--size", "20"]),                // over 80%
        (long.clone(), vec![]),                          // an id too long
        (sample(), vec!["--size", "1009", "--dry-run"]), // writes nothing
    ];
    for (i, (tree, extra)) in cases.iter().enumerate() {
        let top = t.path().join(format!("new{i}"));
        let out = top.join("deep/er");
        let mut args = vec!["migrate", s(tree), "--out", s(&out)];
        args.extend_from_slice(extra);
        let o = keycache(&args);
        if !extra.contains(&"--dry-run") {
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
        }
        assert!(!top.exists(), "{args:?} left {}", top.display());
    }
    for umask in ["000", "022", "077"] {
        let out = t.path().join(format!("out{umask}"));
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask}; exec \"{BIN}\" migrate \"{}\" --out \"{}\" --size 1009",
                s(&sample()),
                s(&out)
            ))
            .env("KEYCACHE_REBUILD_SETTLE_MS", "0")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", err(&o));
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "umask {umask}");
    }
}

// ---- class 6: accept/reject/delete arguments and confirmation -------------

#[test]
fn state_commands_without_ids_say_give_ids_or_all() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    let before = files(&st);
    for cmd in ["accept", "reject", "delete"] {
        let o = keycache(&[cmd, s(&st)]);
        assert_eq!(o.status.code(), Some(2));
        assert_eq!(err(&o), "keycache: give minion ids or --all\n", "{cmd}");
        let o = keycache(&[cmd, s(&st), "laptop-jdoe", "--all", "-y"]);
        assert_eq!(o.status.code(), Some(2));
        assert_eq!(err(&o), "keycache: give minion ids or --all, not both\n");
        // Even on a path that is no store: the arguments come first.
        let o = keycache(&[cmd, s(&t.path().join("nowhere"))]);
        assert_eq!(err(&o), "keycache: give minion ids or --all\n");
        assert_eq!(files(&st), before);
    }
}

#[test]
fn delete_all_asks_like_salt_key_unless_yes() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    let before = files(&st);
    // No terminal, no -y: refused.
    let o = Command::new(BIN)
        .args(["delete", s(&st), "--all"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("add -y"), "{}", err(&o));
    assert_eq!(files(&st), before);
    // On a terminal: anything but yes deletes nothing.
    let on_tty = |answer: &str| {
        let mut c = Command::new("script")
            .args([
                "-qec",
                &format!("\"{BIN}\" delete \"{}\" --all", s(&st)),
                "/dev/null",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        c.wait_with_output().unwrap()
    };
    let have_script = Command::new("script").arg("--version").output().is_ok();
    if have_script {
        for answer in ["n\n", "\n", "no\n"] {
            let o = on_tty(answer);
            assert_eq!(o.status.code(), Some(2), "{answer:?}: {}", stdout(&o));
            assert!(stdout(&o).contains("Proceed? [N/y]"), "{}", stdout(&o));
            assert_eq!(files(&st), before, "{answer:?}");
        }
        let o = on_tty("y\n");
        assert!(o.status.success(), "{}", stdout(&o));
        let (_, v) = keycache_json(&["list", s(&st), "--json"]);
        assert_eq!(v["minions"], json!([]));
    } else {
        keycache_testkit::skip::skip("delete --all on a terminal", "no `script` command");
    }
    // -y and --yes delete without asking.
    for (dir, flag) in [(t.path().join("y"), "-y"), (t.path().join("yes"), "--yes")] {
        sample_store(&dir);
        let o = Command::new(BIN)
            .args(["delete", s(&dir), "--all", flag])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", err(&o));
        let (_, v) = keycache_json(&["list", s(&dir), "--json"]);
        assert_eq!(v["minions"], json!([]));
        assert_eq!(v["minions_denied"], json!([]));
    }
    // Deleting named ids does not ask.
    let dir = t.path().join("named");
    sample_store(&dir);
    let o = Command::new(BIN)
        .args(["delete", s(&dir), "rogue-host"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
}

// ---- class 6: the wait for a bank's lock is announced ----------------------

#[test]
fn writers_say_when_they_wait_for_a_banks_lock() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    let cases: Vec<Vec<String>> = vec![
        vec!["accept".into(), s(&st).into(), "laptop-jdoe".into()],
        vec!["delete".into(), s(&st).into(), "--all".into(), "-y".into()],
        vec!["compact".into(), s(&st).into()],
        vec![
            "migrate".into(),
            s(&sample()).into(),
            "--out".into(),
            s(&st).into(),
        ],
    ];
    for (i, args) in cases.iter().enumerate() {
        let bank = if i % 2 == 0 {
            ".mmap_keys.idx.lock"
        } else {
            ".mmap_denied.idx.lock"
        };
        let lock_path = st.join(bank);
        let lock = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&lock_path)
            .unwrap();
        lock.lock().unwrap();
        let mut child = Command::new(BIN)
            .args(args)
            .env("KEYCACHE_REBUILD_SETTLE_MS", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let _ = tx.send(line.unwrap_or_default());
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut said = None;
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(l) if l.contains("waiting for the lock") => {
                    said = Some(l);
                    break;
                }
                Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(_) => break,
            }
        }
        let said = said.unwrap_or_else(|| panic!("{args:?}: no notice"));
        assert_eq!(
            said,
            format!(
                "keycache: waiting for the lock of {} (a Salt master or another keycache is writing)",
                s(&lock_path)
            )
        );
        // It waits: not done while the lock is held.
        std::thread::sleep(Duration::from_millis(200));
        assert!(child.try_wait().unwrap().is_none(), "{args:?} did not wait");
        drop(lock);
        let status = child.wait().unwrap();
        assert!(status.success(), "{args:?}");
    }
    // No lock held: no notice.
    let o = keycache(&["delete", s(&st), "laptop-jdoe"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(!err(&o).contains("waiting"), "{}", err(&o));
}

// ---- class 6: ids are escaped in text output -------------------------------

#[test]
fn text_output_escapes_control_characters_in_ids() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    std::fs::create_dir(&st).unwrap();
    let forged = "evil\nKey for minion root accepted.";
    let esc_id = "esc\u{1b}[2J\u{1b}[31mred";
    let bidi = "bidi\u{202e}txt.exe";
    let store = open(&st, 1009);
    for id in [forged, esc_id, bidi] {
        store
            .put(
                &MinionId::new(id).unwrap(),
                KeyState::Pending,
                pem(id, 100).as_bytes(),
            )
            .unwrap();
    }
    store
        .deny(&MinionId::new(esc_id).unwrap(), pem("d", 100).as_bytes())
        .unwrap();
    drop(store);
    let clean = |o: &Output, what: &str| {
        for (name, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
            let text = String::from_utf8_lossy(bytes);
            assert!(!bytes.contains(&0x1b), "{what} {name}: raw ESC: {text:?}");
            assert!(
                !text.contains('\u{202e}'),
                "{what} {name}: raw bidi: {text:?}"
            );
            assert!(
                !text.lines().any(|l| l.starts_with("Key for minion root")),
                "{what} {name}: a forged line: {text:?}"
            );
        }
    };
    let d = s(&st);
    let o = keycache(&["list", d]);
    clean(&o, "list");
    assert!(stdout(&o).contains("evil\\nKey for minion root accepted.\n"));
    assert!(stdout(&o).contains("esc\\u{1b}[2J\\u{1b}[31mred\n"));
    assert!(stdout(&o).contains("bidi\\u{202e}txt.exe\n"));
    // JSON carries the ids as they are.
    let (_, v) = keycache_json(&["list", d, "--json"]);
    assert!(v["minions_pre"]
        .as_array()
        .unwrap()
        .contains(&json!(forged)));
    let o = keycache(&["get", d, forged]);
    clean(&o, "get");
    assert!(stdout(&o).starts_with("id: evil\\nKey for minion root accepted.\n"));
    let o = keycache(&["get", d, "absent\u{1b}x"]);
    clean(&o, "get absent");
    let other = t.path().join("other");
    std::fs::create_dir(&other).unwrap();
    drop(open(&other, 1009));
    let o = keycache(&["diff", d, s(&other)]);
    clean(&o, "diff");
    assert!(
        stdout(&o).contains("only in A: evil\\nKey"),
        "{}",
        stdout(&o)
    );
    let tree = t.path().join("tree");
    let o = keycache(&["export", d, "--to", s(&tree)]);
    clean(&o, "export");
    let o = keycache(&["accept", d, forged, esc_id]);
    clean(&o, "accept");
    assert!(stdout(&o).contains("Key for minion evil\\nKey for minion root accepted. accepted.\n"));
    let o = keycache(&["accept", d, forged]);
    clean(&o, "accept again");
    assert!(err(&o).contains("evil\\nKey"), "{}", err(&o));
    let o = keycache(&["delete", d, "--all", "-y"]);
    clean(&o, "delete");
    let o = keycache(&["export", d, "--to", s(&tree)]);
    clean(&o, "export removing");
    assert!(stdout(&o).contains("removed: "), "{}", stdout(&o));
    // migrate's report: duplicates and skipped entries.
    let pki = t.path().join("pki");
    for dir in ["minions", "minions_pre"] {
        std::fs::create_dir_all(pki.join(dir)).unwrap();
        std::fs::write(pki.join(dir).join(esc_id), pem("x", 100)).unwrap();
    }
    std::fs::write(pki.join("minions").join(".\u{1b}[31mdot"), pem("y", 100)).unwrap();
    let o = keycache(&["migrate", s(&pki), "--dry-run"]);
    clean(&o, "migrate");
    assert!(
        stdout(&o).contains("duplicate: esc\\u{1b}"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("skipped: "), "{}", stdout(&o));
}
