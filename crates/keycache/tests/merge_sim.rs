//! Simulation of 2 to 4 peers of a cluster exchanging snapshots by the
//! README's timer recipe (`snapshot` piped into `merge --base F
//! --write-base F`, in process), with operator actions (accept, reject,
//! delete, deny, re-key, new minions) made on the banks directly, as Salt's
//! own writers make them (the history finds them), and the events that
//! used to undo revocations: new peers, peers restored from older copies of
//! their store directory, wiped peers, lost and unreadable bases, replayed
//! older snapshots, another cluster's snapshots and a peer's own.
//!
//! Asserted at every step: a merge never makes an id accepted with a key
//! unless an operator accepted that key after the id's last revocation
//! (deletion or rejection of the id, or the key denied) anywhere; refused
//! merges write nothing. After the events stop, rounds of merges between
//! all pairs make every peer equal, and what they hold accepted passes the
//! same rule.
//!
//! One global logical clock drives every peer (each action and merge a
//! tick), so "after" is exact. `KEYCACHE_MERGE_SIMS` sets the number of
//! runs (1500 by default); `KEYCACHE_MERGE_SEED` the first seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use keycache::history::HistoryOptions;
use keycache::hlc::WallClock;
use keycache::merge::{self, Base, BaseFile, MergeOptions};
use keycache::snapshot::{self, SnapshotOptions};
use keycache::{Error, KeyState, MinionId, OpenOptions, Params, Store};
use keycache_testkit::common::Rng;

const CLUSTER_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMIIBclusterA\n-----END PUBLIC KEY-----\n";
const FOREIGN_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMIIBclusterB\n-----END PUBLIC KEY-----\n";

const IDS: [&str; 6] = ["m1", "m2", "web-1", "web-2", "db-1", ".dot"];

/// A PEM public key: id and key version in its body.
fn pem(id: usize, ver: u32) -> Vec<u8> {
    format!("-----BEGIN PUBLIC KEY-----\nMIIBk{id}v{ver}AQAB\n-----END PUBLIC KEY-----\n")
        .into_bytes()
}

/// What a store holds: (bank 0 keys / 1 denied, id) -> (state, key).
type Held = BTreeMap<(u8, usize), (Option<KeyState>, Vec<u8>)>;

fn mid(i: usize) -> MinionId {
    MinionId::new(IDS[i]).expect("id")
}

/// The revocations a peer knows of: its own, and those of the peers it
/// merged from (as of their snapshots). A peer restored from a copy knows
/// what the copy knew; a wiped or new one nothing.
#[derive(Debug, Clone, Default)]
struct Know {
    /// The last revocation of each id (deleted or rejected).
    revoked: BTreeMap<usize, u64>,
    /// (id, key) denied at these times.
    denied: BTreeMap<(usize, Vec<u8>), u64>,
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

struct Sim {
    rng: Rng,
    clock: Arc<AtomicU64>,
    root: tempfile::TempDir,
    peers: Vec<PathBuf>,
    /// What each peer knows of revocations.
    know: Vec<Know>,
    /// Copies of peers' directories taken earlier (for restores).
    backups: Vec<(usize, PathBuf, Know)>,
    /// Snapshots taken earlier, per peer (for replays).
    old_snaps: Vec<(usize, Vec<u8>, Know)>,
    /// A separate two-store cluster's snapshot.
    foreign: Vec<u8>,
    events: Events,
    next_key: u32,
    n_dirs: usize,
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

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
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
            backups: Vec::new(),
            old_snaps: Vec::new(),
            foreign: Vec::new(),
            events: Events::default(),
            next_key: 0,
            n_dirs: 0,
        };
        // Another cluster: its own cluster key, a key of its own.
        let x = s.new_dir_with(FOREIGN_KEY);
        s.store(&x)
            .put(&mid(0), KeyState::Accepted, &pem(0, 999_999))
            .expect("put");
        s.foreign = s.snap_of(&x);
        let n = 2 + s.rng.below(3) as usize;
        for _ in 0..n {
            let d = s.new_dir();
            s.peers.push(d);
            s.know.push(Know::default());
        }
        s
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1_000, Ordering::SeqCst) + 1_000
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

    fn store(&self, dir: &Path) -> Store {
        Store::open_with(dir, &opts()).expect("open")
    }

    fn snap_of(&mut self, dir: &Path) -> Vec<u8> {
        self.tick();
        let o = SnapshotOptions {
            history: self.hist(),
            ..SnapshotOptions::default()
        };
        let s = snapshot::take(&self.store(dir), &o).expect("snapshot");
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
        self.tick();
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

    /// Asserts that nothing accepted in peer `p` and not accepted with the
    /// same key in `before` lacks an operator's accept after the id's last
    /// revocation that `p` knows of.
    fn check_merge(&self, before: &Held, p: usize, what: &str) {
        for ((b, i), (s, k)) in self.state(&self.peers[p]) {
            if b != 0 || s != Some(KeyState::Accepted) {
                continue;
            }
            if before.get(&(0, i)) == Some(&(Some(KeyState::Accepted), k.clone())) {
                continue;
            }
            assert!(
                self.events.allows(&self.know[p], i, &k),
                "{what}: a merge made {} accepted with a key no operator accepted after its last \
                 revocation",
                IDS[i]
            );
        }
    }

    fn base_path(&self, to: usize, from: usize) -> PathBuf {
        self.root.path().join(format!("base-{to}-from-{from}"))
    }

    /// One operator action on peer `p`, on the banks (as Salt writes them).
    fn act(&mut self, p: usize) {
        let st = self.store(&self.peers[p].clone());
        let i = self.rng.below(IDS.len() as u64) as usize;
        let id = mid(i);
        let now = self.tick();
        let what = self.rng.below(7);
        if std::env::var_os("KEYCACHE_MERGE_TRACE").is_some() {
            eprintln!("act peer {p} id {} op {what} t={now}", IDS[i]);
        }
        match what {
            // A minion presents a (new) key: pending.
            0 | 1 => {
                self.next_key += 1;
                let k = pem(i, self.next_key);
                st.put(&id, KeyState::Pending, &k).expect("put");
            }
            // salt-key -a on a pending key.
            2 | 3 => {
                if let Some(e) = st.get(&id).expect("get") {
                    if e.state == KeyState::Pending {
                        st.set_state(&id, KeyState::Accepted).expect("accept");
                        self.events
                            .accepts
                            .entry((i, e.public_key))
                            .or_default()
                            .push(now);
                    }
                }
            }
            // salt-key -r.
            // salt-key -r (a revocation when it changes the state: a
            // rejected key rejected again changes nothing, in the store or
            // in what an operator revoked).
            4 => {
                let was = st.get(&id).expect("get").map(|e| e.state);
                if st.set_state(&id, KeyState::Rejected).expect("reject")
                    && was != Some(KeyState::Rejected)
                {
                    self.know[p].revoked.insert(i, now);
                }
            }
            // salt-key -d (a revocation when the id had a key), in a store
            // that has a history: an entry that came and went between two
            // observations is in the removal log, which the next
            // observation turns into a tombstone. A store that never took
            // part in a snapshot or merge keeps no log: what it deleted
            // before it joined is not a revocation of the cluster's.
            5 => {
                st.remove_denied(&id).expect("delete denied");
                let joined = self.peers[p].join(keycache::format::IDENTITY_FILE).exists();
                if st.remove(&id).expect("delete") && joined {
                    self.know[p].revoked.insert(i, now);
                }
            }
            // A key denied (a minion presented another key for an id).
            _ => {
                self.next_key += 1;
                let k = pem(i, self.next_key);
                st.deny(&id, &k).expect("deny");
                self.know[p].denied.insert((i, k), now);
            }
        }
    }

    /// Peer `to` pulls from peer `from` by the recipe.
    fn pull(&mut self, to: usize, from: usize) {
        let bytes = self.snap_of(&self.peers[from].clone());
        let known = self.know[from].clone();
        if self.rng.one_in(4) {
            self.old_snaps.push((from, bytes.clone(), known.clone()));
        }
        let dir = self.peers[to].clone();
        let before = self.state(&dir);
        let base = self.base_path(to, from);
        if std::env::var_os("KEYCACHE_MERGE_TRACE").is_some() {
            eprintln!("pull {from} -> {to}");
        }
        match self.merge_bytes(&dir, &bytes, Some(&base)) {
            Ok(()) => self.know[to].absorb(&known),
            Err(Error::MergeRefused { .. }) => {
                assert_eq!(before, self.state(&dir), "a refused merge wrote")
            }
            Err(e) => panic!("merge {from} -> {to}: {e}"),
        }
        self.check_merge(&before, to, &format!("merge {from} -> {to}"));
    }

    fn event(&mut self) {
        let n = self.peers.len();
        let p = self.rng.below(n as u64) as usize;
        let what = self.rng.below(9);
        if std::env::var_os("KEYCACHE_MERGE_TRACE").is_some() {
            eprintln!("event {what} peer {p}");
        }
        match what {
            // A new peer.
            0 if n < 4 => {
                let d = self.new_dir();
                self.peers.push(d);
                self.know.push(Know::default());
            }
            // A backup of a peer's directory.
            1 => {
                let d = self.new_dir();
                copy_dir(&self.peers[p].clone(), &d);
                self.backups.push((p, d, self.know[p].clone()));
            }
            // A peer restored from an older copy.
            2 => {
                if !self.backups.is_empty() {
                    let k = self.rng.below(self.backups.len() as u64) as usize;
                    let (q, src, known) = self.backups[k].clone();
                    let d = self.new_dir();
                    copy_dir(&src, &d);
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
                    let dir = self.peers[to].clone();
                    let before = self.state(&dir);
                    let base = self.base_path(to, from);
                    match self.merge_bytes(&dir, &bytes, Some(&base)) {
                        Ok(()) => self.know[to].absorb(&known),
                        Err(Error::MergeRefused { .. }) => {}
                        Err(e) => panic!("replay: {e}"),
                    }
                    self.check_merge(&before, to, "replay");
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
        let trace = std::env::var_os("KEYCACHE_MERGE_TRACE").is_some();
        for step in 0..steps {
            let n = self.peers.len();
            if trace {
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
                            .map(|((b, i), (s, k))| format!(
                                "{b}/{}:{:?}:{}",
                                IDS[*i],
                                s,
                                String::from_utf8_lossy(&k[32..k.len() - 30])
                            ))
                            .collect::<Vec<_>>()
                    );
                }
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
        // Quiescence: rounds of merges between all pairs.
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
    }
}

#[test]
fn peers_converge_and_never_undo_a_revocation() {
    let runs: u64 = std::env::var("KEYCACHE_MERGE_SIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let seed0: u64 = std::env::var("KEYCACHE_MERGE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for seed in seed0..seed0 + runs {
        let r = std::panic::catch_unwind(|| {
            let mut s = Sim::new(seed);
            s.run(40);
        });
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!("seed {seed} (KEYCACHE_MERGE_SEED={seed} KEYCACHE_MERGE_SIMS=1): {msg}");
        }
    }
}
