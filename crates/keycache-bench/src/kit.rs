//! The data the criterion benches (`benches/*.rs`) and the comparison tool
//! (`examples/compare/`) measure on (feature `kit`, on by default): realistic
//! minion ids and PEM keys, the stores, maps and LMDB environments the
//! contenders look up in. The seeded generator is the test kit's
//! ([`keycache_testkit::rng::Rng`]).
//!
//! Ids look like `web-0012345.dc1.example.com` (the shape of
//! `tools/gen-pki-tree.py`), keys are PEM `BEGIN PUBLIC KEY` blocks of an
//! RSA-2048 SubjectPublicKeyInfo (451 bytes, a minion's `minion.pub`).

use std::collections::HashMap as StdHashMap;
use std::io;
use std::path::Path;

use keycache::{KeyState, MinionId, OpenOptions, Params, Store};

use keycache_testkit::rng::Rng;

const ROLES: &[(&str, u64)] = &[
    ("web", 24),
    ("app", 18),
    ("k8s-node", 20),
    ("db", 7),
    ("cache", 6),
    ("lb", 2),
    ("mon", 2),
    ("ci-runner", 5),
    ("batch", 6),
    ("mq", 3),
    ("search", 3),
    ("storage", 4),
];

/// The id of minion number `n`: `{role}-{n:07}.dc{dc}.example.com`, role
/// and data centre drawn from `n`. Distinct for distinct `n`.
pub fn minion_id(n: u64) -> String {
    let mut r = Rng::new(n ^ 0xA5A5_0000);
    let total: u64 = ROLES.iter().map(|r| r.1).sum();
    let mut pick = r.below(total);
    let mut role = ROLES[0].0;
    for &(name, w) in ROLES {
        if pick < w {
            role = name;
            break;
        }
        pick -= w;
    }
    format!("{role}-{n:07}.dc{}.example.com", 1 + r.below(4))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(B64[(v >> 18) as usize & 63]);
        out.push(B64[(v >> 12) as usize & 63]);
        out.push(if c.len() > 1 {
            B64[(v >> 6) as usize & 63]
        } else {
            b'='
        });
        out.push(if c.len() > 2 {
            B64[v as usize & 63]
        } else {
            b'='
        });
    }
    out
}

/// The PEM public key of minion number `n` (451 bytes): an RSA-2048
/// SubjectPublicKeyInfo with a seeded random modulus.
pub fn pem(n: u64) -> Vec<u8> {
    let mut der = Vec::with_capacity(294);
    der.extend_from_slice(&[
        0x30, 0x82, 0x01, 0x22, 0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01,
        0x01, 0x01, 0x05, 0x00, 0x03, 0x82, 0x01, 0x0f, 0x00, 0x30, 0x82, 0x01, 0x0a, 0x02, 0x82,
        0x01, 0x01, 0x00,
    ]);
    let mut r = Rng::new(n ^ 0x5EED_0000_0000);
    let start = der.len();
    for _ in 0..32 {
        der.extend_from_slice(&r.next().to_le_bytes());
    }
    der[start] |= 0x80;
    der[start + 255] |= 0x01;
    der.extend_from_slice(&[0x02, 0x03, 0x01, 0x00, 0x01]);
    let b = base64(&der);
    let mut out = Vec::with_capacity(451);
    out.extend_from_slice(b"-----BEGIN PUBLIC KEY-----\n");
    for (i, line) in b.chunks(64).enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(line);
    }
    out.extend_from_slice(b"\n-----END PUBLIC KEY-----\n");
    out
}

/// The state of minion number `n`: 90% accepted, 6% pending, 4% rejected.
pub fn state(n: u64) -> KeyState {
    match Rng::new(n ^ 0x57A7E).below(100) {
        0..=89 => KeyState::Accepted,
        90..=95 => KeyState::Pending,
        _ => KeyState::Rejected,
    }
}

/// What every contender does with a found entry: reads every byte of the
/// key and the state. The key is summed as little-endian 8-byte words
/// (`keycache bench` does the same): vector adds, about 70 instructions for
/// a 451-byte key, where a byte-at-a-time sum took 1,100 and measured the
/// caller more than the store.
#[inline]
pub fn touch(state: u8, key: &[u8]) -> u64 {
    u64::from(state).wrapping_add(crate::measure::touch(key))
}

/// A table size that Salt's default layout uses up to 400k minions; past
/// that, keycache's own suggestion (at most half full).
pub fn table_size_for(minions: u64) -> u64 {
    if minions <= 400_000 {
        Params::default().size
    } else {
        keycache::migrate::suggest_size(minions)
    }
}

/// Open options of a store of table size `size`, the rest Salt's defaults.
pub fn open_options(size: u64) -> OpenOptions {
    OpenOptions {
        params: Params {
            size,
            ..Params::default()
        },
        ..OpenOptions::default()
    }
}

/// Builds a store of minions `1..=n` in `dir` (batches of 10k puts, one
/// round of fsyncs each) and returns it.
pub fn build_store(dir: &Path, n: u64, size: u64) -> Store {
    std::fs::create_dir_all(dir).expect("store dir");
    let store = Store::open_with(dir, &open_options(size)).expect("open store");
    let mut i = 1;
    while i <= n {
        let end = (i + 10_000).min(n + 1);
        store
            .batch(|b| {
                for k in i..end {
                    b.put(&MinionId::new(minion_id(k))?, state(k), &pem(k))?;
                }
                Ok(())
            })
            .expect("batch");
        i = end;
    }
    store
}

/// Ids `1..=n` in a random order, and as many absent ids of the same shape
/// (numbers `n+1..=2n`), also shuffled.
pub fn shuffled_ids(n: u64, seed: u64) -> (Vec<MinionId>, Vec<MinionId>) {
    let mut rng = Rng::new(seed);
    let mut hits: Vec<MinionId> = (1..=n)
        .map(|k| MinionId::new(minion_id(k)).unwrap())
        .collect();
    let mut misses: Vec<MinionId> = (n + 1..=2 * n)
        .map(|k| MinionId::new(minion_id(k)).unwrap())
        .collect();
    rng.shuffle(&mut hits);
    rng.shuffle(&mut misses);
    (hits, misses)
}

/// The in-memory contenders' value: state byte and key.
pub type Value = (u8, Vec<u8>);

/// A std `HashMap` of `entries` (id -> state byte and key): the in-memory
/// contender.
pub fn std_map(entries: &[(String, u8, Vec<u8>)]) -> StdHashMap<String, Value> {
    let mut m = StdHashMap::with_capacity(entries.len());
    for (id, s, k) in entries {
        m.insert(id.clone(), (*s, k.clone()));
    }
    m
}

/// A hashbrown `HashMap` of `entries` (id -> state byte and key).
pub fn hashbrown_map(entries: &[(String, u8, Vec<u8>)]) -> hashbrown::HashMap<String, Value> {
    let mut m = hashbrown::HashMap::with_capacity(entries.len());
    for (id, s, k) in entries {
        m.insert(id.clone(), (*s, k.clone()));
    }
    m
}

/// A lookup in [`hashbrown_map`]: the key's bytes summed with its state, 0
/// when the id is absent.
pub fn hashbrown_get(m: &hashbrown::HashMap<String, Value>, id: &str) -> u64 {
    m.get(id).map_or(0, |(s, k)| touch(*s, k))
}

/// The value of the checked in-memory contender: xxh3 of the record's value
/// and the value itself, `[state][key]`, as a keycache bank stores them.
pub type CheckedValue = (u64, Vec<u8>);

/// A hashbrown map holding what a keycache heap record holds, so that a
/// lookup can do the two things a reader of shared memory must add to a
/// hash table's: copy the value out and check its xxh3.
pub fn checked_map(entries: &[(String, u8, Vec<u8>)]) -> hashbrown::HashMap<String, CheckedValue> {
    let mut m = hashbrown::HashMap::with_capacity(entries.len());
    for (id, s, k) in entries {
        let state = KeyState::from_byte(*s).expect("a keys bank state");
        let v = keycache::store::encode_key_value(state, k);
        m.insert(id.clone(), (keycache::format::hash(&v), v));
    }
    m
}

/// A lookup in [`checked_map`]: the value copied into `buf` and its xxh3
/// checked before the key is read, as `Store::get_in` does.
pub fn checked_get(
    m: &hashbrown::HashMap<String, CheckedValue>,
    id: &str,
    buf: &mut Vec<u8>,
) -> u64 {
    let Some((sum, v)) = m.get(id) else {
        return 0;
    };
    buf.clear();
    buf.extend_from_slice(v);
    match buf.split_first() {
        Some((s, k)) if keycache::format::hash(buf) == *sum => touch(*s, k),
        _ => 0,
    }
}

/// Every entry of the store's `keys` bank: (id, state byte, key).
pub fn entries_of(store: &Store) -> Vec<(String, u8, Vec<u8>)> {
    store
        .keys(None)
        .expect("list")
        .map(|r| {
            let (id, e) = r.expect("entry");
            (id, e.state.byte(), e.public_key)
        })
        .collect()
}

/// An LMDB environment (through heed) in `dir` holding `entries`, keyed by
/// id, valued `[state][pem]` like the keys bank; one write transaction.
pub fn build_lmdb(
    dir: &Path,
    entries: &[(String, u8, Vec<u8>)],
) -> (
    heed::Env,
    heed::Database<heed::types::Str, heed::types::Bytes>,
) {
    std::fs::create_dir_all(dir).expect("lmdb dir");
    let (env, db) = open_lmdb(dir);
    let mut sorted: Vec<&(String, u8, Vec<u8>)> = entries.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut wtxn = env.write_txn().expect("write txn");
    db.clear(&mut wtxn).expect("clear");
    let mut v = Vec::new();
    for (id, s, k) in sorted {
        v.clear();
        v.push(*s);
        v.extend_from_slice(k);
        db.put(&mut wtxn, id, &v).expect("lmdb put");
    }
    wtxn.commit().expect("commit");
    (env, db)
}

/// Opens (creating) the LMDB environment in `dir`: 8 GiB map, default
/// (durable) flags, 126 readers.
// heed's `EnvOpenOptions::open` is an `unsafe` API (LMDB's contract on the
// files); the one unsafe call of the benches, for a contender.
#[allow(unsafe_code)]
pub fn open_lmdb(
    dir: &Path,
) -> (
    heed::Env,
    heed::Database<heed::types::Str, heed::types::Bytes>,
) {
    std::fs::create_dir_all(dir).expect("lmdb dir");
    // SAFETY: (heed's contract) the environment is opened once per process
    // and its files are not modified behind its back.
    let env = unsafe {
        heed::EnvOpenOptions::new()
            .map_size(8 << 30)
            .max_dbs(1)
            .open(dir)
            .expect("open lmdb")
    };
    let mut wtxn = env.write_txn().expect("write txn");
    let db = env
        .create_database::<heed::types::Str, heed::types::Bytes>(&mut wtxn, Some("keys"))
        .expect("create db");
    wtxn.commit().expect("commit");
    (env, db)
}

/// Minions in the benchmark stores: `KEYCACHE_BENCH_MINIONS`, 100,000 by
/// default.
pub fn minions() -> u64 {
    std::env::var("KEYCACHE_BENCH_MINIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000)
}

/// The `localfs_key` tree's state directories the benches write and walk, with
/// the state number [`touch`] takes (accepted 1, pending 2, rejected 3).
pub const TREE_STATE_DIRS: [(&str, u8); 3] =
    [("minions", 1), ("minions_pre", 2), ("minions_rejected", 3)];

/// The files of a `localfs_key` tree's state directories, with their state
/// number; an error names the directory or file it could not read.
fn tree_files(
    tree: &Path,
    mut each: impl FnMut(String, u8, &Path) -> io::Result<()>,
) -> io::Result<()> {
    let named = |p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
    for (d, s) in TREE_STATE_DIRS {
        let dir = tree.join(d);
        for e in std::fs::read_dir(&dir).map_err(|e| named(&dir, e))? {
            let e = e.map_err(|e| named(&dir, e))?;
            let path = e.path();
            if !e.file_type().map_err(|e| named(&path, e))?.is_file() {
                continue;
            }
            let name = e.file_name().into_string().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not UTF-8", path.display()),
                )
            })?;
            each(name, s, &path).map_err(|e| named(&path, e))?;
        }
    }
    Ok(())
}

/// Ids with their state from a `localfs_key` tree: one readdir per state directory.
pub fn walk_ids(tree: &Path) -> io::Result<Vec<(String, u8)>> {
    let mut out = Vec::new();
    tree_files(tree, |name, s, _| {
        out.push((name, s));
        Ok(())
    })?;
    Ok(out)
}

/// Ids with their state and key from a `localfs_key` tree: readdir, then read
/// every file.
pub fn walk_keys(tree: &Path) -> io::Result<Vec<(String, u8, Vec<u8>)>> {
    let mut out = Vec::new();
    tree_files(tree, |name, s, path| {
        out.push((name, s, std::fs::read(path)?));
        Ok(())
    })?;
    Ok(out)
}

/// Writes back the file system that holds `dir` (coreutils' `sync -f`:
/// syncfs(2), with no unsafe code outside the library's mapping module):
/// the measurements' floors end with it, and contenders start after it.
pub fn write_back(dir: &Path) -> io::Result<()> {
    if std::process::Command::new("sync")
        .arg("-f")
        .arg(dir)
        .status()?
        .success()
    {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "sync -f {} failed",
            dir.display()
        )))
    }
}
