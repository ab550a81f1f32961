//! b) Readers never wait for a writer holding the banks' locks, in this
//! process or another.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keycache::format::KEYS_INDEX;
use keycache::{KeyState, MinionId, Store};
use keycache_testkit::rng::Rng;

use super::*;

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
