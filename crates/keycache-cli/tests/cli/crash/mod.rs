//! Crash safety: writers, compactions, migrations, merges and tree
//! writers killed at random moments, at system calls, or losing power.

mod journal;
mod kill;
mod merge;
mod ownership;
mod power_loss;
mod syscall;
mod tree;

use std::path::{Path, PathBuf};

use keycache_testkit::crash::{check_crashed, models, parse_log, Cli, Model, SaltCheck, Tally};

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
        self.model = check_crashed(kc, &self.dir, &before, &after, ctx, &mut self.tally);
        self.seq = log.next_seq;
        if k % 10 == 9 {
            self.salt
                .add(&self.dir, self.t.path().join(format!("salt-{k}")));
        }
    }
}
