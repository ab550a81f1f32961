//! Listing a whole bank: ids with their state, and ids with their keys,
//! from keycache's store against walking the equivalent `localfs_key` tree
//! (a directory per state, a file per minion).
//!
//! `cargo bench --bench list`: 100k minions (`KEYCACHE_BENCH_MINIONS` to
//! change), store and tree in a temporary directory. Salt's own
//! `mmap_key.list_all` is in `tools/bench.sh compare`.

#![allow(missing_docs)] // criterion_group! makes undocumented public items
mod common;

use std::path::Path;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use keycache::{KeyState, Store};
use keycache_bench::*;

fn write_tree(dir: &Path, n: u64) {
    for (d, _) in TREE_STATE_DIRS {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    for k in 1..=n {
        let d = match state(k) {
            KeyState::Accepted => "minions",
            KeyState::Pending => "minions_pre",
            KeyState::Rejected => "minions_rejected",
        };
        std::fs::write(dir.join(d).join(minion_id(k)), pem(k)).unwrap();
    }
}

fn bench_list(c: &mut Criterion) {
    let n = minions();
    let tmp = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let store: Store = build_store(&tmp.path().join("store"), n, table_size_for(n));
    let tree = tmp.path().join("tree");
    write_tree(&tree, n);
    eprintln!(
        "list bench: {n} minions, set up in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let mut g = c.benchmark_group("list");
    g.throughput(Throughput::Elements(n));
    g.bench_function(BenchmarkId::new("keycache_ids_with_state", n), |b| {
        b.iter(|| {
            store
                .keys(None)
                .unwrap()
                .map(|r| {
                    let (id, e) = r.unwrap();
                    (id, e.state)
                })
                .collect::<Vec<_>>()
        })
    });
    g.bench_function(BenchmarkId::new("keycache_ids_with_keys", n), |b| {
        b.iter(|| {
            store
                .keys(None)
                .unwrap()
                .map(|r| r.unwrap())
                .collect::<Vec<_>>()
        })
    });
    g.bench_function(BenchmarkId::new("localfs_tree_ids_with_state", n), |b| {
        b.iter(|| walk_ids(&tree).expect("the tree the bench made"))
    });
    g.bench_function(BenchmarkId::new("localfs_tree_ids_with_keys", n), |b| {
        b.iter(|| walk_keys(&tree).expect("the tree the bench made"))
    });
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(10, 500, 3); targets = bench_list }
criterion_main!(benches);
