//! The watch: changes applied in batches as etcd sends them, the revision
//! recorded after each, and the proofs of currency (a linearizable read, then
//! the watch's progress) that keep the replica's time of last contact fresh.

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};

use crate::catch_up::{CatchUp, Step, MAX_HELD};
use crate::error::Result;
use crate::metrics::Relist;
use crate::replica::{self, Applied, Change};
use crate::report::Report;
use crate::state::{boot_ms, now_ms, Anchor, Applying};

use super::{Next, Replicator, MAX_EVENTS, MAX_READ_FAILURES, PROGRESS_EVERY, READ_TIMEOUT};

/// The shortest time between two proofs asked for early (after a batch,
/// while the last proof is old).
const ASK_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// A proof of currency under way: a linearizable read answered at
/// `revision`, taken at `boot_ms`; it holds once the watch reports
/// progress up to that revision.
#[derive(Debug, Clone, Copy)]
struct Proof {
    revision: i64,
    boot_ms: u64,
}

impl Replicator {
    /// Records `revision` as the one being applied, before the store
    /// changes ([`Applying`]).
    pub(super) fn record_applying(&mut self, revision: i64) -> Result<()> {
        let a = match &mut self.applying {
            Some(a) => a,
            none => none.insert(Applying::open(self.store.dir())?),
        };
        a.record(revision)
    }

    /// Reports a watch response too large to take ([`too_large`]) and
    /// answers that the replicator lists again.
    pub(super) fn list_again(&mut self, e: etcd_client::Error) -> Next {
        (self.report)(Report::TooLarge { why: e.to_string() });
        Next::List(Relist::TooLarge)
    }

    /// A linearizable read through `client`, at most [`READ_TIMEOUT`]: the
    /// revision etcd had when the member answered, proving the member
    /// current (a member whose disk stalls, or cut off from the quorum,
    /// answers none).
    pub(super) async fn read_current(&self, client: &mut Client) -> Option<i64> {
        let o = GetOptions::new().with_limit(1).with_count_only();
        let read = client.get(self.settings.layout.prefix(), Some(o));
        match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok(r)) => r.header().map(|h| h.revision()),
            _ => None,
        }
    }

    /// Watches from the recorded revision until the watch must list again
    /// (`Ok`) or fails (`Err`).
    pub(super) async fn watch(&mut self, client: &mut Client) -> Result<Next> {
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
            self.audit
                .append(self.store.dir(), audit, self.state.revision)?;
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
/// [`Settings::max_response`](crate::connect::Settings::max_response)
/// (tonic's `OUT_OF_RANGE`; etcd puts up to 1,000 revisions in one catch-up
/// response, fragmenting none unless asked):
/// resuming from the same revision would fail the same way, forever, and
/// hold back every later change, revocations included; a list is paged.
fn too_large(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() as i32 == crate::list::GRPC_OUT_OF_RANGE)
}
