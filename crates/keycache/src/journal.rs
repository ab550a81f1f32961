//! The roll-forward journal of atomic rebuilds.
//!
//! Salt's own rebuild renames heap segments, heap, index and roster one after
//! another, so a crash in the middle leaves an old index over a new heap.
//! keycache writes the list of renames to `D/.keycache-journal` (fsynced)
//! before the first one; every keycache writer that takes a bank's lock, and
//! every `Store::open`, finishes a journal it finds, so after a crash the
//! store is the whole old state (no journal yet) or the whole new one.
//! Finishing a journal starts by marking the indexes it replaces as retired,
//! so that readers still mapping them move at their next lookup.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::files::{self, Ownership};

use crate::format::JOURNAL_TMP_PREFIX;
pub use crate::format::{JOURNAL, TMP_PREFIX};

/// How long a rebuild keeps its banks locked after renaming the new files
/// into place, unless set otherwise ([`crate::OpenOptions::rebuild_settle`]).
///
/// Salt 3008's writers re-check whether the index was replaced at most every
/// 0.25 s (`MmapCache.open`, `staleness_check_interval`), also under the
/// lock: a Salt writer that takes the lock within 0.25 s of its previous
/// check writes through its mapping of the old index, into the new heap by
/// path (an in-place rewrite lands on another record; an append's slot is
/// lost). Holding the lock a little longer than that interval after the
/// renames makes every Salt writer that gets it next re-check and map the
/// new files. The wait happens only when another process maps one of the
/// replaced files (found in `/proc/PID/maps`).
pub const DEFAULT_SETTLE: std::time::Duration = std::time::Duration::from_millis(300);

/// How long a roll-forward waits for the lock of another bank that its
/// journal names before giving up (the holder finishes the journal itself).
const OTHER_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn file_name(p: &Path) -> Option<String> {
    p.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Owner of the directory, mode 0600: what the journal gets, so that the
/// Salt master's user can finish a journal that root left.
fn dir_ownership(dir: &Path) -> Ownership {
    Ownership::for_dir(dir).unwrap_or(Ownership {
        owner: None,
        mode: files::DEFAULT_MODE,
        explicit: false,
    })
}

/// Takes the directory's journal lock (blocking): `flock` on the directory
/// itself, so the store holds no file beyond Salt's.
fn lock_journal(dir: &Path) -> Result<File> {
    let f = File::open(dir).map_err(|e| Error::io(dir, "open", e))?;
    f.lock().map_err(|e| Error::io(dir, "flock", e))?;
    Ok(f)
}

/// One step of a journal, with names relative to the journal's directory.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Lock(String),
    Rename(String, String),
    Remove(String),
}

/// Parses a complete journal. Every name is taken as a file of the
/// journal's own directory (journals of older versions held whole paths:
/// only their last component is used, so a moved or differently mounted
/// store still rolls forward, and no journal can reach outside it). Rename
/// sources must be rebuild temporaries; nothing may touch a journal file.
fn parse_journal(text: &str) -> std::result::Result<Vec<Step>, String> {
    let name = |s: &str| -> std::result::Result<String, String> {
        let n = Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("{s:?} names no file"))?;
        if n.starts_with(JOURNAL) {
            return Err(format!("{s:?} names a journal file"));
        }
        Ok(n)
    };
    let mut steps = Vec::new();
    let mut ended = false;
    for line in text.lines() {
        if ended {
            return Err("text after the end marker".into());
        }
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["lock", l] => steps.push(Step::Lock(name(l)?)),
            ["rename", a, b] => {
                let (a, b) = (name(a)?, name(b)?);
                if !a.starts_with(TMP_PREFIX) {
                    return Err(format!("rename source {a:?} is not a rebuild temporary"));
                }
                if b.starts_with(TMP_PREFIX) {
                    return Err(format!("rename target {b:?} is a rebuild temporary"));
                }
                steps.push(Step::Rename(a, b));
            }
            ["remove", r] => {
                let r = name(r)?;
                if r.starts_with(TMP_PREFIX) {
                    return Err(format!("removal of {r:?}, a rebuild temporary"));
                }
                steps.push(Step::Remove(r));
            }
            ["end"] => ended = true,
            _ => return Err(format!("unknown line {line:?}")),
        }
    }
    if !ended {
        return Err("no end marker".into());
    }
    Ok(steps)
}

/// Performs a journal's steps (each is idempotent) and removes it; then, if
/// files that another process maps were replaced, waits out Salt's
/// staleness interval (see [`DEFAULT_SETTLE`]) before the caller releases
/// the locks.
fn finish(dir: &Path, steps: &[Step], settle: Duration) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // The files about to be replaced, to look for them in other processes'
    // mappings afterwards.
    let replaced: Vec<(u64, u64)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Rename(a, b) if std::fs::symlink_metadata(dir.join(a)).is_ok() => {
                std::fs::symlink_metadata(dir.join(b))
                    .ok()
                    .map(|m| (m.dev(), m.ino()))
            }
            _ => None,
        })
        .collect();
    retire_indexes(dir, steps)?;
    for s in steps {
        match s {
            Step::Rename(a, b) => {
                let (a, b) = (dir.join(a), dir.join(b));
                if std::fs::symlink_metadata(&a).is_ok() {
                    files::rename(&a, &b)?;
                }
            }
            Step::Remove(p) => files::remove_if_exists(&dir.join(p))?,
            Step::Lock(_) => {}
        }
    }
    files::sync_dir(dir)?;
    files::remove_if_exists(&dir.join(JOURNAL))?;
    files::sync_dir(dir)?;
    if !replaced.is_empty() && mapped_elsewhere(&replaced) {
        std::thread::sleep(settle);
    }
    Ok(())
}

/// Marks the index of each bank the journal names (by its lock file) as
/// retired when the journal still has to rename a new index over it (its
/// temporary is still there): readers that map it move to the new files at
/// their next lookup (see [`crate::format::RETIRED_MAGIC`]). After a crash
/// the roll-forward marks what is left to replace, never a new index.
fn retire_indexes(dir: &Path, steps: &[Step]) -> Result<()> {
    for s in steps {
        let Step::Lock(lock) = s else { continue };
        let Some(index) = lock.strip_suffix(crate::format::LOCK_SUFFIX) else {
            continue;
        };
        let pending = steps.iter().any(|t| {
            matches!(t, Step::Rename(a, b)
                if b == index && std::fs::symlink_metadata(dir.join(a)).is_ok())
        });
        if pending {
            retire(&dir.join(index))?;
        }
    }
    Ok(())
}

/// Whether another process maps one of `files` ((dev, ino) pairs), as Salt
/// processes that used the bank do: only they can hold a stale view that
/// [`DEFAULT_SETTLE`] waits out. Processes whose maps this one may not read
/// are not seen.
fn mapped_elsewhere(files: &[(u64, u64)]) -> bool {
    // Linux's (glibc's) encoding of dev_t, as /proc/PID/maps prints it.
    let split = |dev: u64| {
        (
            ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
            (dev & 0xff) | ((dev >> 12) & !0xff),
        )
    };
    let wanted: Vec<((u64, u64), u64)> = files.iter().map(|&(d, i)| (split(d), i)).collect();
    let me = std::process::id().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str() else { continue };
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // Gone meanwhile, or not ours to read (another user's, when not
        // root: run rebuilds as root or as the master's user).
        let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) else {
            continue;
        };
        for line in maps.lines() {
            let mut f = line.split_ascii_whitespace().skip(3);
            let (Some(dev), Some(ino)) = (f.next(), f.next()) else {
                continue;
            };
            let Ok(ino) = ino.parse::<u64>() else {
                continue;
            };
            if ino == 0 {
                continue;
            }
            let Some((maj, min)) = dev.split_once(':') else {
                continue;
            };
            let (Ok(maj), Ok(min)) = (u64::from_str_radix(maj, 16), u64::from_str_radix(min, 16))
            else {
                continue;
            };
            if wanted.iter().any(|&(d, i)| d == (maj, min) && i == ino) {
                return true;
            }
        }
    }
    false
}

/// Finishes the journal of `dir`, if there is one, holding the journal lock.
/// `held` are the names of the bank lock files the caller holds; the other
/// banks' locks that the journal names are taken here (waiting at most
/// [`OTHER_LOCK_WAIT`]: their holder finishes the journal when it gets ours).
fn process_journal(dir: &Path, held: &[String], settle: Duration) -> Result<()> {
    let journal = dir.join(JOURNAL);
    let text = match files::open_regular(&journal, false) {
        Ok(mut f) => {
            let mut t = String::new();
            std::io::Read::read_to_string(&mut f, &mut t)
                .map_err(|e| Error::io(&journal, "read", e))?;
            t
        }
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e),
    };
    if !text.ends_with("end\n") {
        // Never completed (journals appear by a rename after their fsync, so
        // only a lost write leaves one): the renames never started. Drop it;
        // its temporaries go with the next rebuild of their bank.
        files::remove_if_exists(&journal)?;
        return files::sync_dir(dir);
    }
    let steps = parse_journal(&text).map_err(|why| Error::Corrupt {
        path: journal.clone(),
        id: None,
        why: format!("refusing to act on this journal ({why}); remove it if no keycache rebuild was interrupted"),
    })?;
    let mut locks = Vec::new();
    for s in &steps {
        let Step::Lock(l) = s else { continue };
        if held.contains(l) {
            continue;
        }
        let path = dir.join(l);
        let f = match files::open_regular(&path, true) {
            Ok(f) => f,
            // No lock file: nobody can hold it.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let deadline = std::time::Instant::now() + OTHER_LOCK_WAIT;
        loop {
            match f.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::io(
                        &path,
                        "flock (held by another process while an interrupted rebuild waits to be finished; retry)",
                        std::io::ErrorKind::WouldBlock.into(),
                    ))
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, "flock", e)),
            }
        }
        locks.push(f);
    }
    finish(dir, &steps, settle)?;
    drop(locks);
    Ok(())
}

/// Finishes a rebuild that a crash interrupted, if `dir` has a complete
/// journal. `held` is the lock file the caller already holds; the locks of
/// the other banks in the journal are taken here.
pub(crate) fn roll_forward(dir: &Path, held: Option<&Path>, settle: Duration) -> Result<()> {
    if std::fs::symlink_metadata(dir.join(JOURNAL)).is_err() {
        return Ok(());
    }
    let _journal_lock = lock_journal(dir)?;
    let held: Vec<String> = held.and_then(file_name).into_iter().collect();
    process_journal(dir, &held, settle)
}

/// Finishes a rebuild of a bank of `dir` that a crash interrupted, when it
/// left a complete journal (a no-op otherwise), taking the locks of the
/// banks it names. A tool that reads a store's layout off its files (the
/// table size from an index's length) calls this first: a compaction into
/// another size is half-way between the two sizes until its journal is done.
///
/// `settle` is [`crate::OpenOptions::rebuild_settle`].
pub fn finish_interrupted(dir: &Path, settle: Duration) -> Result<()> {
    roll_forward(dir, None, settle)
}

/// Removes leftovers of rebuilds killed before their journal was written,
/// and of index creations killed half-way (and roster rewrites, which
/// earlier versions made). The caller holds the lock of the banks concerned.
pub(crate) fn remove_temps_of(index: &Path) -> Result<()> {
    let dir = index.parent().unwrap_or(Path::new("."));
    let name = index
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!("{TMP_PREFIX}{name}.");
    // Also what a writer killed while creating the index left
    // (`I.keycache-new.PID`), and a roster rewrite of an earlier version
    // (`I.roster.keycache-new.PID`; roster recovery now patches in place):
    // both were made under this bank's lock, which the caller holds.
    let new_index = format!("{name}.keycache-new.");
    let new_roster = format!("{name}.roster.keycache-new.");
    remove_matching(dir, |n| {
        n.starts_with(&prefix) || n.starts_with(&new_index) || n.starts_with(&new_roster)
    })
}

fn remove_matching(dir: &Path, f: impl Fn(&str) -> bool) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "read directory", e))?;
    for e in rd.flatten() {
        let name = e.file_name();
        if let Some(n) = name.to_str() {
            if f(n) {
                files::remove_if_exists(&e.path())?;
            }
        }
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8], own: &Ownership) -> Result<()> {
    let f: File = files::create_new_unsynced(path, own)?;
    f.write_all_at(bytes, 0)
        .map_err(|e| Error::io(path, "write", e))?;
    files::sync_data(&f, path)
}

/// The journal's text: the banks' lock files, the renames in order, each
/// bank's stale segments removed right before its index is renamed, `end`.
fn journal_text(locks: &[PathBuf], renames: &[(PathBuf, PathBuf)], removals: &[PathBuf]) -> String {
    let mut text = String::new();
    let name = |p: &Path| file_name(p).unwrap_or_default();
    for l in locks {
        text.push_str(&format!("lock\t{}\n", name(l)));
    }
    // A bank's stale segments go before its index is renamed: a reader
    // that maps the new index must never find an old segment under a
    // number the new heap may reach later (it would keep that mapping, and
    // read another id's record through it, once a writer rolls into a new
    // file of that number). Readers that map the old index meanwhile map
    // its segments already, or see its retired mark and wait.
    let mut removed = vec![false; removals.len()];
    for (a, b) in renames {
        let heap = format!("{}{}", name(b), crate::format::HEAP_SUFFIX);
        for (r, done) in removals.iter().zip(removed.iter_mut()) {
            if !*done && name(r).starts_with(&heap) {
                text.push_str(&format!("remove\t{}\n", name(r)));
                *done = true;
            }
        }
        text.push_str(&format!("rename\t{}\t{}\n", name(a), name(b)));
    }
    for (r, done) in removals.iter().zip(&removed) {
        if !done {
            text.push_str(&format!("remove\t{}\n", name(r)));
        }
    }
    text.push_str("end\n");
    text
}

/// Journals `renames` and `removals` of the banks whose lock files are
/// `locks` (all in `dir`), performs them, and removes the journal. The
/// caller holds every one of those locks.
///
/// `settle` is how long to keep the locks after the renames while other
/// processes map the replaced files ([`DEFAULT_SETTLE`]).
pub(crate) fn commit(
    dir: &Path,
    locks: &[PathBuf],
    renames: &[(PathBuf, PathBuf)],
    removals: &[PathBuf],
    settle: Duration,
) -> Result<()> {
    files::sync_dir(dir)?;
    // One journal per directory: rebuilds of the banks of one directory
    // (each under its own bank lock) take turns on it.
    let _journal_lock = lock_journal(dir)?;
    // A journal a crash left half-written under its temporary name.
    remove_matching(dir, |n| n.starts_with(JOURNAL_TMP_PREFIX))?;
    let held: Vec<String> = locks.iter().filter_map(|l| file_name(l)).collect();
    // A journal that a crash left for another bank of this directory.
    process_journal(dir, &held, settle)?;
    let text = journal_text(locks, renames, removals);
    let steps = parse_journal(&text).map_err(|why| Error::Corrupt {
        path: dir.join(JOURNAL),
        id: None,
        why: format!("journal about to be written is invalid: {why}"),
    })?;
    // The journal appears whole or not at all: written under a temporary
    // name, fsynced, renamed.
    let journal = dir.join(JOURNAL);
    let tmp = dir.join(format!("{JOURNAL_TMP_PREFIX}{}", std::process::id()));
    files::remove_if_exists(&tmp)?;
    write_file(&tmp, text.as_bytes(), &dir_ownership(dir))?;
    files::rename(&tmp, &journal)?;
    files::sync_dir(dir)?;
    finish(dir, &steps, settle)
}

/// Marks the index file `index` as retired ([`crate::format::RETIRED_MAGIC`]), for a
/// journal about to rename a new index over it; the caller holds the bank's
/// lock. Readers that map it then look for the new files at their next
/// lookup. No index file: nothing to mark. An index this process may not
/// write (a journal left by another user, finished by the master's) is not
/// marked either: the journal must still be finished, and its readers then
/// see the new files within their refresh interval.
fn retire(index: &Path) -> Result<()> {
    let f = match files::open_regular(index, true) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied
                || source.raw_os_error() == Some(libc::EROFS) =>
        {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    if f.metadata().map_err(|e| Error::io(index, "stat", e))?.len() == 0 {
        return Ok(());
    }
    f.write_all_at(&[crate::format::RETIRED_MAGIC], 0)
        .map_err(|e| Error::io(index, "write", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bank's stale segments are removed after its segments are renamed
    /// and before its index is; removals of no renamed bank come last.
    #[test]
    fn stale_segments_go_before_their_index_is_renamed() {
        let d = Path::new("/s");
        let p = |n: &str| d.join(n);
        let tmp = |n: &str| p(&format!("{TMP_PREFIX}{n}"));
        let text = journal_text(
            &[p(".mmap_keys.idx.lock")],
            &[
                (tmp("k.1"), p(".mmap_keys.idx.heap.1")),
                (tmp("k.0"), p(".mmap_keys.idx.heap")),
                (tmp("k"), p(".mmap_keys.idx")),
                (tmp("k.r"), p(".mmap_keys.idx.roster")),
            ],
            &[
                p(".mmap_keys.idx.heap.2"),
                p(".mmap_keys.idx.heap.3"),
                p("other"),
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        let k = ".keycache-tmp.k";
        assert_eq!(
            lines,
            [
                "lock\t.mmap_keys.idx.lock".to_owned(),
                format!("rename\t{k}.1\t.mmap_keys.idx.heap.1"),
                format!("rename\t{k}.0\t.mmap_keys.idx.heap"),
                "remove\t.mmap_keys.idx.heap.2".to_owned(),
                "remove\t.mmap_keys.idx.heap.3".to_owned(),
                format!("rename\t{k}\t.mmap_keys.idx"),
                format!("rename\t{k}.r\t.mmap_keys.idx.roster"),
                "remove\tother".to_owned(),
                "end".to_owned(),
            ]
        );
        assert!(parse_journal(&text).is_ok());
    }
}
