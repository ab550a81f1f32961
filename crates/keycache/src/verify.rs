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
        if chain_len(t, &scan, &s.id, s.slot, &ids).is_none() {
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
                image.allow_dropping(id);
                continue;
            }
            match t.entry_at(s) {
                Ok(Some(r)) => match check.and_then(|c| c(&r.value)) {
                    Some(why) => {
                        rep.lost.push((name, why));
                        image.allow_dropping(id);
                    }
                    None => {
                        image.insert(&r.id, &r.value, r.mtime, t.path())?;
                        rep.kept += 1;
                    }
                },
                Ok(None) => {}
                Err(e) => {
                    rep.lost.push((name, e.to_string()));
                    image.allow_dropping(id);
                }
            }
        }
        Ok(image)
    })?;
    Ok(rep)
}

/// A finding in one bank of a store.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BankFinding {
    /// The bank: `keys` or `denied_keys`.
    pub bank: &'static str,
    /// The problem.
    pub finding: Finding,
}

/// What the repair of one bank of a store did.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BankRepair {
    /// The bank: `keys` or `denied_keys`.
    pub bank: &'static str,
    /// Entries in the rebuilt bank.
    pub kept: u64,
    /// Ids whose entry could not be read back intact, with why.
    pub lost: Vec<(String, String)>,
    /// What a check of the rebuilt bank found (empty when it is clean).
    pub findings_after: Vec<Finding>,
}

/// The check of both banks of a store ([`check_store`]), and the repairs
/// made.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct VerifyReport {
    /// No finding in either bank (before any repair).
    pub clean: bool,
    /// What was found, `keys` bank first.
    pub findings: Vec<BankFinding>,
    /// The banks repaired: each bank with findings, when a repair was asked.
    pub repaired: Vec<BankRepair>,
}

impl VerifyReport {
    /// Whether the store passed: clean, or repaired back to clean without
    /// losing an entry.
    pub fn passed(&self) -> bool {
        // A store with findings has a repair of each bank with findings
        // when, and only when, a repair was asked.
        self.clean
            || (!self.repaired.is_empty()
                && self
                    .repaired
                    .iter()
                    .all(|r| r.findings_after.is_empty() && r.lost.is_empty()))
    }
}

/// Checks both banks of `store` (the `keys` values as `[state][public
/// key]`) and, when `repair`, rebuilds each bank with findings from its
/// intact entries ([`repair`]) and checks it again.
pub fn check_store(store: &crate::Store, repair: bool) -> Result<VerifyReport> {
    let banks: [(&'static str, &Table, Option<ValueCheck>); 2] = [
        ("keys", store.keys_table(), Some(check_key_value)),
        ("denied_keys", store.denied_table(), None),
    ];
    let mut findings = Vec::new();
    let mut repaired = Vec::new();
    for (bank, t, check) in banks {
        let found = verify(t, check)?;
        if repair && !found.is_empty() {
            let r = self::repair(t, check)?;
            repaired.push(BankRepair {
                bank,
                kept: r.kept,
                lost: r.lost,
                findings_after: verify(t, check)?,
            });
        }
        findings.extend(
            found
                .into_iter()
                .map(|finding| BankFinding { bank, finding }),
        );
    }
    Ok(VerifyReport {
        clean: findings.is_empty(),
        findings,
        repaired,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(kind: FindingKind) -> Finding {
        Finding {
            kind,
            file: PathBuf::from("x"),
            slot: None,
            offset: None,
            id: None,
            what: String::new(),
            repairable: kind.repairable(),
        }
    }

    #[test]
    fn passed_means_clean_or_repaired_without_loss() {
        let found = vec![BankFinding {
            bank: "keys",
            finding: finding(FindingKind::HighWater),
        }];
        let repair = |lost: usize, after: usize| BankRepair {
            bank: "keys",
            kept: 1,
            lost: vec![("id".into(), "why".into()); lost],
            findings_after: vec![finding(FindingKind::BadRecord); after],
        };
        let report = |findings: Vec<BankFinding>, repaired| VerifyReport {
            clean: findings.is_empty(),
            findings,
            repaired,
        };
        assert!(report(vec![], vec![]).passed());
        assert!(!report(found.clone(), vec![]).passed());
        assert!(report(found.clone(), vec![repair(0, 0)]).passed());
        assert!(!report(found.clone(), vec![repair(1, 0)]).passed());
        assert!(!report(found, vec![repair(0, 1)]).passed());
    }

    #[test]
    fn kinds_say_what_a_repair_keeps() {
        assert!(FindingKind::Unreachable.repairable());
        assert!(FindingKind::RosterDuplicate.repairable());
        assert!(!FindingKind::BadRecord.repairable());
        assert!(!FindingKind::IndexMissing.repairable());
    }
}
