//! `keycache etcd status` and `diff`: the replica against etcd.

use std::time::Duration;

use etcd_client::Client;
use keycache::snapshot::Bank;
use keycache::store::Store;
use serde::Serialize;

use crate::connect::Settings;
use crate::error::Result;
use crate::layout::Value;
use crate::state::{now_ms, ReplicaState};

/// A replica's standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The etcd prefix.
    pub prefix: String,
    /// The revision the store holds (0: never listed).
    pub replica_revision: i64,
    /// etcd's current revision (`None`: etcd could not be reached).
    pub etcd_revision: Option<i64>,
    /// Keys under the prefix in etcd.
    pub etcd_keys: Option<i64>,
    /// etcd's revision minus the replica's (changes outside the prefix
    /// count too: a replica is current when the watch has nothing to send).
    pub revision_lag: Option<i64>,
    /// When the replicator last heard from etcd (ms since the epoch).
    pub last_contact_ms: Option<u64>,
    /// How long ago that was.
    pub since_contact_ms: Option<u64>,
    /// No contact for longer than `stale_after` (or never).
    pub stale: bool,
    /// Why etcd could not be reached.
    pub etcd_error: Option<String>,
}

/// The status of the replica in `store`'s directory; `client` is `None`
/// when etcd could not be reached (`why`).
pub async fn status(
    settings: &Settings,
    store: &Store,
    client: Result<&mut Client>,
) -> Result<Status> {
    let s = ReplicaState::read(store.dir())?;
    let (etcd_revision, etcd_keys, etcd_error) = match client {
        Ok(c) => match crate::seed::count(c, settings).await {
            Ok((n, rev)) => (Some(rev), Some(n), None),
            Err(e) => (None, None, Some(e.to_string())),
        },
        Err(e) => (None, None, Some(e.to_string())),
    };
    let rev = s.as_ref().map_or(0, |s| s.revision);
    let contact = s.as_ref().map(|s| s.contact_ms);
    let since = contact.map(|c| now_ms().saturating_sub(c));
    Ok(Status {
        prefix: settings.layout.prefix().to_owned(),
        replica_revision: rev,
        etcd_revision,
        etcd_keys,
        revision_lag: etcd_revision.map(|e| e - rev),
        last_contact_ms: contact,
        since_contact_ms: since,
        stale: since.is_none_or(|s| Duration::from_millis(s) > settings.stale_after),
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
