//! Section `write`: single puts and batches of 1,000 into a 100k store,
//! keycache against LMDB; its report table.

use std::time::Instant;

use keycache::MinionId;
use keycache_bench::{build_lmdb, build_store, entries_of, minion_id, pem, state, table_size_for};

use crate::contenders::Lmdb;
use crate::data::Data;
use crate::measure::{Cfg, Samples};
use crate::report::Report;
use crate::util::{fmt_rate, fmt_secs, log};

/// The head of the report's table of write: heading and table header.
pub(crate) const WRITE_TABLE: &str = "### Writes into a store of 100k minions (median)\n\n| contender | single durable put | puts/s | batch of 1000, one fsync round | per key in a batch | keys/s in batches |\n|---|---:|---:|---:|---:|---:|";

pub(crate) const W_KC: &str = "keycache";
pub(crate) const W_LMDB: &str = "LMDB/heed";

pub(crate) fn section_write(cfg: &Cfg, data: &Data) -> Samples {
    let mut s = Samples::default();
    const BASE: u64 = 100_000;
    const SINGLE: usize = 40;
    const BATCH: u64 = 1000;
    let dir = data.dir.join("write-scratch");
    let _ = std::fs::remove_dir_all(&dir);
    log("writes: building scratch store and LMDB environment of 100k minions");
    let store = build_store(&dir.join("store"), BASE, table_size_for(BASE));
    let lmdb: Option<Lmdb> = cfg
        .lmdb
        .then(|| build_lmdb(&dir.join("lmdb"), &entries_of(&store)));
    let pems: Vec<Vec<u8>> = (0..64).map(pem).collect();
    let mut next = 10_000_000u64;
    for round in 0..cfg.rounds {
        for _ in 0..SINGLE {
            next += 1;
            let id = MinionId::new(minion_id(next)).unwrap();
            let t0 = Instant::now();
            store
                .put(&id, state(next), &pems[(next % 64) as usize])
                .unwrap();
            s.add(W_KC, "put", t0.elapsed().as_secs_f64());
            if let Some(db) = &lmdb {
                next += 1;
                let id = minion_id(next);
                let t0 = Instant::now();
                let mut v = vec![state(next).byte()];
                v.extend_from_slice(&pems[(next % 64) as usize]);
                let mut w = db.0.write_txn().unwrap();
                db.1.put(&mut w, &id, &v).unwrap();
                w.commit().unwrap();
                s.add(W_LMDB, "put", t0.elapsed().as_secs_f64());
            }
        }
        for _ in 0..3 {
            let ids: Vec<(MinionId, u64)> = (0..BATCH)
                .map(|_| {
                    next += 1;
                    (MinionId::new(minion_id(next)).unwrap(), next)
                })
                .collect();
            let t0 = Instant::now();
            store
                .batch(|b| {
                    for (id, k) in &ids {
                        b.put(id, state(*k), &pems[(k % 64) as usize])?;
                    }
                    Ok(())
                })
                .unwrap();
            s.add(W_KC, "batch", t0.elapsed().as_secs_f64());
            if let Some(db) = &lmdb {
                let ids: Vec<(String, u64)> = (0..BATCH)
                    .map(|_| {
                        next += 1;
                        (minion_id(next), next)
                    })
                    .collect();
                let t0 = Instant::now();
                let mut w = db.0.write_txn().unwrap();
                let mut v = Vec::new();
                for (id, k) in &ids {
                    v.clear();
                    v.push(state(*k).byte());
                    v.extend_from_slice(&pems[(k % 64) as usize]);
                    db.1.put(&mut w, id, &v).unwrap();
                }
                w.commit().unwrap();
                s.add(W_LMDB, "batch", t0.elapsed().as_secs_f64());
            }
        }
        log(&format!(
            "  writes round {}/{}: keycache put {} batch({BATCH}) {}",
            round + 1,
            cfg.rounds,
            fmt_secs(s.med(W_KC, "put")),
            fmt_secs(s.med(W_KC, "batch"))
        ));
    }
    drop(store);
    drop(lmdb);
    let _ = std::fs::remove_dir_all(&dir);
    s
}

pub(crate) fn report_write(r: &mut Report, s: &Samples) {
    for c in s.present([W_KC, W_LMDB]) {
        let (p, b) = (s.med(c, "put"), s.med(c, "batch"));
        let name = if c == W_LMDB {
            "LMDB/heed (txn commit per put / per batch)"
        } else {
            "keycache put / batch"
        };
        r.line(&format!(
            "| {name} | {} | {} | {} | {} | {} |",
            fmt_secs(p),
            fmt_rate(1.0 / p),
            fmt_secs(b),
            fmt_secs(b / 1000.0),
            fmt_rate(1000.0 / b)
        ));
    }
    r.line("");
}
