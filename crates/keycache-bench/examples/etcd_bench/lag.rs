//! Replication lag at a steady write rate.

use super::*;

/// A lag's figures: p50, p99, max.
#[derive(Clone, Copy)]
pub(crate) struct Lag {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

/// Lag at `rate` writes a second for `secs` seconds, printed when
/// `report`; under a prefix of its own for each `tag` (a sign-in is a new
/// key only once under a prefix).
pub(crate) fn lag(
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
