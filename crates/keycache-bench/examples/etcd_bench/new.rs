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
/// revision of `n` keys; its directory is removed, and the removal
/// written back, outside the time.
pub(crate) fn new_replica(st: &Settings, n: usize, seeded: i64, tree: TreeSync) -> Res<Duration> {
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

/// The file system's floor for a key tree of `n` files, on the same file
/// system as the replicas (TMPDIR): each file created, written (450
/// bytes) and renamed into one directory, a write-back (syncfs) per 4,096
/// files; none of the tree writer's checks (entries looked at, owner).
pub(crate) fn tree_floor(n: usize) -> Res<Duration> {
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
