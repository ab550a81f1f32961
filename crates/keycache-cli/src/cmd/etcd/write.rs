//! `keycache accept`, `reject`, `delete` and `deny` when the master config has
//! `keycache_etcd`: each id decided on what etcd holds (the decision of
//! the local path, `super::super::change::decide`), written in etcd
//! transactions that commit only if the id's keys did not change since they
//! were read, and done once this master's replica has applied the commit
//! (`keycache_etcd::write::Writer::update`). Nothing is written locally:
//! the replicator brings the change, and the key tree with it.

use keycache::store::Store;
use keycache::Bank;
use keycache::MinionId;
use keycache_etcd::write::{Decision, Writer};
use keycache_etcd::{ReplicaState, Settings, Value};

use crate::cmd::change::{decide, Action, Change, Guard, Refusal, Skipped, StateReport};
use crate::output::{esc, esc_path, CmdError};

/// Writes `action` on `ids` through etcd for the replica `store` (each
/// change recorded in the cluster's audit trail as made by the store's
/// actor, [`Store::audit`]); what it did, or why nothing was (etcd unreachable, a conflict every time, the
/// replica not applying the commit in time: exit 2).
pub(crate) fn run(
    settings: Settings,
    store: &Store,
    action: Action,
    ids: &[MinionId],
    include_all: bool,
    guard: &Guard,
) -> Result<StateReport, CmdError> {
    check_replica(&settings, store)?;
    let dir = store.dir().to_path_buf();
    // A fingerprint that is not the key's, as etcd holds it in the
    // transaction's read: the whole command is refused.
    let mut refused: Option<keycache::Error> = None;
    let written = keycache_etcd::block_on(async {
        let mut w = Writer::connect(settings, &dir).await?;
        // The records go into etcd in each change's own transaction.
        w.set_actor(store.audit().cloned());
        w.update(ids, |id, cur| {
            // Decided again on each read (a conflict retries): the last
            // read's refusal stands.
            refused = None;
            let state = cur.key.as_ref().map(|(s, _)| *s);
            let decided = decide(action, state, cur.denied.is_some(), include_all).and_then(|ch| {
                guard
                    .apply(
                        id,
                        ch,
                        cur.key.as_ref().map(|(s, p)| (*s, p.as_slice())),
                        cur.denied.as_deref(),
                    )
                    .map_err(|r| match r {
                        Refusal::Skip(why) => why,
                        Refusal::Refuse(e) => {
                            let why = e.to_string();
                            refused = Some(e);
                            why
                        }
                    })
            });
            match decided {
                Err(why) => Decision::Skip(why),
                Ok(Change::Remove { key, denied }) => Decision::Write(
                    [(key, Bank::Keys), (denied, Bank::Denied)]
                        .into_iter()
                        .filter(|(on, _)| *on)
                        .map(|(_, b)| (b, None))
                        .collect(),
                ),
                Ok(Change::Deny) => {
                    // What etcd's denied bank may hold (no empty key, no
                    // private key material), as the replicas decode it.
                    let pem = cur
                        .key
                        .as_ref()
                        .map(|(_, p)| p.as_slice())
                        .unwrap_or_default();
                    match Value::decode(Bank::Denied, pem) {
                        Ok(v) => Decision::Write(vec![(Bank::Keys, None), (Bank::Denied, Some(v))]),
                        Err(why) => Decision::Skip(why.into()),
                    }
                }
                Ok(Change::SetState(target)) => {
                    let pem = cur.key.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
                    Decision::Write(vec![(Bank::Keys, Some(Value::Key(target, pem)))])
                }
            }
        })
        .await
    })?;
    if let Some(e) = refused {
        return Err(e.into());
    }
    let skipped = written
        .skipped
        .into_iter()
        .map(|(id, reason)| Skipped {
            id: id.to_string(),
            reason,
        })
        .collect();
    let done = written.done.iter().map(ToString::to_string).collect();
    let mut report = StateReport::new(action, done, skipped, None);
    report.etcd_revision = Some(written.revision);
    Ok(report)
}

/// Refuses, before etcd is asked anything, a store that is not a replica
/// of this prefix: the write would wait for a replicator that is not there
/// (and `--all` would have listed ids from a store that etcd does not
/// feed).
fn check_replica(settings: &Settings, store: &Store) -> Result<(), CmdError> {
    let prefix = settings.layout.prefix();
    match ReplicaState::read(store.dir())? {
        Some(s) if s.prefix == prefix => Ok(()),
        Some(s) => Err(CmdError::usage(format!(
            "{} replicates the etcd prefix {}, not {prefix} (keycache_etcd's): nothing written; \
             run keycache replicate with this config to make it a replica of {prefix}",
            esc_path(store.dir()),
            esc(&s.prefix)
        ))),
        None => Err(CmdError::usage(format!(
            "{} is not a replica of etcd yet (no {}): nothing written; start keycache \
             replicate with this master config first, so that the change reaches this master",
            esc_path(store.dir()),
            keycache::format::REPLICA_FILE
        ))),
    }
}
