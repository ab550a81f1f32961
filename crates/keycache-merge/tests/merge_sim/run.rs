//! A run of the sim: its peers set up, random steps (actions, merges by the
//! recipe, events), and the rounds of merges that end it.

use std::sync::atomic::Ordering;

use keycache::KeyState;
use keycache_merge::Error;

use crate::model::{show, Know, Setup, IDS};
use crate::sim::{trace, Sim};

impl Sim {
    /// 2 to 4 peers, the first two started as `setup` says (drawn when
    /// `None`: a copy or a tree migrated twice one run in six each).
    pub(crate) fn new(seed: u64, setup: Option<Setup>) -> Sim {
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

    /// Merges `bytes` (a snapshot of `from`, which knew `known` then) into
    /// peer `to` by the recipe, and asserts both invariants.
    pub(crate) fn merge_into(
        &mut self,
        to: usize,
        from: usize,
        bytes: &[u8],
        known: &Know,
        what: &str,
    ) {
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
    pub(crate) fn pull(&mut self, to: usize, from: usize) {
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

    pub(crate) fn event(&mut self) {
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

    pub(crate) fn run(&mut self, steps: usize) {
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

    pub(crate) fn trace_state(&self, step: usize) {
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
    pub(crate) fn settle(&mut self) {
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
