//! The peer merge's one error type: the engine's errors, and what a
//! snapshot or a merge adds.

use std::path::PathBuf;

/// What can go wrong in a snapshot, a history or a merge: an error of the
/// store ([`keycache::Error`]) or one of the merge's own, each naming the
/// file, store or id and what to do.
///
/// New variants may come: match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of the store underneath (its message as it is).
    #[error(transparent)]
    Store(#[from] keycache::Error),

    /// A snapshot file ([`crate::snapshot`]) that cannot be read: not a
    /// snapshot, another format version, truncated, damaged (checksum) or
    /// holding an entry that is not valid.
    #[error("{source_name}: not a usable keycache snapshot: {why}")]
    BadSnapshot {
        /// Where the snapshot came from (a file name, `stdin`).
        source_name: String,
        /// What is wrong, with the byte offset where it helps.
        why: String,
    },

    /// A merge plan ([`crate::merge`]) made from a snapshot of the store
    /// that the store no longer matches: another writer changed an id the
    /// plan changes. Nothing was written; take a new snapshot and plan again.
    #[error("{dir}: {bank} entry {id:?} changed since the merge was planned ({why}); nothing was written: plan again")]
    StalePlan {
        /// The store directory.
        dir: PathBuf,
        /// The bank: `keys` or `denied_keys`.
        bank: &'static str,
        /// The id.
        id: String,
        /// What the plan expected and what the store holds.
        why: String,
    },

    /// A merge ([`crate::merge`]) that is not made: the snapshot is the
    /// store's own, from another cluster, a replay, too old, from a clock
    /// too far ahead, or would revoke too many keys at once. Nothing was
    /// written.
    #[error("merge refused: {why}; nothing was written")]
    MergeRefused {
        /// Why, and what to do.
        why: String,
    },

    /// A merge ([`crate::merge`]) refused because this store or the
    /// snapshot names no cluster: neither `cluster.pub` nor `master.pub`
    /// where it was looked for, so a snapshot of another cluster could not
    /// be told from a peer's (a real master always has its key pair).
    /// Nothing was written.
    #[error("merge refused: {side} names no cluster: {why}; nothing was written")]
    UnknownCluster {
        /// The side without a key: this store's directory, or the snapshot.
        side: String,
        /// Whether that side is the snapshot (a caller may name its file).
        snapshot: bool,
        /// The files that are missing, and the way out.
        why: String,
    },
}

impl Error {
    /// An I/O error on `path` during `op` (the store's own variant).
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        Error::Store(keycache::Error::io(path, op, source))
    }

    /// True when the error is a missing file or directory.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_not_found())
    }
}

/// Where a caller of the engine wants the engine's error (a hook it runs,
/// the Salt driver's write): the store's error as it was, the merge's own
/// as [`keycache::Error::Hook`].
impl From<Error> for keycache::Error {
    fn from(e: Error) -> keycache::Error {
        match e {
            Error::Store(e) => e,
            e => keycache::Error::Hook(Box::new(e)),
        }
    }
}

/// The merge's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
