//! The lost-entries file (`I.keycache-lost`): the ids a repair could not keep, so
//! that later runs of `verify` go on reporting them.

use super::*;

/// The file in which repairs of the bank whose index is `index` list the
/// entries they could not keep: `I.keycache-lost` (keycache's own; Salt
/// ignores it). [`verify`] reports each entry listed there
/// ([`FindingKind::Lost`]) for as long as the bank does not hold its id
/// again; remove the file to forget them.
pub fn lost_path(index: &Path) -> PathBuf {
    crate::format::lost_path(index)
}

/// The most of a lost-entries file that is read.
pub(super) const LOST_MAX: u64 = 16 << 20;

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
pub(super) fn lost_line(e: &LostEntry) -> String {
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
pub(super) fn record_lost(t: &Table, lost: &[LostEntry], live: &HashSet<&[u8]>) -> Result<()> {
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
pub(super) fn utc(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = crate::clock::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The entries of the lost-entries file that the bank does not hold again
/// (the latest line of each id), and its unreadable lines.
pub(super) fn lost_findings(t: &Table, scan: &Scan) -> Result<Vec<Finding>> {
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
