//! Lookups: keycache's store against an in-memory `HashMap` (std and
//! hashbrown, and hashbrown that also copies the value out and checks its
//! xxh3 as a keycache reader must) and LMDB through heed, all holding the
//! same entries; plus opening a store and answering the first lookup.
//!
//! `cargo bench --bench lookup` builds a store of 100k minions
//! (`KEYCACHE_BENCH_MINIONS=1000000` for 1M) in a temporary directory.
//! Every lookup hands back state and key and the caller sums every byte of
//! the key. The side-by-side comparison with Salt's own Python reader, two
//! threads and several store sizes is `tools/bench.sh compare`.

#![allow(missing_docs)] // criterion_group! makes undocumented public items
mod common;

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use keycache::{MinionId, Store};
use keycache_bench::*;

struct Cycle<'a> {
    ids: &'a [MinionId],
    i: usize,
}

impl<'a> Cycle<'a> {
    fn new(ids: &'a [MinionId]) -> Self {
        Cycle { ids, i: 0 }
    }
    #[inline]
    fn next(&mut self) -> &'a MinionId {
        let id = &self.ids[self.i];
        self.i += 1;
        if self.i == self.ids.len() {
            self.i = 0;
        }
        id
    }
}

fn keycache_get(store: &Store, id: &MinionId) -> u64 {
    match store.get(id).unwrap() {
        Some(e) => touch(e.state.byte(), &e.public_key),
        None => 0,
    }
}

fn bench_lookups(c: &mut Criterion) {
    let n = minions();
    let size = table_size_for(n);
    let tmp = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let store = build_store(&tmp.path().join("store"), n, size);
    let entries = entries_of(&store);
    let (hits, misses) = shuffled_ids(n, 42);
    let std_m = std_map(&entries);
    let hb_m = hashbrown_map(&entries);
    let hbc_m = checked_map(&entries);
    let (env, db) = build_lmdb(&tmp.path().join("lmdb"), &entries);
    drop(entries);
    eprintln!(
        "lookup bench: {n} minions (table size {size}), set up in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // Warm every contender: touch each entry once.
    let mut warm = 0u64;
    for id in &hits {
        warm = warm.wrapping_add(keycache_get(&store, id));
        let rtxn = env.read_txn().unwrap();
        warm = warm.wrapping_add(
            db.get(&rtxn, id.as_str())
                .unwrap()
                .map_or(0, |v| v.len() as u64),
        );
    }
    black_box(warm);

    for (kind, ids) in [("hit", &hits), ("miss", &misses)] {
        let mut g = c.benchmark_group(format!("lookup_{kind}"));
        g.throughput(Throughput::Elements(1));
        let label = |name: &str| BenchmarkId::new(name, n);
        g.bench_function(label("keycache_get"), |b| {
            let mut cy = Cycle::new(ids);
            b.iter(|| keycache_get(&store, cy.next()))
        });
        g.bench_function(label("keycache_get_in"), |b| {
            let (mut cy, mut buf) = (Cycle::new(ids), Vec::new());
            b.iter(|| match store.get_in(cy.next(), &mut buf).unwrap() {
                Some(e) => touch(e.state.byte(), e.public_key),
                None => 0,
            })
        });
        g.bench_function(label("keycache_reader_get_in"), |b| {
            let (mut cy, mut buf, mut r) = (Cycle::new(ids), Vec::new(), store.reader());
            b.iter(|| match r.get_in(cy.next(), &mut buf).unwrap() {
                Some(e) => touch(e.state.byte(), e.public_key),
                None => 0,
            })
        });
        g.bench_function(label("std_hashmap"), |b| {
            let mut cy = Cycle::new(ids);
            b.iter(|| match std_m.get(cy.next().as_str()) {
                Some((s, k)) => touch(*s, k),
                None => 0,
            })
        });
        g.bench_function(label("hashbrown"), |b| {
            let mut cy = Cycle::new(ids);
            b.iter(|| hashbrown_get(&hb_m, cy.next().as_str()))
        });
        g.bench_function(label("hashbrown_checked"), |b| {
            let (mut cy, mut buf) = (Cycle::new(ids), Vec::new());
            b.iter(|| checked_get(&hbc_m, cy.next().as_str(), &mut buf))
        });
        g.bench_function(label("lmdb_heed_txn_per_lookup"), |b| {
            let mut cy = Cycle::new(ids);
            b.iter(|| {
                let rtxn = env.read_txn().unwrap();
                match db.get(&rtxn, cy.next().as_str()).unwrap() {
                    Some(v) => touch(v[0], &v[1..]),
                    None => 0,
                }
            })
        });
        g.bench_function(label("lmdb_heed_shared_txn"), |b| {
            let mut cy = Cycle::new(ids);
            let rtxn = env.read_txn().unwrap();
            b.iter(|| match db.get(&rtxn, cy.next().as_str()).unwrap() {
                Some(v) => touch(v[0], &v[1..]),
                None => 0,
            })
        });
        g.finish();
    }

    // Batched lookups: get_many (and get_many_in) of 64 ids against the same
    // 64 one by one (get, get_in).
    let mut g = c.benchmark_group("lookup_batch64");
    g.throughput(Throughput::Elements(64));
    let batches: Vec<&[MinionId]> = hits.chunks_exact(64).collect();
    g.bench_function(BenchmarkId::new("keycache_get_many", n), |b| {
        let mut next = round_robin(&batches);
        b.iter(|| {
            let batch = next();
            store
                .get_many(batch)
                .unwrap()
                .iter()
                .flatten()
                .map(|e| touch(e.state.byte(), &e.public_key))
                .fold(0u64, u64::wrapping_add)
        })
    });
    g.bench_function(BenchmarkId::new("keycache_get_many_in", n), |b| {
        let mut next = round_robin(&batches);
        let mut kb = keycache::KeyBatch::new();
        b.iter(|| {
            let batch = next();
            store.get_many_in(batch, &mut kb).unwrap();
            kb.iter()
                .flatten()
                .map(|e| touch(e.state.byte(), e.public_key))
                .fold(0u64, u64::wrapping_add)
        })
    });
    g.bench_function(BenchmarkId::new("keycache_get_in_one_by_one", n), |b| {
        let mut next = round_robin(&batches);
        let mut buf = Vec::new();
        b.iter(|| {
            let batch = next();
            batch
                .iter()
                .map(|id| match store.get_in(id, &mut buf).unwrap() {
                    Some(e) => touch(e.state.byte(), e.public_key),
                    None => 0,
                })
                .fold(0u64, u64::wrapping_add)
        })
    });
    g.bench_function(BenchmarkId::new("keycache_get_one_by_one", n), |b| {
        let mut next = round_robin(&batches);
        b.iter(|| {
            let batch = next();
            batch
                .iter()
                .map(|id| keycache_get(&store, id))
                .fold(0u64, u64::wrapping_add)
        })
    });
    g.finish();

    // Two reader threads sharing one handle: throughput of both together.
    let mut g = c.benchmark_group("lookup_hit_2_threads");
    g.throughput(Throughput::Elements(2));
    g.bench_function(BenchmarkId::new("keycache_get", n), |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for t in 0..2usize {
                    let (store, hits) = (&store, &hits);
                    s.spawn(move || {
                        let mut i = t * hits.len() / 2;
                        let mut sum = 0u64;
                        for _ in 0..iters {
                            sum = sum.wrapping_add(keycache_get(store, &hits[i]));
                            i += 1;
                            if i == hits.len() {
                                i = 0;
                            }
                        }
                        black_box(sum);
                    });
                }
            });
            t0.elapsed()
        })
    });
    g.finish();

    // Opening the store and answering one lookup (files in the page cache).
    let mut g = c.benchmark_group("open");
    let path = tmp.path().join("store");
    let opts = open_options(size);
    let first = hits[0].clone();
    g.bench_function(BenchmarkId::new("keycache_open_and_first_get", n), |b| {
        b.iter(|| {
            let s = Store::open_with(&path, &opts).unwrap();
            keycache_get(&s, &first)
        })
    });
    g.finish();
}

/// The items one after the other, round and round: the next at each call.
fn round_robin<T: Copy>(items: &[T]) -> impl FnMut() -> T + '_ {
    let mut i = 0;
    move || {
        let item = items[i % items.len()];
        i += 1;
        item
    }
}

criterion_group! { name = benches; config = common::criterion(30, 500, 2); targets = bench_lookups }
criterion_main!(benches);
