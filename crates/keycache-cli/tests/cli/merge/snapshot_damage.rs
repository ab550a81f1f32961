//! A damaged snapshot changes nothing: `keycache merge` refuses a snapshot
//! file (THEIRS, or THEIRS on stdin) that is truncated (at several lengths:
//! empty, inside the magic, the magic alone, the header alone, inside an
//! entry, without its checksum, one byte short), has one byte flipped (in
//! the magic, the version, the flags, the cluster, the store, the
//! generation, the count, an entry's fields, an id, a key, the checksum),
//! has bytes past its end, another format version (1, the old format,
//! included; checksum made right) or another magic, is not a snapshot at
//! all, or breaks what an entry promises with its checksum right (entries
//! out of order or repeated, a kind the bank cannot hold, a tombstone with
//! a key, an invalid id); and a merge base (`--base`, a `KCBASE` file) that
//! is truncated, flipped, too long, of another version, or a snapshot. Each
//! refusal exits 2 with a message naming the file and what is wrong, and
//! every file of the store directory (banks, lock files, the localfs_key
//! tree; no history file appears) is byte for byte and inode for inode what
//! it was, with no file added or removed.
//!
//! Control: the intact snapshot merges (exit 0) and does change the store, so
//! the comparison can fail.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::{
    check_ok, files, files_changed as changes, gen_pki_tree, kc, reseal, small, snapshot_bytes,
    snapshot_parts, stderr, Params, ParamsExt, RawEntry,
};
use keycache::{KeyState, MinionId, Store};
use keycache_merge::snapshot::{Snapshot, HEADER_LEN, MAGIC, TRAILER_LEN};

fn layout() -> Params {
    small(1009, 16 * 1024)
}

/// How a damaged file is handed to `keycache merge`: (how, arguments,
/// stdin, the name the message must give).
type Case<'a> = (&'a str, Vec<std::ffi::OsString>, Option<&'a [u8]>, String);

fn run(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut sin = child.stdin.take().unwrap();
    let data = stdin.map(<[u8]>::to_vec).unwrap_or_default();
    let w = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut sin, &data);
    });
    let out = child.wait_with_output().unwrap();
    w.join().unwrap();
    out
}

/// A pki_dir holding a localfs_key tree and the banks migrated from it.
fn make_store(root: &Path) -> PathBuf {
    let pki = root.join("pki");
    gen_pki_tree(&pki, &["--minions", "60", "--seed", "5"]);
    common::kc()
        .no_settle()
        .arg("migrate")
        .arg(&pki)
        .arg("--no-master-keys")
        .layout(&layout())
        .ok();
    assert!(pki.join("minions").is_dir() && pki.join(".mmap_keys.idx").is_file());
    std::fs::write(pki.join("master.pub"), cluster_key()).unwrap();
    pki
}

/// The master public key both stores hold: they are of one cluster.
fn cluster_key() -> String {
    common::pem("the-cluster", 451)
}

/// A snapshot (through `keycache snapshot`) of a store holding only new ids:
/// merged into the store of [`make_store`], it adds keys to both banks and
/// conflicts with nothing.
fn theirs_snapshot(root: &Path) -> Vec<u8> {
    let dir = root.join("theirs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("master.pub"), cluster_key()).unwrap();
    {
        let st = Store::open_with(&dir, &layout().options()).unwrap();
        for i in 0..12 {
            let id = MinionId::new(format!("peer-{i:02}.example.org")).unwrap();
            let state = KeyState::ALL[i % 3];
            st.put(&id, state, common::pem(id.as_str(), 451).as_bytes())
                .unwrap();
            if i % 4 == 0 {
                st.deny(&id, common::pem(&format!("{id}-denied"), 451).as_bytes())
                    .unwrap();
            }
        }
    }
    let snap = root.join("theirs.snap");
    kc().arg("snapshot")
        .arg(&dir)
        .arg("-o")
        .arg(&snap)
        .layout(&layout())
        .no_settle()
        .ok_output();
    let b = std::fs::read(&snap).unwrap();
    let s = Snapshot::from_bytes(&b, "theirs.snap").expect("the intact snapshot reads");
    assert_eq!(s.entries.len(), 12 + 3);
    b
}

/// A damaged variant: (what, bytes, words one of which the message must
/// hold).
type Variant = (String, Vec<u8>, Vec<&'static str>);

/// The damaged variants of `good`, a version 2 snapshot.
fn variants(good: &[u8]) -> Vec<Variant> {
    let n = good.len();
    let mut v: Vec<Variant> = Vec::new();
    let trunc = ["truncated", "empty"];
    // The first entry's head starts at HEADER_LEN; its id at +16.
    for len in [
        0,
        MAGIC.len(),
        HEADER_LEN,
        HEADER_LEN + TRAILER_LEN,
        HEADER_LEN + 10,
        HEADER_LEN + 20,
        n / 2,
        n - TRAILER_LEN,
        n - 3,
        n - 1,
    ] {
        v.push((
            format!("truncated to {len} of {n} bytes"),
            good[..len].to_vec(),
            trunc.to_vec(),
        ));
    }
    let any = vec![
        "checksum",
        "truncated",
        "version",
        "magic",
        "unknown",
        "past",
        "order",
        "flags",
        "invalid",
        "utf-8",
        "kind",
        "tombstone",
        "empty",
        "more than",
    ];
    let sum = vec!["checksum"];
    for (pos, words, what) in [
        (0, vec!["magic"], "magic"),
        (7, vec!["magic"], "magic"),
        (8, vec!["version"], "version"),
        (12, any.clone(), "flags"),
        (16, sum.clone(), "cluster"),
        (31, sum.clone(), "cluster, last byte"),
        (32, sum.clone(), "store"),
        (48, sum.clone(), "generation"),
        (56, any.clone(), "entry count"),
        (HEADER_LEN, any.clone(), "first entry's bank"),
        (HEADER_LEN + 1, any.clone(), "first entry's kind"),
        (HEADER_LEN + 2, any.clone(), "first entry's id length"),
        (HEADER_LEN + 4, any.clone(), "first entry's key length"),
        (HEADER_LEN + 8, sum.clone(), "first entry's stamp"),
        (HEADER_LEN + 16 + 2, any.clone(), "first entry's id"),
        (HEADER_LEN + 16 + 40, sum.clone(), "first entry's key"),
        (n / 2, any.clone(), "middle"),
        (n - TRAILER_LEN - 30, sum.clone(), "last entry's key"),
        (n - TRAILER_LEN, sum.clone(), "checksum, first byte"),
        (n - 1, sum.clone(), "checksum, last byte"),
    ] {
        for bit in [0x01u8, 0x80] {
            let mut b = good.to_vec();
            b[pos] ^= bit;
            v.push((
                format!("byte {pos} ({what}) ^ {bit:#04x}"),
                b,
                words.clone(),
            ));
        }
    }
    let mut b = good.to_vec();
    b.extend_from_slice(b"\0\0\0\0");
    v.push(("4 bytes past the checksum".into(), b, any.clone()));
    for version in [0u32, 1, 3, 0x0100_0000] {
        let mut b = good.to_vec();
        b[8..12].copy_from_slice(&version.to_le_bytes());
        reseal(&mut b);
        v.push((
            format!("version {version} (checksum right)"),
            b,
            vec!["version"],
        ));
    }
    let mut b = good.to_vec();
    b[..8].copy_from_slice(b"KCSNAQ\r\n");
    reseal(&mut b);
    v.push(("another magic (checksum right)".into(), b, vec!["magic"]));
    v.push((
        "a PEM file".into(),
        common::pem("not-a-snapshot", 451).into_bytes(),
        vec!["magic", "not a keycache snapshot"],
    ));
    v
}

/// Variants of `good` that break what an entry promises, their checksum
/// right: the reader must check more than the checksum.
fn promise_variants(good: &[u8]) -> Vec<Variant> {
    let (h, entries) = snapshot_parts(good);
    let keys = entries.iter().position(|e| e.bank == 1).unwrap();
    let denied = entries.iter().position(|e| e.bank == 2).unwrap();
    let mut v: Vec<Variant> = Vec::new();
    let mut with = |what: &str, words: Vec<&'static str>, f: &dyn Fn(&mut Vec<RawEntry>)| {
        let mut e = entries.clone();
        f(&mut e);
        v.push((
            format!("{what} (checksum right)"),
            snapshot_bytes(&h, &e),
            words,
        ));
    };
    with("two entries swapped", vec!["order"], &|e| e.swap(0, 1));
    with("an entry twice", vec!["repeated"], &|e| {
        let d = e[keys].clone();
        e.insert(keys, d)
    });
    with("a keys entry of kind denied", vec!["kind denied"], &|e| {
        e[keys].kind = 4
    });
    with(
        "a denied_keys entry of kind accepted",
        vec!["kind accepted"],
        &|e| e[denied].kind = 1,
    );
    with("kind 9", vec!["unknown kind"], &|e| e[keys].kind = 9);
    with("bank 3", vec!["unknown bank"], &|e| e[keys].bank = 3);
    with(
        "a tombstone with a key",
        vec!["tombstone with a key"],
        &|e| e[keys].kind = 0,
    );
    with("an empty id", vec!["id"], &|e| e[keys].id.clear());
    with("an id with a slash", vec!["id"], &|e| {
        e[keys].id = b"../etc".to_vec()
    });
    for (delta, what, words) in [
        (-1i64, "one short", vec!["past the checksum", "checksum"]),
        (1, "one more", vec!["truncated"]),
    ] {
        let mut b = good.to_vec();
        let count = u64::from_le_bytes(b[56..64].try_into().unwrap());
        b[56..64].copy_from_slice(&count.wrapping_add_signed(delta).to_le_bytes());
        reseal(&mut b);
        v.push((format!("the count {what} (checksum right)"), b, words));
    }
    v
}

/// A merge base `keycache merge --write-base` wrote for `good` (in a copy
/// of the store), and its damaged variants.
fn base_variants(root: &Path, pki: &Path, good_file: &Path) -> Vec<Variant> {
    let copy = root.join("copy-for-base");
    keycache_testkit::crash::copy_tree(pki, &copy);
    let base = root.join("good.base");
    kc().arg("merge")
        .arg(&copy)
        .arg(good_file)
        .arg("--write-base")
        .arg(&base)
        .layout(&layout())
        .no_settle()
        .ok_output();
    let good = std::fs::read(&base).unwrap();
    assert_eq!(&good[..8], b"KCBASE\r\n");
    let n = good.len();
    let words = vec!["merge base"];
    let mut v: Vec<Variant> = Vec::new();
    for len in [0, 4, 8, 12, n - 8, n - 1] {
        v.push((
            format!("base truncated to {len} of {n} bytes"),
            good[..len].to_vec(),
            words.clone(),
        ));
    }
    for (pos, what) in [
        (0, "magic"),
        (8, "version"),
        (12, "store"),
        (28, "generation"),
        (n - 8, "checksum"),
    ] {
        let mut b = good.clone();
        b[pos] ^= 0x01;
        v.push((format!("base byte {pos} ({what}) ^ 0x01"), b, words.clone()));
    }
    let mut b = good.clone();
    b.push(0);
    v.push(("base with a byte past its end".into(), b, words.clone()));
    let mut b = good.clone();
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    reseal(&mut b);
    v.push((
        "base of version 2 (checksum right)".into(),
        b,
        words.clone(),
    ));
    let snap = std::fs::read(good_file).unwrap();
    v.push(("a version 2 snapshot as the base".into(), snap, words));
    v
}

#[test]
fn damaged_snapshots_are_refused_and_change_nothing() {
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let pki = make_store(t.path());
    let good = theirs_snapshot(t.path());
    let good_file = t.path().join("theirs.snap");
    let before = files(&pki);
    let l = layout();
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut all: Vec<(&str, Variant)> = Vec::new();
    all.extend(variants(&good).into_iter().map(|v| ("THEIRS", v)));
    all.extend(promise_variants(&good).into_iter().map(|v| ("THEIRS", v)));
    all.extend(
        base_variants(t.path(), &pki, &good_file)
            .into_iter()
            .map(|v| ("--base", v)),
    );
    for (k, (role, (what, bytes, words))) in all.into_iter().enumerate() {
        let file = t.path().join(format!("damaged-{k}"));
        std::fs::write(&file, &bytes).unwrap();
        // THEIRS damaged (as a file and on stdin), or --base damaged
        // (THEIRS intact).
        let cases: Vec<Case> = if role == "THEIRS" {
            vec![
                (
                    "THEIRS",
                    vec![file.clone().into()],
                    None,
                    file.to_string_lossy().into_owned(),
                ),
                ("stdin", vec!["-".into()], Some(&bytes[..]), String::new()),
            ]
        } else {
            vec![(
                "--base",
                vec![
                    good_file.clone().into(),
                    "--base".into(),
                    file.clone().into(),
                ],
                None,
                file.to_string_lossy().into_owned(),
            )]
        };
        for (how, args, stdin, name) in cases {
            if how == "stdin" && k % 3 != 0 {
                continue;
            }
            let mut cmd = kc.cmd();
            cmd.arg("merge").arg(&pki).args(&args).args(l.args());
            let out = run(&mut cmd, stdin);
            let err = stderr(&out);
            let ctx = format!("{what}, as {how}");
            checked += 1;
            if out.status.code() != Some(2) {
                failures.push(format!(
                    "{ctx}: exit {:?}, not 2: {err}{}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stdout)
                ));
            } else {
                if !name.is_empty() && !err.contains(&name) {
                    failures.push(format!("{ctx}: the message does not name {name}: {err}"));
                }
                if how == "stdin"
                    && !(err.contains("stdin") || err.contains("'-'") || err.contains("\"-\""))
                {
                    failures.push(format!("{ctx}: the message does not name stdin: {err}"));
                }
                let lower = err.to_lowercase();
                if !words.iter().any(|w| lower.contains(w)) {
                    failures.push(format!("{ctx}: the message says none of {words:?}: {err}"));
                }
            }
            let after = files(&pki);
            let c = changes(&before, &after);
            assert!(
                c.is_empty(),
                "{ctx}: the refused merge changed the store: {c:?}\nstderr: {err}"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} refusals wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Control: the intact snapshot merges and changes the store.
    let out = kc
        .cmd()
        .arg("merge")
        .arg(&pki)
        .arg(&good_file)
        .args(l.args())
        .output()
        .unwrap();
    check_ok("the intact snapshot", &out);
    let after = files(&pki);
    assert!(
        !changes(&before, &after).is_empty(),
        "the intact snapshot changed nothing"
    );
    let dump = common::kc_dump(&pki, &l);
    assert!(dump["keys"]["peer-00.example.org"].is_object(), "{dump}");
    assert!(
        dump["denied_keys"]["peer-04.example.org"].is_array(),
        "{dump}"
    );
    eprintln!("snapshot_damage: {checked} refusals checked, the store unchanged by each");
}

#[test]
fn a_snapshot_cut_inside_its_magic_is_reported_truncated() {
    let t = tempfile::tempdir().unwrap();
    let good = theirs_snapshot(t.path());
    let pki = make_store(t.path());
    let before = files(&pki);
    for len in [1, 4, MAGIC.len() - 1] {
        let file = t.path().join(format!("cut-{len}.snap"));
        std::fs::write(&file, &good[..len]).unwrap();
        let out = common::cli()
            .cmd()
            .arg("merge")
            .arg(&pki)
            .arg(&file)
            .args(layout().args())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&*file.to_string_lossy()) && err.to_lowercase().contains("truncated"),
            "the first {len} bytes of a snapshot: {err}"
        );
        assert!(changes(&before, &files(&pki)).is_empty());
    }
}
