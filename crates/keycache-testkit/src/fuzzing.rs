//! Bodies of the fuzz targets, as plain functions of the input bytes, so the
//! cargo-fuzz targets in `fuzz/` and the stable replay test
//! (`tests/fuzz_replay.rs`) run the same code. Each one panics when a
//! property fails; nothing here is API. One module per fuzz target (the
//! cargo-fuzz target of the same name in `fuzz/fuzz_targets/` calls it),
//! each re-exported here:
//!
//! - [`store_bytes()`] (module [`store_bytes`](mod@store_bytes)): a store
//!   made of arbitrary bytes (index, heap segments, roster, journal,
//!   directories and symlinks in their place) is opened, read, listed,
//!   verified, repaired and compacted; every answer is checked against an
//!   independent reference reader of the same bytes.
//! - [`ops_model()`] (module [`ops_model`](mod@ops_model)): random puts,
//!   state changes, denies, removes, batches, compactions (into other sizes
//!   too) and reopens on tiny tables, checked against a model after every
//!   step, through two handles.
//! - [`migrate_tree()`] (module [`migrate_tree`](mod@migrate_tree)):
//!   `localfs_key` trees with odd names, sizes, symlinks, directories and
//!   sockets migrated into a store, checked against a model of the
//!   migrator's rules; nothing outside the tree is read, nothing outside the
//!   target written.
//! - [`master_config()`] (module [`master_config`](mod@master_config)): the
//!   Salt master config reader on arbitrary configs.
//! - [`snapshot_merge()`] (module [`snapshot_merge`](mod@snapshot_merge)):
//!   untrusted snapshot bytes read and planned as `keycache merge --dry-run`
//!   does.
//!
//! What the bodies share: `Input`, a cursor over the fuzz input, and
//! `opts`, the open options of the tiny tables.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keycache::format::Params;
use keycache::store::{KeyState, Store};
use keycache::table::OpenOptions;

pub mod master_config;
pub mod migrate_tree;
pub mod ops_model;
pub mod snapshot_merge;
pub mod store_bytes;
pub use master_config::master_config;
pub use migrate_tree::migrate_tree;
pub use ops_model::ops_model;
pub use snapshot_merge::snapshot_merge;
pub use store_bytes::{encode_store, store_bytes, store_params, STORE_FILES};

/// A cursor over the fuzz input that yields zeros once exhausted.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, pos: 0 }
    }
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = self.pos.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        &self.data[start..end]
    }
}

fn opts(params: Params) -> OpenOptions {
    OpenOptions {
        params,
        refresh: Duration::ZERO,
        ownership: None,
        read_retry: Duration::ZERO,
        rebuild_settle: Duration::ZERO,
    }
}

/// Both banks of `store` as its listings give them: `(id, state, key)` of
/// the keys bank, `(id, key)` of the denied bank, in listing order.
#[allow(clippy::type_complexity)]
fn banks_of(store: &Store) -> (Vec<(String, KeyState, Vec<u8>)>, Vec<(String, Vec<u8>)>) {
    let keys = store
        .keys(None)
        .expect("list")
        .map(|r| {
            let (id, e) = r.expect("entry");
            (id, e.state, e.public_key)
        })
        .collect();
    let denied = store
        .denied_keys()
        .expect("list")
        .map(|r| r.expect("entry"))
        .collect();
    (keys, denied)
}

/// The key state a byte selects.
fn state_of(b: u8) -> KeyState {
    KeyState::ALL[usize::from(b % 3)]
}

/// Snapshot of a directory tree: path -> (kind, bytes or link target).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (char, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let ft = m.file_type();
            let entry = if ft.is_symlink() {
                (
                    'l',
                    std::fs::read_link(&p)
                        .map(|t| t.as_os_str().as_bytes().to_vec())
                        .unwrap_or_default(),
                )
            } else if ft.is_dir() {
                stack.push(p.clone());
                ('d', Vec::new())
            } else if ft.is_file() {
                let mut b = std::fs::read(&p).unwrap_or_default();
                b.extend_from_slice(format!("|mode {:o}", m.mode() & 0o7777).as_bytes());
                ('f', b)
            } else {
                ('o', Vec::new())
            };
            out.insert(p, entry);
        }
    }
    out
}
