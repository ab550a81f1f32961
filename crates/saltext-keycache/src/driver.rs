//! [`Driver`]: Salt's key cache functions over one store directory, with
//! the values and errors of `salt/cache/mmap_key.py` (see [`crate::values`]).

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use keycache::KeyState;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::door::{index_name, Door};
use crate::listing::{Failed, Keep, Kept};
use crate::open::Open;
use crate::values::{self, Bank, Put};
use crate::{error, fork_generation, DriverKey};

/// Salt's key cache functions on the store of one directory (a master's
/// `pki_dir`, or `cluster_pki_dir`), with one layout. Values, absent
/// entries and errors are those of Salt 3008.5's `mmap_key`; errors are
/// raised as the class given to `set_error_class` (Salt's
/// `SaltCacheError`), with keycache's message.
#[pyclass(frozen, module = "saltext.keycache._native")]
pub struct Driver {
    pub(crate) key: DriverKey,
    pub(crate) open: ArcSwap<Open>,
    /// Where reads and writes go: the store's files, or etcd
    /// (`keycache_etcd`) for the `keys` and `denied_keys` banks.
    pub(crate) door: Door,
    /// What the last listing kept for the next (see [`crate::listing`]):
    /// taken by a listing, put back when it is done; a listing that finds
    /// it taken (another thread is listing) starts from nothing.
    pub(crate) kept: Mutex<Option<Kept>>,
}

impl Driver {
    /// The driver of `key`'s store, its [`Door`] decided here, once: etcd
    /// when `key` has `keycache_etcd`, else the store's files.
    pub(crate) fn new(py: Python<'_>, key: DriverKey) -> PyResult<Driver> {
        let door = Door::new(key.etcd.as_ref()).map_err(|why| error(py, why))?;
        Ok(Driver {
            open: ArcSwap::new(Arc::new(Open::new(&key, door.is_etcd()))),
            key,
            door,
            kept: Mutex::new(None),
        })
    }

    /// This process's handles: new ones after a fork, and before a write
    /// (`writing`) in a process other than the one that opened them.
    fn current(&self, writing: bool) -> Arc<Open> {
        let o = self.open.load_full();
        if o.generation == fork_generation() && (!writing || o.pid == std::process::id()) {
            return o;
        }
        let fresh = Arc::new(Open::new(&self.key, self.door.is_etcd()));
        self.open.store(fresh.clone());
        fresh
    }

    /// [`Driver::current`], after refusing a legacy tree beside no store:
    /// what every function calls first.
    fn ready(&self, py: Python<'_>, writing: bool) -> PyResult<Arc<Open>> {
        let open = self.current(writing);
        open.vet().map_err(|why| error(py, why))?;
        if let Some(m) = open.resume_once() {
            warn(py, &m);
        }
        Ok(open)
    }

    /// Lists `bank` (see [`crate::listing`]), with what the last listing
    /// kept; a listing that finds it taken (another thread is listing)
    /// starts from nothing.
    fn listing<'py>(
        &self,
        py: Python<'py>,
        open: &Open,
        bank: Bank,
        keep: Keep,
    ) -> PyResult<Bound<'py, PyAny>> {
        let taken = self.kept.try_lock().ok().and_then(|mut k| k.take());
        let mut kept = taken.unwrap_or_default();
        let out = py
            .detach(|| open.table(bank))
            .map_err(Failed::Walk)
            .and_then(|t| kept.list(py, &t, bank, keep));
        if let Ok(mut k) = self.kept.try_lock() {
            *k = Some(kept);
        }
        out.map_err(|e| match e {
            Failed::Walk(e) => fail(py, e),
            Failed::Py(e) => e,
        })
    }

    /// The bank named `bank`, or Salt's error for an unknown one.
    fn bank(py: Python<'_>, bank: &str) -> PyResult<Bank> {
        Bank::parse(bank).ok_or_else(|| error(py, format!("keycache: unrecognised bank {bank:?}")))
    }

    /// Salt's `_check_id`: in the minion banks, `key` must pass Salt's
    /// `valid_id` (a `str`, not empty, `.` or `..`, without `/`, `\` or
    /// NUL, and the master's `pki_dir` absolute).
    fn check_id(&self, py: Python<'_>, bank: Option<Bank>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        if !bank.is_some_and(Bank::holds_minion_ids) {
            return Ok(());
        }
        let ok = self.key.pki_dir_is_abs
            && key
                .cast::<PyString>()
                .ok()
                .and_then(|s| s.to_str().ok().map(|s| keycache::id::validate(s).is_ok()))
                .unwrap_or(false);
        if ok {
            Ok(())
        } else {
            Err(error(
                py,
                format!("keycache: {} is not a valid minion_id", key.repr()?),
            ))
        }
    }

    /// The bank `bank` names and the bytes of `key` in it, after Salt's
    /// checks of both ([`Driver::check_id`], then [`Driver::bank`]).
    fn target(
        &self,
        py: Python<'_>,
        bank: &str,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<(Bank, Vec<u8>)> {
        self.check_id(py, Bank::parse(bank), key)?;
        Ok((Self::bank(py, bank)?, Self::name(key)?))
    }

    /// The bytes of a key name (`str`, or bytes for `master_keys`).
    fn name(key: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
        values::to_bytes(key)
    }

    /// Whether the id fits the table's id field; Salt's mmap_key would
    /// truncate a longer one (two minions could then share an entry), so
    /// such an id is never found, and storing it is refused.
    fn fits(&self, name: &[u8]) -> bool {
        name.len() <= self.key.params.2 && !name.is_empty() && !name.contains(&0)
    }

    /// Why [`Driver::fits`] refuses `name`, in words.
    fn misfit(&self, name: &[u8]) -> String {
        if name.is_empty() {
            "the name is empty".into()
        } else if name.contains(&0) {
            "the name contains a NUL byte".into()
        } else {
            format!(
                "the name is {} bytes, more than mmap_key_id_size ({})",
                name.len(),
                self.key.params.2
            )
        }
    }
}

/// Logs `msg` as a warning through Salt's logging (the logger
/// `saltext.keycache`); a failure to log is not the caller's.
pub(crate) fn warn(py: Python<'_>, msg: &str) {
    let _ = py
        .import("logging")
        .and_then(|l| l.call_method1("getLogger", ("saltext.keycache",)))
        .and_then(|l| l.call_method1("warning", ("%s", msg)));
}

/// keycache's error as the driver's exception, with the driver's advice
/// where the library's words leave the front end's part out.
pub(crate) fn fail(py: Python<'_>, e: keycache::Error) -> PyErr {
    let advice = if keycache::tree::in_the_way(&e) {
        "; keycache_tree: False in the master config leaves the key tree out"
    } else if keycache::tree::out_of_step(&e) {
        "; `salt-run keycache.verify repair=True` (the command: `keycache verify --repair`) mends the tree"
    } else {
        ""
    };
    error(py, format!("keycache: {e}{advice}"))
}

#[pymethods]
impl Driver {
    /// The store's directory.
    #[getter]
    fn dir(&self) -> &str {
        &self.key.dir
    }

    /// Salt's `fetch(bank, key)`.
    fn fetch<'py>(
        &self,
        py: Python<'py>,
        bank: &str,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self.ready(py, false)?;
        let (b, name) = self.target(py, bank, key)?;
        if !self.fits(&name) {
            return Ok(values::absent(py, b));
        }
        let mut buf = Vec::new();
        let raw = self
            .door
            .read(&open, b, &name, &mut buf)
            .map_err(|e| fail(py, e))?;
        if b == Bank::Keys && raw.and_then(|r| r.first()) == Some(&KeyState::Accepted.byte()) {
            if let Some(m) = open.missing_key_file(&name) {
                warn(py, &m);
            }
        }
        match raw {
            Some(raw) => values::fetched(py, b, raw),
            None => Ok(values::absent(py, b)),
        }
    }

    /// Salt's `store(bank, key, data)`.
    fn store(
        &self,
        py: Python<'_>,
        bank: &str,
        key: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let open = self.ready(py, true)?;
        let (b, name) = self.target(py, bank, key)?;
        let put = Put::of(py, b, data)?;
        if !self.fits(&name) {
            return Err(error(
                py,
                format!(
                    "keycache: failed to write bank={bank:?} key={}: {}",
                    key.repr()?,
                    self.misfit(&name)
                ),
            ));
        }
        self.door.store(py, &open, b, &name, put, key)
    }

    /// Salt's `flush(bank, key=None)`: removes `key`, or the whole bank.
    #[pyo3(signature = (bank, key=None))]
    fn flush(&self, py: Python<'_>, bank: &str, key: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let open = self.ready(py, true)?;
        let b = Bank::parse(bank);
        if let Some(k) = key {
            self.check_id(py, b, k)?;
        }
        let b = Self::bank(py, bank)?;
        let Some(k) = key else {
            return self.door.wipe(py, &open, b);
        };
        let name = Self::name(k)?;
        if !self.fits(&name) {
            return Ok(false);
        }
        self.door.remove(py, &open, b, &name)
    }

    /// Salt's `list(bank)`: the bank's ids, in roster order.
    fn list<'py>(&self, py: Python<'py>, bank: &str) -> PyResult<Bound<'py, PyAny>> {
        let open = self.ready(py, false)?;
        let b = Self::bank(py, bank)?;
        self.listing(py, &open, b, Keep::Ids)
    }

    /// Salt's `list_all(bank, include_data=False)`: `{id: value}` of the
    /// `keys` or `denied_keys` bank in one pass.
    #[pyo3(signature = (bank, include_data=false))]
    fn list_all<'py>(
        &self,
        py: Python<'py>,
        bank: &str,
        include_data: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self.ready(py, false)?;
        let b = match Bank::parse(bank) {
            Some(b @ (Bank::Keys | Bank::Denied)) => b,
            _ => {
                return Err(error(
                    py,
                    format!("keycache: list_all unsupported for bank {bank:?}"),
                ))
            }
        };
        let keep = Keep::Values {
            bank: b,
            data: include_data,
        };
        self.listing(py, &open, b, keep)
    }

    /// Salt's `contains(bank, key)`; with `key=None`, whether the bank's
    /// index file exists.
    #[pyo3(signature = (bank, key=None))]
    fn contains(
        &self,
        py: Python<'_>,
        bank: &str,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let open = self.ready(py, false)?;
        let b = Bank::parse(bank);
        let Some(k) = key else {
            return Ok(b.is_some_and(|b| {
                std::path::Path::new(&self.key.dir)
                    .join(index_name(b))
                    .exists()
            }));
        };
        let (b, name) = self.target(py, bank, k)?;
        if !self.fits(&name) {
            return Ok(false);
        }
        let t = open.table(b).map_err(|e| fail(py, e))?;
        t.contains(&name).map_err(|e| fail(py, e))
    }

    /// Salt's `updated(bank, key)`: the write time in whole seconds, or
    /// `None`.
    fn updated(&self, py: Python<'_>, bank: &str, key: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
        let open = self.ready(py, false)?;
        let (b, name) = self.target(py, bank, key)?;
        if !self.fits(&name) {
            return Ok(None);
        }
        let t = open.table(b).map_err(|e| fail(py, e))?;
        let mut buf = Vec::new();
        Ok(t.get_into(&name, &mut buf)
            .map_err(|e| fail(py, e))?
            // Salt: int(mtime_ns / 1e9), a float division truncated.
            .map(|f| (f.mtime as f64 / 1e9) as i64))
    }
}
