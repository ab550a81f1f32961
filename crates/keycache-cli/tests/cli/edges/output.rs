//! The CLI's edges: what the CLI prints (private key material never, a
//! closed stdout, ids escaped in text output).

use super::*;

use std::process::{Command, Output, Stdio};

use keycache::{KeyState, MinionId};
use serde_json::json;

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
    assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(o));
    let out = stdout(o);
    assert!(!out.contains("PRIVATE KEY"), "{what}: {out}");
    assert!(!out.contains(SECRET), "{what}: {out}");
    assert!(!stderr(o).contains(SECRET), "{what}: {}", stderr(o));
    for id in ids {
        assert!(
            stderr(o).contains(&format!("{id}: withheld")),
            "{what}: {id}: {}",
            stderr(o)
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
    let store = open(&st, &sized(1009));
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
    let v = keycache_ok_json(&["list", d, "--json"]);
    assert_eq!(v["minions"], json!(["salty"]));
    assert_eq!(v["minions_rejected"], json!(["tabled"]));
}

// ---- class 6: a closed stdout ---------------------------------------------

/// Runs keycache with its stdout a pipe whose reader is already gone.
fn closed_stdout(args: &[&str]) -> Output {
    let mut child = kc().args(args).no_settle().spawn(Stdio::piped());
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
    keycache_ok(&["delete", s(&b), "rogue-host"]);
    let tree = t.path().join("tree");
    let c = t.path().join("c");
    let sample = sample_pki();
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
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
    }
    // The work was done.
    assert!(tree.join("minions/web-01.dc1.example.com").is_file());
    assert!(c.join(".mmap_keys.idx").is_file());
    let (_, v) = keycache_json(&["list", s(&b), "--json"]);
    for g in TREE_DIRS {
        assert_eq!(v[g], json!([]), "{g}");
    }
}

#[test]
fn delete_all_into_head_exits_0_with_everything_deleted() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    std::fs::create_dir(&st).unwrap();
    let store = open(&st, &sized(10007));
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
    assert!(out.ends_with("status 0\n"), "{out} {}", stderr(&o));
    no_panic(&o, "delete | head");
    let store = open(&st, &sized(10007));
    assert_eq!(store.counts().unwrap().accepted, 0);
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
    let store = open(&st, &sized(1009));
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
    drop(open(&other, &sized(1009)));
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
    assert!(stderr(&o).contains("evil\\nKey"), "{}", stderr(&o));
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
