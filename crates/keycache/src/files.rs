//! File handling shared by every writer: opening bank files without
//! following symlinks, creating them with Salt's key-material permissions and
//! the right owner, syncing, and atomic replacement.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Mode of new bank files: owner read and write, like Salt's key material.
pub const DEFAULT_MODE: u32 = 0o600;

/// Opens an existing bank file, refusing symlinks and anything that is not a
/// regular file. `O_NONBLOCK` keeps a FIFO planted under a bank file's name
/// from blocking the open (it has no effect on regular files).
pub(crate) fn open_regular(path: &Path, write: bool) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::NotARegularFile {
                    path: path.into(),
                    why: "it is a symlink",
                }
            } else if e.raw_os_error() == Some(libc::EISDIR) {
                Error::NotARegularFile {
                    path: path.into(),
                    why: "it is a directory",
                }
            } else if e.raw_os_error() == Some(libc::ENXIO) {
                // A socket, or a FIFO opened for writing without a reader.
                Error::NotARegularFile {
                    path: path.into(),
                    why: "it is not a regular file",
                }
            } else {
                Error::io(path, "open", e)
            }
        })?;
    let meta = f.metadata().map_err(|e| Error::io(path, "stat", e))?;
    if !meta.is_file() {
        return Err(Error::NotARegularFile {
            path: path.into(),
            why: if meta.is_dir() {
                "it is a directory"
            } else {
                "it is not a regular file"
            },
        });
    }
    Ok(f)
}

/// Who new files belong to and what mode they get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// Owner and group to give new files, or `None` to keep the creator's.
    pub owner: Option<(u32, u32)>,
    /// Permission bits of new files.
    pub mode: u32,
    /// The owner was given explicitly (`--user`): it also applies to files
    /// that replace others.
    pub explicit: bool,
}

impl Ownership {
    /// New files in `dir`: mode 0600, and when running as root, the owner
    /// and group of `dir` (so that a Salt master running as its own user can
    /// still write what root migrated).
    pub fn for_dir(dir: &Path) -> Result<Ownership> {
        let meta = std::fs::metadata(dir).map_err(|e| Error::io(dir, "stat", e))?;
        Ok(Ownership {
            owner: Some((meta.uid(), meta.gid())),
            mode: DEFAULT_MODE,
            explicit: false,
        })
    }

    /// What a file replacing `old` gets: `old`'s owner and mode, so a
    /// rebuild never widens permissions nor takes a file from its owner.
    pub(crate) fn replacing(&self, old: &Path) -> Ownership {
        match std::fs::symlink_metadata(old) {
            Ok(m) if m.is_file() => Ownership {
                owner: if self.explicit {
                    self.owner
                } else {
                    Some((m.uid(), m.gid()))
                },
                mode: m.permissions().mode() & 0o777,
                explicit: self.explicit,
            },
            _ => *self,
        }
    }

    /// Applies owner (when it differs from the file's) and mode to an open file.
    pub(crate) fn apply(&self, f: &File, path: &Path) -> Result<()> {
        let meta = f.metadata().map_err(|e| Error::io(path, "stat", e))?;
        if meta.permissions().mode() & 0o7777 != self.mode {
            f.set_permissions(std::fs::Permissions::from_mode(self.mode))
                .map_err(|e| Error::io(path, "chmod", e))?;
        }
        if let Some((uid, gid)) = self.owner {
            if (meta.uid(), meta.gid()) != (uid, gid) {
                match std::os::unix::fs::fchown(f, Some(uid), Some(gid)) {
                    Ok(()) => {}
                    // Not root: files stay ours, which is the only owner we can give.
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                    Err(e) => return Err(Error::io(path, "chown", e)),
                }
            }
        }
        Ok(())
    }
}

/// Creates a new file (failing if it exists) with the given ownership, and
/// makes its directory entry durable: a writer creates the roster, a heap
/// segment or the lock file and then only fsyncs the file itself, and an
/// entry acknowledged after that must not lose its roster (or segment) to a
/// power loss.
pub(crate) fn create_new(path: &Path, own: &Ownership) -> Result<File> {
    let f = create_new_unsynced(path, own)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    sync_dir(dir)?;
    Ok(f)
}

/// [`create_new`] without the directory fsync, for callers that sync the
/// directory themselves before anything depends on the new name (rebuilds).
pub(crate) fn create_new_unsynced(path: &Path, own: &Ownership) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(own.mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, "create", e))?;
    own.apply(&f, path)?;
    Ok(f)
}

/// Reserves `len` bytes of zeros for a file, so writes through a mapping
/// cannot fail for lack of space later (which would raise SIGBUS).
pub(crate) fn allocate(f: &File, path: &Path, len: u64) -> Result<()> {
    f.set_len(len).map_err(|e| Error::io(path, "truncate", e))?;
    if len == 0 {
        return Ok(());
    }
    let Ok(off_len) = libc::off_t::try_from(len) else {
        return Ok(());
    };
    match crate::map::fallocate(f, off_len) {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()), // sparse is the best this filesystem offers
        e => Err(Error::io(
            path,
            "fallocate",
            io::Error::from_raw_os_error(e),
        )),
    }
}

/// Flushes a file's data to stable storage.
pub(crate) fn sync_data(f: &File, path: &Path) -> Result<()> {
    f.sync_data().map_err(|e| Error::io(path, "fsync", e))
}

/// Makes the entries of `dir` (creations, renames) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io(dir, "open", e))?;
    d.sync_all().map_err(|e| Error::io(dir, "fsync", e))
}

/// Renames `from` over `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| Error::io(to, "rename", e))
}

/// Removes a file, ignoring one that is already gone.
pub(crate) fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, "remove", e)),
    }
}

/// `(device, inode)` of a path, not following symlinks; `None` when absent.
pub(crate) fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A path with a suffix appended to its file name.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Nanoseconds since the Unix epoch.
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Replaces `path` with `bytes` atomically: a temporary file beside it
/// (created with `own`), fsynced, renamed over it, the directory fsynced.
pub(crate) fn replace_with(path: &Path, bytes: &[u8], own: &Ownership) -> Result<()> {
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        "{}{name}.{}.{}",
        crate::journal::TMP_PREFIX,
        std::process::id(),
        now_ns()
    ));
    let done = (|| {
        let f = create_new_unsynced(&tmp, own)?;
        let mut w = io::BufWriter::new(&f);
        w.write_all(bytes)
            .and_then(|()| w.flush())
            .map_err(|e| Error::io(&tmp, "write", e))?;
        drop(w);
        sync_data(&f, &tmp)?;
        rename(&tmp, path)?;
        sync_dir(&dir)
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}
