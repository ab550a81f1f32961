//! The writer in another process that section `scaling` runs beside the
//! readers of keycache and LMDB: `compare writer` (the child's side, a
//! hidden subcommand) and [`WriterProc`] (the measuring side's handle, which
//! starts it, asks it how many writes it made, and kills it when dropped).
//!
//! Protocol, one line each: the child prints `ready` on stdout once it has
//! written to every target at least once; it answers a `count` line on its
//! stdin with `writes N` (the writes so far, every target together); it
//! stops when its stdin closes, when it is killed, or after
//! `--max-seconds`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keycache::{KeyState, MinionId, Store};
use keycache_bench::{open_lmdb, open_options, pem};

use crate::args::WriterArgs;
use crate::util::{die, log};

/// Ids the writer takes from the ids file at most (it cycles over them).
const MAX_IDS: usize = 65_536;

/// How long the measuring side waits for `ready` or for an answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The two values a changed key alternates between: PEM keys of the same
/// length as every other key of the stores (451 bytes), so that a change
/// replaces a value with one of its size and the store does not grow.
pub(crate) fn alternate_keys() -> [Vec<u8>; 2] {
    [pem(u64::MAX - 1), pem(u64::MAX - 2)]
}

/// Sleeps until the `k`-th tick of a schedule of `rate` ticks a second
/// that began at `t0`; when it is more than 100 ms late (a slow fsync), it
/// moves the schedule instead of catching up in a burst.
pub(crate) fn pace(t0: &mut Instant, k: &mut u64, rate: u64) {
    *k += 1;
    let due = *t0 + Duration::from_secs_f64(*k as f64 / rate.max(1) as f64);
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    } else if now - due > Duration::from_millis(100) {
        *t0 = now;
        *k = 0;
    }
}

/// `compare writer`: changes existing keys of the store and/or the LMDB
/// environment at `--rate` writes a second (each), a write a change: a
/// `Store::put` (durable) and an LMDB write transaction (committed,
/// durable). Only ids in state accepted are changed, and they stay
/// accepted, so other sections still see the stores' states.
pub(crate) fn cmd_writer(a: &WriterArgs) {
    if a.store.is_none() && a.lmdb.is_none() {
        die("writer: nothing to write to (--store, --lmdb)");
    }
    let text = std::fs::read_to_string(&a.ids).expect("writer: read the ids file");
    let all: Vec<MinionId> = text
        .lines()
        .filter(|l| !l.is_empty())
        .take(MAX_IDS)
        .map(|l| MinionId::new(l).expect("writer: a valid id"))
        .collect();
    let store = a.store.as_ref().map(|dir| {
        Store::open_with(dir, &open_options(a.size)).expect("writer: open the keycache store")
    });
    let lmdb = a.lmdb.as_deref().map(open_lmdb);
    let accepted = KeyState::Accepted.byte();
    let ids: Vec<MinionId> = all
        .into_iter()
        .filter(|id| {
            let in_store = store
                .as_ref()
                .is_none_or(|s| matches!(s.get(id), Ok(Some(e)) if e.state == KeyState::Accepted));
            let in_lmdb = lmdb.as_ref().is_none_or(|(env, db)| {
                let t = env.read_txn().expect("writer: lmdb read txn");
                matches!(db.get(&t, id.as_str()), Ok(Some(v)) if v.first() == Some(&accepted))
            });
            in_store && in_lmdb
        })
        .collect();
    if ids.is_empty() {
        die("writer: no id of the ids file is accepted in every target");
    }
    let keys = alternate_keys();
    let lmdb_values: Vec<Vec<u8>> = keys.iter().map(|k| [&[accepted][..], k].concat()).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    {
        let (stop, writes) = (Arc::clone(&stop), Arc::clone(&writes));
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(l) if l.trim() == "count" => {
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "writes {}", writes.load(Ordering::Relaxed));
                        let _ = out.flush();
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
    let end = Instant::now() + Duration::from_secs_f64(a.max_seconds);
    let (mut t0, mut tick) = (Instant::now(), 0u64);
    let mut n = 0usize;
    let mut ready = false;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        let id = &ids[n % ids.len()];
        let which = (n / ids.len()) % 2;
        n += 1;
        if let Some(s) = &store {
            s.put(id, KeyState::Accepted, &keys[which])
                .expect("writer: keycache put");
            writes.fetch_add(1, Ordering::Relaxed);
        }
        if let Some((env, db)) = &lmdb {
            let mut w = env.write_txn().expect("writer: lmdb write txn");
            db.put(&mut w, id.as_str(), &lmdb_values[which])
                .expect("writer: lmdb put");
            w.commit().expect("writer: lmdb commit");
            writes.fetch_add(1, Ordering::Relaxed);
        }
        if !ready {
            ready = true;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "ready");
            let _ = out.flush();
        }
        pace(&mut t0, &mut tick, a.rate);
    }
}

/// The measuring side's handle on a running `compare writer` process:
/// kills it (by its pid, through its [`Child`]) and waits for it when
/// dropped, on a panic too.
pub(crate) struct WriterProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl WriterProc {
    /// Starts this tool's `writer` subcommand on `store` (with its table
    /// size) and/or `lmdb`, changing ids of `ids` at `rate` writes a second,
    /// and waits until it has written once.
    pub(crate) fn start(
        store: Option<(&Path, u64)>,
        lmdb: Option<&Path>,
        ids: &Path,
        rate: u64,
    ) -> WriterProc {
        let exe = std::env::current_exe().expect("the path of this executable");
        let mut c = Command::new(exe);
        c.arg("writer")
            .arg("--ids")
            .arg(ids)
            .args(["--rate", &rate.to_string()]);
        if let Some((dir, size)) = store {
            c.arg("--store")
                .arg(dir)
                .args(["--size", &size.to_string()]);
        }
        if let Some(dir) = lmdb {
            c.arg("--lmdb").arg(dir);
        }
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().expect("start the writer process");
        let stdout = child.stdout.take().expect("the writer's stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut w = WriterProc {
            stdin: child.stdin.take(),
            child,
            lines,
        };
        let ready = w.next_line();
        if ready.as_deref() != Some("ready") {
            let pid = w.pid();
            drop(w);
            die(&format!(
                "the writer process (pid {pid}) did not get ready: {ready:?}"
            ));
        }
        log(&format!("  writer process {} running", w.pid()));
        w
    }

    /// The writer's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line of the writer's stdout, waiting at most
    /// [`ANSWER_WITHIN`]; None when it ended or did not answer in time.
    fn next_line(&mut self) -> Option<String> {
        self.lines.recv_timeout(ANSWER_WITHIN).ok()
    }

    /// The writes the writer has made since it started (every target).
    pub(crate) fn writes(&mut self) -> u64 {
        let asked = self
            .stdin
            .as_mut()
            .is_some_and(|s| writeln!(s, "count").and_then(|()| s.flush()).is_ok());
        let answer = if asked { self.next_line() } else { None };
        answer
            .as_deref()
            .and_then(|l| l.strip_prefix("writes "))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| {
                let _ = self.child.kill();
                let _ = self.child.wait();
                die(&format!(
                    "the writer process (pid {}) did not say how many writes it made: {answer:?}",
                    self.pid()
                ))
            })
    }
}

impl Drop for WriterProc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let pid = self.pid();
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(st) => log(&format!("  writer process {pid} ended ({st})")),
            Err(e) => log(&format!("  writer process {pid}: wait: {e}")),
        }
    }
}
