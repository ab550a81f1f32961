//! One-shot, atomic migration of a `localfs_key` tree into a store: what
//! `salt-run pki.migrate_to_mmap` does, as one pass with no fsync per key.
//!
//! The four directories are read in parallel; every entry Salt would skip
//! (and a few it would choke on) is skipped with a reason; an id found in
//! several states gets the state Salt gives it (rejected, then pending, then
//! accepted). Both banks are then built in memory, merged with what the
//! target banks already hold (unless `replace`), written under temporary
//! names and renamed into place through [`crate::rebuild`]'s journal, under
//! the banks' locks.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::layout::Params;
use crate::rebuild::{self, Commit, Image};
use crate::store::{encode_key_value, KeyState, Store, DENIED_INDEX, KEYS_INDEX};
use crate::table::OpenOptions;

/// The highest share of data slots a migration fills before it refuses and
/// asks for a bigger table: linear probing degrades quickly past it.
pub const MAX_LOAD_FACTOR: f64 = 0.8;

/// Largest file accepted as a public key (a 16384-bit RSA key in PEM is
/// under 3 KiB).
pub const MAX_KEY_BYTES: u64 = 64 * 1024;

/// The four directories of a `localfs_key` tree, in Salt's scan order.
pub const TREE_DIRS: [&str; 4] = [
    "minions",
    "minions_pre",
    "minions_rejected",
    "minions_denied",
];

/// Options of [`migrate`].
#[derive(Clone, Default)]
pub struct MigrateOptions {
    /// Layout of the target banks.
    pub params: Params,
    /// Where to write the banks (a `cluster_pki_dir`); the tree itself when `None`.
    pub out: Option<PathBuf>,
    /// Count and report, write nothing.
    pub dry_run: bool,
    /// Drop entries of the target banks that the tree does not have.
    pub replace: bool,
    /// Skip ids longer than the id size instead of refusing the tree.
    pub skip_long_ids: bool,
    /// Owner and mode of new files (default: those of the target directory, 0600).
    pub ownership: Option<Ownership>,
}

/// Why an entry of the tree was not migrated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// A symlink: never followed.
    Symlink,
    /// A directory, socket, device...
    NotARegularFile,
    /// A name starting with `.` (Salt's `.key_cache` and the like).
    DotFile,
    /// Salt's `valid_id` refuses the name.
    InvalidId,
    /// Longer than the id size (only with `skip_long_ids`).
    IdTooLong,
    /// The file name is not UTF-8.
    NonUtf8Name,
    /// The file could not be read.
    Unreadable,
    /// The file is empty.
    Empty,
    /// The content is not a PEM public key (or not UTF-8 text).
    NotAPublicKey,
    /// Larger than [`MAX_KEY_BYTES`].
    TooLarge,
}

/// One skipped entry.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// The path in the tree (lossily decoded when not UTF-8).
    pub path: String,
    /// Why.
    pub reason: SkipReason,
    /// Details (the OS error, the rule broken).
    pub detail: String,
}

/// An id found in several of `minions`, `minions_pre`, `minions_rejected`.
#[derive(Debug, Clone, Serialize)]
pub struct Duplicate {
    /// The id.
    pub id: String,
    /// The states it was found in, in scan order.
    pub found_in: Vec<KeyState>,
    /// The state it got.
    pub state: KeyState,
}

/// Per-state numbers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StateCounts {
    /// Accepted.
    pub accepted: u64,
    /// Pending.
    pub pending: u64,
    /// Rejected.
    pub rejected: u64,
    /// Denied.
    pub denied: u64,
}

/// What a migration did (or, dry, would do).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The tree.
    pub pki_dir: PathBuf,
    /// Where the banks were written.
    pub target: PathBuf,
    /// Whether nothing was written.
    pub dry_run: bool,
    /// Key files found per state, as Salt's runner counts them.
    pub found: StateCounts,
    /// Entries of the tree migrated, per state after precedence.
    pub migrated: StateCounts,
    /// Entries already in the target banks that the tree lacks, kept.
    pub kept: StateCounts,
    /// Entries of the target banks dropped by `replace`.
    pub dropped: u64,
    /// Entries of the banks afterwards.
    pub total: StateCounts,
    /// Ids found in several states.
    pub duplicates: Vec<Duplicate>,
    /// Entries skipped.
    pub skipped: Vec<Skipped>,
    /// Table size (`mmap_key_size`).
    pub size: u64,
    /// Share of the `keys` table's data slots filled afterwards.
    pub load_factor: f64,
    /// Seconds spent.
    pub seconds: f64,
}

/// One key read from the tree.
struct Found {
    dir: usize,
    id: String,
    pem: Vec<u8>,
    mtime: u64,
}

fn is_pem_public_key(b: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(b) else {
        return false;
    };
    let t = s.trim_start();
    t.starts_with("-----BEGIN ") && s.contains("PUBLIC KEY-----") && s.contains("-----END ")
}

/// A key read from the tree (id, PEM, mtime), or why the entry was skipped.
type Entry = std::result::Result<(String, Vec<u8>, u64), (SkipReason, String)>;

/// Reads one entry of a tree directory, or says why it is skipped.
fn read_entry(dir: &Path, name: &OsStr, params: &Params, skip_long: bool) -> Result<Entry> {
    let path = dir.join(name);
    let skip = |r: SkipReason, d: String| Ok(Err((r, d)));
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) => return skip(SkipReason::Unreadable, e.to_string()),
    };
    if meta.file_type().is_symlink() {
        return skip(SkipReason::Symlink, "symlinks are never followed".into());
    }
    if !meta.is_file() {
        return skip(SkipReason::NotARegularFile, "not a regular file".into());
    }
    let Some(id) = name.to_str() else {
        return skip(
            SkipReason::NonUtf8Name,
            format!(
                "file name {:?} is not UTF-8",
                String::from_utf8_lossy(name.as_bytes())
            ),
        );
    };
    if id.starts_with('.') {
        return skip(
            SkipReason::DotFile,
            "names starting with '.' are not keys".into(),
        );
    }
    if let Err(e) = crate::id::validate(id) {
        return skip(SkipReason::InvalidId, e.to_string());
    }
    if id.len() > params.id_size {
        let e = Error::IdTooLong {
            id: id.into(),
            len: id.len(),
            id_size: params.id_size,
            slot: crate::layout::min_slot_size(id.len()).max(params.slot_size),
        };
        if skip_long {
            return skip(SkipReason::IdTooLong, e.to_string());
        }
        return Err(e);
    }
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return skip(SkipReason::Symlink, "symlinks are never followed".into())
        }
        Err(e) => return skip(SkipReason::Unreadable, e.to_string()),
    };
    let meta = match f.metadata() {
        Ok(m) => m,
        Err(e) => return skip(SkipReason::Unreadable, e.to_string()),
    };
    if !meta.is_file() {
        return skip(SkipReason::NotARegularFile, "not a regular file".into());
    }
    if meta.len() > MAX_KEY_BYTES {
        return skip(
            SkipReason::TooLarge,
            format!(
                "{} bytes; a public key is under {MAX_KEY_BYTES}",
                meta.len()
            ),
        );
    }
    let mut pem = Vec::with_capacity(meta.len() as usize);
    if let Err(e) = (&mut f).take(MAX_KEY_BYTES + 1).read_to_end(&mut pem) {
        return skip(SkipReason::Unreadable, e.to_string());
    }
    if pem.len() as u64 > MAX_KEY_BYTES {
        return skip(
            SkipReason::TooLarge,
            "file grew past the limit while read".into(),
        );
    }
    if pem.is_empty() {
        return skip(SkipReason::Empty, "empty file".into());
    }
    if !is_pem_public_key(&pem) {
        return skip(SkipReason::NotAPublicKey, "not a PEM public key".into());
    }
    let mtime = (meta.mtime().max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec().max(0) as u64);
    Ok(Ok((id.to_owned(), pem, mtime)))
}

/// Checks the tree and lists its directories' entries.
fn list_tree(pki_dir: &Path) -> Result<Vec<(usize, PathBuf, Vec<std::ffi::OsString>)>> {
    let bad = |why: String| Error::PkiDir {
        path: pki_dir.into(),
        why,
    };
    let meta = std::fs::metadata(pki_dir).map_err(|e| bad(format!("cannot open it: {e}")))?;
    if !meta.is_dir() {
        return Err(bad("it is not a directory".into()));
    }
    let mut out = Vec::new();
    for (i, d) in TREE_DIRS.iter().enumerate() {
        let p = pki_dir.join(d);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(bad(format!(
                    "{d} is not a directory (symlinked directories are not followed)"
                )))
            }
            Err(_) => continue,
        }
        let rd = std::fs::read_dir(&p).map_err(|e| Error::PkiDir {
            path: p.clone(),
            why: format!("cannot list it: {e}"),
        })?;
        let mut names = Vec::new();
        for e in rd {
            let e = e.map_err(|e| Error::PkiDir {
                path: p.clone(),
                why: format!("cannot list it: {e}"),
            })?;
            names.push(e.file_name());
        }
        names.sort();
        out.push((i, p, names));
    }
    if out.is_empty() {
        return Err(bad(format!(
            "it has none of {}; is it a Salt pki_dir?",
            TREE_DIRS.join(", ")
        )));
    }
    Ok(out)
}

/// Migrates the `localfs_key` tree at `pki_dir`. `progress(done, total)` is
/// called as files are read.
pub fn migrate(
    pki_dir: &Path,
    opts: &MigrateOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Report> {
    let start = std::time::Instant::now();
    opts.params.validate()?;
    let dirs = list_tree(pki_dir)?;
    let target = opts.out.clone().unwrap_or_else(|| pki_dir.to_path_buf());
    let work: Vec<(usize, &Path, &OsStr)> = dirs
        .iter()
        .flat_map(|(i, p, names)| names.iter().map(move |n| (*i, p.as_path(), n.as_os_str())))
        .collect();
    let total = work.len() as u64;
    // Read in parallel, in chunks, keeping the scan order.
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8);
    let chunk = work.len().div_ceil(threads).max(1);
    let done = std::sync::atomic::AtomicU64::new(0);
    type Item = (
        usize,
        PathBuf,
        std::result::Result<(String, Vec<u8>, u64), (SkipReason, String)>,
    );
    let results: Vec<Result<Vec<Item>>> = std::thread::scope(|s| {
        let handles: Vec<_> = work
            .chunks(chunk)
            .map(|part| {
                let done = &done;
                s.spawn(move || {
                    let mut out = Vec::with_capacity(part.len());
                    for (n, (i, dir, name)) in part.iter().enumerate() {
                        let r = read_entry(dir, name, &opts.params, opts.skip_long_ids)?;
                        out.push((*i, dir.join(name), r));
                        if n % 256 == 255 {
                            let d = done.fetch_add(256, std::sync::atomic::Ordering::Relaxed) + 256;
                            progress(d, total);
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::PkiDir {
                        path: pki_dir.into(),
                        why: "a reader thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    progress(total, total);
    let mut found_keys = Vec::new();
    let mut skipped = Vec::new();
    let mut found = StateCounts::default();
    for r in results {
        for (dir, path, item) in r? {
            match item {
                Ok((id, pem, mtime)) => {
                    bump(&mut found, dir);
                    found_keys.push(Found {
                        dir,
                        id,
                        pem,
                        mtime,
                    });
                }
                Err((reason, detail)) => skipped.push(Skipped {
                    path: path.to_string_lossy().into_owned(),
                    reason,
                    detail,
                }),
            }
        }
    }
    // Precedence: the last directory scanned wins (rejected > pending > accepted).
    let mut keys: Vec<(String, KeyState, Vec<u8>, u64)> = Vec::new();
    let mut pos: HashMap<String, usize> = HashMap::new();
    let mut seen_in: HashMap<String, Vec<KeyState>> = HashMap::new();
    let mut denied: Vec<(String, Vec<u8>, u64)> = Vec::new();
    for f in found_keys {
        if f.dir == 3 {
            denied.push((f.id, f.pem, f.mtime));
            continue;
        }
        let state = KeyState::ALL[f.dir];
        seen_in.entry(f.id.clone()).or_default().push(state);
        match pos.get(&f.id) {
            Some(&i) => keys[i] = (f.id, state, f.pem, f.mtime),
            None => {
                pos.insert(f.id.clone(), keys.len());
                keys.push((f.id, state, f.pem, f.mtime));
            }
        }
    }
    let duplicates: Vec<Duplicate> = keys
        .iter()
        .filter_map(|(id, state, _, _)| {
            let s = &seen_in[id];
            (s.len() > 1).then(|| Duplicate {
                id: id.clone(),
                found_in: s.clone(),
                state: *state,
            })
        })
        .collect();
    let mut migrated = StateCounts::default();
    for (_, s, _, _) in &keys {
        bump(&mut migrated, *s as usize);
    }
    migrated.denied = denied.len() as u64;

    let mut report = Report {
        pki_dir: pki_dir.into(),
        target: target.clone(),
        dry_run: opts.dry_run,
        found,
        migrated,
        kept: StateCounts::default(),
        dropped: 0,
        total: StateCounts::default(),
        duplicates,
        skipped,
        size: opts.params.size,
        load_factor: 0.0,
        seconds: 0.0,
    };
    if !opts.dry_run {
        std::fs::create_dir_all(&target).map_err(|e| Error::io(&target, "create directory", e))?;
    }
    let topts = OpenOptions {
        params: opts.params,
        ownership: opts.ownership,
        ..OpenOptions::default()
    };
    let store = if target.is_dir() {
        Some(Store::open_with(&target, &topts)?)
    } else {
        None
    };
    let build = |report: &mut Report| -> Result<(Image, Image)> {
        let mut kimg = Image::new(opts.params)?;
        let mut dimg = Image::new(opts.params)?;
        let kpath = target.join(KEYS_INDEX);
        let dpath = target.join(DENIED_INDEX);
        let tree_keys: HashMap<&str, usize> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.0.as_str(), i))
            .collect();
        let tree_denied: HashMap<&str, usize> = denied
            .iter()
            .enumerate()
            .map(|(i, k)| (k.0.as_str(), i))
            .collect();
        let mut entries: Vec<(String, KeyState, Vec<u8>, u64)> = Vec::new();
        let mut placed = vec![false; keys.len()];
        let mut dentries: Vec<(String, Vec<u8>, u64)> = Vec::new();
        let mut dplaced = vec![false; denied.len()];
        if let Some(store) = &store {
            for r in store.keys_table().iter()? {
                let r = r?;
                let id = String::from_utf8_lossy(&r.id).into_owned();
                if let Some(&i) = tree_keys.get(id.as_str()) {
                    placed[i] = true;
                    entries.push(keys[i].clone());
                } else if opts.replace {
                    report.dropped += 1;
                } else {
                    let (state, pem) = crate::store::decode_key_value(&r.value).ok_or_else(|| Error::Corrupt {
                        path: kpath.clone(),
                        id: Some(id.clone()),
                        why: "existing value is not [state][public key]; run keycache verify --repair".into(),
                    })?;
                    bump(&mut report.kept, state as usize);
                    entries.push((id, state, pem.to_vec(), r.mtime));
                }
            }
            for r in store.denied_table().iter()? {
                let r = r?;
                let id = String::from_utf8_lossy(&r.id).into_owned();
                if let Some(&i) = tree_denied.get(id.as_str()) {
                    dplaced[i] = true;
                    dentries.push(denied[i].clone());
                } else if opts.replace {
                    report.dropped += 1;
                } else {
                    report.kept.denied += 1;
                    dentries.push((id, r.value, r.mtime));
                }
            }
        }
        entries.extend(
            keys.iter()
                .zip(&placed)
                .filter(|(_, p)| !**p)
                .map(|(k, _)| k.clone()),
        );
        dentries.extend(
            denied
                .iter()
                .zip(&dplaced)
                .filter(|(_, p)| !**p)
                .map(|(k, _)| k.clone()),
        );
        check_load(&kpath, entries.len() as u64, &opts.params)?;
        check_load(&dpath, dentries.len() as u64, &opts.params)?;
        for (id, state, pem, mtime) in &entries {
            bump(&mut report.total, *state as usize);
            kimg.insert(
                id.as_bytes(),
                &encode_key_value(*state, pem),
                *mtime,
                &kpath,
            )?;
        }
        for (id, pem, mtime) in &dentries {
            dimg.insert(id.as_bytes(), pem, *mtime, &dpath)?;
        }
        report.total.denied = dentries.len() as u64;
        report.load_factor = entries.len() as f64 / opts.params.capacity() as f64;
        Ok((kimg, dimg))
    };
    // Validate (ids, load factor) before taking any lock or creating a file.
    build(&mut report.clone())?;
    match (&store, opts.dry_run) {
        (Some(store), false) => {
            let kt = store.keys_table();
            let dt = store.denied_table();
            kt.exclusive(|| {
                dt.exclusive(|| {
                    rebuild::remove_temps_of(kt.path())?;
                    rebuild::remove_temps_of(dt.path())?;
                    let (kimg, dimg) = build(&mut report)?;
                    let mut c = Commit::default();
                    let own = kt.ownership();
                    c.stage(kt.path(), kimg, &own)?;
                    c.stage(dt.path(), dimg, &own)?;
                    c.apply()
                })
            })?;
        }
        _ => {
            build(&mut report)?;
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

fn bump(c: &mut StateCounts, dir: usize) {
    match dir {
        0 => c.accepted += 1,
        1 => c.pending += 1,
        2 => c.rejected += 1,
        _ => c.denied += 1,
    }
}

/// Refuses a bank that would be filled past [`MAX_LOAD_FACTOR`].
fn check_load(path: &Path, entries: u64, p: &Params) -> Result<()> {
    let load = entries as f64 / p.capacity() as f64;
    if load > MAX_LOAD_FACTOR {
        return Err(Error::Overfull {
            path: path.into(),
            entries,
            size: p.size,
            load,
            max_load: MAX_LOAD_FACTOR,
            suggested: suggest_size(entries),
        });
    }
    Ok(())
}

/// A table size that holds `entries` at most half full, rounded up to a
/// readable number.
pub fn suggest_size(entries: u64) -> u64 {
    let need = Params::size_for(entries, 0.5);
    let step = 10u64
        .pow((need as f64).log10().floor().max(1.0) as u32 - 1)
        .max(1);
    need.div_ceil(step) * step
}
