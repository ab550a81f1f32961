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
//! A crash anywhere leaves the recorded revision at or behind the store:
//! changes are absolute (a value or a removal), and what etcd committed
//! before a watch began is applied as one batch ([`crate::catch_up`]), so
//! applying some twice after a restart changes nothing, not even for a
//! moment (a revoked key is never accepted again in between).

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use keycache::store::Store;

use crate::catch_up::{CatchUp, Step, MAX_HELD};
use crate::connect::Settings;
use crate::error::{Error, Result};
use crate::replica::{self, Applied, Change};
use crate::state::{now_ms, Applying, ReplicaState};

/// Events applied in one batch at most.
pub const MAX_EVENTS: usize = 10_000;
/// How often the watch asks etcd for its progress.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What the replicator tells its caller (the CLI prints these).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Report {
    /// The store was made equal to etcd's list at `revision`.
    Listed {
        /// The revision listed.
        revision: i64,
        /// Entries under the prefix.
        entries: usize,
        /// What changed locally.
        applied: Applied,
        /// How long the list took (etcd's pages).
        listing: Duration,
        /// How long the store (and tree) writes took.
        took: Duration,
    },
    /// A batch of watched changes was applied.
    Applied {
        /// The revision the store now holds.
        revision: i64,
        /// Events in the batch.
        events: usize,
        /// What changed locally.
        applied: Applied,
        /// How long the store (and tree) writes took.
        took: Duration,
    },
    /// The watch's revision was compacted: listing again.
    Compacted {
        /// etcd's compaction revision.
        compact_revision: i64,
    },
    /// A watch's catch-up was more than the replicator takes (a response
    /// over [`Settings::max_response`]: many revisions of large values; or
    /// more events than it holds): resuming the watch would meet it again,
    /// so the replicator lists again (in pages).
    TooLarge {
        /// The transport's words.
        why: String,
    },
    /// The connection was lost or refused; retrying after `retry_in`.
    Lost {
        /// Why.
        why: String,
        /// When the next try is.
        retry_in: Duration,
    },
}

/// How much a line of a [`Report`] matters, for a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// A batch of changes applied.
    Debug,
    /// A list.
    Info,
    /// A compaction, a lost connection, an etcd key the store cannot hold.
    Warning,
}

impl Report {
    /// The report as lines for a log (the CLI's stderr, Salt's log): what
    /// happened, then one line per etcd key that the store cannot hold.
    pub fn lines(&self) -> Vec<(Level, String)> {
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        let (level, first, applied) = match self {
            Report::Listed {
                revision,
                entries,
                applied,
                took,
                ..
            } => (
                Level::Info,
                format!(
                    "listed {entries} entries at revision {revision}: {} written, {} removed \
                     in {:.1} ms",
                    applied.written,
                    applied.removed,
                    ms(took)
                ),
                Some(applied),
            ),
            Report::Applied {
                revision,
                events,
                applied,
                took,
            } => (
                Level::Debug,
                format!(
                    "revision {revision}: {events} changes, {} written, {} removed in {:.1} ms",
                    applied.written,
                    applied.removed,
                    ms(took)
                ),
                Some(applied),
            ),
            Report::Compacted { compact_revision } => (
                Level::Warning,
                format!(
                    "etcd compacted its history past this replica's revision (to \
                     {compact_revision}): listing again"
                ),
                None,
            ),
            Report::TooLarge { why } => (
                Level::Warning,
                format!("the watch's catch-up is more than it takes ({why}): listing again"),
                None,
            ),
            Report::Lost { why, retry_in } => (
                Level::Warning,
                format!("{why}; retrying in {} ms", retry_in.as_millis()),
                None,
            ),
        };
        let mut out = vec![(level, first)];
        for (key, why) in applied.map_or(&[][..], |a| &a.refused[..]) {
            out.push((Level::Warning, format!("not held here: {key}: {why}")));
        }
        out
    }
}

/// A replicator of one store.
pub struct Replicator {
    settings: Settings,
    store: Store,
    state: ReplicaState,
    /// The record of the revision being applied, opened at the first
    /// batch.
    applying: Option<Applying>,
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
    /// List again (a compaction).
    List,
}

impl Replicator {
    /// A replicator of `store` (opened with the tree in step, as the master
    /// needs it) from the etcd of `settings`; `report` hears what it does.
    pub fn new(
        settings: Settings,
        store: Store,
        report: impl FnMut(Report) + Send + 'static,
    ) -> Replicator {
        Replicator {
            settings,
            store,
            state: ReplicaState::default(),
            applying: None,
            report: Box::new(report),
        }
    }

    /// Runs until `stop` completes, or forever; returns only an error that
    /// retrying cannot mend (the store's own refusals are retried too: an
    /// operator may fix them while it waits).
    pub async fn run(&mut self, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(stop);
        let mut backoff = Duration::from_millis(100);
        loop {
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
        let mut client = self.settings.connect().await?;
        let mut must_list = !self.resumable(&mut client).await?;
        loop {
            if must_list {
                self.list(&mut client).await?;
            }
            *backoff = Duration::from_millis(100);
            match self.watch(&mut client).await? {
                Next::List => must_list = true,
            }
        }
    }

    /// Whether the recorded state lets the watch resume: the same prefix,
    /// the same etcd cluster, a revision etcd has reached.
    async fn resumable(&mut self, client: &mut Client) -> Result<bool> {
        // An unreadable state (a crash while it was replaced) lists again.
        let Ok(Some(s)) = ReplicaState::read(self.store.dir()) else {
            return Ok(false);
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
        let ok = s.prefix == self.settings.layout.prefix()
            && s.cluster_id == h.cluster_id()
            && s.revision > 0
            && s.revision <= h.revision();
        // The state this replicator writes names its own pid.
        self.state = ReplicaState {
            pid: std::process::id(),
            ..s
        };
        Ok(ok)
    }

    /// Lists the prefix at one revision and makes the store equal to it.
    async fn list(&mut self, client: &mut Client) -> Result<()> {
        let t = std::time::Instant::now();
        let l = crate::list::list(client, &self.settings).await?;
        let listing = t.elapsed();
        let t = std::time::Instant::now();
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
            contact_ms: now_ms(),
            pid: std::process::id(),
        };
        self.state.write(self.store.dir())?;
        (self.report)(Report::Listed {
            revision: l.revision,
            entries: l.keys,
            applied: done,
            listing,
            took,
        });
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
        Next::List
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
                return Ok(Next::List);
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
            return Ok(Next::List);
        }
        // A replay of changes the store may hold already is applied as
        // one batch (see `catch_up`).
        let applying = Applying::read(self.store.dir())?;
        let mut catch_up = CatchUp::new(self.state.revision, applying, current);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                m = responses.message() => match m {
                    Err(e) if too_large(&e) => return Ok(self.list_again(e)),
                    m => m.map_err(|e| self.settings.err("watch", e))?,
                },
                _ = tick.tick() => {
                    requests.request_progress().await.map_err(|e| self.settings.err("watch progress", e))?;
                    continue;
                }
            };
            let Some(first) = first else {
                return Err(self.settings.err("watch", "the stream ended"));
            };
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
            let batch = match &mut catch_up {
                None => batch,
                Some(c) => match c.take(batch) {
                    Step::Wait => continue,
                    Step::Compacted(compact_revision) => {
                        (self.report)(Report::Compacted { compact_revision });
                        return Ok(Next::List);
                    }
                    Step::TooMany => {
                        (self.report)(Report::TooLarge {
                            why: format!("a catch-up of more than {MAX_HELD} events"),
                        });
                        return Ok(Next::List);
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
            let mut next = None;
            for m in &batch {
                if let Some(h) = m.header() {
                    etcd_revision = etcd_revision.max(h.revision());
                }
                if m.compact_revision() > 0 {
                    (self.report)(Report::Compacted {
                        compact_revision: m.compact_revision(),
                    });
                    next = Some(Next::List);
                    break;
                }
                if m.canceled() {
                    return Err(self
                        .settings
                        .err("watch", format!("canceled: {}", m.cancel_reason())));
                }
                if m.events().is_empty() {
                    // A progress notification: contact, nothing more. Its
                    // revision is not taken as the store's: etcd before
                    // 3.5.8 (and 3.4.24) can send it ahead of the events
                    // of that revision (etcd issue 15220).
                    continue;
                }
                for ev in m.events() {
                    let Some(kv) = ev.kv() else { continue };
                    revision = revision.max(kv.mod_revision());
                    let value = match ev.event_type() {
                        EventType::Put => Some(kv.value()),
                        EventType::Delete => None,
                    };
                    if let Some(c) = replica::decode(&layout, kv.key(), value, &mut applied) {
                        changes.push(c);
                    }
                }
            }
            let t = std::time::Instant::now();
            if !changes.is_empty() {
                // Recorded before the store changes (see `catch_up`).
                self.record_applying(revision)?;
                let mut done = replica::apply_changes(&self.store, &changes)?;
                done.refused
                    .splice(0..0, std::mem::take(&mut applied.refused));
                applied = done;
            }
            self.state.etcd_revision = etcd_revision;
            self.state.contact_ms = now_ms();
            self.state.revision = revision;
            self.state.write(self.store.dir())?;
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
