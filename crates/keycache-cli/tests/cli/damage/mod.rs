//! Damaged store files, as the `keycache` commands see them: bank files
//! that are not regular files are refused by the commands; `keycache
//! verify --repair` keeps every intact entry ([`repair`]).
//!
//! What the library does with damaged files (random damage, files
//! shrinking under an open store, absurd header counters, bank files that
//! are not regular files) is tested by the engine's own tests
//! (crates/keycache/tests/damage).

mod repair;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{kc, pem, Params, ParamsExt};
use keycache::format::KEYS_INDEX;
use keycache::{KeyState, MinionId, Store};
use keycache_testkit::sys;

fn layout() -> Params {
    Params {
        size: 257,
        max_segment_bytes: 3000,
        id_size: 64,
        slot_size: 96,
    }
}

/// A store with both banks, several heap segments and garbage; every
/// value has a length of its own.
fn build(dir: &Path) {
    let s = Store::open_with(dir, &layout().options_with(Duration::ZERO, Duration::ZERO)).unwrap();
    let mut len = 40usize;
    for i in 0..70 {
        let id = format!("host-{i:03}.corrupt.example");
        let m = MinionId::new(id.clone()).unwrap();
        len += 7;
        s.put(&m, KeyState::ALL[i % 3], pem(&id, len).as_bytes())
            .unwrap();
        if i % 4 == 0 {
            len += 7;
            s.deny(&m, pem(&format!("d{id}"), len).as_bytes()).unwrap();
        }
        if i % 9 == 0 {
            s.remove(&m).unwrap();
        }
    }
}

/// The bank files of `dir` (lock files left out), sorted.
fn bank_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    v.sort();
    v
}

/// Runs `keycache ARGS` with the store's layout; its output, whatever its
/// status. A panic, the process killed, when it runs for more than a
/// minute (a command blocked on a FIFO would).
fn within_a_minute(args: &[&str]) -> Output {
    let mut c = kc();
    c.args(args).args(layout().args());
    let line = c.line();
    let mut child = c.spawn(Stdio::piped());
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("hang: {line} did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Puts a `kind` (symlink to `sound`, directory, socket or FIFO) where the
/// bank file `path` was; the file, or an empty one when there was none,
/// goes to `sound`.
fn replace(path: &Path, kind: &str, sound: &Path) {
    match std::fs::rename(path, sound) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::write(sound, b"").unwrap(),
        r => r.unwrap(),
    }
    match kind {
        "symlink" => std::os::unix::fs::symlink(sound, path).unwrap(),
        "directory" => std::fs::create_dir(path).unwrap(),
        "socket" => drop(std::os::unix::net::UnixListener::bind(path).unwrap()),
        _ => sys::mkfifo(path, 0o600).unwrap(),
    }
}

/// A bank file replaced by a symlink (even to a sound copy), a directory, a
/// socket or a FIFO: `keycache list` and `keycache verify` refuse it (exit
/// 2), naming the file and what it is; never followed, never blocking.
#[test]
fn bank_files_that_are_not_regular_files_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    std::fs::create_dir(&base).unwrap();
    build(&base);
    assert!(
        bank_files(&base).iter().any(|f| f.ends_with(".heap.2")),
        "several segments"
    );
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let mut names = bank_files(&base);
    names.push(format!("{KEYS_INDEX}.lock"));
    let mut cases = 0;
    for name in &names {
        for kind in ["symlink", "directory", "socket", "fifo"] {
            let dir = t.path().join(format!("{name}-{kind}"));
            keycache_testkit::crash::copy_tree(&base, &dir);
            let sound = outside.join(format!("{name}-{kind}"));
            replace(&dir.join(name), kind, &sound);
            let ctx = format!("{name} as a {kind}");
            let before = std::fs::read(&sound).unwrap();
            let d = dir.to_str().unwrap();
            let out = within_a_minute(&["list", d]);
            // The banks only: this store has no key tree (which verify
            // reports on its own).
            let out2 = within_a_minute(&["verify", d, "--tree", "never"]);
            let what = match kind {
                "symlink" => "symlink",
                "directory" => "directory",
                _ => "not a regular file",
            };
            let is_roster_or_lock = name.ends_with(".roster") || name.ends_with(".lock");
            for o in [&out, &out2] {
                let err = String::from_utf8_lossy(&o.stderr);
                if is_roster_or_lock && o.status.success() {
                    // Read-only commands need no lock file; the roster is
                    // only read by listing.
                    assert!(name.ends_with(".lock") || !o.status.success(), "{ctx}");
                    continue;
                }
                assert_eq!(o.status.code(), Some(2), "{ctx}: {err}");
                assert!(
                    err.contains(what) && err.contains(name.as_str()),
                    "{ctx}: {err}"
                );
            }
            assert_eq!(
                std::fs::read(&sound).unwrap(),
                before,
                "{ctx}: the target changed"
            );
            cases += 1;
        }
    }
    eprintln!("not-regular bank files, by the CLI: {cases} cases refused");
}
