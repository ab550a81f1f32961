//! The simulated cluster ([`Sim`]): its peers' store directories on one
//! logical clock, and what it does to a store: make one (empty, copied,
//! from a tree), snapshot it, merge into it by the recipe, read it.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use keycache::{KeyState, OpenOptions, Params, Store};
use keycache_merge::history::HistoryOptions;
use keycache_merge::hlc::WallClock;
use keycache_merge::merge::{self, Base, BaseFile, MergeOptions};
use keycache_merge::snapshot::{self, Bank, SnapshotOptions};
use keycache_testkit::common::Rng;

use crate::model::{
    mid, pem, Action, Events, Held, Know, Observations, Op, Tree, TreeEntry, Value, CLUSTER_KEY,
    FOREIGN_KEY, IDS, TICK,
};

pub(crate) struct Sim {
    pub(crate) rng: Rng,
    pub(crate) clock: Arc<AtomicU64>,
    pub(crate) root: tempfile::TempDir,
    pub(crate) peers: Vec<PathBuf>,
    /// What each peer knows.
    pub(crate) know: Vec<Know>,
    /// Every write, in the sim's order.
    pub(crate) acts: Vec<Action>,
    /// Per store directory, its observations.
    pub(crate) seen: BTreeMap<PathBuf, Observations>,
    /// Copies of peers' directories taken earlier (for restores).
    pub(crate) backups: Vec<(usize, PathBuf, Know)>,
    /// Snapshots taken earlier, per peer (for replays).
    pub(crate) old_snaps: Vec<(usize, Vec<u8>, Know)>,
    /// A separate two-store cluster's snapshot.
    pub(crate) foreign: Vec<u8>,
    pub(crate) events: Events,
    pub(crate) next_key: u32,
    n_dirs: usize,
    /// How many times the second invariant applied (it must, to mean
    /// anything).
    pub(crate) kept_checks: Cell<u64>,
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

pub(crate) fn trace() -> bool {
    std::env::var_os("KEYCACHE_MERGE_TRACE").is_some()
}

impl Sim {
    /// A sim with the foreign cluster and no peer yet.
    pub(crate) fn bare(seed: u64) -> Sim {
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

    pub(crate) fn tick(&self) -> u64 {
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
    pub(crate) fn new_dir(&mut self) -> PathBuf {
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
    pub(crate) fn add_peer(&mut self) -> usize {
        let d = self.new_dir();
        self.peers.push(d);
        self.know.push(Know::default());
        self.peers.len() - 1
    }

    pub(crate) fn store(&self, dir: &Path) -> Store {
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
    pub(crate) fn copy_store(&mut self, from: &Path, to: &Path) {
        copy_dir(from, to);
        let o = self.seen.get(from).cloned().unwrap_or_default();
        for &a in &o.unstamped {
            self.acts[a].hi.get_or_insert(u64::MAX);
        }
        self.seen.insert(to.to_path_buf(), o);
    }

    /// A new peer whose store is a copy of peer `p`'s, knowing what `p`
    /// knows.
    pub(crate) fn copy_peer(&mut self, p: usize) -> usize {
        let d = self.new_dir();
        self.copy_store(&self.peers[p].clone(), &d);
        self.peers.push(d);
        self.know.push(self.know[p].clone());
        self.peers.len() - 1
    }

    /// A `localfs_key` tree: pending keys mostly, some accepted, rejected
    /// and denied; at least one key.
    pub(crate) fn random_tree(&mut self) -> Tree {
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

    pub(crate) fn tree_entry(&mut self, bank: u8, id: usize, value: Value) -> TreeEntry {
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
    /// ([`keycache_merge::history::begin_if_missing`]): by a migration when
    /// `migrated` (a rejected or denied entry stamped at its file's time,
    /// so that two stores migrated from one tree hold one version of it),
    /// else by the Salt driver's first write (stamped at the creation).
    /// The tree's entries are writes both stores made from it know of.
    pub(crate) fn made_from(&mut self, tree: &mut Tree, migrated: bool) -> usize {
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
        let since: Option<keycache_merge::history::Since<'_>> = migrated.then_some(&ctime);
        // Not asserted: without a history begun here, the sim's
        // invariants are what fail.
        keycache_merge::history::begin_if_missing(&st, &self.hist(), since).expect("begin");
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

    pub(crate) fn snap_of(&mut self, dir: &Path) -> Vec<u8> {
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
    pub(crate) fn merge_bytes(
        &mut self,
        dir: &Path,
        bytes: &[u8],
        base: Option<&Path>,
    ) -> keycache_merge::Result<()> {
        let t = self.tick();
        let store = self.store(dir);
        let mo = MergeOptions {
            history: self.hist(),
            ..MergeOptions::default()
        };
        let h = keycache_merge::history::History::load(dir, &mo.history)?;
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
    pub(crate) fn state(&self, dir: &Path) -> Held {
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

    pub(crate) fn base_path(&self, to: usize, from: usize) -> PathBuf {
        self.root.path().join(format!("base-{to}-from-{from}"))
    }
}
