//! Reading a `localfs_key` tree: the four directories listed, every key
//! file opened without following links and read once into per-thread
//! buffers, the skips decided, in parallel (the listing of `minions`
//! overlaps the reading of the small directories).

use super::*;
use crate::files::{NotRegular, Refused};

/// One entry of a tree directory, as listed.
struct Listed {
    /// The directory it is in.
    pub(super) dir: TreeDir,
    /// Where its name is in the listing's [`Names`].
    pub(super) name: (usize, usize),
    /// The type the directory listing gives (no `stat` on most filesystems).
    pub(super) kind: std::io::Result<std::fs::FileType>,
}

/// Where a key read from the tree lies in its reader's buffer: its whole
/// heap record, `[xxh3(value)][value]`, is at `off .. off + 8 + value
/// length`. The value is the PEM for `minions_denied`, and the state byte of
/// its directory then the PEM for the other three (their `keys` value).
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) off: usize,
    /// Length of the PEM.
    pub(super) len: usize,
    pub(super) mtime: u64,
}

/// Bytes before the value in a record: its checksum.
pub(super) const SUM: usize = crate::format::CHECKSUM_LEN;

/// Bytes of a `dir` value before the PEM: the state byte, but in
/// `minions_denied` (the `denied_keys` bank has no state).
pub(super) fn state_bytes(dir: TreeDir) -> usize {
    usize::from(dir.state().is_some())
}

/// A key read from the tree, or why the entry was skipped.
type KeyFile = std::result::Result<Span, (SkipReason, String)>;

/// The names of a listing, one after the other (one allocation, not one
/// per name: walked in order, they are in cache).
#[derive(Default)]
struct Names(Vec<u8>);

impl Names {
    fn push(&mut self, name: &[u8]) -> (usize, usize) {
        let start = self.0.len();
        self.0.extend_from_slice(name);
        (start, name.len())
    }

    fn get(&self, (start, len): (usize, usize)) -> &[u8] {
        self.0.get(start..start + len).unwrap_or_default()
    }
}

/// What one reader thread hands back: its entries in order, and the buffer
/// holding their bytes.
pub(super) struct Part {
    /// The ids of `keys`, one after the other.
    pub(super) ids: String,
    /// Key files read, in scan order.
    pub(super) keys: Vec<TreeKey>,
    /// Entries skipped, in scan order.
    pub(super) skipped: Vec<Skipped>,
    pub(super) found: Counts,
    pub(super) buf: Vec<u8>,
}

/// Reads one entry of a tree directory into `buf`, or says why it is skipped.
/// Never follows a symlink: the listing's type is checked first, and the
/// file is opened with `O_NOFOLLOW` and checked again on the descriptor.
fn read_key_file(
    path: &Path,
    e: &Listed,
    name: &[u8],
    params: &Params,
    skip_long: bool,
    buf: &mut Vec<u8>,
) -> Result<KeyFile> {
    let skip = |r: SkipReason, d: String| Ok(Err((r, d)));
    let kind = match &e.kind {
        Ok(k) => *k,
        Err(err) => return skip(SkipReason::Unreadable, err.to_string()),
    };
    if kind.is_symlink() {
        return skip(SkipReason::Symlink, "symlinks are never followed".into());
    }
    if !kind.is_file() {
        return skip(SkipReason::NotARegularFile, "not a regular file".into());
    }
    let Ok(id) = std::str::from_utf8(name) else {
        return skip(
            SkipReason::NonUtf8Name,
            format!("file name {:?} is not UTF-8", String::from_utf8_lossy(name)),
        );
    };
    if id.starts_with('.') {
        return skip(
            SkipReason::DotFile,
            "names starting with '.' are skipped, as Salt's pki.migrate_to_mmap skips them \
             (a dot-id is still an id: its file in minions/ passes Salt's validate_token, and \
             a verification of the tree reports it)"
                .into(),
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
            slot: crate::format::min_slot_size(id.len()).max(params.slot_size),
        };
        if skip_long {
            return skip(SkipReason::IdTooLong, e.to_string());
        }
        return Err(e);
    }
    // The listing's type is checked again on the descriptor (replaced
    // since the listing: the descriptor is what counts).
    let off = buf.len();
    let start = off + SUM + state_bytes(e.dir);
    buf.resize(start, 0);
    // The state byte of this directory, for a `keys` value (the entry that
    // wins for an id found in several directories is that of the last).
    if let Some(s) = e.dir.state() {
        buf[off + SUM] = s.byte();
    }
    let (meta, len) = match crate::files::read_small(path, MAX_KEY_BYTES as u64, buf) {
        Ok(read) => read,
        Err(r) => {
            buf.truncate(off);
            let (reason, detail) = match r {
                Refused::NotRegular(NotRegular::Symlink) => {
                    (SkipReason::Symlink, "symlinks are never followed".into())
                }
                Refused::NotRegular(_) => {
                    (SkipReason::NotARegularFile, "not a regular file".into())
                }
                Refused::TooLarge(Some(size)) => (
                    SkipReason::TooLarge,
                    format!("{size} bytes; a public key is under {MAX_KEY_BYTES}"),
                ),
                Refused::TooLarge(None) => (
                    SkipReason::TooLarge,
                    "file grew past the limit while read".into(),
                ),
                Refused::Io(_, e) => (SkipReason::Unreadable, e.to_string()),
            };
            return skip(reason, detail);
        }
    };
    let reject = |buf: &mut Vec<u8>, r: SkipReason, d: &str| {
        buf.truncate(off);
        Ok(Err((r, d.to_owned())))
    };
    if len == 0 {
        return reject(buf, SkipReason::Empty, "empty file");
    }
    match crate::pem::check_public_key(&buf[start..start + len]) {
        Ok(()) => {}
        Err(crate::pem::PemProblem::PrivateKey) => {
            return reject(
                buf,
                SkipReason::PrivateKey,
                "holds a private key block; not stored",
            )
        }
        Err(p) => {
            return reject(
                buf,
                SkipReason::NotAPublicKey,
                &format!("not a PEM public key: {p}"),
            )
        }
    }
    let mtime = (meta.mtime().max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec().max(0) as u64);
    // The record's checksum, so that the heap is written from this buffer.
    let sum = crate::format::record_checksum(&buf[off + SUM..]);
    buf[off..off + SUM].copy_from_slice(&sum);
    Ok(Ok(Span { off, len, mtime }))
}

/// Lists one directory of the tree (`dir`, at `p`), sorted by name (byte
/// order).
fn list_dir(p: &Path, dir: TreeDir) -> Result<DirListing> {
    let cannot = |e: std::io::Error| Error::PkiDir {
        path: p.into(),
        why: format!("cannot list it: {e}"),
    };
    let mut names = Names::default();
    let mut entries = Vec::new();
    for e in std::fs::read_dir(p).map_err(cannot)? {
        let e = e.map_err(cannot)?;
        entries.push(Listed {
            dir,
            name: names.push(e.file_name().as_bytes()),
            kind: e.file_type(),
        });
    }
    entries.sort_unstable_by(|a, b| names.get(a.name).cmp(names.get(b.name)));
    Ok(DirListing { names, entries })
}

/// The entries of one directory of the tree.
struct DirListing {
    names: Names,
    entries: Vec<Listed>,
}

/// Entries of one directory for a reader to read: `listing.entries[range]`,
/// the `chunk`th share of directory `dir`.
struct Unit {
    dir: TreeDir,
    chunk: usize,
    listing: Arc<DirListing>,
    range: std::ops::Range<usize>,
}

/// Entries of a directory in one [`Unit`] (a share for one reader at a time,
/// small enough for the readers to stay busy until the end).
const UNIT_ENTRIES: usize = 2048;

/// The shares of a listing, sent to the readers.
fn enqueue(units: &mpsc::Sender<Unit>, listing: DirListing, dir: TreeDir) {
    let listing = Arc::new(listing);
    let n = listing.entries.len();
    for (chunk, start) in (0..n).step_by(UNIT_ENTRIES).enumerate() {
        // The readers are gone only when the scope is unwinding.
        let _ = units.send(Unit {
            dir,
            chunk,
            listing: listing.clone(),
            range: start..n.min(start + UNIT_ENTRIES),
        });
    }
}

/// Checks the tree, lists its directories and reads every entry. Listing
/// and reading overlap: the small directories (`minions_pre`,
/// `minions_rejected`, `minions_denied`) are listed by one thread, which
/// starts reading them while the main thread still lists `minions`; then
/// every reader takes shares of any directory until all are read. Returns
/// the parts in scan order (directory, then name).
pub(super) fn scan_tree(
    pki_dir: &Path,
    opts: &MigrateOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<Part>> {
    let bad = |why: String| Error::PkiDir {
        path: pki_dir.into(),
        why,
    };
    let meta = std::fs::metadata(pki_dir).map_err(|e| bad(format!("cannot open it: {e}")))?;
    if !meta.is_dir() {
        return Err(bad("it is not a directory".into()));
    }
    let paths: Vec<PathBuf> = TreeDir::NAMES.iter().map(|d| pki_dir.join(d)).collect();
    let mut present = [false; 4];
    for (i, (d, p)) in TreeDir::NAMES.iter().zip(&paths).enumerate() {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => present[i] = true,
            Ok(_) => {
                // The directories before it are listed first, as a scan in
                // order would (their errors come first).
                for j in (0..i).filter(|&j| present[j]) {
                    list_dir(&paths[j], TreeDir::ALL[j])?;
                }
                return Err(bad(format!(
                    "{d} is not a directory (symlinked directories are not followed)"
                )));
            }
            Err(_) => {}
        }
    }
    if !present.iter().any(|&p| p) {
        return Err(bad(format!(
            "it has none of {}; is it a Salt pki_dir?",
            TreeDir::NAMES.join(", ")
        )));
    }
    let readers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(2, 8);
    // Units go to the readers through a channel, which closes when both
    // listers are done (or gone: a panicking lister drops its sender too).
    let (units, queue) = mpsc::channel::<Unit>();
    let queue = std::sync::Mutex::new(queue);
    let total = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicU64::new(0);
    // "DIR/" of each directory.
    let prefixes: Vec<OsString> = paths
        .iter()
        .map(|p| {
            let mut s = p.clone().into_os_string();
            s.push("/");
            s
        })
        .collect();
    type Read = ((usize, usize), Result<Part>);
    // Reads units until none is left and the listers are done.
    let read_units = || -> Vec<Read> {
        let mut out = Vec::new();
        loop {
            let unit = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
            let Ok(u) = unit else {
                return out;
            };
            let part = read_unit(&prefixes, &u, opts, &|n| {
                let d = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
                progress(d, total.load(std::sync::atomic::Ordering::Relaxed));
            });
            out.push(((u.dir.index(), u.chunk), part));
        }
    };
    let list = |i: usize, units: &mpsc::Sender<Unit>| -> Result<()> {
        if present[i] {
            let l = list_dir(&paths[i], TreeDir::ALL[i])?;
            total.fetch_add(l.entries.len() as u64, std::sync::atomic::Ordering::Relaxed);
            enqueue(units, l, TreeDir::ALL[i]);
        }
        Ok(())
    };
    let panicked = || Error::PkiDir {
        path: pki_dir.into(),
        why: "a reader thread panicked".into(),
    };
    let (listed, small_listed, mut reads) = std::thread::scope(|s| {
        // The small directories, then reading.
        let small_units = units.clone();
        let small = s.spawn(|| {
            let small_units = small_units;
            let r = (1..4).try_for_each(|i| list(i, &small_units));
            drop(small_units);
            (r, read_units())
        });
        let others: Vec<_> = (2..readers).map(|_| s.spawn(read_units)).collect();
        let listed = list(0, &units);
        drop(units);
        let mut reads = read_units();
        for h in others {
            match h.join() {
                Ok(r) => reads.extend(r),
                Err(_) => reads.push(((usize::MAX, 0), Err(panicked()))),
            }
        }
        let small_listed = match small.join() {
            Ok((l, r)) => {
                reads.extend(r);
                l
            }
            Err(_) => Err(panicked()),
        };
        (listed, small_listed, reads)
    });
    // Errors as a scan in order would meet them: listing `minions`, listing
    // the others, then reading, in scan order.
    listed?;
    small_listed?;
    let n = total.load(std::sync::atomic::Ordering::Relaxed);
    progress(n, n);
    reads.sort_unstable_by_key(|r| r.0);
    reads.into_iter().map(|(_, p)| p).collect()
}

/// Reads the entries of `unit`, reporting progress through `tick` (entries
/// read since its last call).
fn read_unit(
    prefixes: &[OsString],
    unit: &Unit,
    opts: &MigrateOptions,
    tick: &dyn Fn(u64),
) -> Result<Part> {
    let share = unit
        .listing
        .entries
        .get(unit.range.clone())
        .unwrap_or_default();
    let names = &unit.listing.names;
    // Most keys are PEM of well under 1 KiB.
    let mut p = Part {
        ids: String::with_capacity(share.len() * 32),
        keys: Vec::with_capacity(share.len()),
        skipped: Vec::new(),
        found: Counts::default(),
        buf: Vec::with_capacity(share.len() * 512),
    };
    let mut path = OsString::new();
    for (n, e) in share.iter().enumerate() {
        let name = names.get(e.name);
        path.clear();
        path.push(&prefixes[e.dir.index()]);
        path.push(std::ffi::OsStr::from_bytes(name));
        let path = Path::new(&path);
        match read_key_file(path, e, name, &opts.params, opts.skip_long_ids, &mut p.buf)? {
            Ok(span) => {
                bump(&mut p.found, e.dir);
                // UTF-8: checked by `read_key_file`.
                let id = std::str::from_utf8(name).unwrap_or_default();
                let start = p.ids.len();
                p.ids.push_str(id);
                p.keys.push(TreeKey {
                    dir: e.dir,
                    idh: crate::format::hash(name),
                    id: (start, id.len()),
                    part: 0,
                    span,
                });
            }
            Err((reason, detail)) => p.skipped.push(Skipped {
                path: path.to_string_lossy().into_owned(),
                reason,
                detail,
            }),
        }
        if n % 256 == 255 {
            tick(256);
        }
    }
    tick((share.len() % 256) as u64);
    Ok(p)
}
