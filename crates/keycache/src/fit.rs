//! Whether a layout fits a bank's files.
//!
//! Salt's files do not record the slot size, the id size or the segment cap,
//! and the table size is only inferred from the index length, so a wrong
//! layout can look valid: a slot size that divides the index length, or any
//! id size, maps the files without complaint, and a rebuild under it reads
//! nothing and writes an empty bank. [`check`] establishes that a layout is
//! the layout of the files before a command reads, and above all before it
//! writes: slot 0's reserved bytes are zero, the roster's live entries name
//! occupied slots whose ids sit on their own probe chains, with zero padding
//! after the id and after the pointer fields. [`guess`] finds the layout the
//! files do fit, to tell the user.
//!
//! The segment cap is not part of that check: it only decides where the
//! next append goes. Salt rolls to a new segment whenever an append would
//! take the active one past the cap, whatever the segments hold, so a cap
//! lowered below the size of existing segments is Salt's own way of
//! working (the next write starts a new segment), not a misfit.
//!
//! Damage is not a misfit: a store with a few damaged entries still fits
//! its layout (and `verify` reports the damage), so the verdict is a
//! majority of the sampled roster entries, not every one. Nor are inserts a
//! power loss undid (a writer syncs the roster before the index, so the
//! roster may name slots that are empty): when every misfit is an empty
//! slot and no other layout fits, the layout is taken.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, Result};
use crate::files;
use crate::format::{self, Params, DELETED, EMPTY, OCCUPIED, ROSTER_TOMBSTONE};

/// Roster entries looked at, evenly spread over the roster.
const SAMPLE: usize = 256;

/// Roster entries [`guess`] looks at per layout it tries.
const GUESS_SAMPLE: usize = 16;

/// Longest probe chain followed: Salt's tables stay under 80% full, where
/// chains are a few slots long; a longer walk means the layout is wrong.
const MAX_PROBE: u64 = 4096;

/// Slot sizes [`guess`] tries (divisors of the index length in this range).
const GUESS_SLOT_SIZES: std::ops::RangeInclusive<usize> = format::HDR_LEN..=4096;

/// Checks that `p` is the layout of the bank whose index is `index`. A bank
/// with no index file fits any layout. On a misfit the error names the
/// file, the layout tried, what did not fit, and the layout the files look
/// like when [`guess`] can tell.
pub fn check(index: &Path, p: &Params) -> Result<()> {
    let Some(bank) = Bank::open(index)? else {
        return Ok(());
    };
    let ev = bank.evaluate(p, SAMPLE)?;
    let decisive = ev.decisive.is_some();
    let why = match ev.decisive {
        Some(why) => why,
        // Nearly every entry misfits under a wrong layout; damage spares
        // most of them. With few entries to judge by, the files must fit
        // another layout before this one is refused.
        None if ev.checked > 0 && ev.misfits.len() * 10 >= ev.checked * 9 => format!(
            "{} of the {} roster entries checked do not fit it, e.g. {}",
            ev.misfits.len(),
            ev.checked,
            ev.misfits[0]
        ),
        None => return Ok(()),
    };
    let other = bank.guess().filter(|g| g != p);
    // When no other layout fits the files either, the entries are damage,
    // not a misfit, if they are too few to judge by, or if every misfit is
    // an empty slot: inserts a power loss took out of the index after the
    // roster had them (they read as absent; `verify --repair` drops them).
    let damage = ev.checked < 4 || ev.empty == ev.misfits.len();
    if !decisive && other.is_none() && damage {
        return Ok(());
    }
    Err(Error::LayoutMismatch {
        path: index.into(),
        tried: describe(p),
        why,
        looks_like: other
            .map(|g| format!("; the files look like {}", describe(&g)))
            .unwrap_or_default(),
    })
}

/// [`check`] for a handle opening a bank to read it ([`crate::table::Table::open`]):
/// the layout is refused when the files do not fit it and do fit another
/// one, which the error names (a wrong `mmap_key_id_size` would otherwise
/// read as an empty bank). Files that fit no layout at all, or that cannot
/// be read for the check (a roster that is not a regular file), are
/// damaged, not misread: they are left to the readers, which report the
/// damage entry by entry, and to `verify`.
pub fn check_for_reading(index: &Path, p: &Params) -> Result<()> {
    match check(index, p) {
        Err(e) if matches!(&e, Error::LayoutMismatch { looks_like, .. } if !looks_like.is_empty()) => {
            Err(e)
        }
        _ => Ok(()),
    }
}

/// The layout the bank's files fit, when exactly one slot size and id size
/// that Salt accepts does (the segment cap cannot be told from the files:
/// Salt's default, or the smallest cap the segments respect).
pub fn guess(index: &Path) -> Option<Params> {
    Bank::open(index).ok()??.guess()
}

/// `p` as the master config spells it.
pub fn describe(p: &Params) -> String {
    format!(
        "mmap_key_size {}, mmap_key_slot_size {}, mmap_key_id_size {}, mmap_key_max_segment_bytes {}",
        p.size, p.slot_size, p.id_size, p.max_segment_bytes
    )
}

/// What one roster entry says of a layout.
enum Verdict {
    Fits,
    /// Says nothing (a stale or damaged roster entry).
    Neutral,
    Misfit(String),
    /// The slot is EMPTY: the mark of a wrong slot size (an offset inside
    /// another slot's zero padding), or of an insert a power loss undid
    /// after the roster had it (the roster is synced before the index).
    Empty(String),
}

/// What the sampled entries say of a layout.
#[derive(Default)]
struct Evidence {
    /// Entries that fit or misfit.
    checked: usize,
    misfits: Vec<String>,
    /// How many of the misfits are EMPTY slots.
    empty: usize,
    decisive: Option<String>,
}

/// What the check reads of a bank: the index file, the sampled roster
/// entries and the segments' lengths.
struct Bank<'a> {
    index: &'a Path,
    file: File,
    len: u64,
    sample: Vec<u32>,
    segment_lens: Vec<u64>,
}

impl<'a> Bank<'a> {
    /// `None` when there is no index file.
    fn open(index: &'a Path) -> Result<Option<Bank<'a>>> {
        let file = match files::open_regular(index, false) {
            Ok(f) => f,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io(index, "stat", e))?
            .len();
        let mut live: Vec<u32> = crate::roster::read(&format::roster_path(index))?
            .into_iter()
            .filter(|&s| s != ROSTER_TOMBSTONE && s != 0)
            .collect();
        live.sort_unstable();
        live.dedup();
        let step = live.len().div_ceil(SAMPLE).max(1);
        let sample: Vec<u32> = live.into_iter().step_by(step).collect();
        let segment_lens = (0..=u16::MAX)
            .map_while(|n| {
                std::fs::symlink_metadata(format::segment_path(index, n))
                    .ok()
                    .map(|m| m.len())
            })
            .collect();
        Ok(Some(Bank {
            index,
            file,
            len,
            sample,
            segment_lens,
        }))
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<bool> {
        if off.saturating_add(buf.len() as u64) > self.len {
            return Ok(false);
        }
        self.file
            .read_exact_at(buf, off)
            .map_err(|e| Error::io(self.index, "read", e))?;
        Ok(true)
    }

    /// What the sampled roster entries say of `p`.
    fn evaluate(&self, p: &Params, sample: usize) -> Result<Evidence> {
        let mut ev = Evidence::default();
        if p.index_len() != Some(self.len) {
            ev.decisive = Some(format!(
                "the index is {} bytes, not {} x {}",
                self.len, p.size, p.slot_size
            ));
            return Ok(ev);
        }
        let step = self.sample.len().div_ceil(sample).max(1);
        for &slot in self.sample.iter().step_by(step) {
            match self.entry(p, u64::from(slot))? {
                Verdict::Fits => ev.checked += 1,
                Verdict::Neutral => {}
                Verdict::Misfit(why) => {
                    ev.checked += 1;
                    ev.misfits.push(why);
                }
                Verdict::Empty(why) => {
                    ev.checked += 1;
                    ev.empty += 1;
                    ev.misfits.push(why);
                }
            }
        }
        Ok(ev)
    }

    /// What the slot that a live roster entry names says of `p`.
    fn entry(&self, p: &Params, slot: u64) -> Result<Verdict> {
        if slot >= p.size {
            // A damaged roster; the index length already checked the size.
            return Ok(Verdict::Neutral);
        }
        let mut s = vec![0u8; p.slot_size];
        self.read(p.slot_offset(slot) as u64, &mut s)?;
        match s[0] {
            OCCUPIED => {}
            // Salt's writer leaves stale roster entries behind (a
            // misplaced tombstone); they are not a misfit.
            DELETED => return Ok(Verdict::Neutral),
            EMPTY => return Ok(Verdict::Empty(format!("slot {slot} is empty"))),
            b => {
                return Ok(Verdict::Misfit(format!(
                    "slot {slot} has status byte {b:#04x}, not occupied"
                )))
            }
        }
        let id = format::slot_id(p, &s);
        if id.is_empty() {
            return Ok(Verdict::Misfit(format!("slot {slot} holds an empty id")));
        }
        let id_field = &s[p.id_field()..p.id_field() + p.id_size];
        if id_field[id.len()..].iter().any(|&b| b != 0) {
            return Ok(Verdict::Misfit(format!(
                "slot {slot}: bytes after the id {:?} are not zero (the id size is not {}?)",
                String::from_utf8_lossy(id),
                p.id_size
            )));
        }
        if s[p.slot_used()..].iter().any(|&b| b != 0) {
            return Ok(Verdict::Misfit(format!(
                "slot {slot}: padding after its fields is not zero (the id size is not {}?)",
                p.id_size
            )));
        }
        // The id's probe chain must reach this slot without an empty slot.
        let home = p.home(id);
        let mut status = [0u8; 1];
        for step in 0..p.capacity().min(MAX_PROBE) {
            let at = p.probe(home, step);
            if at == slot {
                return Ok(Verdict::Fits);
            }
            self.read(p.slot_offset(at) as u64, &mut status)?;
            if !matches!(status[0], OCCUPIED | DELETED) {
                break;
            }
        }
        Ok(Verdict::Misfit(format!(
            "slot {slot}: id {:?} is not on its probe chain (home slot {home})",
            String::from_utf8_lossy(id)
        )))
    }

    /// The one layout (slot size and id size) whose sampled entries all fit.
    fn guess(&self) -> Option<Params> {
        if self.sample.is_empty() {
            return None;
        }
        let mut found = None;
        for slot_size in GUESS_SLOT_SIZES {
            let ss = slot_size as u64;
            if self.len == 0 || !self.len.is_multiple_of(ss) || self.len / ss < 2 {
                continue;
            }
            for id_size in 1..=slot_size - format::SLOT_FIXED {
                let p = Params {
                    size: self.len / ss,
                    slot_size,
                    id_size,
                    max_segment_bytes: format::DEFAULT_MAX_SEGMENT_BYTES.max(self.smallest_cap()),
                };
                if p.validate().is_err() {
                    continue;
                }
                let fits = self.evaluate(&p, GUESS_SAMPLE).is_ok_and(|ev| {
                    ev.decisive.is_none() && ev.checked > 0 && ev.misfits.is_empty()
                });
                if fits {
                    if found.is_some() {
                        return None; // more than one: cannot tell
                    }
                    found = Some(p);
                }
            }
        }
        found
    }

    /// The smallest segment cap that the segments respect (each segment's
    /// length, a segment of one record aside).
    fn smallest_cap(&self) -> u64 {
        self.segment_lens.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{OpenOptions, Table};

    fn opts(id_size: usize) -> OpenOptions {
        OpenOptions {
            params: Params {
                size: 101,
                id_size,
                ..Params::default()
            },
            ..OpenOptions::default()
        }
    }

    /// A bank of five entries, each slot then zeroed: the roster (synced
    /// before the index) still lists the inserts a power loss took out.
    fn lost_inserts(dir: &Path) -> std::path::PathBuf {
        let index = dir.join(format::KEYS_INDEX);
        let t = Table::open(&index, &opts(64)).unwrap();
        for i in 0..5 {
            t.put(format!("m{i}").as_bytes(), b"v").unwrap();
        }
        drop(t);
        let p = opts(64).params;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&index)
            .unwrap();
        for slot in crate::roster::read(&format::roster_path(&index)).unwrap() {
            f.write_all_at(
                &vec![0u8; p.slot_size],
                p.slot_offset(u64::from(slot)) as u64,
            )
            .unwrap();
        }
        index
    }

    /// Inserts a power loss undid are damage, not a misfit: the layout is
    /// taken (the entries read as absent; a writer opens the bank), where
    /// it used to be refused for five roster entries naming empty slots.
    #[test]
    fn a_roster_naming_only_empty_slots_fits_when_no_other_layout_does() {
        let dir = tempfile::tempdir().unwrap();
        let index = lost_inserts(dir.path());
        check(&index, &opts(64).params).unwrap();
        let t = Table::open(&index, &opts(64)).unwrap();
        assert!(t.get(b"m0").unwrap().is_none());
        t.put(b"after", b"v").unwrap();
        assert_eq!(
            t.get(b"after").unwrap().map(|s| s.value),
            Some(b"v".to_vec())
        );
    }

    /// Entries intact, read under a wrong id size: still refused, naming
    /// the layout the files fit.
    #[test]
    fn intact_entries_under_a_wrong_id_size_are_still_refused() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(format::KEYS_INDEX);
        let t = Table::open(&index, &opts(64)).unwrap();
        for i in 0..5 {
            t.put(format!("m{i}").as_bytes(), b"v").unwrap();
        }
        drop(t);
        let e = check(&index, &opts(32).params).unwrap_err();
        assert!(e.to_string().contains("mmap_key_id_size 64"), "{e}");
    }
}
