//! Every master's keycache store a live local replica of one key state in
//! etcd v3.
//!
//! etcd holds the key state of a cluster of Salt masters under one prefix
//! ([`prefix`]: one etcd key per bank and minion id, the value as the store
//! holds it; never the `master_keys` bank). On each master:
//!
//! - the [`Replicator`] lists the prefix at one revision, makes the local
//!   store equal to it (key tree in step), then applies etcd's watch, batch
//!   by batch, recording the revision the store holds ([`state`]);
//! - every change goes to etcd first ([`write::Writer`]): a transaction,
//!   then a wait until the local replica has applied its revision, so that a
//!   master reads its own writes; nothing is written locally that etcd did
//!   not commit. Reads stay local and lock-free, as with any keycache store;
//! - [`seed`] fills an empty prefix from an existing store, and [`status`]
//!   compares a replica with etcd;
//! - a writer with an actor puts the audit records of each change into
//!   etcd with it, and every replicator appends them to its store's log
//!   ([`audit`]);
//! - each replicator keeps [`metrics`] of what it does, with its health and
//!   readiness, served over HTTP where `keycache_etcd: {metrics: ADDR}`
//!   says.
//!
//! The keycache library itself has no async runtime or gRPC: they live
//! here. Every entry point connects on its own: no connection or runtime
//! outlives the call that made it, so none crosses a fork (Salt forks its
//! workers after loading modules).
//!
//! ```no_run
//! use keycache_etcd::{Replicator, Settings};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = Settings::plain(vec!["http://127.0.0.1:2379".into()], "/keycache/default/")?;
//! let mut store = keycache::Store::open("/etc/salt/pki/master")?;
//! store.set_tree(keycache::tree::TreeSync::auto(store.dir()));
//! // Runs until killed; a restart resumes from the recorded revision.
//! Replicator::new(settings, store, |report| eprintln!("{report:?}")).run_blocking()?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod anchor;
pub mod audit;
pub mod catch_up;
pub mod check;
pub mod connect;
pub mod error;
pub mod list;
pub mod lock;
pub mod metrics;
pub mod prefix;
pub mod replica;
pub mod replicator;
pub mod report;
pub mod seed;
pub mod state;
pub mod status;
pub mod write;

pub use connect::Settings;
pub use error::{Error, Result};
pub use metrics::Metrics;
pub use prefix::{Prefix, Value};
pub use replicator::{Replicator, Report};
pub use state::ReplicaState;

/// Runs `f` on a single-threaded runtime made for this call and dropped
/// with it (no runtime outlives a call, so none crosses a fork).
pub fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Config(format!("cannot start the async runtime: {e}")))?
        .block_on(f)
}
