//! The model test's checks after quiescence, and its summary.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use keycache_testkit::etcd::Cluster;
use serde_json::Value;

use super::master::Master;
use super::model::{self, Kind, Model, Outcome, Rec, St, B, STATES};
use super::{World, PREFIX};
use crate::common::kc;
use crate::common::tree_files;

/// `keycache verify` is clean, key tree included, but for what a kill of a
/// replicator this test killed may leave (docs/reliability.md): the
/// temporaries of tree writes it interrupted, and header counters or
/// roster entries out of step with the slots (a kill between the index
/// and the roster; the crash tests accept the same,
/// `keycache_testkit::crash::legit_after_crash`); once `verify --repair`
/// mends those, verify exits 0.
pub fn verify_clean(m: &Master) -> Option<String> {
    let verify = |repair: bool| {
        let mut c = kc();
        c.args(["verify", "-c", m.c(), "--tree", "always", "--json"]);
        if repair {
            c.arg("--repair");
        }
        c.output_json()
    };
    let (out, v) = verify(false);
    if out.status.code() == Some(0) {
        return None;
    }
    let killed = m.repl.lock().expect("lock").killed.clone();
    let header = [
        keycache::format::HDR_OCCUPIED,
        keycache::format::HDR_DELETED,
        keycache::format::HDR_HWM,
    ];
    let crash_residue = |f: &serde_json::Value| {
        f["repairable"] == true
            && (f["file"].as_str().is_some_and(|p| p.ends_with(".roster"))
                || (f["slot"].is_null()
                    && f["offset"]
                        .as_u64()
                        .is_some_and(|o| header.iter().any(|h| *h as u64 == o))))
    };
    let ok = (v["clean"] == true
        || (!killed.is_empty()
            && v["findings"]
                .as_array()
                .is_some_and(|fs| fs.iter().all(|f| crash_residue(&f["finding"])))))
        && v["tree"]["disagreements"].as_array().is_some_and(|ds| {
            ds.iter().all(|d| {
                d["problem"] == "temp_file"
                    && d["path"]
                        .as_str()
                        .and_then(|p| p.rsplit('/').next())
                        .and_then(|n| n.strip_prefix(".keycache-tree."))
                        .and_then(|n| n.split('.').next())
                        .and_then(|pid| pid.parse::<u32>().ok())
                        .is_some_and(|pid| killed.contains(&pid))
            })
        });
    if !ok {
        return Some(format!(
            "master {}: verify: {v}\n{}\n(killed replicators: {killed:?})",
            m.idx,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!(
        "etcd_model: master {}: what killed replicators left: {} {}",
        m.idx, v["findings"], v["tree"]["disagreements"]
    );
    let (out, v) = verify(true);
    if out.status.code() != Some(0) {
        return Some(format!("master {}: verify --repair: {v}", m.idx));
    }
    let (out, v) = verify(false);
    (out.status.code() != Some(0))
        .then(|| format!("master {}: verify after the repair: {v}", m.idx))
}

/// Per phase: how many operations ended how, and the failures' reasons.
pub fn summary(recs: &[Rec]) {
    let mut phases: Vec<&str> = Vec::new();
    for r in recs {
        if !phases.contains(&r.phase) {
            phases.push(r.phase);
        }
    }
    for p in phases {
        let of: Vec<&Rec> = recs.iter().filter(|r| r.phase == p).collect();
        let count = |f: &dyn Fn(&Outcome) -> bool| of.iter().filter(|r| f(&r.outcome)).count();
        eprintln!(
            "etcd_model: {p}: {} operations: {} done, {} committed (replica late), {} refused, {} not written, {} unknown",
            of.len(),
            count(&|o| matches!(o, Outcome::Done { .. })),
            count(&|o| matches!(o, Outcome::Committed { .. })),
            count(&|o| matches!(o, Outcome::Refused)),
            count(&|o| matches!(o, Outcome::NotWritten)),
            count(&|o| matches!(o, Outcome::Unknown)),
        );
        let mut whys: std::collections::BTreeMap<String, usize> = Default::default();
        for r in of
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Unknown | Outcome::NotWritten))
        {
            *whys.entry(reason(&r.why)).or_default() += 1;
        }
        for (why, n) in whys {
            eprintln!("etcd_model:   {n} x {why}");
        }
    }
}

/// The gist of a failure: its last line, without the endpoints.
fn reason(why: &str) -> String {
    let last = why.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    let gist = match last.split_once("): ") {
        Some((_, rest)) => rest,
        None => last,
    };
    gist.chars().take(200).collect()
}

pub fn ids_in(listing: &Value, state: &str) -> BTreeSet<String> {
    listing[state]
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| i.as_str().expect("id").to_owned())
        .collect()
}

/// The key tree's files (`dir/id`) that a store whose listing is
/// `listing` keeps in step with its banks (the whole tree).
pub fn tree_of(listing: &Value) -> BTreeSet<String> {
    let local = model::listing_state(listing);
    STATES
        .iter()
        .flat_map(|&(dir, _, st)| {
            local
                .iter()
                .filter(move |(_, &s)| s == st)
                .map(move |((_, id), _)| format!("{dir}/{id}"))
        })
        .collect()
}

/// Every replica equals etcd (`etcd diff`, and the listings against
/// etcdctl's), `verify` is clean with the tree, the tree equals the store,
/// and the model explains etcd and every replica; every problem found is
/// reported at once.
pub fn final_checks(w: &World, c: &Cluster) {
    let out = c
        .etcdctl(&["get", PREFIX, "--prefix", "-w", "json"])
        .expect("etcdctl get");
    let (etcd, revision) = model::etcd_state(&out, PREFIX);
    let recs = w.recs.lock().expect("lock").clone();
    let m = Model::new(&recs, &w.universe);
    let mut bad = m.check_etcd(&etcd);
    bad.extend(m.check_history());
    let etcd_states: BTreeMap<(B, String), St> =
        etcd.iter().map(|(k, (st, _))| (k.clone(), *st)).collect();
    for master in &w.masters {
        let i = master.idx;
        let (out, d) = kc()
            .args(["etcd", "diff", "-c", master.c(), "--json"])
            .output_json();
        if out.status.code() != Some(0) || d["same"] != true {
            bad.push(format!("master {i}: etcd diff: {d}"));
        }
        let listing = master.list();
        let local = model::listing_state(&listing);
        for (key, side) in differences(&local, &etcd_states) {
            bad.push(format!(
                "master {i}'s replica (revision {}) against etcd (revision {revision}): {}/{} {side}",
                master.revision(),
                key.0.name(),
                key.1
            ));
        }
        bad.extend(verify_clean(master));
        let tree = tree_of(&listing);
        let files = tree_files(&master.pki);
        for f in files.symmetric_difference(&tree) {
            bad.push(format!(
                "master {i}'s key tree against its store: {f} only in the {}",
                if files.contains(f) { "tree" } else { "store" }
            ));
        }
        for b in m.check_accepted(&ids_in(&listing, "minions"), revision) {
            bad.push(format!("master {i}: {b}"));
        }
    }
    if !bad.is_empty() {
        let logs: Vec<String> = w
            .masters
            .iter()
            .map(|m| {
                format!(
                    "master {}'s replicator said:\n{}",
                    m.idx,
                    tail(&m.log(), 15)
                )
            })
            .collect();
        ensure!(
            false,
            "{} problems:\n{}\n{}",
            bad.len(),
            bad.join("\n"),
            logs.join("\n")
        );
    }
    // The run did what it is for: every kind done, through the CLI (or
    // the etcd writer) and through Salt's driver.
    let kinds = [
        (Kind::SignIn, false),
        (Kind::Deny, false),
        (Kind::Accept, false),
        (Kind::Reject, false),
        (Kind::Delete, false),
        (Kind::SignIn, true),
        (Kind::Deny, true),
        (Kind::Accept, true),
        (Kind::Reject, true),
        (Kind::FlushKeys, true),
        (Kind::FlushDenied, true),
    ];
    for (kind, driver) in kinds {
        ensure!(
            recs.iter().any(|r| r.kind == kind
                && r.driver == driver
                && matches!(&r.outcome, Outcome::Done { ids, .. } if !ids.is_empty())),
            "no {kind:?} was done{}",
            if driver { " through the driver" } else { "" }
        );
    }
    ensure!(
        w.kills.load(Ordering::Relaxed) > 0,
        "no replicator was killed"
    );
}

/// The keys on which two key states differ, and how.
fn differences(
    local: &BTreeMap<(B, String), St>,
    etcd: &BTreeMap<(B, String), St>,
) -> Vec<((B, String), String)> {
    let keys: BTreeSet<&(B, String)> = local.keys().chain(etcd.keys()).collect();
    keys.into_iter()
        .filter_map(|k| match (local.get(k), etcd.get(k)) {
            (Some(a), Some(b)) if a == b => None,
            (a, b) => Some((k.clone(), format!("replica {a:?}, etcd {b:?}"))),
        })
        .collect()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
