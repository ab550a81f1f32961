//! The engine of Salt 3008's `mmap_key` minion-key store, byte for byte.
//!
//! A Salt 3008 master with `keys.cache_driver: mmap_key` keeps its minions'
//! public keys in memory-mapped banks (an open-addressing index, append-only
//! heap segments and a roster per bank; the layout is drawn in [`format`](mod@format)).
//! This crate reads and writes those same files:
//!
//! - [`Store`]: the `keys` bank (accepted, pending, rejected) and the
//!   `denied_keys` bank of one directory. Lookups take no lock and never
//!   return a torn value (every value is checked against its xxh3); writes
//!   interlock with Salt's own writers through `flock` on the banks' `.lock`
//!   files and are durable when they return.
//! - [`migrate::migrate`]: a `localfs_key` tree into the banks, atomically.
//! - [`verify`], [`rebuild`] (compaction), [`export`]: checks, rebuilds and
//!   the way back to a `localfs_key` tree.
//! - [`table::Table`]: one bank of any name, ids and values as bytes.
//! - [`master_keys`]: the master's own key files into the `master_keys`
//!   bank, as Salt's `MasterKeys` reads them.
//!
//! The crate prints nothing and reads no environment variable: settings
//! come in through [`OpenOptions`] and [`migrate::MigrateOptions`].
//!
//! ```
//! use keycache::{KeyState, MinionId, OpenOptions, Params, Store};
//!
//! # fn main() -> keycache::Result<()> {
//! # let dir = tempfile::tempdir().expect("temporary directory");
//! // The layout must match the master config (here `mmap_key_size: 10007`).
//! let opts = OpenOptions {
//!     params: Params { size: 10_007, ..Params::default() },
//!     ..OpenOptions::default()
//! };
//! let store = Store::open_with(dir.path(), &opts)?;
//!
//! let id = MinionId::new("web-01.example.com")?;
//! let pem = b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n";
//! store.put(&id, KeyState::Pending, pem)?;
//! store.set_state(&id, KeyState::Accepted)?; // salt-key -a
//! assert_eq!(store.get(&id)?.map(|e| e.state), Some(KeyState::Accepted));
//!
//! // A thread's loop of lookups: its own Reader, and a buffer reused from
//! // lookup to lookup (no allocation per lookup).
//! let mut reader = store.reader();
//! let mut buf = Vec::new();
//! let key = reader.get_in(&id, &mut buf)?.expect("present");
//! assert_eq!(key.public_key, &pem[..]);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

/// In test builds, a point where a writer can be stopped as if killed there
/// (`test_util::stop_at`): returns an error naming `$path`. Nothing in other
/// builds.
macro_rules! stop_point {
    ($path:expr) => {
        #[cfg(test)]
        if crate::test_util::stop_here() {
            return Err(crate::error::Error::Corrupt {
                path: $path.to_path_buf(),
                id: None,
                why: "stopped here by the test".into(),
            });
        }
    };
}

pub mod audit;
pub mod clock;
pub mod diff;
pub mod error;
pub mod export;
pub mod files;
pub mod fit;
pub mod format;
mod heap;
pub mod id;
mod image;
mod journal;
pub mod key;
#[allow(unsafe_code)]
mod map;
pub mod master_keys;
pub mod migrate;
pub mod pem;
pub mod rebuild;
pub mod removals;
pub mod report;
mod roster;
pub mod store;
pub mod table;
#[cfg(test)]
mod test_util;
pub mod tree;
pub mod verify;

pub use error::{Error, Result};
pub use format::Params;
pub use id::MinionId;
pub use key::Bank;
pub use store::{Counts, KeyBatch, KeyEntry, KeyRef, KeyState, Reader, Store};
pub use table::OpenOptions;
