//! Reading the master's key files where Salt's `localfs_key` serves them
//! ([`collect`]), never following a symlink.

use std::path::{Path, PathBuf};

use super::{
    store_dir, Collected, MasterKeyFile, MasterKeyOptions, MasterKeySkip, MasterKeySkipReason,
};
use crate::error::{Error, Result};

/// The entries of `pki_dir` that show that the master has a key pair of
/// its own: a `master.pem` entry (a regular file before Salt 3008, a
/// symlink to `<master_id>.pem` since), and every other regular `*.pem`
/// file but the signing key's (`<master_sign_key_name>.pem`). When there
/// are some, a migration that stores none of them under the names
/// `MasterKeys` looks for ([`super::MasterKeysReport::holds_master_pair`]) would
/// have Salt replace the master's identity by a new pair. Nothing is
/// followed or read.
pub fn own_key_files(pki_dir: &Path, opts: &MasterKeyOptions) -> Result<Vec<PathBuf>> {
    let sign = format!("{}.pem", opts.master_sign_key_name);
    let mut out = Vec::new();
    for (name, path) in entries(pki_dir)? {
        let Some(name) = name else { continue };
        if name == "master.pem" {
            out.push(path);
            continue;
        }
        if name.starts_with('.') || !name.ends_with(".pem") || name == sign {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).map_err(|e| Error::io(&path, "lstat", e))?;
        if meta.is_file() {
            out.push(path);
        }
    }
    Ok(out)
}

/// Reads the files Salt 3008.5's localfs_key serves under `master_keys`
/// names: the `pki_dir` names of [`MasterKeyOptions::pki_dir_names`] from
/// `pki_dir`, and every other name from `cluster_pki_dir` (a master with a
/// `cluster_id`) or else `pki_dir`: its `.pem`/`.pub` files, the signature
/// and `peers/*.pub`. Symlinks are never followed (files are opened with
/// `O_NOFOLLOW`); dot-files and directories other than `peers` are ignored.
pub fn collect(
    pki_dir: &Path,
    cluster_pki_dir: Option<&Path>,
    opts: &MasterKeyOptions,
) -> Result<Collected> {
    let pinned = opts.pki_dir_names();
    let signature = opts.signature_name();
    let cachedir = store_dir(pki_dir, cluster_pki_dir);
    let same_dir = cachedir == pki_dir;
    let mut out = Collected::default();

    for name in &pinned {
        take(&mut out, name, &pki_dir.join(name), opts);
    }

    for (name, path) in entries(cachedir)? {
        let Some(name) = name else {
            out.skipped.push(skip(
                &path.to_string_lossy(),
                &path,
                MasterKeySkipReason::NonUtf8Name,
            ));
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).map_err(|e| Error::io(&path, "lstat", e))?;
        if meta.is_dir() {
            if name == "peers" {
                peers(&mut out, &path, opts)?;
            }
            continue;
        }
        if pinned.contains(&name) {
            if !same_dir {
                out.skipped
                    .push(skip(&name, &path, MasterKeySkipReason::WrongDir));
            }
            continue;
        }
        if name.ends_with(".pem") || name.ends_with(".pub") || name == signature {
            take(&mut out, &name, &path, opts);
        } else if meta.file_type().is_symlink() {
            out.skipped
                .push(skip(&name, &path, MasterKeySkipReason::Symlink));
        } else {
            out.skipped
                .push(skip(&name, &path, MasterKeySkipReason::NotAKeyName));
        }
    }

    legacy_pair(&mut out, opts);
    out.files.sort_by(|a, b| a.name.cmp(&b.name));
    out.skipped.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A tree from before Salt 3008 holds the master's pair as regular
/// `master.pem`/`master.pub` and no `<master_id>.pem`/`.pub`. On its first
/// start Salt's `_setup_keys` copies them to the id-named entries and serves
/// those from then on (crypt.py `MasterKeys._setup_keys`). Store them under
/// both names, so that a `<master_id>.pem` already in the bank (one that
/// Salt generated when it found the bank empty) cannot take their place.
fn legacy_pair(out: &mut Collected, opts: &MasterKeyOptions) {
    let mid = opts.master_id();
    if mid == "master" {
        return;
    }
    let has = |out: &Collected, n: &str| {
        out.files.iter().any(|f| f.name == n) || out.skipped.iter().any(|s| s.name == n)
    };
    if has(out, &format!("{mid}.pem")) || has(out, &format!("{mid}.pub")) {
        return;
    }
    let pair: Vec<MasterKeyFile> = ["pem", "pub"]
        .iter()
        .filter_map(|ext| {
            let f = out
                .files
                .iter()
                .find(|f| f.name == format!("master.{ext}"))?;
            Some(MasterKeyFile {
                name: format!("{mid}.{ext}"),
                ..f.clone()
            })
        })
        .collect();
    if pair.len() == 2 {
        out.files.extend(pair);
    }
}

/// `peers/*.pub` of the cluster pki dir.
fn peers(out: &mut Collected, dir: &Path, opts: &MasterKeyOptions) -> Result<()> {
    for (name, path) in entries(dir)? {
        let Some(name) = name else {
            out.skipped.push(skip(
                &format!("peers/{}", path.to_string_lossy()),
                &path,
                MasterKeySkipReason::NonUtf8Name,
            ));
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let full = format!("peers/{name}");
        if name.ends_with(".pub") {
            take(out, &full, &path, opts);
        } else {
            out.skipped
                .push(skip(&full, &path, MasterKeySkipReason::NotAKeyName));
        }
    }
    Ok(())
}

/// The entries of a directory (absent: none), names decoded when UTF-8.
fn entries(dir: &Path) -> Result<Vec<(Option<String>, PathBuf)>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, "read_dir", e)),
    };
    let mut v = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io(dir, "read_dir", e))?;
        v.push((e.file_name().to_str().map(str::to_string), e.path()));
    }
    v.sort();
    Ok(v)
}

pub(super) fn skip(name: &str, path: &Path, reason: MasterKeySkipReason) -> MasterKeySkip {
    MasterKeySkip {
        name: name.to_string(),
        path: path.to_path_buf(),
        reason,
        detail: None,
    }
}

/// Reads `path` for `name` into `out`, or records why not. An absent file
/// is neither.
fn take(out: &mut Collected, name: &str, path: &Path, opts: &MasterKeyOptions) {
    match read_key_file(path, opts.max_file_bytes) {
        Ok(Some(bytes)) => out.files.push(MasterKeyFile {
            name: name.to_string(),
            path: path.to_path_buf(),
            bytes,
        }),
        Ok(None) => {}
        Err((reason, detail)) => out.skipped.push(MasterKeySkip {
            name: name.to_string(),
            path: path.to_path_buf(),
            reason,
            detail,
        }),
    }
}

type Refusal = (MasterKeySkipReason, Option<String>);

/// Opens `path` without following a symlink and reads it whole; `Ok(None)`
/// when it does not exist.
fn read_key_file(path: &Path, max: u64) -> std::result::Result<Option<Vec<u8>>, Refusal> {
    use crate::files::{NotRegular, Refused};
    let mut bytes = Vec::new();
    match crate::files::read_small(path, max, &mut bytes) {
        Ok(_) => {}
        Err(Refused::Io("open", e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(Refused::NotRegular(NotRegular::Symlink)) => {
            return Err((MasterKeySkipReason::Symlink, None))
        }
        Err(Refused::NotRegular(_)) => return Err((MasterKeySkipReason::NotARegularFile, None)),
        Err(Refused::TooLarge(_)) => return Err((MasterKeySkipReason::TooLarge, None)),
        Err(Refused::Io(_, e)) => {
            return Err((MasterKeySkipReason::Unreadable, Some(e.to_string())))
        }
    }
    if bytes.is_empty() {
        return Err((MasterKeySkipReason::Empty, None));
    }
    if std::str::from_utf8(&bytes).is_err() || bytes.last() == Some(&0) {
        return Err((MasterKeySkipReason::NotText, None));
    }
    Ok(Some(bytes))
}
