//! The `master_keys` bank's files: opened with new files 0600 or narrower,
//! and existing ones (Salt's `MmapCache` creates them with its umask)
//! narrowed.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::format::{self, MASTER_INDEX};
use crate::table::{OpenOptions, Table};

/// Narrows every regular bank file ([`format::bank_files`]) wider than
/// 0600 to `mode & 0600`; returns the files changed. Symlinks are not
/// followed (the table refuses them anyway).
pub(super) fn tighten(index: &Path) -> Result<Vec<PathBuf>> {
    let mut changed = Vec::new();
    for p in format::bank_files(index) {
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(crate::files::NO_FOLLOW)
            .open(&p)
        {
            Ok(f) => f,
            Err(_) => continue,
        };
        let meta = f.metadata().map_err(|e| Error::io(&p, "stat", e))?;
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_file() && mode & !0o600 != 0 {
            f.set_permissions(std::fs::Permissions::from_mode(mode & 0o600))
                .map_err(|e| Error::io(&p, "chmod", e))?;
            changed.push(p);
        }
    }
    Ok(changed)
}

/// Opens the `master_keys` bank of `dir` for a driver that reads and
/// writes it entry by entry (Salt's `master_keys` bank: private keys
/// among the values): files it creates are mode 0600 or narrower (owner
/// from `opts.ownership`, else `dir`'s), and existing bank files wider than
/// that (Salt's mmap_key creates them with its umask) are narrowed first.
pub fn open_bank(dir: &Path, opts: &OpenOptions) -> Result<Table> {
    let index = dir.join(MASTER_INDEX);
    tighten(&index)?;
    Table::open(index, &private_options(dir, opts)?)
}

/// The `master_keys` bank beside the key bank `keys` (in its directory),
/// for a rebuild of every bank Salt opens with one `mmap_key_size`: `None`
/// when it has no index file. It is opened with `keys`' layout but for the
/// table size, which is read off its own index (a compaction made before
/// keycache moved `master_keys` along left it at the old size), so that it
/// can be rebuilt into the size of the key banks; its new files are 0600 or
/// narrower (the rebuild keeps them so, [`crate::rebuild`]).
pub(crate) fn bank_beside(keys: &Table) -> Result<Option<Table>> {
    let dir = keys.path().parent().unwrap_or(Path::new("."));
    let index = dir.join(MASTER_INDEX);
    let meta = match std::fs::symlink_metadata(&index) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&index, "lstat", e)),
    };
    let mut params = *keys.params();
    let slot = params.slot_size as u64;
    if meta.is_file() && slot > 0 && meta.len() > 0 && meta.len() % slot == 0 {
        params.size = meta.len() / slot;
    }
    let own = keys.ownership();
    let opts = OpenOptions {
        params,
        ownership: Some(Ownership {
            mode: own.mode & 0o600,
            ..own
        }),
        rebuild_settle: keys.rebuild_settle(),
        ..OpenOptions::default()
    };
    Table::open(index, &opts).map(Some)
}

/// `opts` with the owner of new files kept and their mode never wider than
/// 0600.
pub(super) fn private_options(dir: &Path, opts: &OpenOptions) -> Result<OpenOptions> {
    let own = match opts.ownership {
        Some(o) => o,
        None => Ownership::for_dir(dir)?,
    };
    Ok(OpenOptions {
        ownership: Some(Ownership {
            mode: own.mode & 0o600,
            ..own
        }),
        ..opts.clone()
    })
}
