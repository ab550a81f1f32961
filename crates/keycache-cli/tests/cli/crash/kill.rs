//! Crash safety: a writer killed at random moments.
//!
//! A writer in a child process (the test binary re-executed as its
//! `#[ignore]`d `child_writer` test, in `main.rs`: random puts, state
//! changes, denies, removes, batches and compactions, each op printed
//! before it starts and after it returns, i.e. once it is durable) is
//! killed with SIGKILL after a random delay (any instruction, mapped-memory
//! stores included). After every kill the store is reopened and checked:
//! every acknowledged write is there, no id has a value that was never
//! written for it (each id holds its value before or after the op in
//! flight), `verify` is clean or finds only what a crash between the index
//! and the roster leaves (header counters and roster entries) and the next
//! writer to open the bank mends it (no `verify --repair`: a batch in flight
//! keeps the header's occupied count out of step with the roster, which
//! every writer, Salt's too, checks on open); Salt's own `mmap_key` then
//! reads copies of the stores without error and agrees with keycache.
//!
//! Scale with `KEYCACHE_CRASH_KILLS` (default 300).

use crate::common;
use crate::common::ok;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::KilledWriters;
use keycache_testkit::crash::{kills, temp_files, writer_command};
use keycache_testkit::rng::Rng;

#[test]
fn writer_killed_at_random_moments() {
    let kc = common::cli();
    let n = kills();
    let mut w = KilledWriters::new();
    let dir = w.dir().to_path_buf();
    let mut rng = Rng::new(0x1234_5678_9abc);
    let start = Instant::now();
    for k in 0..n {
        let mut child = writer_command(&dir, rng.next(), w.seq, None)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let mut r = BufReader::new(out);
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                if line.contains("@@READY") {
                    let _ = tx.send(());
                }
                text.push_str(&line);
                line.clear();
            }
            text
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the writer starts");
        // Kill within the first few ops, anywhere in them.
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success());
        let text = reader.join().unwrap();
        w.check(&kc, k, &text, &format!("kill {k}"));
    }
    let (seq, tally) = (w.seq, &w.tally);
    // A compaction clears what killed rebuilds and roster repairs left.
    let out = kc.run(&dir, &["compact"]);
    ok(&out);
    assert_eq!(temp_files(&dir), Vec::<String>::new());
    let salt_mended = w.check_salt_mends();
    let salted = w.salt.run("timed kills");
    eprintln!(
        "timed kills: {n} kills, {seq} ops begun, {} in flight at the kill ({} applied), \
         {} with findings (all mended by the next writer; {salt_mended} copies mended by \
         Salt's), {salted} copies read by Salt, {:.1} s",
        tally.in_flight,
        tally.in_flight_applied,
        tally.with_findings,
        start.elapsed().as_secs_f64()
    );
    assert!(
        tally.in_flight > n / 4,
        "too few kills landed inside an op: {tally:?}"
    );
    assert!(
        salt_mended > 0,
        "no kill left a store for the next writer to mend: {tally:?}"
    );
}
