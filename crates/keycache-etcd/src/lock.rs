//! One replicator per store: an exclusive `flock` on
//! [`keycache::format::REPLICATOR_LOCK_FILE`] in the store directory, held
//! for the replicator's lifetime and released by the kernel when its
//! process ends, however it ends.
//!
//! Two replicators on one store (the systemd unit and the Salt engine, say)
//! would each apply their own watch: the one that lags would write an old
//! accept back after the other applied its revocation, and its state file
//! would take the recorded revision back. The second one is refused with
//! the holder's pid, which the holder writes into the file.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// How long a replicator waits for the lock before it gives up: long
/// enough for a `keycache etcd status` that looks at it (it takes the lock
/// shared for a moment), far shorter than any real replicator's life.
pub const WAIT: Duration = Duration::from_secs(3);

/// The lock, held until dropped.
#[derive(Debug)]
pub struct ReplicatorLock {
    _file: File,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(keycache::format::REPLICATOR_LOCK_FILE)
}

impl ReplicatorLock {
    /// Takes the lock of the store in `dir`, waiting up to [`WAIT`]; a
    /// lock another replicator holds is refused with its pid.
    pub async fn acquire(dir: &Path) -> Result<ReplicatorLock> {
        let p = path(dir);
        let own = keycache::files::Ownership::for_dir(dir)?;
        let mut file = keycache::files::open_or_create(&p, &own)?;
        let start = std::time::Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if start.elapsed() < WAIT => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(TryLockError::WouldBlock) => {
                    let mut s = String::new();
                    let _ = file.read_to_string(&mut s);
                    return Err(Error::Locked {
                        path: p,
                        pid: s.trim().parse().ok(),
                    });
                }
                Err(TryLockError::Error(e)) => return Err(Error::io(&p, "lock", e)),
            }
        }
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(pid.as_bytes()))
            .map_err(|e| Error::io(&p, "write", e))?;
        Ok(ReplicatorLock { _file: file })
    }

    /// Whether a replicator holds the lock of the store in `dir` now:
    /// `None` when that cannot be told (no lock file, or not readable by
    /// this user). Takes the lock shared for a moment when it is free.
    pub fn held(dir: &Path) -> Option<bool> {
        let f = File::open(path(dir)).ok()?;
        match f.try_lock_shared() {
            Ok(()) => {
                let _ = f.unlock();
                Some(false)
            }
            Err(TryLockError::WouldBlock) => Some(true),
            Err(TryLockError::Error(_)) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second lock of one store is refused with the holder's pid; the
    /// lock is free again once dropped; `held` tells which.
    #[test]
    fn one_replicator_per_store() {
        let dir = tempfile::tempdir().expect("dir");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        assert_eq!(ReplicatorLock::held(dir.path()), None);
        let first = rt
            .block_on(ReplicatorLock::acquire(dir.path()))
            .expect("first");
        assert_eq!(ReplicatorLock::held(dir.path()), Some(true));
        let e = rt
            .block_on(ReplicatorLock::acquire(dir.path()))
            .expect_err("second");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(
            msg.contains(keycache::format::REPLICATOR_LOCK_FILE),
            "{msg}"
        );
        drop(first);
        assert_eq!(ReplicatorLock::held(dir.path()), Some(false));
        rt.block_on(ReplicatorLock::acquire(dir.path()))
            .expect("free again");
    }
}
