//! The minion-key store: Salt's `keys` and `denied_keys` banks in one
//! directory, over two [`Table`]s.
//!
//! Values of the `keys` bank are `[state: u8][PEM]` (1 accepted, 2 pending,
//! 3 rejected); values of `denied_keys` are the PEM bytes. The same id may be
//! in both banks: a denied key is a different key presented under an id.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::Params;
use crate::format::{DENIED_INDEX, KEYS_INDEX};
use crate::id::MinionId;
pub use crate::key::{decode_key_value, encode_key_value, KeyBatch, KeyEntry, KeyRef, KeyState};
use crate::table::{self, Applied, Found, OpenOptions, Stored, Table, TableStats, Txn, View};
use crate::tree::{want_of, Want};
use crate::tree::{TreeChanges, TreeSync};

mod batch;
mod reader;
mod replace;
mod resume;
mod tree_source;

pub use batch::Batch;
pub use reader::Reader;
pub use replace::Contents;

/// What the tree must hold for each id of a batch.
type Wants = Vec<(MinionId, Want)>;
/// Removals of a batch to log: (from `denied_keys`, id).
type Removed = Vec<(bool, Vec<u8>)>;

/// Keys per state, and denied keys.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StoreStats {
    /// The `keys` bank.
    pub keys: TableStats,
    /// The `denied_keys` bank.
    pub denied_keys: TableStats,
}

/// Salt strips trailing NULs from denied keys when reading them.
fn strip_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// Turns a `keys` bank value into an entry, reusing its buffer.
fn entry_of(t: &Table, id: &[u8], r: Stored) -> Result<KeyEntry> {
    let mut v = r.value;
    let Some(state) = decode_key_value(&v).map(|(s, _)| s) else {
        return Err(not_a_key(t, id, r.slot, v.len()));
    };
    v.copy_within(1.., 0);
    v.pop();
    Ok(KeyEntry {
        state,
        public_key: v,
        mtime: r.mtime,
    })
}

/// The entry that a lookup of `id` found (`f`, its value in `buf`).
fn key_ref<'b>(
    t: &Table,
    id: &MinionId,
    f: Option<Found>,
    buf: &'b [u8],
) -> Result<Option<KeyRef<'b>>> {
    let Some(f) = f else {
        return Ok(None);
    };
    match decode_key_value(f.value(buf)) {
        Some((state, public_key)) => Ok(Some(KeyRef {
            state,
            public_key,
            mtime: f.mtime,
        })),
        None => Err(not_a_key(t, id.as_ref(), f.slot, f.len)),
    }
}

/// The error for a `keys` bank value that is not `[state][public key]`.
fn not_a_key(t: &Table, id: &[u8], slot: u64, len: usize) -> Error {
    Error::Corrupt {
        path: t.path().into(),
        id: Some(String::from_utf8_lossy(id).into_owned()),
        why: format!("slot {slot}: value of {len} bytes is not [state 1..3][public key]"),
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
    tree: TreeSync,
    /// What this handle's writes finished of interrupted tree writes
    /// ([`Store::take_resumed`]).
    resumed: std::sync::Mutex<Vec<crate::tree::Resumed>>,
    /// Who this handle's writes are recorded as ([`Store::set_audit`]).
    audit: Option<crate::audit::Actor>,
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
            Table::open(dir.join(KEYS_INDEX), opts)?.finish_interrupted()?;
        }
        // Salt gives both banks one table size: index files of two lengths
        // mean one is damaged (or was replaced by hand), and neither can be
        // blamed alone.
        let len = |n: &str| {
            std::fs::symlink_metadata(dir.join(n))
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len())
        };
        if let (Some(k), Some(d)) = (len(KEYS_INDEX), len(DENIED_INDEX)) {
            if k != d {
                return Err(Error::Mismatch {
                    path: dir.clone(),
                    what: "index files of the two banks (one table size in Salt)",
                    expected: "the same length".into(),
                    found: format!(
                        "{KEYS_INDEX} {k} bytes, {DENIED_INDEX} {d} bytes; one of them is damaged \
                         (verify the store with the size of mmap_key_size)"
                    ),
                });
            }
        }
        Ok(Store {
            keys: Table::open(dir.join(KEYS_INDEX), opts)?,
            denied: Table::open(dir.join(DENIED_INDEX), opts)?,
            dir,
            tree: TreeSync::Off,
            resumed: Default::default(),
            audit: None,
        })
    }

    /// Whether this handle's writes keep the `localfs_key` tree of the
    /// store's directory in step with the banks (see [`crate::tree`]): off
    /// unless set. Salt 3008.5's `validate_token` reads `minions/<id>` from
    /// that directory on every AES request, so a master whose Salt still
    /// reads the tree (a migrated master: [`TreeSync::auto`]) needs it on.
    pub fn set_tree(&mut self, sync: TreeSync) {
        self.tree = sync;
    }

    /// [`Store::set_tree`], as a builder.
    pub fn with_tree(mut self, sync: TreeSync) -> Store {
        self.set_tree(sync);
        self
    }

    /// Records every change this handle's writes make in the store's
    /// audit trail ([`crate::audit`]), as made by `actor`: appended under
    /// the `keys` bank's lock, durably, before the banks are written. Off
    /// (None) unless set: a replica's writer records what etcd's records
    /// say instead.
    pub fn set_audit(&mut self, actor: Option<crate::audit::Actor>) {
        self.audit = actor;
    }

    /// Who this handle's writes are recorded as, if they are.
    pub fn audit(&self) -> Option<&crate::audit::Actor> {
        self.audit.as_ref()
    }

    /// Whether this handle's writes keep the tree in step.
    pub fn tree(&self) -> TreeSync {
        self.tree
    }

    /// Checks that the layout this store was opened with is the layout of
    /// both banks' files (see [`Table::check_layout`]).
    pub fn check_layout(&self) -> Result<()> {
        self.keys.check_layout()?;
        self.denied.check_layout()
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
        match self.keys.get_valid(id.as_ref())? {
            Some(r) => entry_of(&self.keys, id.as_ref(), r).map(Some),
            None => Ok(None),
        }
    }

    /// The entry of `id`, read into `buf` (cleared first) and borrowed
    /// from it: a buffer reused across lookups makes them allocation-free.
    pub fn get_in<'b>(&self, id: &MinionId, buf: &'b mut Vec<u8>) -> Result<Option<KeyRef<'b>>> {
        buf.clear();
        let f = self.keys.get_valid_into(id.as_ref(), buf)?;
        key_ref(&self.keys, id, f, buf)
    }

    /// A handle for a thread's loop of lookups: the same answers as the
    /// store's own, at less cost per lookup (see [`Reader`]).
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            store: self,
            keys: self.keys.view(),
            denied: self.denied.view(),
        }
    }

    /// The entries of many ids, looked up with overlapped memory accesses
    /// (see [`Table::get_many`]): for the burst of authentications after a
    /// master restart.
    pub fn get_many(&self, ids: &[MinionId]) -> Result<Vec<Option<KeyEntry>>> {
        let mut raw = Vec::with_capacity(ids.len());
        self.keys.get_many_valid(ids, &mut Vec::new(), |f, buf| {
            raw.push(f.map(|f| Stored {
                value: std::mem::take(buf),
                mtime: f.mtime,
                slot: f.slot,
            }))
        })?;
        raw.into_iter()
            .zip(ids)
            .map(|(r, id)| r.map(|r| entry_of(&self.keys, id.as_ref(), r)).transpose())
            .collect()
    }

    /// [`Store::get_many`] into `batch` (its previous contents dropped): the
    /// same lookups, without an allocation per key. `batch.get(i)` is the
    /// entry of `ids[i]`.
    pub fn get_many_in(&self, ids: &[MinionId], batch: &mut KeyBatch) -> Result<()> {
        let KeyBatch { buf, entries } = batch;
        buf.clear();
        entries.clear();
        entries.reserve(ids.len());
        let mut bad = None;
        self.keys.get_many_valid(ids, buf, |f, buf| {
            let e = f.and_then(|f| match decode_key_value(f.value(buf)) {
                Some((state, _)) => Some((state, f)),
                None => {
                    bad = bad.or(Some((entries.len(), f)));
                    None
                }
            });
            entries.push(e);
        })?;
        if let Some((i, f)) = bad {
            entries.clear();
            return Err(not_a_key(&self.keys, ids[i].as_ref(), f.slot, f.len));
        }
        Ok(())
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
            .get_valid(id.as_ref())?
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
            let e = Stored {
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
        if crate::files::file_id(self.keys.path()).is_none() {
            // No bank yet: nothing to remove, and no bank created for it.
            return self.keys.remove(id.as_str().as_bytes());
        }
        self.batch(|b| {
            let was = b.get(id)?.is_some();
            b.remove(id)?;
            Ok(was)
        })
        .map(|(was, _)| was)
    }

    /// Removes `id`'s denied key. Returns whether there was one.
    pub fn remove_denied(&self, id: &MinionId) -> Result<bool> {
        if crate::files::file_id(self.denied.path()).is_none() {
            return self.denied.remove(id.as_str().as_bytes());
        }
        let was = self.denied(id)?.is_some();
        self.batch(|b| b.remove_denied(id))?;
        Ok(was)
    }

    /// Runs `f`, the writes of a batch, into `keys` and `denied_ops`; with
    /// the tree on, also returns what the tree must hold for each id the
    /// batch touched once it is in; and, with `log`, the `keys` entries it
    /// removes.
    fn stage<'t, T>(
        &self,
        f: impl FnOnce(&mut Batch<'_, '_>) -> Result<T>,
        keys: &mut Txn<'t>,
        denied_ops: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
        log: bool,
    ) -> Result<(T, Option<Wants>, Removed, Vec<crate::audit::Record>)> {
        let sync = self.tree.is_on();
        let mut touched: Vec<MinionId> = Vec::new();
        let mut removed = Vec::new();
        let out = f(&mut Batch {
            keys,
            denied: denied_ops,
            touched: (sync || self.audit.is_some()).then_some(&mut touched),
            removed: log.then_some(&mut removed),
        })?;
        let (wants, records) =
            self.after_batch(self.audit.as_ref(), sync, keys, denied_ops, touched)?;
        Ok((out, wants, removed, records))
    }

    /// What a staged batch leaves, in one pass over the ids it touched (in
    /// the order first touched), each looked up once: with `actor`, the
    /// audit records (each id as the banks hold it, nothing being written
    /// yet, and as the batch leaves it); with `sync`, what the tree must
    /// hold for each id once the batch is in.
    fn after_batch(
        &self,
        actor: Option<&crate::audit::Actor>,
        sync: bool,
        keys: &Txn<'_>,
        denied_ops: &[(Vec<u8>, Option<Vec<u8>>)],
        mut touched: Vec<MinionId>,
    ) -> Result<(Option<Wants>, Vec<crate::audit::Record>)> {
        use crate::audit::{Entries, Record};
        let now = std::time::SystemTime::now();
        let mut seen = std::collections::HashSet::new();
        touched.retain(|id| seen.insert(id.clone()));
        let mut records = Vec::new();
        let mut wants = Vec::with_capacity(if sync { touched.len() } else { 0 });
        // A `denied_keys` bank without files (most stores) is looked for
        // once, not by a failed `stat` per id.
        let denied_files = (sync || actor.is_some()) && self.denied.has_index_now()?;
        let denied = |id: &MinionId| match denied_files {
            true => self.denied(id),
            false => Ok(None),
        };
        for id in touched {
            let k = id.as_str().as_bytes();
            let key_after = keys
                .get(k)?
                .and_then(|v| decode_key_value(&v).map(|(s, p)| (s, p.to_vec())));
            let op = denied_ops.iter().rev().find(|(d, _)| d.as_slice() == k);
            // `denied_keys` as the banks hold it, read once, only when an
            // id's denied entry is not the batch's.
            let mut held: Option<Result<Option<Vec<u8>>>> = None;
            if let Some(actor) = actor {
                // An entry that cannot be read (a lost segment) is recorded
                // as no key: its removal must not fail on its record.
                let read = denied(&id);
                let denied_before = read.as_ref().ok().cloned().flatten();
                held = Some(read);
                let before = Entries {
                    key: self
                        .get(&id)
                        .ok()
                        .flatten()
                        .map(|e| (e.state, e.public_key)),
                    denied: denied_before.clone(),
                };
                let after = Entries {
                    key: key_after.clone(),
                    denied: match op {
                        Some((_, v)) => v.clone(),
                        None => denied_before,
                    },
                };
                records.extend(Record::of_change(actor, id.as_str(), &before, &after, now));
            }
            if sync {
                let d = match op {
                    Some((_, v)) => v.clone().map(strip_nuls),
                    None => match held {
                        Some(read) => read?,
                        None => denied(&id)?,
                    },
                };
                wants.push((id, want_of(key_after, d)));
            }
        }
        Ok((sync.then_some(wants), records))
    }

    /// Plans both banks' writes of a batch, then applies them between the
    /// two halves of the tree's writes (with `wants`). Both locks are held.
    /// With `log`, the removals (those of `keys` given, those of
    /// `denied_keys` found here) are logged for the history first.
    // The two logs written before the banks (removals, audit) travel
    // beside the plans: one argument each.
    #[allow(clippy::too_many_arguments)]
    fn apply_both(
        &self,
        kix: &table::Index,
        dix: &table::Index,
        keys: Txn<'_>,
        denied_ops: &[(Vec<u8>, Option<Vec<u8>>)],
        wants: Option<Vec<(MinionId, Want)>>,
        mut log: Option<&mut Removed>,
        records: &[crate::audit::Record],
    ) -> Result<(Applied, TreeChanges)> {
        let mut denied = Txn::new(&self.denied);
        for (id, v) in denied_ops {
            match v {
                Some(v) => denied.put(id, v)?,
                None => {
                    if let Some(log) = log.as_deref_mut() {
                        // Unreadable (a lost segment): removed and logged.
                        if denied.get(id).map_or(true, |v| v.is_some()) {
                            log.push((true, id.clone()));
                        }
                    }
                    denied.remove(id)?
                }
            }
        }
        let kplan = self.keys.plan(kix, keys)?;
        let dplan = self.denied.plan(dix, denied)?;
        if let Some(log) = log {
            crate::removals::append(&self.dir, log)?;
        }
        crate::audit::append(&self.dir, records)?;
        let no_denied = denied_ops.is_empty();
        // A key moving between banks is written where it goes before it is
        // removed where it was: a deny (a put into `denied_keys`, a removal
        // from `keys`) writes `denied_keys` first, anything else `keys`
        // first. A kill in between then leaves the key in both banks, never
        // in neither (a pending key lost).
        let denied_first = denied_ops.iter().any(|(_, v)| v.is_some());
        self.with_tree_sync(wants, || {
            let mut applied = Applied::default();
            let mut add = |a: Applied| {
                applied.inserted += a.inserted;
                applied.updated += a.updated;
                applied.removed += a.removed;
            };
            if denied_first {
                add(self.denied.apply(dix, dplan)?);
                add(self.keys.apply(kix, kplan)?);
            } else {
                add(self.keys.apply(kix, kplan)?);
                if !no_denied {
                    add(self.denied.apply(dix, dplan)?);
                }
            }
            Ok(applied)
        })
    }

    /// Runs `apply` (the bank writes of a batch) between the two halves of
    /// the tree's writes, when `wants` is given (see [`crate::tree`]). When
    /// `apply` fails, the tree is brought in step with whatever the banks
    /// then hold, as far as it can be, and `apply`'s error returned.
    fn with_tree_sync(
        &self,
        wants: Option<Vec<(MinionId, Want)>>,
        apply: impl FnOnce() -> Result<Applied>,
    ) -> Result<(Applied, TreeChanges)> {
        let Some(wants) = wants else {
            return Ok((apply()?, TreeChanges::default()));
        };
        let mut sync = crate::tree::Sync::plan(self, &wants)?;
        sync.before()?;
        match apply() {
            Ok(applied) => Ok((applied, sync.after(&wants)?)),
            Err(e) => {
                let now: Result<Vec<(MinionId, Want)>> = wants
                    .into_iter()
                    .map(|(id, _)| {
                        let k = self.get(&id)?.map(|e| (e.state, e.public_key));
                        let d = self.denied(&id)?;
                        Ok((id, want_of(k, d)))
                    })
                    .collect();
                if let Ok(now) = now {
                    let _ = sync.after(&now);
                }
                Err(e)
            }
        }
    }

    /// Compacts both banks (see [`crate::rebuild::compact`]), optionally into
    /// tables of `size` slots, in one atomic rebuild, together with the
    /// directory's `master_keys` bank when it has one: Salt opens all three
    /// with one `mmap_key_size` (`MasterKeys` refuses an index of another
    /// size), so `master_keys` is rebuilt into the key banks' new size (or,
    /// without `size`, their current one), its files 0600 or narrower. The
    /// banks are locked (`keys`, `denied_keys`, `master_keys`) and rebuilt
    /// together, so a failure (an entry that cannot be read, a size too
    /// small) or a crash leaves all as they were, or all new.
    pub fn compact(&self, size: Option<u64>) -> Result<()> {
        let (kt, dt) = (&self.keys, &self.denied);
        let mt = crate::master_keys::bank_beside(kt)?;
        let to = size.unwrap_or(kt.params().size);
        let mut tables = vec![kt, dt];
        tables.extend(mt.as_ref());
        crate::rebuild::replace(&tables, || {
            let mut images = vec![
                crate::rebuild::compacted(kt, size)?,
                crate::rebuild::compacted(dt, size)?,
            ];
            if let Some(m) = &mt {
                images.push(crate::rebuild::compacted(m, Some(to))?);
            }
            Ok(images)
        })
    }
}

#[allow(unused)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<Store>();
    f::<table::Table>();
}

impl Params {
    /// The layout of the store in `dir`: `opts.params` with the table size
    /// read off its index files (see [`Params::from_files`]), after finishing
    /// a rebuild that a crash interrupted (a compaction into another size is
    /// half-way between two sizes until its journal is done).
    pub fn detect(dir: impl AsRef<Path>, opts: &OpenOptions) -> Result<Params> {
        let dir = dir.as_ref();
        if dir.join(crate::rebuild::JOURNAL).exists() {
            crate::rebuild::finish_interrupted(dir, opts.rebuild_settle)?;
        }
        Ok(Params::from_files(dir, opts.params))
    }

    /// `base` with the table size read off the store's index files: the
    /// length of the first regular, non-empty `keys` or `denied_keys` index
    /// whose length is a multiple of `base.slot_size`, divided by it. `base`
    /// as it is when there is no such file. Reads only: a journal left by a
    /// crash is not finished (see [`Params::detect`]).
    pub fn from_files(dir: impl AsRef<Path>, base: Params) -> Params {
        let dir = dir.as_ref();
        let slot = base.slot_size as u64;
        let size = [KEYS_INDEX, DENIED_INDEX]
            .iter()
            .filter_map(|n| std::fs::symlink_metadata(dir.join(n)).ok())
            .find(|m| m.is_file() && slot > 0 && m.len() > 0 && m.len() % slot == 0)
            .map(|m| m.len() / slot);
        Params {
            size: size.unwrap_or(base.size),
            ..base
        }
    }
}
