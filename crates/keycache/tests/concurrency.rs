//! Concurrency: lock-free readers beside a writer of the same process
//! (puts, state changes, removes, denies, batches, compactions), readers
//! that never wait for a writer holding the banks' locks, and readers beside
//! a Salt-style in-place rewrite of a record from another file handle.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use keycache::format::{self, Params};
use keycache::store::{encode_key_value, KEYS_INDEX};
use keycache::{Error, KeyState, MinionId, OpenOptions, Store};
use keycache_testkit::rng::Rng;

fn opts(size: u64, max_segment_bytes: u64, refresh_ms: u64) -> OpenOptions {
    OpenOptions {
        params: Params {
            size,
            max_segment_bytes,
            ..Params::default()
        },
        refresh: Duration::from_millis(refresh_ms),
        ownership: None,
        ..OpenOptions::default()
    }
}

/// A random key state.
fn random_state(rng: &mut Rng) -> KeyState {
    *rng.pick(&KeyState::ALL)
}

fn seed() -> u64 {
    std::env::var("KEYCACHE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// A PEM-like value that names its id and version, `len` bytes long (at
/// least the header and footer).
fn value(id: &str, tag: &str, v: u64, len: usize) -> Vec<u8> {
    let head = format!("-----BEGIN PUBLIC KEY-----\nid={id}, {tag}={v}\n");
    let foot = "\n-----END PUBLIC KEY-----\n";
    let mut s = head.into_bytes();
    let pad = len.saturating_sub(s.len() + foot.len());
    s.extend((0..pad).map(|i| {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[(i + v as usize) % 64]
    }));
    s.extend_from_slice(foot.as_bytes());
    s
}

/// The id a value names, from its `id=...,` line.
fn named_id(v: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(v).ok()?;
    let rest = s.split_once("\nid=")?.1;
    Some(rest.split_once(',')?.0)
}

type Written = Mutex<HashMap<String, HashSet<Vec<u8>>>>;

fn record(w: &Written, id: &MinionId, v: Vec<u8>) {
    w.lock()
        .unwrap()
        .entry(id.as_str().to_owned())
        .or_default()
        .insert(v);
}

fn was_written(w: &Written, id: &MinionId, v: &[u8]) -> bool {
    w.lock()
        .unwrap()
        .get(id.as_str())
        .is_some_and(|set| set.contains(v))
}

/// What readers found wrong.
#[derive(Default)]
struct Problems(Mutex<Vec<String>>);

impl Problems {
    fn add(&self, s: String) {
        let mut v = self.0.lock().unwrap();
        if v.len() < 20 {
            v.push(s);
        }
    }

    fn assert_none(&self) {
        let v = self.0.lock().unwrap();
        assert!(v.is_empty(), "{} problem(s):\n{}", v.len(), v.join("\n"));
    }
}

/// Checks a keys-bank entry read for `id`.
fn check_key(w: &Written, p: &Problems, what: &str, id: &MinionId, e: &keycache::KeyEntry) {
    let v = encode_key_value(e.state, &e.public_key);
    if named_id(&e.public_key) != Some(id.as_str()) {
        p.add(format!(
            "{what}({id}): another id's value or a mixture: {:?}",
            String::from_utf8_lossy(&e.public_key)
        ));
    } else if !was_written(w, id, &v) {
        p.add(format!(
            "{what}({id}): a value never written: {} {:?}",
            e.state,
            String::from_utf8_lossy(&e.public_key)
        ));
    }
}

fn check_denied(w: &Written, p: &Problems, id: &MinionId, v: &[u8]) {
    if named_id(v) != Some(id.as_str()) {
        p.add(format!(
            "denied({id}): another id's value or a mixture: {:?}",
            String::from_utf8_lossy(v)
        ));
    } else if !was_written(w, id, v) {
        p.add(format!(
            "denied({id}): a value never written: {:?}",
            String::from_utf8_lossy(v)
        ));
    }
}

// ---------------------------------------------------------------------------
// a) readers beside a writer
// ---------------------------------------------------------------------------

/// One write of the writer thread, recorded before it is issued.
enum W {
    Put(MinionId, KeyState, Vec<u8>),
    SetState(MinionId, KeyState),
    Remove(MinionId),
    Deny(MinionId, Vec<u8>),
    RemoveDenied(MinionId),
}

struct Writer<'a> {
    rng: Rng,
    ids: &'a [MinionId],
    keys: &'a Written,
    denied: &'a Written,
    /// The writer's own view of the keys bank (it is the only writer).
    cur: HashMap<MinionId, (KeyState, Vec<u8>)>,
    last_len: HashMap<MinionId, usize>,
    version: u64,
}

impl Writer<'_> {
    /// A new value's length: often the previous one's (what Salt would
    /// rewrite in place), else shorter or longer.
    fn len_for(&mut self, id: &MinionId) -> usize {
        let last = self.last_len.get(id).copied().unwrap_or(200);
        let len = match self.rng.below(3) {
            0 => last,
            1 => 60 + self.rng.below(240) as usize,
            _ => 300 + self.rng.below(700) as usize,
        };
        self.last_len.insert(id.clone(), len);
        len
    }

    /// Draws a write, records the value it stores, and updates the view.
    fn draw(&mut self) -> W {
        let id = self.rng.pick(self.ids).clone();
        self.version += 1;
        let v = self.version;
        match self.rng.below(20) {
            0..=7 => {
                let st = random_state(&mut self.rng);
                let len = self.len_for(&id);
                let pem = value(id.as_str(), "v", v, len);
                record(self.keys, &id, encode_key_value(st, &pem));
                self.cur.insert(id.clone(), (st, pem.clone()));
                W::Put(id, st, pem)
            }
            8..=10 => {
                let st = random_state(&mut self.rng);
                if let Some((s, pem)) = self.cur.get_mut(&id) {
                    *s = st;
                    record(self.keys, &id, encode_key_value(st, pem));
                }
                W::SetState(id, st)
            }
            11..=13 => {
                self.cur.remove(&id);
                W::Remove(id)
            }
            14..=17 => {
                let len = self.len_for(&id);
                let pem = value(id.as_str(), "denied", v, len);
                record(self.denied, &id, pem.clone());
                W::Deny(id, pem)
            }
            _ => W::RemoveDenied(id),
        }
    }
}

#[test]
fn readers_see_only_values_that_were_written() {
    const RUN: Duration = Duration::from_millis(1500);
    let seed = seed();
    eprintln!("seed {seed} (KEYCACHE_TEST_SEED to replay the writer's choices)");
    let d = tempfile::tempdir().unwrap();
    // 50 ids in 127 data slots; 16 KiB segments so the heap rolls often.
    let o = opts(128, 16 << 10, 5);
    let store = Store::open_with(d.path(), &o).unwrap();
    let ids: Vec<MinionId> = (0..50)
        .map(|i| MinionId::new(format!("minion-{i:02}")).unwrap())
        .collect();
    let keys = Written::default();
    let denied = Written::default();
    let problems = Problems::default();
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let compactions = AtomicU64::new(0);
    let mut w = Writer {
        rng: Rng::new(seed),
        ids: &ids,
        keys: &keys,
        denied: &denied,
        cur: HashMap::new(),
        last_len: HashMap::new(),
        version: 0,
    };
    // Start with every id present.
    for id in &ids {
        let len = w.len_for(id);
        let pem = value(id.as_str(), "v", 0, len);
        record(&keys, id, encode_key_value(KeyState::Pending, &pem));
        w.cur.insert(id.clone(), (KeyState::Pending, pem.clone()));
        store.put(id, KeyState::Pending, &pem).unwrap();
    }
    // A second handle in the same process, which only sees the files (and
    // the compactions' renames) through its refresh.
    let other = Store::open_with(d.path(), &o).unwrap();
    let lookups: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
    let found = AtomicU64::new(0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let start = Instant::now();
            let mut next_compact = Duration::from_millis(100);
            while start.elapsed() < RUN {
                let apply = |s: &Store, op: W| -> keycache::Result<()> {
                    match op {
                        W::Put(id, st, pem) => s.put(&id, st, &pem),
                        W::SetState(id, st) => s.set_state(&id, st).map(drop),
                        W::Remove(id) => s.remove(&id).map(drop),
                        W::Deny(id, pem) => s.deny(&id, &pem),
                        W::RemoveDenied(id) => s.remove_denied(&id).map(drop),
                    }
                };
                let r = if w.rng.below(8) == 0 {
                    // A batch of several writes.
                    let n = 2 + w.rng.below(5);
                    let ops: Vec<W> = (0..n).map(|_| w.draw()).collect();
                    writes.fetch_add(n, Ordering::Relaxed);
                    store
                        .batch(|b| {
                            for op in ops {
                                match op {
                                    W::Put(id, st, pem) => b.put(&id, st, &pem)?,
                                    W::SetState(id, st) => drop(b.set_state(&id, st)?),
                                    W::Remove(id) => b.remove(&id)?,
                                    W::Deny(id, pem) => b.deny(&id, &pem)?,
                                    W::RemoveDenied(id) => b.remove_denied(&id)?,
                                }
                            }
                            Ok(())
                        })
                        .map(drop)
                } else {
                    writes.fetch_add(1, Ordering::Relaxed);
                    apply(&store, w.draw())
                };
                if let Err(e) = r {
                    problems.add(format!("writer: {e}"));
                    break;
                }
                if start.elapsed() >= next_compact {
                    next_compact += Duration::from_millis(100 + w.rng.below(150));
                    if let Err(e) = store.compact(None) {
                        problems.add(format!("compact: {e}"));
                        break;
                    }
                    compactions.fetch_add(1, Ordering::Relaxed);
                }
            }
            stop.store(true, Ordering::Release);
        });
        for (r, count) in lookups.iter().enumerate() {
            let (ids, keys, denied, problems, stop, found) =
                (&ids, &keys, &denied, &problems, &stop, &found);
            let s = if r == 2 { &other } else { &store };
            sc.spawn(move || {
                let mut rng = Rng::new(seed ^ (r as u64 + 1).wrapping_mul(0x1234_5678_9abc_def1));
                let mut n = 0u64;
                let (mut buf, mut batch) = (Vec::new(), keycache::KeyBatch::new());
                // A reader handle kept for the whole run: it must follow the
                // writes and compactions as the store's own lookups do.
                let mut reader = s.reader();
                while !stop.load(Ordering::Acquire) {
                    let id = rng.pick(ids);
                    match reader.get_in(id, &mut buf) {
                        Ok(Some(e)) => {
                            check_key(keys, problems, "Reader::get_in", id, &e.to_entry())
                        }
                        Ok(None) => {}
                        Err(e) => problems.add(format!("reader {r}: Reader::get_in: {e}")),
                    }
                    match reader.denied(id) {
                        Ok(Some(v)) => check_denied(denied, problems, id, &v),
                        Ok(None) => {}
                        Err(e) => problems.add(format!("reader {r}: Reader::denied({id}): {e}")),
                    }
                    // The allocation-free forms, through buffers reused all along.
                    match s.get_in(id, &mut buf) {
                        Ok(Some(e)) => check_key(keys, problems, "get_in", id, &e.to_entry()),
                        Ok(None) => {}
                        Err(e) => problems.add(format!("reader {r}: get_in: {e}")),
                    }
                    match s.get(id) {
                        Ok(Some(e)) => {
                            found.fetch_add(1, Ordering::Relaxed);
                            check_key(keys, problems, "get", id, &e);
                        }
                        Ok(None) => {}
                        Err(e) => problems.add(format!("reader {r}: get({id}): {e}")),
                    }
                    match s.denied(id) {
                        Ok(Some(v)) => check_denied(denied, problems, id, &v),
                        Ok(None) => {}
                        Err(e) => problems.add(format!("reader {r}: denied({id}): {e}")),
                    }
                    n += 2;
                    if n.is_multiple_of(64) {
                        let some: Vec<MinionId> = (0..8).map(|_| rng.pick(ids).clone()).collect();
                        match s.get_many(&some) {
                            Ok(got) => {
                                for (id, e) in some.iter().zip(got) {
                                    if let Some(e) = e {
                                        check_key(keys, problems, "get_many", id, &e);
                                    }
                                }
                            }
                            Err(e) => problems.add(format!("reader {r}: get_many: {e}")),
                        }
                        match s.get_many_in(&some, &mut batch) {
                            Ok(()) => {
                                for (id, e) in some.iter().zip(batch.iter()) {
                                    if let Some(e) = e {
                                        check_key(keys, problems, "get_many_in", id, &e.to_entry());
                                    }
                                }
                            }
                            Err(e) => problems.add(format!("reader {r}: get_many_in: {e}")),
                        }
                        n += 8;
                    }
                    if n.is_multiple_of(1024) {
                        // A listing: whatever it yields must be intact.
                        match s.keys(None) {
                            Ok(it) => {
                                for item in it {
                                    match item {
                                        Ok((i, e)) => {
                                            let id = MinionId::new(i).unwrap();
                                            check_key(keys, problems, "keys", &id, &e);
                                        }
                                        Err(e) => {
                                            problems.add(format!("reader {r}: keys item: {e}"))
                                        }
                                    }
                                }
                            }
                            Err(e) => problems.add(format!("reader {r}: keys: {e}")),
                        }
                    }
                }
                count.store(n, Ordering::Relaxed);
            });
        }
    });
    let lookups: Vec<u64> = lookups.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    eprintln!(
        "writes {}, compactions {}, lookups per reader {lookups:?}, entries found {}",
        writes.load(Ordering::Relaxed),
        compactions.load(Ordering::Relaxed),
        found.load(Ordering::Relaxed)
    );
    problems.assert_none();
    assert!(
        writes.load(Ordering::Relaxed) >= 20,
        "the writer made too little progress"
    );
    assert!(
        compactions.load(Ordering::Relaxed) >= 1,
        "no compaction ran"
    );
    for (r, n) in lookups.iter().enumerate() {
        assert!(*n >= 1000, "reader {r} made only {n} lookups");
    }
    assert!(found.load(Ordering::Relaxed) > 0);
    // Quiescent: both handles agree with the writer's view.
    std::thread::sleep(Duration::from_millis(10));
    for s in [&store, &other] {
        for id in &ids {
            let got = s.get(id).unwrap().map(|e| (e.state, e.public_key));
            assert_eq!(got, w.cur.get(id).cloned(), "{id}");
        }
    }
}

// ---------------------------------------------------------------------------
// b) readers never wait for a writer
// ---------------------------------------------------------------------------

fn populated(dir: &Path) -> (Store, Vec<MinionId>, Vec<Vec<u8>>) {
    let s = Store::open_with(dir, &opts(257, 1 << 20, 250)).unwrap();
    let ids: Vec<MinionId> = (0..50)
        .map(|i| MinionId::new(format!("minion-{i:02}")).unwrap())
        .collect();
    let pems: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| value(id.as_str(), "v", 0, 200))
        .collect();
    s.batch(|b| {
        for (id, pem) in ids.iter().zip(&pems) {
            b.put(id, KeyState::Accepted, pem)?;
        }
        b.deny(&ids[0], &value(ids[0].as_str(), "denied", 0, 100))
    })
    .unwrap();
    (s, ids, pems)
}

/// Runs `readers` threads that each do `gets` lookups (and a listing every
/// 256), checking they see the state from before the blocked write, and
/// returns, per reader, whether `writer_done` was still false when it
/// finished and how long it took.
fn read_while_blocked(
    s: &Store,
    ids: &[MinionId],
    pems: &[Vec<u8>],
    writer_done: &AtomicBool,
    readers: usize,
    gets: usize,
) -> Vec<(bool, Duration)> {
    let problems = Problems::default();
    let out = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..readers)
            .map(|r| {
                let problems = &problems;
                sc.spawn(move || {
                    let t = Instant::now();
                    let mut rng = Rng::new(r as u64 + 7);
                    for n in 0..gets {
                        let i = rng.below(ids.len() as u64) as usize;
                        match s.get(&ids[i]) {
                            Ok(Some(e)) if e.public_key == pems[i] => {}
                            other => problems.add(format!("get({}): {other:?}", ids[i])),
                        }
                        if n.is_multiple_of(256) {
                            match s.keys(None).map(|it| it.count()) {
                                Ok(50) => {}
                                other => problems.add(format!("keys(None).count(): {other:?}")),
                            }
                            match s.denied(&ids[0]) {
                                Ok(Some(_)) => {}
                                other => problems.add(format!("denied: {other:?}")),
                            }
                        }
                    }
                    (!writer_done.load(Ordering::SeqCst), t.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    problems.assert_none();
    out
}

#[test]
fn readers_never_wait_for_a_batch_holding_the_locks() {
    const HOLD: Duration = Duration::from_millis(500);
    let d = tempfile::tempdir().unwrap();
    let (s, ids, pems) = populated(d.path());
    let writer_done = AtomicBool::new(false);
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    std::thread::scope(|sc| {
        let (s, ids, writer_done) = (&s, &ids, &writer_done);
        let writer = sc.spawn(move || {
            let r = s.batch(|b| {
                b.put(
                    &ids[1],
                    KeyState::Rejected,
                    b"-----BEGIN PUBLIC KEY-----\nnew\n",
                )?;
                b.remove(&ids[2])?;
                b.deny(&ids[3], b"-----BEGIN PUBLIC KEY-----\ndenied\n")?;
                started_tx.send(()).unwrap();
                // Hold both banks' locks until released (or, if readers
                // were blocked by it, until this timeout lets them go).
                let _ = release_rx.recv_timeout(Duration::from_secs(5));
                Ok(())
            });
            writer_done.store(true, Ordering::SeqCst);
            r
        });
        started_rx.recv().unwrap();
        let t0 = Instant::now();
        let res = read_while_blocked(s, ids, &pems, writer_done, 3, 1000);
        let readers_took = t0.elapsed();
        // Keep the write side busy for the whole window.
        std::thread::sleep(HOLD.saturating_sub(t0.elapsed()));
        assert!(!writer_done.load(Ordering::SeqCst));
        release_tx.send(()).unwrap();
        writer.join().unwrap().unwrap();
        eprintln!("3 readers x 1000 gets beside a blocked batch: {readers_took:?} ({res:?})");
        for (r, (blocked, _)) in res.iter().enumerate() {
            assert!(blocked, "reader {r} finished only after the writer did");
        }
        assert!(readers_took < HOLD, "readers took {readers_took:?}");
    });
    // The batch is visible once it committed.
    assert_eq!(s.get(&ids[1]).unwrap().unwrap().state, KeyState::Rejected);
    assert_eq!(s.get(&ids[2]).unwrap(), None);
    assert!(s.is_denied(&ids[3]).unwrap());
}

#[test]
fn readers_never_wait_for_another_process_holding_the_flock() {
    const HOLD: Duration = Duration::from_millis(500);
    let d = tempfile::tempdir().unwrap();
    let (s, ids, pems) = populated(d.path());
    // Salt's writers (and keycache's in other processes) take flock(LOCK_EX)
    // on the bank's .lock file: take it from here, on our own open file.
    let lock = File::options()
        .read(true)
        .write(true)
        .open(d.path().join(format!("{KEYS_INDEX}.lock")))
        .unwrap();
    lock.lock().unwrap();
    let locked_at = Instant::now();
    let writer_done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let r = s.put(
                &ids[1],
                KeyState::Rejected,
                b"-----BEGIN PUBLIC KEY-----\nnew\n",
            );
            writer_done.store(true, Ordering::SeqCst);
            r
        });
        let t0 = Instant::now();
        let res = read_while_blocked(&s, &ids, &pems, &writer_done, 3, 1000);
        let readers_took = t0.elapsed();
        std::thread::sleep(HOLD.saturating_sub(locked_at.elapsed()));
        // The writer respects the lock: still waiting.
        assert!(
            !writer_done.load(Ordering::SeqCst),
            "the writer ignored the flock"
        );
        assert_eq!(s.get(&ids[1]).unwrap().unwrap().public_key, pems[1]);
        lock.unlock().unwrap();
        writer.join().unwrap().unwrap();
        eprintln!(
            "3 readers x 1000 gets beside a writer blocked on flock: {readers_took:?} ({res:?})"
        );
        for (r, (blocked, _)) in res.iter().enumerate() {
            assert!(blocked, "reader {r} finished only after the writer did");
        }
        assert!(readers_took < HOLD, "readers took {readers_took:?}");
    });
    assert_eq!(s.get(&ids[1]).unwrap().unwrap().state, KeyState::Rejected);
}

// ---------------------------------------------------------------------------
// c) Salt rewriting a record in place from another handle
// ---------------------------------------------------------------------------

#[test]
fn salt_style_in_place_rewrites_never_yield_a_wrong_value() {
    const RUN: Duration = Duration::from_millis(1000);
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &opts(17, 1 << 20, 250)).unwrap();
    let target = MinionId::new("target").unwrap();
    let pem_a = value("target", "v", 1, 700);
    let pem_b = value("target", "v", 2, 700);
    let va = encode_key_value(KeyState::Accepted, &pem_a);
    let vb = encode_key_value(KeyState::Rejected, &pem_b);
    assert_eq!(va.len(), vb.len());
    s.put(&target, KeyState::Accepted, &pem_a).unwrap();
    let rec = |v: &[u8]| {
        let mut r = Vec::new();
        format::encode_record(v, &mut r);
        r
    };
    let (rec_a, rec_b) = (rec(&va), rec(&vb));

    // Find the slot and check it points at offset 0 of the heap.
    let p = Params {
        size: 17,
        ..Params::default()
    };
    let index_path = d.path().join(KEYS_INDEX);
    let heap_path = d.path().join(format!("{KEYS_INDEX}.heap"));
    let index = std::fs::read(&index_path).unwrap();
    let slot = (1..p.size)
        .find(|&i| {
            let b = &index[p.slot_offset(i)..p.slot_offset(i) + p.slot_used()];
            b[0] == format::OCCUPIED && format::slot_id(&p, b) == b"target"
        })
        .expect("slot of target");
    let so = p.slot_offset(slot);
    assert_eq!(format::le_u64(&index[so + p.offset_field()..]), 0);
    assert_eq!(
        format::le_u32(&index[so + p.length_field()..]) as usize,
        va.len()
    );
    assert_eq!(std::fs::read(&heap_path).unwrap(), rec_a);

    let heap = File::options().write(true).open(&heap_path).unwrap();
    let idx = File::options().write(true).open(&index_path).unwrap();
    let stop = AtomicBool::new(false);
    let rewrites = AtomicU64::new(0);
    let (ok_a, ok_b, corrupt, wrong) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let problems = Problems::default();
    std::thread::scope(|sc| {
        // Salt's writer: rewrite checksum + value in place, then the slot's
        // mtime; in bursts of ~2 ms separated by ~3 ms pauses. The record is
        // written in several ways, so readers meet every kind of torn record.
        sc.spawn(|| {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < RUN {
                let burst = Instant::now();
                while burst.elapsed() < Duration::from_millis(2) {
                    let r = if n.is_multiple_of(2) { &rec_b } else { &rec_a };
                    match n % 3 {
                        // One write of the whole record (Salt's slice assignment).
                        0 => heap.write_all_at(r, 0).unwrap(),
                        // Value first, then checksum.
                        1 => {
                            heap.write_all_at(&r[8..], 8).unwrap();
                            heap.write_all_at(&r[..8], 0).unwrap();
                        }
                        // In small pieces, front to back.
                        _ => {
                            for (k, c) in r.chunks(64).enumerate() {
                                heap.write_all_at(c, (k * 64) as u64).unwrap();
                            }
                        }
                    }
                    let mtime = (n + 1).to_le_bytes();
                    idx.write_all_at(&mtime, (so + p.mtime_field()) as u64)
                        .unwrap();
                    n += 1;
                }
                // Leave it consistent (either value) while pausing.
                std::thread::sleep(Duration::from_millis(3));
            }
            rewrites.store(n, Ordering::Relaxed);
            stop.store(true, Ordering::Release);
        });
        for _ in 0..3 {
            sc.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    match s.get(&target) {
                        Ok(Some(e)) => {
                            let v = encode_key_value(e.state, &e.public_key);
                            if v == va {
                                ok_a.fetch_add(1, Ordering::Relaxed);
                            } else if v == vb {
                                ok_b.fetch_add(1, Ordering::Relaxed);
                            } else {
                                wrong.fetch_add(1, Ordering::Relaxed);
                                problems.add(format!(
                                    "wrong value: {} {:?}",
                                    e.state,
                                    String::from_utf8_lossy(&e.public_key)
                                ));
                            }
                        }
                        Ok(None) => {
                            wrong.fetch_add(1, Ordering::Relaxed);
                            problems.add("the entry vanished".into());
                        }
                        Err(Error::Corrupt { .. }) => {
                            corrupt.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            wrong.fetch_add(1, Ordering::Relaxed);
                            problems.add(format!("unexpected error: {e}"));
                        }
                    }
                }
            });
        }
    });
    let (a, b, c, w) = (
        ok_a.load(Ordering::Relaxed),
        ok_b.load(Ordering::Relaxed),
        corrupt.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
    );
    let total = a + b + c + w;
    eprintln!(
        "{} in-place rewrites; reads: {a} saw A, {b} saw B, {c} corrupt (gave up), {w} wrong",
        rewrites.load(Ordering::Relaxed)
    );
    problems.assert_none();
    assert_eq!(w, 0);
    assert!(a > 0 && b > 0, "both values must have been read");
    assert!(
        (a + b) * 10 >= total * 9,
        "only {} of {total} reads succeeded",
        a + b
    );
}

/// A writer that stores a slot's length one byte at a time (Salt's
/// `struct.pack_into` does) and is preempted between two of them leaves,
/// when a length under 256 grows to a multiple of 256, a length of zero:
/// a record of no bytes, which has no checksum to fail. Readers meeting it
/// must wait for the writer to finish, not report an empty or corrupt key.
#[test]
fn a_length_caught_between_its_byte_stores_is_read_again() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &opts(17, 1 << 20, 250)).unwrap();
    let target = MinionId::new("target").unwrap();
    let old = value("target", "v", 1, 199);
    let new = value("target", "v", 2, 255);
    s.put(&target, KeyState::Accepted, &old).unwrap();
    let vb = encode_key_value(KeyState::Rejected, &new);
    assert_eq!(vb.len(), 256);
    let p = Params {
        size: 17,
        ..Params::default()
    };
    let index_path = d.path().join(KEYS_INDEX);
    let heap_path = d.path().join(format!("{KEYS_INDEX}.heap"));
    let index = std::fs::read(&index_path).unwrap();
    let slot = (1..p.size)
        .find(|&i| format::slot_id(&p, &index[p.slot_offset(i)..]) == b"target")
        .expect("slot of target");
    let so = p.slot_offset(slot);
    assert_eq!(format::le_u32(&index[so + p.length_field()..]), 200);

    // Salt's append path, stopped half-way through the length: record
    // appended, offset repointed, low byte of 256 (0x00) stored, the high
    // byte (0x01) not yet.
    let heap = File::options().write(true).open(&heap_path).unwrap();
    let at = heap.metadata().unwrap().len();
    let mut rec = Vec::new();
    format::encode_record(&vb, &mut rec);
    heap.write_all_at(&rec, at).unwrap();
    let idx = File::options().write(true).open(&index_path).unwrap();
    idx.write_all_at(&at.to_le_bytes(), (so + p.offset_field()) as u64)
        .unwrap();
    idx.write_all_at(&[0], (so + p.length_field()) as u64)
        .unwrap();
    assert_eq!(
        format::le_u32(&std::fs::read(&index_path).unwrap()[so + p.length_field()..]),
        0,
        "the torn length reads as zero"
    );

    let started = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for r in 0..3 {
            let (s, target, started, results) = (&s, &target, &started, &results);
            sc.spawn(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let got: std::result::Result<Option<(KeyState, Vec<u8>)>, String> = match r {
                    0 => s
                        .get(target)
                        .map(|e| e.map(|e| (e.state, e.public_key)))
                        .map_err(|e| e.to_string()),
                    1 => s
                        .get_many(std::slice::from_ref(target))
                        .map(|mut v| v.remove(0).map(|e| (e.state, e.public_key)))
                        .map_err(|e| e.to_string()),
                    _ => s
                        .keys(None)
                        .unwrap()
                        .next()
                        .transpose()
                        .map(|e| e.map(|(_, e)| (e.state, e.public_key)))
                        .map_err(|e| e.to_string()),
                };
                results.lock().unwrap().push((r, got));
            });
        }
        while started.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        // The writer is "preempted" for 100 ms, then finishes the length.
        std::thread::sleep(Duration::from_millis(100));
        idx.write_all_at(&[1], (so + p.length_field() + 1) as u64)
            .unwrap();
    });
    let results = results.into_inner().unwrap();
    assert_eq!(results.len(), 3);
    for (r, got) in results {
        let reader = ["get", "get_many", "keys"][r];
        assert_eq!(
            got,
            Ok(Some((KeyState::Rejected, new.clone()))),
            "{reader} must wait for the length to be finished"
        );
    }
}
