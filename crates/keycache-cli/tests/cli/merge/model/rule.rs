//! The merge rule, as the model states it: per (bank, id), the version with
//! the later stamp wins, then the more restrictive kind, then the greater
//! hash.

use std::collections::{BTreeMap, BTreeSet};

use keycache::Bank;
use keycache_merge::history::{value_hash, Kind};
use keycache_merge::snapshot::Snapshot;

use super::store::Model;

/// A version: (stamp, how restrictive the kind is, hash of the value), and
/// the value (None: a tombstone).
type Ver = ((u64, u8, u64), Option<(&'static str, String)>);

/// The versions of a snapshot's entries (tombstones included).
fn versions(snap: &Snapshot) -> BTreeMap<(Bank, String), Ver> {
    snap.entries
        .iter()
        .map(|e| {
            let (rank, val) = match e.kind {
                Kind::Accepted => (0, Some("accepted")),
                Kind::Pending => (1, Some("pending")),
                Kind::Rejected => (2, Some("rejected")),
                Kind::Denied => (3, Some("denied")),
                Kind::Absent => (4, None),
            };
            let hash = if val.is_some() {
                value_hash(e.kind, &e.public_key)
            } else {
                0
            };
            let key = String::from_utf8(e.public_key.clone()).expect("a PEM key");
            (
                (e.bank, e.id.clone()),
                ((e.stamp, rank, hash), val.map(|v| (v, key))),
            )
        })
        .collect()
}

/// The merge of their snapshot into ours: per (bank, id), the value of the
/// version that wins (the greater (stamp, rank, hash)).
pub(super) fn model_merge(ours: &Snapshot, theirs: &Snapshot) -> Model {
    let (o, t) = (versions(ours), versions(theirs));
    let keys: BTreeSet<&(Bank, String)> = o.keys().chain(t.keys()).collect();
    let mut out = Model::new();
    for k in keys {
        let win = match (o.get(k), t.get(k)) {
            (Some(a), Some(b)) => {
                if b.0 > a.0 {
                    b
                } else {
                    a
                }
            }
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => unreachable!(),
        };
        if let Some(v) = &win.1 {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}
