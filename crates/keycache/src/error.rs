//! The library's one error type.
//!
//! Its messages name files, ids, Salt's master config options and what to
//! do about the data, never a `keycache` command or flag: the Salt driver
//! and other programs show them too. The CLI adds its own advice where it
//! prints them.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in keycache, with enough context for an
/// operator to act on it: which file, which id, what was expected.
///
/// New variants may come: match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call on a bank file failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file or directory the call was made on.
        path: PathBuf,
        /// What keycache was doing (`open`, `read`, `fsync`, ...).
        op: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The layout parameters cannot describe a Salt table.
    #[error("invalid layout parameters: {0}")]
    InvalidParams(String),

    /// A bank file does not match the layout parameters it was opened with.
    #[error("{path}: {what}: expected {expected}, found {found}")]
    Mismatch {
        /// The file that does not match.
        path: PathBuf,
        /// What was checked.
        what: &'static str,
        /// What the parameters call for.
        expected: String,
        /// What the file holds.
        found: String,
    },

    /// The layout given (or inferred) is not the layout of the files: using
    /// it would misread every entry, and a rebuild would drop them.
    #[error("{path}: the files do not fit the layout {tried}: {why}{looks_like}; nothing was read or written")]
    LayoutMismatch {
        /// The bank's index file.
        path: PathBuf,
        /// The layout tried, as the master config spells it.
        tried: String,
        /// What did not fit.
        why: String,
        /// The layout the files look like, when it can be told (with its
        /// leading "; ").
        looks_like: String,
    },

    /// A rebuild would leave out live entries of the bank it replaces that
    /// it was not asked to remove.
    #[error("{path}: the rebuild would drop {count} live entries it was not asked to remove ({ids}{more}); nothing was written", more = if *count > 10 { ", ..." } else { "" })]
    WouldDrop {
        /// The bank's index file.
        path: PathBuf,
        /// How many live entries would be lost.
        count: usize,
        /// The first ten of their ids.
        ids: String,
    },

    /// A bank file is not a regular file (a symlink, a directory, a device).
    #[error("{path}: refusing to use: {why}")]
    NotARegularFile {
        /// The offending path.
        path: PathBuf,
        /// What it is instead.
        why: &'static str,
    },

    /// A minion id that Salt would refuse.
    #[error("invalid minion id {id:?}: {why}")]
    InvalidId {
        /// The id as given (lossily decoded when not UTF-8).
        id: String,
        /// Which of Salt's rules it breaks.
        why: &'static str,
    },

    /// An id longer than the table's id field; Salt would silently truncate
    /// it into another id, keycache refuses it.
    #[error(
        "minion id {id:?} is {len} bytes, longer than the id size of {id_size} bytes; \
         Salt would truncate it (set mmap_key_id_size: {len} and mmap_key_slot_size: {slot} \
         or more in the master config)"
    )]
    IdTooLong {
        /// The id.
        id: String,
        /// Its length in bytes.
        len: usize,
        /// The table's id size.
        id_size: usize,
        /// The smallest slot size that holds an id of that length.
        slot: usize,
    },

    /// Every data slot is taken.
    #[error("{path}: the table is full ({capacity} data slots); compact into a larger table and raise mmap_key_size")]
    TableFull {
        /// The index file.
        path: PathBuf,
        /// Number of data slots.
        capacity: u64,
    },

    /// A stored entry cannot be read back intact.
    #[error("{path}: corrupt entry{}: {why}", id.as_ref().map(|i| format!(" for {i:?}")).unwrap_or_default())]
    Corrupt {
        /// The file where the damage is.
        path: PathBuf,
        /// The id concerned, when known.
        id: Option<String>,
        /// What is wrong, with the offset where it helps.
        why: String,
    },

    /// A value that does not fit the layout (larger than a u32 length).
    #[error("value for {id:?} is {len} bytes; the layout's length field holds at most 4294967295")]
    ValueTooLarge {
        /// The id.
        id: String,
        /// The value length.
        len: usize,
    },

    /// A `localfs_key` tree that cannot be migrated.
    #[error("{path}: {why}")]
    PkiDir {
        /// The tree or the directory of it concerned.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },

    /// A migration or compaction would fill a table past the load factor
    /// keycache allows.
    #[error(
        "{path}: {entries} entries would fill {:.0}% of a table of size {size} (keycache refuses above {:.0}%); \
         use a table of size {suggested} (`mmap_key_size: {suggested}` in the Salt master config)",
        load * 100.0, max_load * 100.0
    )]
    Overfull {
        /// The bank's index file.
        path: PathBuf,
        /// Entries the bank would hold.
        entries: u64,
        /// The table size given.
        size: u64,
        /// The load factor that would result.
        load: f64,
        /// The limit.
        max_load: f64,
        /// A size that holds the entries comfortably.
        suggested: u64,
    },

    /// A bank's lock stayed taken (by Salt's writer or another keycache)
    /// for longer than the caller would wait.
    #[error("{path}: still locked by another writer (a Salt master or another keycache) after {waited:?}; try again")]
    Busy {
        /// The bank's lock file.
        path: PathBuf,
        /// How long keycache waited.
        waited: std::time::Duration,
    },

    /// A migration into an existing store ([`crate::migrate`]) whose tree
    /// holds key files older than the store's entries that would take keys
    /// out of accepted or rejected: files left from before an earlier
    /// migration (the tree not kept whole since), which would undo a later
    /// accept or rejection. Nothing was written.
    #[error(
        "{dir}: {count} key file(s) of the tree are older than the store's entries and would \
         take them out of accepted or rejected: {entries}; nothing was written. Remove those \
         stale files from the tree, or, once sure the tree holds the states wanted, have the \
         migration replace the store's states"
    )]
    StaleTreeFiles {
        /// The tree migrated.
        dir: PathBuf,
        /// How many entries.
        count: usize,
        /// Each as `id: store <state>, <file> <state>`, comma-separated
        /// (the first few).
        entries: String,
    },

    /// A change guarded by a fingerprint (`--finger`) found another key, or
    /// none: the key was replaced (a new sign-in) or removed since the
    /// operator looked, so nothing was written.
    #[error(
        "{id}: the key held is not the one checked: its fingerprint is {}, not {expected}; \
         nothing was written (look at the key again)",
        found.as_deref().unwrap_or("none (no such key)")
    )]
    FingerMismatch {
        /// The minion id.
        id: String,
        /// The fingerprint given.
        expected: String,
        /// The fingerprint of the key held, if any.
        found: Option<String>,
    },

    /// The `master_keys` bank holds other bytes under a name than the file
    /// a migration would store there (a key pair Salt wrote into the bank
    /// since, or generated when it found the bank empty): replacing it
    /// would lose that key, so nothing was written.
    #[error(
        "{path}: the master_keys bank holds other bytes under {names} than the files of the \
         tree: a key Salt wrote into the bank (newer than the files, or generated when it found \
         the bank empty); nothing was written. Keep the bank's keys (leave the master_keys bank \
         out of the migration), or, once sure the files hold the keys the minions and peers \
         trust, replace the bank's"
    )]
    MasterKeysDiffer {
        /// The bank's index file.
        path: PathBuf,
        /// The names that differ, comma-separated.
        names: String,
    },

    /// An error of a caller's hook (a crate over the engine, such as the
    /// peer merge beginning a history after a migration), as it is.
    #[error(transparent)]
    Hook(Box<dyn std::error::Error + Send + Sync>),

    /// A key-bank value with a state byte Salt does not know.
    #[error("unknown key state {0:?} (expected accepted, pending or rejected)")]
    UnknownState(String),
}

impl Error {
    /// Whether this is an I/O error of a file that does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// Wraps an `io::Error` with the path and the operation.
    pub fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            op,
            source,
        }
    }

    /// True for errors that describe damaged data rather than a failed call.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors that used to tell the user a CLI flag: their messages
    /// name Salt's options only (the Salt driver shows them to operators).
    fn advised() -> Vec<Error> {
        let path = PathBuf::from("/pki/.mmap_keys.idx");
        vec![
            Error::IdTooLong {
                id: "x".repeat(70),
                len: 70,
                id_size: 64,
                slot: 91,
            },
            Error::TableFull {
                path: path.clone(),
                capacity: 10,
            },
            Error::Overfull {
                path: path.clone(),
                entries: 9,
                size: 11,
                load: 0.9,
                max_load: 0.8,
                suggested: 13,
            },
            Error::MasterKeysDiffer {
                path: path.clone(),
                names: "master.pem".into(),
            },
            crate::table::check_index_len(&path, &crate::Params::default(), 96 * 11)
                .expect_err("a short index"),
        ]
    }

    #[test]
    fn messages_name_no_cli_command_or_flag() {
        for e in advised() {
            let m = e.to_string();
            assert!(!m.contains("--"), "{m}");
            assert!(!m.contains("keycache compact"), "{m}");
            assert!(!m.contains("keycache migrate"), "{m}");
        }
        let m = advised()[4].to_string();
        assert!(
            m.contains("that is 11 slots of 96 bytes: set mmap_key_size to match"),
            "{m}"
        );
    }
}
