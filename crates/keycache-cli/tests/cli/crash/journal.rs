//! Crash safety: a rebuild's journal (x86_64 Linux, through ptrace).
//!
//! A compaction run with a relative path is killed mid-renames, the store
//! moved: reopened, it rolls forward; a hostile journal renaming and
//! removing files elsewhere is refused and touches nothing.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use crate::common;
use crate::common::ParamsExt;

use keycache::Store;
use keycache_testkit::crash::{assert_clean, history_store, layout, opts};
use keycache_testkit::rng::Rng;
use keycache_testkit::tracer;

/// A journal is found by file name in its own directory: a store moved (or
/// reached through another path) after a crash still rolls forward, and a
/// journal naming files elsewhere is refused.
#[test]
fn journal_of_a_moved_store_rolls_forward_and_never_reaches_outside() {
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("a/store");
    let want = history_store(&dir, &mut Rng::new(7));
    let mut cmd = kc.cmd();
    // A relative path, as an operator would type it.
    cmd.current_dir(t.path().join("a"))
        .arg("compact")
        .arg("store")
        .args(layout().args());
    let end = tracer::kill_at_rename(cmd, 3);
    assert!(end.killed);
    let moved = t.path().join("b");
    std::fs::rename(t.path().join("a"), &moved).unwrap();
    let moved = moved.join("store");
    assert!(moved.join(keycache::rebuild::JOURNAL).exists());
    assert_eq!(common::kc_dump(&moved, &layout()), want);
    assert!(!moved.join(keycache::rebuild::JOURNAL).exists());
    assert_clean(&moved, "moved store");
    // A hostile journal: renames and removals outside the directory.
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::write(
        moved.join(keycache::rebuild::JOURNAL),
        format!(
            "rename\t{0}\t{1}/x\nremove\t{0}\nend\n",
            victim.display(),
            t.path().display()
        ),
    )
    .unwrap();
    let r = Store::open_with(&moved, &opts());
    let e = r.expect_err("a hostile journal is refused");
    assert!(e.to_string().contains("journal"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let out = kc.run(&moved, &["list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to act on this journal"));
}
