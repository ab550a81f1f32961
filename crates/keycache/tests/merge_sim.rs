//! Simulation of 2 to 4 peers of a cluster exchanging snapshots by the
//! README's timer recipe (`snapshot` piped into `merge --base F
//! --write-base F`, in process), with operator actions (accept, reject,
//! delete, deny, re-key, new minions) made on the banks directly, as Salt's
//! own writers make them (the history finds them), and the events that
//! used to undo revocations: new peers, peers restored from older copies of
//! their store directory, wiped peers, lost and unreadable bases, replayed
//! older snapshots, another cluster's snapshots and a peer's own.
//!
//! Two peers may also start as one store twice, the way that used to undo
//! the accepts made before their first merge: a store made (its history
//! begun by `begin_if_missing`, as the Salt driver's first write does) and
//! copied file by file into another directory (`cp -a`), or one
//! `localfs_key` tree migrated into two stores, the second later. Operators
//! accept, reject and delete keys on both before the first merge between
//! them. A new peer may also be a copy of a running one.
//!
//! Asserted at every merge:
//!
//! - no revoked key comes back: a merge never makes an id accepted with a
//!   key unless an operator accepted that key after the id's last
//!   revocation (deletion or rejection of the id, or the key denied) that
//!   the receiving peer knows of; refused merges write nothing;
//! - no operator action is undone by a peer that never saw a later one:
//!   each peer knows the writes it made and those it merged (as of the
//!   snapshots); when the latest write of an entry that the receiving peer
//!   knows of after the merge is an operator's accept, rejection or
//!   deletion, and it is later than every other write of the entry known,
//!   the peer holds what that action left. "Later" is the design's order,
//!   not only the sim's (see `Sim::check_kept`).
//!
//! After the events stop, rounds of merges between all pairs make every
//! peer equal, and what they hold passes both rules.
//!
//! One global logical clock drives every peer (each action and merge a
//! tick), so "after" is exact. `KEYCACHE_MERGE_SIMS` sets the number of
//! runs (1500 by default); `KEYCACHE_MERGE_SEED` the first seed.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use keycache::history::HistoryOptions;
use keycache::hlc::WallClock;
use keycache::merge::{self, Base, BaseFile, MergeOptions};
use keycache::snapshot::{self, Bank, SnapshotOptions};
use keycache::{Error, KeyState, MinionId, OpenOptions, Params, Store};
use keycache_testkit::common::Rng;

const CLUSTER_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMIIBclusterA\n-----END PUBLIC KEY-----\n";
const FOREIGN_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMIIBclusterB\n-----END PUBLIC KEY-----\n";

const IDS: [&str; 6] = ["m1", "m2", "web-1", "web-2", "db-1", ".dot"];

/// The logical clock's step: every action, snapshot and merge is one.
const TICK: u64 = 1_000;

/// A PEM public key: id and key version in its body.
fn pem(id: usize, ver: u32) -> Vec<u8> {
    format!("-----BEGIN PUBLIC KEY-----\nMIIBk{id}v{ver}AQAB\n-----END PUBLIC KEY-----\n")
        .into_bytes()
}

/// The value of an entry: a state (`None` in the denied bank) and a key.
type Value = (Option<KeyState>, Vec<u8>);

/// What a store holds: (bank 0 keys / 1 denied, id) -> value.
type Held = BTreeMap<(u8, usize), Value>;

fn mid(i: usize) -> MinionId {
    MinionId::new(IDS[i]).expect("id")
}

/// A value, short: its state and the key's body.
fn show(v: Option<&Value>) -> String {
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
enum Op {
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
    fn by_operator(self) -> bool {
        matches!(self, Op::Accept | Op::Reject | Op::Delete)
    }
}

/// One write that changed an entry (bank, id), and the bounds the design
/// puts on the stamp of the version it gets (see `Sim::check_kept`).
#[derive(Debug, Clone)]
struct Action {
    bank: u8,
    id: usize,
    op: Op,
    /// Where: a peer, or the tree the stores were migrated from.
    by: String,
    /// The sim's time of the write.
    at: u64,
    /// What it left in the entry.
    value: Option<Value>,
    /// No earlier than this.
    lo: u64,
    /// No later than this: known once the store that holds it unstamped
    /// observes it; `u64::MAX` when it was copied unstamped (each copy
    /// stamps it at its own next observation).
    hi: Option<u64>,
}

/// What the sim knows of a store directory's observations.
#[derive(Debug, Clone, Default)]
struct Observations {
    /// The time of the last observation saved (a snapshot, a merge, the
    /// history's beginning); 0: the store has no history.
    last: u64,
    /// The writes made since (indices into `Sim::acts`).
    unstamped: Vec<usize>,
}

/// What a peer knows: the revocations (its own, and those of the peers it
/// merged from as of their snapshots) and every write it made or merged.
/// A peer restored from a copy knows what the copy knew; a wiped or new
/// one nothing.
#[derive(Debug, Clone, Default)]
struct Know {
    /// The last revocation of each id (deleted or rejected).
    revoked: BTreeMap<usize, u64>,
    /// (id, key) denied at these times.
    denied: BTreeMap<(usize, Vec<u8>), u64>,
    /// The writes (indices into `Sim::acts`).
    acts: BTreeSet<usize>,
}

impl Know {
    fn absorb(&mut self, o: &Know) {
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
struct Events {
    /// (id, key) accepted at these times.
    accepts: BTreeMap<(usize, Vec<u8>), Vec<u64>>,
}

impl Events {
    /// Whether an operator accepted `key` for `id` after the id's last
    /// revocation and the key's last denial that `know` holds.
    fn allows(&self, know: &Know, id: usize, key: &[u8]) -> bool {
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
enum Setup {
    /// Empty stores.
    Plain,
    /// A store made, then copied file by file into another directory.
    Copied,
    /// One `localfs_key` tree migrated into two stores, the second later.
    MigratedTwice,
}

/// A `localfs_key` tree stores are made from.
#[derive(Debug, Clone)]
struct Tree {
    entries: Vec<TreeEntry>,
    /// Where its entries' writes begin in `Sim::acts`, once recorded: both
    /// stores migrated from it know the same ones.
    acts: Option<usize>,
}

/// An entry of a tree.
#[derive(Debug, Clone)]
struct TreeEntry {
    bank: u8,
    id: usize,
    value: Value,
    /// When its file was written (its ctime).
    at: u64,
}

struct Sim {
    rng: Rng,
    clock: Arc<AtomicU64>,
    root: tempfile::TempDir,
    peers: Vec<PathBuf>,
    /// What each peer knows.
    know: Vec<Know>,
    /// Every write, in the sim's order.
    acts: Vec<Action>,
    /// Per store directory, its observations.
    seen: BTreeMap<PathBuf, Observations>,
    /// Copies of peers' directories taken earlier (for restores).
    backups: Vec<(usize, PathBuf, Know)>,
    /// Snapshots taken earlier, per peer (for replays).
    old_snaps: Vec<(usize, Vec<u8>, Know)>,
    /// A separate two-store cluster's snapshot.
    foreign: Vec<u8>,
    events: Events,
    next_key: u32,
    n_dirs: usize,
    /// How many times the second invariant applied (it must, to mean
    /// anything).
    kept_checks: Cell<u64>,
}

fn opts() -> OpenOptions {
    OpenOptions {
        params: Params {
            size: 257,
            ..Params::default()
        },
        rebuild_settle: std::time::Duration::ZERO,
        ..OpenOptions::default()
    }
}

/// Copies a directory as `cp -a` does: every file, links and
/// subdirectories, modes and modification times kept; the copy is a new
/// directory (inode).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type().expect("type");
        if t.is_dir() {
            copy_dir(&src, &dst);
        } else if t.is_symlink() {
            let target = std::fs::read_link(&src).expect("readlink");
            std::os::unix::fs::symlink(target, &dst).expect("symlink");
        } else if t.is_file() {
            std::fs::copy(&src, &dst).expect("copy");
            let mtime = e.metadata().expect("stat").modified().expect("mtime");
            std::fs::File::options()
                .write(true)
                .open(&dst)
                .and_then(|f| f.set_modified(mtime))
                .expect("set mtime");
        }
    }
}

fn trace() -> bool {
    std::env::var_os("KEYCACHE_MERGE_TRACE").is_some()
}

impl Sim {
    /// A sim with the foreign cluster and no peer yet.
    fn bare(seed: u64) -> Sim {
        let base = Path::new("/dev/shm");
        let root = if base.is_dir() {
            tempfile::tempdir_in(base)
        } else {
            tempfile::tempdir()
        }
        .expect("tempdir");
        let mut s = Sim {
            rng: Rng::new(seed),
            clock: Arc::new(AtomicU64::new(1_000_000_000)),
            root,
            peers: Vec::new(),
            know: Vec::new(),
            acts: Vec::new(),
            seen: BTreeMap::new(),
            backups: Vec::new(),
            old_snaps: Vec::new(),
            foreign: Vec::new(),
            events: Events::default(),
            next_key: 0,
            n_dirs: 0,
            kept_checks: Cell::new(0),
        };
        // Another cluster: its own cluster key, a key of its own.
        let x = s.new_dir_with(FOREIGN_KEY);
        s.store(&x)
            .put(&mid(0), KeyState::Accepted, &pem(0, 999_999))
            .expect("put");
        s.foreign = s.snap_of(&x);
        s
    }

    /// 2 to 4 peers, the first two started as `setup` says (drawn when
    /// `None`: a copy or a tree migrated twice one run in six each).
    fn new(seed: u64, setup: Option<Setup>) -> Sim {
        let mut s = Sim::bare(seed);
        let n = 2 + s.rng.below(3) as usize;
        let setup = setup.unwrap_or_else(|| match s.rng.below(6) {
            0 => Setup::Copied,
            1 => Setup::MigratedTwice,
            _ => Setup::Plain,
        });
        match setup {
            Setup::Plain => {}
            Setup::Copied => {
                let mut tree = s.random_tree();
                let a = s.made_from(&mut tree, false);
                for _ in 0..s.rng.below(3) {
                    s.operate(a);
                }
                s.copy_peer(a);
            }
            Setup::MigratedTwice => {
                let mut tree = s.random_tree();
                let a = s.made_from(&mut tree, true);
                for _ in 0..s.rng.below(3) {
                    s.operate(a);
                }
                s.made_from(&mut tree, true);
            }
        }
        while s.peers.len() < n {
            s.add_peer();
        }
        if setup != Setup::Plain {
            // Operators at work on both before their first merge.
            for _ in 0..2 + s.rng.below(6) {
                let p = s.rng.below(2) as usize;
                s.operate(p);
            }
        }
        s
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(TICK, Ordering::SeqCst) + TICK
    }

    fn wall(&self) -> WallClock {
        let c = self.clock.clone();
        WallClock::new(move || c.load(Ordering::SeqCst))
    }

    fn hist(&self) -> HistoryOptions {
        HistoryOptions {
            wall: self.wall(),
            ..HistoryOptions::default()
        }
    }

    /// A new store directory of our cluster: its key file in place (a
    /// wiped or new master gets the cluster's key pair back before it runs).
    fn new_dir(&mut self) -> PathBuf {
        self.new_dir_with(CLUSTER_KEY)
    }

    fn new_dir_with(&mut self, cluster_key: &str) -> PathBuf {
        self.n_dirs += 1;
        let d = self.root.path().join(format!("s{}", self.n_dirs));
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join("cluster.pub"), cluster_key).expect("cluster.pub");
        d
    }

    /// A new peer with an empty store.
    fn add_peer(&mut self) -> usize {
        let d = self.new_dir();
        self.peers.push(d);
        self.know.push(Know::default());
        self.peers.len() - 1
    }

    fn store(&self, dir: &Path) -> Store {
        Store::open_with(dir, &opts()).expect("open")
    }

    /// `dir` was observed at `t` and the observation saved: the writes it
    /// found are stamped.
    fn observed(&mut self, dir: &Path, t: u64) {
        let o = self.seen.entry(dir.to_path_buf()).or_default();
        o.last = t;
        for a in o.unstamped.drain(..) {
            self.acts[a].hi.get_or_insert(t);
        }
    }

    /// Copies the store directory `from` into `to` (`cp -a`). The writes
    /// it holds unstamped are stamped by each copy at its own next
    /// observation: no bound is known of them any more.
    fn copy_store(&mut self, from: &Path, to: &Path) {
        copy_dir(from, to);
        let o = self.seen.get(from).cloned().unwrap_or_default();
        for &a in &o.unstamped {
            self.acts[a].hi.get_or_insert(u64::MAX);
        }
        self.seen.insert(to.to_path_buf(), o);
    }

    /// A new peer whose store is a copy of peer `p`'s, knowing what `p`
    /// knows.
    fn copy_peer(&mut self, p: usize) -> usize {
        let d = self.new_dir();
        self.copy_store(&self.peers[p].clone(), &d);
        self.peers.push(d);
        self.know.push(self.know[p].clone());
        self.peers.len() - 1
    }

    /// A `localfs_key` tree: pending keys mostly, some accepted, rejected
    /// and denied; at least one key.
    fn random_tree(&mut self) -> Tree {
        let mut tree = Vec::new();
        for i in 0..IDS.len() {
            let state = match self.rng.below(8) {
                0 if i > 0 => None,
                0..=4 => Some(KeyState::Pending),
                5 | 6 => Some(KeyState::Accepted),
                _ => Some(KeyState::Rejected),
            };
            if let Some(s) = state {
                self.next_key += 1;
                let value = (Some(s), pem(i, self.next_key));
                tree.push(self.tree_entry(0, i, value));
            }
            if self.rng.one_in(5) {
                self.next_key += 1;
                let value = (None, pem(i, self.next_key));
                tree.push(self.tree_entry(1, i, value));
            }
        }
        Tree {
            entries: tree,
            acts: None,
        }
    }

    fn tree_entry(&mut self, bank: u8, id: usize, value: Value) -> TreeEntry {
        let at = self.tick();
        if value.0 == Some(KeyState::Accepted) {
            self.events
                .accepts
                .entry((id, value.1.clone()))
                .or_default()
                .push(at);
        }
        TreeEntry {
            bank,
            id,
            value,
            at,
        }
    }

    /// A new peer whose store is made from `tree` and its history begun
    /// ([`keycache::history::begin_if_missing`]): by a migration when
    /// `migrated` (a rejected or denied entry stamped at its file's time,
    /// so that two stores migrated from one tree hold one version of it),
    /// else by the Salt driver's first write (stamped at the creation).
    /// The tree's entries are writes both stores made from it know of.
    fn made_from(&mut self, tree: &mut Tree, migrated: bool) -> usize {
        let p = self.add_peer();
        let dir = self.peers[p].clone();
        let st = self.store(&dir);
        for e in &tree.entries {
            match e.value.0 {
                Some(s) => st.put(&mid(e.id), s, &e.value.1).expect("put"),
                None => st.deny(&mid(e.id), &e.value.1).expect("deny"),
            }
        }
        let made = self.tick();
        let ctime = |bank: Bank, id: &str| {
            let b = u8::from(bank == Bank::Denied);
            tree.entries
                .iter()
                .find(|e| e.bank == b && IDS[e.id] == id)
                .map(|e| e.at)
        };
        let since: Option<keycache::history::Since<'_>> = migrated.then_some(&ctime);
        // Not asserted: without a history begun here, the sim's
        // invariants are what fail.
        keycache::history::begin_if_missing(&st, &self.hist(), since).expect("begin");
        self.observed(&dir, made);
        let first = match tree.acts {
            Some(k) => k,
            None => {
                let first = self.acts.len();
                for e in &tree.entries {
                    let (op, lo, hi) = match e.value.0 {
                        // The values a store is made with are the oldest
                        // there are: the first stamp.
                        Some(KeyState::Pending) => (Op::Pending, 0, 1),
                        Some(KeyState::Accepted) => (Op::Accept, 0, 1),
                        // Revocations at their file's time or the creation.
                        s => {
                            let t = if migrated { e.at } else { made };
                            let op = if s.is_some() { Op::Reject } else { Op::Deny };
                            (op, t, t)
                        }
                    };
                    self.acts.push(Action {
                        bank: e.bank,
                        id: e.id,
                        op,
                        by: "the tree".into(),
                        at: e.at,
                        value: Some(e.value.clone()),
                        lo,
                        hi: Some(hi),
                    });
                }
                tree.acts = Some(first);
                first
            }
        };
        let k = &mut self.know[p];
        k.acts.extend(first..first + tree.entries.len());
        for e in &tree.entries {
            match e.value.0 {
                Some(KeyState::Rejected) => {
                    k.revoked.insert(e.id, e.at);
                }
                None => {
                    k.denied.insert((e.id, e.value.1.clone()), e.at);
                }
                _ => {}
            }
        }
        p
    }

    fn snap_of(&mut self, dir: &Path) -> Vec<u8> {
        let t = self.tick();
        let o = SnapshotOptions {
            history: self.hist(),
            ..SnapshotOptions::default()
        };
        let s = snapshot::take(&self.store(dir), &o).expect("snapshot");
        self.observed(dir, t);
        let mut b = Vec::new();
        s.write_to(&mut b).expect("write");
        b
    }

    /// The recipe on the receiving side: read (filtered), check the base,
    /// prepare the next base, merge, put the base in place.
    fn merge_bytes(
        &mut self,
        dir: &Path,
        bytes: &[u8],
        base: Option<&Path>,
    ) -> keycache::Result<()> {
        let t = self.tick();
        let store = self.store(dir);
        let mo = MergeOptions {
            history: self.hist(),
            ..MergeOptions::default()
        };
        let h = keycache::history::History::load(dir, &mo.history)?;
        let theirs = merge::read_snapshot(&h, &mut &bytes[..], "peer")?;
        if let Some(p) = base {
            if let BaseFile::Base(b) = Base::read_file(p)? {
                b.check(&theirs)?;
            }
        }
        let prepared = base.map(|p| Base::of(&theirs).prepare(p)).transpose()?;
        merge::merge_with(&store, h, &theirs, &mo)?;
        self.observed(dir, t);
        if let Some(p) = prepared {
            p.commit()?;
        }
        Ok(())
    }

    /// What a store holds: id -> (state, key), and denied ids -> key.
    fn state(&self, dir: &Path) -> Held {
        let st = self.store(dir);
        let mut m = BTreeMap::new();
        for i in 0..IDS.len() {
            if let Some(e) = st.get(&mid(i)).expect("get") {
                m.insert((0, i), (Some(e.state), e.public_key));
            }
            if let Some(d) = st.denied(&mid(i)).expect("denied") {
                m.insert((1, i), (None, d));
            }
        }
        m
    }

    /// Asserts that nothing accepted in `after` (peer `p`'s store) and not
    /// accepted with the same key in `before` lacks an operator's accept
    /// after the id's last revocation that `p` knows of.
    fn check_merge(&self, before: &Held, after: &Held, p: usize, what: &str) {
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
    /// the README's timer does.
    fn check_kept(&self, held: &Held, know: &Know, what: &str) {
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

    fn base_path(&self, to: usize, from: usize) -> PathBuf {
        self.root.path().join(format!("base-{to}-from-{from}"))
    }

    /// Records a write of peer `p` that changed (`bank`, `id`), with the
    /// bounds of its stamp (see `check_kept`).
    fn record(&mut self, p: usize, bank: u8, id: usize, op: Op, at: u64, value: Option<Value>) {
        let dir = &self.peers[p];
        let last = self.seen.get(dir).map_or(0, |o| o.last);
        let begun = last > 0;
        let (lo, hi) = match op {
            // At the last observation; in a store without a history yet,
            // at the first stamp (its first observation's "last" is 0).
            Op::Accept => (last, Some(if begun { at } else { 1 })),
            // A key of an id the store knew nothing of: the first stamp.
            Op::Pending => (0, None),
            // No tombstone where the store keeps no removal log yet.
            Op::Delete if !begun => (0, None),
            _ => (at, None),
        };
        let a = self.acts.len();
        self.acts.push(Action {
            bank,
            id,
            op,
            by: format!("peer {p}"),
            at,
            value,
            lo,
            hi,
        });
        self.know[p].acts.insert(a);
        if hi.is_none() {
            self.seen.entry(dir.clone()).or_default().unstamped.push(a);
        }
    }

    /// One random action on peer `p`, on the banks (as Salt writes them),
    /// and some of the time the timer's snapshot of `p` right after.
    fn act(&mut self, p: usize) {
        let i = self.rng.below(IDS.len() as u64) as usize;
        let op = match self.rng.below(7) {
            0 | 1 => Op::Pending,
            2 | 3 => Op::Accept,
            4 => Op::Reject,
            5 => Op::Delete,
            _ => Op::Deny,
        };
        self.apply(p, i, op);
        if self.rng.one_in(3) {
            self.snap_of(&self.peers[p].clone());
        }
    }

    /// An operator's accept, rejection or deletion of a random id on
    /// peer `p`, and some of the time the timer's snapshot right after.
    fn operate(&mut self, p: usize) {
        let i = self.rng.below(IDS.len() as u64) as usize;
        let op = [Op::Accept, Op::Accept, Op::Reject, Op::Delete][self.rng.below(4) as usize];
        self.apply(p, i, op);
        if self.rng.one_in(3) {
            self.snap_of(&self.peers[p].clone());
        }
    }

    /// `op` of id `i` on peer `p`'s banks, as Salt writes it.
    fn apply(&mut self, p: usize, i: usize, op: Op) {
        let st = self.store(&self.peers[p].clone());
        let id = mid(i);
        let now = self.tick();
        if trace() {
            eprintln!("act peer {p} id {} {op:?} t={now}", IDS[i]);
        }
        match op {
            // A minion presents a (new) key: pending.
            Op::Pending => {
                self.next_key += 1;
                let k = pem(i, self.next_key);
                st.put(&id, KeyState::Pending, &k).expect("put");
                self.record(p, 0, i, op, now, Some((Some(KeyState::Pending), k)));
            }
            // salt-key -a on a pending key.
            Op::Accept => {
                if let Some(e) = st.get(&id).expect("get") {
                    if e.state == KeyState::Pending {
                        st.set_state(&id, KeyState::Accepted).expect("accept");
                        self.events
                            .accepts
                            .entry((i, e.public_key.clone()))
                            .or_default()
                            .push(now);
                        let v = (Some(KeyState::Accepted), e.public_key);
                        self.record(p, 0, i, op, now, Some(v));
                    }
                }
            }
            // salt-key -r (a revocation when it changes the state: a
            // rejected key rejected again changes nothing, in the store or
            // in what an operator revoked).
            Op::Reject => {
                let was = st.get(&id).expect("get");
                if st.set_state(&id, KeyState::Rejected).expect("reject") {
                    if let Some(e) = was.filter(|e| e.state != KeyState::Rejected) {
                        self.know[p].revoked.insert(i, now);
                        let v = (Some(KeyState::Rejected), e.public_key);
                        self.record(p, 0, i, op, now, Some(v));
                    }
                }
            }
            // salt-key -d (a revocation when the id had a key), in a store
            // that has a history: an entry that came and went between two
            // observations is in the removal log, which the next
            // observation turns into a tombstone. A store that never took
            // part in a snapshot or merge keeps no log: what it deleted
            // before it joined is not a revocation of the cluster's.
            Op::Delete => {
                let joined = self.peers[p].join(keycache::format::IDENTITY_FILE).exists();
                if st.remove_denied(&id).expect("delete denied") {
                    self.record(p, 1, i, op, now, None);
                }
                if st.remove(&id).expect("delete") {
                    if joined {
                        self.know[p].revoked.insert(i, now);
                    }
                    self.record(p, 0, i, op, now, None);
                }
            }
            // A key denied (a minion presented another key for an id).
            Op::Deny => {
                self.next_key += 1;
                let k = pem(i, self.next_key);
                st.deny(&id, &k).expect("deny");
                self.know[p].denied.insert((i, k.clone()), now);
                self.record(p, 1, i, op, now, Some((None, k)));
            }
        }
    }

    /// Merges `bytes` (a snapshot of `from`, which knew `known` then) into
    /// peer `to` by the recipe, and asserts both invariants.
    fn merge_into(&mut self, to: usize, from: usize, bytes: &[u8], known: &Know, what: &str) {
        let dir = self.peers[to].clone();
        let before = self.state(&dir);
        let base = self.base_path(to, from);
        match self.merge_bytes(&dir, bytes, Some(&base)) {
            Ok(()) => self.know[to].absorb(known),
            Err(Error::MergeRefused { .. }) => {
                assert_eq!(before, self.state(&dir), "{what}: a refused merge wrote")
            }
            Err(e) => panic!("{what}: {e}"),
        }
        let after = self.state(&dir);
        self.check_merge(&before, &after, to, what);
        self.check_kept(&after, &self.know[to], what);
    }

    /// Peer `to` pulls from peer `from` by the recipe.
    fn pull(&mut self, to: usize, from: usize) {
        let bytes = self.snap_of(&self.peers[from].clone());
        let known = self.know[from].clone();
        if self.rng.one_in(4) {
            self.old_snaps.push((from, bytes.clone(), known.clone()));
        }
        if trace() {
            eprintln!("pull {from} -> {to}");
        }
        self.merge_into(to, from, &bytes, &known, &format!("merge {from} -> {to}"));
    }

    fn event(&mut self) {
        let n = self.peers.len();
        let p = self.rng.below(n as u64) as usize;
        let what = self.rng.below(9);
        if trace() {
            eprintln!("event {what} peer {p}");
        }
        match what {
            // A new peer: an empty store, or a copy of a peer's.
            0 if n < 4 => {
                if self.rng.one_in(2) {
                    self.copy_peer(p);
                } else {
                    self.add_peer();
                }
            }
            // A backup of a peer's directory.
            1 => {
                let d = self.new_dir();
                self.copy_store(&self.peers[p].clone(), &d);
                self.backups.push((p, d, self.know[p].clone()));
            }
            // A peer restored from an older copy.
            2 => {
                if !self.backups.is_empty() {
                    let k = self.rng.below(self.backups.len() as u64) as usize;
                    let (q, src, known) = self.backups[k].clone();
                    let d = self.new_dir();
                    self.copy_store(&src, &d);
                    self.peers[q] = d;
                    self.know[q] = known;
                }
            }
            // A wiped peer: its directory emptied.
            3 => {
                let d = self.new_dir();
                self.peers[p] = d;
                self.know[p] = Know::default();
            }
            // Lost bases.
            4 => {
                for f in std::fs::read_dir(self.root.path()).expect("ls").flatten() {
                    if f.file_name().to_string_lossy().starts_with("base-") && self.rng.one_in(2) {
                        std::fs::remove_file(f.path()).expect("rm base");
                    }
                }
            }
            // An unreadable base: the merge must fail and write nothing.
            5 => {
                let q = (p + 1) % n;
                let base = self.base_path(p, q);
                std::fs::write(&base, b"garbage").expect("write");
                let bytes = self.snap_of(&self.peers[q].clone());
                let dir = self.peers[p].clone();
                let before = self.state(&dir);
                assert!(
                    self.merge_bytes(&dir, &bytes, Some(&base)).is_err(),
                    "a damaged base was taken"
                );
                assert_eq!(before, self.state(&dir));
                std::fs::remove_file(&base).expect("rm");
            }
            // A replayed older snapshot.
            6 => {
                if !self.old_snaps.is_empty() {
                    let k = self.rng.below(self.old_snaps.len() as u64) as usize;
                    let (from, bytes, known) = self.old_snaps[k].clone();
                    let to = (from + 1 + self.rng.below(n as u64 - 1) as usize) % n;
                    self.merge_into(to, from, &bytes, &known, "replay");
                }
            }
            // Another cluster's snapshot, or the peer's own: refused.
            _ => {
                let dir = self.peers[p].clone();
                let own = self.rng.one_in(2);
                let bytes = if own {
                    self.snap_of(&dir)
                } else {
                    self.foreign.clone()
                };
                let before = self.state(&dir);
                let r = self.merge_bytes(&dir, &bytes, None);
                assert!(
                    matches!(r, Err(Error::MergeRefused { .. })),
                    "own={own}: {r:?}"
                );
                assert_eq!(before, self.state(&dir));
            }
        }
    }

    fn run(&mut self, steps: usize) {
        for step in 0..steps {
            let n = self.peers.len();
            if trace() {
                self.trace_state(step);
            }
            match self.rng.below(10) {
                0..=3 => {
                    let p = self.rng.below(n as u64) as usize;
                    self.act(p);
                }
                4..=8 => {
                    let to = self.rng.below(n as u64) as usize;
                    let from = (to + 1 + self.rng.below(n as u64 - 1) as usize) % n;
                    self.pull(to, from);
                }
                _ => self.event(),
            }
        }
        self.settle();
    }

    fn trace_state(&self, step: usize) {
        eprintln!(
            "step {step} t={} peers={:?}",
            self.clock.load(Ordering::SeqCst),
            self.peers
                .iter()
                .map(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
        );
        for (i, p) in self.peers.iter().enumerate() {
            eprintln!(
                "  peer {i}: {:?}",
                self.state(p)
                    .iter()
                    .map(|((b, i), v)| format!("{b}/{}:{}", IDS[*i], show(Some(v))))
                    .collect::<Vec<_>>()
            );
        }
    }

    /// Quiescence: rounds of merges between all pairs; every peer equal,
    /// and what they hold passes both rules.
    fn settle(&mut self) {
        let n = self.peers.len();
        for _ in 0..4 {
            for to in 0..n {
                for from in 0..n {
                    if to != from {
                        self.pull(to, from);
                    }
                }
            }
        }
        let first = self.state(&self.peers[0]);
        for p in 1..n {
            assert_eq!(
                first,
                self.state(&self.peers[p]),
                "peers 0 and {p} differ after quiescence"
            );
        }
        let mut all = Know::default();
        for k in &self.know {
            all.absorb(k);
        }
        for ((b, i), (s, k)) in &first {
            if *b == 0 && *s == Some(KeyState::Accepted) {
                assert!(
                    self.events.allows(&all, *i, k),
                    "{} accepted after quiescence without a later accept",
                    IDS[*i]
                );
            }
        }
        self.check_kept(&first, &all, "after quiescence");
    }
}

/// Runs `runs` sims from `KEYCACHE_MERGE_SEED` (or `seed0`) on, their first
/// two peers started as `setup` says; returns how many times the second
/// invariant applied.
fn sims(runs: u64, seed0: u64, setup: Option<Setup>) -> u64 {
    let seed0: u64 = std::env::var("KEYCACHE_MERGE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(seed0);
    let mut checks = 0;
    for seed in seed0..seed0 + runs {
        let r = std::panic::catch_unwind(|| {
            let mut s = Sim::new(seed, setup);
            s.run(40);
            s.kept_checks.get()
        });
        match r {
            Ok(n) => checks += n,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                let how = setup.map_or_else(|| "setup drawn".into(), |s| format!("{s:?}"));
                panic!(
                    "seed {seed} ({how}; KEYCACHE_MERGE_SEED={seed} KEYCACHE_MERGE_SIMS=1): {msg}"
                );
            }
        }
    }
    checks
}

fn runs(default: u64) -> u64 {
    std::env::var("KEYCACHE_MERGE_SIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn peers_converge_and_never_undo_a_revocation() {
    let runs = runs(1500);
    let checks = sims(runs, 0, None);
    eprintln!("{runs} runs: the second invariant applied {checks} times");
    assert!(
        runs < 100 || checks > 0,
        "the second invariant never applied"
    );
}

/// A tree for the scripted runs: m1 to web-2 pending, db-1 accepted,
/// .dot rejected and a key of it denied.
fn script_tree(s: &mut Sim) -> Tree {
    let mut entries = Vec::new();
    for i in 0..IDS.len() {
        let state = match i {
            4 => KeyState::Accepted,
            5 => KeyState::Rejected,
            _ => KeyState::Pending,
        };
        s.next_key += 1;
        entries.push(s.tree_entry(0, i, (Some(state), pem(i, s.next_key))));
    }
    s.next_key += 1;
    entries.push(s.tree_entry(1, 5, (None, pem(5, s.next_key))));
    Tree {
        entries,
        acts: None,
    }
}

/// Operators at work on peers 0 and 1 before their first merge, each
/// action followed by the timer's snapshot: each accepts a pending key and
/// rejects one, each deletes a key (one the other rejected), one accepts a
/// key the other rejected before, one deletes a rejected id and its denied
/// key; then the peers merge (`first_pull` first) until they agree.
fn script(s: &mut Sim, first_pull: (usize, usize)) {
    for (p, i, op) in [
        (1, 0, Op::Accept),
        (0, 1, Op::Accept),
        (1, 2, Op::Reject),
        (0, 3, Op::Reject),
        (1, 4, Op::Delete),
        (0, 2, Op::Delete),
        (1, 3, Op::Accept),
        (0, 5, Op::Delete),
    ] {
        s.apply(p, i, op);
        s.snap_of(&s.peers[p].clone());
    }
    s.pull(first_pull.0, first_pull.1);
    s.settle();
    let held = s.state(&s.peers[0]);
    let want = [
        Some(KeyState::Accepted),
        Some(KeyState::Accepted),
        None,
        Some(KeyState::Accepted),
        None,
        None,
    ];
    for (i, w) in want.into_iter().enumerate() {
        let got = held.get(&(0, i)).map(|v| v.0);
        assert_eq!(got, w.map(Some), "{} after the merges", IDS[i]);
    }
    assert_eq!(held.get(&(1, 5)), None, "the denied key of .dot");
    assert!(
        s.kept_checks.get() > 0,
        "the second invariant never applied"
    );
}

#[test]
fn actions_on_a_copied_store_before_its_first_merge_stand() {
    for first_pull in [(0, 1), (1, 0)] {
        let mut s = Sim::bare(1);
        let mut tree = script_tree(&mut s);
        let a = s.made_from(&mut tree, false);
        s.copy_peer(a);
        script(&mut s, first_pull);
    }
    sims(runs(100).div_ceil(5), 1_000_000, Some(Setup::Copied));
}

#[test]
fn actions_on_a_tree_migrated_twice_stand() {
    for first_pull in [(0, 1), (1, 0)] {
        let mut s = Sim::bare(2);
        let mut tree = script_tree(&mut s);
        s.made_from(&mut tree, true);
        // An accept on the first store before the second is made.
        s.apply(0, 1, Op::Accept);
        s.tick();
        s.made_from(&mut tree, true);
        script(&mut s, first_pull);
    }
    sims(runs(100).div_ceil(5), 2_000_000, Some(Setup::MigratedTwice));
}
