//! The removal log: the entries a store's writers removed since its last
//! observation, so that a removal the observation cannot see (an entry
//! added and removed between two observations) still leaves a tombstone.
//!
//! keycache-merge's `history` finds changes by comparing the store with the
//! versions it recorded. An entry added and removed between two
//! observations is in neither, so without this log it would leave no
//! tombstone, and a peer's older accept of the same id would come back at
//! the next merge. Every removal made through [`crate::Store`] (the CLI,
//! the Salt driver) of an entry the bank held is appended here, under the
//! `keys` bank's lock, before the bank is written, but only in a store
//! that has a history (a store that never took part in a merge keeps no
//! log). The next observation turns each logged id that is not live into a
//! tombstone, and the history's save (under both banks' locks) drops the
//! records it consumed. Salt's own `mmap_key` writer does not log: its
//! removals are seen by observations only.
//!
//! ```text
//! .keycache-removed (mode 0600, appended)
//!   removal: "\n" "KCR1" SP bank ("k" | "d") SP id (hex) SP sum "\n"
//!   marker:  "\n" "KCM1" SP seq (16 hex) SP offset (16 hex) SP sum "\n"
//! ```
//!
//! `sum` is the xxh3-64 (16 hex) of the text between the tag and it. Every
//! record begins and ends with a newline, so a record torn by a crash
//! (which fails its checksum, and is skipped) never runs into the next
//! one. A marker, appended by the history's save before it writes the
//! versions, says that the removals before `offset` are in the versions
//! file of sequence number `seq`: when a crash comes between that save and
//! the trim, the next observation skips them (they were recorded).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::Ownership;

use crate::format::REMOVALS_FILE;

/// One logged removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// From the `denied_keys` bank (else `keys`).
    pub denied: bool,
    /// The id removed.
    pub id: String,
}

fn record(tag: &str, body: &str) -> Vec<u8> {
    let sum = crate::format::hash(body.as_bytes());
    format!("\n{tag} {body} {sum:016x}\n").into_bytes()
}

fn line(denied: bool, id: &[u8]) -> Vec<u8> {
    record(
        "KCR1",
        &format!("{} {}", if denied { 'd' } else { 'k' }, hex(id)),
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

enum Line {
    Removal(Removal),
    Marker { seq: u64, offset: u64 },
}

fn parse(l: &str) -> Option<Line> {
    let (tag, rest) = l.split_once(' ')?;
    let (body, sum) = rest.rsplit_once(' ')?;
    if sum.len() != 16 || u64::from_str_radix(sum, 16).ok()? != crate::format::hash(body.as_bytes())
    {
        return None;
    }
    let mut f = body.split(' ');
    let out = match tag {
        "KCR1" => {
            let denied = match f.next()? {
                "k" => false,
                "d" => true,
                _ => return None,
            };
            let id = String::from_utf8(unhex(f.next()?)?).ok()?;
            Line::Removal(Removal { denied, id })
        }
        "KCM1" => Line::Marker {
            seq: u64::from_str_radix(f.next()?, 16).ok()?,
            offset: u64::from_str_radix(f.next()?, 16).ok()?,
        },
        _ => return None,
    };
    f.next().is_none().then_some(out)
}

fn open_append(dir: &Path) -> Result<(std::fs::File, PathBuf, bool)> {
    let path = dir.join(REMOVALS_FILE);
    let created = !path.exists();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(crate::files::DEFAULT_MODE)
        .custom_flags(crate::files::NO_FOLLOW)
        .open(&path)
        .map_err(|e| Error::io(&path, "open", e))?;
    let meta = f.metadata().map_err(|e| Error::io(&path, "stat", e))?;
    if !meta.is_file() {
        return Err(Error::NotARegularFile {
            path,
            why: "it is not a regular file",
        });
    }
    if created {
        Ownership::for_dir(dir)?.apply(&f, &path)?;
    }
    Ok((f, path, created))
}

fn append_bytes(dir: &Path, bytes: &[u8]) -> Result<()> {
    let (f, path, created) = open_append(dir)?;
    (&f).write_all(bytes)
        .map_err(|e| Error::io(&path, "append to", e))?;
    crate::files::sync_data(&f, &path)?;
    if created {
        crate::files::sync_dir(dir)?;
    }
    Ok(())
}

/// Whether the store in `dir` keeps a removal log: it has a history (its
/// identity file), which the next observation reads the log into.
pub(crate) fn kept_in(dir: &Path) -> bool {
    dir.join(crate::format::IDENTITY_FILE).exists()
}

/// Appends the removals of `ids` (bank: `denied`) to the log of the store
/// in `dir`, durably, when the store has a history; does nothing
/// otherwise. Call it holding the `keys` bank's lock.
pub(crate) fn append(dir: &Path, ids: &[(bool, Vec<u8>)]) -> Result<()> {
    if ids.is_empty() || !kept_in(dir) {
        return Ok(());
    }
    let bytes: Vec<u8> = ids.iter().flat_map(|(d, id)| line(*d, id)).collect();
    append_bytes(dir, &bytes)
}

/// Marks the removals before `offset` as recorded by the versions file of
/// sequence number `seq` (about to be written). Call it holding the `keys`
/// bank's lock.
pub fn mark(dir: &Path, seq: u64, offset: u64) -> Result<()> {
    append_bytes(dir, &record("KCM1", &format!("{seq:016x} {offset:016x}")))
}

/// The removals logged in `dir` that the versions file of sequence
/// number `seq` (the one on disk) does not hold yet, and the length of the
/// log read (what [`trim`] drops once they are recorded). Torn records are
/// skipped.
pub fn read(dir: &Path, seq: u64) -> Result<(Vec<Removal>, u64)> {
    let path = dir.join(REMOVALS_FILE);
    let mut f = match crate::files::open_regular(&path, false) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut b = Vec::new();
    f.read_to_end(&mut b)
        .map_err(|e| Error::io(&path, "read", e))?;
    // Only up to the last newline: a record being appended is not read.
    let end = b.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
    let mut lines = Vec::new();
    let mut at = 0u64;
    for l in b[..end].split(|&c| c == b'\n') {
        if let Some(p) = std::str::from_utf8(l).ok().and_then(parse) {
            lines.push((at, p));
        }
        at += l.len() as u64 + 1;
    }
    let skip = lines
        .iter()
        .filter_map(|(_, l)| match l {
            Line::Marker { seq: s, offset } if *s <= seq => Some(*offset),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let out = lines
        .into_iter()
        .filter_map(|(at, l)| match l {
            Line::Removal(r) if at >= skip => Some(r),
            _ => None,
        })
        .collect();
    Ok((out, end as u64))
}

/// Drops the first `consumed` bytes of the log in `dir` (the records an
/// observation read, now recorded in the saved history), keeping any
/// appended since. Call it holding the `keys` bank's lock.
pub fn trim(dir: &Path, consumed: u64) -> Result<()> {
    if consumed == 0 {
        return Ok(());
    }
    let path = dir.join(REMOVALS_FILE);
    let f = match crate::files::open_regular(&path, true) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e),
    };
    let len = f.metadata().map_err(|e| Error::io(&path, "stat", e))?.len();
    if len <= consumed {
        f.set_len(0).map_err(|e| Error::io(&path, "truncate", e))?;
        return crate::files::sync_data(&f, &path);
    }
    let mut rest = Vec::new();
    let mut r = &f;
    std::io::Seek::seek(&mut r, std::io::SeekFrom::Start(consumed))
        .map_err(|e| Error::io(&path, "seek in", e))?;
    r.read_to_end(&mut rest)
        .map_err(|e| Error::io(&path, "read", e))?;
    // The removals appended since the read, re-written whole (markers
    // refer to offsets of the old file: gone with it).
    let rest: Vec<u8> = rest
        .split(|&c| c == b'\n')
        .filter_map(|l| match std::str::from_utf8(l).ok().and_then(parse) {
            Some(Line::Removal(r)) => Some(line(r.denied, r.id.as_bytes())),
            _ => None,
        })
        .flatten()
        .collect();
    let own = Ownership::for_dir(dir)?.replacing(&path);
    crate::files::replace_with(&path, &rest, &own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(d: &Path, seq: u64) -> Vec<(bool, String)> {
        let (r, _) = read(d, seq).unwrap();
        r.into_iter().map(|x| (x.denied, x.id)).collect()
    }

    fn history_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(crate::format::IDENTITY_FILE), b"x").unwrap();
        d
    }

    #[test]
    fn records_round_trip_and_torn_ones_are_skipped() {
        let d = history_dir();
        append(
            d.path(),
            &[(false, b"m1".to_vec()), (true, b"m\n2".to_vec())],
        )
        .unwrap();
        // A torn record, then one more.
        let p = d.path().join(REMOVALS_FILE);
        let mut t = std::fs::read(&p).unwrap();
        let torn = line(false, b"m3");
        t.extend_from_slice(&torn[..torn.len() / 2]);
        std::fs::write(&p, &t).unwrap();
        append(d.path(), &[(false, b"m4".to_vec())]).unwrap();
        let want = [(false, "m1"), (true, "m\n2"), (false, "m4")];
        let got = ids(d.path(), 0);
        assert_eq!(got.len(), 3);
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0, g.1.as_str()), w);
        }
        let (_, n) = read(d.path(), 0).unwrap();
        assert_eq!(n, std::fs::metadata(&p).unwrap().len());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Trimming what was read keeps what was appended after.
        append(d.path(), &[(true, b"m5".to_vec())]).unwrap();
        trim(d.path(), n).unwrap();
        assert_eq!(ids(d.path(), 0), [(true, "m5".to_owned())]);
        let (_, n) = read(d.path(), 0).unwrap();
        trim(d.path(), n).unwrap();
        assert_eq!(read(d.path(), 0).unwrap(), (Vec::new(), 0));
    }

    #[test]
    fn a_marker_skips_what_a_saved_history_holds() {
        let d = history_dir();
        append(d.path(), &[(false, b"m1".to_vec())]).unwrap();
        let (_, n) = read(d.path(), 4).unwrap();
        append(d.path(), &[(false, b"m2".to_vec())]).unwrap();
        mark(d.path(), 5, n).unwrap();
        // The history of seq 5 was not written (a crash before it): all
        // are read again; once it was, only what came after the offset.
        assert_eq!(ids(d.path(), 4).len(), 2);
        assert_eq!(ids(d.path(), 5), [(false, "m2".to_owned())]);
        // The trim drops the consumed part and the marker.
        trim(d.path(), n).unwrap();
        assert_eq!(ids(d.path(), 0), [(false, "m2".to_owned())]);
    }

    #[test]
    fn a_store_without_history_keeps_no_log() {
        let d = tempfile::tempdir().unwrap();
        append(d.path(), &[(false, b"m1".to_vec())]).unwrap();
        assert!(!d.path().join(REMOVALS_FILE).exists());
    }

    #[test]
    fn a_symlink_in_its_place_is_refused() {
        let d = history_dir();
        let out = d.path().join("outside");
        std::fs::write(&out, b"").unwrap();
        std::os::unix::fs::symlink(&out, d.path().join(REMOVALS_FILE)).unwrap();
        assert!(append(d.path(), &[(false, b"m1".to_vec())]).is_err());
        assert!(read(d.path(), 0).is_err());
        assert_eq!(std::fs::read(&out).unwrap(), b"");
    }
}
