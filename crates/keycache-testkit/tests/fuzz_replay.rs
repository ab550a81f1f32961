//! Replays the fuzz corpus and every crash kept as a regression input
//! (`fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`) through the fuzz
//! target bodies in `keycache_testkit::fuzzing`, on stable Rust, so that nothing fixed
//! comes back. Also a few inputs written out here, so the bodies run even
//! with an empty corpus.
//!
//! `cargo test --test fuzz_replay -- --ignored generate_seed_corpus` writes
//! the seed corpora (real stores made by the library and by Salt, random
//! operation programs, random trees) into `fuzz/corpus/`.

use keycache_testkit::common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use keycache_testkit::fuzzing;
use keycache_testkit::rng::Rng;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 5] = [
    ("store_bytes", fuzzing::store_bytes),
    ("ops_model", fuzzing::ops_model),
    ("migrate_tree", fuzzing::migrate_tree),
    ("snapshot_merge", fuzzing::snapshot_merge),
    ("master_config", fuzzing::master_config),
];

/// The saved inputs of `target`: its corpus, which must be there and not
/// empty (a replay of nothing would pass without checking anything), and
/// its regression inputs, if any.
fn inputs(target: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["corpus", "regressions"] {
        let d = common::repo().join("fuzz").join(sub).join(target);
        let files: Vec<PathBuf> = match std::fs::read_dir(&d) {
            Ok(rd) => rd.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect(),
            Err(e) if sub == "corpus" => panic!(
                "{target}: no corpus to replay at {} ({e}); \
                 `cargo test -p keycache-testkit --test fuzz_replay -- --ignored generate_seed_corpus` \
                 writes the seeds",
                d.display()
            ),
            Err(_) => Vec::new(),
        };
        assert!(
            sub != "corpus" || !files.is_empty(),
            "{target}: the corpus {} is empty: nothing would be replayed",
            d.display()
        );
        out.extend(files);
    }
    out.sort();
    out
}

fn replay(target: &str, f: Target) {
    let files = inputs(target);
    let start = Instant::now();
    let mut replayed = 0usize;
    for p in &files {
        // (A fuzzer running meanwhile may have replaced it.)
        let Ok(data) = std::fs::read(p) else { continue };
        replayed += 1;
        let r = std::panic::catch_unwind(|| f(&data));
        if r.is_err() {
            panic!(
                "{target}: {} fails; reproduce with `cargo +nightly fuzz run {target} {}`",
                p.display(),
                p.display()
            );
        }
    }
    assert!(replayed > 0, "{target}: no saved input could be read");
    // Deterministic extra inputs.
    let mut rng = Rng::new(0x5eed ^ target.len() as u64);
    for n in 0..64 {
        let len = (rng.below(400) + n) as usize;
        f(&rng.bytes(len));
    }
    eprintln!(
        "{target}: {replayed} saved inputs + 64 generated in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

/// One replay test per fuzz target, named after it: `replay_<target>` for
/// `TARGETS[i]`.
macro_rules! replay_tests {
    ($($name:ident: $i:expr),* $(,)?) => {$(
        #[test]
        fn $name() {
            replay(TARGETS[$i].0, TARGETS[$i].1);
        }
    )*};
}

replay_tests! {
    replay_store_bytes: 0,
    replay_ops_model: 1,
    replay_migrate_tree: 2,
    replay_snapshot_merge: 3,
    replay_master_config: 4,
}

/// Stores written by the library with random operations, in the layouts
/// `store_params` selects, encoded as `store_bytes` inputs.
fn library_store_seeds(out: &Path) -> usize {
    use keycache::{KeyState, MinionId, OpenOptions, Store};
    let mut n = 0;
    let mut rng = Rng::new(0xfeed_beef);
    for (b0, b1) in [
        (6u8, 0x10u8), // size 31, id 4, seg 200
        (5, 0x08),     // size 17, id 4, seg 48
        (6 | 8, 0x18), // size 31, id 8, seg 1 MiB
        (7 | 16, 0x10),
        (3 | 8, 0x00),
        (7 | 24, 0x18), // size 64, id 64
        (2 | 16, 0x08),
        (1 | 8, 0x10), // size 3: full table
    ] {
        for round in 0..4 {
            let p = fuzzing::store_params(b0, b1);
            let t = tempfile::tempdir().unwrap();
            let s = Store::open_with(
                t.path(),
                &OpenOptions {
                    params: p,
                    refresh: std::time::Duration::ZERO,
                    ownership: None,
                    ..OpenOptions::default()
                },
            )
            .unwrap();
            let ids: Vec<String> = (0..p.capacity().min(24))
                .map(|i| format!("m{i}").chars().take(p.id_size).collect())
                .collect();
            for _ in 0..(8 + round * 10) {
                let id = MinionId::new(rng.pick(&ids).clone()).unwrap();
                let pem = common::pem(&format!("{id}{}", rng.next()), rng.below(40) as usize);
                let _ = match rng.below(6) {
                    0 | 1 => s.put(&id, KeyState::ALL[rng.below(3) as usize], pem.as_bytes()),
                    2 => s.deny(&id, pem.as_bytes()),
                    3 => s.remove(&id).map(|_| ()),
                    4 => s
                        .set_state(&id, KeyState::ALL[rng.below(3) as usize])
                        .map(|_| ()),
                    _ => s.remove_denied(&id).map(|_| ()),
                };
            }
            if round == 3 {
                s.compact(None).unwrap();
            }
            let bytes = fuzzing::encode_store(t.path(), b0, b1);
            std::fs::write(out.join(format!("lib-{b0:02x}{b1:02x}-{round}")), bytes).unwrap();
            n += 1;
        }
    }
    n
}

/// A store written by the real Salt (in-place rewrites and all).
fn salt_store_seed(out: &Path) -> usize {
    let p = fuzzing::store_params(6 | 8, 0x18); // size 31, id 8, slot 29
    let t = tempfile::tempdir().unwrap();
    let mut ops = Vec::new();
    for i in 0..12 {
        let state = ["accepted", "pending", "rejected"][i % 3];
        ops.push(
            serde_json::json!({"op": "store", "bank": "keys", "id": format!("s{i}"),
            "state": state, "pub": common::pem(&format!("s{i}"), 30 + i)}),
        );
    }
    for i in 0..4 {
        ops.push(
            serde_json::json!({"op": "store", "bank": "keys", "id": format!("s{i}"),
            "state": "accepted", "pub": common::pem(&format!("r{i}"), 10)}),
        );
        ops.push(serde_json::json!({"op": "flush", "bank": "keys", "id": format!("s{}", i + 5)}));
        ops.push(
            serde_json::json!({"op": "store", "bank": "denied_keys", "id": format!("s{i}"),
            "pub": common::pem(&format!("d{i}"), 20)}),
        );
    }
    common::salt(
        t.path(),
        &p,
        &["apply"],
        Some(&serde_json::Value::Array(ops)),
    );
    std::fs::write(
        out.join("salt-0e18"),
        fuzzing::encode_store(t.path(), 6 | 8, 0x18),
    )
    .unwrap();
    1
}

/// Snapshots of real stores (keys in every state, denied keys, tombstones,
/// a cluster key), and the same bytes with one field changed.
fn snapshot_seeds(dir: &Path) -> usize {
    use keycache::{KeyState, MinionId, Store};
    use keycache_merge::snapshot::{self, SnapshotOptions};
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path()).unwrap();
    let pem =
        |t: &str| format!("-----BEGIN PUBLIC KEY-----\nMIIB{t}AQAB\n-----END PUBLIC KEY-----\n");
    let id = |s: &str| MinionId::new(s).unwrap();
    let mut n = 0;
    let mut write = |b: &[u8]| {
        std::fs::write(dir.join(format!("seed-{n:02}")), b).unwrap();
        n += 1;
    };
    let o = SnapshotOptions::default();
    write(&snapshot::take(&s, &o).unwrap().to_bytes().unwrap());
    s.put(&id("a"), KeyState::Accepted, pem("x").as_bytes())
        .unwrap();
    s.put(&id("b"), KeyState::Pending, pem("b").as_bytes())
        .unwrap();
    s.put(&id("c"), KeyState::Rejected, pem("c").as_bytes())
        .unwrap();
    s.put(&id("new"), KeyState::Accepted, pem("n").as_bytes())
        .unwrap();
    s.deny(&id("a"), pem("a3").as_bytes()).unwrap();
    write(&snapshot::take(&s, &o).unwrap().to_bytes().unwrap());
    s.remove(&id("b")).unwrap();
    s.remove_denied(&id("a")).unwrap();
    std::fs::write(d.path().join("master.pub"), pem("m")).unwrap();
    let last = snapshot::take(&s, &o).unwrap().to_bytes().unwrap();
    write(&last);
    // The same bytes with the version, a kind, a length changed.
    for (at, v) in [(8usize, 1u8), (65, 9), (68, 0xff)] {
        let mut b = last.clone();
        b[at] = v;
        write(&b);
    }
    n
}

#[test]
#[ignore = "writes the seed corpora into fuzz/corpus/"]
fn generate_seed_corpus() {
    let root = common::repo().join("fuzz/corpus");
    let sb = root.join("store_bytes");
    std::fs::create_dir_all(&sb).unwrap();
    let n = library_store_seeds(&sb) + salt_store_seed(&sb);
    eprintln!("store_bytes: {n} seeds");
    let sm = root.join("snapshot_merge");
    std::fs::create_dir_all(&sm).unwrap();
    eprintln!("snapshot_merge: {} seeds", snapshot_seeds(&sm));
    let mut rng = Rng::new(0xabcdef);
    for (target, count, len) in [("ops_model", 16, 200u64), ("migrate_tree", 16, 160)] {
        let d = root.join(target);
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..count {
            let l = 20 + rng.below(len) as usize;
            let mut data: Vec<u8> = (0..l).map(|_| rng.next() as u8).collect();
            if target == "migrate_tree" {
                // Mostly present directories, a fair number of entries.
                data[1] &= 0x0f & (rng.next() as u8);
                data[2] = 8 + (i as u8);
            }
            std::fs::write(d.join(format!("seed-{i:02}")), data).unwrap();
        }
    }
}
