//! A `localfs_key` key tree beside no store: refused, never touched.
//!
//! A master switched to `keys.cache_driver: keycache` without `keycache
//! migrate` has its keys in the legacy tree (`minions/<id>`,
//! `minions_pre/`, `minions_rejected/`, `minions_denied/`, the master's own
//! `master.pem` or `<master_id>.pem`) and no bank files. Used as it is, the
//! store reads as empty: every minion that signs in would be stored as a new
//! pending key, and keeping the tree in step would move `minions/<id>` to
//! `minions_pre/<id>` and remove `minions_denied/<id>` (rolled back to
//! `localfs_key`, accepted minions would be pending and denied keys gone),
//! and Salt would generate a new master key pair. So until a store exists,
//! every function of the driver checks for such a tree and, when it finds
//! one, raises an error that says to migrate, reads and writes nothing.
//! Migrating automatically was the other choice; refusing keeps the tree
//! exactly as the operator left it, and `keycache migrate` reports what it
//! skips and why.
//!
//! Once a bank file is seen (or no legacy key is), the answer is kept for
//! the life of the handles: the check costs one atomic load per call.

use std::path::{Path, PathBuf};

use keycache::format::{DENIED_INDEX, KEYS_INDEX, MASTER_INDEX};

/// The state directories of the legacy tree.
const STATE_DIRS: [&str; 4] = [
    "minions",
    "minions_pre",
    "minions_rejected",
    "minions_denied",
];

/// Why the store directory `dir` must be migrated before the driver uses
/// it: `None` when it has a bank file, or no legacy key. `pki_dir` is the
/// master's `pki_dir` when it is not `dir` (a cluster keeps its store in
/// `cluster_pki_dir`, the master's key files in `pki_dir`); `master_id` is
/// the master's id without `_master`.
pub(crate) fn refusal(dir: &Path, pki_dir: Option<&Path>, master_id: &str) -> Option<String> {
    let exists = |p: PathBuf| std::fs::symlink_metadata(p).is_ok();
    if [KEYS_INDEX, DENIED_INDEX, MASTER_INDEX]
        .iter()
        .any(|n| exists(dir.join(n)))
    {
        return None;
    }
    let found = legacy_key(dir, pki_dir, master_id)?;
    Some(format!(
        "keycache: {} holds a localfs_key key tree ({}) and no keycache store: run `salt-run \
         keycache.migrate` (or the command: `keycache migrate {}`) before using \
         keys.cache_driver: keycache; nothing was read or written",
        dir.display(),
        found.display(),
        dir.display()
    ))
}

/// The first legacy key file found: an entry of a state directory (a
/// state directory that is a symlink counts: it is not followed), or the
/// master's or the cluster's private key file.
fn legacy_key(dir: &Path, pki_dir: Option<&Path>, master_id: &str) -> Option<PathBuf> {
    for sub in STATE_DIRS {
        let d = dir.join(sub);
        match std::fs::symlink_metadata(&d) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => return Some(d),
            _ => continue,
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            // Not ours to list: it may hold keys.
            return Some(d);
        };
        for e in entries.flatten() {
            // localfs_key skips dot-files, as Salt lists keys.
            if !e.file_name().to_string_lossy().starts_with('.') {
                return Some(e.path());
            }
        }
    }
    let mut names = vec!["master.pem".to_owned(), "cluster.pem".to_owned()];
    if !master_id.is_empty() {
        names.push(format!("{master_id}.pem"));
    }
    let dirs = std::iter::once(dir).chain(pki_dir.filter(|p| *p != dir));
    for d in dirs {
        for n in &names {
            let p = d.join(n);
            if std::fs::symlink_metadata(&p).is_ok() {
                return Some(p);
            }
        }
    }
    None
}
