//! The CLI's edges: layouts that are not the
//! files' refused by every command, private key material never printed,
//! a closed stdout, bench arguments, unreadable stores, compact's load
//! limit, `--user`, migrate's target directory, accept/delete arguments and
//! confirmation, the notice of a wait for a bank's lock, and escaped ids.
//! The helpers they share are here.

mod args;
mod layouts;
mod output;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use crate::common::{
    kc, keycache, keycache_exits, keycache_json, keycache_ok, keycache_ok_json, ok, open, pem, s,
    salt, sample_pki, sample_store, sample_store_dir, sized, small, stderr, stdout, TestCommand,
    BIN, TREE_DIRS,
};

/// Every file of a directory (not recursive), by name: the store's bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap_or_default(),
                )
            })
            .collect()
        })
        .unwrap_or_default()
}

fn no_panic(o: &Output, what: &str) {
    assert!(
        !stderr(o).contains("panicked") && o.status.code() != Some(101),
        "{what}: {}",
        stderr(o)
    );
}
