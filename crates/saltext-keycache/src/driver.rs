//! [`Driver`]: Salt's key cache functions over one store directory, with
//! the values and errors of `salt/cache/mmap_key.py` (see [`crate::values`]).

use std::path::Path;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use keycache::format::MASTER_INDEX;
use keycache::table::Table;
use keycache::{KeyState, MinionId};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use keycache::Bank as Replicated;
use keycache_etcd::{Settings, Value};

use crate::etcd::Op;
use crate::listing::{Failed, Keep, Kept};
use crate::open::Open;
use crate::seen::Seen;
use crate::values::{self, Bank};
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
    /// etcd mode (`keycache_etcd`): the `keys` and `denied_keys` banks are
    /// written through etcd (see [`crate::etcd`]).
    pub(crate) etcd: Option<Settings>,
    /// What the last listing kept for the next (see [`crate::listing`]):
    /// taken by a listing, put back when it is done; a listing that finds
    /// it taken (another thread is listing) starts from nothing.
    pub(crate) kept: Mutex<Option<Kept>>,
    /// etcd mode: what this process's fetches returned, guarding the
    /// stores that follow them (see [`crate::seen`]).
    pub(crate) seen: Seen,
}

impl Driver {
    /// This process's handles: new ones after a fork, and before a write
    /// (`writing`) in a process other than the one that opened them.
    fn current(&self, writing: bool) -> Arc<Open> {
        let o = self.open.load_full();
        if o.generation == fork_generation() && (!writing || o.pid == std::process::id()) {
            return o;
        }
        let fresh = Arc::new(Open::new(&self.key));
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

    /// etcd mode: writes (`Some`) or removes (`None`) `name` in bank `b`
    /// through etcd, returning once the replica applied the commit (the GIL
    /// released meanwhile). A write is guarded by what this process's last
    /// fetch of the id returned, when there was one ([`crate::seen`]), else
    /// by what the local replica holds now; a removal by what the replica
    /// holds now. A removal of what the replica does not hold is `false`,
    /// with nothing sent.
    fn through_etcd(
        &self,
        py: Python<'_>,
        open: &Open,
        settings: &Settings,
        b: Bank,
        name: &[u8],
        value: Option<Value>,
    ) -> PyResult<bool> {
        let Some(rb) = b.replicated() else {
            return Err(error(py, format!("keycache: bank {b:?} is never in etcd")));
        };
        let id = minion(name).map_err(|e| fail(py, e))?;
        let table = open.table(b).map_err(|e| fail(py, e))?;
        // Taken for a removal too: a write of the id makes the fetch out of date.
        let expected = match self.seen.take(rb, name) {
            Some(seen) if value.is_some() => seen,
            _ => crate::etcd::local_value(&table, rb, name).map_err(|e| fail(py, e))?,
        };
        if value.is_none() && expected.is_none() {
            return Ok(false);
        }
        let op = Op {
            bank: rb,
            id,
            expected,
            value,
        };
        py.detach(|| crate::etcd::write(settings, &open.dir, vec![op], open.actor()))
            .map_err(|why| error(py, why))?;
        Ok(true)
    }

    /// Refuses a local write of a bank etcd holds (`keys`, `denied_keys`)
    /// when the store is a replica of etcd and this driver is not in etcd
    /// mode (no `keycache_etcd` in the master config), as the CLI refuses
    /// it ([`keycache_etcd::state::refused_around_etcd`]).
    fn refuse_around_etcd(&self, py: Python<'_>, open: &Open, b: Bank) -> PyResult<()> {
        if self.etcd.is_some() || b.replicated().is_none() {
            return Ok(());
        }
        let Some(file) = keycache_etcd::state::replica_file(&open.dir) else {
            return Ok(());
        };
        Err(error(
            py,
            format!(
                "keycache: {}",
                keycache_etcd::state::refused_around_etcd(
                    &open.dir.display().to_string(),
                    &file.display().to_string(),
                    "The master config has no keycache_etcd: set it",
                )
            ),
        ))
    }

    /// etcd mode: Salt's `flush(bank)` (`salt-key --delete-den` flushes
    /// `denied_keys`): every entry the local replica holds in the bank is
    /// removed through etcd, each guarded by its value. The bank's files
    /// stay.
    fn wipe_through_etcd(
        &self,
        py: Python<'_>,
        open: &Open,
        settings: &Settings,
        rb: Replicated,
    ) -> PyResult<bool> {
        let store = open.store().map_err(|e| fail(py, e))?;
        let ops = py
            .detach(|| -> keycache::Result<Vec<Op>> {
                let mut ops = Vec::new();
                for (bank, id, value) in keycache_etcd::replica::local_entries(&store)? {
                    if bank != rb {
                        continue;
                    }
                    let Ok(id) = MinionId::new(id) else { continue };
                    ops.push(Op {
                        bank,
                        id,
                        expected: Some(value),
                        value: None,
                    });
                }
                Ok(ops)
            })
            .map_err(|e| fail(py, e))?;
        if ops.is_empty() {
            return Ok(true);
        }
        py.detach(|| crate::etcd::write(settings, &open.dir, ops, open.actor()))
            .map_err(|why| error(py, why))?;
        Ok(true)
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
fn warn(py: Python<'_>, msg: &str) {
    let _ = py
        .import("logging")
        .and_then(|l| l.call_method1("getLogger", ("saltext.keycache",)))
        .and_then(|l| l.call_method1("warning", ("%s", msg)));
}

/// keycache's error as the driver's exception, with the driver's advice
/// where the library's words leave the front end's part out.
fn fail(py: Python<'_>, e: keycache::Error) -> PyErr {
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
        let table = open.table(b).map_err(|e| fail(py, e))?;
        let mut buf = Vec::new();
        let found = table.get_into(&name, &mut buf).map_err(|e| fail(py, e))?;
        let raw = found.filter(|f| f.len > 0).map(|f| f.value(&buf));
        if let (Some(_), Some(rb)) = (&self.etcd, b.replicated()) {
            // What the caller decides on guards its store ([`crate::seen`]).
            let value = raw.and_then(|raw| Value::decode(rb, raw).ok());
            self.seen.fetched(rb, &name, value);
        }
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
        enum Put {
            Key(KeyState, Vec<u8>),
            Denied(Vec<u8>),
            Master(Vec<u8>),
        }
        let put = match b {
            Bank::Keys => {
                let d = data.cast::<PyDict>().ok().filter(|d| {
                    d.contains("state").unwrap_or(false) && d.contains("pub").unwrap_or(false)
                });
                let Some(d) = d else {
                    return Err(error(
                        py,
                        format!(
                            "keycache: keys bank requires {{state, pub}} dict, got {}",
                            data.get_type().repr()?
                        ),
                    ));
                };
                let state = d.get_item("state")?.map(|s| s.extract::<String>());
                let state = match state {
                    Some(Ok(s)) => KeyState::from_name(&s),
                    _ => None,
                };
                let Some(state) = state else {
                    let s = d
                        .get_item("state")?
                        .map(|s| s.repr().map(|r| r.to_string()));
                    let shown = match s {
                        Some(Ok(r)) => r,
                        _ => "None".to_string(),
                    };
                    return Err(error(py, format!("keycache: unknown key state {shown}")));
                };
                let pub_key = match d.get_item("pub")? {
                    Some(p) => values::to_bytes(&p)?,
                    None => Vec::new(),
                };
                Put::Key(state, pub_key)
            }
            Bank::Denied => {
                let raw = match data.cast::<PyList>() {
                    Ok(l) if l.is_empty() => Vec::new(),
                    Ok(l) => values::to_bytes(&l.get_item(0)?)?,
                    Err(_) => values::to_bytes(data)?,
                };
                Put::Denied(raw)
            }
            Bank::Master => Put::Master(values::to_bytes(data)?),
        };
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
        if let Some(settings) = &self.etcd {
            let through = match &put {
                Put::Key(state, p) => Some((Replicated::Keys, Value::Key(*state, p.clone()))),
                Put::Denied(p) => Some((Replicated::Denied, Value::Denied(p.clone()))),
                Put::Master(_) => None,
            };
            if let Some((rb, value)) = through {
                if let Err(why) = Value::decode(rb, &value.encode()) {
                    return Err(error(
                        py,
                        format!(
                            "keycache: failed to write bank={bank:?} key={}: {why}; with \
                             keycache_etcd only a non-empty public key goes to etcd, nothing \
                             was written",
                            key.repr()?
                        ),
                    ));
                }
                return self
                    .through_etcd(py, &open, settings, b, &name, Some(value))
                    .map(|_| ());
            }
        }
        self.refuse_around_etcd(py, &open, b)?;
        py.detach(|| -> keycache::Result<()> {
            // The write that makes the store (its banks) begins its history
            // (see keycache_merge::history::begin_if_missing).
            if !matches!(put, Put::Master(_)) {
                let s = open.store()?;
                if !s.keys_table().path().exists() && !s.denied_table().path().exists() {
                    keycache_merge::history::begin_if_missing(&s, &Default::default(), None)?;
                }
            }
            match put {
                // Salt stores an empty key too (it then reads as absent); the
                // library's batches refuse one, so the id leaves the bank and
                // the tree through a batch first, then the bare value is put.
                Put::Key(state, p) if p.is_empty() => {
                    let s = open.store()?;
                    s.remove(&minion(&name)?)?;
                    s.keys_table().put(&name, &[state.byte()]).map(|_| ())
                }
                Put::Denied(p) if p.is_empty() => {
                    let s = open.store()?;
                    s.remove_denied(&minion(&name)?)?;
                    s.denied_table().put(&name, b"").map(|_| ())
                }
                Put::Key(state, p) => open.store()?.put(&minion(&name)?, state, &p),
                Put::Denied(p) => open.store()?.deny(&minion(&name)?, &p),
                Put::Master(v) => {
                    open.master()?.put(&name, &v)?;
                    open.sync_master_pub(&name)
                }
            }
        })
        .map_err(|e| fail(py, e))?;
        for m in open.resumed() {
            warn(py, &m);
        }
        Ok(())
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
            if let (Some(settings), Some(rb)) = (&self.etcd, b.replicated()) {
                return self.wipe_through_etcd(py, &open, settings, rb);
            }
            self.refuse_around_etcd(py, &open, b)?;
            py.detach(|| wipe(&open, b)).map_err(|e| fail(py, e))?;
            return Ok(true);
        };
        let name = Self::name(k)?;
        if !self.fits(&name) {
            return Ok(false);
        }
        if let (Some(settings), true) = (&self.etcd, b.replicated().is_some()) {
            return self.through_etcd(py, &open, settings, b, &name, None);
        }
        self.refuse_around_etcd(py, &open, b)?;
        py.detach(|| -> keycache::Result<bool> {
            match b {
                Bank::Keys => open.store()?.remove(&minion(&name)?),
                Bank::Denied => open.store()?.remove_denied(&minion(&name)?),
                Bank::Master => {
                    let was = open.master()?.remove(&name)?;
                    open.sync_master_pub(&name)?;
                    Ok(was)
                }
            }
        })
        .map_err(|e| fail(py, e))
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

/// The minion id of a name already checked by `valid_id`.
fn minion(name: &[u8]) -> keycache::Result<MinionId> {
    MinionId::from_bytes(name)
}

/// The index file name of a bank.
fn index_name(b: Bank) -> &'static str {
    match b {
        Bank::Keys => keycache::format::KEYS_INDEX,
        Bank::Denied => keycache::format::DENIED_INDEX,
        Bank::Master => MASTER_INDEX,
    }
}

/// Salt's `flush(bank)`: the bank's files removed ([`Table::remove_files`]:
/// index, heap segments, past a missing one too, roster, lock), for `keys`
/// and `denied_keys` under the banks' locks ([`keycache::Store::wipe`]). With the
/// tree on, the bank's ids (those of damaged entries included) are first
/// removed from the tree, through the bank, so the tree never vouches for a
/// key the store no longer holds.
fn wipe(open: &Open, b: Bank) -> keycache::Result<()> {
    // The entries and the files go under the banks' locks: no write lands
    // between the two.
    let locked = match b {
        Bank::Keys => Some(Replicated::Keys),
        Bank::Denied if open.dir.join(index_name(Bank::Keys)).exists() => Some(Replicated::Denied),
        // The wipe takes the keys bank's lock first, and would create that
        // bank; with no keys bank, only minions_denied/ holds anything.
        Bank::Denied => {
            if open.tree.is_on() {
                let ids = open.store()?.ids_named(Replicated::Denied)?;
                remove_denied_files(&open.dir, &ids)?;
            }
            None
        }
        Bank::Master => None,
    };
    let wiped = match locked {
        Some(bank) => open.store()?.wipe(bank),
        None => Table::remove_files(&open.dir.join(index_name(b))),
    };
    open.forget(b);
    wiped
}

/// Removes `minions_denied/<id>` for each id (a symlink or other
/// non-directory entry is unlinked, never followed), then syncs the
/// directory. A `minions_denied` that is not a directory is left alone.
fn remove_denied_files(dir: &Path, ids: &[MinionId]) -> keycache::Result<()> {
    let sub = dir.join("minions_denied");
    match std::fs::symlink_metadata(&sub) {
        Ok(m) if m.is_dir() => {}
        _ => return Ok(()),
    }
    let mut removed = false;
    for id in ids {
        let p = sub.join(id.as_str());
        match std::fs::symlink_metadata(&p) {
            Ok(m) if !m.is_dir() => {
                std::fs::remove_file(&p).map_err(|e| keycache::Error::Io {
                    path: p.clone(),
                    op: "remove",
                    source: e,
                })?;
                removed = true;
            }
            _ => {}
        }
    }
    if removed {
        std::fs::File::open(&sub)
            .and_then(|d| d.sync_all())
            .map_err(|e| keycache::Error::Io {
                path: sub.clone(),
                op: "fsync",
                source: e,
            })?;
    }
    Ok(())
}
