//! When the replicator lists again: whether the recorded state lets the watch
//! resume (the same prefix, etcd cluster and store files, a history etcd still
//! holds), and the list itself, which makes the store equal to the prefix.

use etcd_client::{Client, GetOptions};

use crate::anchor::Verdict;
use crate::error::Result;
use crate::metrics::Relist;
use crate::replica;
use crate::report::Report;
use crate::state::{boot_ms, now_ms, Binding, ReplicaState};

use super::Replicator;

impl Replicator {
    /// Whether the recorded state lets the watch resume (`None`), or why
    /// not: the same prefix, the same etcd cluster, a revision etcd has
    /// reached, written for this store ([`Binding`]), and a history in etcd
    /// that still holds the last change the store applied
    /// ([`crate::anchor`]).
    pub(super) async fn resumable(&mut self, client: &mut Client) -> Result<Option<Relist>> {
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
    pub(super) fn files_replaced(&mut self) -> Result<bool> {
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
    pub(super) fn write_state(&mut self) -> Result<()> {
        self.state.store = Some(Binding::of(self.store.dir())?);
        self.state.write(self.store.dir())?;
        self.metrics.recorded(&self.state);
        Ok(())
    }

    /// Lists the prefix at one revision and makes the store equal to it
    /// (`why`: for the metrics).
    pub(super) async fn list(&mut self, client: &mut Client, why: Relist) -> Result<()> {
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
            .append_listed(self.store.dir(), std::mem::take(&mut l.audit))?;
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
    pub(super) async fn history_kept(&self, client: &mut Client) -> Result<bool> {
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
}
