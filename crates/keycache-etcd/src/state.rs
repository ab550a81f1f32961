//! The replica's state file (`.keycache-etcd` in the store directory): which
//! etcd cluster and prefix the store replicates, the revision it holds, and
//! when the replicator last heard from etcd.
//!
//! Written only by the replicator, by a rename over the old file (readers
//! see one or the other): before a batch's store write, naming the
//! revision being applied (`applying`), and after the store changes are
//! durable, naming the revision the store holds, so that revision is never
//! ahead of the store. It is not fsynced: after a crash it may name an
//! older revision than the store holds (the watch then applies some
//! changes again, as one batch up to `applying`: see [`crate::catch_up`])
//! or be unreadable (the replicator lists again); it never names a newer
//! one. Fsyncs per batch saved. Read by writers waiting for their
//! revision, and by `keycache etcd status`.

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
    /// The revision of the batch (or list) being applied when this was
    /// written, recorded before the store changes: when above `revision`,
    /// the store may hold every change up to it, and the watch's replay is
    /// applied as one batch up to it ([`crate::catch_up`]). 0 in a file of
    /// an older keycache.
    #[serde(default)]
    pub applying: i64,
}

/// The state file of the store in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(keycache::format::REPLICA_FILE)
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
            applying: 44,
        };
        s.write(dir.path()).expect("write");
        assert_eq!(ReplicaState::read(dir.path()).expect("read"), Some(s));
        // A file of an older keycache, without `applying`.
        std::fs::write(
            path(dir.path()),
            br#"{"prefix":"/p/","cluster_id":1,"revision":5,"listed_at":5,"etcd_revision":5,"contact_ms":1,"pid":2}"#,
        )
        .expect("old file");
        let old = ReplicaState::read(dir.path())
            .expect("read")
            .expect("state");
        assert_eq!((old.revision, old.applying), (5, 0));
        std::fs::write(path(dir.path()), b"{").expect("garbage");
        let e = ReplicaState::read(dir.path()).expect_err("garbage");
        assert!(e.to_string().contains(".keycache-etcd"), "{e}");
    }
}
