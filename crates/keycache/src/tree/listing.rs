//! The tree as a migration into another directory meets it: the ids that
//! already have key files there, and the state directories created as
//! Salt's `verify_env` makes them.

use super::*;

/// The ids that have a key file in a state directory of `dir`'s tree, the
/// tree a migration writes into: every name [`is_key_name`] takes, dot-ids
/// included (Salt's `validate_token` reads `minions/.m` as it reads any
/// id's file; only the source tree's scan leaves dot-files aside, as
/// `pki.migrate_to_mmap` does), none for a directory that is absent.
/// Nothing is followed: a state directory that is not a directory is
/// refused, as the tree writer refuses it.
pub(crate) fn ids_with_key_files(dir: &Path) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for d in TreeDir::NAMES {
        let path = dir.join(d);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::NotARegularFile {
                    path,
                    why: "a state directory of the key tree that is a symlink or not a \
                          directory: keycache does not follow it; replace it with a directory",
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&path, "lstat", e)),
        }
        for e in std::fs::read_dir(&path).map_err(|e| Error::io(&path, "read directory", e))? {
            let e = e.map_err(|e| Error::io(&path, "read directory", e))?;
            if let Some(name) = e.file_name().to_str() {
                if is_key_name(name) {
                    out.insert(name.to_owned());
                }
            }
        }
    }
    Ok(out)
}

/// Creates the state directories of the store's tree that are missing
/// (0755, owned as the store's files, the creation made durable), as
/// Salt's `verify_env` makes them.
pub(crate) fn create_state_dirs(store: &dyn KeySource) -> Result<()> {
    let dir = store.dir();
    let owner = store.ownership().owner;
    let mut created = false;
    for d in TreeDir::NAMES {
        let path = dir.join(d);
        match std::fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => created = true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(&path, "create directory", e)),
        }
        if let Some((uid, gid)) = owner {
            match std::os::unix::fs::lchown(&path, Some(uid), Some(gid)) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                Err(e) => return Err(Error::io(&path, "chown", e)),
            }
        }
    }
    if created {
        crate::files::sync_dir(dir)?;
    }
    Ok(())
}
