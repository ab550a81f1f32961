//! [`Open`]: the open files of one store directory for one process (the
//! `keys` and `denied_keys` banks, the `master_keys` bank), opened on first
//! use, with the checks every function of the driver makes first (a legacy
//! tree beside no store, see [`crate::legacy`]) and the master's public key
//! file kept in step (see [`crate::master_pub`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwapOption;
use keycache::audit::Actor;
use keycache::table::Table;
use keycache::tree::TreeSync;
use keycache::{OpenOptions, Params, Store};

use crate::audit::Who;
use crate::master_pub::MasterPub;
use crate::values::Bank;
use crate::{fork_generation, DriverKey};

/// The open files of one store, for one process (see [`crate::Driver`]).
pub(crate) struct Open {
    pub(crate) generation: u64,
    pub(crate) pid: u32,
    pub(crate) dir: PathBuf,
    opts: OpenOptions,
    pub(crate) tree: TreeSync,
    store: ArcSwapOption<Store>,
    master: ArcSwapOption<Table>,
    opening: Mutex<()>,
    /// The master's `pki_dir` when this is its own store directory.
    master_pki_dir: Option<PathBuf>,
    master_id: String,
    /// `<pki_dir>/master.pub`, kept in step with the bank.
    master_pub: Option<MasterPub>,
    /// A bank file was seen, or no legacy key tree (see `crate::legacy`).
    vetted: AtomicBool,
    /// A tree write left unfinished by a killed writer was looked for
    /// ([`Open::resume_once`]).
    resume_checked: AtomicBool,
    /// Who this process's changes are recorded as (see [`crate::audit`]).
    who: Who,
    /// The actor of [`Open::who`], made on first use in this process.
    actor: OnceLock<Actor>,
    /// etcd mode: the local handles write nothing of the banks etcd holds
    /// (the replicator records what it applies), so they record nothing.
    through_etcd: bool,
}

/// Open options of the layout Salt's options give: (`mmap_key_size`,
/// `mmap_key_slot_size`, `mmap_key_id_size`, `mmap_key_max_segment_bytes`).
pub(crate) fn options(
    (size, slot_size, id_size, max_segment_bytes): (u64, usize, usize, u64),
) -> OpenOptions {
    OpenOptions {
        params: Params {
            size,
            slot_size,
            id_size,
            max_segment_bytes,
        },
        ..OpenOptions::default()
    }
}

impl Open {
    /// Handles for `key`, opened on first use; `through_etcd`: the driver's
    /// door writes the banks etcd holds through etcd ([`crate::door`]).
    pub(crate) fn new(key: &DriverKey, through_etcd: bool) -> Open {
        Open {
            generation: fork_generation(),
            pid: std::process::id(),
            dir: PathBuf::from(&key.dir),
            opts: options(key.params),
            tree: key.tree,
            store: ArcSwapOption::empty(),
            master: ArcSwapOption::empty(),
            opening: Mutex::new(()),
            master_pki_dir: key.master_pki_dir.as_ref().map(PathBuf::from),
            master_id: key.master_id.clone(),
            master_pub: key
                .master_pki_dir
                .as_ref()
                .map(|d| MasterPub::new(Path::new(d), &key.master_id)),
            vetted: AtomicBool::new(false),
            resume_checked: AtomicBool::new(false),
            who: key.recorded_as.clone(),
            actor: OnceLock::new(),
            through_etcd,
        }
    }

    /// Who this process's changes are recorded as: made on first use, in
    /// the process that uses it (see [`crate::audit`]).
    pub(crate) fn actor(&self) -> &Actor {
        self.actor.get_or_init(|| self.who.actor())
    }

    /// Once per process, on first use: finishes the key tree of a write
    /// that a killed writer left unfinished ([`Store::resume_tree`]), when
    /// there is a store. What was done, or why it could not be, for the
    /// master's log (a failure here fails no call: the next write of the
    /// store tries again).
    pub(crate) fn resume_once(&self) -> Option<String> {
        if self.resume_checked.swap(true, Ordering::AcqRel)
            || !self.dir.join(keycache::format::KEYS_INDEX).exists()
        {
            return None;
        }
        match self.store().and_then(|s| s.resume_tree()) {
            Ok(Some(r)) => Some(format!("keycache: {}: {r}", self.dir.display())),
            Ok(None) => None,
            Err(e) => Some(format!(
                "keycache: {}: could not finish an interrupted write of the key tree: {e}",
                self.dir.display()
            )),
        }
    }

    /// What this process's writes finished of interrupted tree writes
    /// ([`Store::take_resumed`]), for the master's log.
    pub(crate) fn resumed(&self) -> Vec<String> {
        match self.store.load_full() {
            Some(s) => s
                .take_resumed()
                .iter()
                .map(|r| format!("keycache: {}: {r}", self.dir.display()))
                .collect(),
            None => Vec::new(),
        }
    }

    /// A `minions/<id>` missing for an id the store holds accepted, with
    /// the key tree kept: Salt's `validate_token` refuses that minion's
    /// every request. Never written back here (a file removed by hand may
    /// be a revocation in `localfs_key` habits): said, for the master's
    /// log, at the minion's next sign-in (its fetch of the key).
    pub(crate) fn missing_key_file(&self, id: &[u8]) -> Option<String> {
        if !self.tree.is_on() {
            return None;
        }
        let name = std::str::from_utf8(id).ok()?;
        keycache::id::validate(name).ok()?;
        let path = self
            .dir
            .join(keycache::tree::TreeDir::Minions.name())
            .join(name);
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
                "keycache: {}: the store holds {name:?} accepted but {} is missing: Salt's \
                 validate_token refuses every request of that minion. If the file was removed \
                 to revoke the key, delete or reject the key (salt-key -d/-r); else \
                 `salt-run keycache.verify repair=True` (or the command: `keycache verify \
                 --repair {}`) writes it back",
                self.dir.display(),
                path.display(),
                self.dir.display()
            )),
            _ => None,
        }
    }

    /// Refuses a `localfs_key` tree beside no store (see `crate::legacy`):
    /// checked until a bank file is seen or the directory has no legacy
    /// key, then never again.
    pub(crate) fn vet(&self) -> Result<(), String> {
        if self.vetted.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(why) =
            crate::legacy::refusal(&self.dir, self.master_pki_dir.as_deref(), &self.master_id)
        {
            return Err(why);
        }
        self.vetted.store(true, Ordering::Release);
        Ok(())
    }

    /// Brings `<pki_dir>/master.pub` in step with the bank after a write
    /// of `name` (when it is the master's public key).
    pub(crate) fn sync_master_pub(&self, name: &[u8]) -> keycache::Result<()> {
        match &self.master_pub {
            Some(mp) if mp.concerns(name) => mp.sync(&*self.master()?),
            _ => Ok(()),
        }
    }

    /// What `slot` holds, else what `open` opens, made once (under
    /// `opening`, the store's directory made first) and kept in `slot`.
    fn once<T>(
        &self,
        slot: &ArcSwapOption<T>,
        open: impl FnOnce() -> keycache::Result<T>,
    ) -> keycache::Result<Arc<T>> {
        if let Some(v) = slot.load_full() {
            return Ok(v);
        }
        let _g = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = slot.load_full() {
            return Ok(v);
        }
        make_dir(&self.dir)?;
        let v = Arc::new(open()?);
        slot.store(Some(v.clone()));
        Ok(v)
    }

    /// The `keys` and `denied_keys` banks; their writes record every
    /// change in the store's audit trail as [`Open::actor`]'s (not in etcd
    /// mode: those writes go through etcd).
    pub(crate) fn store(&self) -> keycache::Result<Arc<Store>> {
        self.once(&self.store, || {
            let mut s = Store::open_with(&self.dir, &self.opts)?.with_tree(self.tree);
            if !self.through_etcd {
                s.set_audit(Some(self.actor().clone()));
            }
            Ok(s)
        })
    }

    /// The `master_keys` bank (its files mode 0600 or narrower).
    pub(crate) fn master(&self) -> keycache::Result<Arc<Table>> {
        self.once(&self.master, || {
            let t = keycache::master_keys::open_bank(&self.dir, &self.opts)?;
            if let Some(mp) = &self.master_pub {
                mp.sync(&t)?;
            }
            Ok(t)
        })
    }

    /// The table of `bank`.
    pub(crate) fn table(&self, bank: Bank) -> keycache::Result<TableRef> {
        Ok(match bank {
            Bank::Keys => TableRef::Keys(self.store()?),
            Bank::Denied => TableRef::Denied(self.store()?),
            Bank::Master => TableRef::Master(self.master()?),
        })
    }

    /// Forgets the handles of `bank`'s files (after they were removed).
    pub(crate) fn forget(&self, bank: Bank) {
        match bank {
            Bank::Master => self.master.store(None),
            _ => self.store.store(None),
        }
    }
}

/// A table of an [`Open`], kept alive by its owner.
pub(crate) enum TableRef {
    Keys(Arc<Store>),
    Denied(Arc<Store>),
    Master(Arc<Table>),
}

impl std::ops::Deref for TableRef {
    type Target = Table;
    fn deref(&self) -> &Table {
        match self {
            TableRef::Keys(s) => s.keys_table(),
            TableRef::Denied(s) => s.denied_table(),
            TableRef::Master(t) => t,
        }
    }
}

/// Creates the store directory, as mmap_key does (`os.makedirs`), mode 0700.
pub(crate) fn make_dir(dir: &Path) -> keycache::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| keycache::Error::Io {
            path: dir.to_path_buf(),
            op: "create directory",
            source: e,
        })
}
