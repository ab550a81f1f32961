//! Merge bases: the small file a merge from a peer leaves for the next one
//! (`keycache merge --write-base`, then `--base`): which store it merged
//! and that snapshot's generation, so that an older snapshot of the same
//! store is refused. The store keeps the same record itself (its identity
//! file); the base file adds a second one that travels with the operator's
//! timer.
//!
//! ```text
//! magic "KCBASE\r\n" (8) | version u32 = 1 | store [16]
//! | generation u64 | xxh3-64 of every byte before it, u64
//! ```
//!
//! A file written by an older keycache (a whole snapshot, version 1) is
//! read as no base: the history replaces what it was for.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::history::Ident;
use crate::snapshot::{prepare_file_with, PreparedFile, Snapshot};

const MAGIC: [u8; 8] = *b"KCBASE\r\n";
const LEN: usize = 8 + 4 + 16 + 8 + 8;

/// What was last merged from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Base {
    /// The peer's store.
    pub store: Ident,
    /// The generation of the snapshot merged.
    pub generation: u64,
}

/// What [`Base::read_file`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseFile {
    /// No file: no merge from that peer yet.
    Missing,
    /// A file of an older keycache (a whole snapshot): no base.
    Old,
    /// A base.
    Base(Base),
}

impl Base {
    /// The base a merge of `s` leaves.
    pub fn of(s: &Snapshot) -> Base {
        Base {
            store: s.store,
            generation: s.generation,
        }
    }

    /// Reads a base file. A file that exists but cannot be read, or is
    /// neither a base nor an older keycache's snapshot, is an error (never
    /// taken as no base).
    pub fn read_file(path: &Path) -> Result<BaseFile> {
        let b = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BaseFile::Missing),
            Err(e) => return Err(Error::io(path, "read the merge base", e)),
        };
        let bad = |why: &str| Error::BadSnapshot {
            source_name: path.to_string_lossy().into_owned(),
            why: format!("not a usable merge base: {why} (remove it to merge without one)"),
        };
        if b.len() >= 12 && b[..8] == crate::snapshot::MAGIC && b[8..12] == 1u32.to_le_bytes() {
            return Ok(BaseFile::Old);
        }
        if b.len() != LEN || b[..8] != MAGIC {
            return Err(bad("wrong magic or length"));
        }
        if b[8..12] != 1u32.to_le_bytes() {
            return Err(bad("unknown version"));
        }
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&b[LEN - 8..]);
        if u64::from_le_bytes(sum) != keycache::format::hash(&b[..LEN - 8]) {
            return Err(bad("checksum mismatch"));
        }
        let mut store = [0u8; 16];
        store.copy_from_slice(&b[12..28]);
        let mut g = [0u8; 8];
        g.copy_from_slice(&b[28..36]);
        Ok(BaseFile::Base(Base {
            store,
            generation: u64::from_le_bytes(g),
        }))
    }

    /// Writes the base beside `path` and fsyncs it, without renaming it
    /// into place: [`PreparedFile::commit`] does, after the merge. A base
    /// that cannot be written so fails before the merge writes anything.
    pub fn prepare(&self, path: &Path) -> Result<PreparedFile> {
        let mut b = Vec::with_capacity(LEN);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&self.store);
        b.extend_from_slice(&self.generation.to_le_bytes());
        let sum = keycache::format::hash(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        prepare_file_with(path, |w| {
            w.write_all(&b)
                .map_err(|e| Error::io(path, "write the merge base", e))
        })
    }

    /// Refuses `theirs` when it is an older snapshot of the store this base
    /// records.
    pub fn check(&self, theirs: &Snapshot) -> Result<()> {
        if theirs.store == self.store && theirs.generation < self.generation {
            return Err(Error::MergeRefused {
                why: format!(
                    "the snapshot of store {} is older (generation {}) than the base given for \
                     it ({}): a replayed or stale snapshot",
                    crate::history::show_ident(&theirs.store),
                    crate::hlc::show(theirs.generation),
                    crate::hlc::show(self.generation)
                ),
            });
        }
        Ok(())
    }
}
