//! The way back: a store written out as a `localfs_key` tree, with the files
//! and modes Salt's `localfs_key` creates (key files 0600 through a
//! temporary file and a rename, as Salt 3008 writes them; a new pki dir
//! 0700 and new state directories 0755, as Salt's `verify_env` makes them).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};
use crate::files::{self, Ownership};
use crate::store::Store;

/// What an export did.
#[derive(Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Exported {
    /// Files written (new or changed).
    pub written: u64,
    /// Files already identical.
    pub unchanged: u64,
    /// Files that differ and were left alone (no `force`).
    pub conflicts: Vec<String>,
}

fn ensure_dir(path: &Path, mode: u32, own: &Ownership) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::NotARegularFile {
            path: path.into(),
            why: "expected a directory (symlinks are not followed)",
        }),
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

fn write_key(
    dir: &Path,
    id: &str,
    pem: &[u8],
    force: bool,
    own: &Ownership,
    out: &mut Exported,
) -> Result<()> {
    crate::id::validate(id)?;
    let path = dir.join(id);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_symlink() || !m.is_file() => {
            out.conflicts
                .push(format!("{} (not a regular file)", path.display()));
            return Ok(());
        }
        Ok(_) => {
            let cur = std::fs::read(&path).map_err(|e| Error::io(&path, "read", e))?;
            if cur == pem {
                out.unchanged += 1;
                return Ok(());
            }
            if !force {
                out.conflicts.push(path.display().to_string());
                return Ok(());
            }
        }
        Err(_) => {}
    }
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
    files::rename(&tmp, &path)?;
    out.written += 1;
    Ok(())
}

/// Writes every key of `store` into the tree at `pki_dir`.
pub fn export(store: &Store, pki_dir: &Path, force: bool) -> Result<Exported> {
    let mut out = Exported::default();
    ensure_dir(
        pki_dir,
        0o700,
        &Ownership::for_dir(pki_dir.parent().unwrap_or(Path::new(".")))?,
    )?;
    let own = Ownership::for_dir(pki_dir)?;
    for d in crate::migrate::TREE_DIRS {
        ensure_dir(&pki_dir.join(d), 0o755, &own)?;
    }
    for r in store.keys(None)? {
        let (id, e) = r?;
        write_key(
            &pki_dir.join(e.state.dir_name()),
            &id,
            &e.public_key,
            force,
            &own,
            &mut out,
        )?;
    }
    for r in store.denied_keys()? {
        let (id, pem) = r?;
        write_key(
            &pki_dir.join("minions_denied"),
            &id,
            &pem,
            force,
            &own,
            &mut out,
        )?;
    }
    for d in crate::migrate::TREE_DIRS {
        files::sync_dir(&pki_dir.join(d))?;
    }
    Ok(out)
}
