//! A thread's own handle for a loop of lookups ([`Reader`]).

use super::*;

/// A thread's handle on a [`Store`] for a loop of lookups ([`Store::reader`]).
///
/// Every lookup of the [`Store`] loads the current view of the files from
/// an `ArcSwap`, which costs two atomic read-modify-writes: full barriers
/// on x86, which keep the memory accesses of one lookup from overlapping
/// those of the next. A `Reader` keeps its own view and only compares a
/// generation number (a plain load) before each lookup, reloading the view
/// when the files changed: its lookups see writes and compactions as the
/// store's do, lock-free, with the same retry policy.
///
/// It holds the files of the view it last used mapped: after a compaction
/// replaced them, they are released at its next lookup or when it is
/// dropped. Keep one per thread (it is `Send`, and `&mut` to use).
#[derive(Debug, Clone)]
pub struct Reader<'s> {
    pub(super) store: &'s Store,
    pub(super) keys: View,
    pub(super) denied: View,
}

impl Reader<'_> {
    /// [`Store::get_in`] through this reader.
    pub fn get_in<'b>(
        &mut self,
        id: &MinionId,
        buf: &'b mut Vec<u8>,
    ) -> Result<Option<KeyRef<'b>>> {
        buf.clear();
        let t = &self.store.keys;
        let f = t.get_valid_in_view(&mut self.keys, id.as_ref(), buf)?;
        key_ref(t, id, f, buf)
    }

    /// [`Store::get`] through this reader.
    pub fn get(&mut self, id: &MinionId) -> Result<Option<KeyEntry>> {
        let mut value = Vec::new();
        let t = &self.store.keys;
        match t.get_valid_in_view(&mut self.keys, id.as_ref(), &mut value)? {
            Some(f) => entry_of(
                t,
                id.as_ref(),
                Stored {
                    value,
                    mtime: f.mtime,
                    slot: f.slot,
                },
            )
            .map(Some),
            None => Ok(None),
        }
    }

    /// [`Store::denied`] through this reader.
    pub fn denied(&mut self, id: &MinionId) -> Result<Option<Vec<u8>>> {
        let mut value = Vec::new();
        let t = &self.store.denied;
        Ok(
            t.get_valid_in_view(&mut self.denied, id.as_ref(), &mut value)?
                .map(|_| strip_nuls(value)),
        )
    }
}
