//! The native core of `saltext.keycache`, Salt's `keys.cache_driver:
//! keycache`.
//!
//! Salt's loader packs only Python functions of the module it loads and
//! runs that module's body again for every new `salt.cache.Cache`, so the
//! driver is a thin Python module (`saltext/keycache/cache/keycache.py`)
//! whose functions call this one. This module keeps the open stores, keyed
//! by directory and layout, for the life of the process: a new `Cache()`
//! finds them open.
//!
//! ```python
//! from saltext.keycache import _native
//!
//! d = _native.driver("/etc/salt/pki/master", size=1_000_000, slot_size=96,
//!                    id_size=64, max_segment_bytes=1 << 30, tree=True,
//!                    pki_dir_is_abs=True)
//! d.store("keys", "web-01", {"state": "pending", "pub": pem})
//! d.fetch("keys", "web-01")   # {"state": "pending", "pub": pem}
//! ```
//!
//! * Reads take no lock: they go straight to keycache's lock-free readers.
//! * A `localfs_key` tree beside no store is refused by every function
//!   until it is migrated (see `legacy`); `<pki_dir>/master.pub` is kept in
//!   step with the bank (see `master_pub`).
//! * Writes (with their fsyncs) and listings release the GIL.
//! * etcd mode (`keycache_etcd`, see `etcd`): `store` and `flush` of the
//!   `keys` and `denied_keys` banks go through etcd and wait for the local
//!   replica, which `replicate` (the Salt engine's function) keeps; each
//!   write's runtime and connection live only inside the call.
//! * The runner functions (`salt-run keycache.*`, see `runner`) run the
//!   library's jobs on Salt's opts, as the `keycache` command runs them.
//! * The audit trail (`keycache::audit`): every change the driver makes
//!   is recorded as made by this process (see `audit`): in the store's
//!   log, or through etcd in the change's own transaction.
//! * Fork: a child never uses its parent's handles. `after_fork_in_child`
//!   (registered with `os.register_at_fork` by the Python package) drops
//!   them, and every write checks the process id as well, so a child
//!   forked some other way reopens before it writes: a parent's `flock` on
//!   the shared lock file description would otherwise let both write at once.

#![deny(clippy::unwrap_used)]

mod audit;
mod door;
mod driver;
mod etcd;
mod legacy;
mod listing;
mod master_pub;
mod open;
mod replicate;
mod runner;
mod seen;
mod strs;
mod values;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use keycache::tree::TreeSync;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

pub use driver::Driver;

pyo3::create_exception!(
    _native,
    KeycacheError,
    pyo3::exceptions::PyException,
    "A keycache error, raised when no SaltCacheError class was registered."
);

/// The exception class errors are raised as (Salt's `SaltCacheError`).
static ERROR_CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Bumped in a forked child: handles opened before it are not used again.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// What identifies one open store: its directory and the driver's settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct DriverKey {
    pub(crate) dir: String,
    pub(crate) params: (u64, usize, usize, u64),
    pub(crate) tree: TreeSync,
    pub(crate) pki_dir_is_abs: bool,
    /// The master's `pki_dir`, when `dir` is the master's own store
    /// directory: where `master.pub` is kept in step, and where the master's
    /// legacy key files are looked for.
    pub(crate) master_pki_dir: Option<String>,
    /// The master's id without `_master` (Salt's `MasterKeys.master_id`).
    pub(crate) master_id: String,
    /// `keycache_etcd`: etcd mode (see [`etcd`]).
    pub(crate) etcd: Option<etcd::EtcdOptions>,
    /// Who this process's changes are recorded as (see [`audit`]): the
    /// program (the base name of Python's `sys.argv[0]`) and the master's
    /// `id`, as Salt's options give it.
    pub(crate) recorded_as: audit::Who,
}

/// The drivers of this process. Looked up when a driver module is (re)loaded,
/// never on a read.
static DRIVERS: Mutex<Option<HashMap<DriverKey, Py<Driver>>>> = Mutex::new(None);

/// The error class set by [`set_error_class`], else [`KeycacheError`].
pub(crate) fn error(py: Python<'_>, msg: String) -> PyErr {
    match ERROR_CLASS.get(py) {
        Some(class) => PyErr::from_type(class.bind(py).clone(), msg),
        None => KeycacheError::new_err(msg),
    }
}

/// The fork generation handles are checked against.
pub(crate) fn fork_generation() -> u64 {
    FORK_GENERATION.load(Ordering::Acquire)
}

/// Registers the class errors are raised as: Salt's `SaltCacheError`. The
/// first class registered stays.
#[pyfunction]
fn set_error_class(py: Python<'_>, class: Bound<'_, PyType>) {
    let _ = ERROR_CLASS.set(py, class.unbind());
}

/// Forgets every handle of the parent: called in a forked child (by the
/// package's `os.register_at_fork(after_in_child=...)`).
#[pyfunction]
fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::AcqRel);
    let mut g = DRIVERS.lock().unwrap_or_else(|e| e.into_inner());
    // Dropping a parent's handle closes this process's copies of its file
    // descriptors and unmaps; no lock is taken.
    *g = None;
}

/// `keycache_tree` as the driver and the engine take it, checked here
/// alone: the string `"accepted"` keeps `minions/` alone in step
/// ([`TreeSync::Accepted`]); any other value but a string counts by its
/// truth, the whole tree or none of it; another string is refused (raised
/// as the registered error class: Python would take `"false"` as true).
pub(crate) fn tree_sync(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<TreeSync> {
    if let Ok(s) = v.cast::<pyo3::types::PyString>() {
        return match s.to_str()? {
            "accepted" => Ok(TreeSync::Accepted),
            other => Err(error(
                py,
                format!("keycache: keycache_tree must be true, false or accepted, not {other:?}"),
            )),
        };
    }
    Ok(if v.is_truthy()? {
        TreeSync::On
    } else {
        TreeSync::Off
    })
}

/// The driver for the store in `dir` with these settings, opened once per
/// process and shared by every `Cache()` that asks for it. `master_pki_dir`
/// is the master's `pki_dir` when `dir` is the master's own store directory
/// (`<master_pki_dir>/master.pub` is then kept in step with the bank), and
/// `master_id` the master's id without `_master`. Changes are recorded in
/// the audit trail as made by `program` (default: the base name of
/// `sys.argv[0]`) for the master `audit_master` (the master options' `id`).
#[pyfunction(name = "driver")]
#[pyo3(signature = (dir, *, size, slot_size, id_size, max_segment_bytes, tree, pki_dir_is_abs, master_pki_dir=None, master_id=String::new(), etcd=None, cluster_id=None, program=None, audit_master=None))]
#[allow(clippy::too_many_arguments)]
fn open_driver(
    py: Python<'_>,
    dir: String,
    size: u64,
    slot_size: usize,
    id_size: usize,
    max_segment_bytes: u64,
    tree: Bound<'_, PyAny>,
    pki_dir_is_abs: bool,
    master_pki_dir: Option<String>,
    master_id: String,
    etcd: Option<Bound<'_, PyAny>>,
    cluster_id: Option<String>,
    program: Option<String>,
    audit_master: Option<String>,
) -> PyResult<Py<Driver>> {
    let program = match program.filter(|p| !p.is_empty()) {
        Some(p) => p,
        None => audit::program(py),
    };
    let etcd = etcd::EtcdOptions::from_py(etcd.as_ref(), cluster_id.as_deref())
        .map_err(|why| error(py, why))?;
    let key = DriverKey {
        dir,
        params: (size, slot_size, id_size, max_segment_bytes),
        tree: tree_sync(py, &tree)?,
        pki_dir_is_abs,
        master_pki_dir,
        master_id,
        etcd,
        recorded_as: audit::Who {
            program,
            master: audit_master.filter(|m| !m.is_empty()),
        },
    };
    let mut g = DRIVERS.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(d) = map.get(&key) {
        return Ok(d.clone_ref(py));
    }
    let d = Py::new(py, Driver::new(py, key.clone())?)?;
    map.insert(key, d.clone_ref(py));
    Ok(d)
}

/// How many listings of this process walked their bank on a second thread
/// (`LIST_BESIDE_FROM` roster entries or more, two CPUs): tells that path
/// from the one-thread walk.
#[pyfunction]
fn walks_beside() -> u64 {
    listing::walks_beside()
}

/// Whether this process's listings of large banks walk on a second thread
/// (it may run on two CPUs at once).
#[pyfunction]
fn can_walk_beside() -> bool {
    listing::two_cpus()
}

/// The native module `saltext.keycache._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Driver>()?;
    m.add_function(wrap_pyfunction!(open_driver, m)?)?;
    m.add_function(wrap_pyfunction!(set_error_class, m)?)?;
    m.add_function(wrap_pyfunction!(after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(replicate::replicate, m)?)?;
    m.add_function(wrap_pyfunction!(etcd::last_etcd_revision, m)?)?;
    m.add_function(wrap_pyfunction!(audit::audit_history, m)?)?;
    m.add_function(wrap_pyfunction!(audit::audit_program, m)?)?;
    m.add_function(wrap_pyfunction!(runner::run_migrate, m)?)?;
    m.add_function(wrap_pyfunction!(runner::run_stats, m)?)?;
    m.add_function(wrap_pyfunction!(runner::run_verify, m)?)?;
    m.add_function(wrap_pyfunction!(runner::run_diff, m)?)?;
    m.add_function(wrap_pyfunction!(runner::run_etcd_status, m)?)?;
    m.add_function(wrap_pyfunction!(runner::run_etcd_diff, m)?)?;
    m.add("KeycacheError", m.py().get_type::<KeycacheError>())?;
    m.add("MAX_KEPT_VALUES", strs::MAX_KEPT_VALUES)?;
    m.add("LIST_BESIDE_FROM", listing::BESIDE_FROM)?;
    m.add_function(wrap_pyfunction!(walks_beside, m)?)?;
    m.add_function(wrap_pyfunction!(can_walk_beside, m)?)?;
    Ok(())
}
