//! The `localfs_key` tree kept in step with the store.
//!
//! Salt 3008.5's `ReqServerChannel.validate_token` (salt/channel/server.py)
//! reads `<pki_dir or cluster_pki_dir>/minions/<id>` straight from disk on
//! every AES request of a signed-in minion, bypassing the key cache driver:
//! under `mmap_key`, a key accepted only in the banks fails every request,
//! and a key deleted or rejected only in the banks keeps passing as long as
//! its old file is there. A store with [`TreeSync::On`]
//! ([`crate::Store::set_tree`]) therefore writes the tree along with the banks, in
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
//! Only `minions/` is fsynced, its files and its entries. The files of
//! `minions_pre/`, `minions_rejected/` and `minions_denied/` let no minion
//! in (Salt reads them from the banks under `mmap_key`; `validate_token`
//! reads `minions/` alone), so they are written through a temporary file
//! and a rename with no fsync: a kill loses nothing (the page cache keeps
//! them), and a power cut can lose such a file or leave it empty, which
//! [`check`] reports and [`mend`] writes again. A pending key renamed into
//! `minions/` on its accept has its data made durable before the rename.
//!
//! A state directory that was absent when the batch began and that the
//! batch writes many files into (a new replica's tree, a migration into
//! another directory) is filled under a temporary name in the pki dir
//! (`.keycache-tree.<pid>.<dir>`, a dot-name Salt passes over), its files
//! created under their own names, then made durable at once when it is
//! `minions/` (one write-back of the filesystem), and renamed into place
//! without replacing anything, the pki dir fsynced: one rename instead of
//! one a file, and a reader finds no directory, then every file. Should the
//! directory appear meanwhile (Salt's `verify_env` makes the four), each
//! file is moved into it instead. A kill before the rename leaves the
//! temporary directory: the next writer removes it as it finishes the
//! killed writer's tree, [`check`] reports it and [`mend`] removes it.
//!
//! Each entry of the batch's ids is looked at once, in 1 (`Sync::plan`);
//! in 3 only the entries found then are looked at again, and `minions/`
//! always: keycache's writers hold the `keys` bank's lock from 1 to 3, and
//! a file someone else plants in `minions/` meanwhile is still removed.
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
//! fsyncs a `minions/` file before the rename and the directory after it
//! (see above for the other directories), and creates
//! a missing state directory 0755 with the pki dir's owner. The pki dir's
//! own mode is never changed.
//!
//! # No symlink is followed
//!
//! The state directories are opened relative to the pki dir without
//! following a symlink, and every file is reached relative to its opened
//! directory (the `*at` system calls on its descriptor), never by a path
//! that could be re-resolved through a planted symlink; key files are opened with
//! `O_NOFOLLOW`. A symlink, a directory or any other non-regular file under
//! a key's name (or in place of a state directory) is neither followed,
//! replaced nor removed: a write that would have to is refused with
//! [`Error::NotARegularFile`] naming the path before the banks or the tree
//! change, and [`mend`] lists it in [`TreeRepair::refused`].
//!
//! What belongs to the tree in a state directory ([`is_key_name`], as for
//! [`crate::export`]): every entry whose name is a valid minion id, dot-ids
//! such as `.m` included, except Salt's `.key_cache` and keycache's own
//! files (names starting with `.keycache-`); an id the store holds is the
//! tree's whatever its name. Salt 3008.5 treats a dot-id as an id:
//! `valid_id` accepts it, `validate_token` reads `minions/.m`, and
//! `localfs_key`'s `fetch`, `contains` and `list` find it (`list` skips
//! only `.key_cache`); only `list_all` and `pki.migrate_to_mmap` skip the
//! dot-names of the three key directories. Leftover temporaries of a
//! writer killed mid-write (`.keycache-tree.*`) are reported and removed
//! by [`mend`].
//!
//! [`mend`] refuses a store that does not exist (no `keys` bank index): a
//! tree made equal to an empty store loses every key file
//! ([`require_store`]).
//!
//! Values that hold a private key block ([`crate::pem::holds_private_key`])
//! are never written to the tree: such an id gets no file (and one there is
//! removed).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::{NotRegular, Ownership};
use crate::id::MinionId;
use crate::key::KeyState;
pub use crate::key::TreeDir;

pub use crate::format::{KEYCACHE_PREFIX, TREE_TEMP_PREFIX as TEMP_PREFIX};

/// The file Salt's key-list cache leaves in a state directory: Salt 3008.5's
/// `localfs_key.list` skips it by name and `fetch` refuses it; never a key.
pub const SALT_KEY_CACHE: &str = ".key_cache";

/// Whether `name`, an entry of a state directory, names a key file: a valid
/// minion id ([`crate::id::validate`]: dot-ids such as `.m` included, as
/// Salt's `valid_id` and `validate_token` take them) other than
/// [`SALT_KEY_CACHE`] and keycache's own files ([`KEYCACHE_PREFIX`]).
pub fn is_key_name(name: &str) -> bool {
    crate::id::validate(name).is_ok()
        && name != SALT_KEY_CACHE
        && !name.starts_with(KEYCACHE_PREFIX)
}

/// The store as the tree sees it: where it is, who owns its files, what
/// its two banks hold. [`crate::Store`] is one (`store` implements it);
/// the tree knows nothing else of the store, which it lies below: the
/// store's writes call the tree ([`TreeSync`]), never the other way.
pub trait KeySource {
    /// The store's directory: the pki dir whose tree is kept in step.
    fn dir(&self) -> &Path;
    /// The `keys` bank's index file (the bank's lock file is beside it;
    /// its absence means there is no store).
    fn keys_index(&self) -> &Path;
    /// Owner and mode of the store's files (new key files and state
    /// directories get that owner).
    fn ownership(&self) -> Ownership;
    /// Calls `f` with every entry of the `keys` bank: id, state, public key.
    fn each_key(&self, f: &mut dyn FnMut(String, KeyState, Vec<u8>)) -> Result<()>;
    /// Calls `f` with every entry of the `denied_keys` bank: id, public key.
    fn each_denied(&self, f: &mut dyn FnMut(String, Vec<u8>)) -> Result<()>;
    /// The state directories kept in step ([`TreeSync::dirs`]): all four
    /// unless the source says otherwise.
    fn tree_dirs(&self) -> &'static [TreeDir] {
        &TreeDir::ALL
    }
}

/// Whether a [`crate::Store`]'s writes keep the `localfs_key` tree of its
/// directory in step ([`crate::Store::set_tree`]). The library's default is
/// [`TreeSync::Off`]; [`TreeSync::auto`] is the CLI's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
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
    /// Only `minions/`, the one directory Salt 3008.5 reads behind the key
    /// cache driver (`validate_token`), is kept in step, in the same order
    /// as [`TreeSync::On`]; `minions_pre/`, `minions_rejected/` and
    /// `minions_denied/` are neither written nor removed from, nor
    /// compared by [`check`] and [`mend`]. A sign-in (a new pending key)
    /// then writes no file; going back to `localfs_key` needs the whole
    /// tree first ([`crate::export`], or a repair with [`TreeSync::On`]).
    Accepted,
}

impl TreeSync {
    /// [`TreeSync::On`] when `dir` holds a tree (a `minions` entry exists
    /// there, not followed: a migrated master whose Salt still reads
    /// `minions/<id>`), else [`TreeSync::Off`]. A `minions` that is a
    /// symlink counts as a tree: the writes then refuse it by name rather
    /// than leave Salt reading a tree that is out of step.
    pub fn auto(dir: &Path) -> TreeSync {
        match std::fs::symlink_metadata(dir.join(TreeDir::Minions.name())) {
            Ok(m) if m.is_dir() || m.file_type().is_symlink() => TreeSync::On,
            _ => TreeSync::Off,
        }
    }

    /// Whether the tree (or its `minions/` alone) is written.
    pub fn is_on(self) -> bool {
        self != TreeSync::Off
    }

    /// The state directories kept in step, compared and mended: `minions/`
    /// alone for [`TreeSync::Accepted`], else all four (for
    /// [`TreeSync::Off`] too: what a [`check`] or [`mend`] of a store that
    /// does not write its tree looks at).
    pub fn dirs(self) -> &'static [TreeDir] {
        match self {
            TreeSync::Accepted => &TreeDir::ALL[..1],
            TreeSync::On | TreeSync::Off => &TreeDir::ALL,
        }
    }
}

/// The bit mask (bit [`TreeDir::index`]) of `dirs`.
pub(crate) fn dir_mask(dirs: &[TreeDir]) -> u8 {
    dirs.iter().fold(0, |m, d| m | 1 << d.index())
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
    /// The state directory (serialized as Salt's folder name: `minions`,
    /// `minions_pre`, `minions_rejected` or `minions_denied`).
    pub dir: TreeDir,
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
        self.dir == TreeDir::Minions
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

/// The refusals of an entry in the way of the tree's writes (a symlink, a
/// directory, another file type under a key's name): turning the key tree
/// off (the CLI's `--tree never`, the driver's `keycache_tree: false`)
/// avoids them; [`in_the_way`] tells them.
const IN_THE_WAY: [&str; 3] = [
    "a symlink in place of a key file of the tree: keycache neither follows, replaces nor \
     removes it; remove it (or turn the key tree off), then try again",
    "a directory in place of a key file of the tree: keycache neither replaces nor removes it; \
     remove it (or turn the key tree off), then try again",
    "not a regular file in place of a key file of the tree: keycache neither replaces nor \
     removes it; remove it (or turn the key tree off), then try again",
];

/// What failed when the tree's files could not follow a store write that
/// was made (the store is right; a repair of the tree mends it):
/// [`out_of_step`] tells these errors.
const AFTER_WRITE: &str =
    "write the key tree after the store changed (a repair of the tree mends it)";
/// See [`AFTER_WRITE`].
const AFTER_REMOVE: &str =
    "remove from the key tree after the store changed (a repair of the tree mends it)";

/// Whether `e` refuses an entry in the way of the key tree's writes (a
/// symlink, a directory or another file type under a key's name): a front
/// end can say how to turn the tree off.
pub fn in_the_way(e: &Error) -> bool {
    matches!(e, Error::NotARegularFile { why, .. } if IN_THE_WAY.contains(why))
}

/// Whether `e` is the failure of a key tree write after the store was
/// written: the store holds the change, the tree is out of step, and a
/// repair of the tree (the CLI's `verify --repair`) mends it.
pub fn out_of_step(e: &Error) -> bool {
    matches!(e, Error::Io { op, .. } if *op == AFTER_WRITE || *op == AFTER_REMOVE)
}

/// Who writes through a [`Dir`]: the tree kept in step with its store
/// (store writes, `verify --repair`, migrate), or an export into another
/// directory ([`crate::export`]). It decides the wording of refusals and
/// the mode of a file that replaces another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    /// The tree of the store's own directory.
    Tree,
    /// [`crate::export`].
    Export,
}

impl Writer {
    /// The refusal for an entry under a key's name that is not a regular
    /// file.
    pub(crate) fn not_a_key_file(self, path: &Path, kind: NotRegular) -> Error {
        let why = match (self, kind) {
            (Writer::Tree, NotRegular::Symlink) => IN_THE_WAY[0],
            (Writer::Tree, NotRegular::Directory) => IN_THE_WAY[1],
            (Writer::Tree, NotRegular::Other) => IN_THE_WAY[2],
            (Writer::Export, NotRegular::Symlink) => {
                "a symlink in place of a key file: export neither follows, replaces nor removes \
                 it; remove it, then export again"
            }
            (Writer::Export, NotRegular::Directory) => {
                "a directory in place of a key file: export neither replaces nor removes it; \
                 remove it, then export again"
            }
            (Writer::Export, NotRegular::Other) => {
                "not a regular file in place of a key file: export neither replaces nor removes \
                 it; remove it, then export again"
            }
        };
        Error::NotARegularFile {
            path: path.into(),
            why,
        }
    }

    /// The refusal for a state directory (or an export's pki dir) that is a
    /// symlink or not a directory.
    pub(crate) fn not_a_dir(self, path: &Path) -> Error {
        Error::NotARegularFile {
            path: path.into(),
            why: match self {
                Writer::Tree => {
                    "a state directory of the tree that is a symlink or not a directory: \
                     keycache does not follow it; replace it with a directory (or use --tree \
                     never)"
                }
                Writer::Export => "expected a directory (symlinks are not followed)",
            },
        }
    }

    /// The mode of a key file written where `own` (the new file's
    /// [`Ownership`], or the one of the regular file it replaces) says
    /// `mode`: 0600 for the tree; for an export, `mode` narrowed to 0600
    /// at most (never wider than what it replaces).
    fn key_mode(self, mode: u32) -> u32 {
        match self {
            Writer::Tree => 0o600,
            Writer::Export => mode & 0o600,
        }
    }
}

mod check;
mod dir;
mod intent;
mod listing;
mod sync;
#[cfg(test)]
mod tests;

pub use check::{check, mend, no_store, require_store};
pub(crate) use dir::{write_many, Dir, Item, Node, Opened, DURABLE_ALL, DURABLE_MINIONS};
pub(crate) use intent::Record as IntentRecord;
pub use intent::{Resumed, INTENT_FILE};
pub(crate) use listing::{create_state_dirs, ids_with_key_files};
pub(crate) use sync::remove_dead_temporaries;
use sync::{held, ownership};
pub(crate) use sync::{want_of, Sync, Want};
