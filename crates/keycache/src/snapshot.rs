//! Snapshots: the `keys` and `denied_keys` banks of a store as of one
//! moment, in one versioned, checksummed file that a peer of an
//! isolated-filesystem cluster sends to another (`keycache snapshot`, then
//! [`crate::merge`] on the other side).
//!
//! A snapshot holds, per entry, the bank, the minion id, the state (for the
//! `keys` bank), the public key and Salt's slot mtime. It never holds the
//! `master_keys` bank (the master's private keys), nor a value holding a
//! private key block: [`take`] refuses such a store, naming the id, and
//! [`Snapshot::read_from`] refuses such a file.
//!
//! [`take`] copies both banks under their locks (Salt's `flock` on each
//! bank's `.lock` file, as the library's writers take it), so a snapshot
//! never holds half of a write, or one bank before a write and the other
//! after it. The wait for each lock is bounded
//! ([`SnapshotOptions::lock_wait`]); Salt's writers wait for keycache only
//! while it copies the entries (no fsync, no I/O but reads of mapped
//! files). The file format is drawn byte by byte in `docs/format.md`
//! ("Snapshot files"):
//!
//! ```text
//! header:  magic "KCSNAP\r\n" (8) | version u32 = 1 | flags u32 = 0
//!          | taken u64 (unix ns) | count u64
//! entry:   bank u8 (1 keys, 2 denied_keys) | state u8 (1 accepted,
//!          2 pending, 3 rejected; 0 in denied_keys) | id_len u16
//!          | key_len u32 | mtime u64 | id | key
//! trailer: xxh3-64 of every byte before it, u64
//! ```
//!
//! All integers are little-endian; entries are sorted by (bank, id), each
//! (bank, id) once.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::format;
use crate::id::MinionId;
use crate::key::{decode_key_value, KeyState};
use crate::store::Store;
use crate::table::Table;

/// The first 8 bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"KCSNAP\r\n";
/// The format version this library writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the header: magic, version, flags, taken, count.
pub const HEADER_LEN: usize = 32;
/// Bytes of an entry before its id and key.
pub const ENTRY_HEAD_LEN: usize = 16;
/// Bit of the header's flags: a section of seen entries follows the
/// entries (see [`Snapshot::seen`]).
pub const FLAG_SEEN: u32 = 1;
/// Bytes of the trailer (the checksum).
pub const TRAILER_LEN: usize = 8;

/// The bank an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Bank {
    /// The `keys` bank: accepted, pending and rejected keys.
    #[cfg_attr(feature = "serde", serde(rename = "keys"))]
    Keys,
    /// The `denied_keys` bank: keys presented under an id that holds
    /// another key.
    #[cfg_attr(feature = "serde", serde(rename = "denied_keys"))]
    Denied,
}

impl Bank {
    /// Salt's name of the bank: `keys` or `denied_keys`.
    pub fn name(self) -> &'static str {
        match self {
            Bank::Keys => "keys",
            Bank::Denied => "denied_keys",
        }
    }

    fn byte(self) -> u8 {
        match self {
            Bank::Keys => 1,
            Bank::Denied => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Bank> {
        match b {
            1 => Some(Bank::Keys),
            2 => Some(Bank::Denied),
            _ => None,
        }
    }
}

impl std::fmt::Display for Bank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The bank.
    pub bank: Bank,
    /// The minion id.
    pub id: String,
    /// The state in the `keys` bank; `None` in `denied_keys`.
    pub state: Option<KeyState>,
    /// The public key, PEM bytes as stored (a denied key without Salt's
    /// trailing NULs, as Salt reads it).
    pub pub_key: Vec<u8>,
    /// Salt's slot mtime: unix nanoseconds of the entry's last write.
    pub mtime: u64,
}

impl Entry {
    /// Whether `self` and `other` hold the same state and key (the mtime
    /// aside: Salt rewrites an unchanged value with a new one).
    pub fn same_value(&self, other: &Entry) -> bool {
        self.state == other.state && self.pub_key == other.pub_key
    }

    /// The state's name: `accepted`, `pending`, `rejected`, or `denied`.
    pub fn state_name(&self) -> &'static str {
        self.state.map_or("denied", KeyState::name)
    }
}

/// Both banks of a store as of one moment, entries sorted by (bank, id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// When it was taken (or, for a merge's result, made): unix nanoseconds.
    pub taken: u64,
    /// The entries, sorted by (bank, id), each (bank, id) once.
    pub entries: Vec<Entry>,
    /// What the sending peer last merged from the peer that reads this
    /// snapshot (the entries of its base for that peer), when it was given
    /// one (`keycache snapshot --seen FILE`): the reader's own state that
    /// the sender has already seen, which tells [`crate::merge::plan`] that
    /// the sender deleted or changed an entry it had received, rather than
    /// never had it. Sorted and unique as `entries`.
    pub seen: Option<Vec<Entry>>,
}

/// How [`take`] takes a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// How long to wait for each bank's lock before giving up with
    /// [`Error::Busy`]. Default 10 s.
    pub lock_wait: Duration,
}

impl Default for SnapshotOptions {
    fn default() -> SnapshotOptions {
        SnapshotOptions {
            lock_wait: Duration::from_secs(10),
        }
    }
}

/// Takes a snapshot of `store`'s `keys` and `denied_keys` banks: both banks'
/// locks are taken (`keys` first, as every writer does; each waited for at
/// most `opts.lock_wait`), the entries copied, the locks released. An entry
/// that cannot be read intact, an id that is not a valid minion id and a
/// value holding a private key block fail the snapshot, naming the id.
pub fn take(store: &Store, opts: &SnapshotOptions) -> Result<Snapshot> {
    let (k, d) = (store.keys_table(), store.denied_table());
    let w = opts.lock_wait;
    let mut entries = k.read_locked(w, || {
        d.read_locked(w, || {
            let mut v = copy_bank(k, Bank::Keys)?;
            v.extend(copy_bank(d, Bank::Denied)?);
            Ok(v)
        })
    })?;
    entries.sort_by(|a, b| (a.bank, &a.id).cmp(&(b.bank, &b.id)));
    Ok(Snapshot {
        taken: crate::files::now_ns(),
        entries,
        seen: None,
    })
}

/// The entries of one bank, as a snapshot holds them.
fn copy_bank(t: &Table, bank: Bank) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for r in t.iter()? {
        let r = r?;
        let corrupt = |why: String| Error::Corrupt {
            path: t.path().into(),
            id: Some(String::from_utf8_lossy(&r.id).into_owned()),
            why,
        };
        let id = MinionId::from_bytes(&r.id)
            .map_err(|e| corrupt(format!("cannot be put in a snapshot: {e}")))?;
        let (state, pub_key) = match bank {
            Bank::Keys => match decode_key_value(&r.value) {
                Some((s, pem)) => (Some(s), pem.to_vec()),
                None => {
                    return Err(corrupt(format!(
                        "slot {}: value of {} bytes is not [state 1..3][public key]",
                        r.slot,
                        r.value.len()
                    )))
                }
            },
            Bank::Denied => {
                let mut v = r.value;
                while v.last() == Some(&0) {
                    v.pop();
                }
                (None, v)
            }
        };
        if crate::pem::holds_private_key(&pub_key) {
            return Err(corrupt(
                "the value holds a PRIVATE KEY block: never put in a snapshot (delete or \
                 replace the key, then take the snapshot again)"
                    .into(),
            ));
        }
        out.push(Entry {
            bank,
            id: id.as_str().to_owned(),
            state,
            pub_key,
            mtime: r.mtime,
        });
    }
    Ok(out)
}

impl Snapshot {
    /// A snapshot of `entries` (sorted here), taken now. Two entries of one
    /// (bank, id), a `keys` entry without a state or a `denied_keys` entry
    /// with one are refused.
    pub fn from_entries(mut entries: Vec<Entry>) -> Result<Snapshot> {
        entries.sort_by(|a, b| (a.bank, &a.id).cmp(&(b.bank, &b.id)));
        let s = Snapshot {
            taken: crate::files::now_ns(),
            entries,
            seen: None,
        };
        s.check("entries")?;
        Ok(s)
    }

    /// The entry of (`bank`, `id`), if any.
    pub fn get(&self, bank: Bank, id: &str) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| (e.bank, e.id.as_str()).cmp(&(bank, id)))
            .ok()
            .and_then(|i| self.entries.get(i))
    }

    /// The file's bytes (see the module's documentation).
    pub fn to_bytes(&self) -> Vec<u8> {
        let body: usize = self
            .entries
            .iter()
            .chain(self.seen.iter().flatten())
            .map(|e| ENTRY_HEAD_LEN + e.id.len() + e.pub_key.len())
            .sum();
        let mut b = Vec::with_capacity(HEADER_LEN + body + 8 + TRAILER_LEN);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        let flags = if self.seen.is_some() { FLAG_SEEN } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.taken.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        encode_entries(&self.entries, &mut b);
        if let Some(seen) = &self.seen {
            b.extend_from_slice(&(seen.len() as u64).to_le_bytes());
            encode_entries(seen, &mut b);
        }
        let sum = format::hash(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// Writes the file's bytes to `w` (not flushed). An entry too long for
    /// the format's length fields (an id over 65535 bytes, a key over 4 GiB)
    /// is refused before anything is written.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        self.check("snapshot to write")?;
        w.write_all(&self.to_bytes())
            .map_err(|e| Error::io("<snapshot output>", "write", e))
    }

    /// Writes the snapshot to `path` atomically: a temporary file in the
    /// same directory, fsynced, renamed over `path`, and the directory
    /// fsynced. Mode 0600.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        self.check("snapshot to write")?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "snapshot".into());
        let tmp = dir.join(format!(
            ".{name}.keycache-tmp.{}.{}",
            std::process::id(),
            crate::files::now_ns()
        ));
        let own = crate::files::Ownership {
            owner: None,
            mode: crate::files::DEFAULT_MODE,
            explicit: false,
        };
        let written = (|| {
            let f = crate::files::create_new(&tmp, &own)?;
            let mut w = std::io::BufWriter::new(&f);
            w.write_all(&self.to_bytes())
                .and_then(|()| w.flush())
                .map_err(|e| Error::io(&tmp, "write", e))?;
            drop(w);
            crate::files::sync_data(&f, &tmp)?;
            crate::files::rename(&tmp, path)?;
            crate::files::sync_dir(&dir)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Reads a snapshot from `r` (to its end); errors name the source as
    /// `snapshot`. See [`Snapshot::read_named`].
    pub fn read_from(r: &mut impl Read) -> Result<Snapshot> {
        Snapshot::read_named(r, "snapshot")
    }

    /// Reads a snapshot from `r` (to its end). A wrong magic, another
    /// version, a truncated file, a checksum that does not match (a flipped
    /// byte), bytes past the end, an invalid id or state, unsorted or
    /// repeated entries and a value holding a private key block are each an
    /// [`Error::BadSnapshot`] naming `name` and what is wrong.
    pub fn read_named(r: &mut impl Read, name: &str) -> Result<Snapshot> {
        let mut b = Vec::new();
        r.read_to_end(&mut b).map_err(|e| Error::BadSnapshot {
            source_name: name.to_owned(),
            why: format!("read failed: {e}"),
        })?;
        Snapshot::from_bytes(&b, name)
    }

    /// Reads the snapshot file at `path` (see [`Snapshot::read_named`]).
    pub fn read_file(path: &Path) -> Result<Snapshot> {
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, "open", e))?;
        Snapshot::read_named(&mut f, &path.to_string_lossy())
    }

    /// Parses a snapshot's bytes (see [`Snapshot::read_named`]).
    pub fn from_bytes(b: &[u8], name: &str) -> Result<Snapshot> {
        let bad = |why: String| Error::BadSnapshot {
            source_name: name.to_owned(),
            why,
        };
        if b.is_empty() {
            return Err(bad(
                "empty (no snapshot was written: did the sending side fail?)".into(),
            ));
        }
        if b.len() < MAGIC.len() && MAGIC.starts_with(b) {
            return Err(bad(format!(
                "truncated: {} bytes, a part of the magic only",
                b.len()
            )));
        }
        if b.len() < MAGIC.len() || b[..MAGIC.len()] != MAGIC {
            return Err(bad(format!(
                "wrong magic (the first 8 bytes are not {:?}): not a keycache snapshot",
                String::from_utf8_lossy(&MAGIC)
            )));
        }
        if b.len() < HEADER_LEN + TRAILER_LEN {
            return Err(bad(format!(
                "truncated: {} bytes, shorter than a header and a checksum ({})",
                b.len(),
                HEADER_LEN + TRAILER_LEN
            )));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!(
                "format version {version}; this keycache reads version {VERSION}"
            )));
        }
        let flags = u32_at(12);
        if flags & !FLAG_SEEN != 0 {
            return Err(bad(format!("unknown flags {flags:#x}")));
        }
        let taken = u64_at(16);
        let count = u64_at(24);
        // Entries are parsed before the checksum is checked, so that a
        // truncated file says so rather than "checksum mismatch".
        let mut o = HEADER_LEN;
        let entries = parse_entries(b, &mut o, count, "entry", &bad)?;
        let seen = if flags & FLAG_SEEN != 0 {
            if o + 8 > b.len() {
                return Err(bad(format!(
                    "truncated: the count of seen entries at byte {o} is missing ({} bytes)",
                    b.len()
                )));
            }
            let n = u64_at(o);
            o += 8;
            Some(parse_entries(b, &mut o, n, "seen entry", &bad)?)
        } else {
            None
        };
        if o + TRAILER_LEN > b.len() {
            return Err(bad(format!(
                "truncated: the checksum at byte {o} is missing ({} bytes)",
                b.len()
            )));
        }
        if o + TRAILER_LEN < b.len() {
            return Err(bad(format!(
                "{} bytes past the checksum at byte {o}",
                b.len() - o - TRAILER_LEN
            )));
        }
        let want = u64_at(o);
        let got = format::hash(&b[..o]);
        if want != got {
            return Err(bad(format!(
                "checksum mismatch (stored {want:016x}, computed {got:016x}): the file is damaged"
            )));
        }
        let s = Snapshot {
            taken,
            entries,
            seen,
        };
        s.check(name)?;
        Ok(s)
    }

    /// Checks what a snapshot promises: valid ids, sorted and unique
    /// (bank, id), states only in `keys`, no private key material, lengths
    /// that fit the format.
    fn check(&self, name: &str) -> Result<()> {
        check_entries(&self.entries, name, "entry")?;
        match &self.seen {
            Some(seen) => check_entries(seen, name, "seen entry"),
            None => Ok(()),
        }
    }
}

mod codec;
use codec::{check_entries, encode_entries, parse_entries};

#[cfg(test)]
mod tests;
