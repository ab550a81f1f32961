//! The sim's vocabulary: the ids and keys it uses, the writes it records
//! ([`Op`], [`Action`]), what a peer knows of them ([`Know`]), what
//! operators accepted ([`Events`]), and the trees stores are made from.

use std::collections::{BTreeMap, BTreeSet};

use keycache::{KeyState, MinionId};

pub(crate) const CLUSTER_KEY: &str =
    "-----BEGIN PUBLIC KEY-----\nMIIBclusterA\n-----END PUBLIC KEY-----\n";
pub(crate) const FOREIGN_KEY: &str =
    "-----BEGIN PUBLIC KEY-----\nMIIBclusterB\n-----END PUBLIC KEY-----\n";

pub(crate) const IDS: [&str; 6] = ["m1", "m2", "web-1", "web-2", "db-1", ".dot"];

/// The logical clock's step: every action, snapshot and merge is one.
pub(crate) const TICK: u64 = 1_000;

/// A PEM public key: id and key version in its body.
pub(crate) fn pem(id: usize, ver: u32) -> Vec<u8> {
    format!("-----BEGIN PUBLIC KEY-----\nMIIBk{id}v{ver}AQAB\n-----END PUBLIC KEY-----\n")
        .into_bytes()
}

/// The value of an entry: a state (`None` in the denied bank) and a key.
pub(crate) type Value = (Option<KeyState>, Vec<u8>);

/// What a store holds: (bank 0 keys / 1 denied, id) -> value.
pub(crate) type Held = BTreeMap<(u8, usize), Value>;

pub(crate) fn mid(i: usize) -> MinionId {
    MinionId::new(IDS[i]).expect("id")
}

/// A value, short: its state and the key's body.
pub(crate) fn show(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some((s, k)) => {
            let k = String::from_utf8_lossy(k);
            format!("{s:?} {}", k.lines().nth(1).unwrap_or(""))
        }
    }
}

/// A write of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// A minion presents a key (pending).
    Pending,
    /// `salt-key -a`.
    Accept,
    /// `salt-key -r`.
    Reject,
    /// `salt-key -d`.
    Delete,
    /// A key denied (the master's, for a second key of an id).
    Deny,
}

impl Op {
    pub(crate) fn by_operator(self) -> bool {
        matches!(self, Op::Accept | Op::Reject | Op::Delete)
    }
}

/// One write that changed an entry (bank, id), and the bounds the design
/// puts on the stamp of the version it gets (see `Sim::check_kept`).
#[derive(Debug, Clone)]
pub(crate) struct Action {
    pub(crate) bank: u8,
    pub(crate) id: usize,
    pub(crate) op: Op,
    /// Where: a peer, or the tree the stores were migrated from.
    pub(crate) by: String,
    /// The sim's time of the write.
    pub(crate) at: u64,
    /// What it left in the entry.
    pub(crate) value: Option<Value>,
    /// No earlier than this.
    pub(crate) lo: u64,
    /// No later than this: known once the store that holds it unstamped
    /// observes it; `u64::MAX` when it was copied unstamped (each copy
    /// stamps it at its own next observation).
    pub(crate) hi: Option<u64>,
}

/// What the sim knows of a store directory's observations.
#[derive(Debug, Clone, Default)]
pub(crate) struct Observations {
    /// The time of the last observation saved (a snapshot, a merge, the
    /// history's beginning); 0: the store has no history.
    pub(crate) last: u64,
    /// The writes made since (indices into `Sim::acts`).
    pub(crate) unstamped: Vec<usize>,
}

/// What a peer knows: the revocations (its own, and those of the peers it
/// merged from as of their snapshots) and every write it made or merged.
/// A peer restored from a copy knows what the copy knew; a wiped or new
/// one nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Know {
    /// The last revocation of each id (deleted or rejected).
    pub(crate) revoked: BTreeMap<usize, u64>,
    /// (id, key) denied at these times.
    pub(crate) denied: BTreeMap<(usize, Vec<u8>), u64>,
    /// The writes (indices into `Sim::acts`).
    pub(crate) acts: BTreeSet<usize>,
}

impl Know {
    pub(crate) fn absorb(&mut self, o: &Know) {
        for (k, t) in &o.revoked {
            let e = self.revoked.entry(*k).or_default();
            *e = (*e).max(*t);
        }
        for (k, t) in &o.denied {
            let e = self.denied.entry(k.clone()).or_default();
            *e = (*e).max(*t);
        }
        self.acts.extend(o.acts.iter().copied());
    }
}

/// What operators accepted, with the global time.
#[derive(Default)]
pub(crate) struct Events {
    /// (id, key) accepted at these times.
    pub(crate) accepts: BTreeMap<(usize, Vec<u8>), Vec<u64>>,
}

impl Events {
    /// Whether an operator accepted `key` for `id` after the id's last
    /// revocation and the key's last denial that `know` holds.
    pub(crate) fn allows(&self, know: &Know, id: usize, key: &[u8]) -> bool {
        let floor = know
            .revoked
            .get(&id)
            .copied()
            .unwrap_or(0)
            .max(know.denied.get(&(id, key.to_vec())).copied().unwrap_or(0));
        self.accepts
            .get(&(id, key.to_vec()))
            .is_some_and(|ts| ts.iter().any(|&t| t > floor))
    }
}

/// How the first two peers start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setup {
    /// Empty stores.
    Plain,
    /// A store made, then copied file by file into another directory.
    Copied,
    /// One `localfs_key` tree migrated into two stores, the second later.
    MigratedTwice,
}

/// A `localfs_key` tree stores are made from.
#[derive(Debug, Clone)]
pub(crate) struct Tree {
    pub(crate) entries: Vec<TreeEntry>,
    /// Where its entries' writes begin in `Sim::acts`, once recorded: both
    /// stores migrated from it know the same ones.
    pub(crate) acts: Option<usize>,
}

/// An entry of a tree.
#[derive(Debug, Clone)]
pub(crate) struct TreeEntry {
    pub(crate) bank: u8,
    pub(crate) id: usize,
    pub(crate) value: Value,
    /// When its file was written (its ctime).
    pub(crate) at: u64,
}
