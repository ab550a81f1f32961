//! The way back: a store written out as a `localfs_key` tree, with the files
//! and modes Salt's `localfs_key` creates (key files 0600 through a
//! temporary file and a rename, as Salt 3008 writes them; a new pki dir
//! 0700 and new state directories 0755, as Salt's `verify_env` makes them).
//!
//! An export is "mend another directory": the tree at the given pki dir is
//! read, compared and written with [`crate::tree`]'s reader and writer
//! (state directories opened without following a link, key files compared
//! with [`crate::files::read_small`], written through `.keycache-tree.*`
//! temporaries, fsync and rename, removed only when regular files), with
//! export's own wording of refusals and its own mode rule: a key file that
//! replaces another keeps that file's mode narrowed to 0600 at most.
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
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::store::Store;
use crate::tree::{write_many, Dir, Item, Node, TreeDir, Writer, DURABLE_ALL};

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

/// The names of one state directory's entries that are the tree's key
/// files ([`crate::tree::is_key_name`], or an id in `held`), and the ones
/// left alone and reported (`ignored`). An absent directory has none.
fn tree_files(
    dir: Option<&Dir>,
    held: &dyn Fn(&str) -> bool,
    ignored: &mut Vec<String>,
) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let Some(dir) = dir else { return Ok(out) };
    for name in dir.names()? {
        match name.to_str() {
            Some(id) if held(id) || crate::tree::is_key_name(id) => {
                out.insert(id.to_owned());
            }
            // Salt's key-list cache and keycache's own files: silently.
            Some(n) if n == crate::tree::SALT_KEY_CACHE => {}
            Some(n) if n.starts_with(crate::tree::KEYCACHE_PREFIX) => {}
            _ => ignored.push(dir.shown(&name).display().to_string()),
        }
    }
    Ok(out)
}

/// The directory a new pki dir is created in (`.` for a bare name).
fn parent_of(pki_dir: &Path) -> &Path {
    match pki_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates the pki dir `path` (0700, owned as its parent) when absent; an
/// entry there that is not a directory (a symlink included) is refused.
fn ensure_pki_dir(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Writer::Export.not_a_dir(path)),
        Err(_) => {
            let own = Ownership::for_dir(parent_of(path))?;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(path)
                .map_err(|e| Error::io(path, "create directory", e))?;
            if let Some((uid, gid)) = own.owner {
                let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
            }
            Ok(())
        }
    }
}

/// The pki dir `pki_dir` opened without following its state directories
/// (None: absent); an entry there that is not a directory is refused.
fn open_root(pki_dir: &Path) -> Result<Option<Dir>> {
    match std::fs::symlink_metadata(pki_dir) {
        Ok(m) if !m.is_dir() => Err(Writer::Export.not_a_dir(pki_dir)),
        Ok(_) => Dir::open_root(pki_dir, Writer::Export).map(Some),
        Err(_) => Ok(None),
    }
}

/// Writes every key of `store` into the tree at `pki_dir` and removes the
/// key files of ids the store no longer holds in that state (see the
/// module's documentation); with `dry_run`, only reports what it would do.
/// The tree at `pki_dir` is mended with [`crate::tree`]'s reader and
/// writer, as the store's own tree is.
pub fn export(store: &Store, pki_dir: &Path, opts: &ExportOptions) -> Result<Exported> {
    const W: &str = "write (exporting the key tree)";
    const R: &str = "remove (exporting the key tree)";
    let mut out = Exported {
        dry_run: opts.dry_run,
        ..Exported::default()
    };
    // What the store holds, per state directory, read in full before any
    // file is touched.
    let mut wanted: [Wanted; 4] = Default::default();
    let mut withheld: [BTreeSet<String>; 4] = Default::default();
    let denied = TreeDir::MinionsDenied.index();
    for r in store.keys(None)? {
        let (id, e) = r?;
        let d = TreeDir::of(e.state).index();
        if crate::pem::holds_private_key(&e.public_key) {
            withheld[d].insert(id);
        } else {
            wanted[d].insert(id, e.public_key);
        }
    }
    for r in store.denied_keys()? {
        let (id, pem) = r?;
        if crate::pem::holds_private_key(&pem) {
            withheld[denied].insert(id);
        } else {
            wanted[denied].insert(id, pem);
        }
    }
    for d in &withheld {
        out.withheld.extend(d.iter().cloned());
    }
    out.withheld.sort();

    // The plan: what to write, what to remove; refused entries fail here.
    let root = open_root(pki_dir)?;
    let mut writes: Vec<(usize, &str, &[u8])> = Vec::new();
    let mut removes: Vec<(usize, String)> = Vec::new();
    let held = |id: &str| {
        wanted.iter().any(|w| w.contains_key(id)) || withheld.iter().any(|w| w.contains(id))
    };
    for td in TreeDir::ALL {
        let d = td.index();
        let dir = match &root {
            Some(root) => root.sub(td.name())?,
            None => None,
        };
        let dir = dir.as_ref();
        let path = |id: &str| pki_dir.join(td.name()).join(id);
        let shown = |id: &str| path(id).display().to_string();
        let present = tree_files(dir, &held, &mut out.ignored)?;
        for (id, pem) in &wanted[d] {
            crate::id::validate(id)?;
            let node = match dir {
                Some(dir) => dir.entry(id)?,
                None => Node::Absent,
            };
            match (node, dir) {
                (Node::Other(m), _) => {
                    return Err(Writer::Export.not_a_key_file(&path(id), m.not_regular()));
                }
                (Node::File(m), Some(dir)) => {
                    if m.len() == pem.len() as u64 && dir.content_is(id, pem)? {
                        out.unchanged += 1;
                        continue;
                    }
                    if td == TreeDir::Minions {
                        // The old key would keep passing validate_token.
                        out.replaced.push(shown(id));
                    } else if !opts.force {
                        out.conflicts.push(shown(id));
                        continue;
                    }
                }
                _ => {}
            }
            writes.push((d, id.as_str(), pem.as_slice()));
        }
        for id in present {
            if wanted[d].contains_key(&id) || (withheld[d].contains(&id) && td != TreeDir::Minions)
            {
                continue;
            }
            if let Some(dir) = dir {
                if let Node::Other(m) = dir.entry(&id)? {
                    return Err(Writer::Export.not_a_key_file(&path(&id), m.not_regular()));
                }
            }
            removes.push((d, id));
        }
    }
    out.written = writes.len() as u64;
    out.removed = removes
        .iter()
        .map(|(d, id)| {
            pki_dir
                .join(TreeDir::ALL[*d].name())
                .join(id)
                .display()
                .to_string()
        })
        .collect();
    out.removed.sort();
    out.ignored.sort();
    if opts.dry_run {
        return Ok(out);
    }

    // Writes first, then removals: a key that moves (pending to accepted,
    // accepted to rejected) is in both directories for a moment, and
    // Salt's precedence (rejected, then pending, then accepted) then gives
    // it the less trusted state, never the more trusted one.
    drop(root);
    ensure_pki_dir(pki_dir)?;
    let own = Ownership::for_dir(pki_dir)?;
    let root = Dir::open_root(pki_dir, Writer::Export)?;
    let mut dirs: [Option<Dir>; 4] = Default::default();
    for td in TreeDir::ALL {
        dirs[td.index()] = Some(root.sub_or_create(td.name(), &own)?);
    }
    let items: Vec<Item<'_>> = writes
        .iter()
        .map(|&(dir, name, pem)| Item {
            dir,
            name,
            pem,
            own,
            absent: false,
        })
        .collect();
    write_many(&dirs, &items, DURABLE_ALL, W)?;
    for dir in dirs.iter().flatten() {
        dir.sync()?;
    }
    // What an export killed before its renames left.
    for dir in dirs.iter().flatten() {
        for p in dir.remove_dead_temporaries(R)? {
            out.removed.push(p.display().to_string());
        }
    }
    for (d, id) in &removes {
        if let Some(dir) = &dirs[*d] {
            dir.remove(id, R)?;
        }
    }
    if !removes.is_empty() {
        for dir in dirs.iter().flatten() {
            dir.sync()?;
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
