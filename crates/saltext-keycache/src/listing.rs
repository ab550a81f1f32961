//! `list` and `list_all`: a bank walked once without the GIL into one
//! buffer ([`Walk`]), then the Python objects built from it with the GIL.
//! A walk allocates nothing per entry, so a bank of a million keys costs
//! one pass over the files and one pass building the result.

use keycache::table::Table;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::values::{self, Bank};

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
pub(crate) struct Walk {
    bytes: Vec<u8>,
    /// Per entry: where its id ends in `bytes`, where its value ends (the
    /// value follows the id), and the `keys` state byte (0 elsewhere).
    entries: Vec<(usize, usize, u8)>,
}

impl Walk {
    /// Walks `table`. An entry that cannot be read back is left out, as
    /// Salt leaves out what it cannot read.
    pub(crate) fn of(table: &Table, keep: Keep) -> keycache::Result<Walk> {
        let mut w = Walk::default();
        let (mut id, mut value) = (Vec::new(), Vec::new());
        let mut it = table.iter()?;
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
            w.bytes.extend_from_slice(&id);
            let id_end = w.bytes.len();
            w.bytes.extend_from_slice(kept);
            w.entries.push((id_end, w.bytes.len(), state));
        }
        Ok(w)
    }

    /// Entry `i`'s id, value and state byte.
    fn entry(&self, i: usize) -> (&[u8], &[u8], u8) {
        let start = if i == 0 { 0 } else { self.entries[i - 1].1 };
        let (id_end, end, state) = self.entries[i];
        (&self.bytes[start..id_end], &self.bytes[id_end..end], state)
    }

    /// Each entry's id, value and state byte.
    fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8], u8)> + '_ {
        (0..self.entries.len()).map(|i| self.entry(i))
    }

    /// `list`'s result.
    pub(crate) fn ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.iter().map(|(id, _, _)| values::text(py, id)))
    }

    /// `list_all`'s result for `bank`.
    pub(crate) fn dict<'py>(
        &self,
        py: Python<'py>,
        bank: Bank,
        data: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (id, v, state) in self.iter() {
            let v = match (bank, keycache::KeyState::from_byte(state)) {
                (Bank::Keys, Some(s)) => values::key_dict(py, s, data.then_some(v))?.into_any(),
                (Bank::Keys, None) => continue,
                _ => PyList::new(py, [values::text(py, v)])?.into_any(),
            };
            out.set_item(values::text(py, id), v)?;
        }
        Ok(out)
    }
}
