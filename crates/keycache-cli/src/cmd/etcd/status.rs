//! `keycache etcd status`: this master's replica against etcd
//! (`keycache_etcd::status::status`).

use std::path::Path;
use std::process::ExitCode;

use anstyle::AnsiColor;
use keycache_etcd::status;

use crate::output::{esc, esc_path, exit, fmt_time, outln, paint, print_json, CmdResult};

/// Runs `keycache etcd status`: exit code 1 when the replica is stale or
/// etcd cannot be reached.
pub(crate) fn run(a: super::Plain) -> CmdResult {
    let settings = super::required(&a.layout, "etcd status")?;
    let store = a.layout.open(Path::new(""))?;
    let report = status::status_report(&settings, &store)?;
    let ok = report.ok();
    if a.json.json {
        print_json(&report);
        return Ok(exit(ok));
    }
    let st = &report.status;
    outln!("store:            {}", esc_path(store.dir()));
    outln!("prefix:           {}", esc(&st.prefix));
    outln!(
        "replica revision: {}",
        match st.replica_revision {
            0 => "none (never listed etcd: is keycache replicate running?)".to_owned(),
            r => r.to_string(),
        }
    );
    match (&st.etcd_error, st.etcd_revision) {
        (Some(e), _) => outln!(
            "etcd:             {}",
            paint(
                &format!("cannot be reached: {}", esc(e)),
                AnsiColor::Red.on_default()
            )
        ),
        (None, Some(r)) => {
            outln!("etcd revision:    {r}");
            outln!("keys in etcd:     {}", st.etcd_keys.unwrap_or(0));
            outln!(
                "lag:              {} revisions",
                st.revision_lag.unwrap_or(0)
            );
        }
        (None, None) => {}
    }
    match (st.last_contact_ms, st.since_contact_ms) {
        (Some(at), Some(since)) => outln!(
            "proven current:   through revision {}, {:.1} s ago ({})",
            st.current_through,
            since as f64 / 1000.0,
            fmt_time(at.saturating_mul(1_000_000)),
        ),
        _ => outln!("proven current:   never (since this host booted)"),
    }
    outln!(
        "replicator:       {}",
        match st.replicator_running {
            Some(true) => "running (holds the store's lock)",
            Some(false) => "none running",
            None => "unknown (the lock file cannot be read here)",
        }
    );
    if let Some(c) = &st.check {
        outln!(
            "last check:       {} at revision {} ({} entries; {} run, {} differed)",
            c.result,
            c.revision,
            c.entries,
            c.runs,
            c.differed
        );
        match (c.tree, &c.tree_first) {
            (Some(0), _) => outln!("key tree:         in step with the store"),
            (Some(n), first) => outln!(
                "key tree:         {} (changed by hand; `keycache verify --repair` mends it){}",
                paint(
                    &format!("{n} entries disagree with the store"),
                    AnsiColor::Red.on_default()
                ),
                first
                    .as_deref()
                    .map(|f| format!(", first: {}", esc(f)))
                    .unwrap_or_default()
            ),
            (None, _) => {}
        }
    }
    outln!(
        "stale:            {}",
        match &st.stale_reason {
            Some(why) => paint(&format!("yes: {}", esc(why)), AnsiColor::Red.on_default()),
            None => paint(
                &format!(
                    "no (proven current within {} s)",
                    settings.stale_after.as_secs()
                ),
                AnsiColor::Green.on_default()
            ),
        }
    );
    Ok(if ok { ExitCode::SUCCESS } else { exit(false) })
}
