//! Corruption and hostile files, through the library.
//!
//! Every file of both banks of a store with history (several heap segments,
//! garbage, tombstones) is truncated, extended, zeroed, bit-flipped (at
//! random and at the header, slot fields, record checksums and values, and
//! roster entries) or removed (a segment in the middle too). On each damaged
//! copy, opening, reading every id, `get_many`, listing, counting, stats,
//! verifying and repairing must not panic, hang (a watchdog) or raise
//! SIGBUS (a handler names the case), and must never return a wrong value:
//! each id reads back its value, or nothing, or a `Corrupt` error naming a
//! file of the store, and whatever is not intact is reported by `verify`
//! with its file (and, for records, the offset). The one thing the format
//! cannot tell is an id renamed by damage to its own bytes (no checksum
//! covers ids): such cases are counted, and only allowed when the damage
//! touched an id field.
//!
//! Bank files that are symlinks, directories, sockets or FIFOs are refused
//! with a clear error, without blocking (the `keycache` binary's tests
//! check that its commands refuse them too).
//!
//! `KEYCACHE_CORRUPTIONS` sets the number of random damages (default 600).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keycache::format::{DENIED_INDEX, KEYS_INDEX};
use keycache::verify::{self, Finding};
use keycache::{Error, KeyState, MinionId, Store};
use keycache_testkit::common::{pem, Params, ParamsExt, Rng};
use keycache_testkit::crash::env_u64;
use keycache_testkit::sys;

fn layout() -> Params {
    Params {
        size: 257,
        max_segment_bytes: 3000,
        id_size: 64,
        slot_size: 96,
    }
}

/// Truth: keys id -> (state, pem), denied id -> pem.
#[derive(Clone, Debug, Default, PartialEq)]
struct Truth {
    keys: BTreeMap<String, (KeyState, Vec<u8>)>,
    denied: BTreeMap<String, Vec<u8>>,
}

/// A store with history; every value has a length of its own, so damage to
/// a pointer can never land on another whole record of the same length.
fn build(dir: &Path) -> Truth {
    let s = Store::open_with(dir, &layout().options_with(Duration::ZERO, Duration::ZERO)).unwrap();
    let mut t = Truth::default();
    let mut rng = Rng::new(0xC0FFEE);
    let mut len = 40usize;
    let mut next = |n: &str| {
        len += 7;
        pem(n, len).into_bytes()
    };
    for i in 0..70 {
        let id = format!("host-{i:03}.corrupt.example");
        let m = MinionId::new(id.clone()).unwrap();
        let st = KeyState::ALL[i % 3];
        let v = next(&id);
        s.put(&m, st, &v).unwrap();
        t.keys.insert(id.clone(), (st, v));
        if i % 4 == 0 {
            let d = next(&format!("d{id}"));
            s.deny(&m, &d).unwrap();
            t.denied.insert(id.clone(), d);
        }
    }
    for _ in 0..40 {
        let i = rng.below(70);
        let id = format!("host-{i:03}.corrupt.example");
        let m = MinionId::new(id.clone()).unwrap();
        match rng.below(3) {
            0 => {
                s.remove(&m).unwrap();
                t.keys.remove(&id);
            }
            1 => {
                let st = KeyState::ALL[rng.below(3) as usize];
                let v = next(&id);
                s.put(&m, st, &v).unwrap();
                t.keys.insert(id, (st, v));
            }
            _ => {
                if s.remove_denied(&m).unwrap() {
                    t.denied.remove(&id);
                }
            }
        }
    }
    t
}

fn bank_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    v.sort();
    v
}

/// What a damage did: a description, and whether it touched an id field.
struct Damage {
    what: String,
    id_field: bool,
}

fn slot_range(p: &Params, off: usize) -> Option<(usize, usize)> {
    let s = off / p.slot_size;
    (s > 0 && s < p.size as usize).then(|| (s, off % p.slot_size))
}

/// Applies one random damage to a copy of the store.
fn damage(dir: &Path, rng: &mut Rng) -> Damage {
    let p = layout();
    let files = bank_files(dir);
    let name = rng.pick(&files).clone();
    let path = dir.join(&name);
    let mut b = std::fs::read(&path).unwrap();
    let len = b.len();
    let is_index = name == KEYS_INDEX || name == DENIED_INDEX;
    let is_heap = name.contains(".heap");
    let mut id_field = false;
    let touch = |off: usize, id_field: &mut bool| {
        if is_index {
            if let Some((_, o)) = slot_range(&p, off) {
                if (1..1 + p.id_size).contains(&o) {
                    *id_field = true;
                }
            }
        }
    };
    let what = match rng.below(14) {
        0 => {
            let to = match rng.below(6) {
                0 => 0,
                1 => 1,
                2 => len / 2,
                3 => len.saturating_sub(1),
                4 => len.saturating_sub(9),
                _ => rng.below(len as u64 + 1) as usize,
            };
            b.truncate(to);
            format!("{name} truncated {len} -> {to}")
        }
        1 => {
            let n = [1usize, 3, 4096, 100][rng.below(4) as usize];
            let zero = rng.below(2) == 0;
            for _ in 0..n {
                b.push(if zero { 0 } else { rng.next() as u8 });
            }
            format!(
                "{name} extended by {n} {} bytes",
                if zero { "zero" } else { "random" }
            )
        }
        2 | 3 => {
            if len == 0 {
                return Damage {
                    what: format!("{name} empty, left alone"),
                    id_field,
                };
            }
            let at = rng.below(len as u64) as usize;
            let n = if rng.below(3) == 0 {
                4096
            } else {
                1 + rng.below(300) as usize
            };
            let end = (at + n).min(len);
            for (o, x) in b.iter_mut().enumerate().take(end).skip(at) {
                *x = 0;
                touch(o, &mut id_field);
            }
            format!("{name} zeroed at {at}..{end}")
        }
        4..=7 => {
            if len == 0 {
                return Damage {
                    what: format!("{name} empty, left alone"),
                    id_field,
                };
            }
            let flips = 1 + rng.below(4);
            let mut at = Vec::new();
            for _ in 0..flips {
                let o = rng.below(len as u64) as usize;
                b[o] ^= 1 << rng.below(8);
                touch(o, &mut id_field);
                at.push(o);
            }
            format!("{name} bits flipped at {at:?}")
        }
        8 | 9 if is_index => {
            // A field of an occupied slot, or the header.
            let occupied: Vec<usize> = (1..p.size as usize)
                .filter(|s| b.get(s * p.slot_size) == Some(&1))
                .collect();
            if rng.below(4) == 0 || occupied.is_empty() {
                let o = rng.below(25) as usize;
                b[o] ^= 1 << rng.below(8);
                format!("{name} header byte {o} flipped")
            } else {
                let s = *rng.pick(&occupied);
                let base = s * p.slot_size;
                let (field, o) = match rng.below(5) {
                    0 => ("status", base),
                    1 => ("id", base + 1 + rng.below(12) as usize),
                    2 => ("offset", base + 65 + rng.below(8) as usize),
                    3 => ("length", base + 73 + rng.below(4) as usize),
                    _ => ("mtime", base + 77 + rng.below(8) as usize),
                };
                if field == "status" && rng.below(2) == 0 {
                    b[o] = [0u8, 2, 3, 0xff][rng.below(4) as usize];
                } else {
                    b[o] ^= 1 << rng.below(8);
                }
                id_field = field == "id";
                format!("{name} slot {s} {field} byte {o} changed")
            }
        }
        8 | 9 if is_heap && len > 8 => {
            // Inside a record: somewhere in the first bytes of one.
            let o = rng.below(len as u64) as usize;
            b[o] ^= 0x80;
            format!("{name} record byte {o} flipped")
        }
        10 if name.ends_with(".roster") && len >= 4 => {
            let i = rng.below(len as u64 / 4) as usize * 4;
            let v: u32 = match rng.below(5) {
                0 => u32::MAX,
                1 => 0,
                2 => p.size as u32 + rng.below(1000) as u32,
                3 => u32::from_le_bytes(b[..4].try_into().unwrap()),
                _ => rng.below(p.size) as u32,
            };
            b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            format!("{name} roster entry {} set to {v}", i / 4)
        }
        11 => {
            std::fs::remove_file(&path).unwrap();
            return Damage {
                what: format!("{name} removed"),
                id_field,
            };
        }
        12 => {
            // A segment in the middle goes missing.
            let segs: Vec<&String> = files.iter().filter(|f| f.contains(".heap.")).collect();
            if let Some(s) = segs.first() {
                std::fs::remove_file(dir.join(s)).unwrap();
                return Damage {
                    what: format!("{s} (a middle segment) removed"),
                    id_field,
                };
            }
            b.clear();
            format!("{name} emptied")
        }
        _ => {
            // A page of garbage.
            let at = if len > 0 {
                rng.below(len as u64) as usize
            } else {
                0
            };
            let end = (at + 4096).min(len);
            for (o, x) in b.iter_mut().enumerate().take(end).skip(at) {
                *x = rng.next() as u8;
                touch(o, &mut id_field);
            }
            format!("{name} garbage at {at}..{end}")
        }
    };
    std::fs::write(&path, &b).unwrap();
    Damage { what, id_field }
}

// -- SIGBUS: name the case, then die -----------------------------------------

fn install_sigbus() {
    sys::report_sigbus();
}

fn set_case(s: &str) {
    sys::set_sigbus_context(&format!("corruption case: {s}"));
}

// -- The checks ----------------------------------------------------------------

#[derive(Debug, Default)]
struct Tally {
    cases: u64,
    refused: u64,
    intact: u64,
    lost: u64,
    corrupt_reads: u64,
    wrong_but_reported: u64,
    id_renamed_unreported: u64,
    with_findings: u64,
    repaired: u64,
}

fn in_dir(dir: &Path, p: &Path) -> bool {
    p.starts_with(dir)
}

fn error_path(e: &Error) -> Option<&Path> {
    match e {
        Error::Corrupt { path, .. }
        | Error::Mismatch { path, .. }
        | Error::NotARegularFile { path, .. }
        | Error::Io { path, .. } => Some(path),
        _ => None,
    }
}

fn findings(s: &Store) -> keycache::Result<Vec<Finding>> {
    verify::verify_store(s)
}

/// Reads everything of a damaged store and checks it. Returns a note when
/// something the format cannot detect happened.
/// One lookup of a damaged store (`what`) against the truth `want`:
/// `Some(true)` it answered the truth, `Some(false)` damage, counted in
/// `tally` (a wrong value needs verify's `findings`, an error must be a
/// corruption error), `None` absent as it should be.
fn judge<T: PartialEq + std::fmt::Debug>(
    got: &Result<Option<T>, Error>,
    want: Option<&T>,
    findings: bool,
    what: &str,
    tally: &mut Tally,
) -> Option<bool> {
    match got {
        Ok(Some(v)) if want == Some(v) => Some(true),
        Ok(Some(v)) => {
            assert!(
                findings,
                "{what} returned a wrong value ({v:?}) and verify is clean"
            );
            tally.wrong_but_reported += 1;
            Some(false)
        }
        Ok(None) if want.is_some() => {
            tally.lost += 1;
            Some(false)
        }
        Ok(None) => None,
        Err(e) => {
            assert!(e.is_corrupt(), "{what}: {e}");
            tally.corrupt_reads += 1;
            Some(false)
        }
    }
}

fn check_damaged(dir: &Path, truth: &Truth, d: &Damage, tally: &mut Tally) {
    let ctx = &d.what;
    tally.cases += 1;
    let store = match Store::open_with(dir, &layout().options_with(Duration::ZERO, Duration::ZERO))
    {
        Ok(s) => s,
        Err(e) => {
            let p =
                error_path(&e).unwrap_or_else(|| panic!("{ctx}: open refused without a file: {e}"));
            assert!(in_dir(dir, p), "{ctx}: {e}");
            assert!(
                matches!(e, Error::Mismatch { .. } | Error::NotARegularFile { .. }),
                "{ctx}: open failed with {e}"
            );
            tally.refused += 1;
            return;
        }
    };
    let f = findings(&store).unwrap_or_else(|e| panic!("{ctx}: verify failed: {e}"));
    for x in &f {
        assert!(
            in_dir(dir, &x.file),
            "{ctx}: finding outside the store: {x:?}"
        );
        // A record's finding names its offset (a missing segment's names
        // the segment file alone).
        if x.kind == verify::FindingKind::BadRecord && x.file.to_string_lossy().contains(".heap") {
            assert!(
                x.offset.is_some(),
                "{ctx}: record finding without an offset: {x:?}"
            );
        }
    }
    if !f.is_empty() {
        tally.with_findings += 1;
    }
    let mut damaged = false;
    let mut intact_before: HashSet<(bool, String)> = HashSet::new();
    let ids: Vec<String> = truth
        .keys
        .keys()
        .chain(truth.denied.keys())
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .chain(["absent-id".to_owned()])
        .collect();
    for id in &ids {
        let m = MinionId::new(id.clone()).unwrap();
        let got = store.get(&m).map(|v| v.map(|e| (e.state, e.public_key)));
        if let Err(e) = &got {
            assert!(in_dir(dir, error_path(e).unwrap()), "{ctx}: {e}");
        }
        let what = format!("{ctx}: get({id})");
        match judge(&got, truth.keys.get(id), !f.is_empty(), &what, tally) {
            Some(true) => {
                intact_before.insert((true, id.clone()));
            }
            Some(false) => damaged = true,
            None => {}
        }
        let what = format!("{ctx}: denied({id})");
        match judge(
            &store.denied(&m),
            truth.denied.get(id),
            !f.is_empty(),
            &what,
            tally,
        ) {
            Some(true) => {
                intact_before.insert((false, id.clone()));
            }
            Some(false) => damaged = true,
            None => {}
        }
    }
    let all: Vec<MinionId> = ids
        .iter()
        .map(|i| MinionId::new(i.clone()).unwrap())
        .collect();
    let _ = store.get_many(&all);
    // Listing: anything listed that is not the truth is reported.
    let mut listed_wrong = false;
    match store.keys(None) {
        Ok(it) => {
            for r in it {
                match r {
                    Ok((id, e)) => {
                        if truth.keys.get(&id) != Some(&(e.state, e.public_key)) {
                            listed_wrong = true;
                        }
                    }
                    Err(e) => {
                        assert!(e.is_corrupt(), "{ctx}: listing: {e}");
                        damaged = true;
                    }
                }
            }
        }
        // A missing index whose roster lists entries: the bank is not
        // empty, and listing it says so.
        Err(e) => {
            assert!(e.is_corrupt(), "{ctx}: listing failed: {e}");
            damaged = true;
        }
    }
    for r in store.denied_keys().into_iter().flatten() {
        match r {
            Ok((id, v)) => {
                if truth.denied.get(&id) != Some(&v) {
                    listed_wrong = true;
                }
            }
            Err(e) => {
                assert!(e.is_corrupt(), "{ctx}: listing: {e}");
                damaged = true;
            }
        }
    }
    if (damaged || listed_wrong) && f.is_empty() {
        // Only an id renamed by damage to its own bytes escapes verify.
        assert!(
            d.id_field,
            "{ctx}: entries are lost or wrong, yet verify is clean"
        );
        tally.id_renamed_unreported += 1;
    }
    if !damaged && !listed_wrong {
        tally.intact += 1;
    }
    let _ = store.counts();
    let _ = store.stats();
    let _ = verify::probe_stats(store.keys_table());
    // Repair: clean afterwards, and nothing intact lost (an id stored twice
    // by damage may keep the other copy).
    if !f.is_empty() {
        let dup = f.iter().any(|x| x.what.contains("stored in"));
        let rk = verify::repair(store.keys_table(), Some(verify::check_key_value))
            .unwrap_or_else(|e| panic!("{ctx}: repair keys: {e}"));
        let rd = verify::repair(store.denied_table(), None)
            .unwrap_or_else(|e| panic!("{ctx}: repair denied: {e}"));
        tally.repaired += 1;
        let again =
            Store::open_with(dir, &layout().options_with(Duration::ZERO, Duration::ZERO)).unwrap();
        let after = findings(&again).unwrap();
        // Stricter now: what a repair lost stays reported (from
        // the bank's lost-entries file), and nothing else is left.
        let lost: HashSet<String> = rk
            .lost
            .iter()
            .chain(&rd.lost)
            .map(|(id, _)| id.clone())
            .collect();
        for x in &after {
            assert_eq!(
                x.kind,
                verify::FindingKind::Lost,
                "{ctx}: finding after repair: {x:?}"
            );
            if let Some(id) = &x.id {
                assert!(
                    lost.contains(id),
                    "{ctx}: reported lost, not lost by the repair: {x:?}"
                );
            }
        }
        if !dup {
            for (keys, id) in &intact_before {
                let m = MinionId::new(id.clone()).unwrap();
                if *keys {
                    let e = again.get(&m).unwrap().expect("kept");
                    assert_eq!(
                        Some(&(e.state, e.public_key)),
                        truth.keys.get(id),
                        "{ctx}: {id}"
                    );
                } else {
                    assert_eq!(
                        again.denied(&m).unwrap().as_ref(),
                        truth.denied.get(id),
                        "{ctx}: {id}"
                    );
                }
            }
        }
    }
}

fn with_watchdog<T: Send + 'static>(what: String, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(());
        r
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        panic!("hang: {what} did not finish in 60 s");
    }
    match h.join().unwrap() {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e),
    }
}

#[test]
fn damaged_files_never_panic_hang_or_lie() {
    install_sigbus();
    let n = env_u64("KEYCACHE_CORRUPTIONS", 600);
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let truth = build(&base);
    assert!(
        bank_files(&base).iter().any(|f| f.ends_with(".heap.2")),
        "several segments"
    );
    let mut rng = Rng::new(0xDA_4A6E);
    let start = Instant::now();
    let truth = std::sync::Arc::new(truth);
    let mut tally = Tally::default();
    for k in 0..n {
        let dir = t.path().join(format!("case-{k}"));
        std::fs::create_dir(&dir).unwrap();
        for f in bank_files(&base) {
            std::fs::copy(base.join(&f), dir.join(&f)).unwrap();
        }
        // One damage, sometimes two or three.
        let mut ds = vec![damage(&dir, &mut rng)];
        while rng.below(4) == 0 && ds.len() < 3 {
            ds.push(damage(&dir, &mut rng));
        }
        let d = Damage {
            what: format!(
                "case {k}: {}",
                ds.iter()
                    .map(|d| d.what.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            id_field: ds.iter().any(|d| d.id_field),
        };
        set_case(&d.what);
        let (truth, dir2) = (truth.clone(), dir.clone());
        tally = with_watchdog(d.what.clone(), move || {
            let mut tally = tally;
            check_damaged(&dir2, &truth, &d, &mut tally);
            tally
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }
    eprintln!(
        "corruption: {n} damaged stores in {:.1} s: {tally:?}",
        start.elapsed().as_secs_f64()
    );
    assert!(tally.refused > 0 && tally.corrupt_reads > 0 && tally.repaired > 0);
}

/// A bank file replaced by a symlink (even to a sound copy), a directory, a
/// socket or a FIFO: refused, naming the file and what it is; never followed,
/// never blocking.
#[test]
fn bank_files_that_are_not_regular_files_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    std::fs::create_dir(&base).unwrap();
    build(&base);
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let mut names = bank_files(&base);
    names.push(format!("{KEYS_INDEX}.lock"));
    let mut cases = 0;
    for name in &names {
        for kind in ["symlink", "directory", "socket", "fifo"] {
            let dir = t.path().join(format!("{name}-{kind}"));
            std::fs::create_dir(&dir).unwrap();
            for f in bank_files(&base) {
                std::fs::copy(base.join(&f), dir.join(&f)).unwrap();
            }
            let path = dir.join(name);
            let sound = outside.join(format!("{name}-{kind}"));
            if path.exists() {
                std::fs::rename(&path, &sound).unwrap();
            } else {
                std::fs::write(&sound, b"").unwrap();
            }
            match kind {
                "symlink" => std::os::unix::fs::symlink(&sound, &path).unwrap(),
                "directory" => std::fs::create_dir(&path).unwrap(),
                "socket" => drop(std::os::unix::net::UnixListener::bind(&path).unwrap()),
                _ => {
                    sys::mkfifo(&path, 0o600).unwrap();
                }
            }
            let ctx = format!("{name} as a {kind}");
            let before = std::fs::read(&sound).unwrap();
            let d2 = dir.clone();
            let n2 = name.clone();
            let msgs = with_watchdog(ctx.clone(), move || {
                let mut msgs = Vec::new();
                // Library: open, read, list, write.
                let r =
                    Store::open_with(&d2, &layout().options_with(Duration::ZERO, Duration::ZERO))
                        .and_then(|s| {
                            let id = MinionId::new("host-001.corrupt.example").unwrap();
                            s.get(&id)?;
                            s.keys(None)?.count();
                            s.denied_keys()?.count();
                            s.put(
                                &id,
                                KeyState::Accepted,
                                b"-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n",
                            )?;
                            s.deny(
                                &id,
                                b"-----BEGIN PUBLIC KEY-----\ny\n-----END PUBLIC KEY-----\n",
                            )?;
                            Ok(())
                        });
                let e = r.expect_err("refused");
                msgs.push(e.to_string());
                assert!(matches!(e, Error::NotARegularFile { .. }), "{n2}: {e:?}");
                msgs
            });
            let what = match kind {
                "symlink" => "symlink",
                "directory" => "directory",
                _ => "not a regular file",
            };
            assert!(
                msgs[0].contains(what) && msgs[0].contains(name.as_str()),
                "{ctx}: {}",
                msgs[0]
            );
            assert_eq!(
                std::fs::read(&sound).unwrap(),
                before,
                "{ctx}: the target changed"
            );
            cases += 1;
        }
    }
    eprintln!("not-regular bank files: {cases} cases refused");
}

/// Header counters that overflow when added.
#[test]
fn stats_survive_absurd_header_counters() {
    let t = tempfile::tempdir().unwrap();
    build(t.path());
    let idx = t.path().join(KEYS_INDEX);
    let mut b = std::fs::read(&idx).unwrap();
    b[1..9].copy_from_slice(&u64::MAX.to_le_bytes());
    b[9..17].copy_from_slice(&7u64.to_le_bytes());
    std::fs::write(&idx, &b).unwrap();
    let s = Store::open_with(
        t.path(),
        &layout().options_with(Duration::ZERO, Duration::ZERO),
    )
    .unwrap();
    let _ = s.stats();
    let f = findings(&s).unwrap();
    assert!(!f.is_empty());
}

/// A store whose files were truncated while it was open (by someone else):
/// keycache checks lengths before touching mapped bytes past them.
#[test]
fn files_shrinking_under_an_open_store_are_reported_not_faulted() {
    install_sigbus();
    let t = tempfile::tempdir().unwrap();
    let truth = build(t.path());
    set_case("files shrinking under an open store");
    let s = Store::open_with(
        t.path(),
        &layout().options_with(Duration::ZERO, Duration::ZERO),
    )
    .unwrap();
    // Warm the mappings.
    for id in truth.keys.keys() {
        s.get(&MinionId::new(id.clone()).unwrap()).unwrap();
    }
    for f in bank_files(t.path()) {
        if f.contains(".heap") {
            let p: PathBuf = t.path().join(&f);
            let len = std::fs::metadata(&p).unwrap().len();
            let file = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            file.set_len(len / 3).unwrap();
        }
    }
    let mut corrupt = 0;
    for id in truth.keys.keys() {
        match s.get(&MinionId::new(id.clone()).unwrap()) {
            Ok(Some(e)) => assert_eq!(Some(&(e.state, e.public_key)), truth.keys.get(id)),
            Ok(None) => panic!("{id} vanished"),
            Err(e) => {
                assert!(e.is_corrupt(), "{e}");
                corrupt += 1;
            }
        }
    }
    assert!(corrupt > 0);
    let f = findings(&s).unwrap();
    assert!(
        f.iter().any(|x| x.what.contains("past the end")) && f.iter().all(|x| x.offset.is_some()),
        "{f:?}"
    );
}
