//! The `localfs_key` tree: migrate's `--out`, the tree kept in step with
//! the store, export.

mod export;
mod migrate;
mod sync;
