//! What the replicator tells its caller ([`Report`]), and how each report
//! reads as lines of a log ([`Report::lines`]: the CLI's stderr, Salt's
//! log).

use std::time::Duration;

use crate::replica::Applied;

/// The first etcd 3.5 release with the watch fixes Kubernetes requires
/// (progress notifications no longer ahead of events; no event lost on a
/// slow watcher): older ones are warned of.
pub const WATCH_FIXED: (u32, u32, u32) = (3, 5, 13);

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
    /// over [`crate::Settings::max_response`]: many revisions of large values; or
    /// more events than it holds): resuming the watch would meet it again,
    /// so the replicator lists again (in pages).
    TooLarge {
        /// The transport's words.
        why: String,
    },
    /// The recorded state could not be trusted: listing again.
    Relist {
        /// Why (a history that forked, a copied store, ...).
        why: String,
    },
    /// A consistency check ran ([`crate::check`]).
    Checked {
        /// The revision compared at.
        revision: i64,
        /// Entries in etcd's digest.
        entries: u64,
        /// `equal`, `differed` (listing again), `not_held` (differed again
        /// right after a list: not listing again) or `skipped`.
        result: &'static str,
    },
    /// At the start, a write of the key tree that a killed writer left
    /// unfinished was finished ([`keycache::Store::resume_tree`]).
    TreeResumed {
        /// What was done, or why it could not be.
        what: String,
    },
    /// The key tree disagrees with the store (found by a consistency
    /// check): changed by hand, never mended by the replicator.
    TreeDisagrees {
        /// How many entries disagree.
        count: u64,
        /// The first, as `keycache verify` says it.
        first: String,
    },
    /// The etcd member is older than [`WATCH_FIXED`].
    OldEtcd {
        /// The member's endpoint.
        endpoint: String,
        /// Its version.
        version: String,
    },
    /// Audit records older than the retention were deleted from etcd
    /// ([`crate::audit::trim`]).
    AuditTrimmed {
        /// Audit keys deleted.
        deleted: i64,
    },
    /// The audit trail's retention could not be applied (retried at the
    /// next check).
    AuditTrimFailed {
        /// Why.
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
            Report::Relist { why } => (Level::Warning, format!("{why}: listing again"), None),
            Report::TreeResumed { what } => (Level::Warning, what.clone(), None),
            Report::TreeDisagrees { count, first } => (
                Level::Warning,
                format!(
                    "the key tree disagrees with the store in {count} entr{} (changed by hand; \
                     not mended by the replicator: `salt-run keycache.verify repair=True` or \
                     `keycache verify --repair` mends it once looked at), first: {first}",
                    if *count == 1 { "y" } else { "ies" }
                ),
                None,
            ),
            Report::Checked {
                revision,
                entries,
                result,
            } => (
                if *result == "equal" || *result == "skipped" {
                    Level::Info
                } else {
                    Level::Warning
                },
                match *result {
                    "equal" => format!(
                        "consistency check at revision {revision}: the replica equals etcd \
                         ({entries} entries)"
                    ),
                    "skipped" => format!(
                        "consistency check at revision {revision}: skipped, etcd compacted that \
                         revision"
                    ),
                    "not_held" => format!(
                        "consistency check at revision {revision}: the replica still differs \
                         from etcd ({entries} entries) right after a list: entries this store \
                         cannot hold (a full bank?); not listing again"
                    ),
                    _ => format!(
                        "consistency check at revision {revision}: the replica differs from \
                         etcd ({entries} entries): listing again"
                    ),
                },
                None,
            ),
            Report::OldEtcd { endpoint, version } => (
                Level::Warning,
                format!(
                    "etcd {version} at {endpoint} is older than {}.{}.{}, the first release \
                     with the watch fixes Kubernetes requires (progress notifications ahead of \
                     events, events lost by slow watchers): upgrade etcd",
                    WATCH_FIXED.0, WATCH_FIXED.1, WATCH_FIXED.2
                ),
                None,
            ),
            Report::AuditTrimmed { deleted } => (
                Level::Info,
                format!(
                    "deleted {deleted} audit key{} older than the retention from etcd",
                    if *deleted == 1 { "" } else { "s" }
                ),
                None,
            ),
            Report::AuditTrimFailed { why } => (
                Level::Warning,
                format!(
                    "could not delete old audit keys from etcd ({why}): retried at the next check"
                ),
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
