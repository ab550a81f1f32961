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
//!   would copy them on its first start.
//! - **Which pair Salt uses** (crypt.py `MasterKeys._setup_keys`): the
//!   master id is `opts["id"]` minus one trailing `_master`, where
//!   `opts["id"]` is the config's `id`, else the host's id with `_master`
//!   appended (salt/config `apply_master_config`); Salt uses
//!   `<master_id>.pem` when the bank holds it, else `master.pem`, else it
//!   generates a new pair (and a cluster peer then stops: its
//!   `peers/<master_id>.pub` no longer matches).
//!   [`MasterKeysReport::holds_master_pair`] says whether a write leaves the
//!   bank with the pair; [`own_key_files`] whether the tree has one to lose.
//! - **A bank value that differs from its file** is never replaced unless
//!   asked ([`OnDiffer`]): it may be a key Salt wrote into the bank since (a
//!   pair it generated, a newer one), and the only copy of it. By default
//!   the whole write is refused before anything is written.
//! - Salt's own `MmapCache` creates the bank's files with the process umask
//!   (0644 under root's 022), private keys included; [`write()`] narrows the
//!   files of the bank it writes to 0600 or less.

use std::collections::BTreeSet;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::format::MASTER_INDEX;
use crate::table::{OpenOptions, Table};

mod bank;
mod collect;
mod pair;
pub(crate) use bank::bank_beside;
pub use bank::open_bank;
use bank::{private_options, tighten};
use collect::skip;
pub use collect::{collect, own_key_files};
pub use pair::{write_pair, PairReport};

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

impl MasterKeysReport {
    /// Whether the bank, once this report's write is done, holds the
    /// master's own pair where Salt's `MasterKeys._setup_keys` (crypt.py)
    /// looks for it: `<master_id>.pem`, else `master.pem` (which Salt then
    /// copies under the id's names). With neither, Salt generates a new
    /// pair, and minions (and a cluster's peers, through
    /// `peers/<master_id>.pub`) refuse the master.
    pub fn holds_master_pair(&self, opts: &MasterKeyOptions) -> bool {
        let own = format!("{}.pem", opts.master_id());
        [&self.written, &self.replaced, &self.unchanged, &self.kept]
            .iter()
            .any(|v| v.iter().any(|n| *n == own || n == "master.pem"))
    }
}

/// What [`write()`] and [`plan`] do with a name whose value in the bank
/// differs from its file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnDiffer {
    /// Refuse the whole write ([`Error::MasterKeysDiffer`]), writing
    /// nothing: the bank's value may be a key Salt wrote there since the
    /// files were, and the only copy of it.
    #[default]
    Refuse,
    /// Replace the bank's value with the file's (what an operator asks for
    /// once sure the files hold the keys the minions and peers trust).
    Replace,
}

/// Stores `collected.files` in the `master_keys` bank of `dir` (see
/// [`store_dir`]) as Salt's mmap_key stores them (the file's bytes as the
/// value, under its name), in one transaction under the bank's lock: a
/// failure writes nothing. Values equal to the file are left alone; a value
/// that differs refuses the whole write ([`Error::MasterKeysDiffer`]) unless
/// `on_differ` is [`OnDiffer::Replace`]. Creates `dir` (mode 0700) when
/// missing. The bank's files end mode 0600 or narrower: new ones are
/// created so (the owner from `opts.ownership`, else `dir`'s), existing
/// wider ones (Salt creates them with its umask) are narrowed, before and
/// after the write.
pub fn write(
    dir: &Path,
    collected: &Collected,
    opts: &OpenOptions,
    on_differ: OnDiffer,
) -> Result<MasterKeysReport> {
    run(dir, collected, opts, on_differ, false)
}

/// What [`write()`] would do (and its refusal), writing and creating
/// nothing.
pub fn plan(
    dir: &Path,
    collected: &Collected,
    opts: &OpenOptions,
    on_differ: OnDiffer,
) -> Result<MasterKeysReport> {
    run(dir, collected, opts, on_differ, true)
}

fn run(
    dir: &Path,
    collected: &Collected,
    opts: &OpenOptions,
    on_differ: OnDiffer,
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

    // The bank's values, sorted into the report; refused when one differs
    // and replacing was not asked for.
    let classify = |olds: Vec<Option<Vec<u8>>>| -> Result<MasterKeysReport> {
        let mut r = MasterKeysReport::default();
        for (f, old) in todo.iter().zip(olds) {
            match old {
                None => r.written.push(f.name.clone()),
                Some(v) if v == f.bytes => r.unchanged.push(f.name.clone()),
                Some(_) => r.replaced.push(f.name.clone()),
            }
        }
        if on_differ == OnDiffer::Refuse && !r.replaced.is_empty() {
            return Err(Error::MasterKeysDiffer {
                path: index.clone(),
                names: r.replaced.join(", "),
            });
        }
        Ok(r)
    };
    let r = if dry_run || todo.is_empty() {
        let olds = todo
            .iter()
            .map(|f| Ok(table.get(f.name.as_bytes())?.map(|s| s.value)))
            .collect::<Result<Vec<_>>>()?;
        classify(olds)?
    } else {
        let (r, _) = table.transaction(|tx| {
            let olds = todo
                .iter()
                .map(|f| tx.get(f.name.as_bytes()))
                .collect::<Result<Vec<_>>>()?;
            let r = classify(olds)?;
            for f in &todo {
                if !r.unchanged.contains(&f.name) {
                    tx.put(f.name.as_bytes(), &f.bytes)?;
                }
            }
            Ok(r)
        })?;
        for p in tighten(&index)? {
            if !report.tightened.contains(&p) {
                report.tightened.push(p);
            }
        }
        r
    };
    report.written = r.written;
    report.replaced = r.replaced;
    report.unchanged = r.unchanged;
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
