//! A watch's catch-up after a crash: the changes a store already held
//! past the revision it records, replayed as one batch.
//!
//! Before a batch's store write the replicator records the revision it is
//! applying ([`crate::state::Applying`]), and after it the
//! revision the store holds. A replicator killed between the two leaves a
//! store ahead of its record, and the next watch replays the changes from
//! the recorded revision on, which the store already holds. etcd sends a
//! replay in responses of at most 1,000 revisions. Applied one response at
//! a time, a key accepted early in the replay and revoked later would be
//! accepted again between the two, `minions/<id>` and all: a revoked key
//! back for a moment. Held until the revision that was being applied is
//! in, and applied at once, the replay takes the store from what it holds
//! to etcd's state at that revision in one step, whatever it held.
//!
//! That revision is the one of an event under the prefix (the last of
//! the batch), so an event at or past it is bound to come (a watch's
//! events come in revision order, a revision's in one response), unless
//! etcd compacted it, and the replicator lists again. A catch-up of more
//! than [`MAX_HELD`] events is not held: the replicator lists again.
//!
//! Not covered: a state file older than the store by more than one batch,
//! which only a power loss leaves (the state file is not fsynced; the
//! store is). A progress notification cannot prove a catch-up whole
//! instead: etcd before 3.5.8 answers a progress request at once, with its
//! current revision, before a watcher's backlog is sent.

use etcd_client::WatchResponse;

/// Events a catch-up holds at most; past them the replicator lists again
/// (a list, paged, makes the store equal to etcd in one step too).
pub const MAX_HELD: usize = 100_000;

/// What the watch does with the responses it received.
#[derive(Debug)]
pub(crate) enum Step {
    /// Hold them: the catch-up is not whole yet.
    Wait,
    /// Apply these, as one batch (the catch-up, whole, and what came with
    /// it).
    Apply(Vec<WatchResponse>),
    /// A compaction (at this revision): list again.
    Compacted(i64),
    /// More than [`MAX_HELD`] events: list again.
    TooMany,
}

/// A catch-up in progress (see the module's header).
#[derive(Debug)]
pub(crate) struct CatchUp {
    /// The revision that was being applied.
    through: i64,
    held: Vec<WatchResponse>,
    events: usize,
}

impl CatchUp {
    /// The catch-up of a watch that starts after `recorded`, when the
    /// store may hold changes up to `applying` (`None`: it holds none
    /// past `recorded`). `current` is etcd's revision when the watch
    /// began: a revision past it cannot have been applied.
    pub(crate) fn new(recorded: i64, applying: i64, current: i64) -> Option<CatchUp> {
        let through = applying.min(current);
        (through > recorded).then(|| CatchUp {
            through,
            held: Vec::new(),
            events: 0,
        })
    }

    /// Takes the responses `batch` received next.
    pub(crate) fn take(&mut self, batch: Vec<WatchResponse>) -> Step {
        let mut whole = false;
        for m in &batch {
            if m.compact_revision() > 0 {
                return Step::Compacted(m.compact_revision());
            }
            if m.canceled() {
                // Applied as it is: the watch fails on it, applying nothing.
                return Step::Apply(batch);
            }
            self.events += m.events().len();
            let last = m
                .events()
                .iter()
                .filter_map(|e| e.kv())
                .map(|kv| kv.mod_revision())
                .max();
            whole |= caught_up(last, self.through);
        }
        self.held.extend(batch);
        if whole {
            Step::Apply(std::mem::take(&mut self.held))
        } else if self.events > MAX_HELD {
            Step::TooMany
        } else {
            Step::Wait
        }
    }
}

/// Whether a response whose last event is at `last` brings every event up
/// to `through`: etcd sends the events of one revision in one response,
/// in revision order.
fn caught_up(last: Option<i64>, through: i64) -> bool {
    last.is_some_and(|rev| rev >= through)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events before the revision that was being applied do not finish a
    /// catch-up; one at or past it does. Nothing to catch up when the
    /// record is not behind, and never past etcd's revision.
    #[test]
    fn a_catch_up_is_whole_at_the_revision_that_was_being_applied() {
        let through = 2_000;
        // A first response of a split replay: revisions up to 1,100.
        assert!(!caught_up(Some(1_100), through));
        // A progress notification proves nothing.
        assert!(!caught_up(None, through));
        assert!(caught_up(Some(2_000), through));
        assert!(caught_up(Some(2_001), through));
        assert!(CatchUp::new(7, 7, 9).is_none());
        assert!(CatchUp::new(7, 0, 9).is_none());
        assert_eq!(CatchUp::new(7, 8, 9).map(|c| c.through), Some(8));
        assert_eq!(CatchUp::new(7, 12, 9).map(|c| c.through), Some(9));
        assert!(CatchUp::new(7, 12, 7).is_none());
    }
}
