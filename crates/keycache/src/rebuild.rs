//! Atomic rebuilds: bank images ([`Image`]) written under temporary names,
//! fsynced, then renamed into place through the roll-forward journal, one
//! journal for every bank rebuilt together. Renames follow Salt's order
//! (segments, heap, index, roster); heap segments that the new image does
//! not use are removed last.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::files::{self, Ownership};
use crate::format;
use crate::journal;
use crate::roster;
use crate::table::Table;

pub use crate::image::Image;
pub(crate) use crate::journal::remove_temps_of;
pub use crate::journal::{finish_interrupted, DEFAULT_SETTLE, JOURNAL, TMP_PREFIX};

/// A set of bank images to swap into place together.
#[derive(Debug, Default)]
struct Commit {
    renames: Vec<(PathBuf, PathBuf)>,
    removals: Vec<PathBuf>,
    locks: Vec<PathBuf>,
    dir: Option<PathBuf>,
}

/// What a temporary file of a staged image holds.
enum Body<'a> {
    Bytes(&'a [u8]),
    /// Heap segment `n` of an image.
    Heap(&'a Image, usize),
    /// The index of an image: mostly zeros. Its blocks are reserved (so
    /// later writes through a mapping, Salt's included, cannot fail for want
    /// of space, as with the zero-filled index Salt creates), and only the
    /// pages holding non-zero bytes are written.
    Index(&'a Image),
}

/// Bytes written to a file between two early syncs (see [`syncing_early`]).
const EARLY_SYNC_BYTES: u64 = 16 << 20;

/// Runs `write`, which reports the bytes it wrote through its argument,
/// while another thread syncs `f` whenever [`EARLY_SYNC_BYTES`] more were
/// written: the disk takes the first bytes of a large file while the last
/// are still being copied, instead of all of them at the final sync (which
/// the caller still makes: these syncs only start the writeback early).
/// `len` is at least what `write` writes; below twice [`EARLY_SYNC_BYTES`],
/// `write` just runs.
fn syncing_early(
    f: &File,
    path: &Path,
    len: u64,
    write: impl FnOnce(&mut dyn FnMut(u64)) -> Result<()>,
) -> Result<()> {
    if len < 2 * EARLY_SYNC_BYTES {
        return write(&mut |_| {});
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let syncer = s.spawn(move || -> Result<()> {
            while rx.recv().is_ok() {
                // Requests made during the last sync: one more covers them.
                while rx.try_recv().is_ok() {}
                files::sync_data(f, path)?;
            }
            Ok(())
        });
        let wrote = {
            let mut pending = 0u64;
            let mut report = |n: u64| {
                pending += n;
                if pending >= EARLY_SYNC_BYTES {
                    pending = 0;
                    // The syncer is gone only when a sync failed: the
                    // error comes from its join.
                    let _ = tx.send(());
                }
            };
            write(&mut report)
        };
        drop(tx);
        let synced = syncer.join().unwrap_or_else(|_| {
            Err(Error::io(
                path,
                "fsync",
                std::io::Error::other("a sync thread panicked"),
            ))
        });
        wrote.and(synced)
    })
}

/// Writes and fsyncs new files (already created), several at a time: their
/// writeback overlaps.
fn write_all(jobs: &[(PathBuf, File, Body<'_>)]) -> Result<()> {
    let write = |(path, f, body): &(PathBuf, File, Body<'_>)| -> Result<()> {
        match body {
            Body::Bytes(b) => f
                .write_all_at(b, 0)
                .map_err(|e| Error::io(path, "write", e))?,
            Body::Heap(image, n) => {
                let Some(seg) = image.segments.get(*n) else {
                    return Err(Error::io(
                        path,
                        "write",
                        std::io::Error::other("no such heap segment"),
                    ));
                };
                syncing_early(f, path, seg.len, |w| seg.write(&image.shared, f, path, w))?;
            }
            Body::Index(image) => {
                let len = image.params.index_len().unwrap_or(0);
                files::allocate(f, path, len)?;
                syncing_early(f, path, len, |w| image.write_index(f, path, w))?;
            }
        }
        files::sync_data(f, path)
    };
    let workers = jobs.len().min(4);
    if workers <= 1 {
        return jobs.iter().try_for_each(write);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else {
                            return Ok(());
                        };
                        write(job)?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::io(
                        &jobs[0].0,
                        "write",
                        std::io::Error::other("a writer thread panicked"),
                    ))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}

impl Commit {
    /// Writes the images of several banks (index path, image, owner and
    /// mode of the bank's new files) under temporary names, all of them
    /// written and fsynced together, to be renamed into place by
    /// [`Commit::apply`]. A file that replaces another keeps its owner and
    /// mode ([`Ownership::replacing`]); the files of the `master_keys` bank
    /// (private keys) are never wider than 0600, whatever they replace.
    fn stage_all(&mut self, banks: Vec<(PathBuf, Image, Ownership)>) -> Result<()> {
        let rosters: Vec<Vec<u8>> = banks
            .iter()
            .map(|(_, image, _)| roster::encode(&image.roster))
            .collect();
        // Per bank: (temporary, final name, contents), in rename order.
        let mut plans: Vec<Vec<(PathBuf, PathBuf, Body<'_>)>> = Vec::new();
        for ((index, image, _), roster_bytes) in banks.iter().zip(&rosters) {
            let dir = index.parent().unwrap_or(Path::new("."));
            let name = index
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let tag = format!(
                "{TMP_PREFIX}{name}.{}.{}",
                std::process::id(),
                files::now_ns()
            );
            let tmp = |suffix: &str| dir.join(format!("{tag}{suffix}"));
            let mut plan = Vec::new();
            for n in (0..image.segments.len()).rev() {
                plan.push((
                    tmp(&format::segment_suffix(n as u16)),
                    format::segment_path(index, n as u16),
                    Body::Heap(image, n),
                ));
            }
            plan.push((tmp(""), index.clone(), Body::Index(image)));
            plan.push((
                tmp(format::ROSTER_SUFFIX),
                format::roster_path(index),
                Body::Bytes(roster_bytes),
            ));
            plans.push(plan);
        }
        // Created one by one, in order; written and fsynced together.
        let mut jobs = Vec::new();
        let mut renames: Vec<Vec<(PathBuf, PathBuf)>> = Vec::new();
        for (plan, (index, _, own)) in plans.into_iter().zip(&banks) {
            let private = index.file_name() == Some(std::ffi::OsStr::new(format::MASTER_INDEX));
            let mut r = Vec::with_capacity(plan.len());
            for (t, final_path, body) in plan {
                let mut o = own.replacing(&final_path);
                if private {
                    o.mode &= 0o600;
                }
                let f = files::create_new_unsynced(&t, &o)?;
                jobs.push((t.clone(), f, body));
                r.push((t, final_path));
            }
            renames.push(r);
        }
        write_all(&jobs)?;
        drop(jobs);
        for ((index, image, _), r) in banks.iter().zip(renames) {
            // Segments of the old bank past the new image's last one.
            for old in crate::format::discover(index)
                .into_iter()
                .skip(image.segments.len())
            {
                self.removals.push(old);
            }
            self.renames.extend(r);
            self.locks.push(format::lock_path(index));
            self.dir = Some(index.parent().unwrap_or(Path::new(".")).to_path_buf());
        }
        Ok(())
    }

    /// Journals the renames, performs them, removes stale segments and the
    /// journal. The caller holds the locks of every bank staged.
    ///
    /// `settle` is how long to keep the locks after the renames while other
    /// processes map the replaced files ([`DEFAULT_SETTLE`]).
    fn apply(self, settle: Duration) -> Result<()> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        journal::commit(&dir, &self.locks, &self.renames, &self.removals, settle)
    }
}

impl Table {
    /// Replaces the bank by the image that `build` makes under the bank's
    /// lock (reading what the image is built from), atomically.
    pub fn replace_with(&self, build: impl FnOnce(&Table) -> Result<Image>) -> Result<()> {
        replace(&[self], || Ok(vec![build(self)?]))
    }
}

/// Rebuilds `table` without garbage and tombstones, optionally into a table
/// of `size` slots, atomically. Entries keep their mtimes and roster order.
/// Refuses (changing nothing) when an entry cannot be read intact: run
/// `keycache verify --repair` first.
pub fn compact(table: &Table, size: Option<u64>) -> Result<()> {
    replace(&[table], || Ok(vec![compacted(table, size)?]))
}

/// Replaces the banks of `tables` (banks of one directory, locked in the
/// order given) by the images that `build` makes under their locks,
/// in one atomic rebuild: leftovers of killed rebuilds are removed first,
/// then the images are staged under temporary names and renamed into place
/// through one journal. A failure of `build` (or a crash) changes nothing.
pub(crate) fn replace(tables: &[&Table], build: impl FnOnce() -> Result<Vec<Image>>) -> Result<()> {
    replace_then(tables, build, || Ok(()))
}

/// [`replace`], then `after` once the new images are in place, still under
/// the banks' locks (a merge writes the key tree there). `after` does not
/// run when the rebuild fails.
pub(crate) fn replace_then(
    tables: &[&Table],
    build: impl FnOnce() -> Result<Vec<Image>>,
    after: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let Some(first) = tables.first() else {
        return Ok(());
    };
    // Refused before any lock file is created, and again under the locks.
    for t in tables {
        crate::fit::check(t.path(), t.params())?;
    }
    let run = || -> Result<()> {
        for t in tables {
            crate::fit::check(t.path(), t.params())?;
            remove_temps_of(t.path())?;
        }
        let images = build()?;
        if images.len() != tables.len() {
            return Err(Error::InvalidParams(format!(
                "a rebuild of {} banks was given {} images",
                tables.len(),
                images.len()
            )));
        }
        // Never drop a live entry the caller did not name.
        for (t, image) in tables.iter().zip(&images) {
            let missing: Vec<String> = t
                .live_ids()?
                .into_iter()
                .filter(|id| !image.accounts_for(id))
                .map(|id| String::from_utf8_lossy(&id).into_owned())
                .collect();
            if !missing.is_empty() {
                return Err(Error::WouldDrop {
                    path: t.path().into(),
                    count: missing.len(),
                    ids: missing
                        .iter()
                        .take(10)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        let banks = tables
            .iter()
            .zip(images)
            .map(|(t, image)| (t.path().to_path_buf(), image, t.ownership()))
            .collect();
        let mut c = Commit::default();
        c.stage_all(banks)?;
        c.apply(first.rebuild_settle())?;
        after()
    };
    let dir = first.path().parent();
    if tables.iter().any(|t| t.path().parent() != dir) {
        return Err(Error::InvalidParams(
            "a rebuild replaces banks of one directory (one journal)".into(),
        ));
    }
    locked(tables, run)
}

/// Runs `run` holding the locks of `tables`, taken in the order given.
fn locked<T>(tables: &[&Table], run: impl FnOnce() -> Result<T>) -> Result<T> {
    match tables.split_first() {
        None => run(),
        Some((t, rest)) => t.exclusive(|| locked(rest, run)),
    }
}

/// The image of `table` compacted (see [`compact`]); the caller holds its
/// lock.
pub(crate) fn compacted(table: &Table, size: Option<u64>) -> Result<Image> {
    let mut params = *table.params();
    if let Some(s) = size {
        params.size = s;
    }
    let mut image = Image::new(params)?;
    for r in table.iter()? {
        let r = r?;
        image.insert(&r.id, &r.value, r.mtime, table.path())?;
    }
    Ok(image)
}
