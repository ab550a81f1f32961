//! Hostile input and permissions.
//!
//! - Ids (empty, `.`, `..`, with `/`, `\`, NUL, non-UTF-8, longer than the id
//!   size, exactly the id size, non-ASCII UTF-8 whose bytes outrun its
//!   characters): accepted or refused as Salt's own `valid_id` says (asked
//!   through the real Salt), with a clear error, by the library (`MinionId`,
//!   the store, the generic table) and by every CLI command that takes ids;
//!   what is accepted Salt reads back.
//! - The migrator never follows a symlink (key files, state directories, bank
//!   files in the target), never opens anything outside PKI_DIR and the
//!   target, never writes outside the target (checked with strace when it is
//!   installed), refuses files too large to be a public key and skips FIFOs
//!   and device nodes without blocking.
//! - Files are created 0600 whatever the umask; compaction, migration and
//!   export never widen an existing file's mode.
//! - Under root: files written by migrate, compact, the library and export
//!   take the owner and group of their directory, or of the files they
//!   replace (when not root: a SKIP line, see `keycache_testkit::skip`).

use crate::common;
use crate::common::{kc, ok, pem, s, stderr, Params, ParamsExt, TestCommand, TREE_DIRS};

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use keycache::format::{DENIED_INDEX, KEYS_INDEX};
use keycache::{Error, KeyState, MinionId, Store};
use keycache_testkit::{skip, sys};

/// A layout with a 16-byte id field, so the length limits are easy to hit.
fn narrow() -> Params {
    Params {
        size: 101,
        max_segment_bytes: 1 << 20,
        id_size: 16,
        slot_size: 40,
    }
}

/// Salt's `valid_id` verdict on each id.
fn salt_valid(ids: &[String]) -> Vec<bool> {
    let script = r#"
import json, sys
import salt.utils.verify as v
ids = json.load(sys.stdin)
print(json.dumps([bool(v.valid_id({"pki_dir": "/srv/salt/pki/master"}, i)) for i in ids]))
"#;
    let v = TestCommand::new(common::python())
        .args(["-c", script])
        .stdin(serde_json::to_string(ids).unwrap())
        .json();
    serde_json::from_value(v).unwrap()
}

/// `keycache migrate pki --out out` in `layout`, which must exit 2; its stderr.
fn migrate_refused(pki: &Path, out: &Path, layout: &Params) -> String {
    let o = kc()
        .args(["migrate", s(pki), "--out", s(out)])
        .layout(layout)
        .fails_output(2);
    stderr(&o)
}

#[test]
fn ids_are_accepted_or_refused_as_salt_says() {
    let l = narrow();
    let cands: Vec<String> = [
        "",
        ".",
        "..",
        "a/b",
        "/",
        "../up",
        "a\\b",
        "nul\0id",
        " a ",
        "a\nb",
        "tab\there",
        "...",
        ".hidden",
        "a..b",
        "-",
        "~",
        "$(reboot)",
        "web-01",
        "sixteen-bytes-16",  // exactly the id size
        "seventeen-bytes17", // one more
        "ünïcødé",           // non-ASCII, short
        "éééééééé",          // 8 chars, 16 bytes: exactly the id size
        "ééééééééé",         // 9 chars, 18 bytes: too long in bytes
        "日本語のホスト名",  // 8 chars, 24 bytes
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let verdicts = salt_valid(&cands);
    let t = tempfile::tempdir().unwrap();
    let store = Store::open_with(t.path(), &l.options()).unwrap();
    let mut stored = Vec::new();
    for (id, salt_ok) in cands.iter().zip(&verdicts) {
        let m = MinionId::new(id.clone());
        assert_eq!(
            m.is_ok(),
            *salt_ok,
            "{id:?}: keycache {m:?}, Salt {salt_ok}"
        );
        let Ok(m) = m else {
            let e = m.unwrap_err();
            assert!(matches!(e, Error::InvalidId { .. }), "{e}");
            assert!(e.to_string().contains("invalid minion id"), "{e}");
            continue;
        };
        let r = store.put(&m, KeyState::Pending, pem(id, 40).as_bytes());
        if id.len() > l.id_size {
            let e = r.unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::IdTooLong { .. }), "{id:?}: {e}");
            assert!(
                msg.contains(&format!("mmap_key_id_size: {}", id.len()))
                    && !msg.contains("--id-size"),
                "{msg}"
            );
            // Every other entry point refuses it the same way.
            assert!(matches!(store.get(&m), Err(Error::IdTooLong { .. })));
            assert!(matches!(
                store.deny(&m, b"-----BEGIN PUBLIC KEY-----\n"),
                Err(Error::IdTooLong { .. })
            ));
            assert!(matches!(store.remove(&m), Err(Error::IdTooLong { .. })));
            assert!(matches!(
                store.set_state(&m, KeyState::Accepted),
                Err(Error::IdTooLong { .. })
            ));
        } else {
            r.unwrap();
            assert_eq!(
                store.get(&m).unwrap().unwrap().public_key,
                pem(id, 40).as_bytes()
            );
            stored.push(id.clone());
        }
    }
    // Non-UTF-8 and the generic table's own checks.
    assert!(matches!(
        MinionId::from_bytes(b"caf\xe9"),
        Err(Error::InvalidId { why, .. }) if why.contains("UTF-8")
    ));
    let kt = store.keys_table();
    assert!(matches!(
        kt.put(b"", b"\x01x"),
        Err(Error::InvalidId { .. })
    ));
    assert!(matches!(
        kt.put(b"a\0b", b"\x01x"),
        Err(Error::InvalidId { .. })
    ));
    assert!(matches!(
        kt.put(&[b'x'; 17], b"\x01x"),
        Err(Error::IdTooLong { .. })
    ));
    kt.put(b"\xff\xfe-raw", b"\x02raw").unwrap(); // the generic table takes bytes
    kt.remove(b"\xff\xfe-raw").unwrap();
    // Salt reads back every id keycache accepted, exactly.
    let (dump, log) = common::salt_dump_many(&[t.path().to_path_buf()], &l).remove(0);
    assert!(log.iter().all(|x| !x.starts_with("salt: ")), "{log:?}");
    let mut salt_ids: Vec<String> = dump["keys"].as_object().unwrap().keys().cloned().collect();
    salt_ids.sort();
    stored.sort();
    assert_eq!(salt_ids, stored);

    // The CLI: every command that takes ids.
    let d = s(t.path());
    for (id, salt_ok) in cands.iter().zip(&verdicts) {
        if id.contains('\0') {
            continue; // cannot be an argument
        }
        for cmd in ["get", "accept", "reject", "delete"] {
            let o = kc().args([cmd, d, id]).layout(&l).output();
            let e = stderr(&o);
            if !salt_ok {
                assert_eq!(o.status.code(), Some(2), "{cmd} {id:?}: {e}");
                assert!(e.contains("invalid minion id"), "{cmd} {id:?}: {e}");
            } else if id.len() > l.id_size {
                assert_eq!(o.status.code(), Some(2), "{cmd} {id:?}: {e}");
                assert!(e.contains("longer than the id size"), "{cmd} {id:?}: {e}");
            } else {
                assert!(
                    matches!(o.status.code(), Some(0) | Some(1)),
                    "{cmd} {id:?}: {e}"
                );
                assert!(!e.contains("panicked"), "{e}");
            }
        }
    }
    // A non-UTF-8 argument.
    for cmd in ["get", "accept", "delete"] {
        let o = Command::new(env!("CARGO_BIN_EXE_keycache"))
            .arg(cmd)
            .arg(d)
            .arg(OsStr::from_bytes(b"caf\xe9"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        assert!(stderr(&o).contains("UTF-8"), "{cmd}: {}", stderr(&o));
    }
    // Migration: an id at the limit goes in, one past it refuses the tree
    // (or is skipped with --skip-long-ids).
    let pki = t.path().join("pki");
    std::fs::create_dir_all(pki.join("minions")).unwrap();
    std::fs::write(pki.join("minions/sixteen-bytes-16"), pem("a", 50)).unwrap();
    std::fs::write(pki.join("minions/éééééééé"), pem("b", 50)).unwrap();
    std::fs::write(pki.join("minions/ééééééééé"), pem("c", 50)).unwrap();
    let out = t.path().join("out");
    let e = migrate_refused(&pki, &out, &l);
    assert!(e.contains("ééééééééé") && e.contains("--id-size"), "{e}");
    assert!(!out.join(KEYS_INDEX).exists());
    let o = kc()
        .args([
            "migrate",
            s(&pki),
            "--out",
            s(&out),
            "--skip-long-ids",
            "--json",
        ])
        .layout(&l)
        .ok_output();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["migrated"]["accepted"], 2);
    assert_eq!(v["skipped"][0]["reason"], "id_too_long");
}

// ---------------------------------------------------------------------------
// The migrator and the file system
// ---------------------------------------------------------------------------

fn strace() -> Option<PathBuf> {
    ["/usr/bin/strace", "/bin/strace"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Paths a traced run touched: (syscall, path, flags text).
fn traced_paths(log: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for line in log.lines() {
        let line = line.split_once(' ').map(|x| x.1).unwrap_or(line).trim();
        let Some((call, rest)) = line.split_once('(') else {
            continue;
        };
        // strace -y prints each descriptor argument with its path,
        // `5</dir>`: a name given to an `*at` call right after one (the key
        // tree's writer reaches its files relative to the directories it
        // opened) is placed in that directory.
        let mut it = rest.split('"');
        let mut before = it.next().unwrap_or("");
        while let Some(q) = it.next() {
            let dir = before
                .trim_end()
                .strip_suffix(">,")
                .and_then(|b| b.rsplit_once('<'))
                .map(|(_, d)| d);
            let path = match dir {
                Some(d) if !q.starts_with('/') => format!("{d}/{q}"),
                _ => q.to_owned(),
            };
            out.push((call.to_owned(), path, rest.to_owned()));
            before = it.next().unwrap_or("");
        }
    }
    out
}

#[test]
fn the_migrator_stays_inside_the_tree_and_the_target() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    let pki = root.join("pki");
    let outside = root.join("outside");
    let out = root.join("out");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.pub"), pem("OUTSIDE-SECRET", 80)).unwrap();
    for d in TREE_DIRS {
        std::fs::create_dir_all(pki.join(d)).unwrap();
    }
    std::fs::write(pki.join("minions/good"), pem("good", 300)).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.pub"), pki.join("minions/linked")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", pki.join("minions_pre/zero")).unwrap();
    std::os::unix::fs::symlink(&outside, pki.join("minions_rejected/dirlink")).unwrap();
    // Too large: one byte over the limit; exactly the limit is taken.
    let max = keycache::migrate::MAX_KEY_BYTES;
    let big = |n: usize| {
        let mut v = b"-----BEGIN PUBLIC KEY-----\n".to_vec();
        v.resize(n - 25, b'A');
        v.extend_from_slice(b"\n-----END PUBLIC KEY-----\n");
        v.truncate(n);
        v
    };
    std::fs::write(pki.join("minions/huge"), big(max + 1)).unwrap();
    std::fs::write(pki.join("minions/atlimit"), big(max)).unwrap();
    // A FIFO (would block a plain open) and, as root, a device node.
    sys::mkfifo(&pki.join("minions_pre/fifo"), 0o644).unwrap();
    let root_part = skip::needs_root(
        "the_migrator_stays_inside_the_tree_and_the_target: a device node in the tree",
    );
    if root_part {
        sys::mknod_char(&pki.join("minions_denied/null"), 0o644, 1, 3).unwrap();
    }
    // Bank files planted in the target as symlinks are refused.
    std::fs::create_dir_all(&out).unwrap();
    let victim = outside.join("victim");
    std::fs::write(&victim, b"do not touch").unwrap();
    std::os::unix::fs::symlink(&victim, out.join(KEYS_INDEX)).unwrap();
    let e = migrate_refused(&pki, &out, &common::small(1009, 1 << 20));
    assert!(e.contains("symlink"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
    std::fs::remove_file(out.join(KEYS_INDEX)).unwrap();

    // The real run, traced when strace is there.
    let layout = common::small(1009, 1 << 20);
    let mut args = vec![
        "migrate".to_owned(),
        s(&pki).to_owned(),
        "--out".to_owned(),
        s(&out).to_owned(),
        "--json".to_owned(),
    ];
    args.extend(layout.args());
    let log = root.join("strace.log");
    let o = match strace() {
        Some(st) => Command::new(st)
            .args(["-f", "-qq", "-y", "-s", "4096", "-o"])
            .arg(&log)
            .args([
                "-e",
                "trace=open,openat,creat,rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat,\
                 link,linkat,symlink,symlinkat,truncate,chmod,fchmodat,chown,fchownat,lchown,\
                 readlink,readlinkat",
            ])
            .arg(env!("CARGO_BIN_EXE_keycache"))
            .args(&args)
            .output()
            .unwrap(),
        None => {
            skip::skip(
                "the_migrator_stays_inside_the_tree_and_the_target: its file accesses under strace",
                "strace is not installed",
            );
            Command::new(env!("CARGO_BIN_EXE_keycache"))
                .args(&args)
                .output()
                .unwrap()
        }
    };
    ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let reasons: BTreeMap<String, String> = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                Path::new(x["path"].as_str().unwrap())
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                x["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(reasons["linked"], "symlink");
    assert_eq!(reasons["zero"], "symlink");
    assert_eq!(reasons["dirlink"], "symlink");
    assert_eq!(reasons["huge"], "too_large");
    assert_eq!(reasons["fifo"], "not_a_regular_file");
    if root_part {
        assert_eq!(reasons["null"], "not_a_regular_file");
    }
    assert_eq!(v["migrated"]["accepted"], 2, "good and atlimit");
    let listed = common::kc_dump(&out, &layout);
    assert!(!listed.to_string().contains("OUTSIDE"));
    if log.exists() {
        let text = std::fs::read_to_string(&log).unwrap();
        let mut reads = 0;
        for (call, path, rest) in traced_paths(&text) {
            let p = Path::new(&path);
            let writes = !(call.starts_with("open") || call.starts_with("readlink"))
                || rest.contains("O_WRONLY")
                || rest.contains("O_RDWR")
                || rest.contains("O_CREAT");
            assert!(
                !p.starts_with(&outside),
                "the migration touched {path} outside the tree: {call}({rest}"
            );
            if p.starts_with(&pki) {
                assert!(!writes, "the migration wrote into the tree: {call}({rest}");
                // Never opened a symlink (nor a FIFO or device).
                let name = p.file_name().unwrap().to_string_lossy();
                assert!(
                    !["linked", "zero", "dirlink", "fifo", "null"].contains(&name.as_ref())
                        || !call.starts_with("open"),
                    "opened {path}: {call}({rest}"
                );
                reads += 1;
            } else if writes {
                assert!(
                    p.starts_with(&out),
                    "the migration wrote outside the target: {call}({rest}"
                );
            } else if p.is_absolute() && !rest.contains("= -1 ") {
                // (The dynamic loader probes LD_LIBRARY_PATH, which cargo
                // points into target/: failed probes are not reads.)
                let system = [
                    "/proc",
                    "/sys",
                    "/etc",
                    "/lib",
                    "/usr",
                    "/dev/null",
                    "/dev/urandom",
                ];
                assert!(
                    p.starts_with(&out) || system.iter().any(|x| p.starts_with(x)),
                    "the migration read {path}: {call}({rest}"
                );
            }
        }
        assert!(reads >= 2, "the trace saw the tree being read");
    }
    // A state directory that is a symlink refuses the whole tree.
    std::fs::remove_dir_all(pki.join("minions_pre")).unwrap();
    std::os::unix::fs::symlink(&outside, pki.join("minions_pre")).unwrap();
    let before = std::fs::read(out.join(KEYS_INDEX)).unwrap();
    let e = migrate_refused(&pki, &out, &layout);
    assert!(e.contains("minions_pre") && e.contains("symlink"), "{e}");
    assert_eq!(std::fs::read(out.join(KEYS_INDEX)).unwrap(), before);
}

// ---------------------------------------------------------------------------
// Permissions and ownership
// ---------------------------------------------------------------------------

fn modes(dir: &Path) -> BTreeMap<String, u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().mode() & 0o7777,
            )
        })
        .collect()
}

/// The keycache CLI with umask 000.
fn kc_umask0() -> TestCommand {
    let mut c = common::kc();
    sys::umask_in_child(c.cmd(), 0);
    c
}

fn sample_tree(root: &Path, n: usize) {
    for (i, d) in TREE_DIRS.iter().enumerate() {
        std::fs::create_dir_all(root.join(d)).unwrap();
        for k in 0..n {
            std::fs::write(
                root.join(d).join(format!("h{i}-{k}")),
                pem(&format!("{i}{k}"), 200),
            )
            .unwrap();
        }
    }
}

#[test]
fn files_are_created_0600_and_never_widened() {
    let l = common::small(1009, 1 << 20);
    let t = tempfile::tempdir().unwrap();
    let pki = t.path().join("pki");
    sample_tree(&pki, 3);
    let out = t.path().join("out");
    kc_umask0()
        .args(["migrate", s(&pki), "--out", s(&out)])
        .layout(&l)
        .ok();
    let m = modes(&out);
    assert!(m.len() >= 8, "{m:?}");
    for (f, mode) in &m {
        assert_eq!(*mode, 0o600, "{f} after migrate with umask 000");
    }
    // The library, in a fresh directory.
    let lib = t.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    let st = Store::open_with(&lib, &l.options()).unwrap();
    st.put(
        &MinionId::new("x").unwrap(),
        KeyState::Pending,
        pem("x", 9).as_bytes(),
    )
    .unwrap();
    st.deny(&MinionId::new("x").unwrap(), pem("y", 9).as_bytes())
        .unwrap();
    st.compact(None).unwrap();
    for (f, mode) in modes(&lib) {
        assert_eq!(mode, 0o600, "{f} (library)");
    }
    // Narrower modes survive compaction and migration; wider ones are not
    // created.
    for (f, mode) in [(KEYS_INDEX, 0o400u32), (DENIED_INDEX, 0o640)] {
        for g in [f.to_owned(), format!("{f}.heap"), format!("{f}.roster")] {
            std::fs::set_permissions(out.join(&g), std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
    let before = modes(&out);
    kc_umask0().args(["compact", s(&out)]).layout(&l).ok();
    kc_umask0()
        .args(["migrate", s(&pki), "--out", s(&out)])
        .layout(&l)
        .ok();
    let after = modes(&out);
    for (f, mode) in &after {
        let was = before.get(f).copied().unwrap_or(0o600);
        assert_eq!(mode & !was, 0, "{f}: {was:o} widened to {mode:o}");
    }
    assert_eq!(after[KEYS_INDEX], 0o400);
    assert_eq!(after[&format!("{DENIED_INDEX}.roster")], 0o640);
    // Export: new key files 0600; a replaced one never wider than it was.
    let tree = t.path().join("export");
    kc_umask0()
        .args(["export", s(&out), "--to", s(&tree)])
        .layout(&l)
        .ok();
    assert_eq!(std::fs::metadata(&tree).unwrap().mode() & 0o777, 0o700);
    for d in TREE_DIRS {
        for e in std::fs::read_dir(tree.join(d)).unwrap().flatten() {
            assert_eq!(
                e.metadata().unwrap().mode() & 0o777,
                0o600,
                "{}",
                e.path().display()
            );
        }
    }
    let key = tree.join("minions/h0-0");
    std::fs::write(&key, b"other content").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    let key2 = tree.join("minions/h0-1");
    std::fs::write(&key2, b"other content").unwrap();
    std::fs::set_permissions(&key2, std::fs::Permissions::from_mode(0o644)).unwrap();
    kc_umask0()
        .args(["export", s(&out), "--to", s(&tree), "--force"])
        .layout(&l)
        .ok();
    assert_eq!(
        std::fs::metadata(&key).unwrap().mode() & 0o777,
        0o400,
        "not widened"
    );
    assert_eq!(
        std::fs::metadata(&key2).unwrap().mode() & 0o777,
        0o600,
        "narrowed to 0600"
    );
    assert_eq!(std::fs::read(&key).unwrap(), pem("00", 200).as_bytes());
}

#[test]
fn files_written_as_root_belong_to_the_directory_owner() {
    if !skip::needs_root("files_written_as_root_belong_to_the_directory_owner") {
        return;
    }
    let l = common::small(1009, 1 << 20);
    let t = tempfile::tempdir().unwrap();
    let pki = t.path().join("pki");
    sample_tree(&pki, 2);
    let owner = (4242u32, 4343u32);
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::chown(&out, Some(owner.0), Some(owner.1)).unwrap();
    let owners = |d: &Path| -> BTreeMap<String, (u32, u32)> {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| {
                let m = e.metadata().unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    (m.uid(), m.gid()),
                )
            })
            .collect()
    };
    // migrate (CLI), then writes and a compaction through the library.
    kc().args(["migrate", s(&pki), "--out", s(&out)])
        .layout(&l)
        .ok();
    let st = Store::open_with(&out, &l.options()).unwrap();
    st.put(
        &MinionId::new("new-one").unwrap(),
        KeyState::Pending,
        pem("n", 30).as_bytes(),
    )
    .unwrap();
    st.compact(None).unwrap();
    drop(st);
    kc().args(["compact", s(&out)]).layout(&l).ok();
    kc().args(["accept", s(&out), "new-one"]).layout(&l).ok();
    let got = owners(&out);
    assert!(got.len() >= 8, "{got:?}");
    for (f, o) in &got {
        assert_eq!(*o, owner, "{f}");
    }
    // Files that belong to someone else than the directory keep their owner
    // when replaced.
    let other = (5151u32, 5252u32);
    for f in [
        KEYS_INDEX.to_owned(),
        format!("{KEYS_INDEX}.heap"),
        format!("{KEYS_INDEX}.roster"),
    ] {
        std::os::unix::fs::chown(out.join(&f), Some(other.0), Some(other.1)).unwrap();
    }
    kc().args(["compact", s(&out)]).layout(&l).ok();
    let got = owners(&out);
    assert_eq!(got[KEYS_INDEX], other);
    assert_eq!(got[&format!("{KEYS_INDEX}.roster")], other);
    assert_eq!(got[DENIED_INDEX], owner);
    // A new bank in a new directory, by the library.
    let fresh = t.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    std::os::unix::fs::chown(&fresh, Some(owner.0), Some(owner.1)).unwrap();
    let st = Store::open_with(&fresh, &l.options()).unwrap();
    st.deny(&MinionId::new("d").unwrap(), pem("d", 30).as_bytes())
        .unwrap();
    for (f, o) in owners(&fresh) {
        assert_eq!(o, owner, "{f} (library, new bank)");
    }
    // Export into a pki dir owned by the master's user.
    let tree = t.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::os::unix::fs::chown(&tree, Some(owner.0), Some(owner.1)).unwrap();
    kc().args(["export", s(&out), "--to", s(&tree)])
        .layout(&l)
        .ok();
    for d in TREE_DIRS {
        let m = std::fs::metadata(tree.join(d)).unwrap();
        assert_eq!((m.uid(), m.gid()), owner, "{d}");
        for e in std::fs::read_dir(tree.join(d)).unwrap().flatten() {
            let m = e.metadata().unwrap();
            assert_eq!((m.uid(), m.gid()), owner, "{}", e.path().display());
        }
    }
}
