//! `list` and `list_all`: a bank walked without the GIL into a buffer
//! ([`Walk`]), [`CHUNK`] entries at a time, the Python objects built from
//! each chunk with the GIL.
//!
//! A driver keeps what a listing worked with ([`Kept`]) for its next one:
//! the walk's buffers and the iterator's memory (so a listing allocates no
//! fresh memory), and the `str`s it built ([`Strs`]), reused for the same
//! bytes.

use keycache::table::{Iter, IterScratch, Table};
use keycache::KeyState;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::strs::{Reuse, Strs};
use crate::values::{self, Bank};

/// Entries walked at a time: the walk's buffers stay small (in the CPU's
/// cache while the result is built from them, and little memory kept),
/// and the GIL is released and taken once per chunk.
const CHUNK: usize = 1024;

/// What a walk keeps of each entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The id only (`list`).
    Ids,
    /// `list_all`'s value: the `keys` state (and the key with `data`), or
    /// the denied key; entries Salt's `list_all` leaves out are left out.
    Values { bank: Bank, data: bool },
}

/// Why a listing failed.
pub(crate) enum Failed {
    /// The bank could not be walked.
    Walk(keycache::Error),
    /// Building the result raised.
    Py(PyErr),
}

/// What a driver keeps from one listing to the next (see the module's
/// header): taken whole by a listing, given back when it is done.
#[derive(Default)]
pub(crate) struct Kept {
    scratch: IterScratch,
    /// The walk's buffers, emptied.
    spare: Option<Walk>,
    keys: Strs,
    denied: Strs,
}

impl Kept {
    /// Lists `table`, the bank `bank`, keeping `keep` of each entry: the
    /// list of ids (`Keep::Ids`, `list`'s result) or the dict (`list_all`'s).
    pub(crate) fn list<'py>(
        &mut self,
        py: Python<'py>,
        table: &Table,
        bank: Bank,
        keep: Keep,
    ) -> Result<Bound<'py, PyAny>, Failed> {
        let scratch = std::mem::take(&mut self.scratch);
        let mut it = py
            .detach(|| table.iter_reusing(scratch))
            .map_err(Failed::Walk)?;
        let strs = match bank {
            Bank::Denied => &mut self.denied,
            _ => &mut self.keys,
        };
        let mut build = Build::new(py, keep, strs.reuse());
        let mut w = self.spare.take().unwrap_or_default();
        let built = loop {
            w.clear();
            let more = py.detach(|| w.fill(&mut it, keep, CHUNK));
            if let Err(e) = build.feed(&w) {
                break Err(e);
            }
            if !more {
                break Ok(());
            }
        };
        w.clear();
        self.spare = Some(w);
        self.scratch = it.into_scratch();
        built.map_err(Failed::Py)?;
        build.finish().map_err(Failed::Py)
    }
}

/// A listing's result as it is built, chunk by chunk.
struct Build<'a, 'py> {
    py: Python<'py>,
    keep: Keep,
    strs: Reuse<'a>,
    ids: Vec<Bound<'py, PyString>>,
    dict: Bound<'py, PyDict>,
    /// `{"state": ...}` per state, copied for each entry (a small dict's
    /// copy is one allocation and a memcpy).
    templates: [Option<Bound<'py, PyDict>>; 3],
}

impl<'a, 'py> Build<'a, 'py> {
    fn new(py: Python<'py>, keep: Keep, strs: Reuse<'a>) -> Self {
        Build {
            py,
            keep,
            strs,
            ids: Vec::new(),
            dict: PyDict::new(py),
            templates: [None, None, None],
        }
    }

    /// Adds the entries of `w`.
    fn feed(&mut self, w: &Walk) -> PyResult<()> {
        let py = self.py;
        let (bank, data) = match self.keep {
            Keep::Ids => {
                self.ids.reserve(w.entries.len());
                for e in w.iter() {
                    self.ids.push(self.strs.id(py, e.id));
                }
                return Ok(());
            }
            Keep::Values { bank, data } => (bank, data),
        };
        for e in w.iter() {
            let id = self.strs.id(py, e.id);
            let v = match (bank, KeyState::from_byte(e.state)) {
                (Bank::Keys, Some(s)) => {
                    let at = match s {
                        KeyState::Accepted => 0,
                        KeyState::Pending => 1,
                        KeyState::Rejected => 2,
                    };
                    let t = match &mut self.templates[at] {
                        Some(t) => t,
                        t @ None => t.insert(values::key_dict(py, s, None)?),
                    };
                    let d = t.copy()?;
                    if data {
                        d.set_item(pyo3::intern!(py, "pub"), self.strs.value(py, e.value))?;
                    }
                    d.into_any()
                }
                (Bank::Keys, None) => continue,
                _ => PyList::new(py, [self.strs.value(py, e.value)])?.into_any(),
            };
            self.dict.set_item(id, v)?;
        }
        Ok(())
    }

    /// The result: the list of ids, or the dict.
    fn finish(self) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self.keep {
            Keep::Ids => PyList::new(self.py, self.ids)?.into_any(),
            Keep::Values { .. } => self.dict.into_any(),
        })
    }
}

/// Entries of a bank, in roster order, packed into one buffer.
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
    /// Empties the buffers (their memory kept).
    fn clear(&mut self) {
        self.bytes.clear();
        self.entries.clear();
    }

    /// Appends up to `max` entries of `it`; whether `it` may have more. An
    /// entry that cannot be read back is left out, as Salt leaves out what
    /// it cannot read.
    fn fill(&mut self, it: &mut Iter<'_>, keep: Keep, max: usize) -> bool {
        let (mut id, mut value) = (Vec::new(), Vec::new());
        let mut n = 0;
        while n < max {
            let Some(r) = it.next_into(&mut id, &mut value) else {
                return false;
            };
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
            n += 1;
        }
        true
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
