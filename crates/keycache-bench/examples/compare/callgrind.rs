//! Section `callgrind`: instructions and allocations per lookup, counted by
//! callgrind in the child subcommand `callgrind-loop`; its report table.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use keycache::{KeyBatch, MinionId, Store};
use keycache_bench::{
    checked_get, checked_map, entries_of, hashbrown_get, hashbrown_map, open_lmdb, open_options,
    std_map, touch,
};
use serde_json::json;

use crate::args::CallgrindArgs;
use crate::contenders::{
    kc_get, kc_get_in, kc_get_many, kc_get_many_in, kc_reader_get_in, lmdb_get,
};
use crate::data::{read_ids, Data, Prepared};
use crate::measure::{Cfg, Samples};
use crate::open::self_exe;
use crate::report::Report;
use crate::util::{die, log, size_label};

#[inline(never)]
pub(crate) fn callgrind_measured(f: &mut dyn FnMut(usize) -> u64, n: usize) -> u64 {
    let mut sum = 0u64;
    for i in 0..n {
        sum = sum.wrapping_add(f(i));
    }
    sum
}

pub(crate) fn cmd_callgrind_loop(a: &CallgrindArgs) {
    let lookups = a.lookups;
    let a = &a.lookup;
    let store = Store::open_with(&a.store.store, &open_options(a.store.size)).unwrap();
    let ids = read_ids(&a.ids);
    let n = ids.len();
    let sum = match a.contender.as_str() {
        "keycache" => callgrind_measured(&mut |i| kc_get(&store, &ids[i % n]), lookups),
        "keycache_many" => {
            let batches: Vec<&[MinionId]> = ids.chunks_exact(64).collect();
            callgrind_measured(
                &mut |i| kc_get_many(&store, batches[i % batches.len()]),
                lookups / 64,
            )
        }
        "keycache_in" => {
            let mut buf = Vec::new();
            callgrind_measured(&mut |i| kc_get_in(&store, &ids[i % n], &mut buf), lookups)
        }
        "keycache_reader" => {
            let (mut r, mut buf) = (store.reader(), Vec::new());
            callgrind_measured(
                &mut |i| kc_reader_get_in(&mut r, &ids[i % n], &mut buf),
                lookups,
            )
        }
        "keycache_many_in" => {
            let batches: Vec<&[MinionId]> = ids.chunks_exact(64).collect();
            let mut batch = KeyBatch::new();
            callgrind_measured(
                &mut |i| kc_get_many_in(&store, batches[i % batches.len()], &mut batch),
                lookups / 64,
            )
        }
        "hashbrown_checked" => {
            let m = checked_map(&entries_of(&store));
            let mut buf = Vec::new();
            callgrind_measured(
                &mut |i| checked_get(&m, ids[i % n].as_str(), &mut buf),
                lookups,
            )
        }
        "hashbrown" | "std" => {
            let entries = entries_of(&store);
            if a.contender == "std" {
                let m = std_map(&entries);
                callgrind_measured(
                    &mut |i| m.get(ids[i % n].as_str()).map_or(0, |(s, k)| touch(*s, k)),
                    lookups,
                )
            } else {
                let m = hashbrown_map(&entries);
                callgrind_measured(&mut |i| hashbrown_get(&m, ids[i % n].as_str()), lookups)
            }
        }
        "lmdb" => {
            let db = open_lmdb(a.lmdb());
            callgrind_measured(
                &mut |i| {
                    let t = db.0.read_txn().unwrap();
                    lmdb_get(&db, &t, &ids[i % n])
                },
                lookups,
            )
        }
        c => die(&format!("unknown contender {c}")),
    };
    println!("{}", json!({"sum": sum}));
}

/// Parses a callgrind output file: total instructions collected, and the
/// number of calls to malloc/realloc/calloc and free.
pub(crate) fn parse_callgrind(path: &Path) -> (f64, f64, f64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut total = f64::NAN;
    let (mut allocs, mut frees) = (0.0, 0.0);
    let mut callee = String::new();
    for line in text.lines() {
        if let Some(t) = line
            .strip_prefix("totals:")
            .or_else(|| line.strip_prefix("summary:"))
        {
            total = t.split_whitespace().next().unwrap().parse().unwrap();
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            // "(id) name" defines, "(id)" refers.
            let (id, name) = match rest.split_once(' ') {
                Some((id, name)) => {
                    names.insert(id.to_string(), name.to_string());
                    (id.to_string(), name.to_string())
                }
                None => (
                    rest.to_string(),
                    names.get(rest).cloned().unwrap_or_default(),
                ),
            };
            let _ = id;
            callee = name;
        } else if let Some(rest) = line.strip_prefix("fn=") {
            if let Some((id, name)) = rest.split_once(' ') {
                names.insert(id.to_string(), name.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("calls=") {
            let c: f64 = rest.split_whitespace().next().unwrap().parse().unwrap();
            match callee.as_str() {
                "malloc" | "realloc" | "calloc" => allocs += c,
                "free" => frees += c,
                _ => {}
            }
        }
    }
    (total, allocs, frees)
}

pub(crate) fn section_callgrind(data: &Data, p: &Prepared, cfg: &Cfg, all: bool) -> Samples {
    let mut s = Samples::default();
    if Command::new("valgrind").arg("--version").output().is_err() {
        log("valgrind not installed: callgrind section skipped");
        return s;
    }
    let mut contenders = vec![
        "keycache",
        "keycache_many",
        "keycache_in",
        "keycache_reader",
        "keycache_many_in",
    ];
    if all && cfg.maps {
        contenders.extend(["hashbrown", "hashbrown_checked", "std"]);
    }
    if all && cfg.lmdb {
        contenders.push("lmdb");
    }
    // Two runs per contender, of L1 and L2 lookups: the differences of the
    // instruction and allocation counts, divided by L2 - L1, are per lookup
    // (set-up and tear-down cancel out).
    const L1: usize = 64 * 200;
    const L2: usize = 64 * 600;
    for (kind, ids) in [("hit", &p.hits_file), ("miss", &p.misses_file)] {
        for c in &contenders {
            if kind == "miss" && c.starts_with("keycache_many") {
                continue;
            }
            log(&format!("  callgrind: {c} {kind} at {}", size_label(p.n)));
            let mut counts = Vec::new();
            for lookups in [L1, L2] {
                let out = data
                    .dir
                    .join(format!("callgrind-{c}-{}-{kind}-{lookups}.out", p.n));
                let mut cmd = Command::new("valgrind");
                cmd.args(["--tool=callgrind", "--toggle-collect=*callgrind_measured*"])
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(self_exe())
                    .arg("callgrind-loop")
                    .arg("--store")
                    .arg(&p.store)
                    .args(["--size", &p.size.to_string(), "--contender", c])
                    .arg("--ids")
                    .arg(ids)
                    .args(["--lookups", &lookups.to_string()])
                    .stderr(Stdio::null())
                    .stdout(Stdio::null());
                if *c == "lmdb" {
                    cmd.arg("--lmdb")
                        .arg(data.dir.join(format!("lmdb-{}", p.n)));
                }
                if !cmd.status().unwrap().success() {
                    log(&format!("  callgrind run of {c} failed"));
                    break;
                }
                counts.push(parse_callgrind(&out));
            }
            if counts.len() != 2 {
                continue;
            }
            let per = (L2 - L1) as f64;
            s.add(c, &format!("ir/{kind}"), (counts[1].0 - counts[0].0) / per);
            s.add(
                c,
                &format!("allocs/{kind}"),
                (counts[1].1 - counts[0].1) / per,
            );
        }
    }
    s
}

pub(crate) fn report_callgrind(r: &mut Report, all: &[(u64, Samples)]) {
    if all.iter().all(|(_, s)| s.0.is_empty()) {
        return;
    }
    r.line(
        "### Instructions per lookup (valgrind --tool=callgrind, only the lookup loop collected)",
    );
    r.line("");
    r.line("Per lookup: the difference between runs of 12,800 and 38,400 lookups, divided by 25,600. The counts include the caller's sum over the 451-byte key (8-byte words: about 70 instructions).");
    r.line("");
    r.line(
        "| store | contender | Ir per hit | Ir per miss | heap allocations per hit | per miss |",
    );
    r.line("|---|---|---:|---:|---:|---:|");
    for (n, s) in all {
        for (c, name) in [
            ("keycache", "keycache get"),
            ("keycache_many", "keycache get_many(64), per id"),
            ("keycache_in", "keycache get_in (reused buffer)"),
            (
                "keycache_reader",
                "keycache Reader::get_in (handle per thread)",
            ),
            (
                "keycache_many_in",
                "keycache get_many_in(64) (reused batch), per id",
            ),
            ("hashbrown", "hashbrown HashMap"),
            ("hashbrown_checked", "hashbrown + copy-out and xxh3 check"),
            ("std", "std HashMap"),
            ("lmdb", "LMDB/heed, txn per lookup"),
        ] {
            if !s.0.contains_key(c) {
                continue;
            }
            let f = |k: &str, d: usize| {
                let v = s.med(c, k);
                if v.is_finite() {
                    format!("{v:.d$}")
                } else {
                    "—".into()
                }
            };
            r.line(&format!(
                "| {} | {name} | {} | {} | {} | {} |",
                size_label(*n),
                f("ir/hit", 0),
                f("ir/miss", 0),
                f("allocs/hit", 2),
                f("allocs/miss", 2),
            ));
        }
    }
    r.line("");
}
