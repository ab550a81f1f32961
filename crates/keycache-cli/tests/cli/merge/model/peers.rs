//! The peers ([`Peers`]): their store directories, what the model says each
//! holds, every operation on an id and when the stores' stamps say it can
//! have happened, and the check that a merge undoes no operator's action a
//! peer never saw a later change of.

use std::collections::BTreeSet;
use std::path::PathBuf;

use keycache::Bank;

use crate::common;
use crate::common::pem;

use super::store::Model;

/// What an operation did to an id, for the end's check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Event {
    /// An operator (Salt's writer or `keycache accept`) accepted this key.
    Accept(String),
    /// An operator rejected or deleted the id.
    Revoke,
    /// Salt's writer put a pending key (a sign-in): a change, not an
    /// operator's action.
    Write,
}

/// When an event can have happened, as the stores' stamps tell (on the
/// counter of events and observations, [`Peers::clock`]), and what it left.
#[derive(Debug, Clone)]
pub(super) struct Times {
    serial: u64,
    /// The peer it was made on ([`TREE`]: the tree both were made from).
    peer: usize,
    id: String,
    /// The earliest stamp a store gives it: an accept's, the last
    /// observation before it or the store's making; else the event itself.
    lower: u64,
    /// The latest: an accept's, the event itself; else the next
    /// observation of its peer (0 for a pending key a store was made with).
    upper: u64,
    /// The `keys` value it left (None: no entry).
    result: Option<(&'static str, String)>,
    operator: bool,
}

/// The peer of the events of a `localfs_key` tree that stores are made from.
pub(super) const TREE: usize = usize::MAX;

pub(super) struct Peers {
    _tmp: tempfile::TempDir,
    pub(super) root: PathBuf,
    pub(super) dirs: Vec<PathBuf>,
    pub(super) models: Vec<Model>,
    /// Every operation on an id, in the order they ran (they run one at a
    /// time): (id, event).
    pub(super) events: Vec<(String, Event)>,
    /// Per peer, the ids its history has a version of (live or a
    /// tombstone): the ids of its snapshots, and of the snapshots merged
    /// into it.
    pub(super) known: Vec<BTreeSet<String>>,
    pub(super) keys_made: u64,
    pub(super) merges: usize,
    /// Merges that took an accepted key out of accepted (a revocation that
    /// won), and that replaced a key by another one.
    pub(super) revoked: usize,
    pub(super) rekeyed: usize,
    /// Beside `events`, when each happened.
    pub(super) times: Vec<Times>,
    /// Per peer, the serials of the events it knows of: its own, and those
    /// its peers knew of when it merged their snapshots.
    pub(super) knows: Vec<BTreeSet<u64>>,
    /// A counter of events and observations, in the order they run.
    pub(super) clock: u64,
    /// Per peer, the counter at its last observation, and at its making
    /// (0: never made; its history begins at its first observation).
    pub(super) last_obs: Vec<u64>,
    pub(super) made: Vec<u64>,
    /// Merges that changed an operator's value and were checked.
    pub(super) undo_checks: usize,
}

pub(super) const IDS: [&str; 10] = [
    "web-01", "web-02", "web-03", "db-01", "db-02", "cache-1", "cache-2", "mq-1", "mq-2", "edge",
];

impl Peers {
    pub(super) fn new(n: usize) -> Peers {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let dirs: Vec<PathBuf> = (0..n)
            .map(|i| {
                let d = root.join(format!("peer-{i}"));
                std::fs::create_dir(&d).expect("mkdir");
                // Masters of one cluster: one master key pair.
                std::fs::write(d.join("master.pub"), common::pem("the-cluster", 451))
                    .expect("master.pub");
                d
            })
            .collect();
        Peers {
            _tmp: tmp,
            root,
            dirs,
            models: vec![Model::new(); n],
            events: Vec::new(),
            known: vec![BTreeSet::new(); n],
            keys_made: 0,
            merges: 0,
            revoked: 0,
            rekeyed: 0,
            times: Vec::new(),
            knows: vec![BTreeSet::new(); n],
            clock: 0,
            last_obs: vec![0; n],
            made: vec![0; n],
            undo_checks: 0,
        }
    }

    /// Records an event on peer `p` (or [`TREE`]) and when it can have
    /// happened.
    pub(super) fn event(
        &mut self,
        p: usize,
        id: &str,
        ev: Event,
        result: Option<(&'static str, String)>,
    ) {
        self.clock += 1;
        let (lower, upper) = match ev {
            Event::Accept(_) if p != TREE => (self.last_obs[p].max(self.made[p]), self.clock),
            Event::Accept(_) => (0, self.clock),
            _ => (self.clock, u64::MAX),
        };
        let operator = ev != Event::Write;
        self.events.push((id.to_owned(), ev));
        self.times.push(Times {
            serial: self.clock,
            peer: p,
            id: id.to_owned(),
            lower,
            upper,
            result,
            operator,
        });
        if p == TREE {
            for k in &mut self.knows {
                k.insert(self.clock);
            }
        } else {
            self.knows[p].insert(self.clock);
        }
    }

    /// Peer `p` observed its store (a snapshot or a merge).
    pub(super) fn observed(&mut self, p: usize) {
        self.clock += 1;
        self.last_obs[p] = self.clock;
        for t in &mut self.times {
            if t.peer == p && t.upper == u64::MAX {
                t.upper = self.clock;
            }
        }
    }

    /// Peer `p`'s store was made (its history began): the values it holds
    /// are as old as can be, but revocations (stamped at the making).
    pub(super) fn made_now(&mut self, p: usize) {
        self.clock += 1;
        self.made[p] = self.clock;
        self.last_obs[p] = self.clock;
        for t in &mut self.times {
            if (t.peer == p || t.peer == TREE) && t.upper == u64::MAX {
                t.upper = if t.operator { self.clock } else { 0 };
            }
        }
    }

    /// The invariant beside "no revoked key comes back": a merge of peer
    /// `j` into peer `i` that changes the `keys` value an operator's action
    /// left on `i` (the last event of the id `i` knows of) does so only
    /// when `j` knew of an event of the id that may have come after it.
    pub(super) fn check_not_undone(&mut self, i: usize, j: usize, want: &Model) {
        let ids: BTreeSet<String> = self.models[i]
            .keys()
            .chain(want.keys())
            .filter(|k| k.0 == Bank::Keys)
            .map(|k| k.1.clone())
            .collect();
        for id in ids {
            let k = (Bank::Keys, id.clone());
            let before = self.models[i].get(&k).cloned();
            if before == want.get(&k).cloned() {
                continue;
            }
            let last = self
                .times
                .iter()
                .filter(|t| t.id == id && self.knows[i].contains(&t.serial))
                .max_by_key(|t| t.serial);
            let Some(a) = last else { continue };
            if !a.operator || a.result != before {
                continue;
            }
            let excused = self.times.iter().any(|e| {
                e.id == id
                    && e.serial != a.serial
                    && self.knows[j].contains(&e.serial)
                    && e.upper > a.lower
            });
            assert!(
                excused,
                "peer {i} merging peer {j}: {id}'s {:?} (an operator's action, {a:?}) undone by a \
                 peer that never saw a later change of {id}; now {:?}",
                before.map(|v| v.0),
                want.get(&k).map(|v| v.0)
            );
            self.undo_checks += 1;
        }
    }

    pub(super) fn fresh_key(&mut self, id: &str) -> String {
        self.keys_made += 1;
        pem(
            &format!("{id}-{}", self.keys_made),
            120 + (self.keys_made % 7) as usize * 30,
        )
    }
}
