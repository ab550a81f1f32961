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
//!
//! A writer given an actor ([`Writer::set_actor`]) records every change in
//! the audit trail ([`crate::audit`]) in the change's own transaction: one
//! more put per transaction, of one `<prefix>audit/` key
//! ([`crate::Prefix::audit_key`]) holding the records of every id the
//! transaction changes (what was read against what the decision writes,
//! [`keycache::audit::Record::of_change`]). The record is committed with
//! the change or not at all, and reaches every master's log through its
//! replicator; by the time a write returns (its replica applied the
//! revision) it is in this master's log. A transaction retried after a
//! conflict records what it found on its last read. A driver write
//! ([`Writer::put_if`]) records the one entry it changes; one that finds
//! etcd already holding its value (another master's identical write)
//! records nothing: the other write did. Without an actor nothing is
//! recorded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use keycache::audit::{Entries, Record};
use keycache::store::KeyState;
use keycache::Bank;
use keycache::MinionId;

use crate::anchor::Verdict;
use crate::connect::Settings;
use crate::error::{Error, Result};
use crate::prefix::Value;
use crate::state::ReplicaState;

/// Ids per transaction: two keys each, and one audit key per transaction
/// (etcd's default `--max-txn-ops` is 128 operations per transaction).
pub const IDS_PER_TXN: usize = 60;
/// How many times a conditional write reads again after a conflict.
pub const TRIES: u32 = 8;
/// Transactions of one update in flight at once: etcd commits concurrent
/// proposals together, so more in flight means fewer WAL fsyncs for a
/// large update (a 10,000-key `salt-key -A` reached a second master in a
/// median 1.01 s with 32, 1.12 s with 8: docs/performance-notes.md).
pub const IN_FLIGHT: usize = 32;

/// One chunk's planned transaction.
#[derive(Default)]
struct Planned {
    cmp: Vec<Compare>,
    ops: Vec<TxnOp>,
    done: Vec<MinionId>,
    skipped: Vec<(MinionId, String)>,
}

/// What a read transaction of `n` ids found (see [`Writer::read`]).
fn currents(n: usize, r: &TxnResponse) -> Vec<Current> {
    let mut out = vec![Current::default(); n];
    for (i, op) in r.op_responses().into_iter().enumerate() {
        let TxnOpResponse::Get(g) = op else { continue };
        let bank = if i % 2 == 0 { Bank::Keys } else { Bank::Denied };
        let Some(c) = out.get_mut(i / 2) else {
            continue;
        };
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
    out
}

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
    /// Who the changes are recorded as ([`Writer::set_actor`]).
    actor: Option<keycache::audit::Actor>,
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
            actor: None,
        })
    }

    /// Records every change this writer commits in the cluster's audit
    /// trail as made by `actor`, in the change's own transaction (None:
    /// no record).
    pub fn set_actor(&mut self, actor: Option<keycache::audit::Actor>) {
        self.actor = actor;
    }

    /// Reads what etcd holds for `ids`, in one transaction.
    pub async fn read(&mut self, ids: &[MinionId]) -> Result<Vec<Current>> {
        let r = self
            .client
            .txn(self.read_txn(ids))
            .await
            .map_err(|e| self.settings.err("txn (read)", e))?;
        Ok(currents(ids.len(), &r))
    }

    /// The read-only transaction of both banks' keys of `ids`.
    fn read_txn(&self, ids: &[MinionId]) -> Txn {
        let l = &self.settings.layout;
        let ops: Vec<TxnOp> = ids
            .iter()
            .flat_map(|id| {
                [Bank::Keys, Bank::Denied].map(|b| TxnOp::get(l.key(b, id), None::<GetOptions>))
            })
            .collect();
        Txn::new().and_then(ops)
    }

    /// Runs `txns`, at most [`IN_FLIGHT`] at a time (etcd commits
    /// concurrent proposals together); the responses in the order given.
    async fn run_all(&self, txns: Vec<Txn>, op: &'static str) -> Result<Vec<TxnResponse>> {
        let mut out: Vec<Option<TxnResponse>> = (0..txns.len()).map(|_| None).collect();
        let mut set = tokio::task::JoinSet::new();
        let mut txns = txns.into_iter().enumerate();
        loop {
            while set.len() < IN_FLIGHT {
                let Some((i, t)) = txns.next() else { break };
                let mut c = self.client.clone();
                set.spawn(async move { (i, c.txn(t).await) });
            }
            let Some(done) = set.join_next().await else {
                break;
            };
            let (i, r) = done.map_err(|e| self.settings.err(op, e))?;
            out[i] = Some(r.map_err(|e| self.settings.err(op, e))?);
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Decides and writes each of `ids` (see [`Decision`]), in transactions
    /// of [`IDS_PER_TXN`] ids, [`IN_FLIGHT`] at a time, each committed only
    /// if none of its keys changed since they were read (a transaction that
    /// finds one changed is read, decided and tried again, up to [`TRIES`]
    /// times); then waits for the replica.
    pub async fn update(
        &mut self,
        ids: &[MinionId],
        mut decide: impl FnMut(&MinionId, &Current) -> Decision,
    ) -> Result<Written> {
        let chunks: Vec<&[MinionId]> = ids.chunks(IDS_PER_TXN).collect();
        let mut w = Written::default();
        let mut cluster = 0;
        let mut pending: Vec<usize> = (0..chunks.len()).collect();
        let mut tries = 0;
        while let Some(&first) = pending.first() {
            tries += 1;
            if tries > TRIES {
                let key = self.settings.layout.key(Bank::Keys, &chunks[first][0]);
                return Err(Error::Conflict {
                    key: String::from_utf8_lossy(&key).into_owned(),
                    tries: TRIES,
                });
            }
            let reads = pending.iter().map(|&i| self.read_txn(chunks[i])).collect();
            let reads = self.run_all(reads, "txn (read)").await?;
            let mut plans = Vec::new();
            for (&i, r) in pending.iter().zip(&reads) {
                let cur = currents(chunks[i].len(), r);
                let p = self.plan(chunks[i], &cur, &mut decide);
                if p.ops.is_empty() {
                    w.skipped.extend(p.skipped);
                } else {
                    plans.push((i, p));
                }
            }
            let txns = plans
                .iter_mut()
                .map(|(_, p)| {
                    Txn::new()
                        .when(std::mem::take(&mut p.cmp))
                        .and_then(std::mem::take(&mut p.ops))
                })
                .collect();
            let results = self.run_all(txns, "txn (write)").await?;
            pending.clear();
            for ((i, p), r) in plans.into_iter().zip(results) {
                if let Some(h) = r.header() {
                    cluster = h.cluster_id();
                }
                if r.succeeded() {
                    w.revision = w.revision.max(r.header().map_or(0, |h| h.revision()));
                    w.done.extend(p.done);
                    w.skipped.extend(p.skipped);
                } else {
                    pending.push(i);
                }
            }
        }
        if w.revision > 0 {
            self.wait_applied(cluster, w.revision).await?;
        }
        Ok(w)
    }

    /// The transaction of one chunk: `decide` on what was read, each write
    /// guarded by both banks' revisions of its id.
    fn plan(
        &self,
        chunk: &[MinionId],
        cur: &[Current],
        decide: &mut impl FnMut(&MinionId, &Current) -> Decision,
    ) -> Planned {
        let l = &self.settings.layout;
        let mut p = Planned::default();
        let now = SystemTime::now();
        let mut records = Vec::new();
        for (id, c) in chunk.iter().zip(cur) {
            match decide(id, c) {
                Decision::Skip(why) => p.skipped.push((id.clone(), why)),
                Decision::Write(changes) => {
                    for b in [Bank::Keys, Bank::Denied] {
                        let rev = c.revs[bank_index(b)];
                        p.cmp
                            .push(Compare::mod_revision(l.key(b, id), CompareOp::Equal, rev));
                    }
                    if let Some(actor) = &self.actor {
                        let before = Entries {
                            key: c.key.clone(),
                            denied: c.denied.clone(),
                        };
                        let mut after = before.clone();
                        for (b, v) in &changes {
                            set(&mut after, *b, v.as_ref());
                        }
                        records.extend(Record::of_change(actor, id.as_str(), &before, &after, now));
                    }
                    for (b, v) in changes {
                        p.ops.push(match v {
                            Some(v) => TxnOp::put(l.key(b, id), v.encode(), None),
                            None => TxnOp::delete(l.key(b, id), None),
                        });
                    }
                    p.done.push(id.clone());
                }
            }
        }
        if !records.is_empty() && !p.ops.is_empty() {
            p.ops.push(audit_put(&self.settings, now, &records));
        }
        p
    }

    /// Writes (`Some`) or removes (`None`) one entry, as the Salt driver's
    /// `store` and `flush` do: committed only if etcd still holds what the
    /// local replica showed when the driver decided (`expected`: the
    /// replica's value, or `None` for absent), so that a change committed
    /// elsewhere that the replica has not applied yet (a revocation) is
    /// never overwritten; a write whose value etcd already holds (another
    /// master wrote the same) succeeds without writing, and one whose value
    /// the replica already shows sends nothing. Waits for the replica.
    pub async fn put_if(
        &mut self,
        bank: Bank,
        id: &MinionId,
        expected: Option<&Value>,
        value: Option<Value>,
    ) -> Result<i64> {
        let key = self.settings.layout.key(bank, id);
        if expected == value.as_ref() {
            // The replica holds it already (Salt's cluster masters store a
            // peer's key change again on every master): nothing to write,
            // and no new revision for every master to apply.
            return Ok(ReplicaState::read(&self.dir)?.map_or(0, |s| s.revision));
        }
        let guard = match expected {
            Some(v) => Compare::value(key.clone(), CompareOp::Equal, v.encode()),
            None => Compare::version(key.clone(), CompareOp::Equal, 0),
        };
        let want = value.as_ref().map(Value::encode);
        let mut ops = vec![match &want {
            Some(v) => TxnOp::put(key.clone(), v.clone(), None),
            None => TxnOp::delete(key.clone(), None),
        }];
        if let Some(actor) = &self.actor {
            // The other bank is not read: left out of both sides.
            let (mut before, mut after) = (Entries::default(), Entries::default());
            set(&mut before, bank, expected);
            set(&mut after, bank, value.as_ref());
            let now = SystemTime::now();
            if let Some(r) = Record::of_change(actor, id.as_str(), &before, &after, now) {
                ops.push(audit_put(&self.settings, now, &[r]));
            }
        }
        let r = self
            .client
            .txn(
                Txn::new()
                    .when([guard])
                    .and_then(ops)
                    .or_else([TxnOp::get(key.clone(), None)]),
            )
            .await
            .map_err(|e| self.settings.err("txn (write)", e))?;
        let cluster = r.header().map_or(0, |h| h.cluster_id());
        let revision = if r.succeeded() {
            r.header().map_or(0, |h| h.revision())
        } else {
            // Changed since the replica read it; when etcd already holds
            // exactly what this write would (two masters taking one
            // minion's first sign-in at once), that is this write's
            // outcome: wait for it like for a commit of our own.
            let now = r.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
                _ => None,
            });
            match (now, &want) {
                (Some((v, rev)), Some(w)) if v == *w => rev,
                _ => {
                    return Err(Error::Changed {
                        key: String::from_utf8_lossy(&key).into_owned(),
                    })
                }
            }
        };
        self.wait_applied(cluster, revision).await?;
        Ok(revision)
    }

    /// Waits until the replica in this writer's store directory holds
    /// `revision` of the etcd cluster `cluster_id`, at most the write
    /// timeout (see [`wait_applied`]).
    pub async fn wait_applied(&self, cluster_id: u64, revision: i64) -> Result<()> {
        let mut client = self.client.clone();
        wait_applied(&mut client, &self.settings, &self.dir, cluster_id, revision).await
    }
}

/// Sets `bank`'s entry of `e` to `v` (None: absent; a value of the other
/// bank grants nothing there: absent too).
fn set(e: &mut Entries, bank: Bank, v: Option<&Value>) {
    match (bank, v) {
        (Bank::Keys, Some(Value::Key(s, p))) => e.key = Some((*s, p.clone())),
        (Bank::Keys, _) => e.key = None,
        (Bank::Denied, Some(Value::Denied(p))) => e.denied = Some(p.clone()),
        (Bank::Denied, _) => e.denied = None,
    }
}

/// The put of one transaction's audit key: `records` as JSON lines.
fn audit_put(settings: &Settings, now: SystemTime, records: &[Record]) -> TxnOp {
    let key = settings.layout.audit_key(now, crate::audit::nonce());
    TxnOp::put(key, crate::audit::value(records), None)
}

/// Waits until the replica of `dir` holds `revision` of the etcd cluster
/// `cluster_id` (0: any), at most the write timeout of `settings`. A
/// replica's word is taken only when its state was written for this store
/// ([`crate::state::Binding`]: not a copy's) and etcd's history still holds
/// the last change it applied ([`crate::anchor`]: not a history that etcd,
/// restored from a backup, left): a replica of another cluster, or of
/// another history, holds none of `revision`, whatever its number.
pub async fn wait_applied(
    client: &mut Client,
    settings: &Settings,
    dir: &Path,
    cluster_id: u64,
    revision: i64,
) -> Result<()> {
    let start = Instant::now();
    let timeout = settings.write_timeout;
    let mut pause = Duration::from_micros(200);
    // The anchor last checked, and what etcd said of it.
    let mut checked: Option<(i64, Option<crate::state::Anchor>, Verdict)> = None;
    let mut why = "is the replicator running for this store, on these endpoints?".to_owned();
    loop {
        let state =
            ReplicaState::read(dir)?.filter(|s| cluster_id == 0 || s.cluster_id == cluster_id);
        let holds = state.as_ref().map_or(0, |s| s.revision);
        if let Some(s) = state.filter(|s| s.revision >= revision) {
            if !s.belongs_to(dir) {
                why = format!(
                    "{} was not written for this store (a copy or a restore of the directory?): \
                     its replicator lists etcd again when it runs",
                    crate::state::path(dir).display()
                );
            } else {
                let fresh =
                    !matches!(&checked, Some((r, a, _)) if *r == s.revision && *a == s.anchor);
                if fresh {
                    let v = crate::anchor::verify(client, settings, s.anchor.as_ref(), s.revision)
                        .await?;
                    checked = Some((s.revision, s.anchor.clone(), v));
                }
                match checked.as_ref().map(|c| &c.2) {
                    Some(Verdict::Same) => return Ok(()),
                    Some(Verdict::Forked(w)) | Some(Verdict::Unknown(w)) => {
                        why = format!("{w}; its replicator lists etcd again when it runs")
                    }
                    None => {}
                }
            }
        }
        if start.elapsed() >= timeout {
            return Err(Error::NotApplied {
                dir: dir.to_path_buf(),
                revision,
                holds,
                waited_ms: start.elapsed().as_millis() as u64,
                why,
            });
        }
        tokio::time::sleep(pause).await;
        // A few reads of a small file a millisecond cost nothing next to a
        // write's wait; a longer pause would be paid by every write.
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}
