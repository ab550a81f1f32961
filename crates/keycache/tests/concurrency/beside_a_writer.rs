//! a) Lock-free readers beside a writer of the same process (puts, state
//! changes, removes, denies, batches, compactions): every value read was
//! written.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keycache::store::encode_key_value;
use keycache::{KeyState, MinionId, Store};
use keycache_testkit::rng::Rng;

use super::*;

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
                    check_denied_read(denied, problems, id, reader.denied(id), || {
                        format!("reader {r}: Reader::denied({id})")
                    });
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
                    check_denied_read(denied, problems, id, s.denied(id), || {
                        format!("reader {r}: denied({id})")
                    });
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
