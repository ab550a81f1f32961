//! Settling one conflict: the `restrictive` join, `newer`, `ours`,
//! `theirs`, the key-mismatch policies, and the raise of a settlement the
//! other peer already had.

use super::{KeyMismatch, MergeOptions, Policy};
use crate::key::KeyState;
use crate::snapshot::{Bank, Entry};

/// One step up the `restrictive` order (accepted, pending, rejected,
/// deleted): for a settled conflict whose result equals the base's value.
/// Only a key mismatch held out of accepted can come back as the base's
/// value (every other settlement is one side's value, and a conflict's
/// sides both differ from the base); the other peer would keep its own
/// value, seeing no change here, and the peers would never converge.
pub(super) fn raise(e: Option<Entry>) -> Option<Entry> {
    let e = e?;
    let state = match e.state? {
        KeyState::Accepted => KeyState::Pending,
        KeyState::Pending => KeyState::Rejected,
        KeyState::Rejected => return None,
    };
    Some(Entry {
        state: Some(state),
        ..e
    })
}

/// The rank of a state for `restrictive`: higher is more restrictive.
fn rank(s: Option<KeyState>) -> u8 {
    match s {
        Some(KeyState::Accepted) => 0,
        Some(KeyState::Pending) => 1,
        Some(KeyState::Rejected) => 2,
        None => 3,
    }
}

/// The `restrictive` join of two different present entries of one bank
/// and id with the same key: the more restrictive state (the greater key
/// between two denied keys), keeping the winning side's mtime.
fn restrictive(o: &Entry, t: &Entry) -> Entry {
    let ko = (rank(o.state), &o.pub_key);
    let kt = (rank(t.state), &t.pub_key);
    if ko >= kt {
        o.clone()
    } else {
        t.clone()
    }
}

/// Settles a conflict between `o` and `t` (different, at least one
/// present): the result, whether it was a key mismatch, and why.
pub(super) fn settle(
    o: Option<&Entry>,
    t: Option<&Entry>,
    opts: &MergeOptions,
) -> (Option<Entry>, bool, String) {
    let (o, t) = match (o, t) {
        (Some(o), Some(t)) => (o, t),
        _ => {
            let (res, why) = match opts.on_conflict {
                Policy::Ours => (o.cloned(), "ours"),
                Policy::Theirs => (t.cloned(), "theirs"),
                Policy::Restrictive | Policy::Newer => (None, "the deletion wins over a change"),
            };
            let what = if o.is_none() {
                "deleted on our side, changed on theirs"
            } else {
                "changed on our side, deleted on theirs"
            };
            return (
                res,
                false,
                format!("{what}: {}: {why}", opts.on_conflict.name()),
            );
        }
    };
    let newer = |tie: &dyn Fn() -> Entry| match o.mtime.cmp(&t.mtime) {
        std::cmp::Ordering::Greater => o.clone(),
        std::cmp::Ordering::Less => t.clone(),
        std::cmp::Ordering::Equal => tie(),
    };
    if o.bank == Bank::Keys && o.pub_key != t.pub_key {
        let held = |floor: KeyState| {
            let winner = if o.pub_key >= t.pub_key { o } else { t };
            let state = [o.state, t.state, Some(floor)]
                .into_iter()
                .max_by_key(|s| rank(*s))
                .flatten();
            Entry {
                state,
                mtime: o.mtime.max(t.mtime),
                ..winner.clone()
            }
        };
        let res = match opts.on_key_mismatch {
            KeyMismatch::Pending => held(KeyState::Pending),
            KeyMismatch::Reject => held(KeyState::Rejected),
            KeyMismatch::Newer => newer(&|| held(KeyState::Pending)),
            KeyMismatch::Ours => o.clone(),
            KeyMismatch::Theirs => t.clone(),
        };
        let why = format!(
            "key mismatch: ours {} with key {:016x}, theirs {} with key {:016x}; \
             --on-key-mismatch {}: {} with key {:016x}",
            o.state_name(),
            crate::format::hash(&o.pub_key),
            t.state_name(),
            crate::format::hash(&t.pub_key),
            opts.on_key_mismatch.name(),
            res.state_name(),
            crate::format::hash(&res.pub_key),
        );
        return (Some(res), true, why);
    }
    let res = match opts.on_conflict {
        Policy::Restrictive => restrictive(o, t),
        Policy::Newer => newer(&|| restrictive(o, t)),
        Policy::Ours => o.clone(),
        Policy::Theirs => t.clone(),
    };
    let why = if o.bank == Bank::Keys {
        format!(
            "ours {}, theirs {}: {}: {}",
            o.state_name(),
            t.state_name(),
            opts.on_conflict.name(),
            res.state_name()
        )
    } else {
        format!(
            "two denied keys (ours {:016x}, theirs {:016x}): {}: {:016x}",
            crate::format::hash(&o.pub_key),
            crate::format::hash(&t.pub_key),
            opts.on_conflict.name(),
            crate::format::hash(&res.pub_key)
        )
    };
    (Some(res), false, why)
}
