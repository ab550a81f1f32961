//! File handling shared by every writer: opening bank files without
//! following symlinks, reading small files (key files) without following
//! them ([`read_small`]), creating them with Salt's key-material permissions and
//! the right owner, syncing, and atomic replacement.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Mode of new bank files: owner read and write, like Salt's key material.
pub const DEFAULT_MODE: u32 = 0o600;

/// What is under a name that is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRegular {
    /// A symlink (never followed).
    Symlink,
    /// A directory.
    Directory,
    /// A FIFO, socket, device...
    Other,
}

impl NotRegular {
    /// What `m` (from `lstat` or `fstat`) is, when it is not a regular file.
    pub fn of(m: &std::fs::Metadata) -> NotRegular {
        NotRegular::of_mode(m.mode())
    }

    /// What an entry of `st_mode` `mode` is, when it is not a regular file.
    pub(crate) fn of_mode(mode: u32) -> NotRegular {
        match mode & libc::S_IFMT {
            libc::S_IFLNK => NotRegular::Symlink,
            libc::S_IFDIR => NotRegular::Directory,
            _ => NotRegular::Other,
        }
    }
}

/// Why [`open_no_follow`] or [`read_small`] gave no file or no bytes.
#[derive(Debug)]
pub enum Refused {
    /// `open`, `stat` or `read` (the first field) failed; a file that does
    /// not exist is `Io("open", NotFound)`.
    Io(&'static str, io::Error),
    /// Not a regular file; a symlink is never followed.
    NotRegular(NotRegular),
    /// Larger than the limit: `Some(size)` when `fstat` said so, `None`
    /// when it grew past the limit while it was read.
    TooLarge(Option<u64>),
}

impl Refused {
    /// The library's error for `path` ([`open_regular`]'s wording).
    pub fn into_error(self, path: &Path) -> Error {
        let why = match self {
            Refused::Io(op, e) => return Error::io(path, op, e),
            Refused::NotRegular(NotRegular::Symlink) => "it is a symlink",
            Refused::NotRegular(NotRegular::Directory) => "it is a directory",
            Refused::NotRegular(NotRegular::Other) => "it is not a regular file",
            Refused::TooLarge(_) => "it is larger than expected",
        };
        Error::NotARegularFile {
            path: path.into(),
            why,
        }
    }
}

/// The flags of every open of a name under a store or a pki tree that an
/// attacker may have planted something under: no symlink followed
/// (`O_NOFOLLOW`), `O_NONBLOCK` so that a FIFO does not block the open,
/// `O_NOCTTY` so that a terminal does not become the process's controlling
/// one (both have no effect on regular files), `O_CLOEXEC`. The caller
/// still checks on the descriptor that it opened a regular file.
pub const NO_FOLLOW: libc::c_int =
    libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Opens `path` with [`NO_FOLLOW`] and checks on the descriptor that it is
/// a regular file. The one place that decides what such an open refuses.
pub fn open_no_follow(
    path: &Path,
    write: bool,
) -> std::result::Result<(File, std::fs::Metadata), Refused> {
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(NO_FOLLOW)
        .open(path)
        .map_err(refused_open)?;
    regular(f)
}

/// [`open_no_follow`] of the entry `name` of the open directory `dir`
/// (`openat`: nothing but `dir` itself is resolved, so a directory reached
/// without following links stays so, and no `/proc` path is walked).
pub(crate) fn open_no_follow_at(
    dir: &File,
    name: &str,
) -> std::result::Result<(File, std::fs::Metadata), Refused> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| refused_open(e.into()))?;
    regular(File::from(fd))
}

/// What a failed no-follow open refuses.
fn refused_open(e: io::Error) -> Refused {
    match e.raw_os_error() {
        Some(libc::ELOOP) => Refused::NotRegular(NotRegular::Symlink),
        Some(libc::EISDIR) => Refused::NotRegular(NotRegular::Directory),
        // A socket, or a FIFO opened for writing without a reader.
        Some(libc::ENXIO) => Refused::NotRegular(NotRegular::Other),
        _ => Refused::Io("open", e),
    }
}

/// `f` and its metadata, if it is a regular file (`fstat`).
fn regular(f: File) -> std::result::Result<(File, std::fs::Metadata), Refused> {
    let meta = f.metadata().map_err(|e| Refused::Io("stat", e))?;
    if !meta.is_file() {
        return Err(Refused::NotRegular(NotRegular::of(&meta)));
    }
    Ok((f, meta))
}

/// Opens an existing file (a bank file, a lock file), refusing symlinks
/// and anything that is not a regular file ([`Error::NotARegularFile`]
/// saying which).
pub fn open_regular(path: &Path, write: bool) -> Result<File> {
    open_no_follow(path, write)
        .map(|(f, _)| f)
        .map_err(|r| r.into_error(path))
}

/// Reads the small regular file `path` without following a symlink
/// ([`open_no_follow`]): appends its bytes to `buf` when it holds at most
/// `max` bytes, and returns its metadata (`fstat` of the descriptor) and
/// how many bytes were appended. A file `fstat` says is larger is not
/// read; otherwise at most `max + 1` bytes are read (what `fstat`
/// announced in one read as a rule, then to the end if it grew), so a file
/// that grows while it is read is refused too. On a refusal `buf` is left
/// as it was. The one "open, stat, read at most N + 1 bytes" of keycache:
/// the tree's key files, a migration's scan, the master's key files.
pub fn read_small(
    path: &Path,
    max: u64,
    buf: &mut Vec<u8>,
) -> std::result::Result<(std::fs::Metadata, usize), Refused> {
    read_opened(open_no_follow(path, false)?, max, buf)
}

/// [`read_small`] of the entry `name` of the open directory `dir`
/// ([`open_no_follow_at`]).
pub(crate) fn read_small_at(
    dir: &File,
    name: &str,
    max: u64,
    buf: &mut Vec<u8>,
) -> std::result::Result<(std::fs::Metadata, usize), Refused> {
    read_opened(open_no_follow_at(dir, name)?, max, buf)
}

/// The reading half of [`read_small`], on a file opened and checked.
fn read_opened(
    (mut f, meta): (File, std::fs::Metadata),
    max: u64,
    buf: &mut Vec<u8>,
) -> std::result::Result<(std::fs::Metadata, usize), Refused> {
    let len = read_small_from(&mut f, meta.len(), max, buf)?;
    Ok((meta, len))
}

/// [`read_small`]'s read, of a regular file already open whose `fstat`
/// said `size` bytes, for a caller that keeps the file open afterwards;
/// returns how many bytes were appended to `buf`.
pub(crate) fn read_small_from(
    f: &mut File,
    size: u64,
    max: u64,
    buf: &mut Vec<u8>,
) -> std::result::Result<usize, Refused> {
    if size > max {
        return Err(Refused::TooLarge(Some(size)));
    }
    let start = buf.len();
    // What fstat announced plus one byte, to see a file that grew.
    buf.resize(start + size as usize + 1, 0);
    let mut got = 0;
    let res = loop {
        match f.read(&mut buf[start + got..]) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                got += n;
                // All fstat announced (the usual case: no read to see end
                // of file), or more than that.
                if got as u64 >= size {
                    break Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    buf.truncate(start + got);
    let res = res.and_then(|()| {
        if got as u64 > size {
            // The file grew since fstat: the rest, up to the limit.
            let room = (max + 1).saturating_sub(got as u64);
            f.take(room).read_to_end(buf).map(|_| ())
        } else {
            Ok(())
        }
    });
    if let Err(e) = res {
        buf.truncate(start);
        return Err(Refused::Io("read", e));
    }
    let len = buf.len() - start;
    if len as u64 > max {
        buf.truncate(start);
        return Err(Refused::TooLarge(None));
    }
    Ok(len)
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
            Ok(m) if m.is_file() => self.replacing_file(m.uid(), m.gid(), m.mode()),
            _ => *self,
        }
    }

    /// What a file replacing a regular file of owner `uid`, group `gid`
    /// and mode `mode` gets (see [`Ownership::replacing`]).
    pub(crate) fn replacing_file(&self, uid: u32, gid: u32, mode: u32) -> Ownership {
        Ownership {
            owner: if self.explicit {
                self.owner
            } else {
                Some((uid, gid))
            },
            mode: mode & 0o777,
            explicit: self.explicit,
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

/// `create_new` without the directory fsync, for callers that sync the
/// directory themselves before anything depends on the new name (rebuilds).
pub fn create_new_unsynced(path: &Path, own: &Ownership) -> Result<File> {
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

/// Opens the regular file `path` for reading and writing, creating it
/// (with `own`, its directory entry not fsynced) when it is absent; a
/// symlink or anything else than a regular file is refused. For a small
/// file written in place again and again (the etcd replicator's record of
/// the revision it is applying), where a new file each time would cost an
/// inode each time.
pub fn open_or_create(path: &Path, own: &Ownership) -> Result<File> {
    match open_no_follow(path, true) {
        Ok((f, _)) => Ok(f),
        Err(Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => {
            create_new_unsynced(path, own)
        }
        Err(r) => Err(r.into_error(path)),
    }
}

/// Reserves `len` bytes of zeros for a file, so writes through a mapping
/// cannot fail for lack of space later (which would raise SIGBUS).
pub(crate) fn allocate(f: &File, path: &Path, len: u64) -> Result<()> {
    f.set_len(len).map_err(|e| Error::io(path, "truncate", e))?;
    if len == 0 {
        return Ok(());
    }
    // fallocate(2) itself, where posix_fallocate would write zeros on a
    // filesystem without it: there, sparse is the best it offers.
    match rustix::fs::fallocate(f, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) => Ok(()),
        Err(e) => Err(Error::io(path, "fallocate", e.into())),
    }
}

/// `syncfs(f)`: writes back every dirty page and inode of the filesystem
/// that holds `f`, and waits for it (one call instead of an fsync per file
/// for the key tree's large batches).
pub(crate) fn syncfs(f: &File) -> io::Result<()> {
    rustix::fs::syncfs(f).map_err(io::Error::from)
}

/// Flushes a file's data to stable storage.
pub fn sync_data(f: &File, path: &Path) -> Result<()> {
    f.sync_data().map_err(|e| Error::io(path, "fsync", e))
}

/// Makes the entries of `dir` (creations, renames) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io(dir, "open", e))?;
    d.sync_all().map_err(|e| Error::io(dir, "fsync", e))
}

/// Renames `from` over `to`.
pub fn rename(from: &Path, to: &Path) -> Result<()> {
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
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Replaces `path` with `bytes` atomically: a temporary file beside it
/// (created with `own`), fsynced, renamed over it, the directory fsynced.
pub fn replace_with(path: &Path, bytes: &[u8], own: &Ownership) -> Result<()> {
    replace(path, bytes, own, true)
}

/// [`replace_with`] without the fsyncs: readers see the old bytes or the
/// new ones, never a mix, but a crash may leave either (or, on some file
/// systems, an empty file). For records that may fall behind after a crash
/// and whose reader copes with garbage: the etcd replica's revision, which
/// a restart re-reads from etcd.
pub fn replace_unsynced(path: &Path, bytes: &[u8], own: &Ownership) -> Result<()> {
    replace(path, bytes, own, false)
}

fn replace(path: &Path, bytes: &[u8], own: &Ownership, durable: bool) -> Result<()> {
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        "{}{name}.{}.{}",
        crate::format::TMP_PREFIX,
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
        if durable {
            sync_data(&f, &tmp)?;
        }
        rename(&tmp, path)?;
        if durable {
            sync_dir(&dir)?;
        }
        Ok(())
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path, max: u64) -> std::result::Result<Vec<u8>, Refused> {
        let mut buf = b"prefix".to_vec();
        match read_small(path, max, &mut buf) {
            Ok((meta, n)) => {
                assert_eq!(meta.len() as usize, n);
                assert_eq!(&buf[..6], b"prefix");
                Ok(buf[6..].to_vec())
            }
            Err(e) => {
                assert_eq!(buf, b"prefix", "a refusal leaves the buffer as it was");
                Err(e)
            }
        }
    }

    #[test]
    fn read_small_reads_a_file_of_exactly_the_limit_and_refuses_one_byte_more() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("k");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read(&p, 10).unwrap(), b"0123456789");
        assert_eq!(read(&p, 11).unwrap(), b"0123456789");
        assert!(matches!(read(&p, 9), Err(Refused::TooLarge(Some(10)))));
        std::fs::write(&p, b"").unwrap();
        assert_eq!(read(&p, 0).unwrap(), b"");
    }

    #[test]
    fn read_small_refuses_a_symlink_without_following_it() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("target"), b"key").unwrap();
        std::os::unix::fs::symlink(t.path().join("target"), t.path().join("k")).unwrap();
        assert!(matches!(
            read(&t.path().join("k"), 100),
            Err(Refused::NotRegular(NotRegular::Symlink))
        ));
        let e = open_regular(&t.path().join("k"), false).unwrap_err();
        assert!(e.to_string().contains("it is a symlink"), "{e}");
    }

    #[test]
    fn read_small_refuses_what_is_not_a_regular_file() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        std::fs::create_dir(&d).unwrap();
        assert!(matches!(
            read(&d, 100),
            Err(Refused::NotRegular(NotRegular::Directory))
        ));
        // A FIFO: O_NONBLOCK keeps the open from waiting for a writer.
        let fifo = t.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        assert!(matches!(
            read(&fifo, 100),
            Err(Refused::NotRegular(NotRegular::Other))
        ));
        assert!(matches!(
            read(&t.path().join("absent"), 100),
            Err(Refused::Io("open", e)) if e.kind() == io::ErrorKind::NotFound
        ));
    }
}
