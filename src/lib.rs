#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#[doc(hidden)]
pub mod bench;
pub mod cli;
pub mod error;
pub mod export;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
mod heap;
pub mod id;
pub mod layout;
mod map;
pub mod migrate;
pub mod rebuild;
mod roster;
pub mod store;
pub mod table;
pub mod verify;

pub use error::{Error, Result};
pub use id::MinionId;
pub use layout::Params;
pub use store::{Counts, KeyBatch, KeyEntry, KeyRef, KeyState, Reader, Store};
pub use table::OpenOptions;
