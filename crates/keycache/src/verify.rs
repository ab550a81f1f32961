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

/// The file in which repairs of the bank whose index is `index` list the
/// entries they could not keep: `I.keycache-lost` (keycache's own; Salt
/// ignores it). [`verify`] reports each entry listed there
/// ([`FindingKind::Lost`]) for as long as the bank does not hold its id
/// again; remove the file to forget them.
pub fn lost_path(index: &Path) -> PathBuf {
    crate::files::with_suffix(index, LOST_SUFFIX)
}

const LOST_SUFFIX: &str = ".keycache-lost";

/// The most of a lost-entries file that is read.
const LOST_MAX: u64 = 16 << 20;

/// One entry of a lost-entries file ([`lost_path`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostEntry {
    /// The id, or `None` for entries whose ids are not known (the index
    /// was missing).
    pub id: Option<Vec<u8>>,
    /// When the repair ran, Unix seconds.
    pub at: u64,
    /// Why the entry could not be kept.
    pub why: String,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// One line: `lost <unix seconds> <id in hex, or -> <why>`; control
/// characters of `why` become spaces.
fn lost_line(e: &LostEntry) -> String {
    let why: String = e
        .why
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let id = e.id.as_deref().map(hex).unwrap_or_else(|| "-".into());
    format!("lost {} {id} {why}\n", e.at)
}

/// The entries of a bank's lost-entries file (none when there is none),
/// and the numbers of its lines that cannot be read.
pub fn read_lost(index: &Path) -> Result<(Vec<LostEntry>, Vec<usize>)> {
    let path = lost_path(index);
    let f = match crate::files::open_regular(&path, false) {
        Ok(f) => f,
        Err(crate::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Vec::new(), Vec::new()))
        }
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    f.take(LOST_MAX)
        .read_to_end(&mut bytes)
        .map_err(|e| crate::Error::io(&path, "read", e))?;
    let text = String::from_utf8_lossy(&bytes);
    let (mut entries, mut bad) = (Vec::new(), Vec::new());
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(4, ' ');
        let parsed = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("lost"), Some(at), Some(id), why) => at.parse().ok().and_then(|at| {
                let id = if id == "-" {
                    Some(None)
                } else {
                    unhex(id).map(Some)
                }?;
                Some(LostEntry {
                    id,
                    at,
                    why: why.unwrap_or("").to_owned(),
                })
            }),
            _ => None,
        };
        match parsed {
            Some(e) => entries.push(e),
            None => bad.push(i + 1),
        }
    }
    Ok((entries, bad))
}

/// Writes `bytes` as the bank's lost-entries file, through a temporary
/// name, fsynced: the file is whole or as it was.
fn write_lost(t: &Table, bytes: &[u8]) -> Result<()> {
    let path = lost_path(t.path());
    let tmp = crate::files::with_suffix(&path, &format!(".new.{}", std::process::id()));
    crate::files::remove_if_exists(&tmp)?;
    let mut f = crate::files::create_new(&tmp, &t.ownership())?;
    f.write_all(bytes)
        .map_err(|e| crate::Error::io(&tmp, "write", e))?;
    crate::files::sync_data(&f, &tmp)?;
    crate::files::rename(&tmp, &path)?;
    crate::files::sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Adds `lost` to the bank's lost-entries file, dropping the entries listed
/// earlier whose ids are in `live` (the bank holds them again).
fn record_lost(t: &Table, lost: &[LostEntry], live: &HashSet<&[u8]>) -> Result<()> {
    let (earlier, _) = read_lost(t.path())?;
    let mut text = String::new();
    for e in earlier
        .iter()
        .filter(|e| e.id.as_deref().is_none_or(|id| !live.contains(id)))
        .chain(lost)
    {
        text.push_str(&lost_line(e));
    }
    write_lost(t, text.as_bytes())
}

/// `YYYY-MM-DD HH:MM:SS UTC` of Unix seconds.
fn utc(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The entries of the lost-entries file that the bank does not hold again
/// (the latest line of each id), and its unreadable lines.
fn lost_findings(t: &Table, scan: &Scan) -> Result<Vec<Finding>> {
    let (entries, bad) = read_lost(t.path())?;
    let file = lost_path(t.path());
    let live: HashSet<&[u8]> = scan
        .slots
        .iter()
        .filter(|s| s.status == OCCUPIED)
        .map(|s| s.id.as_slice())
        .collect();
    let mut latest: BTreeMap<Option<&[u8]>, &LostEntry> = BTreeMap::new();
    let mut unknown = Vec::new();
    for e in &entries {
        match e.id.as_deref() {
            Some(id) => {
                latest.insert(Some(id), e);
            }
            None => unknown.push(e),
        }
    }
    let forget = format!("remove {} to forget it", file.display());
    let mut out = Vec::new();
    let mut push = |id: Option<&[u8]>, what: String| {
        out.push(Finding {
            kind: FindingKind::Lost,
            file: file.clone(),
            slot: None,
            offset: None,
            id: id.map(|i| String::from_utf8_lossy(i).into_owned()),
            what,
            repairable: false,
        })
    };
    for (id, e) in latest {
        if id.is_some_and(|id| !live.contains(id)) {
            push(
                id,
                format!(
                    "lost by the repair of {}: {}; the bank does not hold this id: its key \
                     must be added again (the finding then clears), or {forget}",
                    utc(e.at),
                    e.why
                ),
            );
        }
    }
    for e in unknown {
        push(
            None,
            format!(
                "lost by the repair of {}: {} (ids unknown); {forget}",
                utc(e.at),
                e.why
            ),
        );
    }
    for n in bad {
        push(
            None,
            format!("line {n} is not an entry of a lost-entries file; {forget}"),
        );
    }
    Ok(out)
}

// -- Repair ----------------------------------------------------------------------

/// What a repair kept and lost.
#[derive(Debug, Default, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repaired {
    /// Whether the bank was rebuilt: a check under the bank's lock found
    /// damage. An undamaged bank (or one whose only findings are entries
    /// lost earlier) is left as it is.
    pub rebuilt: bool,
    /// Entries in the rebuilt bank.
    pub kept: u64,
    /// Ids whose entry could not be read back intact, with why.
    pub lost: Vec<(String, String)>,
    /// Old heap segment files that the rebuilt bank no longer uses and that
    /// no live entry points into any more (their intact records were
    /// moved), removed by the rebuild.
    pub removed_segments: Vec<PathBuf>,
    /// The lost-entries file where the lost entries were listed
    /// ([`lost_path`]), when any was lost.
    pub lost_file: Option<PathBuf>,
}

/// Live entries the roster lists for a bank whose index is missing: lost,
/// since only the index holds their ids.
fn orphaned_roster_entries(t: &Table) -> usize {
    t.roster()
        .map(|r| r.iter().filter(|&&e| e != ROSTER_TOMBSTONE).count())
        .unwrap_or(0)
}

/// The reason of a read that failed, without the file and id that the
/// lost-entry line names anyway.
fn reason(e: &crate::Error) -> String {
    match e {
        crate::Error::Corrupt { why, .. } => why.clone(),
        e => e.to_string(),
    }
}

/// Rebuilds the bank from every intact entry (roster order first, then the
/// other occupied slots), atomically, when a check under the bank's lock
/// finds it damaged; an undamaged bank is left as it is
/// ([`Repaired::rebuilt`]). Every record that can be read and checked is
/// kept, in whichever segment it is (segments past a missing one
/// included); an id stored twice keeps the entry a lookup finds first. The
/// entries that cannot be kept are named with why, and listed in the
/// bank's lost-entries file ([`lost_path`]) before the new files replace
/// the old ones, so that [`verify`] keeps reporting them. Old segment files
/// past the new heap are removed by the rebuild, after their records moved.
pub fn repair(t: &Table, check: Option<ValueCheck>) -> Result<Repaired> {
    let mut rep = Repaired::default();
    let mut undamaged = false;
    let r = t.replace_with(|t| {
        // Decided under the lock: no writer is half-way through a write.
        let found = verify(t, check)?;
        if found.iter().all(|f| f.kind == FindingKind::Lost) {
            undamaged = true;
            return Err(crate::Error::InvalidParams(
                "the bank is not damaged".into(),
            ));
        }
        let scan = t.scan()?;
        let now = crate::files::now_ns() / 1_000_000_000;
        let mut lost: Vec<LostEntry> = Vec::new();
        if !scan.exists {
            let live = orphaned_roster_entries(t);
            if live > 0 {
                let why = "the index file is missing; only it holds their ids".to_owned();
                rep.lost.push((format!("{live} entries"), why.clone()));
                lost.push(LostEntry {
                    id: None,
                    at: now,
                    why: format!("{live} entries: {why}"),
                });
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
        let mut kept: HashSet<&[u8]> = HashSet::new();
        let mut lose = |image: &mut Image, id: &[u8], why: String| {
            rep.lost
                .push((String::from_utf8_lossy(id).into_owned(), why.clone()));
            lost.push(LostEntry {
                id: Some(id.to_vec()),
                at: now,
                why,
            });
            image.allow_dropping(id);
        };
        for s in order {
            let id = ids[&s];
            if chosen.get(id) != Some(&s) || !done.insert(id.to_vec()) {
                continue;
            }
            if id.is_empty() || id.len() > t.params().id_size {
                lose(&mut image, id, format!("slot {s} holds an unusable id"));
                continue;
            }
            match t.entry_at(s) {
                Ok(Some(r)) => match check.and_then(|c| c(&r.value)) {
                    Some(why) => lose(&mut image, id, format!("slot {s}: {why}")),
                    None => {
                        image.insert(&r.id, &r.value, r.mtime, t.path())?;
                        kept.insert(id);
                        rep.kept += 1;
                    }
                },
                Ok(None) => {}
                Err(e) => lose(&mut image, id, reason(&e)),
            }
        }
        // The old segment files past the new heap: the rebuild removes them
        // (every live record in them was read above, and is in the image).
        rep.removed_segments = heap::discover(t.path())
            .into_iter()
            .skip(image.segments.len())
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .collect();
        // Listed before the new files replace the old ones: a crash after
        // the rebuild never forgets what it lost.
        if !lost.is_empty() {
            record_lost(t, &lost, &kept)?;
            rep.lost_file = Some(lost_path(t.path()));
        }
        Ok(image)
    });
    match r {
        Ok(()) => {
            rep.rebuilt = true;
            Ok(rep)
        }
        Err(_) if undamaged => Ok(Repaired::default()),
        Err(e) => Err(e),
    }
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
    /// Old heap segment files the rebuild removed (see
    /// [`Repaired::removed_segments`]).
    pub removed_segments: Vec<PathBuf>,
    /// Where the lost entries are listed ([`lost_path`]), when any was lost.
    pub lost_file: Option<PathBuf>,
    /// What a check of the rebuilt bank found (empty when it is clean; the
    /// entries just lost are there, as [`FindingKind::Lost`]).
    pub findings_after: Vec<Finding>,
}

/// The check of both banks of a store ([`check_store`]), and the repairs
/// made.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct VerifyReport {
    /// No finding in either bank (before any repair).
    pub clean: bool,
    /// What was found and confirmed under the bank's lock, `keys` bank
    /// first.
    pub findings: Vec<BankFinding>,
    /// Findings of the check without the lock that the check under the
    /// lock did not confirm (writes seen half done): not reported.
    pub unconfirmed: u64,
    /// The banks repaired: each bank found damaged under its lock, when a
    /// repair was asked.
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
                    .all(|r| r.findings_after.is_empty() && r.lost.is_empty())
                && self
                    .findings
                    .iter()
                    .all(|f| self.repaired.iter().any(|r| r.bank == f.bank)))
    }
}

/// The same problem, as two checks report it.
fn same(a: &Finding, b: &Finding) -> bool {
    a.kind == b.kind && a.file == b.file && a.slot == b.slot && a.id == b.id
}

/// Whether `e` says the bank's lock file may not be opened or locked by
/// this user (a read-only store, a verify by another user).
fn lock_refused(e: &crate::Error) -> bool {
    matches!(e, crate::Error::Io { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem))
}

/// The findings of `found` (a check without the lock) that are in the
/// files: the bank is checked again under its lock, and that check's
/// findings are the answer. Where the lock may not be taken (no write
/// access), only the findings that three more checks, 100 ms apart, all
/// see again are kept.
fn confirm(t: &Table, check: Option<ValueCheck>, found: Vec<Finding>) -> Result<Vec<Finding>> {
    match verify_locked(t, check) {
        Ok(f) => Ok(f),
        Err(e) if lock_refused(&e) => {
            let mut keep = found;
            for _ in 0..3 {
                if keep.is_empty() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
                let again = verify(t, check)?;
                keep.retain(|f| again.iter().any(|g| same(f, g)));
            }
            Ok(keep)
        }
        Err(e) => Err(e),
    }
}

/// Checks both banks of `store` (the `keys` values as `[state][public
/// key]`) and, when `repair`, rebuilds each damaged bank from its intact
/// entries ([`repair`]) and checks it again.
///
/// A bank is first checked without its lock, so that a clean bank costs
/// its writers nothing; when that check finds something, the bank is
/// checked again under its lock, and only what that check finds is
/// reported (a bank that Salt writes meanwhile is not reported damaged for
/// a write seen half done). A repair decides under the lock too.
pub fn check_store(store: &crate::Store, repair: bool) -> Result<VerifyReport> {
    let banks: [(&'static str, &Table, Option<ValueCheck>); 2] = [
        ("keys", store.keys_table(), Some(check_key_value)),
        ("denied_keys", store.denied_table(), None),
    ];
    let mut findings = Vec::new();
    let mut repaired = Vec::new();
    let mut unconfirmed = 0u64;
    for (bank, t, check) in banks {
        let mut found = verify(t, check)?;
        if !found.is_empty() {
            let first = found.clone();
            found = confirm(t, check, found)?;
            unconfirmed += first
                .iter()
                .filter(|f| !found.iter().any(|g| same(f, g)))
                .count() as u64;
        }
        if repair && found.iter().any(|f| f.kind != FindingKind::Lost) {
            let r = self::repair(t, check)?;
            if r.rebuilt {
                repaired.push(BankRepair {
                    bank,
                    kept: r.kept,
                    lost: r.lost,
                    removed_segments: r.removed_segments,
                    lost_file: r.lost_file,
                    findings_after: verify_locked(t, check)?,
                });
            } else {
                // Mended meanwhile (a writer repairs a roster on its own):
                // what is left.
                found = verify_locked(t, check)?;
            }
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
        unconfirmed,
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
            removed_segments: Vec::new(),
            lost_file: None,
            findings_after: vec![finding(FindingKind::BadRecord); after],
        };
        let report = |findings: Vec<BankFinding>, repaired| VerifyReport {
            clean: findings.is_empty(),
            findings,
            unconfirmed: 0,
            repaired,
        };
        assert!(report(vec![], vec![]).passed());
        assert!(!report(found.clone(), vec![]).passed());
        assert!(report(found.clone(), vec![repair(0, 0)]).passed());
        assert!(!report(found.clone(), vec![repair(1, 0)]).passed());
        assert!(!report(found, vec![repair(0, 1)]).passed());
    }

    #[test]
    fn lost_entries_round_trip_through_their_file() {
        let e = [
            LostEntry {
                id: Some(b"web 01\nx".to_vec()),
                at: 1_700_000_000,
                why: "slot 3 points into heap segment 2,\nwhich does not exist".into(),
            },
            LostEntry {
                id: None,
                at: 0,
                why: "4 entries: the index file is missing".into(),
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(".mmap_keys.idx");
        let mut text: String = e.iter().map(lost_line).collect();
        text.push_str("garbage\nlost 12 zz why\n");
        std::fs::write(lost_path(&index), text).unwrap();
        let (got, bad) = read_lost(&index).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].id, e[0].id);
        assert_eq!(
            got[0].why,
            "slot 3 points into heap segment 2, which does not exist"
        );
        assert_eq!(got[1], e[1]);
        assert_eq!(bad, vec![3, 4]);
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn kinds_say_what_a_repair_keeps() {
        assert!(FindingKind::Unreachable.repairable());
        assert!(FindingKind::RosterDuplicate.repairable());
        assert!(!FindingKind::BadRecord.repairable());
        assert!(!FindingKind::IndexMissing.repairable());
        assert!(!FindingKind::Lost.repairable());
        assert!(FindingKind::SegmentMissing.repairable());
    }
}
