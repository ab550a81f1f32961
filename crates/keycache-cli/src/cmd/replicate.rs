//! `keycache replicate`: the replicator of this master's store, in the
//! foreground, forever (`keycache_etcd::Replicator`): the store made equal
//! to the key state in etcd, then kept so, with its key tree. Each report
//! is one line on stderr, or one JSON document per line on stdout with
//! `--json`. Meant for a service manager (`dist/keycache-replicate.service`):
//! a kill at any moment is safe, a restart resumes from the recorded
//! revision. With `keycache_etcd: {metrics: ADDR}` it serves its metrics,
//! health and readiness there (`keycache_etcd::metrics`); under systemd's
//! `NOTIFY_SOCKET` it speaks the notify protocol ([`super::notify`]).

use std::path::Path;
use std::process::ExitCode;

use keycache::tree::TreeSync;
use keycache_etcd::replica::Applied;
use keycache_etcd::{Replicator, Report};
use serde::Serialize;

use super::notify::{stop_signal, Notifier};
use super::state::TreeMode;
use crate::args::{Json, StoreArgs};
use crate::output::{errln, esc, esc_path, print_json_line, CmdResult};

/// The arguments of `keycache replicate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Keep the key tree of the store's directory (minions/, minions_pre/,
    /// minions_rejected/, minions_denied/) in step with the replica: Salt
    /// 3008.5's validate_token reads minions/<id> on every request of a
    /// minion, and a new replica has no tree yet. `auto`: when the
    /// directory holds a `minions` entry; `accepted`: minions/ alone (the
    /// directory validate_token reads; a sign-in then writes no file).
    /// Default: the master config's keycache_tree (false: never, accepted:
    /// accepted), else always.
    #[arg(long, value_enum, value_name = "WHEN")]
    tree: Option<TreeMode>,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// One report as a JSON line.
#[derive(Debug, Serialize)]
struct Line<'a> {
    event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    revision: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entries: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    written: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    removed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<Vec<Refused<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compact_revision: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_in_ms: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    took_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'a str>,
}

/// An etcd key the replica does not hold, and why.
#[derive(Debug, Serialize)]
struct Refused<'a> {
    key: &'a str,
    why: &'a str,
}

impl<'a> Line<'a> {
    fn new(event: &'static str) -> Line<'a> {
        Line {
            event,
            revision: None,
            entries: None,
            events: None,
            written: None,
            removed: None,
            refused: None,
            compact_revision: None,
            why: None,
            retry_in_ms: None,
            took_ms: None,
            result: None,
            endpoint: None,
            version: None,
        }
    }

    /// A listing or batch of events applied at `revision`: what it wrote,
    /// removed and refused, and how long it took.
    fn applied(mut self, revision: i64, a: &'a Applied, took: std::time::Duration) -> Line<'a> {
        self.revision = Some(revision);
        self.took_ms = Some(took.as_secs_f64() * 1e3);
        self.written = Some(a.written);
        self.removed = Some(a.removed);
        self.refused = Some(
            a.refused
                .iter()
                .map(|(key, why)| Refused { key, why })
                .collect(),
        );
        self
    }
}

/// Prints `r`: a JSON line on stdout (`json`), else a line on stderr.
fn print(r: &Report, json: bool) {
    if json {
        let line = match r {
            Report::Listed {
                revision,
                entries,
                applied,
                took,
                ..
            } => Line {
                entries: Some(*entries),
                ..Line::new("listed")
            }
            .applied(*revision, applied, *took),
            Report::Applied {
                revision,
                events,
                applied,
                took,
            } => Line {
                events: Some(*events),
                ..Line::new("applied")
            }
            .applied(*revision, applied, *took),
            Report::Compacted { compact_revision } => Line {
                compact_revision: Some(*compact_revision),
                ..Line::new("compacted")
            },
            Report::TooLarge { why } => Line {
                why: Some(why),
                ..Line::new("too_large")
            },
            Report::Lost { why, retry_in } => Line {
                why: Some(why),
                retry_in_ms: Some(retry_in.as_millis()),
                ..Line::new("lost")
            },
            Report::Relist { why } => Line {
                why: Some(why),
                ..Line::new("relist")
            },
            Report::Checked {
                revision,
                entries,
                result,
            } => Line {
                revision: Some(*revision),
                entries: Some(*entries as usize),
                result: Some(result),
                ..Line::new("checked")
            },
            Report::OldEtcd { endpoint, version } => Line {
                endpoint: Some(endpoint),
                version: Some(version),
                ..Line::new("old_etcd")
            },
            _ => Line::new("other"),
        };
        print_json_line(&line);
        return;
    }
    for (_, line) in r.lines() {
        errln!("keycache: replicate: {}", esc(&line));
    }
}

/// Runs `keycache replicate`: forever (under systemd's notify protocol:
/// until SIGTERM or SIGINT); exit code 2 on a failure that retrying cannot
/// mend.
pub(crate) fn run(a: Args) -> CmdResult {
    let settings = super::etcd::required(&a.layout, "replicate")?;
    let metrics = a
        .layout
        .config(Path::new(""))?
        .and_then(|c| c.etcd)
        .and_then(|e| e.value.metrics);
    // No audit actor: the replicator appends the records etcd holds with
    // each change (whoever made it), not records of its own.
    let (store, _) = TreeMode::open_writer(a.tree, &a.layout, Path::new(""), TreeMode::Always)?;
    errln!(
        "keycache: replicate: {} from etcd {} into {} (key tree {})",
        esc(settings.layout.prefix()),
        esc(&settings.endpoints.join(",")),
        esc_path(store.dir()),
        match store.tree() {
            TreeSync::On => "kept in step",
            TreeSync::Accepted => "minions/ kept in step",
            TreeSync::Off => "left alone",
        }
    );
    let json = a.json.json;
    let replicator = Replicator::new(settings, store, move |r| print(&r, json));
    keycache_etcd::block_on(replicate(replicator, metrics, Notifier::from_env()))?;
    Ok(ExitCode::SUCCESS)
}

/// The replicator, with its metrics served at `metrics` and systemd told
/// what it does through `notifier`, until a signal stops it (under
/// `notifier` only: without it, signals kill as they always did).
async fn replicate(
    mut replicator: Replicator,
    metrics: Option<String>,
    notifier: Option<Notifier>,
) -> keycache_etcd::Result<()> {
    let m = replicator.metrics();
    let server = match &metrics {
        Some(addr) => {
            let listener = keycache_etcd::metrics::bind(addr).await?;
            let at = listener
                .local_addr()
                .map_or_else(|_| addr.clone(), |a| a.to_string());
            errln!(
                "keycache: replicate: metrics on http://{}/metrics (and /healthz, /readyz)",
                esc(&at)
            );
            Some(keycache_etcd::metrics::serve(listener, m.clone()))
        }
        None => None,
    };
    let serving = async {
        match server {
            Some(s) => match s.await {},
            None => std::future::pending().await,
        }
    };
    let notifying = async {
        match &notifier {
            Some(n) => match n.run(&m).await {},
            None => std::future::pending().await,
        }
    };
    let stop = async {
        match &notifier {
            Some(n) => {
                stop_signal().await;
                n.send("STOPPING=1");
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = replicator.run(stop) => r,
        () = serving => Ok(()),
        () = notifying => Ok(()),
    }
}
