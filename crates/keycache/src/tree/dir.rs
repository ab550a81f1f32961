//! The tree's state directories, opened without following links, and the
//! key files in them: looked at, written through temporaries, removed.

use super::*;
use crate::files::Refused;
use std::os::unix::ffi::OsStringExt;

mod filled;
pub(crate) use filled::filled_name;

/// A directory opened without following a symlink, and reached through
/// its descriptor from then on: every entry is looked at, opened, renamed
/// and removed with the `*at` system calls relative to it, so no path is
/// resolved again (a symlink planted in place of the directory afterwards
/// is never followed) and no `/proc/self/fd` path is walked.
#[derive(Debug)]
pub(crate) struct Dir {
    /// The open directory.
    fd: File,
    /// Whose refusals and file modes.
    by: Writer,
    /// The path, for messages.
    path: PathBuf,
    /// A state directory being filled under a temporary name before it is
    /// renamed into place ([`Dir::create_filled`]): its files are created
    /// under their own names, with no temporary of their own.
    fill: bool,
}

/// What is under a name in a directory (not followed).
pub(crate) enum Node {
    Absent,
    File(Meta),
    Other(Meta),
}

/// What `lstat` says of an entry: the fields the tree's writers look at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    len: u64,
    uid: u32,
    gid: u32,
    /// `st_mode`: file type and permission bits.
    mode: u32,
}

impl Meta {
    fn of(st: &rustix::fs::Stat) -> Meta {
        Meta {
            len: u64::try_from(st.st_size).unwrap_or(0),
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode,
        }
    }

    /// The same fields of an open file's `fstat`.
    fn of_metadata(m: &std::fs::Metadata) -> Meta {
        Meta {
            len: m.len(),
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode(),
        }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Owner.
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }

    /// Group.
    pub(crate) fn gid(&self) -> u32 {
        self.gid
    }

    /// `st_mode`, as [`std::os::unix::fs::MetadataExt::mode`] gives it.
    pub(crate) fn mode(&self) -> u32 {
        self.mode
    }

    /// What the entry is, when it is not a regular file.
    pub(crate) fn not_regular(&self) -> NotRegular {
        NotRegular::of_mode(self.mode)
    }
}

impl Dir {
    /// The pki dir (the store's directory, or an export's, followed as
    /// given), its state directories written `by`.
    pub(crate) fn open_root(path: &Path, by: Writer) -> Result<Dir> {
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| Error::io(path, "open directory", e))?;
        Ok(Dir {
            fd,
            by,
            path: path.to_path_buf(),
            fill: false,
        })
    }

    pub(crate) fn shown(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// The state directory `name`, not followed; None when absent.
    pub(crate) fn sub(&self, name: &str) -> Result<Option<Dir>> {
        use rustix::fs::{Mode, OFlags};
        let shown = self.shown(name);
        match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => Ok(Some(Dir {
                fd: File::from(fd),
                by: self.by,
                path: shown,
                fill: false,
            })),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                Err(self.by.not_a_dir(&shown))
            }
            Err(e) => Err(Error::io(&shown, "open directory", e.into())),
        }
    }

    /// The state directory `name`, created (0755, `own`'s owner) when
    /// absent, its creation made durable.
    pub(crate) fn sub_or_create(&self, name: &str, own: &Ownership) -> Result<Dir> {
        if let Some(d) = self.sub(name)? {
            return Ok(d);
        }
        let shown = self.shown(name);
        match self.mkdir(name, own) {
            Ok(d) => {
                self.sync()?;
                Ok(d)
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
                self.sub(name)?
                    .ok_or_else(|| Error::io(&shown, "open directory", not_found()))
            }
            Err(e) => Err(e),
        }
    }

    /// Creates the directory `name` (0755, `own`'s owner) and opens it.
    fn mkdir(&self, name: &str, own: &Ownership) -> Result<Dir> {
        let shown = self.shown(name);
        rustix::fs::mkdirat(&self.fd, name, rustix::fs::Mode::from_raw_mode(0o755))
            .map_err(|e| Error::io(&shown, "create directory", e.into()))?;
        let d = self
            .sub(name)?
            .ok_or_else(|| Error::io(&shown, "open directory", not_found()))?;
        if let Some((uid, gid)) = own.owner {
            let m = d.fd.metadata().map_err(|e| Error::io(&shown, "stat", e))?;
            if (m.uid(), m.gid()) != (uid, gid) {
                match std::os::unix::fs::fchown(&d.fd, Some(uid), Some(gid)) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                    Err(e) => return Err(Error::io(&shown, "chown", e)),
                }
            }
        }
        Ok(d)
    }

    /// What is under `name` (`lstat`, not followed).
    pub(crate) fn entry(&self, name: &str) -> Result<Node> {
        match rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let m = Meta::of(&st);
                Ok(if m.mode & libc::S_IFMT == libc::S_IFREG {
                    Node::File(m)
                } else {
                    Node::Other(m)
                })
            }
            Err(rustix::io::Errno::NOENT) => Ok(Node::Absent),
            Err(e) => Err(Error::io(self.shown(name), "stat", e.into())),
        }
    }

    /// Whether the regular file `name` holds exactly `pem`, read with
    /// [`crate::files::read_small_at`] (at most `pem.len() + 1` bytes, no
    /// symlink followed), without looking at the entry first: for callers
    /// that saw a regular file of `pem`'s length there.
    pub(crate) fn content_is(&self, name: &str, pem: &[u8]) -> Result<bool> {
        let mut got = Vec::with_capacity(pem.len());
        match crate::files::read_small_at(&self.fd, name, pem.len() as u64, &mut got) {
            Ok(_) => Ok(got == pem),
            Err(Refused::TooLarge(_)) => Ok(false),
            Err(Refused::NotRegular(kind)) => Err(self.by.not_a_key_file(&self.shown(name), kind)),
            Err(Refused::Io(op, e)) => Err(Error::io(self.shown(name), op, e)),
        }
    }

    /// Whether `name` is a regular file holding exactly `pem`.
    pub(crate) fn holds(&self, name: &str, pem: &[u8]) -> Result<bool> {
        match self.entry(name)? {
            Node::File(m) if m.len() == pem.len() as u64 => self.content_is(name, pem),
            _ => Ok(false),
        }
    }

    /// The regular file `name`, opened (never through a symlink, never
    /// waiting on a FIFO) and kept open, with what its `fstat` says. None
    /// when there is no entry, or one that is not a regular file: a caller
    /// that meets that entry again where it must be written or removed
    /// refuses it there.
    pub(crate) fn open_file(&self, name: &str) -> Result<Option<Opened>> {
        match crate::files::open_no_follow_at(&self.fd, name) {
            Ok((file, m)) => Ok(Some(Opened {
                meta: Meta::of_metadata(&m),
                dev: m.dev(),
                ino: m.ino(),
                file,
            })),
            Err(Refused::NotRegular(_)) => Ok(None),
            Err(Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(Refused::Io(op, e)) => Err(Error::io(self.shown(name), op, e)),
            Err(Refused::TooLarge(_)) => Ok(None),
        }
    }

    /// Whether the entry `name` is the file `f` (the same device and inode,
    /// `lstat`): after a rename, that the entry moved is the file opened
    /// and read, not one put under its name in between.
    pub(crate) fn is(&self, name: &str, f: &Opened) -> Result<bool> {
        match rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(st.st_dev == f.dev && st.st_ino == f.ino),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(Error::io(self.shown(name), "stat", e.into())),
        }
    }

    /// Renames `name` of this directory to `to_name` of directory `to`
    /// (`renameat`).
    pub(crate) fn rename_to(&self, name: &str, to: &Dir, to_name: &str) -> std::io::Result<()> {
        rustix::fs::renameat(&self.fd, name, &to.fd, to_name).map_err(Into::into)
    }

    /// Unlinks `name` (`unlinkat`), whatever it is but a directory.
    fn unlink(&self, name: &str) -> std::io::Result<()> {
        rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty()).map_err(Into::into)
    }

    /// Writes the item's `pem` under its `name`, first half: a temporary
    /// file (0600, the item's owner, or the replaced file's), written, not
    /// yet fsynced. Staging a group of files before committing any lets the
    /// first fsync carry the data of all of them (one journal commit instead
    /// of one per file on ext4 and XFS). `pid` (this process's, read once
    /// per group) names the temporary; one left by an earlier failure of
    /// this process is only looked at when the exclusive create finds it, so
    /// a file costs one `lstat` (of `name`) here, none for an item the plan
    /// found absent, and a new one none in [`Dir::commit`].
    fn stage(&self, item: &Item<'_>, op: &'static str, pid: u32) -> Result<Staged> {
        use rustix::fs::{Mode, OFlags};
        let (name, pem) = (item.name, item.pem);
        let shown = self.shown(name);
        let node = match item.absent {
            true => Node::Absent,
            false => self.entry(name)?,
        };
        let (mut own, fresh) = match node {
            Node::Other(m) => return Err(self.by.not_a_key_file(&shown, m.not_regular())),
            Node::File(m) => (item.own.replacing_file(m.uid(), m.gid(), m.mode()), false),
            Node::Absent => (item.own, true),
        };
        own.mode = self.by.key_mode(own.mode);
        let tmp = match self.fill {
            true => name.to_owned(),
            false => format!("{TEMP_PREFIX}{pid}.{name}"),
        };
        let tmp_shown = self.shown(&tmp);
        let create = || {
            rustix::fs::openat(
                &self.fd,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
        };
        let fd = match create() {
            Err(rustix::io::Errno::EXIST) => {
                // Ours, from a write of this process that failed before its
                // rename: removed if it is a regular file (anything else
                // makes the second create fail).
                if let Node::File(_) = self.entry(&tmp)? {
                    self.unlink(&tmp)
                        .map_err(|e| Error::io(&tmp_shown, op, e))?;
                }
                create()
            }
            r => r,
        };
        let mut f = fd
            .map(File::from)
            .map_err(|e| Error::io(&tmp_shown, op, e.into()))?;
        let done = own
            .apply(&f, &tmp_shown)
            .and_then(|()| f.write_all(pem).map_err(|e| Error::io(&tmp_shown, op, e)));
        match done {
            Ok(()) => Ok(Staged {
                file: Some(f),
                tmp,
                name: name.to_owned(),
                fresh,
            }),
            Err(e) => {
                let _ = self.unlink(&tmp);
                Err(e)
            }
        }
    }

    /// Second half of a write: fsync (a staged file still open; a closed
    /// one was made durable by its group's write-back), then the rename
    /// over the name, refused if a non-regular entry was planted there
    /// meanwhile. A new name (absent when staged) is renamed without
    /// replacing (`RENAME_NOREPLACE`), so only a name taken since costs a
    /// look; a replaced file's name is looked at first. The directory is
    /// not fsynced (see [`Dir::sync`]).
    fn commit(&self, st: Staged, op: &'static str) -> Result<()> {
        let shown = self.shown(&st.name);
        let data = st.file.as_ref().map_or(Ok(()), File::sync_data);
        let done = data
            .map_err(|e| Error::io(self.shown(&st.tmp), op, e))
            .and_then(|()| {
                if self.fill {
                    // Under its own name already: the directory is what
                    // is renamed into place.
                    return Ok(());
                }
                if st.fresh {
                    match rustix::fs::renameat_with(
                        &self.fd,
                        st.tmp.as_str(),
                        &self.fd,
                        st.name.as_str(),
                        rustix::fs::RenameFlags::NOREPLACE,
                    ) {
                        Ok(()) => return Ok(()),
                        // Taken since the stage, or a filesystem without
                        // the flag: looked at, as a replacement is.
                        Err(rustix::io::Errno::EXIST | rustix::io::Errno::INVAL) => {}
                        Err(e) => return Err(Error::io(&shown, op, e.into())),
                    }
                }
                match self.entry(&st.name)? {
                    Node::Other(m) => Err(self.by.not_a_key_file(&shown, m.not_regular())),
                    _ => self
                        .rename_to(&st.tmp, self, &st.name)
                        .map_err(|e| Error::io(&shown, op, e)),
                }
            });
        if done.is_err() {
            let _ = self.unlink(&st.tmp);
        }
        done
    }

    /// Removes a staged temporary that will not be committed.
    fn discard(&self, st: Staged) {
        let _ = self.unlink(&st.tmp);
    }

    /// Removes the regular file `name`; a non-regular entry is refused.
    /// Returns whether a file was removed.
    pub(crate) fn remove(&self, name: &str, op: &'static str) -> Result<bool> {
        let shown = self.shown(name);
        match self.entry(name)? {
            Node::Absent => Ok(false),
            Node::Other(m) => Err(self.by.not_a_key_file(&shown, m.not_regular())),
            Node::File(_) => match self.unlink(name) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(Error::io(&shown, op, e)),
            },
        }
    }

    /// Writes back every dirty file of the directory's filesystem: the data
    /// of a group of staged files at once ([`write_many`]).
    pub(crate) fn sync_filesystem(&self, op: &'static str) -> Result<()> {
        crate::files::syncfs(&self.fd).map_err(|e| Error::io(&self.path, op, e))
    }

    /// Makes the directory's entries (creations, renames, removals) durable.
    pub(crate) fn sync(&self) -> Result<()> {
        self.fd
            .sync_all()
            .map_err(|e| Error::io(&self.path, "fsync", e))
    }

    /// Removes the temporaries of tree writers that were killed
    /// ([`is_dead_temporary`]) from the directory; returns their paths.
    pub(crate) fn remove_dead_temporaries(&self, op: &'static str) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for name in self.names()? {
            let Some(n) = name.to_str() else { continue };
            if is_dead_temporary(n) && self.remove(n, op)? {
                out.push(self.shown(n));
            }
        }
        Ok(out)
    }

    /// The names in the directory (`.` and `..` left out).
    pub(crate) fn names(&self) -> Result<Vec<std::ffi::OsString>> {
        Ok(self.entries()?.into_iter().map(|(n, _)| n).collect())
    }

    /// The names of the directory's entries (not `.` and `..`), each with
    /// whether the listing itself says it is a regular file (`d_type`;
    /// false for any other type and where the file system does not say).
    pub(crate) fn entries(&self) -> Result<Vec<(std::ffi::OsString, bool)>> {
        let err = |e: rustix::io::Errno| Error::io(&self.path, "read directory", e.into());
        let mut rd = rustix::fs::Dir::read_from(&self.fd).map_err(err)?;
        let mut out = Vec::new();
        while let Some(ent) = rd.read() {
            let ent = ent.map_err(err)?;
            let name = ent.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                let regular = ent.file_type() == rustix::fs::FileType::RegularFile;
                out.push((std::ffi::OsString::from_vec(name), regular));
            }
        }
        Ok(out)
    }
}

/// A regular file of a state directory held open ([`Dir::open_file`]):
/// its bytes are read once through it, and after a rename its inode tells
/// whether the entry moved is this file ([`Dir::is`]).
pub(crate) struct Opened {
    file: File,
    meta: Meta,
    dev: u64,
    ino: u64,
}

impl Opened {
    /// What its `fstat` said.
    pub(crate) fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Whether it holds exactly `pem` (at most `pem.len() + 1` bytes read);
    /// `shown` names it in an error.
    pub(crate) fn holds(&mut self, pem: &[u8], shown: &Path) -> Result<bool> {
        if self.meta.len != pem.len() as u64 {
            return Ok(false);
        }
        let mut got = Vec::with_capacity(pem.len() + 1);
        match crate::files::read_small_from(
            &mut self.file,
            self.meta.len,
            pem.len() as u64,
            &mut got,
        ) {
            Ok(_) => Ok(got == pem),
            Err(Refused::Io(op, e)) => Err(Error::io(shown, op, e)),
            Err(_) => Ok(false),
        }
    }

    /// Makes its data durable (`fdatasync`).
    pub(crate) fn sync_data(&self, shown: &Path, op: &'static str) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io(shown, op, e))
    }
}

/// A key file written under its temporary name ([`Dir::stage`]).
pub(crate) struct Staged {
    /// Open until its fdatasync; None once closed: its group is made
    /// durable by a write-back of the filesystem before any commit, or it
    /// is not made durable at all (a directory outside [`write_many`]'s
    /// `durable`).
    file: Option<File>,
    tmp: String,
    name: String,
    /// The name was absent when staged.
    fresh: bool,
}

/// One key file for [`write_many`] to write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item<'a> {
    /// The state directory ([`TreeDir::index`]).
    pub(crate) dir: usize,
    /// The file's name: the minion id.
    pub(crate) name: &'a str,
    /// The file's bytes.
    pub(crate) pem: &'a [u8],
    /// Owner and mode of a new file.
    pub(crate) own: Ownership,
    /// The writer looked, under the lock that keeps other keycache writers
    /// out, and found no entry under `name`: the stage does not look again
    /// (one `lstat` a file fewer in a new replica). Should an entry appear
    /// in between all the same, the rename that does not replace fails,
    /// and the entry is looked at before anything replaces it.
    pub(crate) absent: bool,
}

/// How many files are staged before they are committed when each gets its
/// own fdatasync (each holds a descriptor open until then).
pub(crate) const GROUP: usize = 128;

/// How many files are staged before they are committed when the group is
/// made durable by one write-back of the filesystem (descriptors closed
/// once written): 100,000 key files take 25 write-backs instead of 782
/// (on a journaled ext4 here, 3.3 ms each).
pub(crate) const GROUP_WHOLE: usize = 4096;

/// From how many files a write is made durable by write-backs of the
/// filesystem ([`crate::files::syncfs`]) instead of an fsync each: a single
/// accept keeps its own fsync (a write-back would flush every other
/// process's dirty pages too).
pub(crate) const SYNC_WHOLE: usize = 16;

/// Every state directory's files made durable ([`write_many`]'s `durable`).
pub(crate) const DURABLE_ALL: u8 = 0b1111;

/// Only `minions/`'s files made durable ([`write_many`]'s `durable`): the
/// store's own tree, where only `minions/` lets a minion in
/// (`validate_token`) and a file of another directory lost to a power cut
/// is a finding of `verify` that its repair mends.
pub(crate) const DURABLE_MINIONS: u8 = 1 << TreeDir::Minions.index();

/// Writes `items` (state directory, name, key) with [`Dir::stage`] and
/// [`Dir::commit`], in
/// groups: each group's temporaries are all written before the first is
/// fsynced and renamed. The files of the directories in `durable` (bit
/// [`TreeDir::index`]) have their data durable before their rename; the
/// others are renamed as written, with no fsync (the page cache keeps
/// them through a kill; a power cut can lose them or leave them empty).
pub(crate) fn write_many(
    dirs: &[Option<Dir>; 4],
    items: &[Item<'_>],
    durable: u8,
    op: &'static str,
) -> Result<()> {
    // A large write's data made durable by one write-back of the
    // filesystem per group and directory, not by an fsync per file
    // (100,000 key files: seconds instead of half a minute). Each durable
    // file's data is durable before its rename either way.
    let whole = items
        .iter()
        .filter(|it| durable & (1 << it.dir) != 0)
        .count()
        >= SYNC_WHOLE;
    let pid = std::process::id();
    for group in items.chunks(if whole { GROUP_WHOLE } else { GROUP }) {
        let mut staged: Vec<(usize, Staged)> = Vec::with_capacity(group.len());
        let mut failed = None;
        for it in group {
            let d = it.dir;
            let Some(dir) = &dirs[d] else { continue };
            match dir.stage(it, op, pid) {
                Ok(mut st) => {
                    if whole || durable & (1 << d) == 0 {
                        st.file = None;
                    }
                    staged.push((d, st))
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if failed.is_none() && whole {
            let mut done = [false; 4];
            for (d, _) in staged.iter().filter(|(d, _)| durable & (1 << d) != 0) {
                if let (Some(dir), false) = (&dirs[*d], done[*d]) {
                    done[*d] = true;
                    if let Err(e) = dir.sync_filesystem(op) {
                        failed = Some(e);
                        break;
                    }
                }
            }
        }
        let mut it = staged.into_iter();
        if failed.is_none() {
            for (d, st) in it.by_ref() {
                if let Some(dir) = &dirs[d] {
                    if let Err(e) = dir.commit(st, op) {
                        failed = Some(e);
                        break;
                    }
                }
            }
        }
        for (d, st) in it {
            if let Some(dir) = &dirs[d] {
                dir.discard(st);
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(())
}

fn not_found() -> std::io::Error {
    std::io::ErrorKind::NotFound.into()
}

/// Whether `name` is the temporary of a tree write (`.keycache-tree.<pid>.<id>`,
/// [`TEMP_PREFIX`]) whose writer is gone: no process `<pid>` runs (a
/// writer killed between the temporary's creation and its rename). A
/// temporary of a running writer is its own.
pub(crate) fn is_dead_temporary(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(TEMP_PREFIX) else {
        return false;
    };
    let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(t: &Path) -> Dir {
        Dir::open_root(t, Writer::Tree).unwrap()
    }

    fn own(t: &Path) -> Ownership {
        Ownership::for_dir(t).unwrap()
    }

    /// `KEY` under `name`, to be looked at by the stage (`absent` false).
    fn item<'a>(t: &Path, name: &'a str, absent: bool) -> Item<'a> {
        Item {
            dir: 0,
            name,
            pem: b"KEY",
            own: own(t),
            absent,
        }
    }

    #[test]
    fn a_temporary_this_process_left_is_replaced() {
        let t = tempfile::tempdir().unwrap();
        let d = dir(t.path());
        let pid = std::process::id();
        let tmp = t.path().join(format!("{TEMP_PREFIX}{pid}.m1"));
        std::fs::write(&tmp, b"left by a failed write").unwrap();
        let st = d.stage(&item(t.path(), "m1", false), "write", pid).unwrap();
        d.commit(st, "write").unwrap();
        assert_eq!(std::fs::read(t.path().join("m1")).unwrap(), b"KEY");
        assert!(!tmp.exists());
    }

    #[test]
    fn a_directory_in_place_of_the_temporary_refuses_the_write() {
        let t = tempfile::tempdir().unwrap();
        let d = dir(t.path());
        let pid = std::process::id();
        let tmp = t.path().join(format!("{TEMP_PREFIX}{pid}.m1"));
        std::fs::create_dir(&tmp).unwrap();
        assert!(d.stage(&item(t.path(), "m1", false), "write", pid).is_err());
        assert!(tmp.is_dir());
        assert!(!t.path().join("m1").exists());
    }

    #[test]
    fn what_is_planted_at_a_new_name_after_the_stage_is_refused_and_kept() {
        let t = tempfile::tempdir().unwrap();
        let d = dir(t.path());
        let pid = std::process::id();
        let outside = t.path().join("outside");
        std::fs::write(&outside, b"not a key").unwrap();
        type Plant = dyn Fn(&Path) -> std::io::Result<()>;
        let dir_at = |p: &Path| std::fs::create_dir(p);
        let link_at = |p: &Path| std::os::unix::fs::symlink("outside", p);
        // After the stage; or before it, where the writer's plan found
        // the name absent and the stage does not look (`absent`).
        for (name, plant, before) in [
            ("m1", &dir_at as &Plant, false),
            ("m2", &link_at as &Plant, false),
            ("m3", &dir_at as &Plant, true),
            ("m4", &link_at as &Plant, true),
        ] {
            let at = t.path().join(name);
            if before {
                plant(&at).unwrap();
            }
            let st = d
                .stage(&item(t.path(), name, before), "write", pid)
                .unwrap();
            if !before {
                plant(&at).unwrap();
            }
            let e = d.commit(st, "write").unwrap_err();
            assert!(in_the_way(&e), "{name}: {e}");
            let m = std::fs::symlink_metadata(&at).unwrap();
            assert!(!m.is_file(), "{name}: replaced");
            assert!(!t.path().join(format!("{TEMP_PREFIX}{pid}.{name}")).exists());
        }
        assert_eq!(std::fs::read(&outside).unwrap(), b"not a key");
    }

    #[test]
    fn a_file_written_at_a_new_name_after_the_stage_is_replaced() {
        let t = tempfile::tempdir().unwrap();
        let d = dir(t.path());
        let pid = std::process::id();
        let st = d.stage(&item(t.path(), "m1", false), "write", pid).unwrap();
        std::fs::write(t.path().join("m1"), b"OTHER").unwrap();
        d.commit(st, "write").unwrap();
        assert_eq!(std::fs::read(t.path().join("m1")).unwrap(), b"KEY");
        // A file there already, where the plan found none: replaced too.
        std::fs::write(t.path().join("m2"), b"OTHER").unwrap();
        let st = d.stage(&item(t.path(), "m2", true), "write", pid).unwrap();
        d.commit(st, "write").unwrap();
        assert_eq!(std::fs::read(t.path().join("m2")).unwrap(), b"KEY");
    }

    #[test]
    fn a_file_opened_to_be_moved_is_told_from_one_put_under_its_name() {
        let t = tempfile::tempdir().unwrap();
        let d = dir(t.path());
        std::fs::create_dir(t.path().join("to")).unwrap();
        let to = d.sub("to").unwrap().unwrap();
        std::fs::write(t.path().join("m1"), b"KEY").unwrap();
        let mut f = d.open_file("m1").unwrap().unwrap();
        assert!(f.holds(b"KEY", &d.shown("m1")).unwrap());
        d.rename_to("m1", &to, "m1").unwrap();
        assert!(to.is("m1", &f).unwrap(), "the file read, moved");
        // The same bytes under the name, another file: not the one read.
        std::fs::remove_file(t.path().join("to/m1")).unwrap();
        std::fs::write(t.path().join("to/m1"), b"KEY").unwrap();
        assert!(!to.is("m1", &f).unwrap());
        std::fs::remove_file(t.path().join("to/m1")).unwrap();
        assert!(!to.is("m1", &f).unwrap(), "no entry");
        // Other bytes, or more of them: not held.
        std::fs::write(t.path().join("m2"), b"KEX").unwrap();
        std::fs::write(t.path().join("m3"), b"KEY\n").unwrap();
        for name in ["m2", "m3"] {
            let mut f = d.open_file(name).unwrap().unwrap();
            assert!(!f.holds(b"KEY", &d.shown(name)).unwrap(), "{name}");
        }
    }

    #[test]
    fn what_is_not_a_regular_file_is_not_opened_to_be_moved() {
        let t = tempfile::tempdir().unwrap();
        let d = dir(t.path());
        std::fs::write(t.path().join("outside"), b"KEY").unwrap();
        std::os::unix::fs::symlink("outside", t.path().join("link")).unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        // A FIFO without a writer: opening it must not wait.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            t.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        for name in ["link", "sub", "fifo", "absent"] {
            assert!(d.open_file(name).unwrap().is_none(), "{name}");
        }
    }
}
