//! The CLI's edges: arguments and their checks (bench's ranges, migrate's
//! tree and target, accept/reject/delete ids and confirmation) and the
//! notice of a wait for a bank's lock.

use super::*;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

// ---- class 6: bench arguments ---------------------------------------------

#[test]
fn bench_refuses_out_of_range_arguments() {
    let (_t, st) = sample_store_dir();
    for secs in ["nan", "NaN", "inf", "-inf", "-1", "0", "1e300", "3601", "x"] {
        let o = keycache(&["bench", s(&st), &format!("--seconds={secs}")]);
        no_panic(&o, secs);
        assert_eq!(o.status.code(), Some(2), "--seconds {secs}: {}", stderr(&o));
        assert!(stderr(&o).contains("--seconds"), "{}", stderr(&o));
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
        assert_eq!(o.status.code(), Some(2), "--threads {n}: {}", stderr(&o));
        assert!(stderr(&o).contains("--threads"), "{}", stderr(&o));
    }
    let v = keycache_ok_json(&[
        "bench",
        s(&st),
        "--seconds",
        "0.01",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(v["threads"], 2);
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
        assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
        assert!(!stderr(&o).contains("has none of"), "{}", stderr(&o));
        assert!(!out.exists() && !missing.exists());
    }
    // An existing directory that is not a pki dir still says what it lacks.
    let o = keycache_exits(&["migrate", s(t.path()), "--dry-run"], 2);
    assert!(stderr(&o).contains("none of"), "{}", stderr(&o));
}

#[test]
fn a_refused_migration_leaves_no_out_directory_and_out_is_0700() {
    let t = tempfile::tempdir().unwrap();
    // A tree with an id longer than the id size.
    let long = t.path().join("long");
    std::fs::create_dir_all(long.join("minions")).unwrap();
    std::fs::write(long.join("minions").join("x".repeat(100)), pem("long", 100)).unwrap();
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (sample_pki(), vec!["--size", "20"]),                // over 80%
        (long.clone(), vec![]),                              // an id too long
        (sample_pki(), vec!["--size", "1009", "--dry-run"]), // writes nothing
    ];
    for (i, (tree, extra)) in cases.iter().enumerate() {
        let top = t.path().join(format!("new{i}"));
        let out = top.join("deep/er");
        let mut args = vec!["migrate", s(tree), "--out", s(&out)];
        args.extend_from_slice(extra);
        let o = keycache(&args);
        if !extra.contains(&"--dry-run") {
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        }
        assert!(!top.exists(), "{args:?} left {}", top.display());
    }
    for umask in ["000", "022", "077"] {
        let out = t.path().join(format!("out{umask}"));
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask}; exec \"{BIN}\" migrate \"{}\" --out \"{}\" --size 1009",
                s(&sample_pki()),
                s(&out)
            ))
            .env("KEYCACHE_REBUILD_SETTLE_MS", "0")
            .output()
            .unwrap();
        ok(&o);
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "umask {umask}");
    }
}

// ---- class 6: accept/reject/delete arguments and confirmation -------------

#[test]
fn state_commands_without_ids_say_give_ids_or_all() {
    let (t, st) = sample_store_dir();
    let before = files(&st);
    for cmd in ["accept", "reject", "delete"] {
        let o = keycache_exits(&[cmd, s(&st)], 2);
        assert_eq!(stderr(&o), "keycache: give minion ids or --all\n", "{cmd}");
        let o = keycache_exits(&[cmd, s(&st), "laptop-jdoe", "--all", "-y"], 2);
        assert_eq!(stderr(&o), "keycache: give minion ids or --all, not both\n");
        // Even on a path that is no store: the arguments come first.
        let o = keycache(&[cmd, s(&t.path().join("nowhere"))]);
        assert_eq!(stderr(&o), "keycache: give minion ids or --all\n");
        assert_eq!(files(&st), before);
    }
}

#[test]
fn delete_all_asks_like_salt_key_unless_yes() {
    let (t, st) = sample_store_dir();
    let before = files(&st);
    // No terminal, no -y: refused.
    let o = Command::new(BIN)
        .args(["delete", s(&st), "--all"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("add -y"), "{}", stderr(&o));
    assert_eq!(files(&st), before);
    // On a terminal: anything but yes deletes nothing.
    let on_tty = |answer: &str| {
        let mut c = TestCommand::new("script");
        // The terminal as an operator has it: colours as the environment says.
        c.cmd().env_remove("NO_COLOR");
        c.args([
            "-qec",
            &format!("\"{BIN}\" delete \"{}\" --all", s(&st)),
            "/dev/null",
        ])
        .stdin(answer)
        .output()
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
        ok(&o);
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
        ok(&o);
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
    ok(&o);
}

// ---- class 6: the wait for a bank's lock is announced ----------------------

#[test]
fn writers_say_when_they_wait_for_a_banks_lock() {
    let (_t, st) = sample_store_dir();
    let cases: Vec<Vec<String>> = vec![
        vec!["accept".into(), s(&st).into(), "laptop-jdoe".into()],
        vec!["delete".into(), s(&st).into(), "--all".into(), "-y".into()],
        vec!["compact".into(), s(&st).into()],
        vec![
            "migrate".into(),
            s(&sample_pki()).into(),
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
        let mut child = kc().args(args).no_settle().spawn(Stdio::null());
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
    let o = keycache_ok(&["delete", s(&st), "laptop-jdoe"]);
    assert!(!stderr(&o).contains("waiting"), "{}", stderr(&o));
}
