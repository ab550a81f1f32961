//! The two invariants asserted at every merge: no revoked key comes back
//! ([`Sim::check_merge`]), and no operator action is undone by a peer that
//! never saw a later one ([`Sim::check_kept`]).

use std::collections::BTreeMap;

use keycache::KeyState;

use crate::model::{show, Action, Held, Know, IDS, TICK};
use crate::sim::Sim;

impl Sim {
    /// Asserts that nothing accepted in `after` (peer `p`'s store) and not
    /// accepted with the same key in `before` lacks an operator's accept
    /// after the id's last revocation that `p` knows of.
    pub(crate) fn check_merge(&self, before: &Held, after: &Held, p: usize, what: &str) {
        for ((b, i), (s, k)) in after {
            if *b != 0 || *s != Some(KeyState::Accepted) {
                continue;
            }
            if before.get(&(0, *i)) == Some(&(Some(KeyState::Accepted), k.clone())) {
                continue;
            }
            assert!(
                self.events.allows(&self.know[p], *i, k),
                "{what}: a merge made {} accepted with a key no operator accepted after its last \
                 revocation",
                IDS[*i]
            );
        }
    }

    /// Asserts that no operator action is undone by a peer that never saw
    /// a later one: for each entry, when the latest write that `know`
    /// holds is an operator's and is later than every other write it
    /// holds, `held` holds what that write left.
    ///
    /// "Later" in the design's order: an accept is stamped at the last
    /// observation of its store before it (the earliest it can have
    /// happened), every other write at the next observation (the latest),
    /// a minion's first key at the first stamp there is, and a store's
    /// creation values as `begin_if_missing` says. So an accept and a
    /// revocation made on two peers between the same two observations may
    /// be ordered the safe way (the revocation wins) whatever their order
    /// in the sim: each write carries the bounds of its stamp (`lo`, `hi`),
    /// and the rule applies where the latest write's `lo` is past every
    /// other one's `hi`. A tick apart at least: a clock's stamps run ahead
    /// of the wall by a few nanoseconds within one tick. The timer's
    /// snapshot after an action (some of the time) narrows the bounds, as
    /// docs/install.md's timer does.
    pub(crate) fn check_kept(&self, held: &Held, know: &Know, what: &str) {
        let mut by: BTreeMap<(u8, usize), Vec<&Action>> = BTreeMap::new();
        for &a in &know.acts {
            let a = &self.acts[a];
            by.entry((a.bank, a.id)).or_default().push(a);
        }
        for (entry, writes) in by {
            let Some(last) = writes.iter().max_by_key(|a| a.at) else {
                continue;
            };
            if !last.op.by_operator() {
                continue;
            }
            let others = writes
                .iter()
                .filter(|a| !std::ptr::eq(**a, *last))
                .map(|a| a.hi.unwrap_or(u64::MAX))
                .max()
                .unwrap_or(0);
            if last.lo < others.saturating_add(TICK) {
                continue;
            }
            self.kept_checks.set(self.kept_checks.get() + 1);
            let got = held.get(&entry);
            assert!(
                got == last.value.as_ref(),
                "{what}: an operator action was undone by a peer that never saw a later one: \
                 {:?} of {} ({} bank) on {} at t={} left {}, the store holds {}",
                last.op,
                IDS[last.id],
                if last.bank == 0 { "keys" } else { "denied" },
                last.by,
                last.at,
                show(last.value.as_ref()),
                show(got)
            );
        }
    }
}
