//! The way back: a store written out as a `localfs_key` tree, with the files
//! and modes Salt's `localfs_key` creates (key files 0600 through a
//! temporary file and a rename, as Salt 3008 writes them; a new pki dir
//! 0700 and new state directories 0755, as Salt's `verify_env` makes them).
//!
//! An export makes the tree equal to the store: into a tree exported
//! earlier, it also removes the key files of ids that are no longer in that
//! state (deleted, accepted out of `minions_pre`, ...), so that a master
//! reading the tree never keeps a key the store revoked.
//!
//! What belongs to the tree: in each state directory, the files whose names
//! are minion ids, dot-ids such as `.m` included, except Salt's
//! `.key_cache` and keycache's own files (`.keycache-*`), as
//! [`crate::tree::is_key_name`] says (Salt's `validate_token` reads
//! `minions/.m`, so a dot-id's file is a key like any other); an id the
//! store holds is the tree's whatever its name. Other entries (names Salt
//! would refuse, names that are not UTF-8) are left alone and reported
//! ([`Exported::ignored`]); `.key_cache` and keycache's files are left alone
//! silently.
//!
//! A key file that differs from the store's key: in `minions/` it is
//! always replaced ([`Exported::replaced`]), since Salt's `validate_token`
//! would keep letting the old key in and turn the accepted one away; in
//! the other state directories (which let no minion in) it is left alone
//! and reported ([`Exported::conflicts`]) unless
//! [`ExportOptions::force`]: a file changed there by hand is not
//! overwritten unasked. A file in `minions/` under an id whose stored value
//! is withheld (it holds a private key block) is removed, as a key the
//! store does not vouch for.
//!
//! The whole export is planned before anything is written: the store is
//! read, every file it would replace or remove is looked at (never
//! following a symlink), and an entry it can neither replace nor remove (a
//! symlink, a directory or any other non-regular file under a key's name)
//! fails the export with [`Error::NotARegularFile`] before a file changes.
//! `dry_run` stops after the plan. Values that hold a private key block
//! ([`crate::pem::holds_private_key`]) are never written: they are listed in
//! [`Exported::withheld`], and a file already in the tree under that id is
//! left as it is, except in `minions/` (see above).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::{self, Ownership};
use crate::migrate::TREE_DIRS;
use crate::store::Store;

/// Index of `minions/` in [`TREE_DIRS`].
const ACCEPTED: usize = 0;

/// How to export ([`export`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Also overwrite the key files of `minions_pre/`, `minions_rejected/`
    /// and `minions_denied/` whose content differs from the store's (those
    /// of `minions/` are always replaced).
    pub force: bool,
    /// Plan and report, write and remove nothing.
    pub dry_run: bool,
}

/// What an export did (or, dry, would do).
#[derive(Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Exported {
    /// Nothing was written or removed.
    pub dry_run: bool,
    /// Files written (new or changed), or to write when dry.
    pub written: u64,
    /// Files already identical.
    pub unchanged: u64,
    /// Files that differ and were left alone (no `force`; never in
    /// `minions/`).
    pub conflicts: Vec<String>,
    /// Files of `minions/` that held another key than the one the store
    /// accepts, replaced with the store's (or to replace when dry), with or
    /// without `force`; counted in `written` too.
    pub replaced: Vec<String>,
    /// Key files of ids the store no longer holds in that state, removed
    /// (or to remove when dry), sorted.
    pub removed: Vec<String>,
    /// Entries of the state directories that are not the tree's (not a
    /// minion id), left alone, sorted.
    pub ignored: Vec<String>,
    /// Ids whose value holds a private key block: not written, sorted.
    pub withheld: Vec<String>,
}

/// The key files the store asks for in one state directory: id -> value.
type Wanted = BTreeMap<String, Vec<u8>>;

/// A write the plan makes: state directory, id, value.
struct Write1<'a> {
    dir: usize,
    id: &'a str,
    pem: &'a [u8],
}

fn ensure_dir(path: &Path, mode: u32, own: &Ownership) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(not_a_dir(path)),
        Err(_) => {
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(path)
                .map_err(|e| Error::io(path, "create directory", e))?;
            if let Some((uid, gid)) = own.owner {
                let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
            }
            Ok(())
        }
    }
}

fn not_a_dir(path: &Path) -> Error {
    Error::NotARegularFile {
        path: path.into(),
        why: "expected a directory (symlinks are not followed)",
    }
}

/// The refusal for an entry under a key's name that is not a regular file.
fn not_a_key_file(path: &Path, m: &std::fs::Metadata) -> Error {
    Error::NotARegularFile {
        path: path.into(),
        why: if m.file_type().is_symlink() {
            "a symlink in place of a key file: export neither follows, replaces nor removes it; \
             remove it, then export again"
        } else if m.is_dir() {
            "a directory in place of a key file: export neither replaces nor removes it; \
             remove it, then export again"
        } else {
            "not a regular file in place of a key file: export neither replaces nor removes it; \
             remove it, then export again"
        },
    }
}

/// Whether the regular file `path` holds exactly `pem` (read without
/// following a symlink; a file of another length is not read).
fn same_content(path: &Path, len: u64, pem: &[u8]) -> Result<bool> {
    if len != pem.len() as u64 {
        return Ok(false);
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, "open", e))?;
    let mut cur = Vec::with_capacity(pem.len());
    Read::by_ref(&mut f)
        .take(len + 1)
        .read_to_end(&mut cur)
        .map_err(|e| Error::io(path, "read", e))?;
    Ok(cur == pem)
}

/// The entries of one state directory that are the tree's key files (id ->
/// path: [`crate::tree::is_key_name`], or an id in `held`), and the ones
/// left alone and reported (`ignored`). An absent directory has none.
fn tree_files(
    dir: &Path,
    held: &dyn Fn(&str) -> bool,
    ignored: &mut Vec<String>,
) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(not_a_dir(dir)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(dir, "stat", e)),
    }
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "read directory", e))?;
    for ent in rd {
        let ent = ent.map_err(|e| Error::io(dir, "read directory", e))?;
        let name = ent.file_name();
        match name.to_str() {
            Some(id) if held(id) || crate::tree::is_key_name(id) => {
                out.insert(id.to_owned(), ent.path());
            }
            // Salt's key-list cache and keycache's own files: silently.
            Some(n) if n == crate::tree::SALT_KEY_CACHE => {}
            Some(n) if n.starts_with(crate::tree::KEYCACHE_PREFIX) => {}
            _ => ignored.push(ent.path().display().to_string()),
        }
    }
    Ok(out)
}

fn write_key(dir: &Path, id: &str, pem: &[u8], own: &Ownership) -> Result<()> {
    crate::id::validate(id)?;
    let path = dir.join(id);
    // A file replacing another keeps its owner, and its mode narrowed to
    // 0600 at most: never wider than what it replaces.
    let mut own = own.replacing(&path);
    own.mode &= 0o600;
    let own = &own;
    let tmp = dir.join(format!(".keycache-export.{}.{id}", std::process::id()));
    files::remove_if_exists(&tmp)?;
    let mut f: File = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| Error::io(&tmp, "create", e))?;
    own.apply(&f, &tmp)?;
    f.write_all(pem).map_err(|e| Error::io(&tmp, "write", e))?;
    files::sync_data(&f, &tmp)?;
    // rename() replaces the name itself: a symlink planted since the plan
    // looked is replaced, never followed.
    files::rename(&tmp, &path)
}

/// Removes the key file `path`, which the plan found a regular file; an
/// entry that became something else since is refused, not removed.
fn remove_key(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => files::remove_if_exists(path),
        Ok(m) => Err(not_a_key_file(path, &m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, "stat", e)),
    }
}

/// The directory a new pki dir is created in (`.` for a bare name).
fn parent_of(pki_dir: &Path) -> &Path {
    match pki_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes every key of `store` into the tree at `pki_dir` and removes the
/// key files of ids the store no longer holds in that state (see the
/// module's documentation); with `dry_run`, only reports what it would do.
pub fn export(store: &Store, pki_dir: &Path, opts: &ExportOptions) -> Result<Exported> {
    let mut out = Exported {
        dry_run: opts.dry_run,
        ..Exported::default()
    };
    // What the store holds, per state directory, read in full before any
    // file is touched.
    let mut wanted: [Wanted; 4] = Default::default();
    let mut withheld: [BTreeSet<String>; 4] = Default::default();
    let dir_index = |name: &str| TREE_DIRS.iter().position(|d| *d == name).unwrap_or(0);
    for r in store.keys(None)? {
        let (id, e) = r?;
        let d = dir_index(e.state.dir_name());
        if crate::pem::holds_private_key(&e.public_key) {
            withheld[d].insert(id);
        } else {
            wanted[d].insert(id, e.public_key);
        }
    }
    for r in store.denied_keys()? {
        let (id, pem) = r?;
        if crate::pem::holds_private_key(&pem) {
            withheld[3].insert(id);
        } else {
            wanted[3].insert(id, pem);
        }
    }
    for d in &withheld {
        out.withheld.extend(d.iter().cloned());
    }
    out.withheld.sort();

    // The plan: what to write, what to remove; refused entries fail here.
    match std::fs::symlink_metadata(pki_dir) {
        Ok(m) if !m.is_dir() => return Err(not_a_dir(pki_dir)),
        _ => {}
    }
    let mut writes: Vec<Write1<'_>> = Vec::new();
    let mut removes: Vec<PathBuf> = Vec::new();
    let held = |id: &str| {
        wanted.iter().any(|w| w.contains_key(id)) || withheld.iter().any(|w| w.contains(id))
    };
    for (d, name) in TREE_DIRS.iter().enumerate() {
        let dir = pki_dir.join(name);
        let present = tree_files(&dir, &held, &mut out.ignored)?;
        for (id, pem) in &wanted[d] {
            crate::id::validate(id)?;
            let path = dir.join(id);
            match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&path, "stat", e)),
                Ok(m) if !m.is_file() => return Err(not_a_key_file(&path, &m)),
                Ok(m) => {
                    if same_content(&path, m.len(), pem)? {
                        out.unchanged += 1;
                        continue;
                    }
                    if d == ACCEPTED {
                        // The old key would keep passing validate_token.
                        out.replaced.push(path.display().to_string());
                    } else if !opts.force {
                        out.conflicts.push(path.display().to_string());
                        continue;
                    }
                }
            }
            writes.push(Write1 { dir: d, id, pem });
        }
        for (id, path) in present {
            if wanted[d].contains_key(&id) || (withheld[d].contains(&id) && d != ACCEPTED) {
                continue;
            }
            let m = std::fs::symlink_metadata(&path).map_err(|e| Error::io(&path, "stat", e))?;
            if !m.is_file() {
                return Err(not_a_key_file(&path, &m));
            }
            removes.push(path);
        }
    }
    out.written = writes.len() as u64;
    out.removed = removes.iter().map(|p| p.display().to_string()).collect();
    out.removed.sort();
    out.ignored.sort();
    if opts.dry_run {
        return Ok(out);
    }

    // Writes first, then removals: a key that moves (pending to accepted,
    // accepted to rejected) is in both directories for a moment, and
    // Salt's precedence (rejected, then pending, then accepted) then gives
    // it the less trusted state, never the more trusted one.
    ensure_dir(pki_dir, 0o700, &Ownership::for_dir(parent_of(pki_dir))?)?;
    let own = Ownership::for_dir(pki_dir)?;
    for d in TREE_DIRS {
        ensure_dir(&pki_dir.join(d), 0o755, &own)?;
    }
    for w in &writes {
        write_key(&pki_dir.join(TREE_DIRS[w.dir]), w.id, w.pem, &own)?;
    }
    for d in TREE_DIRS {
        files::sync_dir(&pki_dir.join(d))?;
    }
    for p in &removes {
        remove_key(p)?;
    }
    if !removes.is_empty() {
        for d in TREE_DIRS {
            files::sync_dir(&pki_dir.join(d))?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{pem, small_store as store};
    use crate::{KeyState, MinionId};

    #[test]
    fn a_bare_relative_name_has_the_current_directory_as_parent() {
        assert_eq!(parent_of(Path::new("out")), Path::new("."));
        assert_eq!(parent_of(Path::new("a/out")), Path::new("a"));
        assert_eq!(parent_of(Path::new("/out")), Path::new("/"));
    }

    #[test]
    fn export_follows_the_store_and_dry_run_writes_nothing() -> Result<()> {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("s")).unwrap();
        let st = store(&t.path().join("s"));
        let tree = t.path().join("tree");
        let (a, b) = (MinionId::new("a")?, MinionId::new("b")?);
        st.put(&a, KeyState::Pending, &pem("a"))?;
        st.put(&b, KeyState::Accepted, &pem("b"))?;
        let r = export(&st, &tree, &ExportOptions::default())?;
        assert_eq!((r.written, r.removed.len()), (2, 0));
        st.set_state(&a, KeyState::Accepted)?;
        st.remove(&b)?;
        let dry = export(
            &st,
            &tree,
            &ExportOptions {
                dry_run: true,
                ..ExportOptions::default()
            },
        )?;
        assert!(dry.dry_run);
        assert_eq!(dry.written, 1);
        assert_eq!(dry.removed.len(), 2);
        assert!(tree.join("minions/b").exists() && tree.join("minions_pre/a").exists());
        assert!(!tree.join("minions/a").exists());
        let r = export(&st, &tree, &ExportOptions::default())?;
        assert_eq!(r.removed, dry.removed);
        assert!(!tree.join("minions/b").exists() && !tree.join("minions_pre/a").exists());
        assert_eq!(std::fs::read(tree.join("minions/a")).unwrap(), pem("a"));
        Ok(())
    }
}
