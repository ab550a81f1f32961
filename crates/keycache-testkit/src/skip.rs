//! Tests, or parts of tests, that cannot run here (not root, a tool
//! missing) say so: a `SKIP` line on the real stderr (libtest captures only
//! `print!`/`eprint!`, so the line shows even when the test passes), a line
//! in the file `KEYCACHE_SKIP_LOG` names (`tools/test.sh` counts them), and
//! a failure instead when `KEYCACHE_NO_SKIPS=1` (`.ci/run` sets it: in CI,
//! which runs as root, everything must run).

use std::io::Write;

/// Reports that `what` (a test's name, or a test's name and the part left
/// out) is skipped because of `why`; panics when `KEYCACHE_NO_SKIPS=1`.
pub fn skip(what: &str, why: &str) {
    let line = format!("SKIP {what}: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("KEYCACHE_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
    assert!(
        std::env::var("KEYCACHE_NO_SKIPS").as_deref() != Ok("1"),
        "{what} is skipped ({why}) and KEYCACHE_NO_SKIPS=1 forbids skips"
    );
}

/// Whether this process runs as root; when not, reports `what` skipped
/// ("needs root").
pub fn needs_root(what: &str) -> bool {
    if crate::sys::is_root() {
        true
    } else {
        skip(what, &format!("needs root (euid {})", crate::sys::euid()));
        false
    }
}
