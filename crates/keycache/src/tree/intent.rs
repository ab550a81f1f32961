//! The intent record of a tree write: the ids whose key files a batch is
//! about to change, made durable before the banks are written and cleared
//! once the tree is in step with them.
//!
//! A writer killed between the bank write and the end of the tree write
//! leaves the tree behind the store: accepted minions without their
//! `minions/<id>` (refused by Salt's `validate_token`), or a file left in
//! a directory of a state the id is no longer in. Nothing in the banks says
//! which ids those are, and a tree changed by hand must not be "mended" in
//! the accepting direction without an operator (a `minions/<id>` removed
//! by hand may be a revocation in `localfs_key` habits). The record names
//! exactly the ids the interrupted write touched, so the next writer of the
//! store (every batch does it first, under the `keys` bank's lock) brings
//! those, and only those, in step with the store ([`crate::Store::resume_tree`]).
//!
//! # The record
//!
//! [`INTENT_FILE`] in the store directory, mode 0600, written in place
//! (one file for the store's life: no directory entry to make durable per
//! batch): a 24-byte header, `KCTI`, a version byte (1), the scope (the
//! state directories kept in step, bit [`TreeDir::index`]), two zero
//! bytes, the count of ids (u32 LE), the length of the ids (u32 LE), the
//! XXH3-64 of the header's first 16 bytes and the ids (u64 LE); then the
//! ids, each followed by `\n`. Clearing overwrites the magic with zeros,
//! without an fsync: a clearing lost to a power cut makes the next writer
//! bring the same ids in step again, which changes nothing.
//!
//! A record whose checksum does not match was being written when the
//! writer died: it is made durable before the banks are written, so the
//! banks were not, and there is nothing to bring in step.
//!
//! Only a batch that removes or writes a `minions/` file makes its record
//! durable (`fdatasync`). Any other batch (a sign-in: a `minions_pre/`
//! file) leaves its record to the page cache, which a kill does not lose;
//! a power cut can lose it with the files it names, files that let no
//! minion in and that `verify` reports and its repair writes again.

use std::os::unix::fs::FileExt;

use super::*;
pub use crate::format::TREE_INTENT_FILE as INTENT_FILE;

const MAGIC: &[u8; 4] = b"KCTI";
const VERSION: u8 = 1;
const HEADER: usize = 24;
/// The largest record read back: 16 MiB of ids (a million ids of 16 bytes).
const MAX_RECORD: u64 = 16 << 20;

/// An intent record found: a tree write that did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The state directories the interrupted write kept in step.
    pub scope: u8,
    /// The ids it touched.
    pub ids: Vec<MinionId>,
}

impl Record {
    /// The state directories of [`Record::scope`]: `minions/` alone, or
    /// all four (the only two scopes a [`TreeSync`] has).
    pub fn dirs(&self) -> &'static [TreeDir] {
        if self.scope == dir_mask(TreeSync::Accepted.dirs()) {
            TreeSync::Accepted.dirs()
        } else {
            TreeSync::On.dirs()
        }
    }
}

/// What the next writer did to finish an interrupted tree write
/// ([`crate::Store::resume_tree`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Resumed {
    /// The ids the interrupted write had touched, brought in step with the
    /// store.
    pub ids: Vec<String>,
    /// The key files written and removed to do it.
    pub changes: TreeChanges,
}

impl std::fmt::Display for Resumed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a write of the key tree was interrupted (a killed writer): the key files of its {} \
             id(s) were brought in step with the store ({} written, {} removed)",
            self.ids.len(),
            self.changes.written.len(),
            self.changes.removed.len()
        )
    }
}

fn path(dir: &Path) -> PathBuf {
    dir.join(INTENT_FILE)
}

/// Writes the record of a tree write of `ids` (scope `scope`) in `dir`,
/// durably when `durable` (a write that changes `minions/`); else it is
/// left to the page cache, which a kill does not lose.
pub(crate) fn begin<'a>(
    dir: &Path,
    own: &Ownership,
    scope: u8,
    ids: impl Iterator<Item = &'a str>,
    durable: bool,
) -> Result<()> {
    let p = path(dir);
    let mut buf = vec![0u8; HEADER];
    let mut n: u32 = 0;
    for id in ids {
        buf.extend_from_slice(id.as_bytes());
        buf.push(b'\n');
        n = n.saturating_add(1);
    }
    let len = u32::try_from(buf.len() - HEADER).map_err(|_| Error::Io {
        path: p.clone(),
        op: "record the ids of a key tree write",
        source: std::io::Error::other("more than 4 GiB of ids in one batch"),
    })?;
    buf[..4].copy_from_slice(MAGIC);
    buf[4] = VERSION;
    buf[5] = scope;
    buf[8..12].copy_from_slice(&n.to_le_bytes());
    buf[12..16].copy_from_slice(&len.to_le_bytes());
    let sum = checksum(&buf[..16], &buf[HEADER..]);
    buf[16..24].copy_from_slice(&sum.to_le_bytes());
    let existed = std::fs::symlink_metadata(&p).is_ok();
    let f = crate::files::open_or_create(
        &p,
        &Ownership {
            mode: 0o600,
            ..*own
        },
    )?;
    f.write_all_at(&buf, 0)
        .map_err(|e| Error::io(&p, "write", e))?;
    if durable {
        crate::files::sync_data(&f, &p)?;
        if !existed {
            crate::files::sync_dir(dir)?;
        }
    }
    Ok(())
}

/// Clears the record in `dir` (the tree is in step with what it named).
pub(crate) fn clear(dir: &Path) -> Result<()> {
    let p = path(dir);
    match crate::files::open_no_follow(&p, true) {
        Ok((f, _)) => f
            .write_all_at(&[0; 4], 0)
            .map_err(|e| Error::io(&p, "clear", e)),
        Err(crate::files::Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(r) => Err(r.into_error(&p)),
    }
}

impl Record {
    /// Whether `dir` holds no record to finish (no file, or a cleared
    /// one): four bytes read, for every write of the store to ask.
    pub fn absent(dir: &Path) -> bool {
        let p = path(dir);
        let mut magic = [0u8; 4];
        match crate::files::open_no_follow(&p, false) {
            Ok((f, _)) => !matches!(f.read_exact_at(&mut magic, 0), Ok(()) if &magic == MAGIC),
            Err(_) => true,
        }
    }

    /// See [`read`].
    pub fn read(dir: &Path) -> Result<Option<Record>> {
        if Record::absent(dir) {
            return Ok(None);
        }
        read(dir)
    }
}

/// The record left in `dir` by a tree write that did not finish, if any.
/// A record that is not whole (its write was interrupted, so the banks were
/// not written after it) or cleared is none; ids that are not valid minion
/// ids are skipped (never written by keycache).
fn read(dir: &Path) -> Result<Option<Record>> {
    let p = path(dir);
    let mut buf = Vec::new();
    match crate::files::read_small(&p, MAX_RECORD, &mut buf) {
        Ok(_) => {}
        Err(crate::files::Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(r) => return Err(r.into_error(&p)),
    }
    if buf.len() < HEADER || &buf[..4] != MAGIC || buf[4] != VERSION {
        return Ok(None);
    }
    let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let len = u32_at(12) as usize;
    let Some(ids) = buf.get(HEADER..HEADER + len) else {
        return Ok(None);
    };
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&buf[16..24]);
    if checksum(&buf[..16], ids) != u64::from_le_bytes(sum) {
        return Ok(None);
    }
    let ids = ids
        .split(|b| *b == b'\n')
        .filter(|s| !s.is_empty())
        .filter_map(|s| MinionId::from_bytes(s).ok())
        .collect();
    Ok(Some(Record { scope: buf[5], ids }))
}

fn checksum(head: &[u8], ids: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(head);
    h.update(ids);
    h.digest()
}
