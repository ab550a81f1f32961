//! Consistency checks of a bank, probe-length statistics, and repair.
//!
//! [`verify`] checks the header counters against the slots, the roster
//! against the index, that every occupied id is reachable along its probe
//! chain and stored once, and every live record's bounds and checksum (and,
//! for the `keys` bank, its state byte). [`repair`] rebuilds the bank from
//! every intact entry, reachable or not, atomically, and lists what was lost.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::error::Result;
use crate::format::{self, DELETED, EMPTY, OCCUPIED, ROSTER_TOMBSTONE};
use crate::rebuild::Image;
use crate::table::{Scan, Table};

/// One problem found.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Finding {
    /// The file concerned.
    pub file: PathBuf,
    /// The slot concerned, if any.
    pub slot: Option<u64>,
    /// Byte offset in the file, if any.
    pub offset: Option<u64>,
    /// The id concerned, if any.
    pub id: Option<String>,
    /// What is wrong.
    pub what: String,
    /// Whether `--repair` mends it without losing the entry.
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
pub fn verify(t: &Table, check: Option<ValueCheck>) -> Result<Vec<Finding>> {
    let p = *t.params();
    let scan = t.scan()?;
    let mut out = Vec::new();
    let index = t.path().to_path_buf();
    let roster_path = crate::files::with_suffix(&index, ".roster");
    if !scan.exists {
        // No index: the bank reads as empty. Say so when its companions
        // show that it held entries (the ids live only in the index).
        let live = orphaned_roster_entries(t);
        if live > 0 {
            out.push(Finding {
                file: index,
                slot: None,
                offset: None,
                id: None,
                what: format!(
                    "the index file is missing, but the roster lists {live} live entries: they are lost"
                ),
                repairable: false,
            });
        }
        return Ok(out);
    }
    let mut find = |file: &PathBuf,
                    slot: Option<u64>,
                    offset: Option<u64>,
                    id: Option<&[u8]>,
                    what: String,
                    repairable: bool| {
        out.push(Finding {
            file: file.clone(),
            slot,
            offset,
            id: id.map(|i| String::from_utf8_lossy(i).into_owned()),
            what,
            repairable,
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
            &index,
            None,
            Some(0),
            None,
            "header magic 0xAB is missing".into(),
            true,
        );
    }
    if h_occ != occupied.len() as u64 {
        find(
            &index,
            None,
            Some(format::HDR_OCCUPIED as u64),
            None,
            format!(
                "header says {h_occ} occupied, the slots hold {}",
                occupied.len()
            ),
            true,
        );
    }
    if h_del != deleted {
        find(
            &index,
            None,
            Some(format::HDR_DELETED as u64),
            None,
            format!("header says {h_del} deleted, the slots hold {deleted}"),
            true,
        );
    }
    if let Some(max) = scan.slots.iter().map(|s| s.slot).max() {
        if h_hwm < max {
            find(
                &index,
                None,
                Some(format::HDR_HWM as u64),
                None,
                format!("high-water mark {h_hwm} is below slot {max}, which is in use"),
                true,
            );
        }
    }
    for s in scan
        .slots
        .iter()
        .filter(|s| s.status != OCCUPIED && s.status != DELETED)
    {
        find(
            &index,
            Some(s.slot),
            Some(p.slot_offset(s.slot) as u64),
            Some(&s.id),
            format!("unknown status byte {}", s.status),
            false,
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
                &roster_path,
                None,
                off,
                None,
                format!("entry {e} is not a data slot"),
                true,
            );
        } else if !in_roster.insert(e) {
            find(
                &roster_path,
                Some(e.into()),
                off,
                None,
                format!("slot {e} is listed twice"),
                true,
            );
        } else if scan.status[e as usize] != OCCUPIED {
            find(
                &roster_path,
                Some(e.into()),
                off,
                None,
                format!("slot {e} is listed but not occupied"),
                true,
            );
        }
    }
    for s in &occupied {
        if !in_roster.contains(&(s.slot as u32)) {
            find(
                &roster_path,
                Some(s.slot),
                None,
                Some(&s.id),
                "occupied slot missing from the roster".into(),
                true,
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
                &index,
                Some(s.slot),
                Some(p.slot_offset(s.slot) as u64),
                None,
                "occupied slot with an empty id".into(),
                false,
            );
            continue;
        }
        if chain_len(t, &scan, &s.id, s.slot, &ids).is_none() {
            find(
                &index,
                Some(s.slot),
                Some(p.slot_offset(s.slot) as u64),
                Some(&s.id),
                "id is not reachable along its probe chain".into(),
                true,
            );
        }
    }
    for (id, slots) in &by_id {
        if slots.len() > 1 {
            find(
                &index,
                Some(slots[1]),
                None,
                Some(id),
                format!("id stored in {} slots: {slots:?}", slots.len()),
                true,
            );
        }
    }
    // Records.
    for s in &occupied {
        match t.entry_at(s.slot) {
            Ok(Some(r)) => {
                if let Some(why) = check.and_then(|c| c(&r.value)) {
                    find(&index, Some(s.slot), None, Some(&s.id), why, false);
                }
            }
            Ok(None) => {}
            Err(e) => {
                let (seg, off) = format::unpack_offset(s.fields.offset);
                find(
                    &crate::heap::segment_path(&index, seg),
                    Some(s.slot),
                    Some(off),
                    Some(&s.id),
                    e.to_string(),
                    false,
                );
            }
        }
    }
    Ok(out)
}

/// What a repair kept and lost.
#[derive(Debug, Default, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repaired {
    /// Entries in the rebuilt bank.
    pub kept: u64,
    /// Ids whose entry could not be read back intact, with why.
    pub lost: Vec<(String, String)>,
}

/// Live entries the roster lists for a bank whose index is missing: lost,
/// since only the index holds their ids.
fn orphaned_roster_entries(t: &Table) -> usize {
    t.roster()
        .map(|r| r.iter().filter(|&&e| e != ROSTER_TOMBSTONE).count())
        .unwrap_or(0)
}

/// Rebuilds the bank from every intact entry (roster order first, then the
/// other occupied slots), atomically. An id stored twice keeps the entry a
/// lookup finds first.
pub fn repair(t: &Table, check: Option<ValueCheck>) -> Result<Repaired> {
    let mut rep = Repaired::default();
    t.replace_with(|t| {
        let scan = t.scan()?;
        if !scan.exists {
            let live = orphaned_roster_entries(t);
            if live > 0 {
                rep.lost.push((
                    format!("{live} entries"),
                    "the index file is missing; only it holds their ids".into(),
                ));
            }
        }
        let mut order: Vec<u64> = Vec::new();
        let mut seen = HashSet::new();
        for e in t.roster()? {
            let s = u64::from(e);
            if e != ROSTER_TOMBSTONE
                && s > 0
                && s < t.params().size
                && scan.status[s as usize] == OCCUPIED
                && seen.insert(s)
            {
                order.push(s);
            }
        }
        for s in scan.slots.iter().filter(|s| s.status == OCCUPIED) {
            if seen.insert(s.slot) {
                order.push(s.slot);
            }
        }
        let ids: HashMap<u64, &[u8]> = scan
            .slots
            .iter()
            .map(|s| (s.slot, s.id.as_slice()))
            .collect();
        let reach: HashMap<u64, u64> = scan
            .slots
            .iter()
            .filter(|s| s.status == OCCUPIED && !s.id.is_empty())
            .filter_map(|s| chain_len(t, &scan, &s.id, s.slot, &ids).map(|l| (s.slot, l)))
            .collect();
        // For duplicated ids, prefer the reachable copy.
        let mut chosen: HashMap<Vec<u8>, u64> = HashMap::new();
        for s in &order {
            let id = ids[s].to_vec();
            match chosen.get(&id) {
                Some(prev) if reach.contains_key(prev) || !reach.contains_key(s) => {}
                _ => {
                    chosen.insert(id, *s);
                }
            }
        }
        let mut image = Image::new(*t.params())?;
        let mut done = HashSet::new();
        for s in order {
            let id = ids[&s];
            if chosen.get(id) != Some(&s) || !done.insert(id.to_vec()) {
                continue;
            }
            let name = String::from_utf8_lossy(id).into_owned();
            if id.is_empty() || id.len() > t.params().id_size {
                rep.lost.push((name, "unusable id".into()));
                continue;
            }
            match t.entry_at(s) {
                Ok(Some(r)) => match check.and_then(|c| c(&r.value)) {
                    Some(why) => rep.lost.push((name, why)),
                    None => {
                        image.insert(&r.id, &r.value, r.mtime, t.path())?;
                        rep.kept += 1;
                    }
                },
                Ok(None) => {}
                Err(e) => rep.lost.push((name, e.to_string())),
            }
        }
        Ok(image)
    })?;
    Ok(rep)
}
