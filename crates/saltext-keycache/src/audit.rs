//! The audit trail (`keycache::audit`) as the driver writes and reads it.
//!
//! Every change the driver makes of the `keys` and `denied_keys` banks is
//! recorded as made by this process: program the base name of Python's
//! `sys.argv[0]` (`salt-master` for a minion's sign-in, `salt-key`,
//! `salt-run`, ...), user the OS user it runs as, `sudo_user` the
//! environment's `SUDO_USER`, master the master options' `id`, no reason.
//! Locally the store handle records them ([`keycache::Store::set_audit`]:
//! appended to the store's log under the `keys` bank's lock, fsynced, before
//! the banks are written); in etcd mode the etcd writer puts them into the
//! change's own transaction ([`keycache_etcd::write::Writer::set_actor`]),
//! and each master's replicator appends them to its log.
//!
//! The actor is computed once per [`crate::open::Open`], that is once per
//! process and store (a forked child makes its own `Open`, and so its own
//! actor: nothing of it is shared across a fork).
//!
//! [`audit_history`] reads a store's log for `salt-run keycache.history`.

use std::path::Path;

use keycache::audit::{Actor, Record};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::error;

/// What identifies the writer of a driver, beside the OS user: part of
/// [`crate::DriverKey`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct Who {
    /// The program (see [`program`]).
    pub(crate) program: String,
    /// The master options' `id`.
    pub(crate) master: Option<String>,
}

impl Who {
    /// The actor of this process: [`Who`], the OS user (looked up now) and
    /// `SUDO_USER`.
    pub(crate) fn actor(&self) -> Actor {
        keycache_config::actor::actor(
            &self.program,
            std::env::var("SUDO_USER").ok(),
            self.master.clone(),
            None,
        )
    }
}

/// The program this process records its changes as: the base name of
/// Python's `sys.argv[0]` (`salt-master`, `salt-key`, `salt-run`, ...);
/// `python` when there is none (an embedded interpreter, `python -c`).
pub(crate) fn program(py: Python<'_>) -> String {
    let argv0 = py
        .import("sys")
        .and_then(|sys| sys.getattr("argv"))
        .and_then(|argv| argv.get_item(0))
        .and_then(|a| a.extract::<String>())
        .unwrap_or_default();
    program_of(&argv0)
}

/// [`program`] of an `argv[0]`.
fn program_of(argv0: &str) -> String {
    let base = argv0.rsplit('/').next().unwrap_or_default().trim();
    if base.is_empty() || base.starts_with('-') {
        "python".to_owned()
    } else {
        base.to_owned()
    }
}

/// The program this process's changes are recorded as, when the driver is
/// opened without `program` (see [`program`]).
#[pyfunction]
pub(crate) fn audit_program(py: Python<'_>) -> String {
    program(py)
}

/// A record as a dict, its keys the log's JSON field names, in their
/// order.
fn record_dict<'py>(py: Python<'py>, r: &Record) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("time", &r.time)?;
    d.set_item("id", &r.id)?;
    d.set_item("action", &r.action)?;
    d.set_item("from", &r.from)?;
    d.set_item("to", &r.to)?;
    d.set_item("finger", &r.finger)?;
    d.set_item("replaced_finger", &r.replaced_finger)?;
    d.set_item("user", &r.user)?;
    d.set_item("sudo_user", &r.sudo_user)?;
    d.set_item("program", &r.program)?;
    d.set_item("master", &r.master)?;
    d.set_item("reason", &r.reason)?;
    d.set_item("revision", r.revision)?;
    Ok(d)
}

/// The audit trail of the store in `dir`, oldest first (the rotated logs,
/// then the log): a list of dicts (the log's JSON fields), those of minion
/// `id` alone when given, those made at `since` or later when given (RFC
/// 3339, `2026-11-29T04:05:06Z`, or a date, `2026-11-29`, its midnight
/// UTC); and how many lines could not be read (torn by a kill). A `since`
/// that is no time raises `ValueError` naming it; a log that cannot be
/// read, the registered error class.
#[pyfunction]
#[pyo3(signature = (dir, id=None, since=None))]
pub(crate) fn audit_history<'py>(
    py: Python<'py>,
    dir: String,
    id: Option<String>,
    since: Option<String>,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let since = match since.as_deref() {
        None => None,
        Some(s) => Some(keycache::audit::parse_time(s).ok_or_else(|| {
            PyValueError::new_err(format!(
                "keycache: since {s:?} is not a time: give RFC 3339 (2026-11-29T04:05:06Z, \
                 2026-11-29T05:05:06+01:00) or a date (2026-11-29, its midnight UTC)"
            ))
        })?),
    };
    let (records, torn) = py
        .detach(|| keycache::audit::read(Path::new(&dir)))
        .map_err(|e| error(py, format!("keycache: the audit trail of {dir}: {e}")))?;
    let out = PyList::empty(py);
    for r in records {
        if id.as_deref().is_some_and(|id| id != r.id) {
            continue;
        }
        if let Some(since) = since {
            match r.millis() {
                Some(t) if t >= since => {}
                _ => continue,
            }
        }
        out.append(record_dict(py, &r)?)?;
    }
    Ok((out, torn))
}
