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

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use keycache::store::Store;

use crate::anchor::Verdict;
use crate::catch_up::{CatchUp, Step, MAX_HELD};
use crate::connect::Settings;
use crate::error::{Error, Result};
use crate::lock::ReplicatorLock;
use crate::metrics::{Metrics, Relist};
use crate::replica::{self, Applied, Change};
pub use crate::report::{Level, Report};
use crate::state::{boot_ms, now_ms, Anchor, Applying, Binding, CheckResult, ReplicaState};

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
/// The shortest time between two proofs asked for early (after a batch,
/// while the last proof is old).
const ASK_AGAIN_AFTER: Duration = Duration::from_millis(100);
/// How long a writer waits for a running replicator's next proof before it
/// takes a stale replica for stale: a proof's period and its read, twice.
pub const PROOF_GRACE: Duration = Duration::from_secs(3);
/// The first etcd 3.5 release whose progress notifications never run
/// ahead of the events of their revision (etcd issue 15220).
const PROGRESS_EXACT: (u32, u32, u32) = (3, 5, 8);
/// The first etcd 3.5 release with the watch fixes Kubernetes requires
/// (progress notifications no longer ahead of events; no event lost on a
/// slow watcher): older ones are warned of.
pub const WATCH_FIXED: (u32, u32, u32) = (3, 5, 13);

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

/// A proof of currency under way: a linearizable read answered at
/// `revision`, taken at `boot_ms`; it holds once the watch reports
/// progress up to that revision.
#[derive(Debug, Clone, Copy)]
struct Proof {
    revision: i64,
    boot_ms: u64,
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

    /// Whether the recorded state lets the watch resume (`None`), or why
    /// not: the same prefix, the same etcd cluster, a revision etcd has
    /// reached, written for this store ([`Binding`]), and a history in etcd
    /// that still holds the last change the store applied
    /// ([`crate::anchor`]).
    async fn resumable(&mut self, client: &mut Client) -> Result<Option<Relist>> {
        // An unreadable state (a crash while it was replaced) lists again.
        let Ok(Some(s)) = ReplicaState::read(self.store.dir()) else {
            return Ok(Some(Relist::Start));
        };
        let r = client
            .get(
                self.settings.layout.prefix(),
                Some(GetOptions::new().with_limit(1).with_keys_only()),
            )
            .await
            .map_err(|e| self.settings.err("range", e))?;
        let h = r
            .header()
            .ok_or_else(|| self.settings.err("range", "no header"))?;
        let fits = s.prefix == self.settings.layout.prefix()
            && s.cluster_id == h.cluster_id()
            && s.revision > 0
            && s.revision <= h.revision();
        let bound = s.belongs_to(self.store.dir());
        let (anchor, revision) = (s.anchor.clone(), s.revision);
        let (s_prefix, s_cluster) = (s.prefix.clone(), s.cluster_id);
        // The state this replicator writes names its own pid.
        self.state = ReplicaState {
            pid: std::process::id(),
            ..s
        };
        if !fits {
            let why = if s_prefix != self.settings.layout.prefix() {
                format!("the replica holds etcd prefix {s_prefix}, not this one")
            } else if s_cluster != h.cluster_id() {
                format!(
                    "the replica holds etcd cluster {s_cluster:x}, not {:x} (etcd replaced, or \
                     restored with a new token)",
                    h.cluster_id()
                )
            } else {
                format!(
                    "the replica holds revision {revision}, which etcd has not reached (at {}): \
                     etcd went back (restored from a backup?)",
                    h.revision()
                )
            };
            (self.report)(Report::Relist { why });
            return Ok(Some(Relist::Mismatch));
        }
        if !bound {
            (self.report)(Report::Relist {
                why: format!(
                    "{} was not written for the store in {} (a copy or a restore of the \
                     directory, or a state from an older keycache)",
                    crate::state::path(self.store.dir()).display(),
                    self.store.dir().display()
                ),
            });
            return Ok(Some(Relist::NotBound));
        }
        let (why, relist) =
            match crate::anchor::verify(client, &self.settings, anchor.as_ref(), revision).await? {
                Verdict::Same => {
                    self.metrics.recorded(&self.state);
                    return Ok(None);
                }
                Verdict::Forked(why) => (why, Relist::Forked),
                Verdict::Unknown(why) => (why, Relist::Unverified),
            };
        (self.report)(Report::Relist { why });
        Ok(Some(relist))
    }

    /// Whether the store's files are not those the state was last written
    /// for (a restore of the directory's files in place, behind this
    /// replicator's back): then its record no longer describes them, and it
    /// reports that it lists again.
    fn files_replaced(&mut self) -> Result<bool> {
        if self.state.store.as_ref() == Some(&Binding::of(self.store.dir())?) {
            return Ok(false);
        }
        (self.report)(Report::Relist {
            why: format!(
                "the store's files in {} were replaced since this replicator last wrote them",
                self.store.dir().display()
            ),
        });
        Ok(true)
    }

    /// Writes the state, bound to the store's files as they are now.
    fn write_state(&mut self) -> Result<()> {
        self.state.store = Some(Binding::of(self.store.dir())?);
        self.state.write(self.store.dir())?;
        self.metrics.recorded(&self.state);
        Ok(())
    }

    /// Lists the prefix at one revision and makes the store equal to it
    /// (`why`: for the metrics).
    async fn list(&mut self, client: &mut Client, why: Relist) -> Result<()> {
        self.metrics.relisted(why);
        let t = std::time::Instant::now();
        let read_at = boot_ms();
        let mut l = self
            .metrics
            .beating(crate::list::list(client, &self.settings))
            .await?;
        let listing = t.elapsed();
        let t = std::time::Instant::now();
        // The audit records listed that the log lacks, before the store
        // changes and the revision is recorded.
        self.audit
            .append_listed(self.store.dir(), std::mem::take(&mut l.audit), l.revision)?;
        // Recorded before the store changes: a kill in between leaves a
        // store at this revision and a record behind it (`catch_up`).
        self.record_applying(l.revision)?;
        let mut done = replica::apply_list(&self.store, &l.entries)?;
        let took = t.elapsed();
        done.refused.splice(0..0, l.refused);
        self.state = ReplicaState {
            prefix: self.settings.layout.prefix().to_owned(),
            cluster_id: l.cluster_id,
            revision: l.revision,
            listed_at: l.revision,
            etcd_revision: l.revision,
            // A list is a read at etcd's current revision, linearizable:
            // the store now holds it.
            contact_ms: now_ms(),
            contact_boot_ms: read_at,
            boot_id: crate::state::boot_id(),
            current_through: l.revision,
            anchor: l.anchor,
            store: None,
            check: self.state.check.take(),
            pid: std::process::id(),
        };
        self.write_state()?;
        // Equal to etcd at that revision: the next check after a period,
        // or at once after a list made because a check differed (did the
        // list mend it?).
        self.next_check = (!self.listed_for_check)
            .then(|| tokio::time::Instant::now() + self.settings.check_every);
        (self.report)(Report::Listed {
            revision: l.revision,
            entries: l.keys,
            applied: done,
            listing,
            took,
        });
        self.metrics.count_keys(&self.store);
        Ok(())
    }

    /// Whether etcd still holds the history right after the revision the
    /// store holds. etcd lets a watch start at its compaction revision, but
    /// compaction has already dropped the deletions made at that very
    /// revision (a key whose last revision is a deletion is forgotten
    /// whole): a watch from there would miss them, a revocation among
    /// them. A range read at the store's own revision fails exactly when
    /// etcd compacted past it (gRPC `OUT_OF_RANGE`, as for a revision etcd
    /// has not reached): then the replicator lists again. Asked once the
    /// watcher exists, so that a compaction after the question cancels the
    /// watcher instead.
    async fn history_kept(&self, client: &mut Client) -> Result<bool> {
        let o = GetOptions::new()
            .with_revision(self.state.revision)
            .with_limit(1)
            .with_keys_only();
        match client.get(self.settings.layout.prefix(), Some(o)).await {
            Ok(_) => Ok(true),
            Err(etcd_client::Error::GRpcStatus(s))
                if s.code() as i32 == crate::list::GRPC_OUT_OF_RANGE =>
            {
                Ok(false)
            }
            Err(e) => Err(self.settings.err("range (history check)", e)),
        }
    }

    /// Records `revision` as the one being applied, before the store
    /// changes ([`Applying`]).
    fn record_applying(&mut self, revision: i64) -> Result<()> {
        let a = match &mut self.applying {
            Some(a) => a,
            none => none.insert(Applying::open(self.store.dir())?),
        };
        a.record(revision)
    }

    /// Reports a watch response too large to take ([`too_large`]) and
    /// answers that the replicator lists again.
    fn list_again(&mut self, e: etcd_client::Error) -> Next {
        (self.report)(Report::TooLarge { why: e.to_string() });
        Next::List(Relist::TooLarge)
    }

    /// A linearizable read through `client`, at most [`READ_TIMEOUT`]: the
    /// revision etcd had when the member answered, proving the member
    /// current (a member whose disk stalls, or cut off from the quorum,
    /// answers none).
    async fn read_current(&self, client: &mut Client) -> Option<i64> {
        let o = GetOptions::new().with_limit(1).with_count_only();
        let read = client.get(self.settings.layout.prefix(), Some(o));
        match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok(r)) => r.header().map(|h| h.revision()),
            _ => None,
        }
    }

    /// The consistency check at the revision the store holds: `Some(List)`
    /// when the replica differs from etcd and a list should mend it.
    async fn check(&mut self, client: &mut Client) -> Result<Option<Next>> {
        // The store holds etcd's prefix as of the last proof too, when the
        // member's progress notifications come after the events of their
        // revision (3.5.8 and later): checked there, a quiet prefix is not
        // skipped for a revision etcd compacted long ago.
        let exact = self
            .versions
            .get(&self.member)
            .is_some_and(|v| v.is_some_and(|v| v >= PROGRESS_EXACT));
        let revision = if exact {
            self.state.revision.max(self.state.current_through)
        } else {
            self.state.revision
        };
        let local = crate::check::local(&self.store)?;
        let remote = crate::check::remote(client, &self.settings, &self.store, revision).await?;
        let last = self.state.check.clone();
        let (mut runs, mut differed) = last.map_or((0, 0), |c| (c.runs, c.differed));
        runs += 1;
        let (result, entries) = match remote {
            None => ("skipped", 0),
            Some(d) if d == local => ("equal", d.entries),
            Some(d) if self.listed_for_check || self.not_held == Some(d.minus(&local)) => {
                self.not_held = Some(d.minus(&local));
                ("not_held", d.entries)
            }
            Some(d) => ("differed", d.entries),
        };
        if result == "equal" {
            self.not_held = None;
        }
        if result == "differed" || result == "not_held" {
            differed += 1;
        }
        // The key tree against the store (after the replicator's own
        // writes, which keep it in step): what is left was done by hand.
        let tree = if self.store.tree().is_on() {
            Some(keycache::tree::check(&self.store)?)
        } else {
            None
        };
        self.state.check = Some(CheckResult {
            revision,
            result: result.to_owned(),
            entries,
            boot_ms: boot_ms(),
            runs,
            differed,
            tree: tree.as_ref().map(|t| t.len() as u64),
            tree_first: tree.as_ref().and_then(|t| t.first()).map(|d| d.to_string()),
        });
        self.write_state()?;
        (self.report)(Report::Checked {
            revision,
            entries,
            result,
        });
        if let Some(t) = tree.filter(|t| !t.is_empty()) {
            (self.report)(Report::TreeDisagrees {
                count: t.len() as u64,
                first: t[0].to_string(),
            });
        }
        self.listed_for_check = result == "differed";
        // The audit trail's retention: a failure is reported, and the next
        // check tries again.
        match crate::audit::trim(client, &self.settings, std::time::SystemTime::now()).await {
            Ok(0) => {}
            Ok(deleted) => (self.report)(Report::AuditTrimmed { deleted }),
            Err(e) => (self.report)(Report::AuditTrimFailed { why: e.to_string() }),
        }
        Ok((result == "differed").then_some(Next::List(Relist::CheckDiffers)))
    }

    /// Watches from the recorded revision until the watch must list again
    /// (`Ok`) or fails (`Err`).
    async fn watch(&mut self, client: &mut Client) -> Result<Next> {
        let layout = self.settings.layout.clone();
        let opts = WatchOptions::new()
            .with_range(layout.range_end())
            .with_start_revision(self.state.revision + 1)
            .with_progress_notify();
        let stream = client
            .watch_client()
            .max_decoding_message_size(self.settings.max_response)
            .watch(layout.prefix(), Some(opts))
            .await
            .map_err(|e| self.settings.err("watch", e))?;
        let (mut requests, mut responses) = stream.split();
        // The watcher exists once etcd says so; only then is the history
        // after our revision known to be whole (see `history_kept`).
        let current = match responses
            .message()
            .await
            .map_err(|e| self.settings.err("watch", e))?
        {
            Some(m) if m.created() && !m.canceled() => m.header().map_or(0, |h| h.revision()),
            Some(m) if m.compact_revision() > 0 => {
                (self.report)(Report::Compacted {
                    compact_revision: m.compact_revision(),
                });
                return Ok(Next::List(Relist::Compacted));
            }
            Some(m) => {
                return Err(self
                    .settings
                    .err("watch", format!("not created: {}", m.cancel_reason())))
            }
            None => return Err(self.settings.err("watch", "the stream ended")),
        };
        if !self.history_kept(client).await? {
            (self.report)(Report::Compacted {
                compact_revision: self.state.revision + 1,
            });
            return Ok(Next::List(Relist::Compacted));
        }
        // A replay of changes the store may hold already is applied as
        // one batch (see `catch_up`).
        let applying = Applying::read(self.store.dir())?;
        let mut catch_up = CatchUp::new(self.state.revision, applying, current);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut proof: Option<Proof> = None;
        let mut asked = tokio::time::Instant::now();
        let mut failures = 0;
        loop {
            let first = tokio::select! {
                m = responses.message() => match m {
                    Err(e) if too_large(&e) => return Ok(self.list_again(e)),
                    m => m.map_err(|e| self.settings.err("watch", e))?,
                },
                _ = tick.tick() => {
                    self.metrics.beat();
                    self.metrics.count_keys(&self.store);
                    // A check runs between two batches, the store at the
                    // revision it records; not during a catch-up.
                    let due = self.next_check.is_none_or(|t| tokio::time::Instant::now() >= t);
                    if due && catch_up.is_none() {
                        self.next_check = Some(tokio::time::Instant::now() + self.settings.check_every);
                        let m = self.metrics.clone();
                        let checked = m.beating(self.check(client)).await;
                        if checked.is_err() {
                            m.check_failed();
                        }
                        if let Some(n) = checked? {
                            return Ok(n);
                        }
                    }
                    // The store's files replaced behind the replicator's
                    // back (a restore of the directory's files in place):
                    // its record no longer describes them.
                    if catch_up.is_none() && self.files_replaced()? {
                        return Ok(Next::List(Relist::FilesReplaced));
                    }
                    let at = boot_ms();
                    asked = tokio::time::Instant::now();
                    match self.read_current(client).await {
                        Some(revision) => {
                            failures = 0;
                            proof = Some(Proof { revision, boot_ms: at });
                        }
                        None => {
                            failures += 1;
                            if failures >= MAX_READ_FAILURES {
                                // Another member next time.
                                self.member += 1;
                                return Err(self.settings.err(
                                    "linearizable read",
                                    format!(
                                        "{} answered none of the last {failures} in {} ms: it \
                                         is not proven current (a stalled disk, or no quorum); \
                                         connecting to another member",
                                        self.settings.endpoints[self.member.wrapping_sub(1) % self.settings.endpoints.len().max(1)],
                                        READ_TIMEOUT.as_millis()
                                    ),
                                ));
                            }
                        }
                    }
                    requests.request_progress().await.map_err(|e| self.settings.err("watch progress", e))?;
                    continue;
                }
            };
            let Some(first) = first else {
                return Err(self.settings.err("watch", "the stream ended"));
            };
            self.metrics.beat();
            // Responses already waiting join this batch.
            let mut batch = vec![first];
            let mut events: usize = batch[0].events().len();
            while events < MAX_EVENTS {
                match tokio::time::timeout(Duration::ZERO, responses.message()).await {
                    Ok(Ok(Some(m))) => {
                        events += m.events().len();
                        batch.push(m);
                    }
                    Ok(Err(e)) if too_large(&e) => return Ok(self.list_again(e)),
                    Ok(Err(e)) => return Err(self.settings.err("watch", e)),
                    Ok(Ok(None)) | Err(_) => break,
                }
            }
            // A batch that ends a catch-up is applied over a store that may be
            // ahead of its record; any other is checked against the files
            // first.
            let catch_up_done = catch_up.is_none();
            let batch = match &mut catch_up {
                None => batch,
                Some(c) => match c.take(batch) {
                    Step::Wait => continue,
                    Step::Compacted(compact_revision) => {
                        (self.report)(Report::Compacted { compact_revision });
                        return Ok(Next::List(Relist::Compacted));
                    }
                    Step::TooMany => {
                        (self.report)(Report::TooLarge {
                            why: format!("a catch-up of more than {MAX_HELD} events"),
                        });
                        return Ok(Next::List(Relist::TooLarge));
                    }
                    Step::Apply(all) => {
                        catch_up = None;
                        all
                    }
                },
            };
            let events = batch.iter().map(|m| m.events().len()).sum();
            let mut changes: Vec<Change> = Vec::with_capacity(events);
            let mut applied = Applied::default();
            let mut revision = self.state.revision;
            let mut etcd_revision = self.state.etcd_revision;
            let mut anchor: Option<Anchor> = None;
            let mut proven: Option<Proof> = None;
            let mut next = None;
            let mut audit: crate::audit::Found = Vec::new();
            for m in &batch {
                if let Some(h) = m.header() {
                    etcd_revision = etcd_revision.max(h.revision());
                }
                if m.compact_revision() > 0 {
                    (self.report)(Report::Compacted {
                        compact_revision: m.compact_revision(),
                    });
                    next = Some(Next::List(Relist::Compacted));
                    break;
                }
                if m.canceled() {
                    return Err(self
                        .settings
                        .err("watch", format!("canceled: {}", m.cancel_reason())));
                }
                if m.events().is_empty() {
                    // A progress notification. Its revision is not taken
                    // as the store's (etcd before 3.5.8 and 3.4.24 can send
                    // it ahead of the events of that revision, etcd issue
                    // 15220); it completes a proof of currency whose read
                    // it reaches.
                    let p = m.header().map_or(0, |h| h.revision());
                    if let Some(pr) = proof.filter(|pr| p >= pr.revision) {
                        proven = Some(pr);
                        proof = None;
                    }
                    continue;
                }
                for ev in m.events() {
                    let Some(kv) = ev.kv() else { continue };
                    if layout.is_audit(kv.key()) {
                        // Not key state: logged below; the retention's
                        // deletions are passed over.
                        if ev.event_type() == EventType::Put {
                            audit.push((kv.mod_revision(), kv.value().to_vec()));
                        }
                        continue;
                    }
                    revision = revision.max(kv.mod_revision());
                    let value = match ev.event_type() {
                        EventType::Put => Some(kv.value()),
                        EventType::Delete => None,
                    };
                    anchor = Some(Anchor::of(kv, value.is_none()));
                    if let Some(c) = replica::decode(&layout, kv.key(), value, &mut applied) {
                        changes.push(c);
                    }
                }
            }
            if catch_up_done && self.files_replaced()? {
                return Ok(Next::List(Relist::FilesReplaced));
            }
            // The batch's audit records, before the store changes and its
            // revision is recorded (see the module's header).
            self.audit.append(self.store.dir(), audit)?;
            let t = std::time::Instant::now();
            if !changes.is_empty() {
                // Recorded before the store changes (see `catch_up`).
                self.record_applying(revision)?;
                let mut done = replica::apply_changes(&self.store, &changes)?;
                done.refused
                    .splice(0..0, std::mem::take(&mut applied.refused));
                applied = done;
            }
            let moved = anchor.is_some();
            if let Some(a) = anchor {
                self.state.anchor = Some(a);
                self.state.revision = revision;
            }
            self.state.etcd_revision = etcd_revision;
            if let Some(p) = proven {
                self.state.contact_boot_ms = p.boot_ms;
                self.state.boot_id = crate::state::boot_id();
                self.state.contact_ms = now_ms();
                self.state.current_through = p.revision;
            }
            if moved || proven.is_some() {
                self.write_state()?;
            }
            // A replica that applied changes without a recent proof (a
            // restart's catch-up) asks for one at once: etcd from 3.5.8
            // answers a progress request only once the watcher caught up.
            let old_proof = boot_ms().saturating_sub(self.state.contact_boot_ms)
                > PROGRESS_EVERY.as_millis() as u64;
            if moved && old_proof && asked.elapsed() >= ASK_AGAIN_AFTER {
                tick.reset_immediately();
            }
            if !changes.is_empty() || !applied.refused.is_empty() {
                (self.report)(Report::Applied {
                    revision,
                    events: changes.len(),
                    applied,
                    took: t.elapsed(),
                });
            }
            if let Some(n) = next {
                return Ok(n);
            }
        }
    }
}

/// Whether a watch stream failed on a response over
/// [`Settings::max_response`] (tonic's `OUT_OF_RANGE`; etcd puts up to
/// 1,000 revisions in one catch-up response, fragmenting none unless asked):
/// resuming from the same revision would fail the same way, forever, and
/// hold back every later change, revocations included; a list is paged.
fn too_large(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() as i32 == crate::list::GRPC_OUT_OF_RANGE)
}
