//! Writes through etcd: every change of the key state is an etcd
//! transaction, and returns once this master's replica has applied the
//! revision it committed (a master reads its own writes), or fails.
//! Nothing is written locally: the replicator brings the commit in.
//!
//! A change that depends on the current state (`salt-key -a`: pending to
//! accepted) reads both banks' etcd keys of the id, decides, and commits
//! only if neither changed since the read (their `mod_revision`), reading
//! again when one did. A write of the Salt driver, whose decision was made
//! on the local replica, commits only if etcd's key has not changed after
//! the revision the replica holds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use keycache::snapshot::Bank;
use keycache::store::KeyState;
use keycache::MinionId;

use crate::connect::Settings;
use crate::error::{Error, Result};
use crate::layout::Value;
use crate::state::ReplicaState;

/// Ids per transaction: two keys each (etcd's default `--max-txn-ops` is
/// 128 operations per transaction).
pub const IDS_PER_TXN: usize = 60;
/// How many times a conditional write reads again after a conflict.
pub const TRIES: u32 = 8;

/// What etcd holds for one id: both banks' values and their revisions (0:
/// absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Current {
    /// The `keys` entry.
    pub key: Option<(KeyState, Vec<u8>)>,
    /// The `denied_keys` entry.
    pub denied: Option<Vec<u8>>,
    revs: [i64; 2],
}

/// What to do with one id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Leave it, and why.
    Skip(String),
    /// Write these (bank, new value or removal).
    Write(Vec<(Bank, Option<Value>)>),
}

/// The outcome of a write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Ids written.
    pub done: Vec<MinionId>,
    /// Ids left alone, and why.
    pub skipped: Vec<(MinionId, String)>,
    /// The last revision committed (0: nothing was).
    pub revision: i64,
}

/// Writes to the key state in etcd for the master whose store is `dir`.
pub struct Writer {
    settings: Settings,
    client: Client,
    dir: PathBuf,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("settings", &self.settings)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn bank_index(b: Bank) -> usize {
    match b {
        Bank::Keys => 0,
        Bank::Denied => 1,
    }
}

impl Writer {
    /// Connects to etcd for the store in `dir`.
    pub async fn connect(settings: Settings, dir: &Path) -> Result<Writer> {
        let client = settings.connect().await?;
        Ok(Writer {
            settings,
            client,
            dir: dir.to_path_buf(),
        })
    }

    /// Reads what etcd holds for `ids`, in one transaction.
    pub async fn read(&mut self, ids: &[MinionId]) -> Result<Vec<Current>> {
        let l = &self.settings.layout;
        let ops: Vec<TxnOp> = ids
            .iter()
            .flat_map(|id| {
                [Bank::Keys, Bank::Denied].map(|b| TxnOp::get(l.key(b, id), None::<GetOptions>))
            })
            .collect();
        let r = self
            .client
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(|e| self.settings.err("txn (read)", e))?;
        let mut out = vec![Current::default(); ids.len()];
        for (i, op) in r.op_responses().into_iter().enumerate() {
            let TxnOpResponse::Get(g) = op else { continue };
            let (c, bank) = (
                &mut out[i / 2],
                if i % 2 == 0 { Bank::Keys } else { Bank::Denied },
            );
            if let Some(kv) = g.kvs().first() {
                c.revs[bank_index(bank)] = kv.mod_revision();
                match Value::decode(bank, kv.value()) {
                    Ok(Value::Key(s, p)) => c.key = Some((s, p)),
                    Ok(Value::Denied(p)) => c.denied = Some(p),
                    // A value that grants nothing reads as absent, but its
                    // revision still guards the write.
                    Err(_) => {}
                }
            }
        }
        Ok(out)
    }

    /// Decides and writes each of `ids` (see [`Decision`]), in transactions
    /// of [`IDS_PER_TXN`] ids, each committed only if none of its keys
    /// changed since they were read; then waits for the replica.
    pub async fn update(
        &mut self,
        ids: &[MinionId],
        mut decide: impl FnMut(&MinionId, &Current) -> Decision,
    ) -> Result<Written> {
        let mut w = Written::default();
        for chunk in ids.chunks(IDS_PER_TXN) {
            let mut tries = 0;
            loop {
                tries += 1;
                let cur = self.read(chunk).await?;
                let l = &self.settings.layout;
                let (mut cmp, mut ops, mut done, mut skipped) = (vec![], vec![], vec![], vec![]);
                for (id, c) in chunk.iter().zip(&cur) {
                    match decide(id, c) {
                        Decision::Skip(why) => skipped.push((id.clone(), why)),
                        Decision::Write(changes) => {
                            for b in [Bank::Keys, Bank::Denied] {
                                cmp.push(Compare::mod_revision(
                                    l.key(b, id),
                                    CompareOp::Equal,
                                    c.revs[bank_index(b)],
                                ));
                            }
                            for (b, v) in changes {
                                ops.push(match v {
                                    Some(v) => TxnOp::put(l.key(b, id), v.encode(), None),
                                    None => TxnOp::delete(l.key(b, id), None),
                                });
                            }
                            done.push(id.clone());
                        }
                    }
                }
                if ops.is_empty() {
                    w.skipped.extend(skipped);
                    break;
                }
                let r = self
                    .client
                    .txn(Txn::new().when(cmp).and_then(ops))
                    .await
                    .map_err(|e| self.settings.err("txn (write)", e))?;
                if r.succeeded() {
                    w.revision = r.header().map_or(w.revision, |h| h.revision());
                    w.done.extend(done);
                    w.skipped.extend(skipped);
                    break;
                }
                if tries >= TRIES {
                    let key = String::from_utf8_lossy(&l.key(Bank::Keys, &chunk[0])).into_owned();
                    return Err(Error::Conflict { key, tries });
                }
            }
        }
        if w.revision > 0 {
            self.wait_applied(w.revision).await?;
        }
        Ok(w)
    }

    /// Writes (`Some`) or removes (`None`) one entry, as the Salt driver's
    /// `store` and `flush` do: committed only if etcd still holds what the
    /// local replica showed when the driver decided (`expected`: the
    /// replica's value, or `None` for absent), so that a change committed
    /// elsewhere that the replica has not applied yet (a revocation) is
    /// never overwritten. Waits for the replica.
    pub async fn put_if(
        &mut self,
        bank: Bank,
        id: &MinionId,
        expected: Option<&Value>,
        value: Option<Value>,
    ) -> Result<i64> {
        let key = self.settings.layout.key(bank, id);
        let guard = match expected {
            Some(v) => Compare::value(key.clone(), CompareOp::Equal, v.encode()),
            None => Compare::version(key.clone(), CompareOp::Equal, 0),
        };
        let op = match value {
            Some(v) => TxnOp::put(key.clone(), v.encode(), None),
            None => TxnOp::delete(key.clone(), None),
        };
        let r = self
            .client
            .txn(Txn::new().when([guard]).and_then([op]))
            .await
            .map_err(|e| self.settings.err("txn (write)", e))?;
        if !r.succeeded() {
            return Err(Error::Changed {
                key: String::from_utf8_lossy(&key).into_owned(),
            });
        }
        let revision = r.header().map_or(0, |h| h.revision());
        self.wait_applied(revision).await?;
        Ok(revision)
    }

    /// Waits until the replica in this writer's store directory holds
    /// `revision`, at most the write timeout.
    pub async fn wait_applied(&self, revision: i64) -> Result<()> {
        wait_applied(&self.dir, revision, self.settings.write_timeout).await
    }
}

/// Waits until the replica of `dir` holds `revision`, at most `timeout`.
pub async fn wait_applied(dir: &Path, revision: i64, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        let holds = ReplicaState::read(dir)?.map_or(0, |s| s.revision);
        if holds >= revision {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::NotApplied {
                dir: dir.to_path_buf(),
                revision,
                holds,
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}
