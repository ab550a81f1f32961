//! Consistency checks of a bank, probe-length statistics, and repair.
//!
//! [`verify`] checks the header counters against the slots, the roster
//! against the index, that every occupied id is reachable along its probe
//! chain and stored once, every live record's bounds and checksum (and, for
//! the `keys` bank, its state byte), that no heap segment is missing, and
//! lists the entries earlier repairs lost that the bank does not hold again.
//! [`check_store`] confirms what a check without the lock finds by a check
//! under the bank's lock ([`verify_locked`]) before it reports it, so that a
//! bank Salt writes meanwhile is not reported damaged. [`repair`] decides
//! under the lock, rebuilds a damaged bank from every intact entry,
//! reachable or not and in whichever segment, atomically, and names (and
//! lists in the bank's lost-entries file, [`lost_path`]) what was lost.
//! [`missing_key_tree`] reports a store with accepted keys whose directory
//! lacks the `minions` tree that Salt's `validate_token` reads.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::format::{self, DELETED, EMPTY, OCCUPIED, ROSTER_TOMBSTONE};
use crate::heap;
use crate::rebuild::Image;
use crate::table::{Scan, Table};

/// What kind of problem a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FindingKind {
    /// The index file is missing while the roster lists live entries.
    IndexMissing,
    /// The header's magic byte is missing.
    BadMagic,
    /// The header's count of occupied slots disagrees with the slots.
    OccupiedCount,
    /// The header's count of deleted slots disagrees with the slots.
    DeletedCount,
    /// The header's high-water mark is below a slot in use.
    HighWater,
    /// A slot's status byte is none of Salt's.
    UnknownStatus,
    /// A roster entry that is not a data slot.
    RosterNotDataSlot,
    /// A slot listed twice in the roster.
    RosterDuplicate,
    /// A roster entry whose slot is not occupied.
    RosterNotOccupied,
    /// An occupied slot the roster does not list.
    NotInRoster,
    /// An occupied slot with an empty id.
    EmptyId,
    /// An id that a lookup cannot reach along its probe chain.
    Unreachable,
    /// An id stored in more than one slot.
    DuplicateId,
    /// A value that the bank's [`ValueCheck`] refuses.
    BadValue,
    /// A record that cannot be read back intact (bounds, checksum).
    BadRecord,
    /// A heap segment file is missing while live entries point into it or
    /// segment files past it exist (Salt stops reading the heap there).
    SegmentMissing,
    /// An entry a repair could not keep, listed in the bank's lost-entries
    /// file ([`lost_path`]), whose id the bank does not hold again.
    Lost,
    /// A store that holds accepted keys in a directory without the
    /// `localfs_key` tree Salt's `validate_token` reads
    /// ([`missing_key_tree`]).
    NoKeyTree,
}

impl FindingKind {
    /// Whether a repair mends a problem of this kind without losing the
    /// entry.
    pub fn repairable(self) -> bool {
        !matches!(
            self,
            FindingKind::IndexMissing
                | FindingKind::UnknownStatus
                | FindingKind::EmptyId
                | FindingKind::BadValue
                | FindingKind::BadRecord
                | FindingKind::Lost
        )
    }
}

/// One problem found.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Finding {
    /// What kind of problem it is (not serialized: `what` says it).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub kind: FindingKind,
    /// The file concerned.
    pub file: PathBuf,
    /// The slot concerned, if any.
    pub slot: Option<u64>,
    /// Byte offset in the file, if any.
    pub offset: Option<u64>,
    /// The id concerned, if any.
    pub id: Option<String>,
    /// What is wrong, in words.
    pub what: String,
    /// Whether a repair mends it without losing the entry (the kind's
    /// [`FindingKind::repairable`]).
    pub repairable: bool,
}

/// Probe lengths of the live entries: how many slots a lookup visits.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ProbeStats {
    /// Mean slots visited to find a live id.
    pub mean: f64,
    /// 99th percentile.
    pub p99: u64,
    /// Longest.
    pub max: u64,
}

/// Checks a value of the bank (the `keys` bank's state byte); returns what
/// is wrong with it.
pub type ValueCheck = fn(&[u8]) -> Option<String>;

/// The `keys` bank's value check.
pub fn check_key_value(v: &[u8]) -> Option<String> {
    crate::store::decode_key_value(v)
        .is_none()
        .then(|| format!("value of {} bytes is not [state 1..3][public key]", v.len()))
}

/// Slots visited from `id`'s home to `slot`, or `None` when an EMPTY slot
/// (or a slot of the same id) comes first.
fn chain_len(
    t: &Table,
    scan: &Scan,
    id: &[u8],
    slot: u64,
    ids: &HashMap<u64, &[u8]>,
) -> Option<u64> {
    let p = t.params();
    let home = p.home(id);
    for step in 0..p.capacity() {
        let s = p.probe(home, step);
        if s == slot {
            return Some(step + 1);
        }
        match scan.status[s as usize] {
            EMPTY => return None,
            DELETED => {}
            _ => {
                if ids.get(&s).copied() == Some(id) {
                    return None;
                }
            }
        }
    }
    None
}

/// Probe-length statistics of a bank.
pub fn probe_stats(t: &Table) -> Result<ProbeStats> {
    let scan = t.scan()?;
    let ids: HashMap<u64, &[u8]> = scan
        .slots
        .iter()
        .map(|s| (s.slot, s.id.as_slice()))
        .collect();
    let mut lens: Vec<u64> = scan
        .slots
        .iter()
        .filter(|s| s.status == OCCUPIED)
        .filter_map(|s| chain_len(t, &scan, &s.id, s.slot, &ids))
        .collect();
    if lens.is_empty() {
        return Ok(ProbeStats::default());
    }
    lens.sort_unstable();
    let n = lens.len();
    Ok(ProbeStats {
        mean: lens.iter().sum::<u64>() as f64 / n as f64,
        p99: lens[((n * 99).div_ceil(100)).saturating_sub(1).min(n - 1)],
        max: lens[n - 1],
    })
}

/// Checks both banks of a store (the `keys` values as `[state][public key]`);
/// an empty list means it is consistent.
pub fn verify_store(store: &crate::Store) -> Result<Vec<Finding>> {
    let mut f = verify(store.keys_table(), Some(check_key_value))?;
    f.extend(verify(store.denied_table(), None)?);
    Ok(f)
}

/// Checks a bank; an empty list means it is consistent.
///
/// This reads the files as they are, without the bank's lock: on a bank
/// that writers (Salt's) change meanwhile, a finding may be a write seen
/// half done. [`check_store`] confirms findings under the lock
/// ([`verify_locked`]) before it reports them.
pub fn verify(t: &Table, check: Option<ValueCheck>) -> Result<Vec<Finding>> {
    let scan = t.scan()?;
    let mut out = check_scan(t, check, &scan)?;
    out.extend(lost_findings(t, &scan)?);
    Ok(out)
}

/// [`verify`] under the bank's write lock, so that no writer (keycache's or
/// Salt's) changes the files while they are checked: what it finds is in
/// the files, not a write seen half done. It changes nothing, but finishes
/// a rebuild that a crash interrupted (as every writer does).
pub fn verify_locked(t: &Table, check: Option<ValueCheck>) -> Result<Vec<Finding>> {
    t.exclusive(|| verify(t, check))
}

/// The checks of [`verify`] on the slots of `scan`, but the lost entries.
fn check_scan(t: &Table, check: Option<ValueCheck>, scan: &Scan) -> Result<Vec<Finding>> {
    let p = *t.params();
    let mut out = Vec::new();
    let index = t.path().to_path_buf();
    let roster_path = format::roster_path(&index);
    if !scan.exists {
        // No index: the bank reads as empty. Say so when its companions
        // show that it held entries (the ids live only in the index).
        let live = orphaned_roster_entries(t);
        if live > 0 {
            out.push(Finding {
                kind: FindingKind::IndexMissing,
                file: index,
                slot: None,
                offset: None,
                id: None,
                what: format!(
                    "the index file is missing, but the roster lists {live} live entries: they are lost"
                ),
                repairable: FindingKind::IndexMissing.repairable(),
            });
        }
        return Ok(out);
    }
    let mut find = |kind: FindingKind,
                    file: &PathBuf,
                    slot: Option<u64>,
                    offset: Option<u64>,
                    id: Option<&[u8]>,
                    what: String| {
        out.push(Finding {
            kind,
            file: file.clone(),
            slot,
            offset,
            id: id.map(|i| String::from_utf8_lossy(i).into_owned()),
            what,
            repairable: kind.repairable(),
        });
    };
    let occupied: Vec<_> = scan.slots.iter().filter(|s| s.status == OCCUPIED).collect();
    let deleted = scan.slots.iter().filter(|s| s.status == DELETED).count() as u64;
    let (h_occ, h_del, h_hwm) = (
        scan.header.occupied,
        scan.header.deleted,
        scan.header.high_water,
    );
    if !scan.magic && !scan.slots.is_empty() {
        find(
            FindingKind::BadMagic,
            &index,
            None,
            Some(0),
            None,
            "header magic 0xAB is missing".into(),
        );
    }
    if h_occ != occupied.len() as u64 {
        find(
            FindingKind::OccupiedCount,
            &index,
            None,
            Some(format::HDR_OCCUPIED as u64),
            None,
            format!(
                "header says {h_occ} occupied, the slots hold {}",
                occupied.len()
            ),
        );
    }
    if h_del != deleted {
        find(
            FindingKind::DeletedCount,
            &index,
            None,
            Some(format::HDR_DELETED as u64),
            None,
            format!("header says {h_del} deleted, the slots hold {deleted}"),
        );
    }
    if let Some(max) = scan.slots.iter().map(|s| s.slot).max() {
        if h_hwm < max {
            find(
                FindingKind::HighWater,
                &index,
                None,
                Some(format::HDR_HWM as u64),
                None,
                format!("high-water mark {h_hwm} is below slot {max}, which is in use"),
            );
        }
    }
    for s in scan
        .slots
        .iter()
        .filter(|s| s.status != OCCUPIED && s.status != DELETED)
    {
        find(
            FindingKind::UnknownStatus,
            &index,
            Some(s.slot),
            Some(p.slot_offset(s.slot) as u64),
            Some(&s.id),
            format!("unknown status byte {}", s.status),
        );
    }
    // Roster against index.
    let roster = t.roster()?;
    let mut in_roster = HashSet::new();
    for (i, &e) in roster.iter().enumerate() {
        if e == ROSTER_TOMBSTONE {
            continue;
        }
        let off = Some(i as u64 * 4);
        if e == 0 || u64::from(e) >= p.size {
            find(
                FindingKind::RosterNotDataSlot,
                &roster_path,
                None,
                off,
                None,
                format!("entry {e} is not a data slot"),
            );
        } else if !in_roster.insert(e) {
            find(
                FindingKind::RosterDuplicate,
                &roster_path,
                Some(e.into()),
                off,
                None,
                format!("slot {e} is listed twice"),
            );
        } else if scan.status[e as usize] != OCCUPIED {
            find(
                FindingKind::RosterNotOccupied,
                &roster_path,
                Some(e.into()),
                off,
                None,
                format!("slot {e} is listed but not occupied"),
            );
        }
    }
    for s in &occupied {
        if !in_roster.contains(&(s.slot as u32)) {
            find(
                FindingKind::NotInRoster,
                &roster_path,
                Some(s.slot),
                None,
                Some(&s.id),
                "occupied slot missing from the roster".into(),
            );
        }
    }
    // Probe chains and duplicates.
    let ids: HashMap<u64, &[u8]> = scan
        .slots
        .iter()
        .map(|s| (s.slot, s.id.as_slice()))
        .collect();
    let mut by_id: HashMap<&[u8], Vec<u64>> = HashMap::new();
    for s in &occupied {
        by_id.entry(&s.id).or_default().push(s.slot);
        if s.id.is_empty() {
            find(
                FindingKind::EmptyId,
                &index,
                Some(s.slot),
                Some(p.slot_offset(s.slot) as u64),
                None,
                "occupied slot with an empty id".into(),
            );
            continue;
        }
        if chain_len(t, scan, &s.id, s.slot, &ids).is_none() {
            find(
                FindingKind::Unreachable,
                &index,
                Some(s.slot),
                Some(p.slot_offset(s.slot) as u64),
                Some(&s.id),
                "id is not reachable along its probe chain".into(),
            );
        }
    }
    for (id, slots) in &by_id {
        if slots.len() > 1 {
            find(
                FindingKind::DuplicateId,
                &index,
                Some(slots[1]),
                None,
                Some(id),
                format!("id stored in {} slots: {slots:?}", slots.len()),
            );
        }
    }
    // Records.
    for s in &occupied {
        match t.entry_at(s.slot) {
            Ok(Some(r)) => {
                if let Some(why) = check.and_then(|c| c(&r.value)) {
                    find(
                        FindingKind::BadValue,
                        &index,
                        Some(s.slot),
                        None,
                        Some(&s.id),
                        why,
                    );
                }
            }
            Ok(None) => {}
            Err(e) => {
                let (seg, off) = format::unpack_offset(s.fields.offset);
                find(
                    FindingKind::BadRecord,
                    &crate::heap::segment_path(&index, seg),
                    Some(s.slot),
                    Some(off),
                    Some(&s.id),
                    e.to_string(),
                );
            }
        }
    }
    out.extend(segment_findings(t, scan));
    Ok(out)
}

/// Heap segments that are missing while live entries point into them, or
/// while segment files past them exist: one finding each, naming the
/// segment, the entries that are lost with it (each also has its own
/// [`FindingKind::BadRecord`]) and what lies past it.
fn segment_findings(t: &Table, scan: &Scan) -> Vec<Finding> {
    let index = t.path();
    let paths = heap::discover(index);
    // Past a gap, a file that is not regular is not read (a hole).
    let present: Vec<bool> = paths
        .iter()
        .map(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
        .collect();
    let is_present = |n: u16| present.get(usize::from(n)).copied().unwrap_or(false);
    // Live entries with a record, per segment number.
    let mut live: BTreeMap<u16, u64> = BTreeMap::new();
    for s in scan
        .slots
        .iter()
        .filter(|s| s.status == OCCUPIED && s.fields.len > 0)
    {
        *live
            .entry(format::unpack_offset(s.fields.offset).0)
            .or_default() += 1;
    }
    let mut missing: BTreeSet<u16> = (0..present.len())
        .filter(|&n| !present[n])
        .filter_map(|n| u16::try_from(n).ok())
        .collect();
    missing.extend(live.keys().copied().filter(|&n| !is_present(n)));
    let first_gap = missing.first().copied();
    let highest = present
        .iter()
        .rposition(|&x| x)
        .and_then(|h| u16::try_from(h).ok());
    let mut out = Vec::new();
    for n in missing {
        let pointing = live.get(&n).copied().unwrap_or(0);
        let file = heap::segment_path(index, n);
        let mut what = if std::fs::symlink_metadata(&file).is_ok() {
            format!("heap segment {n} is not a regular file, and is not read")
        } else {
            format!("heap segment {n} is missing")
        };
        if pointing > 0 {
            what.push_str(&format!(
                ": {pointing} live entries point into it (lost, each listed)"
            ));
        }
        if let Some(h) = highest.filter(|&h| h > n && first_gap == Some(n)) {
            let past: u64 = live
                .range(n + 1..=h)
                .filter(|(&m, _)| is_present(m))
                .map(|(_, c)| c)
                .sum();
            what.push_str(&format!(
                "; Salt stops reading the heap at its first missing segment, so it does not \
                 read segments {}..={h} past it: ",
                n + 1
            ));
            what.push_str(&if past > 0 {
                format!(
                    "they hold {past} live entries that keycache still reads (a repair moves \
                     them into a heap that Salt reads)"
                )
            } else {
                "no live entry points into them (stale files, which Salt's writer would \
                 truncate when its heap rolls to their numbers; a repair removes them)"
                    .to_owned()
            });
        }
        out.push(Finding {
            kind: FindingKind::SegmentMissing,
            file,
            slot: None,
            offset: None,
            id: None,
            what,
            // The entries in it are lost (each is a finding of its own);
            // the rest a repair mends.
            repairable: pointing == 0,
        });
    }
    out
}

// -- The lost-entries file -------------------------------------------------------

mod job;
mod lost;
mod repair;
mod report;
#[cfg(test)]
mod tests;
mod tree;

pub use job::{check_and_mend, StoreVerify, TreeVerify};
use lost::{lost_findings, record_lost};
pub use lost::{lost_path, read_lost, LostEntry};
use repair::orphaned_roster_entries;
pub use repair::{repair, Repaired};
pub use report::{check_store, BankFinding, BankRepair, VerifyReport};
pub use tree::missing_key_tree;
