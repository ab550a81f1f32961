//! A new replica from an empty store, and the file system's floor for its tree.

use super::*;

/// `n` accepted keys seeded under a prefix of their own, once for every
/// new replica; returns the settings and the seeded revision.
pub(crate) fn seed_new(c: &Cluster, n: usize) -> Res<(Settings, i64)> {
    let st = Settings::plain(c.endpoints(), &format!("/keycache/new{n}/"))?;
    let seeded = seed(&st, n, KeyState::Accepted)?;
    Ok((st, seeded))
}

/// A new replica from an empty store, until it holds the `seeded`
/// revision of `n` keys: until its list's report, which comes right after
/// the replica state that records the revision is written (waited for on
/// the report channel, not by reading the state file in a loop: on two
/// cores a poll every 200 µs took CPU from the replica it timed, and the
/// floor runs with no poll). Its directory is removed, and the removal
/// written back, outside the time.
pub(crate) fn new_replica(st: &Settings, n: usize, seeded: i64, tree: TreeSync) -> Res<Duration> {
    let d = tempfile::tempdir()?;
    let start = Instant::now();
    let running = replicate(st, d.path(), (n as u64 * 2).max(10_007), tree)?;
    // The list's report, after any other (an old etcd's warning, say).
    let limit = Duration::from_secs(600);
    let listed = std::iter::from_fn(|| {
        running
            .reports
            .recv_timeout(limit.saturating_sub(start.elapsed()))
            .ok()
    })
    .find_map(|(r, at)| match r {
        Report::Listed {
            revision,
            entries,
            listing,
            took,
            ..
        } => Some((revision, entries, listing, took, at)),
        _ => None,
    });
    let Some((revision, entries, listing, writes, at)) = listed else {
        return Err(format!("no list reported in {limit:?}").into());
    };
    let took = at.duration_since(start);
    if revision < seeded || revision_of(d.path()) < seeded {
        return Err(format!("listed at revision {revision}, seeded at {seeded}").into());
    }
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

/// The file system's floor for a key tree of `n` files, on the same file
/// system as the replicas (TMPDIR): each file created under its own name
/// and written (450 bytes) in one directory, then one write-back (syncfs)
/// and the directory fsynced, as GNU tar or a plain loop makes a tree;
/// none of the tree writer's checks (entries looked at, owner). With
/// `threads` above one, the creates are shared by that many threads (is
/// parallel creation worth it here?).
pub(crate) fn tree_floor(n: usize, threads: usize) -> Res<Duration> {
    let d = tempfile::tempdir()?;
    let dir = d.path().join("minions");
    std::fs::create_dir(&dir)?;
    let start = Instant::now();
    shared(0..n, threads, |i| {
        use std::io::Write;
        std::fs::File::create_new(dir.join(format!("m{i:07}")))?.write_all(&[b'k'; 450])
    })?;
    keycache_bench::write_back(&dir)?;
    std::fs::File::open(&dir)?.sync_all()?;
    let took = start.elapsed();
    keep(d);
    Ok(took)
}

/// Calls `f` with every number of `range`, on `threads` threads (each a
/// stride of it); the first error, if any.
fn shared(
    range: std::ops::Range<usize>,
    threads: usize,
    f: impl Fn(usize) -> std::io::Result<()> + Sync,
) -> std::io::Result<()> {
    let threads = threads.max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (f, range) = (&f, range.clone());
                s.spawn(move || range.skip(t).step_by(threads).try_for_each(f))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a thread panicked")))
        })
    })
}
