//! Section `list`: listing every id (and every key) of a store, against a
//! walk of the `localfs_key` tree and Salt's `list_all`; its report table.

use std::hint::black_box;
use std::time::Instant;

use keycache::{KeyState, Store};
use keycache_bench::{open_options, touch, walk_ids, walk_keys};

use crate::contenders::{run_json, salt_cmd};
use crate::data::Prepared;
use crate::measure::{Cfg, Samples};
use crate::report::Report;
use crate::util::{fmt_ratio, fmt_secs, log, size_label};

pub(crate) const L_KC: &str = "keycache Store::keys";
pub(crate) const L_TREE: &str = "localfs_key tree walk (Rust, 1 thread)";
pub(crate) const L_SALT: &str = "Salt 3008.5 mmap_key.list_all";

/// The head of the report's table of list: heading and table header.
pub(crate) const LIST_TABLE: &str = "### Listing the whole `keys` bank (median seconds)\n\n| store | contender | ids with state | ids with keys | it ÷ keycache (state) | it ÷ keycache (keys) |\n|---|---|---:|---:|---:|---:|";

pub(crate) fn section_list(cfg: &Cfg, p: &Prepared) -> Samples {
    let mut s = Samples::default();
    let store = Store::open_with(&p.store, &open_options(p.size)).unwrap();
    log(&format!("listing at {}", size_label(p.n)));
    let count = store.keys(None).unwrap().count();
    for round in 0..cfg.rounds {
        let t0 = Instant::now();
        let v: Vec<(String, KeyState)> = store
            .keys(None)
            .unwrap()
            .map(|r| {
                let (id, e) = r.unwrap();
                (id, e.state)
            })
            .collect();
        s.add(L_KC, "ids", t0.elapsed().as_secs_f64());
        assert_eq!(v.len(), count);
        drop(black_box(v));
        let t0 = Instant::now();
        let v: Vec<(String, keycache::KeyEntry)> =
            store.keys(None).unwrap().map(|r| r.unwrap()).collect();
        let sum = v.iter().fold(0u64, |a, (_, e)| {
            a.wrapping_add(touch(e.state.byte(), &e.public_key))
        });
        s.add(L_KC, "keys", t0.elapsed().as_secs_f64());
        black_box(sum);
        drop(v);
        let t0 = Instant::now();
        let v = walk_ids(&p.tree).expect("the tree the comparison made");
        s.add(L_TREE, "ids", t0.elapsed().as_secs_f64());
        assert_eq!(v.len(), count);
        drop(black_box(v));
        let t0 = Instant::now();
        let v = walk_keys(&p.tree).expect("the tree the comparison made");
        let sum = v
            .iter()
            .fold(0u64, |a, (_, st, k)| a.wrapping_add(touch(*st, k)));
        s.add(L_TREE, "keys", t0.elapsed().as_secs_f64());
        black_box(sum);
        drop(v);
        if cfg.salt {
            let mut c = salt_cmd(cfg, &p.store, p.size);
            c.args(["list-bench", "--repeat", "1"]);
            let j = run_json(c);
            assert_eq!(j["count"].as_u64().unwrap() as usize, count);
            s.add(L_SALT, "ids", j["median_seconds"].as_f64().unwrap());
            s.add(
                L_SALT,
                "keys",
                j["median_seconds_with_data"].as_f64().unwrap(),
            );
        }
        log(&format!(
            "  round {}/{}: keycache ids {} keys {}",
            round + 1,
            cfg.rounds,
            fmt_secs(s.0[L_KC]["ids"][round]),
            fmt_secs(s.0[L_KC]["keys"][round])
        ));
    }
    s
}

pub(crate) fn report_list(r: &mut Report, all: &[(u64, Samples)]) {
    for (n, s) in all {
        let (ki, kk) = (s.med(L_KC, "ids"), s.med(L_KC, "keys"));
        for c in s.present([L_KC, L_TREE, L_SALT]) {
            let (i, k) = (s.med(c, "ids"), s.med(c, "keys"));
            let (ri, rk) = if c == L_KC {
                ("—".into(), "—".into())
            } else {
                (fmt_ratio(i / ki), fmt_ratio(k / kk))
            };
            r.line(&format!(
                "| {} | {c} | {} | {} | {ri} | {rk} |",
                size_label(*n),
                fmt_secs(i),
                fmt_secs(k)
            ));
        }
    }
    r.line("");
}
