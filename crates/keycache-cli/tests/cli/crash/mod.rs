//! Crash safety: writers, compactions, migrations, merges and tree
//! writers killed at random moments, at system calls, or losing power.

mod journal;
mod kill;
mod merge;
mod ownership;
mod power_loss;
mod resume;
mod syscall;
mod tree;

use std::path::{Path, PathBuf};

use crate::common;

use keycache::Store;
use keycache_testkit::crash::{
    check_crashed, copy_dir, findings, layout, listing, models, opts, parse_log, Cli, Model,
    SaltCheck, Tally,
};
use serde_json::json;

/// How many stores that a kill left for the next writer to mend are kept
/// for Salt's writer to mend instead ([`KilledWriters::check_salt_mends`]).
const SALT_MENDS: usize = 4;

/// Writers run one after the other into one store and killed: what the
/// store must hold, checked after every kill, and every tenth store kept
/// for Salt to read.
struct KilledWriters {
    t: tempfile::TempDir,
    dir: PathBuf,
    model: Model,
    seq: u64,
    tally: Tally,
    salt: SaltCheck,
    /// Copies of stores as a kill left them, with findings (roster and
    /// counters out of step), and what the store held.
    salt_mends: Vec<(PathBuf, Model)>,
}

impl KilledWriters {
    /// An empty store in a new temporary directory.
    fn new() -> KilledWriters {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("store");
        std::fs::create_dir(&dir).unwrap();
        KilledWriters {
            t,
            dir,
            model: Model::default(),
            seq: 0,
            tally: Tally::default(),
            salt: SaltCheck::default(),
            salt_mends: Vec::new(),
        }
    }

    /// The store's directory.
    fn dir(&self) -> &Path {
        &self.dir
    }

    /// After the `k`th writer died (`text`: its stdout, `ctx`: how), the
    /// store holds every acknowledged write and the op in flight before or
    /// after (see [`check_crashed`]).
    fn check(&mut self, kc: &Cli, k: u64, text: &str, ctx: &str) {
        let log = parse_log(text, self.seq);
        assert!(log.error.is_none(), "writer failed: {:?}", log.error);
        let (before, after, _) = models(&self.model, &log);
        let as_left = self.t.path().join(format!("as-left-{k}"));
        if self.salt_mends.len() < SALT_MENDS {
            copy_dir(&self.dir, &as_left);
        }
        let mended = self.tally.with_findings;
        self.model = check_crashed(kc, &self.dir, &before, &after, ctx, &mut self.tally);
        if as_left.exists() {
            if self.tally.with_findings > mended {
                self.salt_mends.push((as_left, self.model.clone()));
            } else {
                std::fs::remove_dir_all(&as_left).unwrap();
            }
        }
        self.seq = log.next_seq;
        if k % 10 == 9 {
            self.salt
                .add(&self.dir, self.t.path().join(format!("salt-{k}")));
        }
    }
}

impl KilledWriters {
    /// Salt's own writer mends a store as a kill left it, as keycache's
    /// next writer does: it stores a new key (and a denied key) into each
    /// copy kept by [`KilledWriters::check`], which opens the banks for
    /// writing (Salt's `_roster_recover`); the listing then shows exactly
    /// what the lookups find, and `verify` finds at most a deleted count
    /// off (Salt corrects the occupied count only). Returns how many
    /// copies.
    fn check_salt_mends(&self) -> usize {
        let id = "salt-mends.crash.example";
        let pem = common::pem(id, 300);
        for (dir, model) in &self.salt_mends {
            let ops = json!([
                {"op": "store", "bank": "keys", "id": id, "state": "accepted", "pub": pem},
                {"op": "store", "bank": "denied_keys", "id": id, "pub": pem},
            ]);
            common::salt(dir, &layout(), &["apply"], Some(&ops));
            let store = Store::open_with(dir, &opts()).unwrap();
            let mut want = model.clone();
            want.keys
                .insert(id.into(), ("accepted".into(), pem.clone()));
            want.denied.insert(id.into(), pem.clone());
            let ctx = dir.display();
            assert_eq!(listing(&store), want, "{ctx}: listed after Salt's write");
            let left: Vec<_> = findings(&store)
                .into_iter()
                .filter(|f| f.kind != keycache::verify::FindingKind::DeletedCount)
                .collect();
            assert!(left.is_empty(), "{ctx}: after Salt's write: {left:?}");
        }
        self.salt_mends.len()
    }
}
