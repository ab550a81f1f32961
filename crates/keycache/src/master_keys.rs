//! The master's own keys: the `master_keys` bank.
//!
//! Salt 3008.5's `MasterKeys` (salt/crypt.py) reads the master's key pair,
//! the cluster key pair, the peers' public keys and the signing keys through
//! the key cache driver, from the bank `master_keys`. Under
//! `keys.cache_driver: localfs_key` those are files in `pki_dir` and
//! `cluster_pki_dir`; under `mmap_key` they are entries of
//! `D/.mmap_master.idx`, where D is `cluster_pki_dir` when `cluster_id` is
//! set, else `pki_dir` (mmap_key.py `init_kwargs`). A migration that leaves
//! that bank empty makes `MasterKeys._setup_keys` generate a new master key
//! pair, and every minion then refuses the master.
//!
//! [`collect`] reads the files that Salt's `localfs_key` serves under each
//! `master_keys` name, from where `localfs_key` reads them; [`write()`] stores
//! them as `mmap_key.store("master_keys", name, data)` does. The values are
//! private keys: nothing here prints them, reports carry names only, and
//! the bank's files are mode 0600 or narrower.
//!
//! # What Salt 3008.5 does (the facts this module follows)
//!
//! - **Value encoding** (salt/cache/mmap_key.py `store`): for `master_keys`,
//!   `raw = salt.utils.stringutils.to_bytes(data)`, then `MmapCache.put(key,
//!   raw)` (salt/utils/mmap_cache.py), which stores the bytes as they are: no
//!   state byte, no type marker, no serialization; a `str` is stored as its
//!   UTF-8 bytes and `bytes` unchanged, so both look the same on disk.
//!   `fetch` returns `raw.decode("utf-8", errors="replace").rstrip("\x00")`,
//!   and `{}` for an absent or empty (length 0) entry. So a file is stored
//!   as its exact bytes, and only files that are non-empty UTF-8 without
//!   trailing NULs come back from `fetch` unchanged.
//! - **Names and where `localfs_key` reads them** (salt/cache/localfs_key.py
//!   `init_kwargs`, `fetch`): `NON_CLUSTERED_MASTER_KEYS` (`master.pem`,
//!   `master.pub`, `<master_sign_key_name>.pem`/`.pub`,
//!   `<master_id>.pem`/`.pub` where master_id is the id minus a trailing
//!   `_master`, and the `master_pubkey_signature` option when set) are
//!   read from `pki_dir`; every other name from the driver's cachedir
//!   (`cluster_pki_dir` when `cluster_id` is set): `cluster.pem`,
//!   `cluster.pub`, `peers/<id>.pub` (crypt.py `check_master_shared_pub`),
//!   `<id>_pubkey_signature` (crypt.py `MasterKeys.__init__`, with the full
//!   id, `_master` included, when `master_pubkey_signature` is not set;
//!   written by `gen_signature`), `minion.pem`/`minion.pub` (crypt.py
//!   `AsyncAuth.get_keys`) and any other file that `localfs_key.list`
//!   shows (salt-key's "Local Keys" are its `.pem`/`.pub` names).
//! - **Symlinks**: `localfs_key.fetch` returns nothing for a symlink
//!   (`keyfile.is_file() and not keyfile.is_symlink()`). Salt 3008.5's
//!   `_setup_keys` leaves `master.pem` and `master.pub` as symlinks to
//!   `<master_id>.pem`/`.pub` on a fresh localfs_key master, so those two
//!   names are skipped there, as Salt itself skips them, and the master key
//!   travels under `<master_id>.pem`/`.pub`, which `_setup_keys` prefers.
//!   A tree from before 3008 has regular `master.pem`/`master.pub` and no
//!   id-named pair; they are stored under both names, as `_setup_keys`
//!   would copy them on its first start (so a `<master_id>.pem` that Salt
//!   generated into the bank earlier is replaced, not preferred).
//! - Salt's own `MmapCache` creates the bank's files with the process umask
//!   (0644 under root's 022), private keys included; [`write()`] narrows the
//!   files of the bank it writes to 0600 or less.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::format::{self, MASTER_INDEX};
use crate::table::{OpenOptions, Table};

/// The largest file [`collect`] takes (a 16384-bit RSA private key PEM is
/// about 12 KiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The bank's name in Salt.
pub const BANK: &str = "master_keys";

/// What [`collect`] needs from the master config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterKeyOptions {
    /// The master's `id` as Salt's opts hold it: the configured `id`, or the
    /// host's id with `_master` appended (salt/config `apply_master_config`).
    pub id: String,
    /// `master_sign_key_name` (Salt's default `master_sign`).
    pub master_sign_key_name: String,
    /// `master_pubkey_signature` (Salt's default: unset).
    pub master_pubkey_signature: Option<String>,
    /// Files larger than this are skipped ([`MAX_FILE_BYTES`] by default).
    pub max_file_bytes: u64,
}

impl MasterKeyOptions {
    /// The options of a master with id `id` and Salt's defaults otherwise.
    pub fn new(id: impl Into<String>) -> MasterKeyOptions {
        MasterKeyOptions {
            id: id.into(),
            master_sign_key_name: "master_sign".into(),
            master_pubkey_signature: None,
            max_file_bytes: MAX_FILE_BYTES,
        }
    }

    /// `MasterKeys.master_id`: the id without one trailing `_master`.
    pub fn master_id(&self) -> &str {
        self.id.strip_suffix("_master").unwrap_or(&self.id)
    }

    /// `MasterKeys.master_pubkey_signature`: the option when set (and not
    /// empty), else `<id>_pubkey_signature`.
    pub fn signature_name(&self) -> String {
        match &self.master_pubkey_signature {
            Some(s) if !s.is_empty() => s.clone(),
            _ => format!("{}_pubkey_signature", self.id),
        }
    }

    /// localfs_key's `NON_CLUSTERED_MASTER_KEYS`: the names read from
    /// `pki_dir` even when `cluster_id` is set. The signature is among them
    /// only when `master_pubkey_signature` is set (localfs_key adds
    /// `opts.get("master_pubkey_signature", ...)`, which is `None` by
    /// default).
    pub fn pki_dir_names(&self) -> Vec<String> {
        let mid = self.master_id();
        let sign = &self.master_sign_key_name;
        let mut v = vec![
            "master.pem".to_string(),
            "master.pub".to_string(),
            format!("{sign}.pem"),
            format!("{sign}.pub"),
            format!("{mid}.pub"),
            format!("{mid}.pem"),
        ];
        if let Some(s) = &self.master_pubkey_signature {
            v.push(s.clone());
        }
        let mut seen = BTreeSet::new();
        v.retain(|n| seen.insert(n.clone()));
        v
    }
}

/// The directory whose `master_keys` bank Salt's mmap_key uses:
/// `cluster_pki_dir` when the master has a `cluster_id`, else `pki_dir`.
pub fn store_dir<'a>(pki_dir: &'a Path, cluster_pki_dir: Option<&'a Path>) -> &'a Path {
    cluster_pki_dir.unwrap_or(pki_dir)
}

/// One file for the bank. Its `Debug` shows the name, the path and the
/// length, never the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterKeyFile {
    /// The name Salt stores and fetches it under (`peers/m2.pub`).
    pub name: String,
    /// Where it was read from.
    pub path: PathBuf,
    /// Its content, private key material included.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for MasterKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterKeyFile")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// Why a file is not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MasterKeySkipReason {
    /// A symlink: never followed; Salt's localfs_key does not read it either.
    Symlink,
    /// A directory, socket, device...
    NotARegularFile,
    /// The file name is not UTF-8.
    NonUtf8Name,
    /// The file could not be read (see the detail).
    Unreadable,
    /// Empty: Salt's mmap_key would read it as absent.
    Empty,
    /// Larger than [`MasterKeyOptions::max_file_bytes`].
    TooLarge,
    /// Not UTF-8, or ends in NUL: Salt's fetch would not return it unchanged.
    NotText,
    /// A file that is neither a name Salt reads for this master nor a
    /// `.pem`/`.pub` file.
    NotAKeyName,
    /// A name that Salt's localfs_key reads from `pki_dir`, found in
    /// `cluster_pki_dir`.
    WrongDir,
    /// Longer than the layout's id size (Salt would truncate it).
    NameTooLong,
}

impl MasterKeySkipReason {
    /// A short description, for the command's output.
    pub fn describe(&self) -> &'static str {
        match self {
            MasterKeySkipReason::Symlink => {
                "a symlink (never followed; Salt's localfs_key ignores it too)"
            }
            MasterKeySkipReason::NotARegularFile => "not a regular file",
            MasterKeySkipReason::NonUtf8Name => "the name is not UTF-8",
            MasterKeySkipReason::Unreadable => "unreadable",
            MasterKeySkipReason::Empty => "empty (Salt would read it as absent)",
            MasterKeySkipReason::TooLarge => "too large",
            MasterKeySkipReason::NotText => {
                "not UTF-8 text, or ends in NUL (Salt's fetch would alter it)"
            }
            MasterKeySkipReason::NotAKeyName => "not a key file Salt reads through master_keys",
            MasterKeySkipReason::WrongDir => {
                "Salt reads this name from pki_dir, not cluster_pki_dir"
            }
            MasterKeySkipReason::NameTooLong => {
                "the name is longer than mmap_key_id_size (Salt would truncate it)"
            }
        }
    }
}

/// One file not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MasterKeySkip {
    /// The bank name it would have had.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: MasterKeySkipReason,
    /// The error, for [`MasterKeySkipReason::Unreadable`].
    pub detail: Option<String>,
}

/// What [`collect`] found.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// The files to store, sorted by name.
    pub files: Vec<MasterKeyFile>,
    /// The files left out, sorted by name.
    pub skipped: Vec<MasterKeySkip>,
}

/// What [`write()`] (or [`plan`]) did to the bank. Names only, never values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MasterKeysReport {
    /// The bank's index file.
    pub index: PathBuf,
    /// Nothing was written ([`plan`]).
    pub dry_run: bool,
    /// Names new to the bank.
    pub written: Vec<String>,
    /// Names whose value in the bank differed, now the file's content (for
    /// example a key pair Salt generated when it found the bank empty).
    pub replaced: Vec<String>,
    /// Names whose value was already the file's content.
    pub unchanged: Vec<String>,
    /// Names in the bank that no file gave, left as they are.
    pub kept: Vec<String>,
    /// Files not stored: [`collect`]'s and the names the layout cannot hold.
    pub skipped: Vec<MasterKeySkip>,
    /// Bank files that were wider than 0600 and were narrowed.
    pub tightened: Vec<PathBuf>,
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

fn skip(name: &str, path: &Path, reason: MasterKeySkipReason) -> MasterKeySkip {
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
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path);
    let f: File = match f {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err((MasterKeySkipReason::Symlink, None))
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EISDIR) | Some(libc::ENXIO)) => {
            return Err((MasterKeySkipReason::NotARegularFile, None))
        }
        Err(e) => return Err((MasterKeySkipReason::Unreadable, Some(e.to_string()))),
    };
    let meta = f
        .metadata()
        .map_err(|e| (MasterKeySkipReason::Unreadable, Some(e.to_string())))?;
    if !meta.is_file() {
        return Err((MasterKeySkipReason::NotARegularFile, None));
    }
    if meta.len() > max {
        return Err((MasterKeySkipReason::TooLarge, None));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| (MasterKeySkipReason::Unreadable, Some(e.to_string())))?;
    if bytes.len() as u64 > max {
        return Err((MasterKeySkipReason::TooLarge, None));
    }
    if bytes.is_empty() {
        return Err((MasterKeySkipReason::Empty, None));
    }
    if std::str::from_utf8(&bytes).is_err() || bytes.last() == Some(&0) {
        return Err((MasterKeySkipReason::NotText, None));
    }
    Ok(Some(bytes))
}

/// The bank's files that exist: index, heap segments, roster, lock.
fn bank_files(index: &Path) -> Vec<PathBuf> {
    let with = |s: &str| {
        let mut p = index.as_os_str().to_owned();
        p.push(s);
        PathBuf::from(p)
    };
    let mut v = vec![
        index.to_path_buf(),
        with(format::ROSTER_SUFFIX),
        with(format::LOCK_SUFFIX),
    ];
    let heap = with(format::HEAP_SUFFIX);
    v.push(heap.clone());
    for n in 1u32.. {
        let seg = with(&format!("{}.{n}", format::HEAP_SUFFIX));
        if std::fs::symlink_metadata(&seg).is_err() {
            break;
        }
        v.push(seg);
    }
    v.retain(|p| std::fs::symlink_metadata(p).is_ok());
    v
}

/// Narrows every regular bank file wider than 0600 to `mode & 0600`;
/// returns the files changed. Symlinks are not followed (the table refuses
/// them anyway).
fn tighten(index: &Path) -> Result<Vec<PathBuf>> {
    let mut changed = Vec::new();
    for p in bank_files(index) {
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
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
fn private_options(dir: &Path, opts: &OpenOptions) -> Result<OpenOptions> {
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

/// Stores `collected.files` in the `master_keys` bank of `dir` (see
/// [`store_dir`]) as Salt's mmap_key stores them (the file's bytes as the
/// value, under its name), in one transaction under the bank's lock: a
/// failure writes nothing. Values equal to the file are left alone; others
/// are replaced. Creates `dir` (mode 0700) when missing. The bank's files
/// end mode 0600 or narrower: new ones are created so (the owner from
/// `opts.ownership`, else `dir`'s), existing wider ones (Salt creates them
/// with its umask) are narrowed, before and after the write.
pub fn write(dir: &Path, collected: &Collected, opts: &OpenOptions) -> Result<MasterKeysReport> {
    run(dir, collected, opts, false)
}

/// What [`write()`] would do, writing and creating nothing.
pub fn plan(dir: &Path, collected: &Collected, opts: &OpenOptions) -> Result<MasterKeysReport> {
    run(dir, collected, opts, true)
}

fn run(
    dir: &Path,
    collected: &Collected,
    opts: &OpenOptions,
    dry_run: bool,
) -> Result<MasterKeysReport> {
    let index = dir.join(MASTER_INDEX);
    let mut report = MasterKeysReport {
        index: index.clone(),
        dry_run,
        skipped: collected.skipped.clone(),
        ..MasterKeysReport::default()
    };
    if !dry_run && !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::io(dir, "mkdir", e))?;
    }
    let topts = if dir.exists() {
        private_options(dir, opts)?
    } else {
        OpenOptions {
            ownership: Some(Ownership {
                owner: None,
                mode: 0o600,
                explicit: false,
            }),
            ..opts.clone()
        }
    };
    if !dry_run {
        report.tightened = tighten(&index)?;
    }
    let table = Table::open(&index, &topts)?;

    let mut todo = Vec::new();
    for f in &collected.files {
        match table.check_id(f.name.as_bytes()) {
            Ok(()) => todo.push(f),
            Err(Error::IdTooLong { .. }) => {
                report
                    .skipped
                    .push(skip(&f.name, &f.path, MasterKeySkipReason::NameTooLong))
            }
            Err(e) => return Err(e),
        }
    }
    let names: BTreeSet<&str> = todo.iter().map(|f| f.name.as_str()).collect();

    let classify =
        |report: &mut MasterKeysReport, old: Option<Vec<u8>>, f: &MasterKeyFile| match old {
            None => report.written.push(f.name.clone()),
            Some(v) if v == f.bytes => report.unchanged.push(f.name.clone()),
            Some(_) => report.replaced.push(f.name.clone()),
        };
    if dry_run || todo.is_empty() {
        for f in &todo {
            classify(
                &mut report,
                table.get(f.name.as_bytes())?.map(|s| s.value),
                f,
            );
        }
    } else {
        let (r, _) = table.transaction(|tx| {
            let mut r = MasterKeysReport::default();
            for f in &todo {
                let old = tx.get(f.name.as_bytes())?;
                let same = old.as_deref() == Some(&f.bytes[..]);
                classify(&mut r, old, f);
                if !same {
                    tx.put(f.name.as_bytes(), &f.bytes)?;
                }
            }
            Ok(r)
        })?;
        report.written = r.written;
        report.replaced = r.replaced;
        report.unchanged = r.unchanged;
        for p in tighten(&index)? {
            if !report.tightened.contains(&p) {
                report.tightened.push(p);
            }
        }
    }
    report.kept = names_in(&table)?
        .into_iter()
        .filter(|n| !names.contains(n.as_str()))
        .collect();
    report.skipped.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(report)
}

fn names_in(table: &Table) -> Result<Vec<String>> {
    let mut v: Vec<String> = table
        .iter()?
        .map(|r| r.map(|r| String::from_utf8_lossy(&r.id).into_owned()))
        .collect::<Result<_>>()?;
    v.sort();
    Ok(v)
}

/// The names in the `master_keys` bank of `dir`, sorted (for `keycache
/// list --bank master_keys`): names only, never values.
pub fn names(dir: &Path, opts: &OpenOptions) -> Result<Vec<String>> {
    let table = Table::open(dir.join(MASTER_INDEX), opts)?;
    names_in(&table)
}
