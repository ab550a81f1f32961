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
    /// [`Store::batch_with_tree`] holding both banks' locks (`keys` first)
    /// from the start, so that what `f` reads of either bank (through the
    /// batch, or lock-free reads of the store) no other writer changes
    /// before the batch is applied. For writes that depend on both banks:
    /// a merge checks every entry it replaces.
    /// `after` runs once the banks (and the tree) are written, still under
    /// both locks.
    pub fn batch_locked<T>(
        &self,
        f: impl FnOnce(&mut Batch<'_, '_>) -> Result<T>,
        after: impl FnOnce() -> Result<()>,
    ) -> Result<(T, Applied, TreeChanges)> {
        self.keys.with_writer(|kix| {
            self.denied.with_writer(|dix| {
                let mut keys = Txn::new(&self.keys);
                let mut denied_ops: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
                // A merge records its removals in the history itself: no log.
                let (out, wants, _) = self.stage(f, &mut keys, &mut denied_ops, false)?;
                let (applied, changes) =
                    self.apply_both(kix, dix, keys, &denied_ops, wants, None)?;
                after()?;
                Ok((out, applied, changes))
            })
        })
    }
}
