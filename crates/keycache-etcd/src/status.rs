//! `keycache etcd status` and `diff`: the replica against etcd.

use etcd_client::Client;
use keycache::store::Store;
use keycache::Bank;
use serde::Serialize;

use crate::connect::Settings;
use crate::error::Result;
use crate::lock::ReplicatorLock;
use crate::prefix::Value;
use crate::state::{CheckResult, ReplicaState};

/// A replica's standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The etcd prefix.
    pub prefix: String,
    /// The revision the store holds (0: never listed).
    pub replica_revision: i64,
    /// etcd's current revision (`None`: etcd could not be reached).
    pub etcd_revision: Option<i64>,
    /// Keys of the key state under the prefix in etcd (the audit trail's
    /// not counted).
    pub etcd_keys: Option<i64>,
    /// etcd's revision minus the replica's (changes outside the prefix
    /// count too: a replica is current when the watch has nothing to send).
    pub revision_lag: Option<i64>,
    /// The etcd revision the replicator last proved the replica current
    /// through (a linearizable read, then the watch's progress up to it).
    pub current_through: i64,
    /// When that proof was taken (ms since the epoch, by the replicator's
    /// wall clock: shown, never compared).
    pub last_contact_ms: Option<u64>,
    /// How long ago that proof was, on the host's boot clock (`None`:
    /// never, or before this host booted).
    pub since_contact_ms: Option<u64>,
    /// Whether a replicator holds this store's lock now (`None`: this user
    /// cannot tell).
    pub replicator_running: Option<bool>,
    /// Whether the state file was written for this store (not a copy's).
    pub bound: bool,
    /// The last consistency check of the replica against etcd.
    pub check: Option<CheckResult>,
    /// Not proven current within `stale_after`, no replicator running, or
    /// a state that belongs to another store: see `stale_reason`.
    pub stale: bool,
    /// Why it is stale.
    pub stale_reason: Option<String>,
    /// Why etcd could not be reached.
    pub etcd_error: Option<String>,
}

/// The status of the replica in `store`'s directory; `client` is `None`
/// when etcd could not be reached (`why`).
///
/// Staleness is judged without comparing two processes' wall clocks: on
/// the proof of currency the replicator takes (a linearizable read of etcd,
/// then the watch's progress up to that revision), timed on the host's
/// boot clock, and on whether a replicator holds the store's lock.
pub async fn status(
    settings: &Settings,
    store: &Store,
    client: Result<&mut Client>,
) -> Result<Status> {
    let dir = store.dir();
    let s = ReplicaState::read(dir)?;
    let (etcd_revision, etcd_keys, etcd_error) = match client {
        Ok(c) => match crate::seed::count(c, settings).await {
            Ok((n, rev)) => (Some(rev), Some(n), None),
            Err(e) => (None, None, Some(e.to_string())),
        },
        Err(e) => (None, None, Some(e.to_string())),
    };
    let rev = s.as_ref().map_or(0, |s| s.revision);
    let running = ReplicatorLock::held(dir);
    let stale_reason = match &s {
        None => Some("never listed etcd: is keycache replicate running?".to_owned()),
        Some(s) if s.prefix != settings.layout.prefix() => Some(format!(
            "the replica holds etcd prefix {}, not {}",
            s.prefix,
            settings.layout.prefix()
        )),
        Some(s) => s.stale(dir, settings.stale_after),
    };
    Ok(Status {
        prefix: settings.layout.prefix().to_owned(),
        replica_revision: rev,
        etcd_revision,
        etcd_keys,
        revision_lag: etcd_revision.map(|e| e - rev),
        current_through: s.as_ref().map_or(0, |s| s.current_through),
        last_contact_ms: s
            .as_ref()
            .filter(|s| s.contact_boot_ms > 0)
            .map(|s| s.contact_ms),
        since_contact_ms: s
            .as_ref()
            .and_then(ReplicaState::contact_age)
            .map(|d| d.as_millis() as u64),
        replicator_running: running,
        bound: s.as_ref().is_some_and(|s| s.belongs_to(dir)),
        check: s.as_ref().and_then(|s| s.check.clone()),
        stale: stale_reason.is_some(),
        stale_reason,
        etcd_error,
    })
}

/// One entry on which the store and etcd disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    /// `keys` or `denied_keys`.
    pub bank: &'static str,
    /// The minion id.
    pub id: String,
    /// What the store holds: a state (`accepted`, ...), `denied`, or
    /// `None`.
    pub store: Option<String>,
    /// What etcd holds.
    pub etcd: Option<String>,
}

fn describe(v: &Value) -> String {
    match v {
        Value::Key(s, _) => s.name().to_owned(),
        Value::Denied(_) => "denied".to_owned(),
    }
}

/// The entries on which `store` and etcd (listed now) disagree, with the
/// revision listed. Values that differ only in the key show the same
/// state on both sides.
pub async fn diff(
    client: &mut Client,
    settings: &Settings,
    store: &Store,
) -> Result<(i64, Vec<Difference>)> {
    let l = crate::list::list(client, settings).await?;
    let mut local: std::collections::BTreeMap<(Bank, String), Value> =
        crate::replica::local_entries(store)?
            .into_iter()
            .map(|(b, id, v)| ((b, id), v))
            .collect();
    let mut out = Vec::new();
    for ((b, id), v) in &l.entries {
        match local.remove(&(*b, id.to_string())) {
            Some(lv) if lv == *v => {}
            lv => out.push(Difference {
                bank: b.name(),
                id: id.to_string(),
                store: lv.as_ref().map(describe),
                etcd: Some(describe(v)),
            }),
        }
    }
    for ((b, id), lv) in local {
        out.push(Difference {
            bank: b.name(),
            id,
            store: Some(describe(&lv)),
            etcd: None,
        });
    }
    out.sort_by(|a, b| (a.bank, &a.id).cmp(&(b.bank, &b.id)));
    Ok((l.revision, out))
}

/// What `keycache etcd status --json` and `salt-run keycache.status`
/// report: the status, the store and the bound it was judged by.
#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    /// The replica's standing.
    #[serde(flatten)]
    pub status: Status,
    /// The store directory.
    pub dir: std::path::PathBuf,
    /// keycache_etcd's stale_after, in ms.
    pub stale_after_ms: u128,
}

impl StatusReport {
    /// Whether the replica is current and etcd answered.
    pub fn ok(&self) -> bool {
        !self.status.stale && self.status.etcd_error.is_none()
    }
}

/// [`status`] of the replica in `store`'s directory, on a runtime made for
/// the call ([`crate::block_on`]); etcd's connect and request timeouts
/// bound it. An etcd that cannot be reached is part of the report.
pub fn status_report(settings: &Settings, store: &Store) -> Result<StatusReport> {
    let status = crate::block_on(async {
        let mut client = settings.connect().await;
        let c = match &mut client {
            Ok(c) => Ok(c),
            Err(e) => Err(crate::Error::Config(e.to_string())),
        };
        status(settings, store, c).await
    })?;
    Ok(StatusReport {
        status,
        dir: store.dir().to_path_buf(),
        stale_after_ms: settings.stale_after.as_millis(),
    })
}

/// What `keycache etcd diff --json` and `salt-run keycache.diff` report.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// The store directory.
    pub dir: std::path::PathBuf,
    /// The etcd prefix.
    pub prefix: String,
    /// The etcd revision listed.
    pub revision: i64,
    /// Whether the store holds what etcd holds.
    pub same: bool,
    /// The entries that differ.
    pub differences: Vec<Difference>,
}

/// [`diff`] of `store` against etcd, on a runtime made for the call
/// ([`crate::block_on`]); etcd's connect and request timeouts bound it.
pub fn diff_report(settings: &Settings, store: &Store) -> Result<DiffReport> {
    let (revision, differences) = crate::block_on(async {
        let mut client = settings.connect().await?;
        diff(&mut client, settings, store).await
    })?;
    Ok(DiffReport {
        dir: store.dir().to_path_buf(),
        prefix: settings.layout.prefix().to_owned(),
        revision,
        same: differences.is_empty(),
        differences,
    })
}
