//! The peer merge of keycache stores: how the masters of a cluster with
//! isolated filesystems converge on one key state over any transport,
//! without etcd.
//!
//! - [`history`]: per entry of both key banks, the version this master
//!   last saw (a hybrid logical clock stamp, [`hlc`], and the peer that
//!   made it), kept beside the store.
//! - [`snapshot`]: both banks as of one moment, with their versions and
//!   recent removals, in one checksummed file.
//! - [`merge`]: the three-way merge of a peer's snapshot into the store
//!   (the version that wins, per entry), in one batch under both banks'
//!   locks.
//!
//! The engine ([`keycache`]) knows nothing of a merge; what it keeps for
//! one is its removal log ([`keycache::removals`]), written by the store
//! when a history exists. Like the engine, this crate prints nothing and
//! reads no environment variable.
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod error;
pub mod history;
pub mod hlc;
pub mod merge;
pub mod snapshot;
#[cfg(test)]
mod test_util;

pub use error::{Error, Result};
