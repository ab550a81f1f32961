//! Concurrency: lock-free readers beside a writer of the same process
//! (puts, state changes, removes, denies, batches, compactions), readers
//! that never wait for a writer holding the banks' locks, and readers beside
//! a Salt-style in-place rewrite of a record from another file handle, and
//! wipes of a bank beside writers.
//!
//! One module per part: [`beside_a_writer`] (a), [`never_wait`] (b),
//! [`salt_rewrite`] (c), [`wipe`] (d: a bank's wipe beside writers); the helpers they share (options, seeds, values that
//! name their writer, the record of what was written) are here.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use keycache::store::encode_key_value;
use keycache::{KeyState, MinionId};
use keycache_testkit::common::refreshed_every as opts;
use keycache_testkit::rng::Rng;

mod beside_a_writer;
mod never_wait;
mod salt_rewrite;
mod wipe;

/// A random key state.
fn random_state(rng: &mut Rng) -> KeyState {
    *rng.pick(&KeyState::ALL)
}

fn seed() -> u64 {
    std::env::var("KEYCACHE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// A PEM-like value that names its id and version, `len` bytes long (at
/// least the header and footer).
fn value(id: &str, tag: &str, v: u64, len: usize) -> Vec<u8> {
    let head = format!("-----BEGIN PUBLIC KEY-----\nid={id}, {tag}={v}\n");
    let foot = "\n-----END PUBLIC KEY-----\n";
    let mut s = head.into_bytes();
    let pad = len.saturating_sub(s.len() + foot.len());
    s.extend((0..pad).map(|i| {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[(i + v as usize) % 64]
    }));
    s.extend_from_slice(foot.as_bytes());
    s
}

/// The id a value names, from its `id=...,` line.
fn named_id(v: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(v).ok()?;
    let rest = s.split_once("\nid=")?.1;
    Some(rest.split_once(',')?.0)
}

type Written = Mutex<HashMap<String, HashSet<Vec<u8>>>>;

fn record(w: &Written, id: &MinionId, v: Vec<u8>) {
    w.lock()
        .unwrap()
        .entry(id.as_str().to_owned())
        .or_default()
        .insert(v);
}

fn was_written(w: &Written, id: &MinionId, v: &[u8]) -> bool {
    w.lock()
        .unwrap()
        .get(id.as_str())
        .is_some_and(|set| set.contains(v))
}

/// What readers found wrong.
#[derive(Default)]
struct Problems(Mutex<Vec<String>>);

impl Problems {
    fn add(&self, s: String) {
        let mut v = self.0.lock().unwrap();
        if v.len() < 20 {
            v.push(s);
        }
    }

    fn assert_none(&self) {
        let v = self.0.lock().unwrap();
        assert!(v.is_empty(), "{} problem(s):\n{}", v.len(), v.join("\n"));
    }
}

/// Checks a keys-bank entry read for `id`.
fn check_key(w: &Written, p: &Problems, what: &str, id: &MinionId, e: &keycache::KeyEntry) {
    let v = encode_key_value(e.state, &e.public_key);
    if named_id(&e.public_key) != Some(id.as_str()) {
        p.add(format!(
            "{what}({id}): another id's value or a mixture: {:?}",
            String::from_utf8_lossy(&e.public_key)
        ));
    } else if !was_written(w, id, &v) {
        p.add(format!(
            "{what}({id}): a value never written: {} {:?}",
            e.state,
            String::from_utf8_lossy(&e.public_key)
        ));
    }
}

/// A denied lookup's answer: [`check_denied`] when found, a problem (named
/// by `what`) when the lookup failed.
fn check_denied_read(
    w: &Written,
    p: &Problems,
    id: &MinionId,
    got: keycache::Result<Option<Vec<u8>>>,
    what: impl FnOnce() -> String,
) {
    match got {
        Ok(Some(v)) => check_denied(w, p, id, &v),
        Ok(None) => {}
        Err(e) => p.add(format!("{}: {e}", what())),
    }
}

fn check_denied(w: &Written, p: &Problems, id: &MinionId, v: &[u8]) {
    if named_id(v) != Some(id.as_str()) {
        p.add(format!(
            "denied({id}): another id's value or a mixture: {:?}",
            String::from_utf8_lossy(v)
        ));
    } else if !was_written(w, id, v) {
        p.add(format!(
            "denied({id}): a value never written: {:?}",
            String::from_utf8_lossy(v)
        ));
    }
}
