//! Salt's value shapes, as `salt/cache/mmap_key.py` (3008.5) reads and
//! writes them: what each bank's `fetch` and `list_all` return, and what
//! `store` accepts.
//!
//! | bank          | stored bytes             | `fetch`                           | absent  |
//! |---------------|--------------------------|-----------------------------------|---------|
//! | `keys`        | state byte + public key  | `{"state": str, "pub": str}`      | `None`  |
//! | `denied_keys` | the first list item      | `[pub]`, trailing NULs stripped   | `{}`    |
//! | `master_keys` | the value                | `str`, trailing NULs stripped     | `{}`    |
//!
//! Text is decoded as UTF-8 with U+FFFD for bad bytes (Python's
//! `errors="replace"`). A stored empty value reads as absent, and a `keys`
//! value shorter than two bytes or with an unknown state byte reads as
//! `None`, as in Salt.

use keycache::store::decode_key_value;
use keycache::KeyState;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString};

use crate::error;

/// The three banks Salt keeps keys in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bank {
    /// `keys`: minion keys with their state.
    Keys,
    /// `denied_keys`: keys presented for an id that already had another.
    Denied,
    /// `master_keys`: the master's own key files (private keys among them).
    Master,
}

impl Bank {
    /// The bank of a Salt bank name, `None` for any other.
    pub(crate) fn parse(name: &str) -> Option<Bank> {
        [Bank::Keys, Bank::Denied, Bank::Master]
            .into_iter()
            .find(|b| b.name() == name)
    }

    /// Salt's name of the bank.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Bank::Keys => "keys",
            Bank::Denied => "denied_keys",
            Bank::Master => "master_keys",
        }
    }

    /// The bank as etcd and the replica know it; `None` for `master_keys`,
    /// which never leaves the master.
    pub(crate) fn replicated(self) -> Option<keycache::Bank> {
        match self {
            Bank::Keys => Some(keycache::Bank::Keys),
            Bank::Denied => Some(keycache::Bank::Denied),
            Bank::Master => None,
        }
    }

    /// Whether Salt checks the bank's keys with `valid_id`.
    pub(crate) fn holds_minion_ids(self) -> bool {
        self != Bank::Master
    }
}

/// `bytes` with trailing NULs removed (Python's `rstrip("\x00")`).
pub(crate) fn rstrip_nul(mut b: &[u8]) -> &[u8] {
    while let [rest @ .., 0] = b {
        b = rest;
    }
    b
}

/// A Python `str` of `b` decoded as UTF-8 with `errors="replace"`.
pub(crate) fn text<'py>(py: Python<'py>, b: &[u8]) -> Bound<'py, PyString> {
    match std::str::from_utf8(b) {
        Ok(s) => PyString::new(py, s),
        Err(_) => PyString::new(py, &String::from_utf8_lossy(b)),
    }
}

/// Salt's interned state names.
pub(crate) fn state_name<'py>(py: Python<'py>, s: KeyState) -> &'py Bound<'py, PyString> {
    match s {
        KeyState::Accepted => pyo3::intern!(py, "accepted"),
        KeyState::Pending => pyo3::intern!(py, "pending"),
        KeyState::Rejected => pyo3::intern!(py, "rejected"),
    }
}

/// `{"state": ...}` or, with the key, `{"state": ..., "pub": ...}`.
pub(crate) fn key_dict<'py>(
    py: Python<'py>,
    state: KeyState,
    pub_key: Option<&[u8]>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(pyo3::intern!(py, "state"), state_name(py, state))?;
    if let Some(p) = pub_key {
        d.set_item(pyo3::intern!(py, "pub"), text(py, p))?;
    }
    Ok(d)
}

/// What `fetch` returns for a stored value (not empty).
pub(crate) fn fetched<'py>(py: Python<'py>, bank: Bank, raw: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    Ok(match bank {
        // `None` where Salt's `_decode_key_entry` gives `None`.
        Bank::Keys => match decode_key_value(raw) {
            Some((s, p)) => key_dict(py, s, Some(p))?.into_any(),
            None => py.None().into_bound(py),
        },
        Bank::Denied => PyList::new(py, [text(py, rstrip_nul(raw))])?.into_any(),
        Bank::Master => text(py, rstrip_nul(raw)).into_any(),
    })
}

/// What `fetch` returns for an absent entry.
pub(crate) fn absent(py: Python<'_>, bank: Bank) -> Bound<'_, PyAny> {
    match bank {
        Bank::Keys => py.None().into_bound(py),
        _ => PyDict::new(py).into_any(),
    }
}

/// Salt's `salt.utils.stringutils.to_bytes`: `str` as UTF-8, bytes as they
/// are, anything else a `TypeError`.
pub(crate) fn to_bytes(v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes().to_vec());
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    Err(PyTypeError::new_err(format!(
        "expected str, bytes, or bytearray not {}",
        v.get_type().repr()?
    )))
}

/// What `store` writes, read off Salt's value for the bank.
pub(crate) enum Put {
    /// `keys`: the state and the public key (empty: Salt stores it, and it
    /// reads as absent).
    Key(KeyState, Vec<u8>),
    /// `denied_keys`: the first list item, or the value itself.
    Denied(Vec<u8>),
    /// `master_keys`: the value.
    Master(Vec<u8>),
}

impl Put {
    /// Salt's value `data` for bank `bank`, with `mmap_key`'s errors: a
    /// `keys` value must be a dict with `state` (a known state name) and
    /// `pub`; the others are `str` or bytes (a `denied_keys` list gives its
    /// first item).
    pub(crate) fn of(py: Python<'_>, bank: Bank, data: &Bound<'_, PyAny>) -> PyResult<Put> {
        Ok(match bank {
            Bank::Keys => {
                let d = data.cast::<PyDict>().ok().filter(|d| {
                    d.contains("state").unwrap_or(false) && d.contains("pub").unwrap_or(false)
                });
                let Some(d) = d else {
                    return Err(error(
                        py,
                        format!(
                            "keycache: keys bank requires {{state, pub}} dict, got {}",
                            data.get_type().repr()?
                        ),
                    ));
                };
                let state = d.get_item("state")?.map(|s| s.extract::<String>());
                let state = match state {
                    Some(Ok(s)) => KeyState::from_name(&s),
                    _ => None,
                };
                let Some(state) = state else {
                    let s = d
                        .get_item("state")?
                        .map(|s| s.repr().map(|r| r.to_string()));
                    let shown = match s {
                        Some(Ok(r)) => r,
                        _ => "None".to_string(),
                    };
                    return Err(error(py, format!("keycache: unknown key state {shown}")));
                };
                let pub_key = match d.get_item("pub")? {
                    Some(p) => to_bytes(&p)?,
                    None => Vec::new(),
                };
                Put::Key(state, pub_key)
            }
            Bank::Denied => {
                let raw = match data.cast::<PyList>() {
                    Ok(l) if l.is_empty() => Vec::new(),
                    Ok(l) => to_bytes(&l.get_item(0)?)?,
                    Err(_) => to_bytes(data)?,
                };
                Put::Denied(raw)
            }
            Bank::Master => Put::Master(to_bytes(data)?),
        })
    }
}
