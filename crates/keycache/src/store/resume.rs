//! Finishing the tree write of a writer that was killed: the ids of the
//! tree's intent record ([`crate::tree`]) brought in step with the store.

use super::*;
use crate::files::Ownership;
use crate::tree::{IntentRecord, KeySource, Resumed, TreeDir};

/// The store with the scope of the interrupted write (the state
/// directories it kept in step), whatever this handle's own.
struct Scoped<'a> {
    store: &'a Store,
    dirs: &'static [TreeDir],
}

impl KeySource for Scoped<'_> {
    fn dir(&self) -> &Path {
        self.store.dir()
    }
    fn keys_index(&self) -> &Path {
        self.store.keys.path()
    }
    fn ownership(&self) -> Ownership {
        self.store.keys.ownership()
    }
    fn each_key(&self, f: &mut dyn FnMut(String, KeyState, Vec<u8>)) -> Result<()> {
        KeySource::each_key(self.store, f)
    }
    fn each_denied(&self, f: &mut dyn FnMut(String, Vec<u8>)) -> Result<()> {
        KeySource::each_denied(self.store, f)
    }
    fn tree_dirs(&self) -> &'static [TreeDir] {
        self.dirs
    }
}

impl Store {
    /// Finishes the key tree of a write that was killed before its tree was
    /// in step: when the store directory holds an intent record, the key
    /// files of the ids it names (and only those: a tree changed by hand is
    /// not mended here) are made what the store holds, in the state
    /// directories the interrupted write kept in step, under the `keys`
    /// bank's lock. Every write of the store does it first (see
    /// [`Store::take_resumed`]); a front end calls it when it opens a store
    /// to say so at once. Cheap when there is nothing to finish (the
    /// banks' locks taken, a small file read).
    ///
    /// Both banks' writes that a killed writer left in flight are finished
    /// first, as their next writer finishes them: a front end's next write
    /// may not be one of the bank it left (a `deny` killed in its
    /// `denied_keys` write, then an `accept`).
    pub fn resume_tree(&self) -> Result<Option<Resumed>> {
        if crate::files::file_id(self.keys.path()).is_none() {
            return Ok(None);
        }
        if crate::files::file_id(self.denied.path()).is_some() {
            self.denied.with_writer(|_| Ok(()))?;
        }
        self.keys.with_writer(|_| self.resume_tree_locked())
    }

    /// [`Store::resume_tree_locked`] before a write: what it finished is
    /// kept for [`Store::take_resumed`].
    pub(super) fn resume_before_write(&self) -> Result<()> {
        if let Some(done) = self.resume_tree_locked()? {
            if let Ok(mut r) = self.resumed.lock() {
                r.push(done);
            }
        }
        Ok(())
    }

    /// What the writes of this handle finished of interrupted tree writes
    /// since the last call ([`Store::resume_tree`]): for a front end to
    /// report.
    pub fn take_resumed(&self) -> Vec<Resumed> {
        match self.resumed.lock() {
            Ok(mut r) => std::mem::take(&mut *r),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        }
    }

    /// [`Store::resume_tree`] with the `keys` bank's lock held.
    pub(super) fn resume_tree_locked(&self) -> Result<Option<Resumed>> {
        let Some(rec) = IntentRecord::read(&self.dir)? else {
            return Ok(None);
        };
        let wants: Vec<(MinionId, Want)> = rec
            .ids
            .iter()
            .map(|id| {
                let k = self.get(id)?.map(|e| (e.state, e.public_key));
                Ok((id.clone(), want_of(k, self.denied(id)?)))
            })
            .collect::<Result<_>>()?;
        let src = Scoped {
            store: self,
            dirs: rec.dirs(),
        };
        let mut sync = crate::tree::Sync::plan(&src, &wants)?;
        sync.before()?;
        // What the killed writer staged and never renamed, while the
        // record still names its ids.
        let temporaries = crate::tree::remove_dead_temporaries(&src)?;
        let mut changes = sync.after(&wants)?;
        changes.removed.extend(temporaries);
        let done = Resumed {
            ids: rec.ids.iter().map(|i| i.as_str().to_owned()).collect(),
            changes,
        };
        Ok(Some(done))
    }
}
