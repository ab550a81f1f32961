//! keycache: the engine of Salt 3008's `mmap_key` minion-key store.
#![warn(missing_docs)]
pub mod diff;
pub mod error;
pub mod export;
pub mod files;
mod heap;
pub mod id;
pub mod layout;
#[allow(unsafe_code)]
mod map;
pub mod migrate;
pub mod rebuild;
pub mod report;
mod roster;
pub mod store;
pub mod table;
pub mod verify;

pub use error::{Error, Result};
pub use id::MinionId;
pub use layout::Params;
pub use store::{Counts, KeyBatch, KeyEntry, KeyRef, KeyState, Reader, Store};
pub use table::OpenOptions;
