//! The CLI's edges: a layout that is not the files', stores that cannot be
//! read in full, compact's load limit, `--user`.

use super::*;

use std::path::Path;
use std::process::Command;

// ---- class 1: a layout that is not the files' -----------------------------

#[test]
fn every_command_refuses_a_layout_that_is_not_the_files_and_changes_nothing() {
    let (t, st) = sample_store_dir();
    let before = files(&st);
    let tree = t.path().join("tree");
    let sample = sample_pki();
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
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
            no_panic(&o, &format!("{args:?}"));
            assert!(
                stderr(&o).contains(".mmap_"),
                "{args:?} names the file: {}",
                stderr(&o)
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
        assert!(o.status.success(), "{c:?}: {}", stderr(&o));
    }
}

#[test]
fn verify_still_reads_a_damaged_store_with_its_layout() {
    let (_t, st) = sample_store_dir();
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
        stderr(&o)
    );
    assert!(stdout(&o).contains("keys:"), "{}", stdout(&o));
    let o = Command::new(BIN)
        .args(["verify", s(&st), "--id-size", "32"])
        .env("KEYCACHE_READ_RETRY_MS", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
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
                stderr(&o)
            );
            assert!(stderr(&o).contains("run keycache verify"), "{}", stderr(&o));
            // What could be read is still listed: the denied bank is intact.
            assert!(stdout(&o).contains("kiosk-3.example.net"), "{}", stdout(&o));
        }
    }
    assert!(stderr(&run(&noidx, false)).contains("the index file is missing"));
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
        assert_eq!(o.status.code(), Some(2), "--to-size {size}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("use --to-size 67 "), "{e}");
        assert!(!e.contains("--size"), "{e}");
        assert!(e.contains("refuses above 80%"), "{e}");
        assert_eq!(files(&st), before, "--to-size {size} wrote");
        // migrate refuses the same size.
        let o = keycache(&[
            "migrate",
            s(&sample_pki()),
            "--out",
            s(&t.path().join(format!("m{size}"))),
            "--size",
            size,
        ]);
        assert_eq!(o.status.code(), Some(2), "migrate --size {size}");
    }
    for size in ["0", "1"] {
        keycache_exits(&["compact", s(&st), "--to-size", size], 2);
        assert_eq!(files(&st), before);
    }
    // 33 in 42 data slots is 78.6%: allowed, as migrate allows it.
    let m = t.path().join("m43");
    keycache_ok(&["migrate", s(&sample_pki()), "--out", s(&m), "--size", "43"]);
    let o = keycache_ok(&["compact", s(&st), "--to-size", "43"]);
    assert!(stdout(&o).contains("mmap_key_size: 43"));
    let v = keycache_ok_json(&["list", s(&st), "--json"]);
    assert_eq!(v, listed);
}

// ---- class 6: --user ------------------------------------------------------

#[test]
fn user_errors_are_their_own_and_change_nothing() {
    let (t, st) = sample_store_dir();
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
        assert_eq!(o.status.code(), Some(2), "--user {user:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.starts_with("keycache: --user \""), "{e}");
        assert!(!e.contains("layout"), "{e}");
        assert_eq!(files(&st), before);
        let out = t.path().join("out");
        let o = keycache_exits(
            &[
                "migrate",
                s(&sample_pki()),
                "--out",
                s(&out),
                "--user",
                user,
            ],
            2,
        );
        assert!(
            stderr(&o).starts_with("keycache: --user \""),
            "{}",
            stderr(&o)
        );
        assert!(!out.exists());
    }
    assert!(stderr(&keycache(&["compact", s(&st), "--user", "4294967295"])).contains("no change"));
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
        assert!(o.status.success(), "--user {user}: {}", stderr(&o));
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
