//! The `keycache` binary: every command, every skip reason and refusal of
//! `migrate`, and `keycache migrate` against Salt's own migration.

use crate::common;
use crate::common::{
    finding_whats, gen_pki_tree, keycache, keycache_exits, keycache_fails, keycache_json,
    keycache_json_exits, keycache_ok, keycache_ok_json, pem, s, salt, sample_pki, sample_store,
    sample_store_dir, small, TREE_DIRS,
};
use keycache_testkit::crash::copy_tree;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use keycache_testkit::skip;
use serde_json::{json, Value};

/// Copies a tree, symlinks as symlinks.
fn write(p: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

/// A tree with `n` keys per state directory (ids `{dir}-{i}`).
fn tree(root: &Path, n: usize) {
    for d in TREE_DIRS {
        std::fs::create_dir_all(root.join(d)).unwrap();
        for i in 0..n {
            write(
                &root.join(d).join(format!("{d}-{i}")),
                pem(&format!("{d}{i}"), 300).as_bytes(),
            );
        }
    }
}

fn bank_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    v.sort();
    v
}

/// keycache's view of a store as Salt's driver dumps it (keys, denied_keys).
fn keycache_dump(dir: &Path, size: u64) -> Value {
    let v = keycache_ok_json(&[
        "list",
        s(dir),
        "--json",
        "--include-pub",
        "--size",
        &size.to_string(),
    ]);
    let mut keys = serde_json::Map::new();
    for (group, state) in [
        ("minions", "accepted"),
        ("minions_pre", "pending"),
        ("minions_rejected", "rejected"),
    ] {
        for (id, p) in v[group].as_object().unwrap() {
            keys.insert(id.clone(), json!({"state": state, "pub": p}));
        }
    }
    let denied: serde_json::Map<String, Value> = v["minions_denied"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, p)| (k.clone(), json!([p])))
        .collect();
    json!({"keys": keys, "denied_keys": denied})
}

#[test]
fn migrate_matches_salts_own_migration_on_a_generated_tree() {
    let t = tempfile::tempdir().unwrap();
    gen_pki_tree(
        &t.path().join("tree"),
        &["--minions", "400", "--dup-fraction", "0.1", "--seed", "7"],
    );
    let a = t.path().join("a");
    let b = t.path().join("b");
    copy_tree(&t.path().join("tree"), &a);
    copy_tree(&t.path().join("tree"), &b);
    let layout = small(1009, 1 << 30);
    let rep = keycache_ok_json(&["migrate", s(&a), "--json", "--size", "1009"]);
    assert!(rep["skipped"].as_array().unwrap().is_empty(), "{rep}");
    assert!(
        !rep["duplicates"].as_array().unwrap().is_empty(),
        "the tree has duplicates"
    );
    let salt_rep = salt(&b, &layout, &["migrate", "--pki-dir", s(&b)], None);
    // Salt's runner counts files per directory; keycache reports the same as `found`.
    for st in ["accepted", "pending", "rejected", "denied"] {
        assert_eq!(rep["found"][st], salt_rep["counts"][st], "{st}");
    }
    // Entry for entry, as Salt's mmap_key reads each store back.
    let salt_view = salt(&b, &layout, &["dump"], None);
    let kc_view_by_salt = salt(&a, &layout, &["dump"], None);
    assert_eq!(kc_view_by_salt["keys"], salt_view["keys"]);
    assert_eq!(kc_view_by_salt["denied_keys"], salt_view["denied_keys"]);
    // And as keycache reads Salt's store.
    assert_eq!(
        keycache_dump(&b, 1009),
        json!({"keys": salt_view["keys"], "denied_keys": salt_view["denied_keys"]})
    );
    // The tree is as before, but for one difference from Salt's
    // migration: the `minions/<id>` of an id found in `minions/` and in
    // another state directory, which Salt's precedence makes pending or
    // rejected, is removed (Salt leaves it, and its validate_token then
    // admits a minion its store does not hold accepted).
    let count = |p: &Path| walk_count(p);
    let demoted: Vec<String> = rep["duplicates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| {
            d["state"] != "accepted"
                && d["found_in"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("accepted"))
        })
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!demoted.is_empty(), "the tree has such duplicates: {rep}");
    assert_eq!(
        count(&a.join("minions")) + demoted.len(),
        count(&t.path().join("tree/minions"))
    );
    for id in &demoted {
        assert!(!a.join("minions").join(id).exists(), "{id}");
        assert!(b.join("minions").join(id).exists(), "Salt leaves {id}");
    }
    assert_eq!(
        rep["minions_removed"].as_array().unwrap().len(),
        demoted.len(),
        "{rep}"
    );
}

fn walk_count(p: &Path) -> usize {
    std::fs::read_dir(p).unwrap().count()
}

#[test]
fn migrate_sample_tree_matches_salt_except_what_keycache_skips() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    let b = t.path().join("b");
    copy_tree(&sample_pki(), &a);
    copy_tree(&sample_pki(), &b);
    let layout = small(1009, 1 << 30);
    let rep = keycache_ok_json(&["migrate", s(&a), "--json", "--size", "1009"]);
    let reasons: Vec<(String, String)> = rep["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let p = PathBuf::from(x["path"].as_str().unwrap());
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                x["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for want in [
        (".key_cache", "dot_file"),
        ("linked-minion", "symlink"),
        (".hidden-minion", "dot_file"),
        ("broken-minion", "not_a_public_key"),
        ("empty-minion", "empty"),
    ] {
        assert!(
            reasons.contains(&(want.0.to_owned(), want.1.to_owned())),
            "{want:?} not in {reasons:?}"
        );
    }
    let dup: Vec<(String, String)> = rep["duplicates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap().to_owned(),
                d["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        dup.contains(&("app-04.dc2.example.com".into(), "rejected".into())),
        "{dup:?}"
    );
    assert!(
        dup.contains(&("web-04.dc1.example.com".into(), "pending".into())),
        "{dup:?}"
    );
    salt(&b, &layout, &["migrate", "--pki-dir", s(&b)], None);
    let mut salt_view = salt(&b, &layout, &["dump"], None);
    // Salt stores the non-PEM file as a key, and the empty file as an entry
    // it then cannot read; keycache skips both.
    salt_view["keys"]
        .as_object_mut()
        .unwrap()
        .remove("broken-minion");
    let kc = salt(&a, &layout, &["dump"], None);
    assert_eq!(kc["keys"], salt_view["keys"]);
    assert_eq!(kc["denied_keys"], salt_view["denied_keys"]);
    // The symlink's target was never read into the store.
    let outside = std::fs::read(common::repo().join("tools/outside.pub")).unwrap();
    for f in bank_files(&a) {
        let bytes = std::fs::read(a.join(&f)).unwrap();
        let needle = &outside[100..160]; // past the prefix all RSA-2048 keys share
        assert!(!bytes.windows(needle.len()).any(|w| w == needle), "{f}");
    }
}

#[test]
fn migrate_reports_every_skip_reason() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    tree(p, 2);
    let m = p.join("minions");
    std::os::unix::fs::symlink("/etc/hostname", m.join("link")).unwrap();
    std::fs::create_dir(m.join("subdir")).unwrap();
    write(&m.join(".key_cache"), b"\x80");
    write(&m.join("back\\slash"), pem("x", 50).as_bytes());
    write(&m.join("y".repeat(65)), pem("y", 50).as_bytes());
    write(&m.join("empty"), b"");
    write(&m.join("junk"), b"not a key\n");
    write(
        &m.join("latin1"),
        b"-----BEGIN PUBLIC KEY-----\n\xe9\n-----END PUBLIC KEY-----\n",
    );
    write(&m.join("huge"), &vec![b'A'; 70_000]);
    let bad_name = std::ffi::OsStr::from_encoded_bytes_unchecked_safe(b"bad\xffname");
    write(&m.join(bad_name), pem("z", 50).as_bytes());
    let rep = keycache_ok_json(&[
        "migrate",
        s(p),
        "--json",
        "--size",
        "1009",
        "--skip-long-ids",
    ]);
    let got = common::skipped_reasons(&rep);
    let want = [
        ("link", "symlink"),
        ("subdir", "not_a_regular_file"),
        (".key_cache", "dot_file"),
        ("back\\slash", "invalid_id"),
        (&*"y".repeat(65), "id_too_long"),
        ("empty", "empty"),
        ("junk", "not_a_public_key"),
        ("latin1", "not_a_public_key"),
        ("huge", "too_large"),
        ("bad\u{fffd}name", "non_utf8_name"),
    ];
    for (name, reason) in want {
        assert!(
            got.contains(&(name.to_owned(), reason.to_owned())),
            "{name}: {reason} not in {got:?}"
        );
    }
    assert_eq!(rep["migrated"]["accepted"], 2);
    // Text output names the reason too.
    let out = keycache(&[
        "migrate",
        s(p),
        "--dry-run",
        "--size",
        "1009",
        "--skip-long-ids",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("would migrate")
            && text.contains("(symlink:")
            && text.contains("(too_large:"),
        "{text}"
    );
}

/// Helper: a safe stand-in for building an OsStr from raw bytes.
trait FromBytes {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> std::ffi::OsString;
}
impl FromBytes for std::ffi::OsStr {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> std::ffi::OsString {
        use std::os::unix::ffi::OsStringExt;
        std::ffi::OsString::from_vec(b.to_vec())
    }
}

#[test]
fn migrate_refuses_bad_trees_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let out = keycache_exits(&["migrate", s(&t.path().join("missing"))], 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing"));
    let f = t.path().join("file");
    write(&f, b"x");
    let out = keycache_exits(&["migrate", s(&f)], 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = keycache_exits(&["migrate", s(&empty)], 2);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("minions_pre"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(bank_files(&empty).is_empty());

    // Past the load factor: refused with the size and config line to use.
    let p = t.path().join("pki");
    tree(&p, 5);
    let err = keycache_fails(&["migrate", s(&p), "--size", "17"], 2);
    assert!(
        err.contains("--size ") && err.contains("mmap_key_size: ") && err.contains("80%"),
        "{err}"
    );
    assert!(bank_files(&p).is_empty(), "{:?}", bank_files(&p));

    // An id longer than the id size: refused, naming it and the options.
    let long = "l".repeat(70);
    write(&p.join("minions").join(&long), pem("l", 80).as_bytes());
    let err = keycache_fails(&["migrate", s(&p), "--size", "1009"], 2);
    assert!(
        err.contains(&long) && err.contains("mmap_key_id_size: 70") && err.contains("--id-size"),
        "{err}"
    );
    assert!(bank_files(&p).is_empty());
    // ... and held when the options say so.
    keycache_ok(&[
        "migrate",
        s(&p),
        "--size",
        "1009",
        "--id-size",
        "70",
        "--slot-size",
        "91",
    ]);
    keycache_ok(&["get", s(&p), &long, "--id-size", "70", "--slot-size", "91"]);

    // Dry run: counts, writes nothing.
    let q = t.path().join("pki2");
    tree(&q, 3);
    let rep = keycache_ok_json(&["migrate", s(&q), "--dry-run", "--json", "--size", "1009"]);
    assert_eq!(rep["migrated"]["denied"], 3);
    assert!(bank_files(&q).is_empty());
}

#[test]
fn migrate_keeps_or_replaces_existing_entries_and_writes_out_dir() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("pki");
    tree(&p, 3);
    let out_dir = t.path().join("cluster");
    keycache_ok(&["migrate", s(&p), "--out", s(&out_dir), "--size", "1009"]);
    assert!(
        bank_files(&p).is_empty(),
        "the tree dir is not written with --out"
    );
    // The tree loses a key; a second migration keeps it, --replace drops it.
    std::fs::remove_file(p.join("minions/minions-0")).unwrap();
    let migrate_again = |extra: &[&str]| {
        let args = [
            &["migrate", s(&p), "--out", s(&out_dir), "--json"],
            extra,
            &["--size", "1009"],
        ];
        keycache_json(&args.concat()).1
    };
    let rep = migrate_again(&[]);
    assert_eq!(rep["kept"]["accepted"], 1);
    assert_eq!(rep["total"]["accepted"], 3);
    let rep = migrate_again(&["--replace"]);
    assert_eq!(rep["dropped"], 1);
    assert_eq!(rep["total"]["accepted"], 2);
    keycache_exits(&["get", s(&out_dir), "minions-0"], 1);
    // New files are owner-only.
    for f in bank_files(&out_dir) {
        let mode = std::fs::metadata(out_dir.join(&f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{f}");
    }
}

#[test]
fn list_get_state_changes_stats_like_salt_key() {
    let (_t, st) = sample_store_dir();
    let d = s(&st);
    let out = keycache(&["list", d]);
    let text = String::from_utf8(out.stdout).unwrap();
    let heads: Vec<&str> = text.lines().filter(|l| l.ends_with("Keys:")).collect();
    assert_eq!(
        heads,
        [
            "Accepted Keys:",
            "Denied Keys:",
            "Unaccepted Keys:",
            "Rejected Keys:"
        ]
    );
    let (_, v) = keycache_json(&["list", d, "--json"]);
    assert_eq!(v["minions"].as_array().unwrap().len(), 23);
    assert_eq!(v["minions_pre"].as_array().unwrap().len(), 6);
    assert_eq!(v["minions_rejected"].as_array().unwrap().len(), 4);
    assert_eq!(v["minions_denied"].as_array().unwrap().len(), 3);
    let (_, v) = keycache_json(&["list", d, "--json", "--state", "pending"]);
    assert_eq!(
        v.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["minions_pre"]
    );
    assert!(keycache(&["list", d, "--state", "bogus"]).status.code() == Some(2));

    // get: state, key, denied key; exit 1 when absent; clear error for a bad id.
    let v = keycache_ok_json(&["get", d, "db-02.dc1.example.com", "--json"]);
    assert_eq!(v["state"], "accepted");
    assert!(v["pub"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----"));
    assert!(v["denied_pub"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----"));
    assert_ne!(v["pub"], v["denied_pub"]);
    keycache_exits(&["get", d, "nobody"], 1);
    let out = keycache_exits(&["get", d, "../etc"], 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid minion id"));

    // accept / reject / delete.
    // The migration wrote the key tree into the store's directory (it is
    // not the tree migrated): accept keeps it in step.
    let out = keycache_ok(&["accept", d, "laptop-jdoe"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Key for minion laptop-jdoe accepted.\n\
         Key tree: wrote minions/laptop-jdoe.\n\
         Key tree: removed minions_pre/laptop-jdoe.\n"
    );
    assert_eq!(
        keycache(&["accept", d, "laptop-jdoe"]).status.code(),
        Some(1),
        "already accepted"
    );
    assert_eq!(
        keycache(&["accept", d, "rogue-host"]).status.code(),
        Some(1),
        "rejected needs --include-all"
    );
    keycache_ok(&["accept", d, "rogue-host", "--include-all"]);
    let v = keycache_ok_json(&["reject", d, "--all", "--json"]);
    assert_eq!(v["rejected"].as_array().unwrap().len(), 5);
    let (_, v) = keycache_json(&["list", d, "--json"]);
    assert_eq!(v["minions_pre"].as_array().unwrap().len(), 0);
    keycache_ok(&["delete", d, "db-02.dc1.example.com"]);
    assert_eq!(
        keycache(&["get", d, "db-02.dc1.example.com"]).status.code(),
        Some(1),
        "gone from both banks"
    );
    keycache_exits(&["delete", d, "nobody"], 1);

    // stats.
    let v = keycache_ok_json(&["stats", d, "--json"]);
    assert_eq!(v["counts"]["accepted"], 24);
    assert_eq!(v["keys"]["occupied"], 32);
    assert_eq!(v["keys"]["deleted"], 1);
    assert!(v["keys"]["probe_length"]["max"].as_u64().unwrap() >= 1);
    assert!(v["keys"]["garbage_ratio"].as_f64().unwrap() > 0.0);
    let text = String::from_utf8(keycache(&["stats", d]).stdout).unwrap();
    assert!(
        text.contains("load factor") && text.contains("probes:"),
        "{text}"
    );

    // Salt reads what the CLI wrote.
    let layout = small(1009, 1 << 30);
    let f = salt(
        &st,
        &layout,
        &["fetch", "--bank", "keys", "--id", "laptop-jdoe"],
        None,
    );
    assert_eq!(f["result"]["state"], "accepted");
}

#[test]
fn verify_finds_damage_and_repair_mends_it() {
    let (_t, st) = sample_store_dir();
    let d = s(&st);
    keycache_ok(&["verify", d]);
    // Flip a byte inside a record: that entry is lost, the rest kept.
    let heap = st.join(".mmap_keys.idx.heap");
    let mut b = std::fs::read(&heap).unwrap();
    b[100] ^= 0x55;
    std::fs::write(&heap, &b).unwrap();
    // Drop the roster: a crash between index and roster.
    std::fs::write(st.join(".mmap_denied.idx.roster"), b"").unwrap();
    let v = keycache_json_exits(&["verify", d, "--json"], 1);
    let what = finding_whats(&v);
    assert!(what.iter().any(|w| w.contains("checksum")), "{what:?}");
    assert!(
        what.iter().any(|w| w.contains("missing from the roster")),
        "{what:?}"
    );
    let (out, v) = keycache_json(&["verify", d, "--repair", "--json"]);
    assert_eq!(out.status.code(), Some(1), "an entry was lost");
    let lost: usize = v["repaired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["lost"].as_array().unwrap().len())
        .sum();
    assert_eq!(lost, 1, "{v}");
    // The lost entry stays reported (the bank's lost-entries
    // file), and it is the only finding left.
    let v = keycache_json_exits(&["verify", d, "--json"], 1);
    let left = v["findings"].as_array().unwrap();
    assert_eq!(left.len(), 1, "{v}");
    assert!(
        left[0]["finding"]["what"]
            .as_str()
            .unwrap()
            .starts_with("lost by the repair"),
        "{v}"
    );
    std::fs::remove_file(st.join(".mmap_keys.idx.keycache-lost")).unwrap();
    keycache_ok(&["verify", d]);
    let (_, l) = keycache_json(&["list", d, "--json"]);
    let n: usize = ["minions", "minions_pre", "minions_rejected"]
        .iter()
        .map(|g| l[g].as_array().unwrap().len())
        .sum();
    assert_eq!(n, 32);
    assert_eq!(l["minions_denied"].as_array().unwrap().len(), 3);
}

#[test]
fn compact_export_diff() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    let b = t.path().join("b");
    for x in [&a, &b] {
        sample_store(x);
    }
    keycache_ok(&["diff", s(&a), s(&b)]);
    keycache_ok(&["accept", s(&b), "laptop-jdoe"]);
    keycache_ok(&["delete", s(&b), "mail.example.org"]);
    let v = keycache_json_exits(&["diff", s(&a), s(&b), "--json"], 1);
    assert_eq!(v["only_a"][0]["id"], "mail.example.org");
    assert_eq!(v["differ"][0]["id"], "laptop-jdoe");
    assert_eq!(v["differ"][0]["state_b"], "accepted");

    // compact into a new size; the config line is printed; the store still verifies.
    let out = keycache(&["compact", s(&b), "--to-size", "2003"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("mmap_key_size: 2003"),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(b.join(".mmap_keys.idx")).unwrap().len(),
        2003 * 96
    );
    assert!(
        keycache(&["verify", s(&b)]).status.success(),
        "size inferred from the index"
    );
    let (_, v) = keycache_json(&["stats", s(&b), "--json"]);
    assert_eq!(v["keys"]["deleted"], 0);
    assert_eq!(v["keys"]["garbage_ratio"], 0.0);

    // export: the tree Salt would have, 0600 files.
    let e = t.path().join("export");
    let v = keycache_ok_json(&["export", s(&b), "--to", s(&e), "--json"]);
    assert_eq!(v["written"], 35);
    let f = e.join("minions/laptop-jdoe");
    assert_eq!(
        std::fs::read(&f).unwrap(),
        std::fs::read(sample_pki().join("minions_pre/laptop-jdoe")).unwrap()
    );
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let v = keycache_ok_json(&["export", s(&b), "--to", s(&e), "--json"]);
    assert_eq!(v["unchanged"], 35);
    // An accepted key file that differs is always replaced (Salt's
    // validate_token reads it); another state's is left alone unless --force.
    let pending = std::fs::read_dir(e.join("minions_pre"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let want = std::fs::read(&f).unwrap();
    std::fs::write(&f, b"other").unwrap();
    std::fs::write(&pending, b"other").unwrap();
    keycache_exits(&["export", s(&b), "--to", s(&e)], 1);
    assert_eq!(std::fs::read(&f).unwrap(), want);
    assert_eq!(std::fs::read(&pending).unwrap(), b"other");
    keycache_ok(&["export", s(&b), "--to", s(&e), "--force"]);
    assert_ne!(std::fs::read(&pending).unwrap(), b"other");
    // Round trip: migrating the export gives the same store.
    let c = t.path().join("c");
    keycache_ok(&["migrate", s(&e), "--out", s(&c), "--size", "2003"]);
    keycache_ok(&["diff", s(&b), s(&c)]);
}

#[test]
fn bench_reports_rates() {
    let (_t, st) = sample_store_dir();
    let v = keycache_ok_json(&[
        "bench",
        s(&st),
        "--seconds",
        "0.2",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(v["threads"], 2);
    for k in [
        "hit",
        "miss",
        "get_many",
        "get_in",
        "reader_get_in",
        "get_many_in",
    ] {
        assert!(v[k]["lookups_per_s"].as_f64().unwrap() > 0.0, "{k}");
        assert!(v[k]["ns_per_lookup"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn migrate_and_compact_as_root_give_files_to_the_masters_user() {
    use std::os::unix::fs::MetadataExt;
    if skip::needs_root("migrate_and_compact_as_root_give_files_to_the_masters_user") {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("store");
        std::fs::create_dir(&out).unwrap();
        // The directory belongs to the master's user: files follow it.
        std::os::unix::fs::chown(&out, Some(65534), Some(65534)).unwrap();
        sample_store(&out);
        for f in bank_files(&out) {
            let m = std::fs::metadata(out.join(&f)).unwrap();
            assert_eq!(
                (m.uid(), m.gid(), m.mode() & 0o777),
                (65534, 65534, 0o600),
                "{f}"
            );
        }
        // --user overrides, for compaction too: the banks it rebuilds
        // (keycache's own files, the history and the tree's intent record,
        // stay the directory owner's).
        keycache_ok(&["compact", s(&out), "--user", "4242:4343"]);
        for f in bank_files(&out)
            .iter()
            .filter(|f| f.starts_with(".mmap_") && !f.ends_with(".lock"))
        {
            let m = std::fs::metadata(out.join(f)).unwrap();
            assert_eq!((m.uid(), m.gid()), (4242, 4343), "{f}");
        }
        let bad = keycache_exits(
            &[
                "migrate",
                s(&sample_pki()),
                "--out",
                s(&out),
                "--user",
                "no-such-user-xyz",
            ],
            2,
        );
        assert!(String::from_utf8_lossy(&bad.stderr).contains("no such user"));
    }
}
