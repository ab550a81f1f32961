//! Repair: a bank rebuilt from its intact entries, under its lock.

use super::*;

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
pub(super) fn orphaned_roster_entries(t: &Table) -> usize {
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
