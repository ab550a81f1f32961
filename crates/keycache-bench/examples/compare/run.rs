//! `compare run`: prepares the data, runs the sections asked for and writes
//! the report.

use std::fmt::Write as _;
use std::time::Instant;

use keycache_bench::table_size_for;
use serde_json::{json, Value as Json};

use crate::args::RunArgs;
use crate::callgrind::{report_callgrind, section_callgrind};
use crate::data::Data;
use crate::list::{report_list, section_list, LIST_TABLE};
use crate::lookup::{report_lookup, section_lookup, LOOKUP_TABLE};
use crate::measure::{Cfg, Samples};
use crate::migrate::{report_migrate, section_migrate, MIGRATE_TABLE};
use crate::open::{report_open, section_open, OPEN_TABLE};
use crate::report::{machine, Report};
use crate::scaling::{report_scaling, section_scaling};
use crate::util::{die, repo, size_label};
use crate::write::{report_write, section_write, WRITE_TABLE};

pub(crate) fn cmd_run(a: &RunArgs) {
    let sizes = a.sizes.clone();
    let migrate_sizes = a.migrate_sizes.clone();
    let only = &a.only;
    let contenders = &a.contenders;
    let python = a.python.clone();
    let want_salt = contenders.iter().any(|c| c == "salt");
    if want_salt && python.is_none() {
        die("Salt comparisons need --python (the venv python of tools/setup-venv.sh); or --contenders lmdb,maps");
    }
    let cfg = Cfg {
        rounds: a.rounds,
        seconds: a.seconds,
        salt_seconds: a.salt_seconds,
        python,
        salt: want_salt,
        lmdb: contenders.iter().any(|c| c == "lmdb"),
        maps: contenders.iter().any(|c| c == "maps"),
    };
    let data = Data {
        dir: a
            .data
            .clone()
            .unwrap_or_else(|| repo().join("target/bench-data")),
        keycache: a
            .keycache
            .clone()
            .unwrap_or_else(|| repo().join("target/release/keycache")),
        rust: a.generate == "rust",
    };
    std::fs::create_dir_all(&data.dir).unwrap();
    let has = |s: &str| only.iter().any(|o| o == s);
    if data.rust && (has("list") || has("migrate")) {
        die("--generate rust makes no trees: leave out the list and migrate sections (--only)");
    }
    if (!data.rust || has("migrate")) && !data.keycache.exists() {
        die(&format!(
            "{} missing: cargo build --release --bin keycache",
            data.keycache.display()
        ));
    }
    let salt_max = a.salt_migrate_max;
    let started = Instant::now();
    let m0 = machine();
    let mut lookups = Vec::new();
    let mut lists = Vec::new();
    let mut opens = Vec::new();
    let mut grinds = Vec::new();
    let mut scalings = Vec::new();
    let threads = &a.threads.0;
    for &n in &sizes {
        let p = data.prepare(n);
        if has("scaling") {
            scalings.push((n, section_scaling(&cfg, &data, &p, threads, a.writer_rate)));
        }
        if has("lookup") {
            lookups.push((n, section_lookup(&cfg, &data, &p)));
        }
        if has("list") {
            lists.push((n, section_list(&cfg, &p)));
        }
        if has("open") {
            opens.push((n, section_open(&cfg, &data, &p)));
        }
        if has("callgrind") && (n == 100_000 || n == *sizes.last().unwrap()) {
            grinds.push((
                n,
                section_callgrind(&data, &p, &cfg, n == 100_000 || sizes.len() == 1),
            ));
        }
    }
    let mut migrates = Vec::new();
    if has("migrate") {
        let mut per_key = None;
        let mut ms = migrate_sizes.clone();
        ms.sort_unstable();
        for n in ms {
            migrates.push((n, section_migrate(&cfg, &data, n, salt_max, &mut per_key)));
        }
    }
    let writes = if has("write") {
        section_write(&cfg, &data)
    } else {
        Samples::default()
    };
    let m1 = machine();

    let mut r = Report {
        out: String::new(),
        json: serde_json::Map::new(),
        targets: Vec::new(),
    };
    let cmdline: Vec<String> = std::env::args().collect();
    r.line(&format!(
        "## keycache performance comparison\n\nMachine: {}, {} cores, {} RAM, Linux {}. Load average before: {}; after: {}.",
        m0["cpu"].as_str().unwrap_or("?"),
        m0["cores"],
        m0["memory"].as_str().unwrap_or("?"),
        m0["kernel"].as_str().unwrap_or("?"),
        m0["loadavg"].as_str().unwrap_or("?"),
        m1["loadavg"].as_str().unwrap_or("?"),
    ));
    r.line(&format!(
        "Command: `{}`; {} rounds, {} s per Rust measurement, {} s per Salt measurement; run took {:.0} s.\n",
        cmdline.join(" "),
        cfg.rounds,
        cfg.seconds,
        cfg.salt_seconds,
        started.elapsed().as_secs_f64()
    ));
    let table_sizes: Vec<String> = sizes
        .iter()
        .map(|&n| {
            format!(
                "{} minions: mmap_key_size {}",
                size_label(n),
                table_size_for(n)
            )
        })
        .collect();
    if data.rust {
        r.line(&format!(
            "Stores: puts of {} from this tool (`keycache_bench::build_store`: ids `role-NNNNNNN.dcN.example.com`, 90% accepted, 6% pending, 4% rejected; 451-byte PEM keys); {}. Absent ids have the same shape. Every lookup hands back state and key and the caller sums every byte of the key.\n",
            if sizes.len() == 1 { "the minions" } else { "every store's minions" },
            table_sizes.join(", ")
        ));
    } else {
        r.line(&format!(
        "Stores: `keycache migrate` of `tools/gen-pki-tree.py` trees (90% accepted, 5% pending, 3% rejected, 2% denied; 451-byte PEM keys); {}. Existing ids are the `keys` bank's, absent ids have the same shape. Every lookup hands back state and key and the caller sums every byte of the key.\n",
        table_sizes.join(", ")
    ));
    }
    r.section(!lookups.is_empty(), LOOKUP_TABLE, |r| {
        report_lookup(r, &lookups, &cfg)
    });
    r.section(!lists.is_empty(), LIST_TABLE, |r| report_list(r, &lists));
    r.section(!migrates.is_empty(), MIGRATE_TABLE, |r| {
        report_migrate(r, &migrates)
    });
    r.section(!opens.is_empty(), OPEN_TABLE, |r| report_open(r, &opens));
    r.section(!writes.0.is_empty(), WRITE_TABLE, |r| {
        report_write(r, &writes)
    });
    if !scalings.is_empty() {
        report_scaling(&mut r, &scalings, threads, a.writer_rate);
    }
    report_callgrind(&mut r, &grinds);
    if !r.targets.is_empty() {
        r.line("### Targets");
        r.line("");
        r.line("| target | measured | met |");
        r.line("|---|---|---|");
        let t = std::mem::take(&mut r.targets);
        for (what, fig, met) in &t {
            r.line(&format!(
                "| {what} | {fig} | {} |",
                if *met { "yes" } else { "**no**" }
            ));
        }
        r.line("");
        r.targets = t;
    }
    print!("{}", r.out);

    let to_json = |v: &[(u64, Samples)]| -> Json {
        Json::Object(
            v.iter()
                .map(|(n, s)| (n.to_string(), s.to_json()))
                .collect(),
        )
    };
    r.json.insert("machine_before".into(), m0);
    r.json.insert("machine_after".into(), m1);
    r.json.insert("command".into(), json!(cmdline));
    r.json.insert("rounds".into(), json!(cfg.rounds));
    r.json.insert("lookup".into(), to_json(&lookups));
    r.json.insert("list".into(), to_json(&lists));
    r.json.insert("migrate".into(), to_json(&migrates));
    r.json.insert("open".into(), to_json(&opens));
    r.json.insert("callgrind".into(), to_json(&grinds));
    r.json.insert("write".into(), writes.to_json());
    r.json.insert("scaling".into(), to_json(&scalings));
    r.json.insert("threads".into(), json!(threads));
    r.json.insert("writer_rate".into(), json!(a.writer_rate));
    r.json.insert(
        "targets".into(),
        json!(r
            .targets
            .iter()
            .map(|(w, f, m)| json!({"target": w, "measured": f, "met": m}))
            .collect::<Vec<_>>()),
    );
    r.json.insert("markdown".into(), json!(r.out));
    let json_path = a
        .json
        .clone()
        .unwrap_or_else(|| data.dir.join("results.json"));
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&Json::Object(r.json)).unwrap(),
    )
    .unwrap();
    let mut tail = String::new();
    let _ = write!(tail, "results: {}", json_path.display());
    eprintln!("{tail}");
}
