//! Writes: single durable puts (each fsynced before it returns) and batches
//! of 100 puts made durable by one round of fsyncs, keycache against LMDB
//! through heed (a write transaction per put, or per batch; default, durable
//! flags). Both start from 10k minions, Salt's default table size.
//!
//! `cargo bench --bench write`. Numbers depend on the disk's fsync latency.

#![allow(missing_docs)] // criterion_group! makes undocumented public items
mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use keycache::MinionId;
use keycache_bench::*;

const BASE: u64 = 10_000;
const BATCH: u64 = 100;

fn bench_writes(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let store = build_store(&tmp.path().join("store"), BASE, table_size_for(BASE));
    let entries = entries_of(&store);
    let (env, db) = build_lmdb(&tmp.path().join("lmdb"), &entries);
    drop(entries);
    let pems: Vec<Vec<u8>> = (0..64).map(pem).collect();

    let mut g = c.benchmark_group("put_durable");
    g.throughput(Throughput::Elements(1));
    let mut next = 1_000_000u64;
    g.bench_function(BenchmarkId::new("keycache_put", BASE), |b| {
        b.iter(|| {
            next += 1;
            let id = MinionId::new(minion_id(next)).unwrap();
            store
                .put(&id, state(next), &pems[(next % 64) as usize])
                .unwrap()
        })
    });
    g.bench_function(BenchmarkId::new("lmdb_heed_txn_per_put", BASE), |b| {
        b.iter(|| {
            next += 1;
            let id = minion_id(next);
            let mut v = vec![state(next).byte()];
            v.extend_from_slice(&pems[(next % 64) as usize]);
            let mut w = env.write_txn().unwrap();
            db.put(&mut w, &id, &v).unwrap();
            w.commit().unwrap()
        })
    });
    g.finish();

    let mut g = c.benchmark_group("put_batch100_one_fsync");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function(BenchmarkId::new("keycache_batch", BASE), |b| {
        b.iter(|| {
            store
                .batch(|bt| {
                    for _ in 0..BATCH {
                        next += 1;
                        let id = MinionId::new(minion_id(next))?;
                        bt.put(&id, state(next), &pems[(next % 64) as usize])?;
                    }
                    Ok(())
                })
                .unwrap()
        })
    });
    g.bench_function(BenchmarkId::new("lmdb_heed_one_txn", BASE), |b| {
        b.iter(|| {
            let mut w = env.write_txn().unwrap();
            let mut v = Vec::new();
            for _ in 0..BATCH {
                next += 1;
                v.clear();
                v.push(state(next).byte());
                v.extend_from_slice(&pems[(next % 64) as usize]);
                db.put(&mut w, &minion_id(next), &v).unwrap();
            }
            w.commit().unwrap()
        })
    });
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(10, 300, 3); targets = bench_writes }
criterion_main!(benches);
