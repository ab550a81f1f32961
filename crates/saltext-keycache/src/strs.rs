//! [`Strs`]: the `str` objects a bank's last listing built, by position,
//! for the next listing to reuse.
//!
//! A listing of a large bank otherwise builds every id (and, with data,
//! every key) `str` afresh, and frees the last listing's: most of its time.
//! A `str` is immutable, so the one built before for the same bytes is
//! always the right answer; the next listing of an unchanged bank meets
//! the same bytes at the same position. Each lookup compares the bytes
//! (never trusting the position alone), so an entry whose id or value
//! changed gets a new `str`, never a stale one. Only valid UTF-8 is kept
//! (the `str` of other bytes has other bytes). Only the `str`s are kept,
//! never the dicts or lists a listing returns (callers may change those).
//!
//! Entries removed from the middle of a bank shift the ones after them:
//! the listing follows the shift (see [`Strs::id`]), so a removal does not
//! cost the rest of the listing its `str`s. Memory: one `str` per entry of
//! the last listing for ids, and for values up to [`MAX_KEPT_VALUES`].

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::values;

/// How many value `str`s (public keys, about 450 bytes each) a bank keeps
/// between listings: about 50 MB at most. Ids are always kept (tens of
/// bytes each); keys beyond this are built afresh each listing, so that a
/// master process that once listed a million keys with data (Salt's
/// cluster join does) does not hold half a gigabyte for the rest of its life.
pub(crate) const MAX_KEPT_VALUES: usize = 100_000;

/// One column of `str`s (ids, or values), by position in the listing.
#[derive(Default)]
struct Column(Vec<Option<Py<PyString>>>);

impl Column {
    /// The kept `str` at `at`, if its bytes are `bytes`.
    fn find<'py>(&self, py: Python<'py>, at: usize, bytes: &[u8]) -> Option<Bound<'py, PyString>> {
        let s = self.0.get(at)?.as_ref()?.bind(py);
        (s.to_str().ok()?.as_bytes() == bytes).then(|| s.clone())
    }

    /// Keeps `s` at `at` (nothing, for `None`); the column grows by one at
    /// most, as a listing asks for every position in turn.
    fn put(&mut self, at: usize, s: Option<&Bound<'_, PyString>>) {
        if at < self.0.len() {
            let same = match (&self.0[at], s) {
                (Some(kept), Some(s)) => kept.as_ptr() == s.as_ptr(),
                _ => false,
            };
            if !same {
                self.0[at] = s.map(|s| s.clone().unbind());
            }
        } else if at == self.0.len() {
            self.0.push(s.map(|s| s.clone().unbind()));
        }
    }

    /// The `str` of `bytes` for position `at`: `found`, else a new one;
    /// kept at `at` for the next listing.
    fn settle<'py>(
        &mut self,
        py: Python<'py>,
        at: usize,
        found: Option<Bound<'py, PyString>>,
        bytes: &[u8],
    ) -> Bound<'py, PyString> {
        let s = match found {
            Some(s) => s,
            None => match std::str::from_utf8(bytes) {
                Ok(t) => PyString::new(py, t),
                Err(_) => {
                    self.put(at, None);
                    return values::text(py, bytes);
                }
            },
        };
        self.put(at, Some(&s));
        s
    }
}

/// The `str`s of one bank's last listing: its ids, and its values (keys
/// or denied keys) when it listed them.
#[derive(Default)]
pub(crate) struct Strs {
    ids: Column,
    values: Column,
}

/// One listing's walk through [`Strs`]: entries are asked for in order,
/// the id first.
pub(crate) struct Reuse<'a> {
    strs: &'a mut Strs,
    /// How many entries of the last listing were removed before the
    /// current one: its `str`s are that far ahead.
    shift: usize,
    /// Entries asked for so far.
    done: usize,
}

impl Strs {
    /// Starts a listing.
    pub(crate) fn reuse(&mut self) -> Reuse<'_> {
        Reuse {
            strs: self,
            shift: 0,
            done: 0,
        }
    }
}

impl Reuse<'_> {
    /// The `str` of the next entry's id: the last listing's at this
    /// position (or one further on, when an entry before it was removed:
    /// the shift grows), else a new one, kept for the next listing.
    pub(crate) fn id<'py>(&mut self, py: Python<'py>, bytes: &[u8]) -> Bound<'py, PyString> {
        let at = self.done;
        self.done += 1;
        let ids = &mut self.strs.ids;
        let from = at + self.shift;
        let found = ids.find(py, from, bytes).or_else(|| {
            let next = ids.find(py, from + 1, bytes);
            self.shift += usize::from(next.is_some());
            next
        });
        ids.settle(py, at, found, bytes)
    }

    /// The `str` of the value of the entry whose id was asked for last,
    /// found as [`Reuse::id`] finds it.
    pub(crate) fn value<'py>(&mut self, py: Python<'py>, bytes: &[u8]) -> Bound<'py, PyString> {
        let at = self.done.saturating_sub(1);
        if at >= MAX_KEPT_VALUES {
            return values::text(py, bytes);
        }
        let values = &mut self.strs.values;
        let found = values.find(py, at + self.shift, bytes);
        values.settle(py, at, found, bytes)
    }
}

impl Drop for Reuse<'_> {
    /// Forgets what lies past this listing's entries.
    fn drop(&mut self) {
        self.strs.ids.0.truncate(self.done);
        self.strs.values.0.truncate(self.done.min(MAX_KEPT_VALUES));
    }
}
