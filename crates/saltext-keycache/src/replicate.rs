//! `replicate`: the replicator of `keycache_etcd` (list, then watch; see
//! `keycache_etcd::Replicator`) for the Salt engine
//! `saltext/keycache/engines/keycache.py` (`engines: [keycache: {}]`).
//!
//! It runs on the calling thread, on a runtime made for the call, with the
//! GIL released; every 200 ms it takes the GIL for a moment to run Python's
//! signal handlers (Salt's engine process exits on SIGTERM through them),
//! and stops with what they raised. It returns only that way, or with an
//! error that retrying cannot mend: the process then ends, and Salt's
//! process manager starts the engine again, which resumes from the revision
//! the store recorded.
//!
//! With `keycache_etcd: {metrics: ADDR}` it serves the replicator's
//! metrics, health and readiness there (`keycache_etcd::metrics`), on the
//! same runtime; an address it cannot listen on is raised.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keycache::tree::TreeSync;
use keycache::Store;
use keycache_config::etcd::{metrics_address, metrics_port, METRICS_EXPECTED};
use keycache_etcd::replicator::Level;
use keycache_etcd::{Replicator, Report};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use crate::error;
use crate::etcd::EtcdOptions;

/// How often the replicator lets Python run its signal handlers.
const SIGNALS_EVERY: Duration = Duration::from_millis(200);

/// A report as (log level, message).
fn describe(r: &Report) -> Vec<(&'static str, String)> {
    r.lines()
        .into_iter()
        .map(|(level, line)| {
            let level = match level {
                Level::Debug => "debug",
                Level::Info => "info",
                Level::Warning => "warning",
            };
            (level, line)
        })
        .collect()
}

/// `keycache_etcd`'s `metrics` (the address to serve the metrics on, as
/// `keycache_config::etcd` reads it) taken off `etcd`, and the mapping
/// without it (the options of the etcd connection): an unusable value is
/// an error that names the option.
fn take_metrics<'py>(
    etcd: Option<Bound<'py, PyAny>>,
) -> Result<(Option<String>, Option<Bound<'py, PyAny>>), String> {
    let Some(map) = etcd.as_ref().and_then(|e| e.cast::<PyDict>().ok()) else {
        return Ok((None, etcd));
    };
    let Ok(Some(v)) = map.get_item("metrics") else {
        return Ok((None, etcd));
    };
    let addr = if v.is_instance_of::<PyBool>() {
        None
    } else if v.is_instance_of::<PyInt>() {
        v.extract::<i64>().ok().and_then(|p| metrics_port(p.into()))
    } else {
        v.cast::<PyString>()
            .ok()
            .and_then(|s| s.to_str().ok().and_then(metrics_address))
    };
    let Some(addr) = addr else {
        let got = v
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(format!(
            "keycache: bad option keycache_etcd.metrics: expected {METRICS_EXPECTED}, got {got}"
        ));
    };
    let rest = map
        .copy()
        .and_then(|m| m.del_item("metrics").map(|()| m))
        .map_err(|e| format!("keycache: keycache_etcd: {e}"))?;
    Ok((Some(addr), Some(rest.into_any())))
}

/// Runs the replicator of the store in `dir` (the mmap_key layout of the
/// other arguments, the key tree kept in step as `tree` says: see
/// [`crate::tree_sync`]) from the etcd of
/// `etcd` (`keycache_etcd`), until a signal handler raises (its exception
/// is raised) or an error retrying cannot mend (raised as the registered
/// error class). `report(level, message)` hears what it does. With
/// `metrics` in `etcd`, its metrics are served there while it runs.
#[pyfunction]
#[pyo3(signature = (dir, *, size, slot_size, id_size, max_segment_bytes, etcd, tree=None, cluster_id=None, report=None, master_pki_dir=None, master_id=String::new()))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn replicate(
    py: Python<'_>,
    dir: String,
    size: u64,
    slot_size: usize,
    id_size: usize,
    max_segment_bytes: u64,
    etcd: Option<Bound<'_, PyAny>>,
    tree: Option<Bound<'_, PyAny>>,
    cluster_id: Option<String>,
    report: Option<Py<PyAny>>,
    master_pki_dir: Option<String>,
    master_id: String,
) -> PyResult<()> {
    let (metrics, etcd) = take_metrics(etcd).map_err(|why| error(py, why))?;
    let Some(options) =
        EtcdOptions::from_py(etcd.as_ref(), cluster_id.as_deref()).map_err(|why| error(py, why))?
    else {
        return Err(error(
            py,
            "keycache: the keycache engine replicates etcd: keycache_etcd (its endpoints at \
             least) must be set in the master config"
                .into(),
        ));
    };
    let settings = options.settings().map_err(|why| error(py, why))?;
    let tree = match &tree {
        Some(t) => crate::tree_sync(py, t)?,
        None => TreeSync::On,
    };
    let path = Path::new(&dir);
    if let Some(why) =
        crate::legacy::refusal(path, master_pki_dir.as_deref().map(Path::new), &master_id)
    {
        return Err(error(py, why));
    }
    let opts = crate::open::options((size, slot_size, id_size, max_segment_bytes));
    let store = crate::open::make_dir(path)
        .and_then(|()| Store::open_with(path, &opts))
        .map(|s| s.with_tree(tree))
        .map_err(|e| error(py, format!("keycache: {e}")))?;
    let log = report.as_ref().map(|cb| cb.clone_ref(py));
    let replicator = Replicator::new(settings, store, move |r| {
        let Some(cb) = &report else { return };
        Python::attach(|py| {
            for (level, msg) in describe(&r) {
                // A failing report callback must not stop the replica.
                let _ = cb.call1(py, (level, msg));
            }
        });
    });
    let raised: Arc<Mutex<Option<PyErr>>> = Arc::new(Mutex::new(None));
    let slot = raised.clone();
    let out = py.detach(move || {
        let mut replicator = replicator;
        keycache_etcd::block_on(async move {
            let stop = async move {
                loop {
                    tokio::time::sleep(SIGNALS_EVERY).await;
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
                        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        return;
                    }
                }
            };
            let listener = match &metrics {
                Some(addr) => {
                    let l = keycache_etcd::metrics::bind(addr).await?;
                    let at = l
                        .local_addr()
                        .map_or_else(|_| addr.clone(), |a| a.to_string());
                    if let Some(cb) = &log {
                        Python::attach(|py| {
                            let msg = format!(
                                "serving the replicator's metrics on http://{at}/metrics (and \
                                 /healthz, /readyz)"
                            );
                            let _ = cb.call1(py, ("info", msg));
                        });
                    }
                    Some(l)
                }
                None => None,
            };
            keycache_etcd::metrics::run_serving(&mut replicator, listener, stop).await
        })
    });
    if let Some(e) = raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    out.map_err(|e| error(py, format!("keycache: the replicator stopped: {e}")))
}
