//! The writes of a [`Store::batch`] ([`Batch`]).

use super::*;

/// The writes of a [`Store::batch`].
pub struct Batch<'t, 'a> {
    pub(super) keys: &'a mut Txn<'t>,
    pub(super) denied: &'a mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The ids written, when the tree follows the batch.
    pub(super) touched: Option<&'a mut Vec<MinionId>>,
    /// The ids this batch removes from `keys` that the bank (or the batch)
    /// held: logged for the store's history ([`crate::removals`]).
    pub(super) removed: Option<&'a mut Vec<(bool, Vec<u8>)>>,
}

pub(super) fn check_pem(id: &MinionId, pem: &[u8]) -> Result<()> {
    if pem.is_empty() {
        return Err(Error::InvalidId {
            id: id.to_string(),
            why: "its public key is empty",
        });
    }
    // Private key material never enters a minion bank.
    if crate::pem::holds_private_key(pem) {
        return Err(Error::InvalidId {
            id: id.to_string(),
            why: "its public key holds a private key block",
        });
    }
    Ok(())
}

impl Batch<'_, '_> {
    fn touch(&mut self, id: &MinionId) {
        if let Some(t) = self.touched.as_deref_mut() {
            t.push(id.clone());
        }
    }

    /// Stages a put into the `keys` bank.
    pub fn put(&mut self, id: &MinionId, state: KeyState, pem: &[u8]) -> Result<()> {
        check_pem(id, pem)?;
        self.keys
            .put(id.as_str().as_bytes(), &encode_key_value(state, pem))?;
        self.touch(id);
        Ok(())
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
        self.touch(id);
        Ok(true)
    }

    /// Stages a removal from the `keys` bank.
    pub fn remove(&mut self, id: &MinionId) -> Result<()> {
        let k = id.as_str().as_bytes();
        // An entry that cannot be read (a lost segment) is removed all the
        // same, and logged: a removal of something.
        if let Some(log) = self.removed.as_deref_mut() {
            if self.keys.get(k).map_or(true, |v| v.is_some()) {
                log.push((false, k.to_vec()));
            }
        }
        self.keys.remove(k)?;
        self.touch(id);
        Ok(())
    }

    /// Stages a denied key.
    pub fn deny(&mut self, id: &MinionId, pem: &[u8]) -> Result<()> {
        check_pem(id, pem)?;
        self.keys.table().check_id(id.as_str().as_bytes())?;
        self.denied
            .push((id.as_str().as_bytes().to_vec(), Some(pem.to_vec())));
        self.touch(id);
        Ok(())
    }

    /// Stages the removal of a denied key.
    pub fn remove_denied(&mut self, id: &MinionId) -> Result<()> {
        self.keys.table().check_id(id.as_str().as_bytes())?;
        self.denied.push((id.as_str().as_bytes().to_vec(), None));
        self.touch(id);
        Ok(())
    }

    /// Brings the key tree of `id` in step with the banks when the batch is
    /// applied, whether or not the batch writes it (with the tree on).
    pub fn touch_tree(&mut self, id: &MinionId) {
        self.touch(id);
    }

    /// The current entry of `id` as this batch would leave it.
    pub fn get(&self, id: &MinionId) -> Result<Option<(KeyState, Vec<u8>)>> {
        Ok(self
            .keys
            .get(id.as_str().as_bytes())?
            .and_then(|v| decode_key_value(&v).map(|(s, p)| (s, p.to_vec()))))
    }
}

impl Store {
    /// Applies several writes under the banks' locks, made durable by one
    /// round of fsyncs per bank at the end. The `keys` lock is taken first,
    /// then, only when the batch writes to it, the `denied_keys` one; both
    /// banks' writes are planned before any is made, so a batch that fails
    /// (an error from `f`, [`Error::TableFull`]) changes nothing. Inserts
    /// may take the slots the batch's own removals free. Not atomic across
    /// a crash: each id is then as before or as after.
    ///
    /// With the tree on ([`Store::set_tree`]), the tree entries of every id
    /// the batch touches are brought in step too, under the same locks, in
    /// the order of [`crate::tree`]: a `minions/<id>` file the store will no
    /// longer vouch for is removed (durably) before the banks are written,
    /// new files are written after. An entry under an id's name that is not
    /// a regular file fails the batch before anything is written.
    pub fn batch<T>(
        &self,
        f: impl FnOnce(&mut Batch<'_, '_>) -> Result<T>,
    ) -> Result<(T, Applied)> {
        self.batch_with_tree(f)
            .map(|(out, applied, _)| (out, applied))
    }

    /// [`Store::batch`], also returning what it did to the tree (nothing
    /// when the tree is off).
    pub fn batch_with_tree<T>(
        &self,
        f: impl FnOnce(&mut Batch<'_, '_>) -> Result<T>,
    ) -> Result<(T, Applied, TreeChanges)> {
        // Removals are logged only in a store that keeps a history (else
        // nothing reads the log, and nothing is read for it).
        let log = crate::removals::kept_in(&self.dir);
        self.batch_inner(false, log, f, || Ok(()))
    }

    /// [`Store::batch_with_tree`] holding both banks' locks (`keys` first)
    /// from the start, so that what `f` reads of either bank (through the
    /// batch, or lock-free reads of the store) no other writer changes
    /// before the batch is applied. For writes that depend on both banks:
    /// a merge checks every entry it replaces.
    /// `after` runs once the banks (and the tree) are written, still under
    /// both locks.
    /// The errors of `f` and `after` are the caller's own (a crate over the
    /// engine has its own error type), the batch's converted into it.
    pub fn batch_locked<T, E: From<Error>>(
        &self,
        f: impl FnOnce(&mut Batch<'_, '_>) -> std::result::Result<T, E>,
        after: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<(T, Applied, TreeChanges), E> {
        // The caller's error, carried through the batch (which aborts on
        // it as on its own) and handed back as it was.
        let theirs = std::cell::RefCell::new(None);
        let keep = |e: E| {
            *theirs.borrow_mut() = Some(e);
            Error::Hook("the caller's batch failed".into())
        };
        // A merge records its removals in the history itself: no log.
        let r = self.batch_inner(
            true,
            false,
            |b| f(b).map_err(keep),
            || after().map_err(keep),
        );
        match (r, theirs.into_inner()) {
            (Ok(done), _) => Ok(done),
            (Err(Error::Hook(_)), Some(e)) => Err(e),
            (Err(e), _) => Err(e.into()),
        }
    }

    /// Wipes `bank`, as Salt's `flush(bank)` does, with the tree in step:
    /// with the tree on, removes the bank's entries in one batch, logged
    /// like any removal (every id its index names: those of its roster in
    /// order, then those of other occupied slots, whose records may not
    /// read), then the bank's files ([`Table::remove_files`]), all under
    /// the banks' locks. So no write lands between the ids read and the
    /// files removed (an entry written into files about to go, its
    /// `minions/<id>` file left vouching for a key no store holds). The
    /// locks are a batch's: `keys`, and `denied_keys` after it for a wipe
    /// of that bank (which creates the `keys` bank if missing). The lock
    /// file goes with the others: a writer that waited on it takes the new
    /// one ([`Table`]'s lock checks which file it holds). The handle's view
    /// of the bank is stale after: reopen the store.
    pub fn wipe(&self, bank: crate::key::Bank) -> Result<()> {
        use crate::key::Bank;
        let log = crate::removals::kept_in(&self.dir);
        let index = self.table_of(bank).path().to_path_buf();
        // Entry by entry when the tree follows or the changes are recorded.
        let sync = self.tree.is_on() || self.audit.is_some();
        let remove = |b: &mut Batch<'_, '_>| {
            if !sync {
                return Ok(());
            }
            for id in self.ids_named(bank)? {
                match bank {
                    Bank::Keys => b.remove(&id)?,
                    Bank::Denied => b.remove_denied(&id)?,
                }
            }
            Ok(())
        };
        // `denied_keys` is locked for its own wipe (always after `keys`);
        // a wipe of `keys` writes only that bank, and creates no other.
        let both = bank == Bank::Denied;
        self.batch_inner(both, log, remove, || Table::remove_files(&index))
            .map(|_| ())
    }

    /// Every id `bank`'s index names: its roster's, in order, then those of
    /// the other occupied slots (an entry whose record cannot be read, in a
    /// missing segment, is still an id the tree may hold a file of).
    pub fn ids_named(&self, bank: crate::key::Bank) -> Result<Vec<MinionId>> {
        let t = self.table_of(bank);
        let mut ids: Vec<MinionId> = t
            .iter()?
            .filter_map(|r| r.ok())
            .filter_map(|r| MinionId::from_bytes(&r.id).ok())
            .collect();
        let listed: std::collections::HashSet<MinionId> = ids.iter().cloned().collect();
        let mut damaged: Vec<MinionId> = t
            .scan()?
            .slots
            .iter()
            .filter(|s| s.status == crate::format::OCCUPIED)
            .filter_map(|s| MinionId::from_bytes(&s.id).ok())
            .filter(|id| !listed.contains(id))
            .collect();
        damaged.sort_unstable();
        damaged.dedup();
        ids.extend(damaged);
        Ok(ids)
    }

    /// The table of `bank`.
    fn table_of(&self, bank: crate::key::Bank) -> &Table {
        match bank {
            crate::key::Bank::Keys => &self.keys,
            crate::key::Bank::Denied => &self.denied,
        }
    }

    /// A batch: with `both`, the `denied_keys` lock taken with the `keys`
    /// one before `f` runs (else only once `f` wrote to that bank); with
    /// `log`, its `keys` and `denied_keys` removals logged for the history;
    /// `after` run under the locks once the banks and the tree are written.
    fn batch_inner<T>(
        &self,
        both: bool,
        log: bool,
        f: impl FnOnce(&mut Batch<'_, '_>) -> Result<T>,
        after: impl FnOnce() -> Result<()>,
    ) -> Result<(T, Applied, TreeChanges)> {
        self.keys.with_writer(|kix| {
            // A tree write that a killed writer left unfinished first.
            self.resume_before_write()?;
            let mut keys = Txn::new(&self.keys);
            let mut denied_ops: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
            // Both banks planned before either is written (a batch that
            // does not fit changes nothing), between the tree's halves.
            let both_banks = |dix: &table::Index,
                              keys: Txn<'_>,
                              denied_ops: &[(Vec<u8>, Option<Vec<u8>>)],
                              wants,
                              mut removed: Removed,
                              records: &[crate::audit::Record]| {
                self.apply_both(
                    kix,
                    dix,
                    keys,
                    denied_ops,
                    wants,
                    log.then_some(&mut removed),
                    records,
                )
            };
            if both {
                return self.denied.with_writer(|dix| {
                    let (out, wants, removed, records) =
                        self.stage(f, &mut keys, &mut denied_ops, log)?;
                    let (applied, changes) =
                        both_banks(dix, keys, &denied_ops, wants, removed, &records)?;
                    after()?;
                    Ok((out, applied, changes))
                });
            }
            let (out, wants, removed, records) = self.stage(f, &mut keys, &mut denied_ops, log)?;
            if denied_ops.is_empty() {
                let plan = self.keys.plan(kix, keys)?;
                crate::removals::append(&self.dir, &removed)?;
                // Recorded before the change: never a change without its
                // record ([`crate::audit`]).
                crate::audit::append(&self.dir, &records)?;
                let (applied, changes) =
                    self.with_tree_sync(wants, || self.keys.apply(kix, plan))?;
                after()?;
                return Ok((out, applied, changes));
            }
            // Both banks locked (keys first, always).
            self.denied.with_writer(|dix| {
                let (applied, changes) =
                    both_banks(dix, keys, &denied_ops, wants, removed, &records)?;
                after()?;
                Ok((out, applied, changes))
            })
        })
    }
}
