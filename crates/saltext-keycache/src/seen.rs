//! [`Seen`]: in etcd mode, what this process's last `fetch` of each id
//! returned, so that the `store` that follows it is guarded by what its
//! caller decided on.
//!
//! Salt changes a key by reading it, deciding, and storing: a sign-in
//! fetches `keys` and stores a pending key when the id is absent;
//! `salt-key -a` fetches, checks the state is pending, and stores it
//! accepted. The driver's interface carries nothing from the fetch to the
//! store, so a store guarded by what the local replica holds when it is
//! called lets a change the replica applied in between through unseen: a
//! sign-in overwrites another master's pending key of the same id, and an
//! accept of a rejected key (`include_rejected`) that another master
//! deleted meanwhile puts the deleted key back, accepted. So a store is
//! guarded by the value its caller's fetch returned when there is one
//! (this process fetched the id in the last [`SEEN_FOR`] and wrote it
//! since through nothing else), and by the replica's value otherwise. A
//! store whose fetch is out of date is refused ("changed elsewhere") and
//! changes nothing; the caller's next fetch shows the change.
//!
//! Removals (`flush`) stay guarded by the replica's value: a removal
//! refused for an old fetch would keep a key its operator meant to revoke.
//! A fetch and its store may run on different threads (Salt's auth runs
//! both in an executor), so the memory is the process's, per id: where two
//! callers fetch one id at once, the store is guarded by the later fetch,
//! as before by the replica's value. A forked child starts with none.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keycache::Bank;
use keycache_etcd::Value;

use crate::fork_generation;

/// How long a fetch guards the store that follows it: Salt's fetch and
/// store are milliseconds apart, a confirmation prompt's seconds; a store
/// longer after its id's last fetch was decided on something else.
pub(crate) const SEEN_FOR: Duration = Duration::from_secs(120);

/// How many ids' fetches are kept at most (a listing's worth of fetches,
/// `salt-key -F`, must not grow the memory without bound).
const KEEP: usize = 4096;

/// What a fetch returned, and when.
struct Fetched {
    value: Option<Value>,
    at: Instant,
    generation: u64,
}

/// The memory of a driver's fetches in etcd mode (see the module's header).
#[derive(Default)]
pub(crate) struct Seen(Mutex<HashMap<(Bank, Vec<u8>), Fetched>>);

impl Seen {
    /// Remembers that a fetch of `name` in `bank` returned `value` (`None`:
    /// absent, or a value etcd could not hold).
    pub(crate) fn fetched(&self, bank: Bank, name: &[u8], value: Option<Value>) {
        let generation = fork_generation();
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= KEEP {
            m.retain(|_, f| f.generation == generation && f.at.elapsed() < SEEN_FOR);
            if m.len() >= KEEP {
                m.clear();
            }
        }
        let f = Fetched {
            value,
            at: Instant::now(),
            generation,
        };
        m.insert((bank, name.to_vec()), f);
    }

    /// What the last fetch of `name` in `bank` returned, if it was in this
    /// process within [`SEEN_FOR`]; forgotten either way (a write of the
    /// id makes it out of date).
    pub(crate) fn take(&self, bank: Bank, name: &[u8]) -> Option<Option<Value>> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let f = m.remove(&(bank, name.to_vec()))?;
        (f.generation == fork_generation() && f.at.elapsed() < SEEN_FOR).then_some(f.value)
    }
}
