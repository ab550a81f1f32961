//! keycache: the engine of Salt 3008's `mmap_key` minion-key store.
#![warn(missing_docs)]
pub mod error;
pub mod export;
pub mod files;
pub mod format;
mod heap;
pub mod id;
#[allow(unsafe_code)]
mod map;
pub mod migrate;
pub mod rebuild;
mod roster;
pub mod store;
pub mod table;
pub mod verify;

pub use error::{Error, Result};
pub use format::Params;
pub use id::MinionId;
pub use store::{Counts, KeyBatch, KeyEntry, KeyRef, KeyState, Reader, Store};
pub use table::OpenOptions;
