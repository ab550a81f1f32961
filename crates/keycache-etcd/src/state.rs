//! The replica's state file (`.keycache-etcd` in the store directory): which
//! etcd cluster and prefix the store replicates, the revision it holds, and
//! when the replicator last heard from etcd.
//!
//! Written only by the replicator, after the store changes it describes
//! are durable, by a rename over the old file (readers see one or the
//! other), so the revision it names is never ahead of the store. It is not
//! fsynced: after a crash it may name an older revision than the store
//! holds (the watch then applies some changes again, as one batch up to
//! the revision that was being applied, [`Applying`]: see
//! [`crate::catch_up`]) or be unreadable (the replicator lists again); it
//! never names a newer one. Two fsyncs per batch saved. Read by writers
//! waiting for their revision, and by `keycache etcd status`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The replica's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaState {
    /// The etcd prefix replicated.
    pub prefix: String,
    /// The etcd cluster's id (from its response headers).
    pub cluster_id: u64,
    /// The etcd revision the store holds: every change under the prefix up
    /// to it, none after.
    pub revision: i64,
    /// The revision of the last full list (the start of this watch).
    pub listed_at: i64,
    /// The latest etcd revision the replicator saw.
    pub etcd_revision: i64,
    /// When the replicator last heard from etcd, in ms since the epoch.
    pub contact_ms: u64,
    /// The pid of the replicator that wrote this.
    pub pid: u32,
}

/// The state file of the store in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(keycache::format::REPLICA_FILE)
}

/// The replica's state file in `dir`, when there is one: `dir` is then a
/// replica of etcd, whose key state only etcd changes. The CLI and the Salt
/// driver refuse to write its `keys` and `denied_keys` banks locally
/// ([`AROUND_ETCD`]).
pub fn replica_file(dir: &Path) -> Option<PathBuf> {
    let file = path(dir);
    std::fs::symlink_metadata(&file).ok().map(|_| file)
}

/// Why a replica's key state is not changed locally ([`replica_file`]).
pub const AROUND_ETCD: &str = "a change written to it alone would reach neither etcd nor the \
     other masters; its replicator's watch would leave it, and its next list of etcd would undo \
     it (a key deleted here alone back)";

/// The message the CLI and the Salt driver give when they refuse a local
/// write of the replica `dir`, whose state file is `file` (both as the
/// caller prints paths): why ([`AROUND_ETCD`]), `remedy` (the caller's way
/// through etcd), and how to stop replicating instead.
pub fn refused_around_etcd(dir: &str, file: &str, remedy: &str) -> String {
    format!(
        "{dir} is a replica of etcd ({file} names it): {AROUND_ETCD}. {remedy}; to stop \
         replicating into this directory, stop its replicator and remove {file}. Nothing was \
         written"
    )
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ReplicaState {
    /// Reads the state of the store in `dir`; `None` when there is none (a
    /// store that was never a replica).
    pub fn read(dir: &Path) -> Result<Option<ReplicaState>> {
        let p = path(dir);
        let mut buf = Vec::new();
        match keycache::files::read_small(&p, 64 * 1024, &mut buf) {
            Ok(_) => {}
            Err(keycache::files::Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(r) => return Err(r.into_error(&p).into()),
        }
        serde_json::from_slice(&buf)
            .map(Some)
            .map_err(|e| Error::State {
                path: p,
                why: format!("not a replica state file ({e}); remove it to list etcd again"),
            })
    }

    /// Writes it, replacing the old one (not fsynced: see the module doc).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec(self).map_err(|e| Error::State {
            path: path(dir),
            why: e.to_string(),
        })?;
        let own = keycache::files::Ownership::for_dir(dir)?;
        keycache::files::replace_unsynced(&path(dir), &bytes, &own)?;
        Ok(())
    }
}

/// The revision the replicator is applying
/// ([`keycache::format::APPLYING_FILE`] in the store directory): recorded
/// before a batch's (or a list's) store write, so that after a kill
/// between that write and the state's record the next watch knows how far
/// the store may be ahead of the record ([`crate::catch_up`]). Written in
/// place, 8 bytes by one `pwrite` (a new file per batch would cost an
/// inode each time), not fsynced (as the state); read only by the
/// replicator when it starts.
#[derive(Debug)]
pub struct Applying {
    file: std::fs::File,
    path: PathBuf,
}

impl Applying {
    /// Opens (creating) the record of the store in `dir`.
    pub fn open(dir: &Path) -> Result<Applying> {
        let path = dir.join(keycache::format::APPLYING_FILE);
        let own = keycache::files::Ownership::for_dir(dir)?;
        let file = keycache::files::open_or_create(&path, &own)?;
        Ok(Applying { file, path })
    }

    /// Records `revision` as the one being applied.
    pub fn record(&self, revision: i64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(&revision.to_le_bytes(), 0)
            .map_err(|source| {
                keycache::Error::Io {
                    path: self.path.clone(),
                    op: "write",
                    source,
                }
                .into()
            })
    }

    /// The revision recorded for the store in `dir`; 0 (nothing to catch
    /// up) when there is no record, or one that is not 8 bytes.
    pub fn read(dir: &Path) -> Result<i64> {
        let path = dir.join(keycache::format::APPLYING_FILE);
        let mut buf = Vec::new();
        match keycache::files::read_small(&path, 8, &mut buf) {
            Ok(_) => {}
            Err(keycache::files::Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(0)
            }
            Err(r) => return Err(r.into_error(&path).into()),
        }
        Ok(<[u8; 8]>::try_from(buf.as_slice()).map_or(0, i64::from_le_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_garbage_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(ReplicaState::read(dir.path()).expect("read"), None);
        let s = ReplicaState {
            prefix: "/keycache/x/".into(),
            cluster_id: 7,
            revision: 42,
            listed_at: 40,
            etcd_revision: 43,
            contact_ms: 1,
            pid: 9,
        };
        s.write(dir.path()).expect("write");
        assert_eq!(ReplicaState::read(dir.path()).expect("read"), Some(s));
        std::fs::write(path(dir.path()), b"{").expect("garbage");
        let e = ReplicaState::read(dir.path()).expect_err("garbage");
        assert!(e.to_string().contains(".keycache-etcd"), "{e}");
    }

    /// The record of the revision being applied: 0 when absent or not
    /// 8 bytes, else the last one recorded, rewritten in place; never
    /// through a symlink.
    #[test]
    fn applying_is_recorded_in_place() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(Applying::read(dir.path()).expect("read"), 0);
        let a = Applying::open(dir.path()).expect("open");
        a.record(1_234_567).expect("record");
        assert_eq!(Applying::read(dir.path()).expect("read"), 1_234_567);
        let path = dir.path().join(keycache::format::APPLYING_FILE);
        let inode =
            |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).expect("stat"));
        let before = inode(&path);
        a.record(9).expect("record");
        assert_eq!(Applying::read(dir.path()).expect("read"), 9);
        assert_eq!(inode(&path), before, "written in place");
        drop(a);
        Applying::open(dir.path()).expect("opens an existing record");
        std::fs::write(&path, b"xyz").expect("short");
        assert_eq!(Applying::read(dir.path()).expect("read"), 0);
        std::fs::remove_file(&path).expect("rm");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").expect("target");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        assert!(
            Applying::open(dir.path()).is_err(),
            "a symlink is not followed"
        );
        assert!(Applying::read(dir.path()).is_err());
        assert_eq!(std::fs::read(&target).expect("read"), b"");
    }
}
