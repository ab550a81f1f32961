//! The master's key pair written out of the `master_keys` bank as the two
//! files Salt's multi-master setup copies to a second master (`master.pem`,
//! `master.pub`): under `mmap_key` (and keycache) there is no `master.pem` on
//! disk to copy. The private key goes to a file created 0600, new (never
//! over an existing file, never through a symlink), never to a stream.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::MASTER_INDEX;
use crate::table::{OpenOptions, Table};

use super::MasterKeyOptions;

/// What [`write_pair`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PairReport {
    /// The bank entries the pair was read from (`<master_id>.pem` and
    /// `.pub`, or `master.pem` and `master.pub`).
    pub from: [String; 2],
    /// The private key's file (mode 0600).
    pub pem: PathBuf,
    /// The public key's file (mode 0644).
    pub public: PathBuf,
}

/// Writes the master's key pair, as Salt's `MasterKeys._setup_keys` would
/// use it from the `master_keys` bank of `dir` (`<master_id>.pem`/`.pub`,
/// else `master.pem`/`.pub`), to `to/master.pem` (0600) and
/// `to/master.pub` (0644). `to` is created 0700 when missing; it must not
/// be a symlink, and neither file may exist already (nothing is written
/// then). A failure removes what this call created.
pub fn write_pair(
    dir: &Path,
    opts: &OpenOptions,
    mopts: &MasterKeyOptions,
    to: &Path,
) -> Result<PairReport> {
    let index = dir.join(MASTER_INDEX);
    match std::fs::symlink_metadata(&index) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::PkiDir {
                path: dir.to_path_buf(),
                why: format!(
                    "no master_keys bank here ({} is missing): migrate the master's keys \
                     first, or name the directory that holds the bank",
                    index.display()
                ),
            })
        }
        Err(e) => return Err(Error::io(&index, "lstat", e)),
    }
    let table = Table::open(index, opts)?;
    let mid = mopts.master_id();
    let (from, pem, public) = [format!("{mid}.pem"), "master.pem".to_string()]
        .into_iter()
        .find_map(|name| {
            let pub_name = format!("{}.pub", name.trim_end_matches(".pem"));
            let pem = table.get(name.as_bytes()).transpose()?;
            let public = table.get(pub_name.as_bytes()).transpose()?;
            Some((name, pub_name, pem, public))
        })
        .map(|(name, pub_name, pem, public)| Ok(([name, pub_name], pem?, public?)))
        .unwrap_or_else(|| {
            Err(Error::PkiDir {
                path: dir.to_path_buf(),
                why: format!(
                    "the master_keys bank holds no key pair of master id {mid:?} \
                     ({mid}.pem and {mid}.pub) nor master.pem and master.pub"
                ),
            })
        })?;
    check_pem(dir, &from[0], &pem.value, "PRIVATE KEY")?;
    check_pem(dir, &from[1], &public.value, "PUBLIC KEY")?;

    match std::fs::symlink_metadata(to) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::PkiDir {
                path: to.to_path_buf(),
                why: "not a directory (a symlink is not followed)".into(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(to)
                .map_err(|e| Error::io(to, "mkdir", e))?;
        }
        Err(e) => return Err(Error::io(to, "lstat", e)),
    }
    let pem_path = to.join("master.pem");
    let pub_path = to.join("master.pub");
    for p in [&pem_path, &pub_path] {
        if std::fs::symlink_metadata(p).is_ok() {
            return Err(Error::PkiDir {
                path: p.clone(),
                why: "already exists: remove it or write the pair to another directory; \
                      nothing was written"
                    .into(),
            });
        }
    }
    create(&pem_path, 0o600, &pem.value)?;
    if let Err(e) = create(&pub_path, 0o644, &public.value) {
        let _ = std::fs::remove_file(&pem_path);
        return Err(e);
    }
    if let Err(e) = File::open(to).and_then(|d| d.sync_all()) {
        let _ = std::fs::remove_file(&pem_path);
        let _ = std::fs::remove_file(&pub_path);
        return Err(Error::io(to, "fsync", e));
    }
    Ok(PairReport {
        from,
        pem: pem_path,
        public: pub_path,
    })
}

/// `value` (the bank entry `name` of `dir`) is a PEM block of `kind`.
fn check_pem(dir: &Path, name: &str, value: &[u8], kind: &str) -> Result<()> {
    let text = std::str::from_utf8(value).unwrap_or("");
    if text.contains("-----BEGIN ") && text.contains(kind) {
        return Ok(());
    }
    Err(Error::PkiDir {
        path: dir.to_path_buf(),
        why: format!("the master_keys entry {name} holds no PEM {kind}; nothing was written"),
    })
}

/// Creates `path` new with `mode` (no symlink followed, no file replaced),
/// writes `bytes` and syncs it; removes it again on a failure.
fn create(path: &Path, mode: u32, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, "create", e))?;
    let done = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(path, "write", e));
    if done.is_err() {
        let _ = std::fs::remove_file(path);
    }
    done
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::Params;

    const PEM: &[u8] = b"-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n";
    const PUB: &[u8] = b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n";

    fn opts() -> OpenOptions {
        OpenOptions {
            params: Params {
                size: 101,
                ..Params::default()
            },
            ..OpenOptions::default()
        }
    }

    /// A directory whose master_keys bank holds `entries`.
    fn bank(entries: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let t = super::super::open_bank(dir.path(), &opts()).unwrap();
        for (k, v) in entries {
            t.put(k.as_bytes(), v).unwrap();
        }
        dir
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn writes_the_id_named_pair_0600_into_a_new_0700_directory() {
        let dir = bank(&[("m1.pem", PEM), ("m1.pub", PUB), ("master.pem", b"other")]);
        let to = dir.path().join("pair");
        let r = write_pair(
            dir.path(),
            &opts(),
            &MasterKeyOptions::new("m1_master"),
            &to,
        )
        .unwrap();
        assert_eq!(r.from, ["m1.pem".to_string(), "m1.pub".to_string()]);
        assert_eq!(std::fs::read(&r.pem).unwrap(), PEM);
        assert_eq!(std::fs::read(&r.public).unwrap(), PUB);
        assert_eq!(mode(&to), 0o700);
        assert_eq!(mode(&r.pem), 0o600);
        assert_eq!(mode(&r.public) & 0o022, 0);
    }

    #[test]
    fn falls_back_to_master_pem_and_refuses_what_is_not_a_pair() {
        let dir = bank(&[("master.pem", PEM), ("master.pub", PUB)]);
        let to = dir.path().join("pair");
        let r = write_pair(dir.path(), &opts(), &MasterKeyOptions::new("m2"), &to).unwrap();
        assert_eq!(r.from[0], "master.pem");

        let dir = bank(&[("m1.pem", PUB), ("m1.pub", PUB)]);
        let to = dir.path().join("pair");
        let e = write_pair(dir.path(), &opts(), &MasterKeyOptions::new("m1"), &to).unwrap_err();
        assert!(e.to_string().contains("holds no PEM PRIVATE KEY"), "{e}");
        assert!(!to.join("master.pem").exists());

        let dir = bank(&[("m1.pem", PEM)]);
        let e = write_pair(dir.path(), &opts(), &MasterKeyOptions::new("m1"), &to).unwrap_err();
        assert!(e.to_string().contains("holds no key pair"), "{e}");

        let empty = tempfile::tempdir().unwrap();
        let e = write_pair(empty.path(), &opts(), &MasterKeyOptions::new("m1"), &to).unwrap_err();
        assert!(e.to_string().contains("no master_keys bank"), "{e}");
    }

    #[test]
    fn replaces_nothing_and_follows_no_symlink() {
        let dir = bank(&[("m1.pem", PEM), ("m1.pub", PUB)]);
        let m = MasterKeyOptions::new("m1");
        let to = dir.path().join("pair");
        std::fs::create_dir(&to).unwrap();
        std::fs::write(to.join("master.pub"), b"keep").unwrap();
        let e = write_pair(dir.path(), &opts(), &m, &to).unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
        assert!(!to.join("master.pem").exists());
        assert_eq!(std::fs::read(to.join("master.pub")).unwrap(), b"keep");

        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let e = write_pair(dir.path(), &opts(), &m, &link).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
