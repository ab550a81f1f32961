//! The one error type of the etcd replica.

use std::path::PathBuf;

/// What went wrong, with what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store (or the key tree) refused or failed.
    #[error(transparent)]
    Store(#[from] keycache::Error),
    /// A setting that cannot be used.
    #[error("keycache_etcd: {0}")]
    Config(String),
    /// A TLS file that cannot be read.
    #[error("keycache_etcd: cannot read {path}: {why}")]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// etcd did not answer or refused a request.
    #[error("etcd ({endpoints}): {op} failed: {why}")]
    Etcd {
        /// The endpoints tried.
        endpoints: String,
        /// What was asked.
        op: &'static str,
        /// etcd's or the transport's reason.
        why: String,
    },
    /// The key state changed between the read and the write, every time
    /// the write was tried.
    #[error("etcd: {key} kept changing while it was being written ({tries} tries); nothing was written for it, try again")]
    Conflict {
        /// The etcd key.
        key: String,
        /// How many times.
        tries: u32,
    },
    /// etcd holds another value for a key than the replica showed when the
    /// write was decided: a change committed elsewhere has not reached this
    /// master yet. Nothing was written.
    #[error("etcd: {key} was changed elsewhere after this master's replica read it; nothing was written, try again")]
    Changed {
        /// The etcd key.
        key: String,
    },
    /// etcd committed a write, but this master's replica did not apply it
    /// in time.
    #[error(
        "etcd committed the change (revision {revision}), but the replica in {dir} has not \
         applied it within {waited_ms} ms (it holds revision {holds} of that etcd cluster): {why}"
    )]
    NotApplied {
        /// What the replica lacks, and what to look at.
        why: String,
        /// The store directory.
        dir: PathBuf,
        /// The revision of the commit.
        revision: i64,
        /// The revision the replica holds of the etcd cluster that
        /// committed the change (0: none, or it replicates another).
        holds: i64,
        /// How long this waited.
        waited_ms: u64,
    },
    /// The replica's state file cannot be used.
    #[error("{path}: {why}")]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Another replicator holds the store's lock ([`crate::lock`]).
    #[error(
        "{}: another replicator{} replicates into this store; one replicator per store: stop \
         that one (the systemd unit or the Salt engine), or point this one at another \
         directory", path.display(), holder(*.pid)
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The holder's pid, when the file names one.
        pid: Option<u32>,
    },
    /// A seed into a prefix that already holds keys.
    #[error(
        "etcd prefix {prefix} already holds {count} keys: a seed would overwrite another \
         master's key state; seed only into an empty prefix, or ask for it explicitly"
    )]
    PrefixNotEmpty {
        /// The prefix.
        prefix: String,
        /// How many keys it holds.
        count: i64,
    },
}

fn holder(pid: Option<u32>) -> String {
    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The store error of a file operation `op` on `path` that failed.
    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> Error {
        keycache::Error::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
        .into()
    }

    pub(crate) fn etcd(endpoints: &[String], op: &'static str, e: impl std::fmt::Display) -> Error {
        Error::Etcd {
            endpoints: endpoints.join(","),
            op,
            why: e.to_string(),
        }
    }
}
