//! The bytes of snapshot files: a streaming writer and a streaming reader
//! that checks every length before it allocates, and the checks of what
//! an entry promises.

use std::io::{Read, Write};

use xxhash_rust::xxh3::Xxh3;

use super::{
    Bank, Entry, EntryRef, Snapshot, ENTRY_HEAD_LEN, FLAG_CLUSTER, HEADER_LEN, MAGIC,
    MAX_KEY_BYTES, VERSION,
};
use crate::error::{Error, Result};
use crate::history::{Ident, Kind};

/// Writes a snapshot's bytes, hashing them on the way.
pub(super) struct Writer<'w, W: Write> {
    w: &'w mut W,
    h: Xxh3,
}

impl<'w, W: Write> Writer<'w, W> {
    pub(super) fn new(w: &'w mut W) -> Self {
        Writer { w, h: Xxh3::new() }
    }

    fn put(&mut self, b: &[u8]) -> Result<()> {
        self.h.update(b);
        self.w
            .write_all(b)
            .map_err(|e| Error::io("<snapshot output>", "write", e))
    }

    pub(super) fn header(&mut self, s: &Snapshot) -> Result<()> {
        self.header_parts(s.cluster, s.store, s.generation, s.entries.len() as u64)
    }

    /// The header of a snapshot of `count` entries.
    pub(super) fn header_parts(
        &mut self,
        cluster: Option<Ident>,
        store: Ident,
        generation: u64,
        count: u64,
    ) -> Result<()> {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if cluster.is_some() { FLAG_CLUSTER } else { 0 };
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b[16..32].copy_from_slice(&cluster.unwrap_or_default());
        b[32..48].copy_from_slice(&store);
        b[48..56].copy_from_slice(&generation.to_le_bytes());
        b[56..64].copy_from_slice(&count.to_le_bytes());
        self.put(&b)
    }

    pub(super) fn entry(&mut self, e: &Entry) -> Result<()> {
        self.entry_ref(&e.as_ref())
    }

    /// An entry; its lengths must fit the format (checked by the caller).
    pub(super) fn entry_ref(&mut self, e: &EntryRef<'_>) -> Result<()> {
        let mut b = [0u8; ENTRY_HEAD_LEN];
        b[0] = super::bank_byte(e.bank);
        b[1] = e.kind.byte();
        b[2..4].copy_from_slice(&(e.id.len() as u16).to_le_bytes());
        b[4..8].copy_from_slice(&(e.public_key.len() as u32).to_le_bytes());
        b[8..16].copy_from_slice(&e.stamp.to_le_bytes());
        self.put(&b)?;
        self.put(e.id.as_bytes())?;
        self.put(e.public_key)
    }

    pub(super) fn finish(self) -> Result<()> {
        let sum = self.h.digest();
        self.w
            .write_all(&sum.to_le_bytes())
            .map_err(|e| Error::io("<snapshot output>", "write", e))
    }
}

/// Reads a snapshot's bytes, hashing them on the way.
pub(super) struct Reader<'n, R: Read> {
    r: R,
    h: Xxh3,
    name: &'n str,
    /// Bytes read so far.
    at: u64,
    /// Entries announced, and read so far.
    count: u64,
    n: u64,
    prev: Option<(Bank, String)>,
    /// The id and key of the entry last read, reused.
    id: Vec<u8>,
    key: Vec<u8>,
}

impl<'n, R: Read> Reader<'n, R> {
    pub(super) fn new(r: R, name: &'n str) -> Self {
        Reader {
            r,
            h: Xxh3::new(),
            name,
            at: 0,
            count: 0,
            n: 0,
            prev: None,
            id: Vec::new(),
            key: Vec::new(),
        }
    }

    fn bad(&self, why: String) -> Error {
        Error::BadSnapshot {
            source_name: self.name.to_owned(),
            why,
        }
    }

    /// Fills `buf` (hashed when `hash`); `what` names it when the input
    /// ends first.
    fn fill(&mut self, buf: &mut [u8], what: impl Fn() -> String, hash: bool) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => {
                    let at = self.at + got as u64;
                    return Err(self.bad(if at == 0 {
                        "empty (no snapshot was written: did the sending side fail?)".into()
                    } else if at < MAGIC.len() as u64 && MAGIC.starts_with(&buf[..got]) {
                        format!("truncated: {at} bytes, a part of the magic only")
                    } else {
                        format!(
                            "truncated: {} at byte {} is past the end ({at} bytes)",
                            what(),
                            self.at
                        )
                    }));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.bad(format!("read failed: {e}"))),
            }
        }
        if hash {
            self.h.update(buf);
        }
        self.at += buf.len() as u64;
        Ok(())
    }

    pub(super) fn header(&mut self) -> Result<Snapshot> {
        let mut m = [0u8; 8];
        self.fill(&mut m, || "the magic".into(), true)?;
        if m != MAGIC {
            return Err(self.bad(format!(
                "wrong magic (the first 8 bytes are not {:?}): not a keycache snapshot",
                String::from_utf8_lossy(&MAGIC)
            )));
        }
        let mut b = [0u8; HEADER_LEN - 8];
        self.fill(&mut b, || "the header".into(), true)?;
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let version = u32_at(0);
        if version != VERSION {
            return Err(self.bad(format!(
                "format version {version}; this keycache reads version {VERSION}{}",
                if version < VERSION {
                    " (a snapshot of an older keycache: upgrade keycache on every peer)"
                } else {
                    " (a newer keycache wrote it: upgrade this one)"
                }
            )));
        }
        let flags = u32_at(4);
        if flags & !FLAG_CLUSTER != 0 {
            return Err(self.bad(format!("unknown flags {flags:#x}")));
        }
        let mut cluster = [0u8; 16];
        cluster.copy_from_slice(&b[8..24]);
        let mut store = [0u8; 16];
        store.copy_from_slice(&b[24..40]);
        self.count = u64_at(48);
        Ok(Snapshot {
            cluster: (flags & FLAG_CLUSTER != 0).then_some(cluster),
            store,
            generation: u64_at(40),
            entries: Vec::new(),
        })
    }

    /// The next entry, checked; `None` after the last one.
    pub(super) fn entry(&mut self) -> Result<Option<EntryRef<'_>>> {
        if self.n == self.count {
            return Ok(None);
        }
        let (n, count, at) = (self.n, self.count, self.at);
        let mut b = [0u8; ENTRY_HEAD_LEN];
        self.fill(&mut b, || format!("entry {n} of {count}"), true)?;
        let id_len = u16::from_le_bytes([b[2], b[3]]) as usize;
        let key_len = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[8..16]);
        let stamp = u64::from_le_bytes(s);
        let bank = super::bank_of_byte(b[0])
            .ok_or_else(|| self.bad(format!("entry {n} at byte {at}: unknown bank {}", b[0])))?;
        let kind = Kind::from_byte(b[1])
            .ok_or_else(|| self.bad(format!("entry {n} at byte {at}: unknown kind {}", b[1])))?;
        let mut idb = std::mem::take(&mut self.id);
        idb.resize(id_len, 0);
        let r = self.fill(&mut idb, || format!("the id of entry {n}"), true);
        self.id = idb;
        r?;
        let Ok(id) = std::str::from_utf8(&self.id) else {
            return Err(self.bad(format!("entry {n} at byte {at}: the id is not UTF-8")));
        };
        if key_len > MAX_KEY_BYTES {
            return Err(self.bad(format!(
                "entry {n} ({id:?}, {bank}): a public key of {key_len} bytes, more than \
                 {MAX_KEY_BYTES}"
            )));
        }
        let what = id.to_owned();
        let mut key = std::mem::take(&mut self.key);
        key.resize(key_len, 0);
        let r = self.fill(
            &mut key,
            || format!("the key of entry {n} ({what:?})"),
            true,
        );
        self.key = key;
        r?;
        let id = std::str::from_utf8(&self.id).unwrap_or_default();
        let e = EntryRef {
            bank,
            id,
            kind,
            stamp,
            public_key: &self.key,
        };
        check_entry(&e, n, self.name)?;
        if let Some((pb, pid)) = &self.prev {
            if (*pb, pid.as_str()) >= (e.bank, e.id) {
                return Err(Error::BadSnapshot {
                    source_name: self.name.to_owned(),
                    why: format!(
                        "entry {n} ({:?}, {}): out of order or repeated (entries are sorted by \
                         bank, then id, each once)",
                        e.id, e.bank
                    ),
                });
            }
        }
        match &mut self.prev {
            Some((pb, pid)) => {
                *pb = bank;
                pid.clear();
                pid.push_str(id);
            }
            None => self.prev = Some((bank, id.to_owned())),
        }
        self.n += 1;
        Ok(Some(e))
    }

    /// Reads and checks the trailer, and that nothing follows it.
    pub(super) fn finish(mut self) -> Result<()> {
        let mut t = [0u8; 8];
        self.fill(&mut t, || "the checksum".into(), false)?;
        let want = u64::from_le_bytes(t);
        let mut extra = [0u8; 1];
        let more = loop {
            match self.r.read(&mut extra) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.bad(format!("read failed: {e}"))),
            }
        };
        if more > 0 {
            return Err(self.bad(format!("bytes past the checksum at byte {}", self.at - 8)));
        }
        let got = self.h.digest();
        if want != got {
            return Err(self.bad(format!(
                "checksum mismatch (stored {want:016x}, computed {got:016x}): the file is damaged"
            )));
        }
        Ok(())
    }
}

/// Checks one entry: a valid id, a kind that fits the bank, a tombstone
/// without a key, a value with one, within the limits, and no private key
/// block.
pub(super) fn check_entry(e: &EntryRef<'_>, n: u64, name: &str) -> Result<()> {
    let bad = |why: String| Error::BadSnapshot {
        source_name: name.to_owned(),
        why: format!("entry {n} ({:?}, {}): {why}", e.id, e.bank),
    };
    keycache::id::validate(e.id).map_err(|err| bad(err.to_string()))?;
    if e.id.len() > u16::MAX as usize {
        return Err(bad("the id is too long for the format".into()));
    }
    match (e.bank, e.kind) {
        (_, Kind::Absent) => {
            if !e.public_key.is_empty() {
                return Err(bad("a tombstone with a key".into()));
            }
            return Ok(());
        }
        (Bank::Keys, Kind::Denied) => return Err(bad("a keys entry of kind denied".into())),
        (Bank::Denied, k) if k != Kind::Denied => {
            return Err(bad(format!("a denied_keys entry of kind {}", k.name())))
        }
        _ => {}
    }
    if e.public_key.is_empty() {
        return Err(bad("an empty public key".into()));
    }
    if e.public_key.len() > MAX_KEY_BYTES {
        return Err(bad(format!(
            "a public key of {} bytes, more than {MAX_KEY_BYTES}",
            e.public_key.len()
        )));
    }
    if keycache::pem::holds_private_key(e.public_key) {
        return Err(bad("the value holds a PRIVATE KEY block".into()));
    }
    Ok(())
}
