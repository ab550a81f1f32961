//! Scratch directories, removed on drop ([`tempfile::TempDir`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// Where the fuzz bodies make their scratch directories: `KEYCACHE_FUZZ_TMP`
/// when set, else `/dev/shm` when writable (tmpfs: fsyncs cost nothing),
/// else the system's temp dir.
pub fn fuzz_base() -> PathBuf {
    if let Some(b) = std::env::var_os("KEYCACHE_FUZZ_TMP") {
        return PathBuf::from(b);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && std::fs::metadata(shm)
            .map(|m| !m.permissions().readonly())
            .unwrap_or(false)
    {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

/// A fresh, empty scratch directory for a fuzz body, under [`fuzz_base`],
/// named `keycache-fuzz-TAG-...`.
pub fn fuzz_dir(tag: &str) -> TempDir {
    let base = fuzz_base();
    tempfile::Builder::new()
        .prefix(&format!("keycache-fuzz-{tag}-"))
        .tempdir_in(&base)
        .unwrap_or_else(|e| panic!("create a scratch directory in {}: {e}", base.display()))
}

/// A scratch directory every user can enter and read (0755), under `/tmp`
/// rather than `TMPDIR` (which may be private): for what a test runs as
/// another user.
pub fn public_dir() -> TempDir {
    let base = Path::new("/tmp");
    let t = tempfile::Builder::new()
        .prefix("keycache-test-")
        .tempdir_in(base)
        .expect("create a scratch directory in /tmp");
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod 0755 a scratch directory");
    t
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn public_dir_is_0755_under_tmp_and_removed_on_drop() {
        let t = super::public_dir();
        let p = t.path().to_path_buf();
        assert!(p.starts_with("/tmp"));
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o755
        );
        drop(t);
        assert!(!p.exists());
    }

    #[test]
    fn fuzz_dirs_are_fresh_and_distinct() {
        let (a, b) = (super::fuzz_dir("t"), super::fuzz_dir("t"));
        assert_ne!(a.path(), b.path());
        assert_eq!(std::fs::read_dir(a.path()).unwrap().count(), 0);
        assert!(a
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("keycache-fuzz-t-"));
    }
}
