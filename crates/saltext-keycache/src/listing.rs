//! `list` and `list_all`: a bank walked once without the GIL into one
//! buffer ([`Walk`]), then the Python objects built from it with the GIL.
//! A walk allocates nothing per entry, and a driver keeps the walk's memory
//! and the `str`s it built ([`Kept`]) for its next listing: a bank listed
//! again and again costs one pass over the files and one pass building the
//! result, without fresh memory or new `str`s for entries seen before.

use keycache::table::{IterScratch, Table};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::strs::Strs;
use crate::values::{self, Bank};

/// A walk's buffers above this size are not kept for the next listing:
/// a listing of a very large bank with its keys pays for fresh memory
/// rather than holding it for good.
const KEEP_BYTES: usize = 64 << 20;

/// What a driver keeps from one listing to the next (see the module's
/// header): taken whole by a listing, given back when it is done.
#[derive(Default)]
pub(crate) struct Kept {
    walk: Walk,
    scratch: IterScratch,
    keys: Strs,
    denied: Strs,
}

impl Kept {
    /// Walks `table` into this listing's buffers.
    pub(crate) fn walk(&mut self, table: &Table, keep: Keep) -> keycache::Result<()> {
        self.walk.fill(table, keep, &mut self.scratch)
    }

    /// `list`'s result, from the last walk of `bank`.
    pub(crate) fn ids<'py>(&mut self, py: Python<'py>, bank: Bank) -> PyResult<Bound<'py, PyList>> {
        let (walk, strs) = self.parts(bank);
        let mut strs = strs.reuse();
        PyList::new(py, walk.iter().map(|e| strs.id(py, e.id)))
    }

    /// `list_all`'s result, from the last walk of `bank`.
    pub(crate) fn dict<'py>(
        &mut self,
        py: Python<'py>,
        bank: Bank,
        data: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (walk, strs) = self.parts(bank);
        let mut strs = strs.reuse();
        let out = PyDict::new(py);
        // `{"state": ...}` per state, copied for each entry (a small dict's
        // copy is one allocation and a memcpy).
        let mut templates: [Option<Bound<'py, PyDict>>; 3] = [None, None, None];
        for e in walk.iter() {
            let id = strs.id(py, e.id);
            let v = match (bank, keycache::KeyState::from_byte(e.state)) {
                (Bank::Keys, Some(s)) => {
                    let at = match s {
                        keycache::KeyState::Accepted => 0,
                        keycache::KeyState::Pending => 1,
                        keycache::KeyState::Rejected => 2,
                    };
                    let t = match &mut templates[at] {
                        Some(t) => t,
                        t @ None => t.insert(values::key_dict(py, s, None)?),
                    };
                    let d = t.copy()?;
                    if data {
                        d.set_item(pyo3::intern!(py, "pub"), strs.value(py, e.value))?;
                    }
                    d.into_any()
                }
                (Bank::Keys, None) => continue,
                _ => PyList::new(py, [strs.value(py, e.value)])?.into_any(),
            };
            out.set_item(id, v)?;
        }
        Ok(out)
    }

    /// The walk and the `str`s of `bank`.
    fn parts(&mut self, bank: Bank) -> (&Walk, &mut Strs) {
        let strs = match bank {
            Bank::Denied => &mut self.denied,
            _ => &mut self.keys,
        };
        (&self.walk, strs)
    }

    /// Lets go of the walk's buffers when they are larger than
    /// [`KEEP_BYTES`], before this is kept for the next listing.
    pub(crate) fn shrink(&mut self) {
        if self.walk.bytes.capacity() > KEEP_BYTES {
            self.walk = Walk::default();
        }
    }
}

/// What a walk keeps of each entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The id only (`list`).
    Ids,
    /// `list_all`'s value: the `keys` state (and the key with `data`), or
    /// the denied key; entries Salt's `list_all` leaves out are left out.
    Values { bank: Bank, data: bool },
}

/// The entries of a bank, in roster order, packed into one buffer.
#[derive(Debug, Default)]
struct Walk {
    bytes: Vec<u8>,
    entries: Vec<Packed>,
}

/// One entry of a [`Walk`]: its id and value follow one another in the
/// walk's bytes, the id first.
#[derive(Debug, Clone, Copy)]
struct Packed {
    /// Where the id ends in the walk's bytes.
    id_end: usize,
    /// Where the value ends.
    end: usize,
    /// The `keys` state byte (0 elsewhere).
    state: u8,
}

/// One entry of a [`Walk`], as [`Walk::iter`] gives it.
struct Entry<'a> {
    id: &'a [u8],
    value: &'a [u8],
    state: u8,
}

impl Walk {
    /// Walks `table` into this walk's buffers (their contents replaced),
    /// in `scratch`. An entry that cannot be read back is left out, as Salt
    /// leaves out what it cannot read.
    fn fill(
        &mut self,
        table: &Table,
        keep: Keep,
        scratch: &mut IterScratch,
    ) -> keycache::Result<()> {
        self.bytes.clear();
        self.entries.clear();
        let (mut id, mut value) = (Vec::new(), Vec::new());
        let mut it = table.iter_reusing(std::mem::take(scratch))?;
        while let Some(r) = it.next_into(&mut id, &mut value) {
            if r.is_err() {
                continue;
            }
            let (state, kept): (u8, &[u8]) = match keep {
                Keep::Ids => (0, &[]),
                Keep::Values { bank, data } => {
                    // Salt's list_items strips trailing NULs, and drops
                    // what is then empty.
                    let raw = values::rstrip_nul(&value);
                    if raw.is_empty() {
                        continue;
                    }
                    match bank {
                        Bank::Keys => match keycache::store::decode_key_value(raw) {
                            Some((s, p)) => (s.byte(), if data { p } else { &[] }),
                            None => continue,
                        },
                        _ => (0, raw),
                    }
                }
            };
            self.bytes.extend_from_slice(&id);
            let id_end = self.bytes.len();
            self.bytes.extend_from_slice(kept);
            self.entries.push(Packed {
                id_end,
                end: self.bytes.len(),
                state,
            });
        }
        *scratch = it.into_scratch();
        Ok(())
    }

    /// Each entry, in roster order.
    fn iter(&self) -> impl ExactSizeIterator<Item = Entry<'_>> + '_ {
        (0..self.entries.len()).map(|i| {
            let start = if i == 0 { 0 } else { self.entries[i - 1].end };
            let p = self.entries[i];
            Entry {
                id: &self.bytes[start..p.id_end],
                value: &self.bytes[p.id_end..p.end],
                state: p.state,
            }
        })
    }
}
