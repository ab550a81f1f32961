//! A damaged snapshot changes nothing: `keycache merge` refuses a snapshot
//! file (THEIRS, `--base`, or THEIRS on stdin) that is truncated (at several
//! lengths: empty, inside the magic, the magic alone, the header alone, inside
//! an entry, without its checksum, one byte short), has one byte flipped (in
//! the magic, the version, the header, an entry's fields, an id, a key, the
//! checksum), has bytes past its end, another format version (checksum made
//! right) or another magic, or is not a snapshot at all; and a snapshot with
//! a seen section (`keycache snapshot --seen`) truncated or flipped in that
//! section. Each refusal exits 2 with a message naming the file and what is
//! wrong, and every file of the store directory (banks, lock files, the
//! localfs_key tree) is byte for byte and inode for inode what it was, with
//! no file added or removed.
//!
//! Control: the intact snapshot merges (exit 0) and does change the store, so
//! the comparison can fail.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::Layout;
use keycache::snapshot::{Snapshot, HEADER_LEN, MAGIC, TRAILER_LEN};
use keycache::{KeyState, MinionId, Store};

fn layout() -> Layout {
    Layout::small(1009, 16 * 1024)
}

/// Every file under `dir`, recursively: path -> (kind, inode, bytes or
/// link target).
type Files = BTreeMap<PathBuf, (char, u64, Vec<u8>)>;

/// How a damaged file is handed to `keycache merge`: (how, arguments,
/// stdin, the name the message must give).
type Case<'a> = (&'a str, Vec<std::ffi::OsString>, Option<&'a [u8]>, String);

fn files(dir: &Path) -> Files {
    let mut out = Files::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            if m.is_dir() {
                out.insert(rel, ('d', m.ino(), Vec::new()));
                stack.push(p);
            } else if m.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, ('l', m.ino(), t.into_os_string().into_encoded_bytes()));
            } else {
                out.insert(rel, ('f', m.ino(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// What differs between two listings, for a failure message.
fn changes(a: &Files, b: &Files) -> Vec<String> {
    let mut v = Vec::new();
    for (p, x) in a {
        match b.get(p) {
            None => v.push(format!("{} removed", p.display())),
            Some(y) if y.0 != x.0 => v.push(format!("{} changed kind", p.display())),
            Some(y) if y.1 != x.1 => v.push(format!("{} replaced (inode)", p.display())),
            Some(y) if y.2 != x.2 => v.push(format!("{} changed bytes", p.display())),
            _ => {}
        }
    }
    for p in b.keys() {
        if !a.contains_key(p) {
            v.push(format!("{} added", p.display()));
        }
    }
    v
}

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
    let out = Command::new(common::python())
        .arg(common::repo().join("tools/gen-pki-tree.py"))
        .arg(&pki)
        .args(["--minions", "60", "--seed", "5"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gen-pki-tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kc = common::cli();
    let out = kc
        .cmd()
        .arg("migrate")
        .arg(&pki)
        .arg("--no-master-keys")
        .args(layout().args())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keycache migrate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(pki.join("minions").is_dir() && pki.join(".mmap_keys.idx").is_file());
    pki
}

/// A snapshot (through `keycache snapshot`) of a store holding only new ids:
/// merged into the store of [`make_store`], it adds keys to both banks and
/// conflicts with nothing.
fn theirs_snapshot(root: &Path) -> Vec<u8> {
    let dir = root.join("theirs");
    std::fs::create_dir(&dir).unwrap();
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
    let out = common::cli()
        .cmd()
        .arg("snapshot")
        .arg(&dir)
        .arg("-o")
        .arg(&snap)
        .args(layout().args())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keycache snapshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = std::fs::read(&snap).unwrap();
    let s = Snapshot::from_bytes(&b, "theirs.snap").expect("the intact snapshot reads");
    assert_eq!(s.entries.len(), 12 + 3);
    b
}

/// The checksum made right again after an edit.
fn reseal(b: &mut [u8]) {
    let n = b.len() - TRAILER_LEN;
    let sum = keycache::format::hash(&b[..n]);
    b[n..].copy_from_slice(&sum.to_le_bytes());
}

/// The damaged variants of `good`: (name, bytes, words one of which the
/// message must hold).
fn variants(good: &[u8]) -> Vec<(String, Vec<u8>, Vec<&'static str>)> {
    let n = good.len();
    let mut v: Vec<(String, Vec<u8>, Vec<&'static str>)> = Vec::new();
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
    ];
    let sum = vec!["checksum"];
    for (pos, words, what) in [
        (0, vec!["magic"], "magic"),
        (7, vec!["magic"], "magic"),
        (8, vec!["version"], "version"),
        (12, any.clone(), "flags"),
        (16, sum.clone(), "taken time"),
        (24, any.clone(), "entry count"),
        (HEADER_LEN, any.clone(), "first entry's bank"),
        (HEADER_LEN + 1, any.clone(), "first entry's state"),
        (HEADER_LEN + 2, any.clone(), "first entry's id length"),
        (HEADER_LEN + 4, any.clone(), "first entry's key length"),
        (HEADER_LEN + 8, sum.clone(), "first entry's mtime"),
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
    for version in [0u32, 2, 0x0100_0000] {
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

/// A snapshot with a seen section (`keycache snapshot --seen FILE`, FILE
/// the intact snapshot itself), and its variants damaged in that section.
fn seen_variants(root: &Path) -> Vec<(String, Vec<u8>, Vec<&'static str>)> {
    let out = root.join("theirs-seen.snap");
    let o = common::cli()
        .cmd()
        .arg("snapshot")
        .arg(root.join("theirs"))
        .arg("--seen")
        .arg(root.join("theirs.snap"))
        .arg("-o")
        .arg(&out)
        .args(layout().args())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "keycache snapshot --seen: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let good = std::fs::read(&out).unwrap();
    let snap = Snapshot::from_bytes(&good, "theirs-seen.snap").expect("it reads");
    assert_eq!(
        u32::from_le_bytes(good[12..16].try_into().unwrap()),
        keycache::snapshot::FLAG_SEEN
    );
    let seen = snap.seen.as_ref().expect("a seen section");
    assert_eq!(seen.len(), snap.entries.len());
    // Where the seen section starts: after the entries.
    let o = HEADER_LEN
        + snap
            .entries
            .iter()
            .map(|e| 16 + e.id.len() + e.pub_key.len())
            .sum::<usize>();
    assert_eq!(
        u64::from_le_bytes(good[o..o + 8].try_into().unwrap()),
        seen.len() as u64
    );
    let n = good.len();
    let trunc = vec!["truncated"];
    let any = vec![
        "checksum",
        "truncated",
        "unknown",
        "past",
        "order",
        "flags",
        "invalid",
        "utf-8",
    ];
    let mut v = Vec::new();
    for len in [o, o + 4, o + 8, o + 8 + 10, n - TRAILER_LEN - 5] {
        v.push((
            format!("seen snapshot truncated to {len} of {n} bytes"),
            good[..len].to_vec(),
            trunc.clone(),
        ));
    }
    for (pos, words, what) in [
        (12, any.clone(), "flags: the seen bit"),
        (o, any.clone(), "seen count"),
        (o + 8, any.clone(), "first seen entry's bank"),
        (o + 8 + 16 + 3, any.clone(), "first seen entry's id"),
        (
            o + 8 + 16 + 19 + 30,
            vec!["checksum"],
            "first seen entry's key",
        ),
        (
            n - TRAILER_LEN - 5,
            vec!["checksum"],
            "last seen entry's key",
        ),
    ] {
        let mut b = good.clone();
        b[pos] ^= 0x01;
        v.push((
            format!("seen snapshot byte {pos} ({what}) ^ 0x01"),
            b,
            words,
        ));
    }
    v
}

#[test]
fn damaged_snapshots_are_refused_and_change_nothing() {
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let pki = make_store(t.path());
    let good = theirs_snapshot(t.path());
    let before = files(&pki);
    let l = layout();
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut all = variants(&good);
    all.extend(seen_variants(t.path()));
    for (k, (what, bytes, words)) in all.into_iter().enumerate() {
        let file = t.path().join(format!("damaged-{k}.snap"));
        std::fs::write(&file, &bytes).unwrap();
        let good_file = t.path().join("theirs.snap");
        // THEIRS damaged; --base damaged (THEIRS intact); THEIRS on stdin.
        let cases: Vec<Case> = vec![
            (
                "THEIRS",
                vec![file.clone().into()],
                None,
                file.to_string_lossy().into_owned(),
            ),
            (
                "--base",
                vec![good_file.into(), "--base".into(), file.clone().into()],
                None,
                file.to_string_lossy().into_owned(),
            ),
            ("stdin", vec!["-".into()], Some(&bytes[..]), String::new()),
        ];
        for (how, args, stdin, name) in cases {
            if how == "stdin" && k % 3 != 0 {
                continue;
            }
            let mut cmd = kc.cmd();
            cmd.arg("merge").arg(&pki).args(&args).args(l.args());
            let out = run(&mut cmd, stdin);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
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
        .arg(t.path().join("theirs.snap"))
        .args(l.args())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the intact snapshot: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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

/// A file cut inside the magic is a truncated snapshot, not "another file".
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
