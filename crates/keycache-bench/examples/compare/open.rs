//! Section `open`: opening a store and the first lookup in a child process
//! (warm and cold), process start-up, resident memory after 10,000 lookups;
//! the child subcommands `open-first` and `rss`; its report table.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use keycache::{MinionId, Store};
use keycache_bench::{entries_of, hashbrown_get, hashbrown_map, open_lmdb, open_options, touch};
use serde_json::json;

use crate::args::{LookupArgs, OpenFirstArgs};
use crate::contenders::{kc_get, lmdb_get, run_json};
use crate::data::{read_ids, Data, Prepared};
use crate::measure::{Cfg, Samples};
use crate::report::Report;
use crate::util::{die, fmt_secs, log, size_label};

/// The head of the report's table of open: heading and table header.
pub(crate) const OPEN_TABLE: &str = "### Opening a store and answering the first lookup (child processes, median)\n\n| store | process start-up (noop) | open + first get, wall | minus start-up | in process: open | in process: first get | cold cache: wall | cold: open | cold: first get |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|";

pub(crate) fn self_exe() -> PathBuf {
    std::env::current_exe().unwrap()
}

pub(crate) fn evict(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            if let Ok(f) = std::fs::File::open(e.path()) {
                let _ = keycache_testkit::sys::evict_from_page_cache(&f);
            }
        }
    }
}

/// Runs `compare open-first` in a child process: its wall time, and the
/// open and first-lookup times it measured itself, under `label`.
pub(crate) fn open_first(s: &mut Samples, p: &Prepared, first: &str, label: &str) {
    let mut c = Command::new(self_exe());
    c.arg("open-first").arg("--store").arg(&p.store).args([
        "--size",
        &p.size.to_string(),
        "--id",
        first,
    ]);
    let t0 = Instant::now();
    let j = run_json(c);
    s.add(label, "wall", t0.elapsed().as_secs_f64());
    s.add(label, "open", j["open_s"].as_f64().unwrap());
    s.add(label, "first", j["first_get_s"].as_f64().unwrap());
}

pub(crate) fn section_open(cfg: &Cfg, data: &Data, p: &Prepared) -> Samples {
    let mut s = Samples::default();
    let first = read_ids(&p.sample_file)[0].clone();
    log(&format!("open + first lookup at {}", size_label(p.n)));
    let runs = 15 * cfg.rounds.max(1);
    for k in 0..runs {
        let t0 = Instant::now();
        let st = Command::new(self_exe()).arg("noop").status().unwrap();
        assert!(st.success());
        s.add(
            "process start-up (noop)",
            "wall",
            t0.elapsed().as_secs_f64(),
        );
        open_first(&mut s, p, first.as_str(), "open + first get (warm)");
        if k % 3 == 0 {
            // Cold: the store's files evicted from the page cache.
            evict(&p.store);
            open_first(&mut s, p, first.as_str(), "open + first get (cold)");
        }
    }
    // Resident memory of reader processes after 10k lookups.
    let mut contenders = vec!["keycache"];
    if cfg.lmdb {
        contenders.push("lmdb");
    }
    if cfg.maps {
        contenders.push("hashbrown");
    }
    for c in contenders {
        let mut cmd = Command::new(self_exe());
        cmd.arg("rss")
            .arg("--store")
            .arg(&p.store)
            .args(["--size", &p.size.to_string(), "--contender", c])
            .arg("--ids")
            .arg(&p.sample_file);
        if c == "lmdb" {
            cmd.arg("--lmdb")
                .arg(data.dir.join(format!("lmdb-{}", p.n)));
        }
        let j = run_json(cmd);
        for k in ["rss_kib", "anon_kib", "file_kib", "base_rss_kib"] {
            s.add(&format!("rss {c}"), k, j[k].as_f64().unwrap());
        }
    }
    s
}

pub(crate) fn cmd_open_first(a: &OpenFirstArgs) {
    let t0 = Instant::now();
    let store = Store::open_with(&a.store.store, &open_options(a.store.size)).unwrap();
    let t1 = Instant::now();
    let id = MinionId::new(a.id.as_str()).unwrap();
    let e = store.get(&id).unwrap().expect("first id present");
    let sum = touch(e.state.byte(), &e.public_key);
    let t2 = Instant::now();
    println!(
        "{}",
        json!({"open_s": (t1 - t0).as_secs_f64(), "first_get_s": (t2 - t1).as_secs_f64(), "sum": sum})
    );
}

pub(crate) fn proc_status_kib(field: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    for l in s.lines() {
        if let Some(v) = l.strip_prefix(field) {
            return v
                .trim_start_matches(':')
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        }
    }
    f64::NAN
}

pub(crate) fn cmd_rss(a: &LookupArgs) {
    let ids = read_ids(&a.ids);
    let base = proc_status_kib("VmRSS");
    let size = a.store.size;
    let store_dir = &a.store.store;
    let mut sum = 0u64;
    let keep: Box<dyn std::any::Any>;
    match a.contender.as_str() {
        "keycache" => {
            let store = Store::open_with(store_dir, &open_options(size)).unwrap();
            for id in ids.iter().take(10_000) {
                sum = sum.wrapping_add(kc_get(&store, id));
            }
            keep = Box::new(store);
        }
        "lmdb" => {
            let db = open_lmdb(a.lmdb());
            for id in ids.iter().take(10_000) {
                let t = db.0.read_txn().unwrap();
                sum = sum.wrapping_add(lmdb_get(&db, &t, id));
            }
            keep = Box::new(db);
        }
        "hashbrown" => {
            // The in-memory contender has to hold every entry.
            let store = Store::open_with(store_dir, &open_options(size)).unwrap();
            let entries = entries_of(&store);
            drop(store);
            let m = hashbrown_map(&entries);
            drop(entries);
            for id in ids.iter().take(10_000) {
                sum = sum.wrapping_add(hashbrown_get(&m, id.as_str()));
            }
            keep = Box::new(m);
        }
        c => die(&format!("unknown contender {c}")),
    }
    let out = json!({
        "rss_kib": proc_status_kib("VmRSS"),
        "anon_kib": proc_status_kib("RssAnon"),
        "file_kib": proc_status_kib("RssFile"),
        "base_rss_kib": base,
        "hwm_kib": proc_status_kib("VmHWM"),
        "sum": sum,
    });
    drop(keep);
    println!("{out}");
}

pub(crate) fn report_open(r: &mut Report, all: &[(u64, Samples)]) {
    for (n, s) in all {
        let noop = s.med("process start-up (noop)", "wall");
        let w = "open + first get (warm)";
        let c = "open + first get (cold)";
        r.line(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            size_label(*n),
            fmt_secs(noop),
            fmt_secs(s.med(w, "wall")),
            fmt_secs(s.med(w, "wall") - noop),
            fmt_secs(s.med(w, "open")),
            fmt_secs(s.med(w, "first")),
            fmt_secs(s.med(c, "wall")),
            fmt_secs(s.med(c, "open")),
            fmt_secs(s.med(c, "first")),
        ));
    }
    r.line("");
    r.line("Cold: the store's files were evicted from the page cache (`posix_fadvise(DONTNEED)`) before the run.");
    r.line("");
    r.line("### Resident memory of a reader process after 10k lookups\n\n| store | reader | VmRSS | of which anonymous | of which file-backed (mapped store) | VmRSS before opening |\n|---|---|---:|---:|---:|---:|");
    for (n, s) in all {
        for c in ["keycache", "lmdb", "hashbrown"] {
            let k = format!("rss {c}");
            if !s.0.contains_key(&k) {
                continue;
            }
            let mib = |f: &str| format!("{:.1} MiB", s.med(&k, f) / 1024.0);
            let name = match c {
                "keycache" => "keycache Store",
                "lmdb" => "LMDB/heed",
                _ => "hashbrown HashMap (holds every entry)",
            };
            r.line(&format!(
                "| {} | {name} | {} | {} | {} | {} |",
                size_label(*n),
                mib("rss_kib"),
                mib("anon_kib"),
                mib("file_kib"),
                mib("base_rss_kib")
            ));
        }
    }
    r.line("");
    if let Some((n, s)) = all.last() {
        let noop = s.med("process start-up (noop)", "wall");
        let w = s.med("open + first get (warm)", "wall");
        r.target(
            &format!(
                "open + first lookup at {}: within 1 ms of process start-up",
                size_label(*n)
            ),
            format!(
                "{} vs {} (+{}; in process {} + {})",
                fmt_secs(w),
                fmt_secs(noop),
                fmt_secs(w - noop),
                fmt_secs(s.med("open + first get (warm)", "open")),
                fmt_secs(s.med("open + first get (warm)", "first"))
            ),
            w - noop <= 1e-3,
        );
    }
}
