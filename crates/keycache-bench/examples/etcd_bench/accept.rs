//! `salt-key -A` through etcd, and the replica's side alone.

use super::*;

/// Seeds `n` keys of `state` under `prefix`; returns the revision.
pub(crate) fn seed(st: &Settings, n: usize, state: KeyState) -> Res<i64> {
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
/// etcd's transactions alone (the same moves back to pending, right after,
/// with A's replicator stopped). With `second`, a second master's replica
/// B runs beside A's and the time until it holds every change is printed
/// too; the targets' rounds run without it: a real second master is
/// another machine, and here B's writes would share A's two cores and disk.
pub(crate) fn accept_all(
    c: &Cluster,
    n: usize,
    tree: TreeSync,
    round: usize,
    second: bool,
) -> Res<Accepted> {
    let st = Settings::plain(
        c.endpoints(),
        &format!("/keycache/acceptall-{}-{round}-{second}/", label(tree)),
    )?;
    let seeded = seed(&st, n, KeyState::Pending)?;
    let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let ra = replicate(&st, a.path(), 100_003, tree)?;
    let rb = match second {
        true => Some(replicate(&st, b.path(), 100_003, tree)?),
        false => None,
    };
    wait_revision(a.path(), seeded, Duration::from_secs(60))?;
    if rb.is_some() {
        wait_revision(b.path(), seeded, Duration::from_secs(60))?;
    }
    // The sign-ins' files (not fsynced outside `minions/`) written back,
    // as the kernel does within half a minute, before the clock starts.
    settle()?;
    let ids: Vec<MinionId> = (0..n)
        .map(|i| MinionId::new(format!("minion-{i:07}")))
        .collect::<Result<_, _>>()?;
    let busy = machine_busy()?;
    let start = Instant::now();
    let w = move_all(&st, a.path(), &ids, KeyState::Pending, KeyState::Accepted)?;
    let on_a = start.elapsed();
    let busy = machine_busy()?.saturating_sub(busy);
    assert_eq!(w.done.len(), n, "every key accepted");
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let (mut batches, mut took) = (0, Duration::ZERO);
    while let Ok((rep, _)) = ra.reports.try_recv() {
        if let Report::Applied { took: t, .. } = rep {
            batches += 1;
            took += t;
        }
    }
    let accepted = Store::open_with(a.path(), &opts(100_003))?
        .counts()?
        .accepted;
    assert_eq!(accepted as usize, n, "A holds every accept");
    println!(
        "salt-key -A of {n} pending keys through A, key tree {}: returned (A's replica holds \
         all) in {:.0} ms; A applied them in {batches} batches, {:.0} ms of store and tree writes",
        label(tree),
        ms(on_a),
        ms(took)
    );
    println!(
        "  the machine's busy CPU time meanwhile (every process): {:.0} ms, {:.2} of the \
         {cores} cores; no schedule of that work on {cores} cores ends before {:.0} ms",
        ms(busy),
        busy.as_secs_f64() / on_a.as_secs_f64(),
        ms(busy / cores as u32)
    );
    if let Some(rb) = &rb {
        wait_revision(b.path(), w.revision, Duration::from_secs(60))?;
        let on_b = start.elapsed();
        let accepted = Store::open_with(b.path(), &opts(100_003))?
            .counts()?
            .accepted;
        assert_eq!(accepted as usize, n, "B holds every accept");
        let batches = rb
            .reports
            .try_iter()
            .filter(|(r, _)| matches!(r, Report::Applied { .. }))
            .count();
        println!(
            "  every key accepted in B's replica (beside A's, on the same cores and disk) after \
             {:.0} ms, in {batches} batches",
            ms(on_b)
        );
    }
    // The same transactions alone (back to pending, through a writer whose
    // replica claims the revision they end at: it does not wait), with no
    // replicator running.
    drop((ra, rb));
    settle()?;
    let nowait = tempfile::tempdir()?;
    claim_ahead(&st, a.path(), nowait.path(), n.div_ceil(IDS_PER_TXN) as i64)?;
    let cpu = etcd_cpu(c)?;
    let t = Instant::now();
    let back = move_all(
        &st,
        nowait.path(),
        &ids,
        KeyState::Accepted,
        KeyState::Pending,
    )?;
    let txns = t.elapsed();
    let cpu = etcd_cpu(c)?.saturating_sub(cpu);
    assert_eq!(back.done.len(), n);
    println!(
        "  etcd's transactions alone ({} ids per transaction, {} in flight): {:.0} ms; \
         its members' CPU time {:.0} ms, {:.2} of the {cores} cores",
        IDS_PER_TXN,
        keycache_etcd::write::IN_FLIGHT,
        ms(txns),
        ms(cpu),
        cpu.as_secs_f64() / txns.as_secs_f64()
    );
    for d in [a, b, nowait] {
        keep(d);
    }
    // The replica's own work alone: the same accepts in one batch, in a
    // store of its own with no etcd running a transaction.
    let alone = accept_alone(n, tree)?;
    println!(
        "  the replica's own accepts alone, in one batch: {:.0} ms",
        ms(alone)
    );
    Ok(Accepted {
        in_step: on_a,
        txns,
        alone,
        cpu_bound: busy / cores as u32,
    })
}

/// A bulk accept's figures: until the accepting master's replica is in
/// step, etcd's transactions alone, the replica's own accepts alone, and
/// the machine's busy CPU time while in step over its cores (no schedule
/// of that work on these cores ends sooner).
pub(crate) struct Accepted {
    pub(crate) in_step: Duration,
    pub(crate) txns: Duration,
    pub(crate) alone: Duration,
    pub(crate) cpu_bound: Duration,
}

/// Clock ticks a second (`getconf CLK_TCK`), the unit of /proc's CPU times.
fn clock_ticks() -> u64 {
    static TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// The CPU time every core of the machine has spent busy so far (not idle,
/// not waiting for I/O), from /proc/stat's first line: user, nice,
/// system, idle, iowait, irq, softirq, steal.
fn machine_busy() -> Res<Duration> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let f: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .ok_or("/proc/stat: no cpu line")?
        .split_whitespace()
        .take(8)
        .map(|v| v.parse::<u64>())
        .collect::<Result<_, _>>()?;
    if f.len() < 8 {
        return Err("/proc/stat: fewer than 8 fields on the cpu line".into());
    }
    let busy = f.iter().sum::<u64>() - f[3] - f[4];
    Ok(Duration::from_secs_f64(busy as f64 / clock_ticks() as f64))
}

/// The CPU time (user and system) the members of `c` have used so far,
/// from /proc (clock ticks, `getconf CLK_TCK`).
fn etcd_cpu(c: &Cluster) -> Res<Duration> {
    let tick = clock_ticks();
    let mut ticks = 0;
    for pid in c.members.iter().filter_map(|m| m.pid()) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // After the command's name, in parentheses: fields 3 onwards;
        // utime and stime are fields 14 and 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        for i in [11, 12] {
            ticks += f
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("/proc/{pid}/stat: no field {}", i + 3))?;
        }
    }
    Ok(Duration::from_secs_f64(ticks as f64 / tick as f64))
}

/// `n` pending keys accepted in one batch (`replica::apply_changes`) in a
/// new store of its own with `tree`, the sign-ins written back first.
pub(crate) fn accept_alone(n: usize, tree: TreeSync) -> Res<Duration> {
    let pem = pem("apply", 400);
    let ids: Vec<MinionId> = (0..n)
        .map(|i| MinionId::new(format!("minion-{i:07}")))
        .collect::<Result<_, _>>()?;
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
    let took = t.elapsed();
    drop(s);
    keep(d);
    Ok(took)
}

/// Writes, in the empty directory `dir`, a replica state that holds the
/// revision etcd will be at after `txns` more transactions that write (and
/// no other write): a writer on it waits for no replica. A writer takes a
/// replica's word only for a state written for its directory and a last
/// change etcd's history holds at that revision: a marker key, outside the
/// prefix, put here. A's state gives the rest (of the same cluster).
pub(crate) fn claim_ahead(st: &Settings, a: &Path, dir: &Path, txns: i64) -> Res<()> {
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
pub(crate) fn move_all(
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

/// The replica's side alone: 10,000 pending keys accepted in one batch
/// (`replica::apply_changes`), with and without the key tree.
pub(crate) fn apply_alone(n: usize) -> Res<()> {
    for tree in [TreeSync::On, TreeSync::Accepted, TreeSync::Off] {
        let took = accept_alone(n, tree)?;
        println!(
            "  {n} pending keys accepted in a replica's store in one batch, key tree {}: {:.0} ms",
            label(tree),
            ms(took)
        );
    }
    Ok(())
}

/// One change a batch, as the watch brings them at low rates: the median
/// time of `replica::apply_changes`, with and without the key tree.
pub(crate) fn single(n: usize) -> Res<()> {
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
