//! One lookup of each contender (keycache's kinds of lookup, LMDB) and Salt
//! 3008.5's `mmap_key` through the test kit's Salt driver; the contenders'
//! names in the report.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use keycache::{KeyBatch, MinionId, Reader, Store};
use keycache_bench::touch;
use serde_json::Value as Json;

use crate::data::Prepared;
use crate::measure::Cfg;
use crate::util::{die, repo};

#[inline]
pub(crate) fn kc_get(store: &Store, id: &MinionId) -> u64 {
    match store.get(id).expect("keycache get") {
        Some(e) => touch(e.state.byte(), &e.public_key),
        None => 0,
    }
}

#[inline]
pub(crate) fn kc_get_in(store: &Store, id: &MinionId, buf: &mut Vec<u8>) -> u64 {
    match store.get_in(id, buf).expect("keycache get_in") {
        Some(e) => touch(e.state.byte(), e.public_key),
        None => 0,
    }
}

#[inline]
pub(crate) fn kc_reader_get_in(r: &mut Reader<'_>, id: &MinionId, buf: &mut Vec<u8>) -> u64 {
    match r.get_in(id, buf).expect("keycache Reader::get_in") {
        Some(e) => touch(e.state.byte(), e.public_key),
        None => 0,
    }
}

#[inline]
pub(crate) fn kc_get_many_in(store: &Store, ids: &[MinionId], batch: &mut KeyBatch) -> u64 {
    store.get_many_in(ids, batch).expect("keycache get_many_in");
    batch
        .iter()
        .flatten()
        .map(|e| touch(e.state.byte(), e.public_key))
        .fold(0u64, u64::wrapping_add)
}

#[inline]
pub(crate) fn kc_get_many(store: &Store, ids: &[MinionId]) -> u64 {
    store
        .get_many(ids)
        .expect("keycache get_many")
        .iter()
        .flatten()
        .map(|e| touch(e.state.byte(), &e.public_key))
        .fold(0u64, u64::wrapping_add)
}

pub(crate) type Lmdb = (
    heed::Env,
    heed::Database<heed::types::Str, heed::types::Bytes>,
);

#[inline]
pub(crate) fn lmdb_get(db: &Lmdb, txn: &heed::RoTxn, id: &MinionId) -> u64 {
    match db.1.get(txn, id.as_str()).expect("lmdb get") {
        Some(v) => touch(v[0], &v[1..]),
        None => 0,
    }
}

pub(crate) const KC: &str = "keycache get";
pub(crate) const KC_MANY: &str = "keycache get_many(64)";
pub(crate) const KC_IN: &str = "keycache get_in (reused buffer)";
pub(crate) const KC_MANY_IN: &str = "keycache get_many_in(64) (reused batch)";
pub(crate) const KC_READER: &str = "keycache Reader::get_in (handle per thread)";
pub(crate) const STD: &str = "std HashMap (in memory)";
pub(crate) const HB: &str = "hashbrown HashMap (in memory)";
pub(crate) const HB_CHECKED: &str = "hashbrown + copy-out and xxh3 check (in memory)";
pub(crate) const LMDB_TXN: &str = "LMDB/heed, txn per lookup";
pub(crate) const LMDB_SHARED: &str = "LMDB/heed, one txn per thread";
pub(crate) const SALT: &str = "Salt 3008.5 mmap_key.fetch";

pub(crate) fn salt_driver() -> PathBuf {
    repo().join("crates/keycache-testkit/py/salt_driver.py")
}

pub(crate) fn salt_cmd(cfg: &Cfg, store: &Path, size: u64) -> Command {
    let mut c = Command::new(cfg.python.as_ref().expect("python"));
    c.arg(salt_driver())
        .arg("--dir")
        .arg(store)
        .args(["--size", &size.to_string()]);
    c.stderr(Stdio::inherit());
    c
}

pub(crate) fn run_json(mut c: Command) -> Json {
    let out = c.stdout(Stdio::piped()).output().expect("spawn");
    if !out.status.success() {
        die(&format!(
            "{c:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| die(&format!("{c:?}: bad JSON: {e}")))
}

/// Salt's fetch-bench in `procs` processes at once: lookups per second, all
/// together.
pub(crate) fn salt_fetch(cfg: &Cfg, p: &Prepared, ids: &Path, procs: usize) -> f64 {
    let children: Vec<_> = (0..procs)
        .map(|k| {
            let mut c = salt_cmd(cfg, &p.store, p.size);
            c.args(["fetch-bench", "--ids-file"])
                .arg(ids)
                .args(["--seconds", &cfg.salt_seconds.to_string()])
                .args(["--seed", &(12345 + k).to_string()])
                .stdout(Stdio::piped());
            c.spawn().expect("spawn salt driver")
        })
        .collect();
    let mut total = 0.0;
    for ch in children {
        let out = ch.wait_with_output().unwrap();
        if !out.status.success() {
            die("salt fetch-bench failed");
        }
        let j: Json = serde_json::from_slice(&out.stdout).unwrap();
        total += j["lookups"].as_f64().unwrap() / j["seconds"].as_f64().unwrap();
    }
    total
}
