//! Snapshots: the `keys` and `denied_keys` banks of a store as of one
//! moment, with each entry's version and the store's tombstones, in one
//! versioned, checksummed file that a peer sends to another (`keycache
//! snapshot`, then [`crate::merge`] on the other side).
//!
//! A snapshot names its cluster ([`crate::history::cluster_of`]: a hash of
//! the cluster's or master's public key) and its store (made once per
//! store, [`crate::history`]) and carries a **generation**: the store's clock when it was
//! taken, which grows with every snapshot. It holds, per entry, the bank,
//! the minion id, the kind (accepted, pending, rejected, denied, or absent
//! for a tombstone), the version's stamp and the public key. It never
//! holds the `master_keys` bank (the master's private keys), nor a value
//! holding a private key block: [`take`] refuses such a store, naming the
//! id.
//!
//! [`take`] observes the store ([`crate::history::History::observe`]) and
//! copies both banks under their locks (Salt's `flock` on each bank's
//! `.lock` file, as the library's writers take it), so a snapshot never
//! holds half of a write, or one bank before a write and the other after
//! it. The wait for each lock is bounded ([`SnapshotOptions::lock_wait`]).
//! The file format is drawn byte by byte in `docs/format.md` ("Snapshot
//! files"):
//!
//! ```text
//! header:  magic "KCSNAP\r\n" (8) | version u32 = 2 | flags u32 (bit 0:
//!          the cluster is known) | cluster [16] (zero when not) | store [16]
//!          | generation u64 | count u64
//! entry:   bank u8 (1 keys, 2 denied_keys) | kind u8 (0 absent, 1
//!          accepted, 2 pending, 3 rejected, 4 denied) | id_len u16
//!          | key_len u32 (0 for absent) | stamp u64 | id | key
//! trailer: xxh3-64 of every byte before it, u64
//! ```
//!
//! All integers are little-endian; entries are sorted by (bank, id), each
//! (bank, id) once. Readers stream: [`Snapshot::read_filtered`] keeps only
//! the entries a merge may need, so a merge's memory follows the
//! difference, not the store.

use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::history::{value_hash, History, HistoryOptions, Ident, Kind, Version};
use keycache::key::KeyState;
use keycache::store::Store;

mod codec;
mod stream;
use codec::{Reader, Writer};
pub use stream::take_to_file;

/// The first 8 bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"KCSNAP\r\n";
/// The format version this library writes and reads.
pub const VERSION: u32 = 2;
/// Bytes of the header.
pub const HEADER_LEN: usize = 64;
/// Bytes of an entry before its id and key.
pub const ENTRY_HEAD_LEN: usize = 16;
/// Bytes of the trailer (the checksum).
pub const TRAILER_LEN: usize = 8;
/// Bit of the header's flags: the cluster is known.
pub const FLAG_CLUSTER: u32 = 1;
/// The largest public key a snapshot may carry (as `migrate` reads).
pub use keycache::pem::MAX_KEY_BYTES;

pub use keycache::key::Bank;

/// A bank's byte in a snapshot entry.
pub(crate) fn bank_byte(b: Bank) -> u8 {
    match b {
        Bank::Keys => 1,
        Bank::Denied => 2,
    }
}

/// The bank of a snapshot entry's byte.
pub(crate) fn bank_of_byte(b: u8) -> Option<Bank> {
    match b {
        1 => Some(Bank::Keys),
        2 => Some(Bank::Denied),
        _ => None,
    }
}

/// One entry of a snapshot: a version of (bank, id), with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The bank.
    pub bank: Bank,
    /// The minion id.
    pub id: String,
    /// The kind of value ([`Kind::Absent`]: a tombstone).
    pub kind: Kind,
    /// The version's stamp.
    pub stamp: u64,
    /// The public key, PEM bytes as stored (a denied key without Salt's
    /// trailing NULs, as Salt reads it); empty for a tombstone.
    pub public_key: Vec<u8>,
}

/// An entry as the reader holds it before deciding to keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The bank.
    pub bank: Bank,
    /// The minion id.
    pub id: &'a str,
    /// The kind of value.
    pub kind: Kind,
    /// The version's stamp.
    pub stamp: u64,
    /// The public key (empty for a tombstone).
    pub public_key: &'a [u8],
}

/// The version of an entry of `kind` stamped `stamp` holding `public_key` (a
/// tombstone's hash is 0).
fn version_of(stamp: u64, kind: Kind, public_key: &[u8]) -> Version {
    Version {
        stamp,
        kind,
        hash: if kind == Kind::Absent {
            0
        } else {
            value_hash(kind, public_key)
        },
    }
}

impl EntryRef<'_> {
    /// The entry's version.
    pub fn version(&self) -> Version {
        version_of(self.stamp, self.kind, self.public_key)
    }

    /// An owned copy.
    pub fn to_entry(&self) -> Entry {
        Entry {
            bank: self.bank,
            id: self.id.to_owned(),
            kind: self.kind,
            stamp: self.stamp,
            public_key: self.public_key.to_vec(),
        }
    }
}

impl Entry {
    /// A borrowed view.
    pub fn as_ref(&self) -> EntryRef<'_> {
        EntryRef {
            bank: self.bank,
            id: &self.id,
            kind: self.kind,
            stamp: self.stamp,
            public_key: &self.public_key,
        }
    }

    /// The entry's version.
    pub fn version(&self) -> Version {
        version_of(self.stamp, self.kind, &self.public_key)
    }

    /// The state in the `keys` bank, if the entry holds one.
    pub fn state(&self) -> Option<KeyState> {
        self.kind.state()
    }
}

/// Both banks of a store as of one moment, with its tombstones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The cluster of the store it was taken from, when known.
    pub cluster: Option<Ident>,
    /// The store it was taken from.
    pub store: Ident,
    /// The store's clock when it was taken: grows with every snapshot.
    pub generation: u64,
    /// The entries, sorted by (bank, id), each (bank, id) once.
    pub entries: Vec<Entry>,
}

/// How [`take`] takes a snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// How long to wait for each bank's lock before giving up with
    /// [`keycache::Error::Busy`]. Default 10 s.
    pub lock_wait: Duration,
    /// The history's horizon and clock.
    pub history: HistoryOptions,
}

impl Default for SnapshotOptions {
    fn default() -> SnapshotOptions {
        SnapshotOptions {
            lock_wait: Duration::from_secs(10),
            history: HistoryOptions::default(),
        }
    }
}

/// An error when `pem`, the value of (`bank`, `id`), holds a private key:
/// never put in a snapshot.
fn refuse_private(store: &Store, bank: Bank, id: &str, pem: &[u8]) -> Result<()> {
    if keycache::pem::holds_private_key(pem) {
        return Err(keycache::Error::Corrupt {
            path: store.dir().into(),
            id: Some(id.to_owned()),
            why: format!(
                "the {bank} value holds a PRIVATE KEY block: never put in a snapshot (delete or \
                 replace the key, then take the snapshot again)"
            ),
        }
        .into());
    }
    Ok(())
}

/// Takes a snapshot of `store`'s `keys` and `denied_keys` banks: both banks'
/// locks are taken (`keys` first, as every writer does; each waited for at
/// most `opts.lock_wait`), the store observed (changes since the last
/// observation get versions, which are saved), the entries and the
/// tombstones within the horizon copied, the locks released. An entry that
/// cannot be read intact, an id that is not a valid minion id and a value
/// holding a private key block fail the snapshot, naming the id.
pub fn take(store: &Store, opts: &SnapshotOptions) -> Result<Snapshot> {
    let (k, d) = (store.keys_table(), store.denied_table());
    let w = opts.lock_wait;
    let h = &opts.history;
    let cluster = crate::history::cluster_of(store)?;
    let (mut entries, hist, generation) = k.read_locked(w, || {
        d.read_locked(w, || -> Result<_> {
            let mut hist = History::load(store.dir(), h)?;
            let mut v = Vec::new();
            hist.observe(store, h, false, |bank, id, _state, pem, ver| {
                refuse_private(store, bank, id, pem)?;
                v.push(Entry {
                    bank,
                    id: id.to_owned(),
                    kind: ver.kind,
                    stamp: ver.stamp,
                    public_key: pem.to_vec(),
                });
                Ok(())
            })?;
            let cutoff = crate::history::horizon_cutoff(h);
            for (bank, id, ver) in hist.iter() {
                if ver.kind == Kind::Absent && ver.stamp >= cutoff {
                    v.push(Entry {
                        bank,
                        id: id.to_owned(),
                        kind: Kind::Absent,
                        stamp: ver.stamp,
                        public_key: Vec::new(),
                    });
                }
            }
            let generation = hist.identity.clock.tick(&h.wall);
            hist.save(store.dir(), h)?;
            Ok((v, hist, generation))
        })
    })?;
    entries.sort_unstable_by(|a, b| (a.bank, &a.id).cmp(&(b.bank, &b.id)));
    Ok(Snapshot {
        cluster,
        store: hist.identity.store,
        generation,
        entries,
    })
}

impl Snapshot {
    /// The entry of (`bank`, `id`), if any.
    pub fn get(&self, bank: Bank, id: &str) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| (e.bank, e.id.as_str()).cmp(&(bank, id)))
            .ok()
            .and_then(|i| self.entries.get(i))
    }

    /// Writes the file's bytes to `w` (not flushed), streaming. An entry
    /// too long for the format's length fields is refused before anything
    /// is written.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        self.check("snapshot to write")?;
        let mut out = Writer::new(w);
        out.header(self)?;
        for e in &self.entries {
            out.entry(e)?;
        }
        out.finish()
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut b = Vec::new();
        self.write_to(&mut b)?;
        Ok(b)
    }

    /// Writes the snapshot to `path` atomically: a temporary file in the
    /// same directory, fsynced, renamed over `path`, and the directory
    /// fsynced. Mode 0600.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        self.check("snapshot to write")?;
        write_file_with(path, |w| self.write_to(w))
    }

    /// Reads a snapshot from `r` (to its end); errors name the source as
    /// `snapshot`. See [`Snapshot::read_named`].
    pub fn read_from(r: &mut impl Read) -> Result<Snapshot> {
        Snapshot::read_named(r, "snapshot")
    }

    /// Reads a snapshot from `r` (to its end). A wrong magic, another
    /// version, a truncated file, a checksum that does not match (a flipped
    /// byte), bytes past the end, an invalid id or kind, a key over
    /// [`MAX_KEY_BYTES`], a present value with no key, unsorted or
    /// repeated entries are each an [`Error::BadSnapshot`] naming `name`
    /// and what is wrong.
    pub fn read_named(r: &mut impl Read, name: &str) -> Result<Snapshot> {
        Snapshot::read_filtered(r, name, |_| true)
    }

    /// [`Snapshot::read_named`], keeping only the entries `keep` accepts
    /// (every entry is still read and checked, and the checksum too).
    pub fn read_filtered(
        r: &mut impl Read,
        name: &str,
        mut keep: impl FnMut(&EntryRef<'_>) -> bool,
    ) -> Result<Snapshot> {
        let mut rd = Reader::new(BufReader::with_capacity(1 << 20, r), name);
        let mut s = rd.header()?;
        while let Some(e) = rd.entry()? {
            if keep(&e) {
                s.entries.push(e.to_entry());
            }
        }
        rd.finish()?;
        Ok(s)
    }

    /// Reads the snapshot file at `path` (see [`Snapshot::read_named`]).
    pub fn read_file(path: &Path) -> Result<Snapshot> {
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, "open", e))?;
        Snapshot::read_named(&mut f, &path.to_string_lossy())
    }

    /// Parses a snapshot's bytes (see [`Snapshot::read_named`]).
    pub fn from_bytes(b: &[u8], name: &str) -> Result<Snapshot> {
        Snapshot::read_named(&mut &b[..], name)
    }

    /// Checks what a snapshot promises: valid ids, sorted and unique
    /// (bank, id), kinds that fit the bank, keys within the limits, no
    /// private key material.
    fn check(&self, name: &str) -> Result<()> {
        let mut prev: Option<(Bank, &str)> = None;
        for (n, e) in self.entries.iter().enumerate() {
            codec::check_entry(&e.as_ref(), n as u64, name)?;
            let here = (e.bank, e.id.as_str());
            if prev.is_some_and(|p| p >= here) {
                return Err(Error::BadSnapshot {
                    source_name: name.to_owned(),
                    why: format!(
                        "entry {n} ({:?}, {}): out of order or repeated (entries are sorted by \
                         bank, then id, each once)",
                        e.id, e.bank
                    ),
                });
            }
            prev = Some(here);
        }
        Ok(())
    }
}

/// Writes a file atomically through `body`: a temporary file in the same
/// directory (mode 0600), fsynced, renamed over `path`, the directory
/// fsynced. Used for snapshot files and merge bases.
pub(crate) fn write_file_with(
    path: &Path,
    body: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> Result<()>,
) -> Result<()> {
    let tmp = prepare_file_with(path, body)?;
    tmp.commit()
}

/// A file written and fsynced beside its destination, not yet renamed
/// into place ([`PreparedFile::commit`]); removed when dropped uncommitted.
#[derive(Debug)]
pub struct PreparedFile {
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
    done: bool,
}

impl PreparedFile {
    /// Renames the file into place and fsyncs the directory.
    pub fn commit(mut self) -> Result<()> {
        keycache::files::rename(&self.tmp, &self.path)?;
        self.done = true;
        Ok(keycache::files::sync_dir(&self.dir)?)
    }
}

impl Drop for PreparedFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `path`'s future content to a temporary file beside it (see
/// [`PreparedFile`]).
pub(crate) fn prepare_file_with(
    path: &Path,
    body: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> Result<()>,
) -> Result<PreparedFile> {
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
        keycache::files::now_ns()
    ));
    let own = keycache::files::Ownership {
        owner: None,
        mode: keycache::files::DEFAULT_MODE,
        explicit: false,
    };
    let prepared = PreparedFile {
        tmp: tmp.clone(),
        path: path.to_path_buf(),
        dir,
        done: false,
    };
    let f = keycache::files::create_new_unsynced(&tmp, &own).map_err(|e| match e {
        keycache::Error::Io { source, .. } => {
            Error::io(path, "create (beside it, a temporary file)", source)
        }
        e => e.into(),
    })?;
    let mut w = std::io::BufWriter::new(&f);
    body(&mut w)?;
    w.flush().map_err(|e| Error::io(path, "write", e))?;
    drop(w);
    keycache::files::sync_data(&f, path)?;
    Ok(prepared)
}

#[cfg(test)]
mod tests;
