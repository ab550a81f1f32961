//! The roster: a packed array of u32 slot numbers of live entries, in
//! insertion order, with removed entries overwritten by a tombstone.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{ROSTER_ENTRY_LEN, ROSTER_TOMBSTONE, ROSTER_TOMBSTONE_BYTES};

/// Reads a roster file whole. A missing roster is empty; a trailing partial
/// entry (a torn append) is ignored, as Salt ignores it.
pub(crate) fn read(path: &Path) -> Result<Vec<u32>> {
    let mut buf = Vec::new();
    read_raw_into(path, &mut buf)?;
    Ok(decode(&buf))
}

/// Reads a roster file whole into `buf` (its contents replaced, its memory
/// reused), as stored: whole entries only, a trailing partial entry cut
/// off. A missing roster leaves `buf` empty.
pub(crate) fn read_raw_into(path: &Path, buf: &mut Vec<u8>) -> Result<()> {
    buf.clear();
    let mut f = match crate::files::open_regular(path, false) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e),
    };
    f.read_to_end(buf).map_err(|e| Error::io(path, "read", e))?;
    buf.truncate(buf.len() - buf.len() % ROSTER_ENTRY_LEN);
    Ok(())
}

/// Entry `i` of a roster read by [`read_raw_into`], if there is one.
#[inline]
pub(crate) fn raw_entry(raw: &[u8], i: usize) -> Option<u32> {
    let at = i.checked_mul(ROSTER_ENTRY_LEN)?;
    let b = raw.get(at..at.checked_add(ROSTER_ENTRY_LEN)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// How many entries of a roster read by [`read_raw_into`] are not
/// tombstones ([`live_count`] of the raw bytes).
pub(crate) fn raw_live_count(raw: &[u8]) -> usize {
    (0..raw.len() / ROSTER_ENTRY_LEN)
        .filter(|&i| raw_entry(raw, i) != Some(ROSTER_TOMBSTONE))
        .count()
}

pub(crate) use crate::format::{decode_roster as decode, encode_roster as encode};

/// Number of entries that are not tombstones (Salt's live count).
pub(crate) fn live_count(entries: &[u32]) -> usize {
    entries.iter().filter(|&&s| s != ROSTER_TOMBSTONE).count()
}

/// Tombstones the entries at `positions` (entry indexes) and writes `append`
/// at the end, in place: every other entry keeps its byte offset, which
/// Salt's writers remember to tombstone their own entries later, through a
/// file descriptor that must stay on this very file. Does not sync.
pub(crate) fn patch(path: &Path, file: &File, positions: &[usize], append: &[u32]) -> Result<()> {
    let mut len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    len -= len % ROSTER_ENTRY_LEN as u64;
    for &i in positions {
        let at = (i * ROSTER_ENTRY_LEN) as u64;
        if at + ROSTER_ENTRY_LEN as u64 <= len {
            file.write_all_at(&ROSTER_TOMBSTONE_BYTES, at)
                .map_err(|e| Error::io(path, "write", e))?;
        }
    }
    if !append.is_empty() {
        file.write_all_at(&encode(append), len)
            .map_err(|e| Error::io(path, "write", e))?;
    }
    Ok(())
}

/// Applies tombstones and appends to an open roster file: every live entry
/// naming a slot in `remove` becomes a tombstone, then `append` is written at
/// the end. Does not sync.
pub(crate) fn update(path: &Path, file: &File, remove: &[u32], append: &[u32]) -> Result<()> {
    let mut len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    // A torn append leaves a partial entry: write after the last whole one.
    len -= len % ROSTER_ENTRY_LEN as u64;
    if !remove.is_empty() {
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, 0)
            .map_err(|e| Error::io(path, "read", e))?;
        let remove: std::collections::HashSet<u32> = remove.iter().copied().collect();
        for (i, s) in decode(&buf).into_iter().enumerate() {
            if s != ROSTER_TOMBSTONE && remove.contains(&s) {
                file.write_all_at(&ROSTER_TOMBSTONE_BYTES, (i * ROSTER_ENTRY_LEN) as u64)
                    .map_err(|e| Error::io(path, "write", e))?;
                stop_point!(path);
            }
        }
    }
    if !append.is_empty() {
        file.write_all_at(&encode(append), len)
            .map_err(|e| Error::io(path, "write", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_then_appends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.roster");
        std::fs::write(&p, encode(&[5, 7, 9])).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        update(&p, &f, &[7], &[7, 11]).unwrap();
        let r = read(&p).unwrap();
        assert_eq!(r, vec![5, ROSTER_TOMBSTONE, 9, 7, 11]);
        assert_eq!(live_count(&r), 4);
        // A torn trailing entry is ignored and overwritten by the next append.
        let mut raw = std::fs::read(&p).unwrap();
        raw.extend_from_slice(&[1, 2]);
        std::fs::write(&p, &raw).unwrap();
        assert_eq!(read(&p).unwrap().len(), 5);
        update(&p, &f, &[], &[13]).unwrap();
        assert_eq!(read(&p).unwrap(), vec![5, ROSTER_TOMBSTONE, 9, 7, 11, 13]);
        assert_eq!(
            read(&dir.path().join("missing")).unwrap(),
            Vec::<u32>::new()
        );
    }
}
