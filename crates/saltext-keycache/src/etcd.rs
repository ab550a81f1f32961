//! etcd mode: with `keycache_etcd` in the master's options, the `keys` and
//! `denied_keys` banks are a live replica of the key state in etcd (see
//! `keycache_etcd`). The driver's `store` and `flush` on them become etcd
//! transactions ([`write`]), guarded by what the local replica shows, and
//! return once the replica (kept by the `keycache` engine, see
//! [`crate::replicate`]) has applied the commit; nothing is written locally
//! by the driver. Reads stay local.
//!
//! Fork safety: every write makes its own runtime and connection inside the
//! call ([`keycache_etcd::block_on`]) and drops both before it returns, so
//! none is ever shared with a forked child.

use std::path::Path;
use std::time::Duration;

use keycache::audit::Actor;
use keycache::Bank;
use keycache::MinionId;
use keycache_config::etcd::{prefix_or_default, EtcdSettings, SECONDS};
use keycache_etcd::write::Writer;
use keycache_etcd::{ReplicaState, Settings, Value};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};

/// The options of `keycache_etcd`, as read from the master's options: what
/// identifies a driver's etcd mode (the password too, never shown), the
/// prefix resolved.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct EtcdOptions(EtcdSettings);

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.0.endpoints)
            .field("prefix", &self.prefix())
            .finish_non_exhaustive()
    }
}

const KNOWN: &str =
    "endpoints, prefix, ca, cert, key, user, password, write_timeout, stale_after, check_every, \
     metrics";

/// What a value is, for an error (never the value of `password`).
fn shown(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn bad(key: &str, expected: &str, v: &Bound<'_, PyAny>) -> String {
    let what =
        if key == "password" || !(v.is_instance_of::<PyString>() || v.is_instance_of::<PyInt>()) {
            format!("a {}", shown(v))
        } else {
            v.repr().map(|r| r.to_string()).unwrap_or_else(|_| shown(v))
        };
    format!("keycache: bad option keycache_etcd.{key}: expected {expected}, got {what}")
}

fn text(key: &str, v: &Bound<'_, PyAny>) -> Result<String, String> {
    match v.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) {
        Some(s) if !s.is_empty() && !s.contains('\0') => Ok(s.to_owned()),
        _ => Err(bad(key, "a non-empty string", v)),
    }
}

fn seconds(key: &str, v: &Bound<'_, PyAny>) -> Result<u64, String> {
    if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() {
        if let Ok(n) = v.extract::<u64>() {
            if SECONDS.contains(&n) {
                return Ok(n);
            }
        }
    }
    Err(bad(key, "a whole number of seconds from 1 to 86400", v))
}

impl EtcdOptions {
    /// Reads `keycache_etcd` (`opts`: the option's value; `None`, an empty
    /// mapping or a missing option: no etcd). `cluster_id` is the master's
    /// `cluster_id` when it is true: the default prefix is
    /// `/keycache/<cluster_id>/`, else `/keycache/default/`, as the CLI's
    /// config reader has it. An error names the option.
    pub(crate) fn from_py(
        opts: Option<&Bound<'_, PyAny>>,
        cluster_id: Option<&str>,
    ) -> Result<Option<EtcdOptions>, String> {
        let Some(v) = opts.filter(|v| !v.is_none()) else {
            return Ok(None);
        };
        let Ok(map) = v.cast::<PyDict>() else {
            return Err(format!(
                "keycache: bad option keycache_etcd: expected a mapping, got a {}",
                shown(v)
            ));
        };
        if map.is_empty() {
            return Ok(None);
        }
        let mut o = EtcdSettings::default();
        for (k, v) in map.iter() {
            let Some(name) = k.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) else {
                return Err(format!(
                    "keycache: bad option keycache_etcd: its keys must be strings, got a {}",
                    shown(&k)
                ));
            };
            match name {
                "endpoints" => {
                    let items: Vec<Bound<'_, PyAny>> = if v.is_instance_of::<PyString>() {
                        vec![v.clone()]
                    } else if let Ok(l) = v.cast::<PyList>() {
                        l.iter().collect()
                    } else if let Ok(t) = v.cast::<PyTuple>() {
                        t.iter().collect()
                    } else {
                        return Err(bad(name, "a URL or a list of URLs", &v));
                    };
                    if items.is_empty() {
                        return Err(bad(name, "a URL or a list of URLs", &v));
                    }
                    o.endpoints = items
                        .iter()
                        .map(|i| text(name, i).map_err(|_| bad(name, "a list of URLs", i)))
                        .collect::<Result<_, _>>()?;
                }
                "prefix" => o.prefix = Some(text(name, &v)?),
                "ca" => o.ca = Some(text(name, &v)?.into()),
                "cert" => o.cert = Some(text(name, &v)?.into()),
                "key" => o.key = Some(text(name, &v)?.into()),
                "user" => o.user = Some(text(name, &v)?),
                "password" => o.password = Some(text(name, &v)?),
                "write_timeout" => o.write_timeout = seconds(name, &v)?,
                "stale_after" => o.stale_after = seconds(name, &v)?,
                "check_every" => o.check_every = seconds(name, &v)?,
                // The replicator's (the engine's) option: its address is
                // checked where it is served; no write of the driver uses it.
                "metrics" => {}
                other => {
                    return Err(format!(
                        "keycache: unknown option keycache_etcd.{other} (expected one of {KNOWN})"
                    ))
                }
            }
        }
        if o.endpoints.is_empty() {
            return Err(
                "keycache: bad option keycache_etcd.endpoints: expected a URL or a list of URLs, \
                 got nothing"
                    .into(),
            );
        }
        if let Some((first, second)) = o.half_pair() {
            return Err(format!(
                "keycache: bad option keycache_etcd.{first}: {first} and {second} go together, \
                 only one of them is set"
            ));
        }
        o.prefix = Some(prefix_or_default(
            o.prefix.as_deref(),
            cluster_id.filter(|c| !c.is_empty()),
        ));
        let o = EtcdOptions(o);
        // Refused here, when the driver is opened, not on the first write.
        o.settings()?;
        Ok(Some(o))
    }

    /// The options as the master config reader gives them.
    pub(crate) fn into_inner(self) -> EtcdSettings {
        self.0
    }

    /// The etcd prefix, resolved when the options were read.
    fn prefix(&self) -> &str {
        self.0.prefix.as_deref().unwrap_or_default()
    }

    /// The settings of `keycache_etcd`'s crate.
    pub(crate) fn settings(&self) -> Result<Settings, String> {
        Settings::from_parts(&self.0, self.prefix())
            .map_err(|e| format!("keycache: bad option {e}"))
    }
}

/// One write through etcd: (bank, id) from what the local replica holds
/// (`expected`) to `value` (`None`: removed).
pub(crate) struct Op {
    pub(crate) bank: Bank,
    pub(crate) id: MinionId,
    pub(crate) expected: Option<Value>,
    pub(crate) value: Option<Value>,
}

/// What the local replica in `dir` holds for `name` in `table`: its value,
/// or `None` when it is absent or holds nothing etcd could (such a value
/// is then guarded as absent).
pub(crate) fn local_value(
    table: &keycache::table::Table,
    bank: Bank,
    name: &[u8],
) -> keycache::Result<Option<Value>> {
    let mut buf = Vec::new();
    Ok(match table.get_into(name, &mut buf)? {
        Some(f) if f.len > 0 => Value::decode(bank, f.value(&buf)).ok(),
        _ => None,
    })
}

/// Refuses a write before anything goes to etcd when this master's replica
/// could not apply it: no replica in `dir` yet, another prefix, or no
/// proof of currency for longer than `stale_after` (the replicator stopped,
/// or etcd lost), or a state written for another store (a copy).
pub(crate) fn check_replica(settings: &Settings, dir: &Path) -> Result<(), String> {
    let grace = keycache_etcd::replicator::PROOF_GRACE;
    let state = ReplicaState::stale_waiting(dir, settings.stale_after, grace)
        .map_err(|e| format!("keycache: {e}"))?;
    let Some((s, stale)) = state else {
        return Err(format!(
            "keycache: {} is not a replica of etcd yet (no {}): the replicator (the master's \
             `engines: [keycache: {{}}]`, or `keycache replicate`) has not listed etcd into it; \
             nothing was written",
            dir.display(),
            keycache::format::REPLICA_FILE
        ));
    };
    if s.prefix != settings.layout.prefix() {
        return Err(format!(
            "keycache: the replica in {} holds etcd prefix {}, not {} (keycache_etcd.prefix): \
             nothing was written; restart the replicator with this config",
            dir.display(),
            s.prefix,
            settings.layout.prefix()
        ));
    }
    if let Some(why) = stale {
        return Err(format!(
            "keycache: the replica in {} is stale ({why}; keycache_etcd.stale_after is {} s): \
             writes need etcd and a running replicator; nothing was written (reads go on from \
             the replica)",
            dir.display(),
            settings.stale_after.as_secs()
        ));
    }
    Ok(())
}

thread_local! {
    /// The etcd revision of this thread's last write through etcd (see
    /// [`last_etcd_revision`]).
    static LAST_REVISION: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

/// The etcd revision at which the calling thread's last `store` or `flush`
/// through etcd took effect: the revision it committed (or, when etcd
/// already held that very value, the revision that wrote it); 0 when it
/// committed nothing (the replica showed that value already) or failed.
/// Another master can wait for its own replica to reach it (read-your-
/// writes across masters); the etcd model test orders the driver's writes
/// by it.
#[pyfunction]
pub(crate) fn last_etcd_revision() -> i64 {
    LAST_REVISION.with(std::cell::Cell::get)
}

/// Runs `ops` through etcd for the store in `dir`, each committed only if
/// etcd still holds what the replica showed, each waiting until the replica
/// applied it, each change recorded in the cluster's audit trail as made by
/// `actor`, in its own transaction. Every op is tried; the error names how
/// many failed and the first failure. Call without the GIL.
pub(crate) fn write(
    settings: &Settings,
    dir: &Path,
    ops: Vec<Op>,
    actor: &Actor,
) -> Result<(), String> {
    LAST_REVISION.with(|r| r.set(0));
    check_replica(settings, dir)?;
    // Values the replica shows already (Salt's cluster masters store each
    // peer's key change again): nothing to send, no connection to make.
    let ops: Vec<Op> = ops
        .into_iter()
        .filter(|op| op.expected != op.value)
        .collect();
    if ops.is_empty() {
        return Ok(());
    }
    let total = ops.len();
    // A backstop: each request and the wait for the replica are bounded by
    // write_timeout already.
    let deadline = settings.write_timeout * 2 + Duration::from_secs(1);
    let (failures, last) = keycache_etcd::block_on(async {
        let fail = |e: keycache_etcd::Error| e.to_string();
        let mut w =
            match tokio::time::timeout(deadline, Writer::connect(settings.clone(), dir)).await {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => return Ok((vec![(None, fail(e))], 0)),
                Err(_) => return Ok((vec![(None, timed_out(settings))], 0)),
            };
        w.set_actor(Some(actor.clone()));
        let mut failures = Vec::new();
        let mut last = 0;
        for op in ops {
            let r = tokio::time::timeout(
                deadline,
                w.put_if(op.bank, &op.id, op.expected.as_ref(), op.value),
            )
            .await;
            match r {
                Ok(Ok(revision)) => last = last.max(revision),
                Ok(Err(e)) => failures.push((Some(op.id), fail(e))),
                Err(_) => failures.push((Some(op.id), timed_out(settings))),
            }
        }
        Ok((failures, last))
    })
    .map_err(|e| format!("keycache: {e}"))?;
    match failures.first() {
        None => {
            LAST_REVISION.with(|r| r.set(last));
            Ok(())
        }
        Some((_, why)) if total <= 1 => Err(format!("keycache: {why}")),
        Some((id, why)) => Err(format!(
            "keycache: {} of {total} writes through etcd failed; the first{}: {why}",
            if id.is_none() { total } else { failures.len() },
            id.as_ref().map(|i| format!(" ({i})")).unwrap_or_default()
        )),
    }
}

fn timed_out(settings: &Settings) -> String {
    format!(
        "etcd ({}) did not answer within {} s: whether the change was committed is unknown; \
         fetch it again once etcd answers",
        settings.endpoints.join(","),
        (settings.write_timeout * 2 + Duration::from_secs(1)).as_secs()
    )
}
