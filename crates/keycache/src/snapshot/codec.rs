//! The entry format of snapshot files: encoding, parsing with bounds
//! checks, and the checks of what a snapshot promises.

use super::{Bank, Entry, ENTRY_HEAD_LEN};
use crate::error::{Error, Result};
use crate::key::KeyState;

/// Appends `entries` in the file's entry format.
pub(super) fn encode_entries(entries: &[Entry], b: &mut Vec<u8>) {
    for e in entries {
        b.push(e.bank.byte());
        b.push(e.state.map_or(0, KeyState::byte));
        b.extend_from_slice(&(e.id.len().min(u16::MAX as usize) as u16).to_le_bytes());
        b.extend_from_slice(&(e.pub_key.len().min(u32::MAX as usize) as u32).to_le_bytes());
        b.extend_from_slice(&e.mtime.to_le_bytes());
        b.extend_from_slice(e.id.as_bytes());
        b.extend_from_slice(&e.pub_key);
    }
}

/// Parses `count` entries at `*o`, advancing it; `what` names them in
/// errors (`entry`, `seen entry`).
pub(super) fn parse_entries(
    b: &[u8],
    o: &mut usize,
    count: u64,
    what: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<Vec<Entry>> {
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let mut entries = Vec::with_capacity((count as usize).min(b.len() / ENTRY_HEAD_LEN));
    for n in 0..count {
        let at = *o;
        if at + ENTRY_HEAD_LEN > b.len() {
            return Err(bad(format!(
                "truncated: {what} {n} of {count} would start at byte {at}, past the end \
                 ({} bytes)",
                b.len()
            )));
        }
        let (bank_b, state_b) = (b[at], b[at + 1]);
        let id_len = u16::from_le_bytes([b[at + 2], b[at + 3]]) as usize;
        let key_len = u32_at(at + 4) as usize;
        let mtime = u64_at(at + 8);
        let start = at + ENTRY_HEAD_LEN;
        let end = start.saturating_add(id_len).saturating_add(key_len);
        if end > b.len() {
            return Err(bad(format!(
                "truncated: {what} {n} of {count} at byte {at} needs {} bytes, the file ends \
                 at {}",
                end - at,
                b.len()
            )));
        }
        let id = std::str::from_utf8(&b[start..start + id_len])
            .map_err(|_| bad(format!("{what} {n} at byte {at}: the id is not UTF-8")))?
            .to_owned();
        let pub_key = b[start + id_len..end].to_vec();
        let bank = Bank::from_byte(bank_b)
            .ok_or_else(|| bad(format!("{what} {n} at byte {at}: unknown bank {bank_b}")))?;
        let state = match (bank, state_b) {
            (Bank::Keys, s) => Some(KeyState::from_byte(s).ok_or_else(|| {
                bad(format!(
                    "{what} {n} at byte {at} ({id:?}): unknown key state {s}"
                ))
            })?),
            (Bank::Denied, 0) => None,
            (Bank::Denied, s) => {
                return Err(bad(format!(
                    "{what} {n} at byte {at} ({id:?}): a denied key with state {s} (must be 0)"
                )))
            }
        };
        entries.push(Entry {
            bank,
            id,
            state,
            pub_key,
            mtime,
        });
        *o = end;
    }
    Ok(entries)
}

/// Checks what a snapshot promises of its entries (see [`Snapshot::check`]).
pub(super) fn check_entries(entries: &[Entry], name: &str, what: &str) -> Result<()> {
    {
        let bad = |why: String| Error::BadSnapshot {
            source_name: name.to_owned(),
            why,
        };
        let mut prev: Option<(Bank, &str)> = None;
        for (n, e) in entries.iter().enumerate() {
            crate::id::validate(&e.id)
                .map_err(|err| bad(format!("{what} {n} ({:?}): {err}", e.id)))?;
            if e.id.len() > u16::MAX as usize || e.pub_key.len() > u32::MAX as usize {
                return Err(bad(format!(
                    "{what} {n} ({:?}): too long for the format",
                    e.id
                )));
            }
            match (e.bank, e.state) {
                (Bank::Keys, None) => {
                    return Err(bad(format!(
                        "{what} {n} ({:?}): a keys entry without a state",
                        e.id
                    )))
                }
                (Bank::Denied, Some(_)) => {
                    return Err(bad(format!(
                        "{what} {n} ({:?}): a denied key with a state",
                        e.id
                    )))
                }
                _ => {}
            }
            if crate::pem::holds_private_key(&e.pub_key) {
                return Err(bad(format!(
                    "{what} {n} ({:?}, {}): the value holds a PRIVATE KEY block",
                    e.id, e.bank
                )));
            }
            let here = (e.bank, e.id.as_str());
            if let Some(p) = prev {
                if p >= here {
                    return Err(bad(format!(
                        "{what} {n} ({:?}, {}): out of order or repeated (entries are sorted by \
                         bank, then id, each once)",
                        e.id, e.bank
                    )));
                }
            }
            prev = Some(here);
        }
        Ok(())
    }
}
