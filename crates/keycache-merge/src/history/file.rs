//! The bytes of the history files (drawn in `docs/format.md`, "History
//! files"), written atomically and read with every length checked.
//!
//! ```text
//! .keycache-history
//!   header:  magic "KCHIST\r\n" (8) | version u32 = 2 (1 is read too)
//!            | flags u32 = 0
//!            | seq u64 | count u64
//!   entry:   bank u8 (1 keys, 2 denied_keys) | kind u8 | prev kind u8
//!            (0xFF: none) | zero u8 | id_len u16 | slot u32 (version 2
//!            only; 0xFFFFFFFF: none) | stamp u64 | hash u64
//!            | [prev stamp u64 | prev hash u64, when prev kind != 0xFF] | id
//!   trailer: xxh3-64 of every byte before it, u64
//!
//! .keycache-identity
//!   magic "KCIDENT\n" (8) | version u32 = 2 (1 is read too)
//!   | flags u32 (bit 0: bound)
//!   | store [16] | created u64 | clock u64 | scanned u64
//!   | [born u64 | ino u64, version 2 only: the store directory's birth
//!      time in ns (st_dev where the filesystem records none) and
//!      st_ino when bound, else 0]
//!   | peer count u32 | peers: store [16] | generation u64 | merged_at u64
//!   | xxh3-64 of every byte before it, u64
//! ```
//!
//! Kinds: 0 absent, 1 accepted, 2 pending, 3 rejected, 4 denied. All
//! integers little-endian.

use std::collections::BTreeMap;
use std::path::Path;

use super::{History, Identity, Kind, Peer, Record, Version, Versions};
use crate::error::{Error, Result};
use crate::hlc::Hlc;
use keycache::files::Ownership;
use keycache::key::Bank;

use keycache::format::{HISTORY_FILE, IDENTITY_FILE};

const HIST_MAGIC: [u8; 8] = *b"KCHIST\r\n";
const IDENT_MAGIC: [u8; 8] = *b"KCIDENT\n";
/// The identity file's format version: 2 adds the binding to the store
/// directory (see [`Identity::binding`]); 1 is still read (unbound).
const IDENT_VERSION: u32 = 2;
/// Identity flag: the binding is set.
const IDENT_BOUND: u32 = 1;
/// The versions file's format version: 2 adds each entry's bank slot (a
/// hint for observations); 1 is still read.
const HIST_VERSION: u32 = 2;
const NO_PREV: u8 = 0xFF;

fn bad(path: &Path, why: String) -> Error {
    keycache::Error::Corrupt {
        path: path.to_path_buf(),
        id: None,
        why: format!(
            "{why} (the history is damaged: move it away to begin a new one, after which this \
             store merges as a new peer)"
        ),
    }
    .into()
}

/// A bounds-checked reader over a file's bytes.
struct Cursor<'a> {
    b: &'a [u8],
    o: usize,
    path: &'a Path,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        let end = self.o.checked_add(n).filter(|&e| e <= self.b.len());
        match end {
            Some(e) => {
                let s = &self.b[self.o..e];
                self.o = e;
                Ok(s)
            }
            None => Err(bad(
                self.path,
                format!(
                    "truncated: {what} at byte {} is past the end ({} bytes)",
                    self.o,
                    self.b.len()
                ),
            )),
        }
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }
    fn ident(&mut self, what: &str) -> Result<[u8; 16]> {
        let mut a = [0u8; 16];
        a.copy_from_slice(self.take(16, what)?);
        Ok(a)
    }
}

/// Reads a whole file, or `None` when it does not exist. A symlink is
/// refused.
fn read(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, "stat", e)),
        Ok(m) if !m.is_file() => {
            return Err(keycache::Error::NotARegularFile {
                path: path.to_path_buf(),
                why: "a history file must be a regular file",
            }
            .into())
        }
        Ok(_) => {}
    }
    std::fs::read(path)
        .map(Some)
        .map_err(|e| Error::io(path, "read", e))
}

/// Checks a file's magic, version (one of `versions`) and trailing
/// checksum; returns the body (without the trailer) and the version.
fn checked<'a>(
    b: &'a [u8],
    path: &Path,
    magic: &[u8; 8],
    versions: &[u32],
) -> Result<(&'a [u8], u32)> {
    if b.len() < 20 || b[..8] != *magic {
        return Err(bad(
            path,
            "wrong magic or too short: not a keycache history file".into(),
        ));
    }
    let body = &b[..b.len() - 8];
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[b.len() - 8..]);
    if u64::from_le_bytes(a) != keycache::format::hash(body) {
        return Err(bad(path, "checksum mismatch".into()));
    }
    let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if !versions.contains(&version) {
        return Err(bad(
            path,
            format!("format version {version}; this keycache reads {versions:?}"),
        ));
    }
    Ok((body, version))
}

/// Loads both files; `None` when the store has no history yet (no
/// identity file).
pub(super) fn load(dir: &Path) -> Result<Option<History>> {
    let ipath = dir.join(IDENTITY_FILE);
    let Some(ib) = read(&ipath)? else {
        return Ok(None);
    };
    let (body, version) = checked(&ib, &ipath, &IDENT_MAGIC, &[1, IDENT_VERSION])?;
    let mut c = Cursor {
        b: body,
        o: 12,
        path: &ipath,
    };
    let flags = c.u32("flags")?;
    let store = c.ident("store")?;
    let created = c.u64("created")?;
    let clock = c.u64("clock")?;
    let scanned = c.u64("scanned")?;
    let binding = if version >= 2 {
        let dev = c.u64("dev")?;
        let ino = c.u64("ino")?;
        (flags & IDENT_BOUND != 0).then_some((dev, ino))
    } else {
        None
    };
    let n = c.u32("peer count")?;
    let mut peers = BTreeMap::new();
    for _ in 0..n {
        let id = c.ident("peer")?;
        let generation = c.u64("peer generation")?;
        let merged_at = c.u64("peer merged_at")?;
        peers.insert(
            id,
            Peer {
                generation,
                merged_at,
            },
        );
    }
    if c.o != body.len() {
        return Err(bad(
            &ipath,
            format!("{} bytes past the last peer", body.len() - c.o),
        ));
    }
    let identity = Identity {
        store,
        created,
        clock: Hlc { last: clock },
        scanned,
        peers,
        binding,
    };
    let hpath = dir.join(HISTORY_FILE);
    let (entries, seq) = match read(&hpath)? {
        None => (Versions::default(), 0),
        Some(hb) => parse_versions(&hb, &hpath)?,
    };
    // When the versions were last saved: the file's mtime (0 unknown).
    let saved_at = std::fs::symlink_metadata(&hpath)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    Ok(Some(History {
        identity,
        entries,
        dirty: false,
        existed: true,
        seq,
        removals_read: 0,
        mark: 0,
        saved_at,
    }))
}

fn kind(c: &mut Cursor<'_>, b: u8) -> Result<Kind> {
    Kind::from_byte(b).ok_or_else(|| bad(c.path, format!("unknown kind {b} before byte {}", c.o)))
}

fn parse_versions(b: &[u8], path: &Path) -> Result<(Versions, u64)> {
    let (body, version) = checked(b, path, &HIST_MAGIC, &[1, HIST_VERSION])?;
    let mut c = Cursor {
        b: body,
        o: 12,
        path,
    };
    let _flags = c.u32("flags")?;
    let seq = c.u64("seq")?;
    let count = c.u64("count")?;
    let mut m = Versions::with_capacity((count as usize).min(body.len() / 24));
    for _ in 0..count {
        let bank = match c.u8("bank")? {
            1 => Bank::Keys,
            2 => Bank::Denied,
            x => return Err(bad(path, format!("unknown bank {x} before byte {}", c.o))),
        };
        let kb = c.u8("kind")?;
        let k = kind(&mut c, kb)?;
        let pk = c.u8("prev kind")?;
        let _zero = c.u8("padding")?;
        let id_len = c.u16("id length")? as usize;
        let slot = if version >= 2 {
            c.u32("slot")?
        } else {
            super::versions::NO_SLOT
        };
        let stamp = c.u64("stamp")?;
        let hash = c.u64("hash")?;
        let prev = if pk == NO_PREV {
            None
        } else {
            let k = kind(&mut c, pk)?;
            let stamp = c.u64("prev stamp")?;
            let hash = c.u64("prev hash")?;
            Some(Version {
                stamp,
                kind: k,
                hash,
            })
        };
        let at = c.o;
        let id = std::str::from_utf8(c.take(id_len, "id")?)
            .map_err(|_| bad(path, format!("the id at byte {at} is not UTF-8")))?;
        let rec = Record {
            cur: Version {
                stamp,
                kind: k,
                hash,
            },
            prev,
            mark: 0,
        };
        if !m.insert(bank, id, rec, slot) {
            return Err(bad(path, format!("{} {id:?} recorded twice", bank.name())));
        }
    }
    if c.o != body.len() {
        return Err(bad(
            path,
            format!("{} bytes past the last entry", body.len() - c.o),
        ));
    }
    Ok((m, seq))
}

/// The sequence number of the versions file on disk, 0 when none.
pub(super) fn seq_on_disk(dir: &Path) -> Result<u64> {
    let path = dir.join(HISTORY_FILE);
    let Some(b) = read(&path)? else {
        return Ok(0);
    };
    let (body, _) = checked(&b, &path, &HIST_MAGIC, &[1, HIST_VERSION])?;
    let mut c = Cursor {
        b: body,
        o: 16,
        path: &path,
    };
    c.u64("seq")
}

pub(super) fn save_versions(dir: &Path, h: &History, own: &Ownership) -> Result<()> {
    let mut b = Vec::with_capacity(32 + h.entries.len() * 48);
    b.extend_from_slice(&HIST_MAGIC);
    b.extend_from_slice(&HIST_VERSION.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&h.seq.to_le_bytes());
    b.extend_from_slice(&(h.entries.len() as u64).to_le_bytes());
    for (bank, id, r, slot) in h.entries.iter_slots() {
        b.push(match bank {
            Bank::Keys => 1,
            Bank::Denied => 2,
        });
        b.push(r.cur.kind.byte());
        b.push(r.prev.map_or(NO_PREV, |p| p.kind.byte()));
        b.push(0);
        b.extend_from_slice(&(id.len() as u16).to_le_bytes());
        b.extend_from_slice(&slot.to_le_bytes());
        b.extend_from_slice(&r.cur.stamp.to_le_bytes());
        b.extend_from_slice(&r.cur.hash.to_le_bytes());
        if let Some(p) = r.prev {
            b.extend_from_slice(&p.stamp.to_le_bytes());
            b.extend_from_slice(&p.hash.to_le_bytes());
        }
        b.extend_from_slice(id.as_bytes());
    }
    let sum = keycache::format::hash(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    Ok(keycache::files::replace_with(
        &dir.join(HISTORY_FILE),
        &b,
        own,
    )?)
}

pub(super) fn save_identity(dir: &Path, h: &History, own: &Ownership) -> Result<()> {
    let i = &h.identity;
    let mut b = Vec::with_capacity(112 + i.peers.len() * 32);
    b.extend_from_slice(&IDENT_MAGIC);
    b.extend_from_slice(&IDENT_VERSION.to_le_bytes());
    let flags = if i.binding.is_some() { IDENT_BOUND } else { 0 };
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&i.store);
    b.extend_from_slice(&i.created.to_le_bytes());
    b.extend_from_slice(&i.clock.last.to_le_bytes());
    b.extend_from_slice(&i.scanned.to_le_bytes());
    let (dev, ino) = i.binding.unwrap_or((0, 0));
    b.extend_from_slice(&dev.to_le_bytes());
    b.extend_from_slice(&ino.to_le_bytes());
    b.extend_from_slice(&(i.peers.len() as u32).to_le_bytes());
    for (id, p) in &i.peers {
        b.extend_from_slice(id);
        b.extend_from_slice(&p.generation.to_le_bytes());
        b.extend_from_slice(&p.merged_at.to_le_bytes());
    }
    let sum = keycache::format::hash(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    Ok(keycache::files::replace_with(
        &dir.join(IDENTITY_FILE),
        &b,
        own,
    )?)
}
