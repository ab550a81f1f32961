//! The replicator: one per master, it keeps the master's store a live
//! replica of the key state in etcd.
//!
//! 1. **List**: the prefix is read at one revision, page by page; the store
//!    is made equal to it in one batch under the banks' locks with the key
//!    tree in step; then the revision is recorded in the store directory
//!    ([`crate::state`]), durably, after the store is.
//! 2. **Watch** from the next revision: each watch response (with those
//!    that are already waiting, up to [`MAX_EVENTS`] events) is applied as
//!    one batch, durable before its revision is recorded (the revision of
//!    its last event). A progress request every [`PROGRESS_EVERY`] keeps
//!    the time of last contact fresh when nothing changes; its revision is
//!    not recorded as the store's (etcd before 3.5.8 could send it ahead of
//!    the events of that revision, etcd issue 15220).
//! 3. A watch whose revision was compacted lists again (Kubernetes'
//!    list-then-watch). Any other failure (etcd unreachable, no leader,
//!    a stream that ends) reconnects after a backoff of 100 ms doubling to
//!    5 s, across every endpoint; a recorded revision lets the watch resume
//!    where it stopped, and a store whose recorded etcd cluster, prefix or
//!    revision does not fit the etcd it reaches lists again.
//!
//! The audit trail's keys (`<prefix>audit/`, [`crate::audit`]) are no key
//! state: they never move the recorded revision or the anchor. The records
//! of those a batch or a list brings are appended to the store's log, each
//! with its revision, in revision order, before the batch's revision (or
//! the list's) is recorded, and before the store changes: a writer whose
//! wait for this replica returned finds its record in this master's log,
//! and this store never shows a change its log lacks. The last revision
//! logged is remembered (read from the log when the replicator starts) and
//! records at or below it are passed over, so a kill anywhere leaves each
//! record in the log at most once (a kill during an append leaves a torn
//! line, which readers skip); the restart's catch-up, watch or list appends
//! the rest. Deletions of audit keys (the retention, trimmed at each
//! consistency check) are passed over.
//!
//! A crash anywhere leaves the recorded revision at or behind the store:
//! changes are absolute (a value or a removal), and what etcd committed
//! before a watch began is applied as one batch ([`crate::catch_up`]), so
//! applying some twice after a restart changes nothing, not even for a
//! moment (a revoked key is never accepted again in between).

use std::time::Duration;

use etcd_client::Client;
use keycache::store::Store;

use crate::connect::Settings;
use crate::error::{Error, Result};
use crate::lock::ReplicatorLock;
use crate::metrics::{Metrics, Relist};
pub use crate::report::{Level, Report};
use crate::state::{Applying, ReplicaState};

mod consistency;
mod relist;
mod watch;

/// Events applied in one batch at most.
pub const MAX_EVENTS: usize = 10_000;
/// How often the replicator proves its replica current: a linearizable
/// read, then a request for the watch's progress.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// How long the linearizable read of a proof may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// Proofs failed in a row after which the replicator connects to another
/// member: one that answers the watch but no linearizable read (its disk
/// stalls, it lost the quorum) is alive, not current.
pub const MAX_READ_FAILURES: u32 = 3;
/// How long a writer waits for a running replicator's next proof before it
/// takes a stale replica for stale: a proof's period and its read, twice.
pub const PROOF_GRACE: Duration = Duration::from_secs(3);
pub use crate::report::WATCH_FIXED;

/// A replicator of one store.
pub struct Replicator {
    settings: Settings,
    store: Store,
    state: ReplicaState,
    /// The record of the revision being applied, opened at the first
    /// batch.
    applying: Option<Applying>,
    /// The store's lock, held while [`Replicator::run`] runs.
    lock: Option<ReplicatorLock>,
    /// The endpoint to connect to first (the one last used, or the next
    /// one after a member that could not prove itself current).
    member: usize,
    /// When the next consistency check is due (`None`: at the first
    /// chance).
    next_check: Option<tokio::time::Instant>,
    /// Whether the last list was made because a check differed (the next
    /// check then runs at once, to see whether the list mended it).
    listed_for_check: bool,
    /// etcd's digest minus the replica's at a check that still differed
    /// right after such a list: entries this store cannot hold. A later
    /// check with the same difference does not list again.
    not_held: Option<(u64, u128)>,
    /// The etcd version of each endpoint looked at (`None`: it did not
    /// say).
    versions: std::collections::HashMap<usize, Option<(u32, u32, u32)>>,
    /// The store's audit log: the last revision logged.
    audit: crate::audit::Log,
    /// What it does, as metrics ([`crate::metrics`]); every report goes
    /// through them too.
    metrics: Metrics,
    report: Box<dyn FnMut(Report) + Send>,
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("settings", &self.settings)
            .field("store", &self.store.dir())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

enum Next {
    /// List again (a compaction, a consistency check that differed).
    List(Relist),
}
impl Replicator {
    /// A replicator of `store` (opened with the tree in step, as the master
    /// needs it) from the etcd of `settings`; `report` hears what it does.
    pub fn new(
        settings: Settings,
        store: Store,
        mut report: impl FnMut(Report) + Send + 'static,
    ) -> Replicator {
        let metrics = Metrics::new(store.dir(), &settings);
        let m = metrics.clone();
        Replicator {
            settings,
            store,
            state: ReplicaState::default(),
            applying: None,
            lock: None,
            member: std::process::id() as usize,
            versions: Default::default(),
            next_check: None,
            listed_for_check: false,
            not_held: None,
            audit: crate::audit::Log::default(),
            metrics,
            report: Box::new(move |r| {
                m.report(&r);
                report(r)
            }),
        }
    }

    /// Its metrics, health and readiness: serve them with
    /// [`crate::metrics::serve`] beside [`Replicator::run`].
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Runs until `stop` completes, or forever; returns only an error that
    /// retrying cannot mend (another replicator holds the store: see
    /// [`crate::lock`]; the store's own refusals are retried: an operator
    /// may fix them while it waits).
    pub async fn run(&mut self, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(stop);
        if self.lock.is_none() {
            self.lock = Some(ReplicatorLock::acquire(self.store.dir()).await?);
            // A tree write that a killed writer (this replicator's last run,
            // say) left unfinished, before anything else. A failure here is
            // the first batch's to meet again.
            match self.store.resume_tree() {
                Ok(Some(r)) => (self.report)(Report::TreeResumed {
                    what: r.to_string(),
                }),
                Ok(None) => {}
                Err(e) => (self.report)(Report::TreeResumed {
                    what: format!("could not finish an interrupted write of the key tree: {e}"),
                }),
            }
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            self.metrics.beat();
            let session = self.session(&mut backoff);
            let out = tokio::select! {
                r = session => r,
                () = &mut stop => return Ok(()),
            };
            let why = match out {
                Ok(never) => match never {},
                Err(e) => e.to_string(),
            };
            (self.report)(Report::Lost {
                why,
                retry_in: backoff,
            });
            self.metrics.beat();
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = &mut stop => return Ok(()),
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// [`Replicator::run`] on a runtime of its own, on this thread, forever.
    pub fn run_blocking(mut self) -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start the async runtime: {e}")))?;
        rt.block_on(self.run(std::future::pending()))
    }

    /// Connects, lists when needed, then watches until something fails.
    async fn session(&mut self, backoff: &mut Duration) -> Result<std::convert::Infallible> {
        let (mut client, at) = self.settings.connect_from(self.member).await?;
        self.member = at;
        self.metrics.beat();
        if !self.versions.contains_key(&at) {
            let v = self.check_version(&mut client, at).await;
            self.versions.insert(at, v);
        }
        let mut must_list = self.resumable(&mut client).await?;
        loop {
            self.metrics.beat();
            if let Some(why) = must_list.take() {
                self.list(&mut client, why).await?;
            }
            *backoff = Duration::from_millis(100);
            match self.watch(&mut client).await? {
                Next::List(why) => must_list = Some(why),
            }
        }
    }

    /// Reports a member older than [`WATCH_FIXED`] (a member that does not
    /// say is not reported).
    async fn check_version(&mut self, client: &mut Client, at: usize) -> Option<(u32, u32, u32)> {
        let Ok(r) = client.status().await else {
            return None;
        };
        let version = r.version().to_owned();
        let parsed: Vec<u32> = version
            .split(|c: char| !c.is_ascii_digit())
            .take(3)
            .filter_map(|p| p.parse().ok())
            .collect();
        if let [a, b, c] = parsed[..] {
            if (a, b, c) < WATCH_FIXED {
                (self.report)(Report::OldEtcd {
                    endpoint: self.settings.endpoints[at].clone(),
                    version,
                });
            }
            return Some((a, b, c));
        }
        None
    }
}
