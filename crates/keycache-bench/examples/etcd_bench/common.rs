//! The replicator on its own thread, and the small helpers every part uses.

use super::*;

/// A running replicator: its reports; stopped, and its thread joined, when
/// dropped (so that its store is closed before its directory goes).
pub(crate) struct Running {
    pub(crate) reports: mpsc::Receiver<(Report, Instant)>,
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

pub(crate) fn opts(size: u64) -> OpenOptions {
    OpenOptions {
        params: sized(size),
        ..OpenOptions::default()
    }
}

/// A replicator on its own thread; each report's (revision, time) goes to
/// the channel; stopped when the returned sender is dropped.
pub(crate) fn replicate(
    settings: &Settings,
    dir: &Path,
    size: u64,
    tree: TreeSync,
) -> Res<Running> {
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

pub(crate) fn revision_of(dir: &Path) -> i64 {
    ReplicaState::read(dir)
        .ok()
        .flatten()
        .map_or(0, |s| s.revision)
}

pub(crate) fn wait_revision(dir: &Path, rev: i64, limit: Duration) -> Res<Duration> {
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

pub(crate) fn pct<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// How the key tree is kept, as the lines print it.
pub(crate) fn label(tree: TreeSync) -> &'static str {
    match tree {
        TreeSync::On => "on",
        TreeSync::Accepted => "accepted",
        TreeSync::Off => "off",
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Every contender's directory, kept until the end of the run: on an ext4
/// without a journal, creating files right after as many were removed
/// makes every create walk past the inodes freed in the last minute
/// (`recently_deleted`: 20-30% of the time of a 10,000-file accept measured
/// here), a cost of the benchmark's own clean-up and not of a replica.
/// `tools/bench.sh etcd` runs on a fresh journaled ext4 for the same reason
/// (a run's clean-up would slow the next run).
pub(crate) static KEPT: std::sync::Mutex<Vec<tempfile::TempDir>> =
    std::sync::Mutex::new(Vec::new());

/// Keeps `d` until the end of the run ([`KEPT`]).
pub(crate) fn keep(d: tempfile::TempDir) {
    if let Ok(mut k) = KEPT.lock() {
        k.push(d);
    }
}

/// Writes back what the file system of TMPDIR holds
/// ([`keycache_bench::write_back`]), so that one contender's removed files
/// are not the next one's work.
pub(crate) fn settle() -> Res<()> {
    Ok(keycache_bench::write_back(&std::env::temp_dir())?)
}
