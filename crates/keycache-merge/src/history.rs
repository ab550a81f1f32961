//! What happened to each entry of a store, and when: the versions and
//! tombstones that let merges order changes ([`crate::merge`]), and the
//! store's identity in its cluster.
//!
//! Salt's files hold only the present value of an entry. To merge two
//! peers without undoing a revocation, keycache keeps beside the banks, per
//! (bank, id), the **version** the store holds: a stamp of a hybrid logical
//! clock ([`crate::hlc`]), the kind of value (accepted, pending, rejected,
//! denied, or absent: a **tombstone**) and a hash of the value. Two
//! versions of one entry are ordered by stamp, then by how restrictive the
//! kind is (absent over denied over rejected over pending over accepted),
//! then by hash: a total order, so every peer that has seen the same
//! versions keeps the same one, whatever the order of the merges
//! (last-writer-wins registers, as Cassandra's and Riak's anti-entropy).
//!
//! # Changes are found, not announced
//!
//! Salt's own writers (`mmap_key`, the `keycache` driver, `salt-key`) do not
//! know about versions. Every snapshot and merge first **observes** the
//! store ([`History::observe`]): an entry whose value differs from the one
//! its version recorded was changed here since the last observation, and
//! gets a new version. A change is known to have happened between the last
//! observation (`scanned`) and now, and is stamped on the safe side of
//! that interval:
//!
//! - a value that lets a key in (accepted) takes the **earliest** stamp it
//!   can have, the last observation's;
//! - every other change (a deletion, a rejection, a pending or denied key)
//!   takes the **latest**, now;
//! - but a pending key of an id the store knew nothing of (a minion's first
//!   sign-in here) revokes nothing: it takes the first stamp there is
//!   ([`FRESH_PENDING`]), so an accept made on another master wins over it.
//!
//! So an accept never outranks a revocation that happened after it, even
//! when the accept was noticed later; at worst, an accept made on one
//! master while another revoked the key is undone, and an operator accepts
//! again.
//!
//! # When the history begins
//!
//! When the store is made ([`begin_if_missing`]: a migration, the Salt
//! driver's write that creates the banks, a compaction of a store without
//! one), else at the first snapshot or merge. The values a store is made
//! with are as old as can be (accepted and pending at [`FRESH_PENDING`]);
//! its revocations are stamped no earlier than they may have happened. So
//! two stores made from the same contents (a copy, a tree migrated twice)
//! keep every change an operator makes on either after that.
//!
//! # Copies
//!
//! The identity is bound to the store directory (`st_dev`, `st_ino`): read
//! in another directory (a `cp -a`, a restore), it is a copy's, which takes
//! a new store id and keeps the rest ([`History::load`]).
//!
//! # Files
//!
//! `.keycache-history` holds the versions (rewritten when a version
//! changes); `.keycache-identity` the identity, the clock, the last
//! observation and what was last merged from each peer (rewritten by every
//! snapshot and merge). Both are replaced atomically (a temporary file,
//! fsynced, renamed) under both banks' locks, mode 0600; neither holds key
//! material. Their bytes are drawn in `docs/format.md` ("History files").
//!
//! A merge writes the history **before** the banks, with each changed
//! entry's previous version kept beside the new one: an observation that
//! finds the previous value (the merge died before its bank writes) goes
//! back to the previous version instead of reading a local change.
//!
//! # Tombstones and the horizon
//!
//! A tombstone is kept for [`HistoryOptions::horizon`] (30 days by
//! default), then forgotten. A merge treats an accepted entry older than
//! the horizon that it has no version of, on a store that was in the
//! cluster when that entry was stamped, as one whose tombstone may have
//! been forgotten: it takes it pending, not accepted ([`crate::merge`]).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::hlc::{Hlc, WallClock};
use keycache::key::Bank;
use keycache::key::{decode_key_value, KeyState};
use keycache::store::Store;

mod file;
mod observe;
mod versions;

use observe::Stamping;
use versions::Versions;

/// The kind of value a version records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Accepted (`keys`).
    Accepted,
    /// Pending (`keys`).
    Pending,
    /// Rejected (`keys`).
    Rejected,
    /// A denied key (`denied_keys`).
    Denied,
    /// No value: a tombstone.
    Absent,
}

impl Kind {
    /// The kind of a `keys` state.
    pub fn of_state(s: KeyState) -> Kind {
        match s {
            KeyState::Accepted => Kind::Accepted,
            KeyState::Pending => Kind::Pending,
            KeyState::Rejected => Kind::Rejected,
        }
    }

    /// The `keys` state of this kind, if it is one.
    pub fn state(self) -> Option<KeyState> {
        match self {
            Kind::Accepted => Some(KeyState::Accepted),
            Kind::Pending => Some(KeyState::Pending),
            Kind::Rejected => Some(KeyState::Rejected),
            Kind::Denied | Kind::Absent => None,
        }
    }

    /// How restrictive: ties between equal stamps go to the greater.
    pub fn rank(self) -> u8 {
        match self {
            Kind::Accepted => 0,
            Kind::Pending => 1,
            Kind::Rejected => 2,
            Kind::Denied => 3,
            Kind::Absent => 4,
        }
    }

    /// The kind's name: `accepted`, `pending`, `rejected`, `denied`, `absent`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Accepted => "accepted",
            Kind::Pending => "pending",
            Kind::Rejected => "rejected",
            Kind::Denied => "denied",
            Kind::Absent => "absent",
        }
    }

    pub(crate) fn byte(self) -> u8 {
        match self {
            Kind::Absent => 0,
            Kind::Accepted => 1,
            Kind::Pending => 2,
            Kind::Rejected => 3,
            Kind::Denied => 4,
        }
    }

    pub(crate) fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            0 => Kind::Absent,
            1 => Kind::Accepted,
            2 => Kind::Pending,
            3 => Kind::Rejected,
            4 => Kind::Denied,
            _ => return None,
        })
    }
}

/// One version of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    /// When: a hybrid logical clock stamp (unix nanoseconds).
    pub stamp: u64,
    /// What kind of value.
    pub kind: Kind,
    /// [`value_hash`] of the value; 0 for a tombstone.
    pub hash: u64,
}

impl Version {
    /// A tombstone stamped `stamp`.
    pub fn absent(stamp: u64) -> Version {
        Version {
            stamp,
            kind: Kind::Absent,
            hash: 0,
        }
    }

    /// The order of versions: the later stamp, then the more restrictive
    /// kind, then the greater hash. Total: two peers holding the same two
    /// versions keep the same one.
    pub fn key(&self) -> (u64, u8, u64) {
        (self.stamp, self.kind.rank(), self.hash)
    }

    /// Whether `self` wins over `other`.
    pub fn beats(&self, other: &Version) -> bool {
        self.key() > other.key()
    }
}

/// The hash a version records of a value: xxh3 of the public key (a
/// denied key without Salt's trailing NULs) seeded with the kind byte,
/// never 0.
pub fn value_hash(kind: Kind, public_key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(public_key, u64::from(kind.byte())).max(1)
}

/// What the history holds of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// The version of the value the store holds.
    pub cur: Version,
    /// A merge in flight: the version the entry had before it, kept until
    /// an observation finds which one the store holds.
    pub prev: Option<Version>,
    /// The observation that last saw the entry (not stored).
    pub mark: u32,
}

impl Record {
    fn unseen() -> Record {
        Record {
            cur: Version::absent(0),
            prev: None,
            mark: 0,
        }
    }
}

/// A 16-byte random identifier (a cluster's or a store's).
pub type Ident = [u8; 16];

/// What a store last merged from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The generation (the peer's clock when it took the snapshot) of the
    /// last snapshot merged from it.
    pub generation: u64,
    /// Our clock when we merged it.
    pub merged_at: u64,
}

/// A store's identity, clock and peers (`.keycache-identity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The store itself: made once, when its history begins.
    pub store: Ident,
    /// When its history began (a clock stamp).
    pub created: u64,
    /// The clock.
    pub clock: Hlc,
    /// The stamp of the last observation: the earliest a change found by
    /// the next one can have happened.
    pub scanned: u64,
    /// What was last merged from each peer, by store.
    pub peers: BTreeMap<Ident, Peer>,
    /// The store directory the identity belongs to: its (birth time in
    /// ns, or `st_dev` where the filesystem records no birth time,
    /// `st_ino`) when the identity was last saved; `None` in a file of an
    /// older keycache (bound by the next save). A copy of the store (`cp
    /// -a`, tar, rsync, a restore) lies in another directory inode, so it
    /// is told apart from its original (see [`History::load`]).
    pub binding: Option<(u64, u64)>,
}

/// How long tombstones are kept, and the wall clock.
#[derive(Debug, Clone)]
pub struct HistoryOptions {
    /// How long a tombstone is kept. Default 30 days.
    pub horizon: Duration,
    /// Where time comes from.
    pub wall: WallClock,
}

impl Default for HistoryOptions {
    fn default() -> HistoryOptions {
        HistoryOptions {
            horizon: Duration::from_secs(30 * 86_400),
            wall: WallClock::default(),
        }
    }
}

/// The versions of a store's entries, and its identity.
#[derive(Debug, Clone)]
pub struct History {
    /// The identity, clock and peers.
    pub identity: Identity,
    pub(crate) entries: Versions,
    /// The versions changed since loading (the history file is rewritten).
    pub(crate) dirty: bool,
    /// Whether the files existed when loaded.
    pub(crate) existed: bool,
    /// The file's sequence number: bumped by every save of the versions.
    pub(crate) seq: u64,
    /// How much of the removal log ([`keycache::removals`]) the last
    /// observation consumed: dropped from the log by the next save.
    removals_read: u64,
    mark: u32,
    /// When the versions were last saved (Unix ns, wall clock; 0 unknown):
    /// a value written since cannot be a merge in flight's old value left
    /// in the banks (see `observe`).
    pub(crate) saved_at: u64,
}

/// A value written this long after the versions were saved was written
/// after that save (file times are coarser than a slot's mtime).
const WRITTEN_SINCE_MARGIN_NS: u64 = 100_000_000;

/// What an observation found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Entries that changed since the last observation (tombstones included).
    pub changed: usize,
    /// Entries the store holds.
    pub live: usize,
    /// The entries a merge had in flight (written to the history, maybe
    /// not to the banks or the key tree), settled by this observation.
    pub settled: Vec<(Bank, String)>,
}

/// The stamp of a pending key found where the store knew nothing of its
/// id (a minion's first sign-in to this master): the first there is, so it
/// never wins over an accept, a rejection or a deletion of the id made on
/// another master. A minion that signs in to several masters is pending on
/// each; the operator's accept on one of them is then taken by the others
/// at the next merges, whatever the order of the observations.
pub const FRESH_PENDING: u64 = 1;

/// The oldest stamp a tombstone may have and still be kept.
pub fn horizon_cutoff(opts: &HistoryOptions) -> u64 {
    opts.wall
        .now()
        .saturating_sub(opts.horizon.as_nanos().min(u64::MAX as u128) as u64)
}

/// The (`st_dev`, `st_ino`) of the store directory `dir`: what binds an
/// identity to its store.
fn binding_of(dir: &Path) -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).map_err(|e| Error::io(dir, "stat", e))?;
    // The directory's birth time (statx) rather than its device number
    // where the filesystem records one: a device number can change across
    // reboots (device-mapper minors, network filesystems), a birth time
    // only with a new directory.
    let born = m
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as u64)
        .filter(|&ns| ns > 0);
    Ok((born.unwrap_or(m.dev()), m.ino()))
}

/// How long [`begin_if_missing`] waits for each bank's lock.
const BEGIN_LOCK_WAIT: Duration = Duration::from_secs(10);

/// When the caller knows it, the time (unix ns) a rejected or denied entry
/// found at a store's creation was written (its file's ctime, say).
pub type Since<'a> = &'a dyn Fn(Bank, &str) -> Option<u64>;

/// Begins the history of `store` where it has none: the store is being
/// made (`keycache migrate`, the Salt driver's first write, a
/// compaction of a store without one). Returns whether it began one.
///
/// The **creation observation** stamps every entry found as a value the
/// store was made with: accepted and pending at the first stamp there is
/// ([`FRESH_PENDING`]): they are as old as can be, so any change an
/// operator makes afterwards, on any master, wins over them; rejected and
/// denied at `since` of the entry (clamped to now) or else at the creation
/// time: a revocation present at creation is never stamped earlier than it
/// may have happened. The last observation is then the creation, so every
/// accept made later (stamped at the earliest at the last observation)
/// beats a peer's creation-time pending value of the same id. Two stores
/// made from the same contents (a tree migrated twice) hold the same
/// creation values: ties go to the more restrictive kind as always.
///
/// Takes both banks' locks (`keys` first, as a snapshot does); cheap (one
/// stat) when the store has a history.
pub fn begin_if_missing(
    store: &Store,
    opts: &HistoryOptions,
    since: Option<Since<'_>>,
) -> Result<bool> {
    let dir = store.dir();
    let ident = dir.join(keycache::format::IDENTITY_FILE);
    let missing = || match std::fs::symlink_metadata(&ident) {
        Ok(_) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io(&ident, "stat", e)),
    };
    if !missing()? {
        return Ok(false);
    }
    let (k, d) = (store.keys_table(), store.denied_table());
    k.read_locked(BEGIN_LOCK_WAIT, || {
        d.read_locked(BEGIN_LOCK_WAIT, || {
            // Another process may have begun it while we waited.
            if !missing()? {
                return Ok(false);
            }
            let mut h = History::begin(dir, opts)?;
            h.observe_as(
                store,
                opts,
                false,
                Stamping::Creation(since),
                |_, _, _, _, _| Ok(()),
            )?;
            h.save(dir, opts)?;
            Ok(true)
        })
    })
}

/// The hook a migration calls once it made the store
/// ([`keycache::migrate::MigrateOptions::made`]): the store's history
/// begins, a revocation stamped no earlier than its tree file's ctime
/// ([`tree_ctime`]).
pub fn begin_on_migration() -> keycache::migrate::Made {
    std::sync::Arc::new(|store: &Store, pki_dir: &Path| {
        let since = |bank, id: &str| tree_ctime(pki_dir, bank, id);
        begin_if_missing(store, &HistoryOptions::default(), Some(&since))?;
        Ok(())
    })
}

/// The ctime (unix ns) of the `localfs_key` tree file under `pki_dir` of a
/// rejected key (`minions_rejected/<id>`) or a denied one
/// (`minions_denied/<id>`): the latest the revocation can have been
/// written, a `since` for [`begin_if_missing`] after a migration.
pub fn tree_ctime(pki_dir: &Path, bank: Bank, id: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let sub = match bank {
        Bank::Keys => keycache::tree::TreeDir::MinionsRejected,
        Bank::Denied => keycache::tree::TreeDir::MinionsDenied,
    }
    .name();
    let m = std::fs::symlink_metadata(pki_dir.join(sub).join(id)).ok()?;
    let s = u64::try_from(m.ctime()).ok()?;
    let ns = u64::try_from(m.ctime_nsec()).ok()?;
    s.checked_mul(1_000_000_000)?.checked_add(ns)
}

impl History {
    /// Loads the history of the store in `dir`, or begins one (a new
    /// identity) when it has none. A history whose banks are gone (the
    /// store was wiped: no `keys` index while versions are recorded) is
    /// begun anew too: a wiped store is a new store, never a deletion of
    /// every key.
    ///
    /// An identity bound to another directory than `dir` belongs to the
    /// store this one was copied from: the copy gets a new store id (kept
    /// from the next save on), so that peers tell the two apart, and keeps
    /// the versions, the clock and the peers (its values came from the
    /// original at those stamps).
    pub fn load(dir: &Path, opts: &HistoryOptions) -> Result<History> {
        let wiped = !dir.join(keycache::format::KEYS_INDEX).exists()
            && !dir.join(keycache::format::DENIED_INDEX).exists();
        match file::load(dir)? {
            Some(mut h)
                if !(wiped && h.entries.iter().any(|(_, _, r)| r.cur.kind != Kind::Absent)) =>
            {
                h.existed = true;
                let here = binding_of(dir)?;
                if h.identity.binding.is_some_and(|b| b != here) {
                    h.identity.store = random_ident();
                }
                h.identity.binding = Some(here);
                let max = h
                    .entries
                    .iter()
                    .map(|(_, _, r)| r.cur.stamp)
                    .max()
                    .unwrap_or(0);
                h.identity.clock.receive(max);
                // A file of before the versions were kept in order: sorted
                // once, and written sorted by the next save.
                if !h.entries.is_sorted() {
                    h.entries.sort();
                    h.dirty = true;
                }
                Ok(h)
            }
            _ => History::begin(dir, opts),
        }
    }

    fn begin(dir: &Path, opts: &HistoryOptions) -> Result<History> {
        let mut clock = Hlc::default();
        let created = clock.tick(&opts.wall);
        Ok(History {
            identity: Identity {
                store: random_ident(),
                created,
                clock,
                scanned: 0,
                peers: BTreeMap::new(),
                binding: Some(binding_of(dir)?),
            },
            entries: Versions::default(),
            dirty: true,
            existed: false,
            seq: 0,
            removals_read: 0,
            mark: 0,
            saved_at: 0,
        })
    }

    /// Writes the history files of `dir` atomically: the versions when they
    /// changed (tombstones past the horizon dropped), then the identity.
    /// Call it holding both banks' locks.
    pub fn save(&mut self, dir: &Path, opts: &HistoryOptions) -> Result<()> {
        let own = keycache::files::Ownership::for_dir(dir)?;
        // Removals read are recorded by a new versions file (see `mark`).
        self.dirty |= self.removals_read > 0;
        if self.dirty {
            let cutoff = horizon_cutoff(opts);
            self.entries.retain(|r| {
                r.cur.kind != Kind::Absent || r.cur.stamp >= cutoff || r.prev.is_some()
            });
            // In (bank, id) order: a snapshot's, which merges walk beside it.
            self.entries.sort();
            self.seq += 1;
            if self.removals_read > 0 {
                keycache::removals::mark(dir, self.seq, self.removals_read)?;
            }
            file::save_versions(dir, self, &own)?;
            self.saved_at = keycache::files::now_ns();
            self.dirty = false;
        }
        file::save_identity(dir, self, &own)?;
        // The removals read are in the versions now (a crash before this
        // reads them again: the same tombstones, see `observe`).
        Ok(keycache::removals::trim(
            dir,
            std::mem::take(&mut self.removals_read),
        )?)
    }

    /// The sequence number the versions file has on disk now (0 when it
    /// has none): a writer holding both banks' locks compares it with
    /// the sequence number it loaded to learn whether another process saved
    /// since.
    pub fn seq_on_disk(dir: &Path) -> Result<u64> {
        file::seq_on_disk(dir)
    }

    /// The version of (`bank`, `id`), if any (tombstones included).
    pub fn get(&self, bank: Bank, id: &str) -> Option<Version> {
        self.entries.get(bank, id).map(|r| r.cur)
    }

    /// The version of (`bank`, `id`) and, while a merge has it in flight,
    /// the version it had before.
    pub fn get_with_prev(&self, bank: Bank, id: &str) -> Option<(Version, Option<Version>)> {
        self.entries.get(bank, id).map(|r| (r.cur, r.prev))
    }

    /// [`History::get_with_prev`] for lookups made in (bank, id) order, as
    /// a snapshot's entries come: `cursor` (0 at first) keeps the place,
    /// so a walk over a sorted snapshot hashes nothing.
    pub(crate) fn get_with_prev_from(
        &self,
        cursor: &mut usize,
        bank: Bank,
        id: &str,
    ) -> Option<(Version, Option<Version>)> {
        self.entries
            .find_from(cursor, bank, id)
            .map(|r| (r.cur, r.prev))
    }

    /// Settles what a merge had in flight once its bank writes are done:
    /// the previous versions are forgotten (saved by the next
    /// [`History::save`]).
    pub(crate) fn settle(&mut self) {
        for (_, _, r) in self.entries.iter_mut() {
            if r.prev.take().is_some() {
                self.dirty = true;
            }
        }
    }

    /// Every entry's version, tombstones included, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (Bank, &str, Version)> + '_ {
        self.entries.iter().map(|(b, id, r)| (b, id, r.cur))
    }

    /// How many entries (tombstones included) the history holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the history holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }

    /// Records `v` as the version of (`bank`, `id`) that a merge is about
    /// to write, keeping the current one as the previous (see the module's
    /// documentation).
    pub(crate) fn set_in_flight(&mut self, bank: Bank, id: &str, v: Version) {
        let e = self.entries.entry(bank, id);
        let old = e.cur;
        e.cur = v;
        e.prev = Some(old);
        self.dirty = true;
    }

    /// Records `v` as the version of (`bank`, `id`) without a change of the
    /// store (a tombstone of an entry it does not hold, a later stamp of the
    /// value it holds).
    pub(crate) fn record(&mut self, bank: Bank, id: &str, v: Version) {
        self.entries.entry(bank, id).cur = v;
        self.dirty = true;
    }
}

/// The names of the public keys that name a store's cluster, in the order
/// they are looked for: a Salt 3008 cluster's shared key, then the master's
/// own (the masters of a classic multi-master setup share one key pair).
pub const CLUSTER_KEYS: [&str; 2] = ["cluster.pub", "master.pub"];

/// The cluster of `store`: the xxh3-128 of the first public key of
/// [`CLUSTER_KEYS`] found in the store's directory (a regular file, never
/// through a symlink) or in its `master_keys` bank, whitespace trimmed; or
/// `None` when there is none (merges then cannot tell clusters apart).
pub fn cluster_of(store: &Store) -> Result<Option<Ident>> {
    let dir = store.dir();
    let bank_opts = keycache::table::OpenOptions {
        params: *store.keys_table().params(),
        ..keycache::table::OpenOptions::default()
    };
    let bank = if dir.join(keycache::format::MASTER_INDEX).exists() {
        Some(keycache::table::Table::open(
            dir.join(keycache::format::MASTER_INDEX),
            &bank_opts,
        )?)
    } else {
        None
    };
    for name in CLUSTER_KEYS {
        let path = dir.join(name);
        let from_file = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() && m.len() <= crate::snapshot::MAX_KEY_BYTES as u64 => {
                Some(std::fs::read(&path).map_err(|e| Error::io(&path, "read", e))?)
            }
            _ => None,
        };
        let key = match from_file {
            Some(k) => Some(k),
            None => match &bank {
                Some(t) => t.get(name.as_bytes())?.map(|s| s.value),
                None => None,
            },
        };
        if let Some(k) = key {
            let t = k.trim_ascii();
            if !t.is_empty() && !keycache::pem::holds_private_key(t) {
                return Ok(Some(xxhash_rust::xxh3::xxh3_128(t).to_le_bytes()));
            }
        }
    }
    Ok(None)
}

/// 16 random bytes from the kernel.
fn random_ident() -> Ident {
    use std::io::Read;
    let mut b = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok();
    if !ok {
        // No /dev/urandom: time, process id and a counter's hash; unique
        // enough to tell stores apart.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = keycache::files::now_ns();
        let seed = [
            t.to_le_bytes(),
            u64::from(std::process::id()).to_le_bytes(),
            n.to_le_bytes(),
        ]
        .concat();
        b[..8].copy_from_slice(&keycache::format::hash(&seed).to_le_bytes());
        let h = keycache::format::hash(&b[..8]);
        b[8..].copy_from_slice(&h.to_le_bytes());
    }
    b
}

/// An identifier as hex.
pub fn show_ident(i: &Ident) -> String {
    i.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
