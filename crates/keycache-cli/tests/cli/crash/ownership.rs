//! Crash safety: ownership of a crashed rebuild's journal (x86_64 Linux,
//! through ptrace; needs root, and says so when skipped).
//!
//! A compaction run as root is killed after its journal; the Salt master's
//! user (uid 65534, owner of the store's directory) finishes the journal on
//! its next `keycache delete`, with a copy of the binary it can run.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;

use keycache_testkit::crash::{args_of, assert_clean, history_store, layout};
use keycache_testkit::rng::Rng;
use keycache_testkit::{scratch, skip, tracer};

/// A rebuild run as root and killed after its journal: the Salt master's
/// user (owner of the directory) finishes it on its next write.
#[test]
fn journal_left_by_root_is_finished_by_the_masters_user() {
    if !skip::needs_root("journal_left_by_root_is_finished_by_the_masters_user") {
        return;
    }
    // The master's user runs the binary and opens the store: both sit in a
    // directory it can enter (0755 under /tmp), not in the checkout or in
    // TMPDIR, either of which may be private (a clone under `mktemp -d`).
    let t = scratch::public_dir();
    let bin = t.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let kc = common::cli().copied_to(&bin);
    let dir = t.path().join("store");
    let want = history_store(&dir, &mut Rng::new(99));
    let (uid, gid) = (65534u32, 65534u32);
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        std::os::unix::fs::lchown(e.path(), Some(uid), Some(gid)).unwrap();
    }
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    // Kill root's compaction at its first rename of a bank file.
    let mut cmd = kc.cmd();
    cmd.args(args_of(&dir, &["compact"]));
    let end = tracer::kill_at_rename(cmd, 2);
    assert!(end.killed);
    let journal = dir.join(keycache::rebuild::JOURNAL);
    let m = std::fs::metadata(&journal).expect("the journal is left");
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (uid, gid, 0o600));
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            (uid, gid),
            "{} is not the master's",
            e.path().display()
        );
        assert!(
            m.mode() & 0o077 == 0,
            "{} mode {:o}",
            e.path().display(),
            m.mode()
        );
    }
    // The master's user writes: the journal is finished, then the write.
    let id = "m00.crash.example";
    let mut c = kc.cmd();
    c.args(args_of(&dir, &["delete", id])).uid(uid).gid(gid);
    let out = c.output().unwrap();
    let present = want["keys"].get(id).is_some() || want["denied_keys"].get(id).is_some();
    assert_eq!(
        out.status.code(),
        Some(if present { 0 } else { 1 }),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!journal.exists(), "the journal was finished");
    let mut want = want;
    want["keys"].as_object_mut().unwrap().remove(id);
    want["denied_keys"].as_object_mut().unwrap().remove(id);
    assert_eq!(common::kc_dump(&dir, &layout()), want);
    assert_clean(&dir, "after the master's user finished the journal");
}
