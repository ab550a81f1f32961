//! The `localfs_key` tree kept in step with the store.
//!
//! Salt 3008.5's `ReqServerChannel.validate_token` (salt/channel/server.py)
//! reads `<pki_dir or cluster_pki_dir>/minions/<id>` straight from disk on
//! every AES request of a signed-in minion, bypassing the key cache driver:
//! under `mmap_key`, a key accepted only in the banks fails every request,
//! and a key deleted or rejected only in the banks keeps passing as long as
//! its old file is there. A store with [`TreeSync::On`]
//! ([`Store::set_tree`]) therefore writes the tree along with the banks, in
//! the store's own directory (where Salt's `mmap_key` keeps the banks and
//! `validate_token` looks for the files): the accepted key in `minions/`,
//! pending keys in `minions_pre/`, rejected ones in `minions_rejected/`,
//! denied ones in `minions_denied/`, and no file for an id in a directory of
//! a state it is not in.
//!
//! # The order of the two writes
//!
//! A crash between the bank write and the tree write never leaves a file in
//! `minions/` that lets a minion pass `validate_token` while the store does
//! not hold that id accepted with that key:
//!
//! 1. before the banks are written, `minions/<id>` is removed for every id
//!    of the batch that will not be accepted with exactly that file's key
//!    afterwards (rejected, deleted, re-keyed), and `minions/` is fsynced;
//! 2. the banks are written (durable when it returns);
//! 3. then the new files are written (temporary file, fsync, rename over the
//!    name, fsync of the directory), the accepted key into `minions/` last
//!    of all in the sense that the store already holds it, and the files of
//!    the other directories that no longer belong are removed (after the
//!    writes: a key moving from pending to accepted is in both directories
//!    for a moment, and Salt's `localfs_key` precedence, rejected, then
//!    pending, then accepted, then gives it the less trusted state).
//!
//! A crash between 1 and 2 leaves a minion accepted in the banks without
//! its file (it is refused until [`mend`]); a crash between 2 and 3 leaves
//! the tree behind the store, never ahead of it. [`check`] reports what a
//! crash (or anyone else) left, [`mend`] makes the tree equal to the store.
//!
//! # Files as Salt's `localfs_key` writes them
//!
//! Salt 3008.5's `localfs_key.store` (salt/cache/localfs_key.py) writes a
//! key through `tempfile.mkstemp` in the state directory (mode 0600),
//! `chown`s it to the master's `user`, and renames it over the key's name
//! (`salt.utils.atomicfile.atomic_rename`); `os.makedirs` creates a missing
//! state directory, and the master's `verify_env` (salt/utils/verify.py)
//! creates them 0755 (umask 022) owned by the master's user and keeps the
//! pki dir itself 0700 or 0750. keycache writes key files 0600 through a
//! dot-file temporary (`.keycache-tree.<pid>.<id>`, which Salt's listings
//! skip) and a rename, with the owner and group of the file they replace or
//! else of the store's bank files (the pki dir's owner: the master's user),
//! fsyncs the file before the rename and the directory after it, and creates
//! a missing state directory 0755 with the pki dir's owner. The pki dir's
//! own mode is never changed.
//!
//! # No symlink is followed
//!
//! The state directories are opened relative to the pki dir without
//! following a symlink, and every file is reached relative to its opened
//! directory (through `/proc/self/fd`), never by a path that could be
//! re-resolved through a planted symlink; key files are opened with
//! `O_NOFOLLOW`. A symlink, a directory or any other non-regular file under
//! a key's name (or in place of a state directory) is neither followed,
//! replaced nor removed: a write that would have to is refused with
//! [`Error::NotARegularFile`] naming the path before the banks or the tree
//! change, and [`mend`] lists it in [`TreeRepair::refused`].
//!
//! What belongs to the tree in a state directory: the entries whose names
//! are valid minion ids and do not start with `.` (Salt's `list_all` skips
//! dot-files), as for [`crate::export`]. Leftover temporaries of a writer
//! killed mid-write (`.keycache-tree.*`) are reported and removed by
//! [`mend`].
//!
//! Values that hold a private key block ([`crate::pem::holds_private_key`])
//! are never written to the tree: such an id gets no file (and one there is
//! removed).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::id::MinionId;
use crate::migrate::TREE_DIRS;
use crate::store::{KeyState, Store};

/// Prefix of the temporary files a tree write creates in a state directory.
pub const TEMP_PREFIX: &str = ".keycache-tree.";

/// Index of `minions/` in [`TREE_DIRS`].
const ACCEPTED: usize = 0;
/// Index of `minions_denied/` in [`TREE_DIRS`].
const DENIED: usize = 3;

/// Whether a [`Store`]'s writes keep the `localfs_key` tree of its
/// directory in step ([`Store::set_tree`]). The library's default is
/// [`TreeSync::Off`]; [`TreeSync::auto`] is the CLI's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum TreeSync {
    /// The banks only; the tree is left alone.
    #[default]
    Off,
    /// Every write also writes the tree in the store's directory (state
    /// directories created as needed), in the order described in the
    /// module's documentation.
    On,
}

impl TreeSync {
    /// [`TreeSync::On`] when `dir` holds a tree (a `minions` entry exists
    /// there, not followed: a migrated master whose Salt still reads
    /// `minions/<id>`), else [`TreeSync::Off`]. A `minions` that is a
    /// symlink counts as a tree: the writes then refuse it by name rather
    /// than leave Salt reading a tree that is out of step.
    pub fn auto(dir: &Path) -> TreeSync {
        match std::fs::symlink_metadata(dir.join(TREE_DIRS[ACCEPTED])) {
            Ok(m) if m.is_dir() || m.file_type().is_symlink() => TreeSync::On,
            _ => TreeSync::Off,
        }
    }

    /// Whether the tree is written.
    pub fn is_on(self) -> bool {
        self == TreeSync::On
    }
}

/// What a batch did to the tree.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TreeChanges {
    /// Key files written (new or replaced).
    pub written: Vec<PathBuf>,
    /// Key files removed.
    pub removed: Vec<PathBuf>,
}

impl TreeChanges {
    /// Nothing was written or removed.
    pub fn is_empty(&self) -> bool {
        self.written.is_empty() && self.removed.is_empty()
    }
}

/// What is wrong with one entry of the tree, compared with the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum TreeProblem {
    /// A key file in a state directory for an id the store does not hold in
    /// that state (in `minions/`: a minion Salt's `validate_token` lets in
    /// although the store does not hold it accepted).
    Stray,
    /// No key file for an id the store holds in that state (in `minions/`:
    /// an accepted minion that `validate_token` refuses).
    Missing,
    /// The key file's bytes differ from the store's key.
    KeyDiffers,
    /// A key file for an id whose stored value holds a private key block:
    /// the tree never gets such a value, so the file is out of step.
    Withheld,
    /// A symlink, directory or other non-regular file under a key's name:
    /// never followed, replaced or removed by keycache.
    NotAFile,
    /// A state directory that is a symlink or not a directory.
    NotADirectory,
    /// A temporary file left by a tree write that was killed.
    TempFile,
}

/// One disagreement between the tree and the store ([`check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TreeDisagreement {
    /// What is wrong.
    pub problem: TreeProblem,
    /// The state directory: `minions`, `minions_pre`, `minions_rejected`
    /// or `minions_denied`.
    pub dir: &'static str,
    /// The minion id (None for a state directory or a temporary file).
    pub id: Option<String>,
    /// The entry's path.
    pub path: PathBuf,
    /// What the store holds for the id: `accepted`, `pending`, `rejected`
    /// in the `keys` bank, or `denied` (for `minions_denied`); None when
    /// the store holds nothing there.
    pub store: Option<&'static str>,
}

impl TreeDisagreement {
    /// Whether this lets Salt's `validate_token` accept a minion the store
    /// does not hold accepted with that key: a file (or anything Salt would
    /// read through) in `minions/` that the store does not vouch for.
    pub fn grants_access(&self) -> bool {
        self.dir == TREE_DIRS[ACCEPTED]
            && matches!(
                self.problem,
                TreeProblem::Stray
                    | TreeProblem::KeyDiffers
                    | TreeProblem::Withheld
                    | TreeProblem::NotAFile
                    | TreeProblem::NotADirectory
            )
    }
}

impl std::fmt::Display for TreeDisagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.path.display();
        let held = match self.store {
            Some("denied") => "holds a denied key for it".to_owned(),
            Some(s) => format!("holds it {s}"),
            None => "does not hold it".to_owned(),
        };
        match self.problem {
            TreeProblem::Stray => write!(f, "{p}: a key file, but the store {held}")?,
            TreeProblem::Missing => write!(f, "{p}: no key file, but the store {held}")?,
            TreeProblem::KeyDiffers => write!(f, "{p}: the key file differs from the store's key")?,
            TreeProblem::Withheld => write!(
                f,
                "{p}: a key file, but the store's value holds a private key block and is never \
                 written to the tree"
            )?,
            TreeProblem::NotAFile => write!(
                f,
                "{p}: not a regular file (a symlink, a directory or other): keycache neither \
                 follows, replaces nor removes it"
            )?,
            TreeProblem::NotADirectory => write!(
                f,
                "{p}: the state directory is a symlink or not a directory: keycache does not \
                 follow it"
            )?,
            TreeProblem::TempFile => {
                write!(f, "{p}: a temporary file left by a killed tree write")?
            }
        }
        if self.grants_access() {
            write!(f, " (Salt's validate_token reads it: a minion the store does not hold accepted with this key would pass)")?;
        }
        Ok(())
    }
}

/// What [`mend`] did.
#[derive(Debug, Default, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TreeRepair {
    /// Key files written (missing or different).
    pub written: Vec<PathBuf>,
    /// Files removed (stray key files, leftover temporaries).
    pub removed: Vec<PathBuf>,
    /// Disagreements left as they are: entries that are not regular files,
    /// state directories that are not directories. Remove them by hand,
    /// then mend again.
    pub refused: Vec<TreeDisagreement>,
}

/// The refusal for an entry under a key's name that is not a regular file.
fn not_a_key_file(path: &Path, m: &std::fs::Metadata) -> Error {
    Error::NotARegularFile {
        path: path.into(),
        why: if m.file_type().is_symlink() {
            "a symlink in place of a key file of the tree: keycache neither follows, replaces \
             nor removes it; remove it (or use --tree never), then try again"
        } else if m.is_dir() {
            "a directory in place of a key file of the tree: keycache neither replaces nor \
             removes it; remove it (or use --tree never), then try again"
        } else {
            "not a regular file in place of a key file of the tree: keycache neither replaces \
             nor removes it; remove it (or use --tree never), then try again"
        },
    }
}

fn not_a_dir(path: &Path) -> Error {
    Error::NotARegularFile {
        path: path.into(),
        why: "a state directory of the tree that is a symlink or not a directory: keycache \
              does not follow it; replace it with a directory (or use --tree never)",
    }
}

/// A directory opened without following a symlink, and reached through
/// its descriptor from then on.
#[derive(Debug)]
struct Dir {
    /// The open directory; `base` stays valid while it is open.
    fd: File,
    /// `/proc/self/fd/N` (its entries resolve in the opened directory), or
    /// the path itself where `/proc` is not mounted.
    base: PathBuf,
    /// The path, for messages.
    path: PathBuf,
}

/// What is under a name in a directory (not followed).
enum Entry {
    Absent,
    File(std::fs::Metadata),
    Other(std::fs::Metadata),
}

impl Dir {
    fn from_file(fd: File, path: PathBuf) -> Result<Dir> {
        let proc = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let me = fd.metadata().map_err(|e| Error::io(&path, "stat", e))?;
        let base = match std::fs::metadata(&proc) {
            Ok(m) if m.is_dir() && (m.dev(), m.ino()) == (me.dev(), me.ino()) => proc,
            _ => path.clone(),
        };
        Ok(Dir { fd, base, path })
    }

    /// The pki dir (the store's directory, followed as given).
    fn open_root(path: &Path) -> Result<Dir> {
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| Error::io(path, "open directory", e))?;
        Dir::from_file(fd, path.to_path_buf())
    }

    fn at(&self, name: &str) -> PathBuf {
        self.base.join(name)
    }

    fn shown(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The state directory `name`, not followed; None when absent.
    fn sub(&self, name: &str) -> Result<Option<Dir>> {
        let shown = self.shown(name);
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.at(name))
        {
            Ok(fd) => Dir::from_file(fd, shown).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                Err(not_a_dir(&shown))
            }
            Err(e) => Err(Error::io(&shown, "open directory", e)),
        }
    }

    /// The state directory `name`, created (0755, `own`'s owner) when
    /// absent, its creation made durable.
    fn sub_or_create(&self, name: &str, own: &Ownership) -> Result<Dir> {
        if let Some(d) = self.sub(name)? {
            return Ok(d);
        }
        let shown = self.shown(name);
        match std::fs::DirBuilder::new().mode(0o755).create(self.at(name)) {
            Ok(()) => {
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
                self.sync()?;
                Ok(d)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => self
                .sub(name)?
                .ok_or_else(|| Error::io(&shown, "open directory", not_found())),
            Err(e) => Err(Error::io(&shown, "create directory", e)),
        }
    }

    fn entry(&self, name: &str) -> Result<Entry> {
        match std::fs::symlink_metadata(self.at(name)) {
            Ok(m) if m.is_file() => Ok(Entry::File(m)),
            Ok(m) => Ok(Entry::Other(m)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Entry::Absent),
            Err(e) => Err(Error::io(self.shown(name), "stat", e)),
        }
    }

    /// The content of the regular file `name` when it is `len` bytes long
    /// (at most `len + 1` bytes are read), without following a symlink.
    fn read(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        let shown = self.shown(name);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(self.at(name))
            .map_err(|e| Error::io(&shown, "open", e))?;
        let m = f.metadata().map_err(|e| Error::io(&shown, "stat", e))?;
        if !m.is_file() {
            return Err(not_a_key_file(&shown, &m));
        }
        let mut out = Vec::with_capacity(len as usize);
        f.take(len + 1)
            .read_to_end(&mut out)
            .map_err(|e| Error::io(&shown, "read", e))?;
        Ok(out)
    }

    /// Whether `name` is a regular file holding exactly `pem`.
    fn holds(&self, name: &str, pem: &[u8]) -> Result<bool> {
        match self.entry(name)? {
            Entry::File(m) if m.len() == pem.len() as u64 => Ok(self.read(name, m.len())? == pem),
            _ => Ok(false),
        }
    }

    /// Writes `pem` under `name`, first half: a temporary file (0600,
    /// `own`'s owner, or the replaced file's), written, not yet fsynced. Staging a group of files before committing any lets
    /// the first fsync carry the data of all of them (one journal commit
    /// instead of one per file on ext4 and XFS).
    fn stage(&self, name: &str, pem: &[u8], own: &Ownership, op: &'static str) -> Result<Staged> {
        let shown = self.shown(name);
        let mut own = match self.entry(name)? {
            Entry::Other(m) => return Err(not_a_key_file(&shown, &m)),
            Entry::File(_) => own.replacing(&self.at(name)),
            Entry::Absent => *own,
        };
        own.mode = 0o600;
        let tmp = format!("{TEMP_PREFIX}{}.{name}", std::process::id());
        let tmp_shown = self.shown(&tmp);
        if let Entry::File(_) = self.entry(&tmp)? {
            std::fs::remove_file(self.at(&tmp)).map_err(|e| Error::io(&tmp_shown, op, e))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.at(&tmp))
            .map_err(|e| Error::io(&tmp_shown, op, e))?;
        let done = own
            .apply(&f, &tmp_shown)
            .and_then(|()| f.write_all(pem).map_err(|e| Error::io(&tmp_shown, op, e)));
        match done {
            Ok(()) => Ok(Staged {
                file: f,
                tmp,
                name: name.to_owned(),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(self.at(&tmp));
                Err(e)
            }
        }
    }

    /// Second half of a write: fsync, then the rename over the name
    /// (refused if a non-regular entry was planted there meanwhile). The
    /// directory is not fsynced (see [`Dir::sync`]).
    fn commit(&self, st: Staged, op: &'static str) -> Result<()> {
        let shown = self.shown(&st.name);
        let done = st
            .file
            .sync_data()
            .map_err(|e| Error::io(self.shown(&st.tmp), op, e))
            .and_then(|()| match self.entry(&st.name)? {
                Entry::Other(m) => Err(not_a_key_file(&shown, &m)),
                _ => std::fs::rename(self.at(&st.tmp), self.at(&st.name))
                    .map_err(|e| Error::io(&shown, op, e)),
            });
        if done.is_err() {
            let _ = std::fs::remove_file(self.at(&st.tmp));
        }
        done
    }

    /// Removes a staged temporary that will not be committed.
    fn discard(&self, st: Staged) {
        let _ = std::fs::remove_file(self.at(&st.tmp));
    }

    /// Removes the regular file `name`; a non-regular entry is refused.
    /// Returns whether a file was removed.
    fn remove(&self, name: &str, op: &'static str) -> Result<bool> {
        let shown = self.shown(name);
        match self.entry(name)? {
            Entry::Absent => Ok(false),
            Entry::Other(m) => Err(not_a_key_file(&shown, &m)),
            Entry::File(_) => match std::fs::remove_file(self.at(name)) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(Error::io(&shown, op, e)),
            },
        }
    }

    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync(&self) -> Result<()> {
        self.fd
            .sync_all()
            .map_err(|e| Error::io(&self.path, "fsync", e))
    }

    /// The names in the directory.
    fn names(&self) -> Result<Vec<std::ffi::OsString>> {
        let rd = std::fs::read_dir(&self.base)
            .map_err(|e| Error::io(&self.path, "read directory", e))?;
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| Error::io(&self.path, "read directory", e))?;
            out.push(ent.file_name());
        }
        Ok(out)
    }
}

/// A key file written under its temporary name ([`Dir::stage`]).
struct Staged {
    file: File,
    tmp: String,
    name: String,
}

/// How many files are staged before they are committed (each holds a
/// descriptor open).
const GROUP: usize = 128;

/// Writes `items` (state directory, name, key) with [`Dir::stage`] and
/// [`Dir::commit`], in
/// groups: each group's temporaries are all written before the first is
/// fsynced and renamed.
fn write_many(
    dirs: &[Option<Dir>; 4],
    items: &[(usize, &str, &[u8], Ownership)],
    op: &'static str,
) -> Result<()> {
    for group in items.chunks(GROUP) {
        let mut staged: Vec<(usize, Staged)> = Vec::with_capacity(group.len());
        let mut failed = None;
        for (d, name, pem, own) in group {
            let Some(dir) = &dirs[*d] else { continue };
            match dir.stage(name, pem, own, op) {
                Ok(st) => staged.push((*d, st)),
                Err(e) => {
                    failed = Some(e);
                    break;
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

/// The key file an id should have in each state directory (None: no file).
pub(crate) type Want = [Option<Vec<u8>>; 4];

/// What the tree should hold for an id that the `keys` bank holds as
/// `keys` and the `denied_keys` bank as `denied`. Values that hold a
/// private key block get no file.
pub(crate) fn want_of(keys: Option<(KeyState, Vec<u8>)>, denied: Option<Vec<u8>>) -> Want {
    let mut w: Want = Default::default();
    if let Some((s, pem)) = keys {
        if !crate::pem::holds_private_key(&pem) {
            w[dir_of(s)] = Some(pem);
        }
    }
    if let Some(pem) = denied {
        if !crate::pem::holds_private_key(&pem) {
            w[DENIED] = Some(pem);
        }
    }
    w
}

fn dir_of(s: KeyState) -> usize {
    match s {
        KeyState::Accepted => 0,
        KeyState::Pending => 1,
        KeyState::Rejected => 2,
    }
}

/// What the store holds for an id, for a report.
fn held(keys: Option<KeyState>, denied: bool, dir: usize) -> Option<&'static str> {
    if dir == DENIED {
        denied.then_some("denied")
    } else {
        keys.map(KeyState::name)
    }
}

/// Ownership of the tree's new files: the store's (its bank files' owner,
/// the pki dir's by default).
fn ownership(store: &Store) -> Ownership {
    store.keys_table().ownership()
}

/// The tree writes of one batch, planned (and checked) before the banks
/// are written: [`Sync::plan`], [`Sync::before`], the bank write, then
/// [`Sync::after`].
pub(crate) struct Sync {
    root: Dir,
    dirs: [Option<Dir>; 4],
    own: Ownership,
    /// `minions/<id>` files to remove before the banks are written.
    early: Vec<String>,
    /// Owner and group of the `early` files: the files written in their
    /// place keep them, as a replaced file does.
    kept: std::collections::HashMap<String, (u32, u32)>,
    changes: TreeChanges,
}

impl Sync {
    /// Looks at every entry the batch's ids have in the tree. An entry
    /// under an id's name that is not a regular file, or a state directory
    /// that is not one, fails here, before anything is written.
    pub(crate) fn plan(store: &Store, wants: &[(MinionId, Want)]) -> Result<Sync> {
        let root = Dir::open_root(store.dir())?;
        let mut dirs: [Option<Dir>; 4] = Default::default();
        for (d, name) in TREE_DIRS.iter().enumerate() {
            dirs[d] = root.sub(name)?;
        }
        let mut early = Vec::new();
        let mut kept = std::collections::HashMap::new();
        for (id, want) in wants {
            let id = id.as_str();
            for (d, dir) in dirs.iter().enumerate() {
                let Some(dir) = dir else { continue };
                match dir.entry(id)? {
                    Entry::Absent => {}
                    Entry::Other(m) => return Err(not_a_key_file(&dir.shown(id), &m)),
                    Entry::File(m) => {
                        if d == ACCEPTED {
                            let keep = match &want[d] {
                                Some(pem) if m.len() == pem.len() as u64 => {
                                    dir.read(id, m.len())? == *pem
                                }
                                _ => false,
                            };
                            if !keep {
                                early.push(id.to_owned());
                                kept.insert(id.to_owned(), (m.uid(), m.gid()));
                            }
                        }
                    }
                }
            }
        }
        Ok(Sync {
            root,
            dirs,
            own: ownership(store),
            early,
            kept,
            changes: TreeChanges::default(),
        })
    }

    /// Step 1: removes the `minions/<id>` files that the store will not
    /// vouch for once the batch is written, durably.
    pub(crate) fn before(&mut self) -> Result<()> {
        if self.early.is_empty() {
            return Ok(());
        }
        let Some(dir) = &self.dirs[ACCEPTED] else {
            return Ok(());
        };
        for id in &self.early {
            if dir.remove(id, "remove (before the store leaves accepted)")? {
                self.changes.removed.push(dir.shown(id));
            }
        }
        dir.sync()
    }

    /// Step 3, once the banks hold `wants`: writes the files that are
    /// missing or different, then removes those that no longer belong,
    /// fsyncing files and directories.
    pub(crate) fn after(mut self, wants: &[(MinionId, Want)]) -> Result<TreeChanges> {
        const W: &str =
            "write the key tree after the store changed (keycache verify --repair mends it)";
        const R: &str =
            "remove from the key tree after the store changed (keycache verify --repair mends it)";
        let mut touched = [false; 4];
        for (d, name) in TREE_DIRS.iter().enumerate() {
            if wants.iter().any(|(_, w)| w[d].is_some()) && self.dirs[d].is_none() {
                self.dirs[d] = Some(self.root.sub_or_create(name, &self.own)?);
            }
        }
        let mut items: Vec<(usize, &str, &[u8], Ownership)> = Vec::new();
        for (id, want) in wants {
            let id = id.as_str();
            for (d, pem) in want.iter().enumerate() {
                let (Some(pem), Some(dir)) = (pem, &self.dirs[d]) else {
                    continue;
                };
                if dir.holds(id, pem)? {
                    continue;
                }
                let own = match self.kept.get(id) {
                    Some(&(uid, gid)) if d == ACCEPTED && !self.own.explicit => Ownership {
                        owner: Some((uid, gid)),
                        ..self.own
                    },
                    _ => self.own,
                };
                items.push((d, id, pem, own));
                self.changes.written.push(dir.shown(id));
                touched[d] = true;
            }
        }
        write_many(&self.dirs, &items, W)?;
        for (d, dir) in self.dirs.iter().enumerate() {
            if let (true, Some(dir)) = (touched[d], dir) {
                dir.sync()?;
            }
        }
        let mut removed = [false; 4];
        for (id, want) in wants {
            let id = id.as_str();
            for (d, dir) in self.dirs.iter().enumerate() {
                let Some(dir) = dir else { continue };
                if want[d].is_none() && dir.remove(id, R)? {
                    self.changes.removed.push(dir.shown(id));
                    removed[d] = true;
                }
            }
        }
        for (d, dir) in self.dirs.iter().enumerate() {
            if let (true, Some(dir)) = (removed[d], dir) {
                dir.sync()?;
            }
        }
        Ok(self.changes)
    }
}

/// Takes `flock` on the `keys` bank's lock file (the lock every keycache
/// writer, and Salt's, holds while it writes), shared or exclusive, for as
/// long as the returned file is open. None when there is no lock file and
/// `create` is false (no writer ever wrote the bank).
fn bank_lock(store: &Store, exclusive: bool) -> Result<Option<File>> {
    let path = crate::format::lock_path(store.keys_table().path());
    let f = match crate::files::open_regular(&path, true) {
        Ok(f) => f,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            if !exclusive {
                return Ok(None);
            }
            match crate::files::create_new(&path, &ownership(store)) {
                Ok(f) => f,
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    crate::files::open_regular(&path, true)?
                }
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    if exclusive {
        f.lock().map_err(|e| Error::io(&path, "flock", e))?;
    } else {
        f.lock_shared().map_err(|e| Error::io(&path, "flock", e))?;
    }
    Ok(Some(f))
}

/// The store's view, per state directory: id -> key (withheld ids apart).
struct Wanted {
    files: [BTreeMap<String, Vec<u8>>; 4],
    withheld: [BTreeSet<String>; 4],
    /// id -> its state in the `keys` bank.
    states: BTreeMap<String, KeyState>,
    /// ids with a denied key.
    denied: BTreeSet<String>,
}

fn wanted(store: &Store) -> Result<Wanted> {
    let mut w = Wanted {
        files: Default::default(),
        withheld: Default::default(),
        states: BTreeMap::new(),
        denied: BTreeSet::new(),
    };
    for r in store.keys(None)? {
        let (id, e) = r?;
        let d = dir_of(e.state);
        w.states.insert(id.clone(), e.state);
        if crate::pem::holds_private_key(&e.public_key) {
            w.withheld[d].insert(id);
        } else {
            w.files[d].insert(id, e.public_key);
        }
    }
    for r in store.denied_keys()? {
        let (id, pem) = r?;
        w.denied.insert(id.clone());
        if crate::pem::holds_private_key(&pem) {
            w.withheld[DENIED].insert(id);
        } else {
            w.files[DENIED].insert(id, pem);
        }
    }
    Ok(w)
}

/// The comparison behind [`check`] and [`mend`].
fn compare(root: &Dir, w: &Wanted) -> Result<Vec<TreeDisagreement>> {
    let mut out = Vec::new();
    for (d, name) in TREE_DIRS.iter().enumerate() {
        let dis = |problem, id: Option<&str>, path: PathBuf| TreeDisagreement {
            problem,
            dir: TREE_DIRS[d],
            id: id.map(str::to_owned),
            store: id.and_then(|id| held(w.states.get(id).copied(), w.denied.contains(id), d)),
            path,
        };
        let dir = match root.sub(name) {
            Ok(dir) => dir,
            Err(Error::NotARegularFile { path, .. }) => {
                out.push(dis(TreeProblem::NotADirectory, None, path));
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut present = BTreeSet::new();
        if let Some(dir) = &dir {
            let mut names = dir.names()?;
            names.sort();
            for n in names {
                let Some(n) = n.to_str() else { continue };
                if n.starts_with(TEMP_PREFIX) {
                    out.push(dis(TreeProblem::TempFile, None, dir.shown(n)));
                    continue;
                }
                if n.starts_with('.') || crate::id::validate(n).is_err() {
                    continue;
                }
                present.insert(n.to_owned());
                let path = dir.shown(n);
                match dir.entry(n)? {
                    Entry::Absent => {
                        present.remove(n);
                    }
                    Entry::Other(_) => out.push(dis(TreeProblem::NotAFile, Some(n), path)),
                    Entry::File(m) => match w.files[d].get(n) {
                        Some(pem) => {
                            if m.len() != pem.len() as u64 || dir.read(n, m.len())? != *pem {
                                out.push(dis(TreeProblem::KeyDiffers, Some(n), path));
                            }
                        }
                        None if w.withheld[d].contains(n) => {
                            out.push(dis(TreeProblem::Withheld, Some(n), path))
                        }
                        None => out.push(dis(TreeProblem::Stray, Some(n), path)),
                    },
                }
            }
        }
        for id in w.files[d].keys() {
            if !present.contains(id) {
                out.push(dis(
                    TreeProblem::Missing,
                    Some(id),
                    root.shown(name).join(id),
                ));
            }
        }
    }
    Ok(out)
}

/// Every disagreement between the `localfs_key` tree in the store's
/// directory and the store: a key file in a state directory for an id not
/// in that state ([`TreeProblem::Stray`]), a missing file for an id in a
/// state ([`TreeProblem::Missing`]), different key bytes
/// ([`TreeProblem::KeyDiffers`]), entries that are not regular files,
/// state directories that are not directories, leftover temporaries. In
/// directory order (`minions`, `minions_pre`, `minions_rejected`,
/// `minions_denied`), then by name; [`TreeDisagreement::grants_access`]
/// tells those that let a minion pass Salt's `validate_token`.
///
/// Reads only. It holds a shared `flock` on the `keys` bank's lock file
/// while it reads, so that a keycache writer's bank and tree writes are
/// seen both or neither. Meant for a store that keeps a tree (see
/// [`TreeSync::auto`]): without one, every key is reported missing.
pub fn check(store: &Store) -> Result<Vec<TreeDisagreement>> {
    let _lock = bank_lock(store, false)?;
    let root = Dir::open_root(store.dir())?;
    let w = wanted(store)?;
    compare(&root, &w)
}

/// Makes the tree in the store's directory equal to the store: stray key
/// files in `minions/` are removed first (and that removal made durable),
/// then missing and different files are written (temporary file, fsync,
/// rename, as a tree write does; missing state directories are created),
/// then the other stray files and leftover temporaries are removed.
/// Entries that are not regular files and state directories that are not
/// directories are left alone and listed in [`TreeRepair::refused`].
/// Holds the `keys` bank's lock (`flock`, exclusive) throughout, as
/// writers do.
pub fn mend(store: &Store) -> Result<TreeRepair> {
    const W: &str = "write (mending the key tree)";
    const R: &str = "remove (mending the key tree)";
    let _lock = bank_lock(store, true)?;
    let root = Dir::open_root(store.dir())?;
    let w = wanted(store)?;
    let found = compare(&root, &w)?;
    let own = ownership(store);
    let mut out = TreeRepair::default();
    let mut dirs: [Option<Dir>; 4] = Default::default();
    for (d, name) in TREE_DIRS.iter().enumerate() {
        dirs[d] = match root.sub(name) {
            Ok(dir) => dir,
            Err(Error::NotARegularFile { .. }) => None,
            Err(e) => return Err(e),
        };
    }
    let removal = |x: &TreeDisagreement| {
        matches!(
            x.problem,
            TreeProblem::Stray | TreeProblem::Withheld | TreeProblem::TempFile
        )
    };
    let name_of = |x: &TreeDisagreement| -> String {
        x.path
            .file_name()
            .map(OsStr::as_bytes)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    // 1. What lets a minion in that the store does not vouch for.
    if let Some(dir) = &dirs[ACCEPTED] {
        let mut any = false;
        for x in found
            .iter()
            .filter(|x| x.dir == TREE_DIRS[ACCEPTED] && removal(x))
        {
            if dir.remove(&name_of(x), R)? {
                out.removed.push(x.path.clone());
                any = true;
            }
        }
        if any {
            dir.sync()?;
        }
    }
    // 2. Missing and different files.
    let mut wrote = [false; 4];
    let mut items: Vec<(usize, &str, &[u8], Ownership)> = Vec::new();
    for x in &found {
        let d = TREE_DIRS.iter().position(|n| *n == x.dir).unwrap_or(0);
        match x.problem {
            TreeProblem::Missing | TreeProblem::KeyDiffers => {}
            TreeProblem::NotAFile | TreeProblem::NotADirectory => {
                out.refused.push(x.clone());
                continue;
            }
            _ => continue,
        }
        let Some(id) = &x.id else { continue };
        let Some(pem) = w.files[d].get(id) else {
            continue;
        };
        if dirs[d].is_none() {
            if std::fs::symlink_metadata(root.at(x.dir)).is_ok() {
                // Not a directory: refused above (NotADirectory).
                continue;
            }
            dirs[d] = Some(root.sub_or_create(x.dir, &own)?);
        }
        items.push((d, id.as_str(), pem.as_slice(), own));
        out.written.push(x.path.clone());
        wrote[d] = true;
    }
    write_many(&dirs, &items, W)?;
    // 3. The other directories' strays, and leftover temporaries.
    let mut removed = [false; 4];
    for x in found.iter().filter(|x| x.dir != TREE_DIRS[ACCEPTED]) {
        if !removal(x) {
            continue;
        }
        let d = TREE_DIRS.iter().position(|n| *n == x.dir).unwrap_or(0);
        let Some(dir) = &dirs[d] else { continue };
        if dir.remove(&name_of(x), R)? {
            out.removed.push(x.path.clone());
            removed[d] = true;
        }
    }
    for (d, dir) in dirs.iter().enumerate() {
        if let (true, Some(dir)) = (wrote[d] || removed[d], dir) {
            dir.sync()?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{pem, small_store};
    use crate::{OpenOptions, Params};
    use std::os::unix::fs::PermissionsExt;

    fn store(dir: &Path) -> Store {
        small_store(dir).with_tree(TreeSync::On)
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v = Vec::new();
        for d in TREE_DIRS {
            if let Ok(rd) = std::fs::read_dir(dir.join(d)) {
                for e in rd {
                    v.push(format!("{d}/{}", e.unwrap().file_name().to_string_lossy()));
                }
            }
        }
        v.sort();
        v
    }

    #[test]
    fn the_library_writes_keep_the_tree_in_step() -> Result<()> {
        let t = tempfile::tempdir().unwrap();
        let st = store(t.path());
        assert_eq!(TreeSync::auto(t.path()), TreeSync::Off);
        let (a, b) = (MinionId::new("a")?, MinionId::new("b")?);
        st.put(&a, KeyState::Pending, &pem("a"))?;
        assert_eq!(files(t.path()), ["minions_pre/a"]);
        assert_eq!(TreeSync::auto(t.path()), TreeSync::Off);
        st.set_state(&a, KeyState::Accepted)?;
        assert_eq!(files(t.path()), ["minions/a"]);
        assert_eq!(TreeSync::auto(t.path()), TreeSync::On);
        let m = std::fs::metadata(t.path().join("minions/a")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        let m = std::fs::metadata(t.path().join("minions")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o755);
        // Re-keyed while accepted: the file follows.
        st.put(&a, KeyState::Accepted, &pem("a2"))?;
        assert_eq!(
            std::fs::read(t.path().join("minions/a")).unwrap(),
            pem("a2")
        );
        st.deny(&b, &pem("b"))?;
        st.put(&b, KeyState::Rejected, &pem("b1"))?;
        assert_eq!(
            files(t.path()),
            ["minions/a", "minions_denied/b", "minions_rejected/b"]
        );
        assert!(st.remove_denied(&b)?);
        assert!(st.remove(&a)?);
        assert!(!st.remove(&a)?);
        assert_eq!(files(t.path()), ["minions_rejected/b"]);
        let (_, _, ch) = st.batch_with_tree(|x| x.set_state(&b, KeyState::Accepted))?;
        assert_eq!(ch.written, [t.path().join("minions/b")]);
        assert_eq!(ch.removed, [t.path().join("minions_rejected/b")]);
        assert_eq!(check(&st)?, vec![]);
        // Off: the banks only.
        let st = store(t.path()).with_tree(TreeSync::Off);
        st.remove(&b)?;
        assert_eq!(files(t.path()), ["minions/b"]);
        let found = check(&st)?;
        assert_eq!(found.len(), 1);
        assert!(found[0].grants_access());
        let r = mend(&st)?;
        assert_eq!(r.removed, [t.path().join("minions/b")]);
        assert_eq!(files(t.path()), Vec::<String>::new());
        Ok(())
    }

    #[test]
    fn a_table_full_batch_leaves_banks_and_tree_alone() -> Result<()> {
        let t = tempfile::tempdir().unwrap();
        let opts = OpenOptions {
            params: Params {
                size: 4,
                ..Params::default()
            },
            ..OpenOptions::default()
        };
        let st = Store::open_with(t.path(), &opts)?.with_tree(TreeSync::On);
        let a = MinionId::new("a")?;
        st.put(&a, KeyState::Accepted, &pem("a"))?;
        let r = st.batch(|x| {
            x.remove(&a)?;
            for i in 0..10 {
                x.put(
                    &MinionId::new(format!("n{i}"))?,
                    KeyState::Pending,
                    &pem("n"),
                )?;
            }
            Ok(())
        });
        assert!(matches!(r, Err(Error::TableFull { .. })), "{r:?}");
        assert_eq!(files(t.path()), ["minions/a"]);
        assert_eq!(check(&st)?, vec![]);
        Ok(())
    }
}
