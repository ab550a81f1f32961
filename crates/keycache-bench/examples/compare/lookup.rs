//! Section `lookup`: lookups per second of every contender, hits and misses,
//! 1 and 2 threads; its report table.

use std::hint::black_box;

use keycache::{KeyBatch, MinionId, Store};
use keycache_bench::{
    checked_get, checked_map, entries_of, hashbrown_get, hashbrown_map, open_lmdb, open_options,
    std_map, touch,
};

use crate::contenders::{
    kc_get, kc_get_in, kc_get_many, kc_get_many_in, kc_reader_get_in, lmdb_get, salt_fetch, Lmdb,
    HB, HB_CHECKED, KC, KC_IN, KC_MANY, KC_MANY_IN, KC_READER, LMDB_SHARED, LMDB_TXN, SALT, STD,
};
use crate::data::{read_ids, Data, Prepared};
use crate::measure::{measure, Cfg, Samples};
use crate::report::Report;
use crate::util::{fmt_rate, fmt_ratio, log, size_label};

/// The head of the report's table of lookup: heading and table header.
pub(crate) const LOOKUP_TABLE: &str = "### Lookups (lookups per second, all threads together; median of the rounds)\n\n| store | contender | hit, 1 thread | hit, 2 threads | miss, 1 thread | miss, 2 threads | keycache get ÷ it (hit, 1t) | 2t ÷ 1t (hit) |\n|---|---|---:|---:|---:|---:|---:|---:|";

pub(crate) fn section_lookup(cfg: &Cfg, data: &Data, p: &Prepared) -> Samples {
    let mut s = Samples::default();
    let store = Store::open_with(&p.store, &open_options(p.size)).unwrap();
    let hits = read_ids(&p.hits_file);
    let misses = read_ids(&p.misses_file);
    let batches: Vec<&[MinionId]> = hits.chunks_exact(64).collect();
    let need_entries = cfg.maps || cfg.lmdb;
    let entries = if need_entries {
        entries_of(&store)
    } else {
        Vec::new()
    };
    let std_m = cfg.maps.then(|| std_map(&entries));
    let hb_m = cfg.maps.then(|| hashbrown_map(&entries));
    let hbc_m = cfg.maps.then(|| checked_map(&entries));
    let lmdb: Option<Lmdb> = cfg.lmdb.then(|| open_lmdb(&data.lmdb(p, &entries)));
    drop(entries);
    // Warm-up: every entry once, through keycache and LMDB (page cache and
    // page tables), then one pass of every kind.
    let mut warm = 0u64;
    for id in &hits {
        warm = warm.wrapping_add(kc_get(&store, id));
    }
    if let Some(db) = &lmdb {
        let t = db.0.read_txn().unwrap();
        for id in &hits {
            warm = warm.wrapping_add(lmdb_get(db, &t, id));
        }
    }
    // The checked contender hands back what plain hashbrown does (every
    // checksum holds), so it measures the checks and not an early return.
    if let (Some(h), Some(c)) = (&hb_m, &hbc_m) {
        let mut buf = Vec::new();
        for id in &hits {
            let plain = hashbrown_get(h, id.as_str());
            assert_eq!(checked_get(c, id.as_str(), &mut buf), plain, "{id}");
            warm = warm.wrapping_add(plain);
        }
    }
    black_box(warm);
    let (nh, nm, nb) = (hits.len(), misses.len(), batches.len());
    log(&format!(
        "lookups at {}: {} keys, {} absent ids",
        size_label(p.n),
        nh,
        nm
    ));
    let sec = cfg.seconds;
    for round in 0..cfg.rounds {
        for threads in [1usize, 2] {
            let k = |kind: &str| format!("{kind}/{threads}t");
            for (kind, ids, n) in [("hit", &hits, nh), ("miss", &misses, nm)] {
                let r = measure(threads, sec, n, 1, || |i| kc_get(&store, &ids[i]));
                s.add(KC, &k(kind), r);
                if kind == "hit" {
                    let r = measure(threads, sec, nb, 64, || |i| kc_get_many(&store, batches[i]));
                    s.add(KC_MANY, &k(kind), r);
                }
                let r = measure(threads, sec, n, 1, || {
                    let (store, mut buf) = (&store, Vec::new());
                    move |i| kc_get_in(store, &ids[i], &mut buf)
                });
                s.add(KC_IN, &k(kind), r);
                let r = measure(threads, sec, n, 1, || {
                    let (mut reader, mut buf) = (store.reader(), Vec::new());
                    move |i| kc_reader_get_in(&mut reader, &ids[i], &mut buf)
                });
                s.add(KC_READER, &k(kind), r);
                if kind == "hit" {
                    let r = measure(threads, sec, nb, 64, || {
                        let (store, batches, mut batch) = (&store, &batches, KeyBatch::new());
                        move |i| kc_get_many_in(store, batches[i], &mut batch)
                    });
                    s.add(KC_MANY_IN, &k(kind), r);
                }
                if let (Some(m), Some(h)) = (&std_m, &hb_m) {
                    let r = measure(threads, sec, n, 1, || {
                        |i| match m.get(ids[i].as_str()) {
                            Some((st, key)) => touch(*st, key),
                            None => 0,
                        }
                    });
                    s.add(STD, &k(kind), r);
                    let r = measure(threads, sec, n, 1, || |i| hashbrown_get(h, ids[i].as_str()));
                    s.add(HB, &k(kind), r);
                }
                if let Some(m) = &hbc_m {
                    let r = measure(threads, sec, n, 1, || {
                        let mut buf = Vec::new();
                        move |i| checked_get(m, ids[i].as_str(), &mut buf)
                    });
                    s.add(HB_CHECKED, &k(kind), r);
                }
                if let Some(db) = &lmdb {
                    let r = measure(threads, sec, n, 1, || {
                        |i| {
                            let t = db.0.read_txn().unwrap();
                            lmdb_get(db, &t, &ids[i])
                        }
                    });
                    s.add(LMDB_TXN, &k(kind), r);
                    let r = measure(threads, sec, n, 1, || {
                        let t = db.0.read_txn().unwrap();
                        move |i| lmdb_get(db, &t, &ids[i])
                    });
                    s.add(LMDB_SHARED, &k(kind), r);
                }
                if cfg.salt {
                    let f = if kind == "hit" {
                        &p.hits_file
                    } else {
                        &p.misses_file
                    };
                    s.add(SALT, &k(kind), salt_fetch(cfg, p, f, threads));
                }
            }
        }
        log(&format!(
            "  round {}/{}: keycache hit {} (1t), {} (2t), get_many {}",
            round + 1,
            cfg.rounds,
            fmt_rate(s.0[KC]["hit/1t"][round]),
            fmt_rate(s.0[KC]["hit/2t"][round]),
            fmt_rate(s.0[KC_MANY]["hit/1t"][round]),
        ));
    }
    s
}

pub(crate) fn report_lookup(r: &mut Report, all: &[(u64, Samples)], cfg: &Cfg) {
    let order = [
        KC,
        KC_MANY,
        KC_IN,
        KC_READER,
        KC_MANY_IN,
        STD,
        HB,
        HB_CHECKED,
        LMDB_TXN,
        LMDB_SHARED,
        SALT,
    ];
    for (n, s) in all {
        let kc = s.med(KC, "hit/1t");
        for c in s.present(order) {
            let h1 = s.med(c, "hit/1t");
            let h2 = s.med(c, "hit/2t");
            let ratio = if c == KC {
                "—".to_string()
            } else {
                fmt_ratio(kc / h1)
            };
            r.line(&format!(
                "| {} | {c} | {} | {} | {} | {} | {ratio} | {} |",
                size_label(*n),
                fmt_rate(h1),
                fmt_rate(h2),
                fmt_rate(s.med(c, "miss/1t")),
                fmt_rate(s.med(c, "miss/2t")),
                fmt_ratio(h2 / h1),
            ));
        }
    }
    r.line("");
    if cfg.salt {
        r.line("Salt's \"2 threads\" are two processes (the GIL serialises threads), each running its own `fetch-bench`.");
        r.line("");
    }
    // Targets at the largest size.
    let (n, s) = all.last().unwrap();
    let at = size_label(*n);
    let kc = s.med(KC, "hit/1t");
    if s.0.contains_key(HB_CHECKED) && s.0.contains_key(KC_READER) {
        let (c, hb) = (s.med(HB_CHECKED, "hit/1t"), s.med(HB, "hit/1t"));
        r.line(&format!(
            "At {at}, a hashbrown hit that also copies the value out and checks its xxh3 (what a reader of memory other processes write must add) runs at {} against hashbrown's {} ({}); keycache `get` is {} of it, `Reader::get_in` {}.",
            fmt_rate(c),
            fmt_rate(hb),
            fmt_ratio(c / hb),
            fmt_ratio(kc / c),
            fmt_ratio(s.med(KC_READER, "hit/1t") / c),
        ));
        r.line("");
    }
    // Each target is met when the first rate is at least the factor times the second.
    let hit = |c: &str| s.med(c, "hit/1t");
    let mut targets: Vec<(String, f64, f64, f64)> = Vec::new();
    if s.0.contains_key(HB) {
        let what = format!("lookup hit at {at}: no slower than hashbrown in memory");
        targets.push((what, kc, 1.0, hit(HB)));
    }
    if s.0.contains_key(LMDB_TXN) {
        let (txn, shared) = (hit(LMDB_TXN), hit(LMDB_SHARED));
        let what = format!("lookup hit at {at}: >= 2x LMDB/heed (txn per lookup)");
        targets.push((what, kc, 2.0, txn));
        let what = format!("lookup hit at {at}: >= 2x LMDB/heed (one long read txn per thread)");
        targets.push((what, kc, 2.0, shared));
        if s.0.contains_key(KC_READER) {
            targets.push((format!("lookup hit at {at}, long-lived read handles on both sides: Reader::get_in >= 2x LMDB/heed one txn per thread"), hit(KC_READER), 2.0, shared));
        }
    }
    if s.0.contains_key(SALT) {
        let what = format!("lookup hit at {at}: >= 200x Salt's Python fetch");
        targets.push((what, kc, 200.0, hit(SALT)));
    }
    let what = format!("get_many at {at}: >= 2x the same lookups one by one");
    targets.push((what, hit(KC_MANY), 2.0, kc));
    let what = format!("get_many_in at {at}: >= 2x the same lookups one by one (get_in)");
    targets.push((what, hit(KC_MANY_IN), 2.0, hit(KC_IN)));
    let what = format!("two reader threads at {at}: >= 1.8x one");
    targets.push((what, s.med(KC, "hit/2t"), 1.8, kc));
    for (what, a, factor, b) in targets {
        r.at_least(&what, fmt_rate, a, factor, b);
    }
}
