//! The minion-key store: Salt's `keys` and `denied_keys` banks in one
//! directory, over two [`Table`]s.
//!
//! Values of the `keys` bank are `[state: u8][PEM]` (1 accepted, 2 pending,
//! 3 rejected); values of `denied_keys` are the PEM bytes. The same id may be
//! in both banks: a denied key is a different key presented under an id.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::MinionId;
use crate::table::{self, Applied, Entry, OpenOptions, Table, TableStats, Txn};

/// Index file of the `keys` bank, in the store directory.
pub const KEYS_INDEX: &str = ".mmap_keys.idx";
/// Index file of the `denied_keys` bank.
pub const DENIED_INDEX: &str = ".mmap_denied.idx";
/// Index file of Salt's `master_keys` bank (the master's own PEM files).
pub const MASTER_INDEX: &str = ".mmap_master.idx";

/// The state of a key in the `keys` bank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    /// Accepted (`minions/`).
    Accepted,
    /// Pending, unaccepted (`minions_pre/`).
    Pending,
    /// Rejected (`minions_rejected/`).
    Rejected,
}

impl KeyState {
    /// Every state, in `salt-key -L` order.
    pub const ALL: [KeyState; 3] = [KeyState::Accepted, KeyState::Pending, KeyState::Rejected];

    /// The state byte stored in front of the PEM.
    pub fn byte(self) -> u8 {
        match self {
            KeyState::Accepted => 1,
            KeyState::Pending => 2,
            KeyState::Rejected => 3,
        }
    }

    /// The state of a state byte.
    pub fn from_byte(b: u8) -> Option<KeyState> {
        match b {
            1 => Some(KeyState::Accepted),
            2 => Some(KeyState::Pending),
            3 => Some(KeyState::Rejected),
            _ => None,
        }
    }

    /// Salt's name: `accepted`, `pending`, `rejected`.
    pub fn name(self) -> &'static str {
        match self {
            KeyState::Accepted => "accepted",
            KeyState::Pending => "pending",
            KeyState::Rejected => "rejected",
        }
    }

    /// The localfs_key directory and `salt-key --out json` group name.
    pub fn dir_name(self) -> &'static str {
        match self {
            KeyState::Accepted => "minions",
            KeyState::Pending => "minions_pre",
            KeyState::Rejected => "minions_rejected",
        }
    }
}

impl std::str::FromStr for KeyState {
    type Err = Error;
    fn from_str(s: &str) -> Result<KeyState> {
        match s {
            "accepted" | "minions" => Ok(KeyState::Accepted),
            "pending" | "unaccepted" | "minions_pre" => Ok(KeyState::Pending),
            "rejected" | "minions_rejected" => Ok(KeyState::Rejected),
            _ => Err(Error::UnknownState(s.to_owned())),
        }
    }
}

impl std::fmt::Display for KeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An entry of the `keys` bank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// Its state.
    pub state: KeyState,
    /// The minion's public key, PEM bytes as stored.
    pub public_key: Vec<u8>,
    /// Unix nanoseconds of the last write.
    pub mtime: u64,
}

/// Keys per state, and denied keys.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Accepted keys.
    pub accepted: u64,
    /// Pending keys.
    pub pending: u64,
    /// Rejected keys.
    pub rejected: u64,
    /// Denied keys.
    pub denied: u64,
}

/// Statistics of both banks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StoreStats {
    /// The `keys` bank.
    pub keys: TableStats,
    /// The `denied_keys` bank.
    pub denied_keys: TableStats,
}

/// Decodes a `keys` bank value; `None` when it is not one (Salt then answers
/// "no entry").
pub fn decode_key_value(value: &[u8]) -> Option<(KeyState, &[u8])> {
    if value.len() < 2 {
        return None;
    }
    Some((KeyState::from_byte(value[0])?, &value[1..]))
}

/// Encodes a `keys` bank value.
pub fn encode_key_value(state: KeyState, pem: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(pem.len() + 1);
    v.push(state.byte());
    v.extend_from_slice(pem);
    v
}

/// Salt strips trailing NULs from denied keys when reading them.
fn strip_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// Turns a `keys` bank value into an entry, reusing its buffer.
fn entry_of(t: &Table, id: &[u8], r: Entry) -> Result<KeyEntry> {
    let mut v = r.value;
    match decode_key_value(&v).map(|(s, _)| s) {
        Some(state) => {
            v.copy_within(1.., 0);
            v.pop();
            Ok(KeyEntry {
                state,
                public_key: v,
                mtime: r.mtime,
            })
        }
        None => Err(Error::Corrupt {
            path: t.path().into(),
            id: Some(String::from_utf8_lossy(id).into_owned()),
            why: format!(
                "slot {}: value of {} bytes is not [state 1..3][public key]",
                r.slot,
                v.len()
            ),
        }),
    }
}

/// A Salt 3008 `mmap_key` store: the `keys` and `denied_keys` banks of one
/// directory (a master's `pki_dir` or `cluster_pki_dir`).
///
/// `Send + Sync`: share it between threads. Reads take no lock.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    keys: Table,
    denied: Table,
}

impl Store {
    /// Opens the store in `dir` with Salt's default layout.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(dir, &OpenOptions::default())
    }

    /// Opens the store in `dir`. Bank files that do not match the layout
    /// parameters are refused; missing banks read as empty and are created
    /// on the first write.
    pub fn open_with(dir: impl AsRef<Path>, opts: &OpenOptions) -> Result<Store> {
        let dir = dir.as_ref().to_path_buf();
        let meta =
            std::fs::metadata(&dir).map_err(|e| Error::io(&dir, "open store directory", e))?;
        if !meta.is_dir() {
            return Err(Error::NotARegularFile {
                path: dir,
                why: "the store must be a directory",
            });
        }
        if dir.join(crate::rebuild::JOURNAL).exists() {
            Table::open(dir.join(KEYS_INDEX), opts)?.settle()?;
        }
        Ok(Store {
            keys: Table::open(dir.join(KEYS_INDEX), opts)?,
            denied: Table::open(dir.join(DENIED_INDEX), opts)?,
            dir,
        })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `keys` bank's table.
    pub fn keys_table(&self) -> &Table {
        &self.keys
    }

    /// The `denied_keys` bank's table.
    pub fn denied_table(&self) -> &Table {
        &self.denied
    }

    /// The entry of `id` in the `keys` bank.
    pub fn get(&self, id: &MinionId) -> Result<Option<KeyEntry>> {
        match self.keys.get(id.as_str().as_bytes())? {
            Some(r) => entry_of(&self.keys, id.as_str().as_bytes(), r).map(Some),
            None => Ok(None),
        }
    }

    /// The entries of many ids, looked up with overlapped memory accesses
    /// (see [`Table::get_many`]): for the burst of authentications after a
    /// master restart.
    pub fn get_many(&self, ids: &[MinionId]) -> Result<Vec<Option<KeyEntry>>> {
        let raw: Vec<&[u8]> = ids.iter().map(|i| i.as_str().as_bytes()).collect();
        self.keys
            .get_many(&raw)?
            .into_iter()
            .zip(&raw)
            .map(|(r, id)| r.map(|r| entry_of(&self.keys, id, r)).transpose())
            .collect()
    }

    /// Whether `id` is in the `keys` bank (in any state).
    pub fn contains(&self, id: &MinionId) -> Result<bool> {
        Ok(self.get(id)?.is_some())
    }

    /// The denied key of `id`, if there is one (trailing NULs stripped, as
    /// Salt reads it).
    pub fn denied(&self, id: &MinionId) -> Result<Option<Vec<u8>>> {
        Ok(self
            .denied
            .get(id.as_str().as_bytes())?
            .map(|r| strip_nuls(r.value)))
    }

    /// Whether `id` has a denied key.
    pub fn is_denied(&self, id: &MinionId) -> Result<bool> {
        Ok(self.denied(id)?.is_some())
    }

    /// The `keys` bank in roster order (Salt's listing order), optionally
    /// only one state. Entries that cannot be read back intact come as
    /// errors; iteration goes on after them.
    pub fn keys(
        &self,
        state: Option<KeyState>,
    ) -> Result<impl Iterator<Item = Result<(String, KeyEntry)>> + '_> {
        Ok(self.keys.iter()?.filter_map(move |r| {
            let r = match r {
                Ok(r) => r,
                Err(e) => return Some(Err(e)),
            };
            let id = String::from_utf8_lossy(&r.id).into_owned();
            let e = Entry {
                value: r.value,
                mtime: r.mtime,
                slot: r.slot,
            };
            match entry_of(&self.keys, &r.id, e) {
                Ok(e) if state.is_none_or(|s| s == e.state) => Some(Ok((id, e))),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        }))
    }

    /// The `denied_keys` bank in roster order: (id, key).
    pub fn denied_keys(&self) -> Result<impl Iterator<Item = Result<(String, Vec<u8>)>> + '_> {
        Ok(self.denied.iter()?.map(|r| {
            r.map(|r| {
                (
                    String::from_utf8_lossy(&r.id).into_owned(),
                    strip_nuls(r.value),
                )
            })
        }))
    }

    /// Keys per state; entries that cannot be read are not counted.
    pub fn counts(&self) -> Result<Counts> {
        let mut c = Counts::default();
        for (_, e) in self.keys(None)?.flatten() {
            match e.state {
                KeyState::Accepted => c.accepted += 1,
                KeyState::Pending => c.pending += 1,
                KeyState::Rejected => c.rejected += 1,
            }
        }
        c.denied = self.denied_keys()?.flatten().count() as u64;
        Ok(c)
    }

    /// Header counters and heap sizes of both banks.
    pub fn stats(&self) -> Result<StoreStats> {
        Ok(StoreStats {
            keys: self.keys.stats()?,
            denied_keys: self.denied.stats()?,
        })
    }

    /// Puts `id` into the `keys` bank with `state` and `pem`, durably.
    pub fn put(&self, id: &MinionId, state: KeyState, pem: &[u8]) -> Result<()> {
        self.batch(|b| b.put(id, state, pem)).map(|_| ())
    }

    /// Gives `id` a new state, keeping its key. Returns false when `id` is
    /// not in the `keys` bank.
    pub fn set_state(&self, id: &MinionId, state: KeyState) -> Result<bool> {
        self.batch(|b| b.set_state(id, state))
            .map(|(found, _)| found)
    }

    /// Stores a denied key for `id`, durably.
    pub fn deny(&self, id: &MinionId, pem: &[u8]) -> Result<()> {
        self.batch(|b| b.deny(id, pem)).map(|_| ())
    }

    /// Removes `id` from the `keys` bank. Returns whether it was there.
    pub fn remove(&self, id: &MinionId) -> Result<bool> {
        self.keys.remove(id.as_str().as_bytes())
    }

    /// Removes `id`'s denied key. Returns whether there was one.
    pub fn remove_denied(&self, id: &MinionId) -> Result<bool> {
        self.denied.remove(id.as_str().as_bytes())
    }

    /// Applies several writes under the banks' locks, made durable by one
    /// round of fsyncs per bank at the end. The `keys` lock is taken first,
    /// then, only when the batch writes to it, the `denied_keys` one; both
    /// banks' writes are planned before any is made, so a batch that fails
    /// (an error from `f`, [`Error::TableFull`]) changes nothing. Inserts
    /// may take the slots the batch's own removals free. Not atomic across
    /// a crash: each id is then as before or as after.
    pub fn batch<T>(
        &self,
        f: impl FnOnce(&mut Batch<'_, '_>) -> Result<T>,
    ) -> Result<(T, Applied)> {
        self.keys.with_writer(|kix| {
            let mut keys = Txn::new(&self.keys);
            let mut denied_ops: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
            let out = f(&mut Batch {
                keys: &mut keys,
                denied: &mut denied_ops,
            })?;
            if denied_ops.is_empty() {
                let plan = self.keys.plan(kix, keys)?;
                return Ok((out, self.keys.apply(kix, plan)?));
            }
            // Both banks locked (keys first, always), both planned before
            // either is written: a batch that does not fit changes nothing.
            self.denied.with_writer(|dix| {
                let mut denied = Txn::new(&self.denied);
                for (id, v) in &denied_ops {
                    match v {
                        Some(v) => denied.put(id, v)?,
                        None => denied.remove(id)?,
                    }
                }
                let kplan = self.keys.plan(kix, keys)?;
                let dplan = self.denied.plan(dix, denied)?;
                let mut applied = self.keys.apply(kix, kplan)?;
                let a = self.denied.apply(dix, dplan)?;
                applied.inserted += a.inserted;
                applied.updated += a.updated;
                applied.removed += a.removed;
                Ok((out, applied))
            })
        })
    }

    /// Compacts both banks (see [`crate::rebuild::compact`]), optionally into
    /// tables of `size` slots, in one atomic rebuild: both banks are locked
    /// and rebuilt together, so a failure (an entry that cannot be read, a
    /// size too small) or a crash leaves both as they were, or both new.
    pub fn compact(&self, size: Option<u64>) -> Result<()> {
        let (kt, dt) = (&self.keys, &self.denied);
        kt.exclusive(|| {
            dt.exclusive(|| {
                crate::rebuild::remove_temps_of(kt.path())?;
                crate::rebuild::remove_temps_of(dt.path())?;
                let kimg = crate::rebuild::compacted(kt, size)?;
                let dimg = crate::rebuild::compacted(dt, size)?;
                let mut c = crate::rebuild::Commit::default();
                c.stage(kt.path(), kimg, &kt.ownership())?;
                c.stage(dt.path(), dimg, &dt.ownership())?;
                c.apply()
            })
        })
    }
}

/// The writes of a [`Store::batch`].
pub struct Batch<'t, 'a> {
    keys: &'a mut Txn<'t>,
    denied: &'a mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

fn check_pem(id: &MinionId, pem: &[u8]) -> Result<()> {
    if pem.is_empty() {
        return Err(Error::InvalidId {
            id: id.to_string(),
            why: "its public key is empty",
        });
    }
    Ok(())
}

impl Batch<'_, '_> {
    /// Stages a put into the `keys` bank.
    pub fn put(&mut self, id: &MinionId, state: KeyState, pem: &[u8]) -> Result<()> {
        check_pem(id, pem)?;
        self.keys
            .put(id.as_str().as_bytes(), &encode_key_value(state, pem))
    }

    /// Stages a state change; false when `id` is not in the `keys` bank.
    pub fn set_state(&mut self, id: &MinionId, state: KeyState) -> Result<bool> {
        let Some(mut v) = self.keys.get(id.as_str().as_bytes())? else {
            return Ok(false);
        };
        if decode_key_value(&v).is_none() {
            return Err(Error::Corrupt {
                path: PathBuf::from(KEYS_INDEX),
                id: Some(id.to_string()),
                why: "value is not [state][public key]".into(),
            });
        }
        v[0] = state.byte();
        self.keys.put(id.as_str().as_bytes(), &v)?;
        Ok(true)
    }

    /// Stages a removal from the `keys` bank.
    pub fn remove(&mut self, id: &MinionId) -> Result<()> {
        self.keys.remove(id.as_str().as_bytes())
    }

    /// Stages a denied key.
    pub fn deny(&mut self, id: &MinionId, pem: &[u8]) -> Result<()> {
        check_pem(id, pem)?;
        self.keys.table().check_id(id.as_str().as_bytes())?;
        self.denied
            .push((id.as_str().as_bytes().to_vec(), Some(pem.to_vec())));
        Ok(())
    }

    /// Stages the removal of a denied key.
    pub fn remove_denied(&mut self, id: &MinionId) -> Result<()> {
        self.keys.table().check_id(id.as_str().as_bytes())?;
        self.denied.push((id.as_str().as_bytes().to_vec(), None));
        Ok(())
    }

    /// The current entry of `id` as this batch would leave it.
    pub fn get(&self, id: &MinionId) -> Result<Option<(KeyState, Vec<u8>)>> {
        Ok(self
            .keys
            .get(id.as_str().as_bytes())?
            .and_then(|v| decode_key_value(&v).map(|(s, p)| (s, p.to_vec()))))
    }
}

#[allow(unused)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<Store>();
    f::<table::Table>();
}
