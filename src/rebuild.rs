//! Atomic rebuilds: a bank image built in memory, written under temporary
//! names, fsynced, then renamed into place through a roll-forward journal.
//!
//! Salt's own rebuild renames heap segments, heap, index and roster one after
//! another, so a crash in the middle leaves an old index over a new heap.
//! keycache writes the list of renames to `D/.keycache-journal` (fsynced)
//! before the first one; every keycache writer that takes a bank's lock, and
//! every `Store::open`, finishes a journal it finds, so after a crash the
//! store is the whole old state (no journal yet) or the whole new one.
//! Renames follow Salt's order (segments, heap, index, roster); heap segments
//! that the new image does not use are removed last.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::{self, Ownership};
use crate::heap;
use crate::layout::{self, Params, HEADER_MAGIC, OCCUPIED};
use crate::roster;
use crate::table::Table;

/// Name of the roll-forward journal in a store directory.
pub const JOURNAL: &str = ".keycache-journal";
/// Prefix of temporary files of a rebuild in progress.
pub const TMP_PREFIX: &str = ".keycache-tmp.";

/// A bank built in memory: index bytes, heap segments and roster.
#[derive(Debug)]
pub struct Image {
    params: Params,
    index: Vec<u8>,
    segments: Vec<Vec<u8>>,
    roster: Vec<u32>,
    occupied: u64,
    hwm: u64,
}

impl Image {
    /// An empty image for a table with `params`.
    pub fn new(params: Params) -> Result<Image> {
        params.validate()?;
        let len = usize::try_from(params.index_len().unwrap_or(u64::MAX)).map_err(|_| {
            Error::InvalidParams(format!(
                "index of {} slots does not fit in memory",
                params.size
            ))
        })?;
        let mut index = vec![0u8; len];
        index[0] = HEADER_MAGIC;
        Ok(Image {
            params,
            index,
            segments: vec![Vec::new()],
            roster: Vec::new(),
            occupied: 0,
            hwm: 0,
        })
    }

    /// Number of entries.
    pub fn len(&self) -> u64 {
        self.occupied
    }

    /// Whether the image holds no entry.
    pub fn is_empty(&self) -> bool {
        self.occupied == 0
    }

    /// Inserts (or replaces) `id` with `value`, written at `mtime`.
    pub fn insert(&mut self, id: &[u8], value: &[u8], mtime: u64, path: &Path) -> Result<()> {
        let p = self.params;
        if id.is_empty() || id.len() > p.id_size || id.contains(&0) {
            return Err(Error::IdTooLong {
                id: String::from_utf8_lossy(id).into_owned(),
                len: id.len(),
                id_size: p.id_size,
                slot: layout::min_slot_size(id.len()).max(p.slot_size),
            });
        }
        let vlen = u32::try_from(value.len()).map_err(|_| Error::ValueTooLarge {
            id: String::from_utf8_lossy(id).into_owned(),
            len: value.len(),
        })?;
        let home = p.home(id);
        let mut target = None;
        let mut existing = false;
        for step in 0..p.capacity() {
            let slot = p.probe(home, step);
            let off = p.slot_offset(slot);
            if self.index[off] != OCCUPIED {
                target = Some(slot);
                break;
            }
            if layout::slot_id_eq(&p, &self.index[off..off + p.slot_used()], id) {
                target = Some(slot);
                existing = true;
                break;
            }
        }
        let Some(slot) = target else {
            return Err(Error::TableFull {
                path: path.into(),
                capacity: p.capacity(),
            });
        };
        // Append the record, rolling segments as Salt does.
        let rec = layout::record_len(value.len());
        let mut seg = self.segments.len() - 1;
        if !self.segments[seg].is_empty()
            && self.segments[seg].len() as u64 + rec > p.max_segment_bytes
        {
            if seg == usize::from(u16::MAX) {
                return Err(Error::InvalidParams(
                    "more than 65536 heap segments; raise the segment cap".into(),
                ));
            }
            self.segments.push(Vec::new());
            seg += 1;
        }
        let packed = layout::pack_offset(seg as u16, self.segments[seg].len() as u64);
        layout::encode_record(value, &mut self.segments[seg]);
        let off = p.slot_offset(slot);
        let s = &mut self.index[off..off + p.slot_size];
        s[0] = OCCUPIED;
        s[1..1 + p.id_size].fill(0);
        s[1..1 + id.len()].copy_from_slice(id);
        s[p.offset_field()..p.offset_field() + 8].copy_from_slice(&packed.to_le_bytes());
        s[p.length_field()..p.length_field() + 4].copy_from_slice(&vlen.to_le_bytes());
        s[p.mtime_field()..p.mtime_field() + 8].copy_from_slice(&mtime.to_le_bytes());
        if !existing {
            self.roster.push(slot as u32);
            self.occupied += 1;
            self.hwm = self.hwm.max(slot);
        }
        Ok(())
    }

    fn finish_header(&mut self) {
        self.index[layout::HDR_OCCUPIED..layout::HDR_OCCUPIED + 8]
            .copy_from_slice(&self.occupied.to_le_bytes());
        self.index[layout::HDR_DELETED..layout::HDR_DELETED + 8].fill(0);
        self.index[layout::HDR_HWM..layout::HDR_HWM + 8].copy_from_slice(&self.hwm.to_le_bytes());
    }
}

/// A set of bank images to swap into place together.
#[derive(Debug, Default)]
pub struct Commit {
    renames: Vec<(PathBuf, PathBuf)>,
    removals: Vec<PathBuf>,
    locks: Vec<PathBuf>,
    dir: Option<PathBuf>,
}

fn write_file(path: &Path, bytes: &[u8], own: &Ownership) -> Result<()> {
    let f: File = files::create_new(path, own)?;
    f.write_all_at(bytes, 0)
        .map_err(|e| Error::io(path, "write", e))?;
    files::sync_data(&f, path)
}

/// Writes a mostly-zero file: the blocks are reserved (so later writes
/// through a mapping cannot fail for want of space) and only the chunks
/// holding non-zero bytes are written.
fn write_sparse(path: &Path, bytes: &[u8], own: &Ownership) -> Result<()> {
    const CHUNK: usize = 64 * 1024;
    let f: File = files::create_new(path, own)?;
    files::allocate(&f, path, bytes.len() as u64)?;
    for (i, c) in bytes.chunks(CHUNK).enumerate() {
        if c.iter().any(|&b| b != 0) {
            f.write_all_at(c, (i * CHUNK) as u64)
                .map_err(|e| Error::io(path, "write", e))?;
        }
    }
    files::sync_data(&f, path)
}

impl Commit {
    /// Writes `image` for the bank whose index is `index` under temporary
    /// names (fsynced), to be renamed into place by [`Commit::apply`].
    pub fn stage(&mut self, index: &Path, mut image: Image, own: &Ownership) -> Result<()> {
        image.finish_header();
        let dir = index.parent().unwrap_or(Path::new(".")).to_path_buf();
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
        let mut renames = Vec::new();
        for (n, seg) in image.segments.iter().enumerate().skip(1).rev() {
            let t = tmp(&format!(".heap.{n}"));
            let final_path = heap::segment_path(index, n as u16);
            write_file(&t, seg, &own.replacing(&final_path))?;
            renames.push((t, final_path));
        }
        let heap0 = heap::segment_path(index, 0);
        let t = tmp(".heap");
        write_file(&t, &image.segments[0], &own.replacing(&heap0))?;
        renames.push((t, heap0));
        let t = tmp("");
        write_sparse(&t, &image.index, &own.replacing(index))?;
        renames.push((t, index.to_path_buf()));
        let rpath = files::with_suffix(index, ".roster");
        let t = tmp(".roster");
        write_file(&t, &roster::encode(&image.roster), &own.replacing(&rpath))?;
        renames.push((t, rpath));
        // Segments of the old bank past the new image's last one.
        for old in heap::discover(index).into_iter().skip(image.segments.len()) {
            self.removals.push(old);
        }
        self.renames.extend(renames);
        self.locks.push(files::with_suffix(index, ".lock"));
        self.dir = Some(dir);
        Ok(())
    }

    /// Journals the renames, performs them, removes stale segments and the
    /// journal. The caller holds the locks of every bank staged.
    pub fn apply(self) -> Result<()> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        files::sync_dir(&dir)?;
        let journal = dir.join(JOURNAL);
        let mut text = String::new();
        for l in &self.locks {
            text.push_str(&format!("lock\t{}\n", l.display()));
        }
        for (a, b) in &self.renames {
            text.push_str(&format!("rename\t{}\t{}\n", a.display(), b.display()));
        }
        for r in &self.removals {
            text.push_str(&format!("remove\t{}\n", r.display()));
        }
        text.push_str("end\n");
        files::remove_if_exists(&journal)?;
        write_file(
            &journal,
            text.as_bytes(),
            &Ownership {
                owner: None,
                mode: files::DEFAULT_MODE,
                explicit: false,
            },
        )?;
        files::sync_dir(&dir)?;
        finish(&dir, &text)
    }
}

/// Performs a journal's steps (each is idempotent) and removes it.
fn finish(dir: &Path, text: &str) -> Result<()> {
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["rename", a, b] if Path::new(a).exists() => files::rename(Path::new(a), Path::new(b))?,
            ["remove", p] => files::remove_if_exists(Path::new(p))?,
            _ => {}
        }
    }
    files::sync_dir(dir)?;
    files::remove_if_exists(&dir.join(JOURNAL))?;
    files::sync_dir(dir)
}

/// Finishes a rebuild that a crash interrupted, if `dir` has a complete
/// journal, and removes temporary files of rebuilds that never reached
/// their journal. `held` is the lock file the caller already holds; the
/// locks of the other banks in the journal are taken here.
pub(crate) fn roll_forward(dir: &Path, held: Option<&Path>) -> Result<()> {
    let journal = dir.join(JOURNAL);
    let text = match std::fs::read_to_string(&journal) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(&journal, "read", e)),
    };
    if !text.ends_with("end\n") {
        // Torn journal: the renames never started; drop it and its temps.
        files::remove_if_exists(&journal)?;
        return remove_temps(dir);
    }
    let mut locks = Vec::new();
    for line in text.lines() {
        if let Some(l) = line.strip_prefix("lock\t") {
            if Some(Path::new(l)) != held {
                let f = files::open_regular(Path::new(l), true)?;
                f.lock().map_err(|e| Error::io(l, "flock", e))?;
                locks.push(f);
            }
        }
    }
    // Another process may have finished it while we waited for the locks.
    if dir.join(JOURNAL).exists() {
        finish(dir, &text)?;
    }
    drop(locks);
    Ok(())
}

/// Removes leftovers of rebuilds killed before their journal was written.
/// The caller holds the lock of the banks concerned.
pub(crate) fn remove_temps_of(index: &Path) -> Result<()> {
    let dir = index.parent().unwrap_or(Path::new("."));
    let name = index
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!("{TMP_PREFIX}{name}.");
    remove_matching(dir, |n| n.starts_with(&prefix))
}

fn remove_temps(dir: &Path) -> Result<()> {
    remove_matching(dir, |n| n.starts_with(TMP_PREFIX))
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

/// Rebuilds `table` without garbage and tombstones, optionally into a table
/// of `size` slots, atomically. Entries keep their mtimes and roster order.
/// Refuses (changing nothing) when an entry cannot be read intact: run
/// `keycache verify --repair` first.
pub fn compact(table: &Table, size: Option<u64>) -> Result<()> {
    let mut params = *table.params();
    if let Some(s) = size {
        params.size = s;
    }
    table.replace_with(|t| {
        let mut image = Image::new(params)?;
        for r in t.iter()? {
            let r = r?;
            image.insert(&r.id, &r.value, r.mtime, t.path())?;
        }
        Ok(image)
    })
}
