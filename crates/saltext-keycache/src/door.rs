//! [`Door`]: where the driver's reads and writes of a store go, decided
//! once, when the driver is made from the master's options: the store's
//! files (no `keycache_etcd`), or, in etcd mode, etcd for the `keys` and
//! `denied_keys` banks (see [`crate::etcd`]), `master_keys` and every read
//! staying local. The driver's functions check Salt's arguments and shape
//! its values; each reaches the store through one call of its door.

use std::path::Path;

use keycache::table::Table;
use keycache::{Bank as Replicated, MinionId};
use keycache_etcd::{Settings, Value};
use pyo3::prelude::*;

use crate::driver::{fail, warn};
use crate::error;
use crate::etcd::{EtcdOptions, Op};
use crate::open::Open;
use crate::seen::Seen;
use crate::values::{Bank, Put};

/// Where a driver's reads and writes go (see the module's header).
pub(crate) enum Door {
    /// No `keycache_etcd`: every bank is read and written in the store's
    /// files; a store that is a replica of etcd refuses local writes of
    /// the banks etcd holds ([`Door::way`]).
    Local,
    /// `keycache_etcd`: the `keys` and `denied_keys` banks are written
    /// through etcd and read from the local replica.
    Etcd(Box<Etcd>),
}

/// etcd mode's side of a [`Door`].
pub(crate) struct Etcd {
    settings: Settings,
    /// What this process's fetches returned, guarding the stores that
    /// follow them (see [`crate::seen`]).
    seen: Seen,
}

/// Where one write of a bank goes.
enum Way<'a> {
    Local,
    Etcd(&'a Etcd, Replicated),
}

impl Door {
    /// The door of a driver with these `keycache_etcd` options (`None`:
    /// local); an error names the option.
    pub(crate) fn new(etcd: Option<&EtcdOptions>) -> Result<Door, String> {
        Ok(match etcd {
            None => Door::Local,
            Some(o) => Door::Etcd(Box::new(Etcd {
                settings: o.settings()?,
                seen: Seen::default(),
            })),
        })
    }

    /// Whether the banks etcd holds are written through etcd: the local
    /// handles then write, and record, none of their changes.
    pub(crate) fn is_etcd(&self) -> bool {
        matches!(self, Door::Etcd(_))
    }

    /// The value of `name` in bank `b`, read into `buf` (`None`: absent,
    /// or stored empty, which Salt reads as absent). In etcd mode what a
    /// read of `keys` or `denied_keys` returned is kept: the caller decides
    /// on it, and it guards the caller's store ([`crate::seen`]).
    pub(crate) fn read<'b>(
        &self,
        open: &Open,
        b: Bank,
        name: &[u8],
        buf: &'b mut Vec<u8>,
    ) -> keycache::Result<Option<&'b [u8]>> {
        let table = open.table(b)?;
        let found = table.get_into(name, buf)?;
        let buf: &'b [u8] = buf;
        let raw = found.filter(|f| f.len > 0).map(|f| f.value(buf));
        if let (Door::Etcd(e), Some(rb)) = (self, b.replicated()) {
            let value = raw.and_then(|raw| Value::decode(rb, raw).ok());
            e.seen.fetched(rb, name, value);
        }
        Ok(raw)
    }

    /// Salt's `store`: `put` as `name` in bank `b` (`key`, the caller's
    /// name, for errors), through etcd (returning once the replica applied
    /// it) or in the store's files (the GIL released).
    pub(crate) fn store(
        &self,
        py: Python<'_>,
        open: &Open,
        b: Bank,
        name: &[u8],
        put: Put,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (e, rb, value) = match (self.way(py, open, b)?, put) {
            (Way::Etcd(e, rb), Put::Key(state, p)) => (e, rb, Value::Key(state, p)),
            (Way::Etcd(e, rb), Put::Denied(p)) => (e, rb, Value::Denied(p)),
            (_, put) => {
                py.detach(|| store_locally(open, name, put))
                    .map_err(|e| fail(py, e))?;
                for m in open.resumed() {
                    warn(py, &m);
                }
                return Ok(());
            }
        };
        // Refused before anything is sent: etcd holds only whole public
        // keys (not an empty key, nor a private key block).
        if let Err(why) = Value::decode(rb, &value.encode()) {
            return Err(error(
                py,
                format!(
                    "keycache: failed to write bank={:?} key={}: {why}; with keycache_etcd only \
                     a non-empty public key goes to etcd, nothing was written",
                    b.name(),
                    key.repr()?
                ),
            ));
        }
        e.write(py, open, b, rb, name, Some(value)).map(|_| ())
    }

    /// Salt's `flush(bank, key)`: removes `name` from bank `b`; whether
    /// the bank held it.
    pub(crate) fn remove(
        &self,
        py: Python<'_>,
        open: &Open,
        b: Bank,
        name: &[u8],
    ) -> PyResult<bool> {
        match self.way(py, open, b)? {
            Way::Etcd(e, rb) => e.write(py, open, b, rb, name, None),
            Way::Local => py
                .detach(|| remove_locally(open, b, name))
                .map_err(|e| fail(py, e)),
        }
    }

    /// Salt's `flush(bank)`: every entry of bank `b` removed, through etcd
    /// (the bank's files stay), else with the bank's files ([`wipe`]).
    pub(crate) fn wipe(&self, py: Python<'_>, open: &Open, b: Bank) -> PyResult<bool> {
        match self.way(py, open, b)? {
            Way::Etcd(e, rb) => e.wipe(py, open, rb),
            Way::Local => {
                py.detach(|| wipe(open, b)).map_err(|e| fail(py, e))?;
                Ok(true)
            }
        }
    }

    /// Where a write of bank `b` goes: through etcd in etcd mode for the
    /// banks etcd holds, else locally; refused for those banks when the
    /// store is a replica of etcd and this driver is not in etcd mode (no
    /// `keycache_etcd` in the master config), as the CLI refuses it
    /// ([`keycache_etcd::state::refused_around_etcd`]): the change would
    /// reach neither etcd nor the other masters.
    fn way(&self, py: Python<'_>, open: &Open, b: Bank) -> PyResult<Way<'_>> {
        let Some(rb) = b.replicated() else {
            return Ok(Way::Local);
        };
        if let Door::Etcd(e) = self {
            return Ok(Way::Etcd(e, rb));
        }
        let Some(file) = keycache_etcd::state::replica_file(&open.dir) else {
            return Ok(Way::Local);
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
}

impl Etcd {
    /// Writes (`Some`) or removes (`None`) `name` in bank `b` through etcd,
    /// returning once the replica applied the commit (the GIL released
    /// meanwhile). A write is guarded by what this process's last fetch of
    /// the id returned, when there was one ([`crate::seen`]), else by what
    /// the local replica holds now; a removal by what the replica holds
    /// now. A removal of what the replica does not hold is `false`, with
    /// nothing sent.
    fn write(
        &self,
        py: Python<'_>,
        open: &Open,
        b: Bank,
        rb: Replicated,
        name: &[u8],
        value: Option<Value>,
    ) -> PyResult<bool> {
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
        self.send(py, open, vec![op])?;
        Ok(true)
    }

    /// Salt's `flush(bank)` (`salt-key --delete-den` flushes
    /// `denied_keys`): every entry the local replica holds in the bank is
    /// removed through etcd, each guarded by its value. The bank's files
    /// stay.
    fn wipe(&self, py: Python<'_>, open: &Open, rb: Replicated) -> PyResult<bool> {
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
        if !ops.is_empty() {
            self.send(py, open, ops)?;
        }
        Ok(true)
    }

    /// Runs `ops` through etcd ([`crate::etcd::write`]), the GIL released.
    fn send(&self, py: Python<'_>, open: &Open, ops: Vec<Op>) -> PyResult<()> {
        py.detach(|| crate::etcd::write(&self.settings, &open.dir, ops, open.actor()))
            .map_err(|why| error(py, why))
    }
}

/// The minion id of a name already checked by `valid_id`.
fn minion(name: &[u8]) -> keycache::Result<MinionId> {
    MinionId::from_bytes(name)
}

/// Salt's `store` in the store's files: `keys` and `denied_keys` through
/// [`keycache::Store`]'s batches (the key tree kept in step), `master_keys`
/// in its table, with `<pki_dir>/master.pub` kept in step.
fn store_locally(open: &Open, name: &[u8], put: Put) -> keycache::Result<()> {
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
            s.remove(&minion(name)?)?;
            s.keys_table().put(name, &[state.byte()]).map(|_| ())
        }
        Put::Denied(p) if p.is_empty() => {
            let s = open.store()?;
            s.remove_denied(&minion(name)?)?;
            s.denied_table().put(name, b"").map(|_| ())
        }
        Put::Key(state, p) => open.store()?.put(&minion(name)?, state, &p),
        Put::Denied(p) => open.store()?.deny(&minion(name)?, &p),
        Put::Master(v) => {
            open.master()?.put(name, &v)?;
            open.sync_master_pub(name)
        }
    }
}

/// Salt's `flush(bank, key)` in the store's files; whether the bank held
/// `name`.
fn remove_locally(open: &Open, b: Bank, name: &[u8]) -> keycache::Result<bool> {
    match b {
        Bank::Keys => open.store()?.remove(&minion(name)?),
        Bank::Denied => open.store()?.remove_denied(&minion(name)?),
        Bank::Master => {
            let was = open.master()?.remove(name)?;
            open.sync_master_pub(name)?;
            Ok(was)
        }
    }
}

/// The index file name of a bank.
pub(crate) fn index_name(b: Bank) -> &'static str {
    match b {
        Bank::Keys => keycache::format::KEYS_INDEX,
        Bank::Denied => keycache::format::DENIED_INDEX,
        Bank::Master => keycache::format::MASTER_INDEX,
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
