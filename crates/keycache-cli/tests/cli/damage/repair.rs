//! `keycache verify --repair` keeps every intact entry.
//!
//! The sample pki tree is migrated with a small segment cap (five heap
//! segments), then heap segments go missing (first, middle, last, several)
//! or are truncated. The repair must keep exactly the entries whose records
//! are still there and intact (as Salt's own reader and keycache's read them
//! afterwards), name each lost id with its reason and the missing segment by
//! its number, leave no segment file behind that the new heap does not use,
//! and a second `verify` must report the lost entries (from the bank's
//! lost-entries file) until their keys are back.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{
    check_ok, finding_whats, kc_dump, keycache, keycache_json, ok, salt_dump_many, small, Params,
    ParamsExt,
};
use keycache::format;
use keycache::format::KEYS_INDEX;
use keycache::{KeyState, MinionId, Store};
use serde_json::Value;

const SEG: u64 = 4096;

fn layout() -> Params {
    small(1009, SEG)
}

fn args<'a>(cmd: &'a str, dir: &'a str, extra: &[&'a str], l: &'a [String]) -> Vec<&'a str> {
    let mut v = vec![cmd, dir];
    if cmd == "verify" {
        // The banks: the stores here are made without a key tree, which
        // verify would report on its own.
        v.extend(["--tree", "never"]);
    }
    v.extend(extra);
    v.extend(l.iter().map(String::as_str));
    v
}

/// The sample tree migrated into `dir`: several heap segments in `keys`.
/// A new temporary directory with the [`sample_store`] in its `s/`.
fn sample_store_dir() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    sample_store(&dir);
    (t, dir)
}

fn sample_store(dir: &Path) {
    let tree = common::repo().join("tools/sample-pki");
    let l = layout().args();
    let out = keycache(&args(
        "migrate",
        tree.to_str().unwrap(),
        &["--out", dir.to_str().unwrap()],
        &l,
    ));
    ok(&out);
    assert!(dir.join(".mmap_keys.idx.heap.4").exists(), "five segments");
    assert!(!dir.join(".mmap_keys.idx.heap.5").exists(), "five segments");
}

/// Where each live `keys` entry's record is: id -> (segment, offset, end).
fn records(dir: &Path) -> BTreeMap<String, (u16, u64, u64)> {
    let s = Store::open_with(dir, &layout().options()).unwrap();
    let scan = s.keys_table().scan().unwrap();
    scan.slots
        .iter()
        .filter(|x| x.status == format::OCCUPIED)
        .map(|x| {
            let (seg, off) = format::unpack_offset(x.fields.offset);
            let end = off + format::record_len(x.fields.len as usize);
            (String::from_utf8(x.id.clone()).unwrap(), (seg, off, end))
        })
        .collect()
}

fn seg_path(dir: &Path, n: u16) -> PathBuf {
    format::segment_path(&dir.join(KEYS_INDEX), n)
}

/// A damage to the `keys` heap.
#[derive(Clone, Copy, Debug)]
enum Hit {
    Remove(u16),
    /// Cut the segment to this many bytes.
    Truncate(u16, u64),
}

/// The `keys` section of a dump.
fn keys_of(v: &Value) -> BTreeMap<String, Value> {
    v["keys"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn segment_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".mmap_keys.idx.heap"))
        .collect()
}

fn repair_case(name: &str, hits: &[Hit]) {
    let (_t, dir) = sample_store_dir();
    let ds = dir.to_str().unwrap();
    let l = layout().args();
    let before = kc_dump(&dir, &layout());
    let salt_before = &salt_dump_many(std::slice::from_ref(&dir), &layout())[0].0;
    assert_eq!(
        keys_of(salt_before),
        keys_of(&before),
        "{name}: Salt reads the sample"
    );
    let where_ = records(&dir);
    assert_eq!(where_.len(), keys_of(&before).len());

    // What the damage takes, told from the pristine slots.
    let mut lost_want = BTreeSet::new();
    let mut missing = BTreeSet::new();
    for h in hits {
        match *h {
            Hit::Remove(n) => {
                std::fs::remove_file(seg_path(&dir, n)).unwrap();
                missing.insert(n);
                lost_want.extend(
                    where_
                        .iter()
                        .filter(|(_, r)| r.0 == n)
                        .map(|(id, _)| id.clone()),
                );
            }
            Hit::Truncate(n, len) => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(seg_path(&dir, n))
                    .unwrap();
                f.set_len(len).unwrap();
                lost_want.extend(
                    where_
                        .iter()
                        .filter(|(_, r)| r.0 == n && r.2 > len)
                        .map(|(id, _)| id.clone()),
                );
            }
        }
    }
    assert!(!lost_want.is_empty(), "{name}: the damage takes entries");

    // verify names each missing segment by its own file.
    let (out, v) = keycache_json(&args("verify", ds, &["--json"], &l));
    assert_eq!(out.status.code(), Some(1), "{name}: {v}");
    let findings = v["findings"].as_array().unwrap();
    for n in &missing {
        let file = seg_path(&dir, *n).display().to_string();
        assert!(
            findings
                .iter()
                .any(|f| f["finding"]["file"] == file.as_str()
                    && f["finding"]["what"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("heap segment {n} is missing"))),
            "{name}: no finding names {file}: {v:#}"
        );
    }
    // Every lost entry is a finding of its own, at its segment.
    for id in &lost_want {
        let seg = seg_path(&dir, where_[id].0).display().to_string();
        assert!(
            findings
                .iter()
                .any(|f| f["finding"]["id"] == id.as_str() && f["finding"]["file"] == seg.as_str()),
            "{name}: {id} is not reported at {seg}"
        );
    }

    // The repair: exactly the damaged entries are lost, each with a reason.
    let (out, v) = keycache_json(&args("verify", ds, &["--repair", "--json"], &l));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{name}: entries were lost: {v:#}"
    );
    let rep = &v["repaired"].as_array().unwrap();
    assert_eq!(rep.len(), 1, "{name}: only keys is damaged: {v:#}");
    let lost: BTreeMap<String, String> = rep[0]["lost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_owned(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        lost.keys().cloned().collect::<BTreeSet<_>>(),
        lost_want,
        "{name}: lost"
    );
    for (id, why) in &lost {
        let n = where_[id].0;
        assert!(
            why.contains(&format!("heap segment {n}")) || why.contains("past the end"),
            "{name}: {id}: reason {why:?}"
        );
    }
    assert_eq!(
        rep[0]["kept"].as_u64().unwrap() as usize,
        where_.len() - lost_want.len(),
        "{name}: kept"
    );
    // Each lost entry is a change of the key state: in the audit trail, a
    // `repair` by the keycache command, with nothing it could not read.
    let hout = keycache(&["history", ds, "--json"]);
    assert!(hout.status.success(), "{name}: history: {hout:?}");
    let hist: Vec<Value> = String::from_utf8_lossy(&hout.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let repaired: BTreeSet<String> = hist
        .iter()
        .filter(|r| r["action"] == "repair")
        .map(|r| {
            assert_eq!(r["program"], "keycache", "{name}: {r}");
            assert!(r["from"].is_null() && r["finger"].is_null(), "{name}: {r}");
            r["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(repaired, lost_want, "{name}: the trail's repairs");

    // Every intact entry is there, for keycache and for Salt, and nothing else.
    let mut want = keys_of(&before);
    want.retain(|id, _| !lost_want.contains(id));
    let after = kc_dump(&dir, &layout());
    assert_eq!(
        keys_of(&after),
        want,
        "{name}: keycache's view after the repair"
    );
    assert_eq!(
        after["denied_keys"], before["denied_keys"],
        "{name}: denied"
    );
    let salt_after = &salt_dump_many(std::slice::from_ref(&dir), &layout())[0].0;
    assert_eq!(
        keys_of(salt_after),
        want,
        "{name}: Salt's view after the repair"
    );

    // The heap is contiguous: no file left past it, none missing in it.
    let files = segment_files(&dir);
    let k = files.len() as u16;
    let contiguous: BTreeSet<String> = (0..k)
        .map(|n| {
            seg_path(&dir, n)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(files, contiguous, "{name}: segment files after the repair");
    let removed: Vec<String> = rep[0]["removed_segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    for r in &removed {
        assert!(!Path::new(r).exists(), "{name}: {r} reported removed");
    }

    // A second verify still reports every lost entry, and nothing else.
    let (out, v) = keycache_json(&args("verify", ds, &["--json"], &l));
    assert_eq!(out.status.code(), Some(1), "{name}: {v:#}");
    let again: BTreeSet<String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert!(
                f["finding"]["file"]
                    .as_str()
                    .unwrap()
                    .ends_with(".mmap_keys.idx.keycache-lost"),
                "{name}: {f}"
            );
            f["finding"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(again, lost_want, "{name}: the second verify");
    // ... and a repair does not rebuild for them.
    let ino = std::fs::metadata(dir.join(KEYS_INDEX)).unwrap();
    let (out, v) = keycache_json(&args("verify", ds, &["--repair", "--json"], &l));
    assert_eq!(out.status.code(), Some(1), "{name}: {v:#}");
    assert!(
        v["repaired"].as_array().unwrap().is_empty(),
        "{name}: {v:#}"
    );
    let ino2 = std::fs::metadata(dir.join(KEYS_INDEX)).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(ino.ino(), ino2.ino(), "{name}: rebuilt for lost entries");

    // Keys submitted again clear their findings; then the store is clean.
    let s = Store::open_with(&dir, &layout().options_with(Duration::ZERO, Duration::ZERO)).unwrap();
    for id in &lost_want {
        let e = &keys_of(&before)[id];
        let st: KeyState = e["state"].as_str().unwrap().parse().unwrap();
        s.put(
            &MinionId::new(id.clone()).unwrap(),
            st,
            e["pub"].as_str().unwrap().as_bytes(),
        )
        .unwrap();
    }
    drop(s);
    let out = keycache(&args("verify", ds, &[], &l));
    check_ok(name, &out);
    assert_eq!(
        keys_of(&kc_dump(&dir, &layout())),
        keys_of(&before),
        "{name}"
    );
}

#[test]
fn a_missing_middle_segment_loses_only_its_own_entries() {
    repair_case("middle", &[Hit::Remove(2)]);
}

#[test]
fn a_missing_first_segment_loses_only_its_own_entries() {
    repair_case("first", &[Hit::Remove(0)]);
}

#[test]
fn a_missing_last_segment_loses_only_its_own_entries() {
    repair_case("last", &[Hit::Remove(4)]);
}

#[test]
fn truncated_segments_lose_only_the_records_cut() {
    repair_case("truncated middle", &[Hit::Truncate(1, 2000)]);
    repair_case("truncated first to nothing", &[Hit::Truncate(0, 0)]);
}

#[test]
fn several_damaged_segments_at_once() {
    repair_case("first and third", &[Hit::Remove(1), Hit::Remove(3)]);
    repair_case(
        "missing, truncated past it",
        &[Hit::Remove(2), Hit::Truncate(3, 1000)],
    );
    repair_case(
        "all but the last",
        &[
            Hit::Remove(0),
            Hit::Remove(1),
            Hit::Remove(2),
            Hit::Remove(3),
        ],
    );
}

/// A segment file past a gap that no live entry points into (what older
/// repairs left behind): reported, and removed by a repair that
/// loses nothing; the store is clean afterwards, the entries untouched.
#[test]
fn stale_segments_past_a_gap_are_removed_and_nothing_is_lost() {
    let (_t, dir) = sample_store_dir();
    let ds = dir.to_str().unwrap();
    let l = layout().args();
    let before = kc_dump(&dir, &layout());
    let stale = seg_path(&dir, 7);
    std::fs::copy(seg_path(&dir, 2), &stale).unwrap();
    let (out, v) = keycache_json(&args("verify", ds, &["--json"], &l));
    assert_eq!(out.status.code(), Some(1), "{v:#}");
    let what = finding_whats(&v);
    assert_eq!(what.len(), 2, "segments 5 and 6 are missing: {v:#}");
    assert!(what[0].starts_with("heap segment 5 is missing") && what[0].contains("stale"));
    let (out, v) = keycache_json(&args("verify", ds, &["--repair", "--json"], &l));
    assert_eq!(out.status.code(), Some(0), "{v:#}");
    let rep = &v["repaired"][0];
    assert!(rep["lost"].as_array().unwrap().is_empty(), "{v:#}");
    assert_eq!(
        rep["removed_segments"][0],
        stale.display().to_string().as_str()
    );
    assert!(!stale.exists());
    assert_eq!(kc_dump(&dir, &layout()), before);
    let out = keycache(&args("verify", ds, &[], &l));
    assert_eq!(out.status.code(), Some(0));
    assert!(!dir.join(".mmap_keys.idx.keycache-lost").exists());
}

/// A repair of an undamaged bank rebuilds nothing: the library says so
/// (`Repaired::rebuilt`), and the files keep their inodes.
#[test]
fn a_clean_bank_is_not_rebuilt() {
    use std::os::unix::fs::MetadataExt;
    let (_t, dir) = sample_store_dir();
    let ino = |n: &str| std::fs::metadata(dir.join(n)).unwrap().ino();
    let before = (
        ino(KEYS_INDEX),
        ino(".mmap_keys.idx.roster"),
        ino(".mmap_keys.idx.heap.4"),
    );
    let s = Store::open_with(&dir, &layout().options()).unwrap();
    let r =
        keycache::verify::repair(s.keys_table(), Some(keycache::verify::check_key_value)).unwrap();
    assert!(!r.rebuilt && r.lost.is_empty() && r.removed_segments.is_empty());
    drop(s);
    let l = layout().args();
    let (out, v) = keycache_json(&args(
        "verify",
        dir.to_str().unwrap(),
        &["--repair", "--json"],
        &l,
    ));
    assert_eq!(out.status.code(), Some(0), "{v:#}");
    assert!(v["repaired"].as_array().unwrap().is_empty(), "{v:#}");
    let after = (
        ino(KEYS_INDEX),
        ino(".mmap_keys.idx.roster"),
        ino(".mmap_keys.idx.heap.4"),
    );
    assert_eq!(before, after);
}
