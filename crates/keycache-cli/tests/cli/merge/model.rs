//! The merges' model test: isolated peers converge on one key state
//! through `keycache snapshot` and `keycache merge` (the README's timer
//! recipe: `--seen`, `--base` and `--write-base` given as the timers give
//! them), and no revoked key comes back.
//!
//! Two and three peers (stores in separate directories) get random
//! operations: new pending keys and denied keys written by Salt 3008.5's own
//! `mmap_key` writer (`salt_driver.py apply`, as a master's sign-in and
//! `salt-key` do), accepts through Salt's writer too, and `keycache
//! accept`, `reject` and `delete`; ids are shared between peers, so the same
//! id gets different keys on two peers. The peers first join one cluster
//! (peer 1 and peer 0 merge each other, every other peer merges peer 0
//! first, then peer 0 it); between phases, random pairwise merges (`keycache
//! snapshot` of one peer into `keycache merge` of another, by file and by
//! pipe); then rounds of merges of every ordered pair.
//!
//! Before each merge the merging peer's own snapshot is taken too, so that
//! both sides' versions (stamps, kinds, tombstones) are known; after the
//! merge the store equals what the model says: per (bank, id), the value
//! of the version that wins by the documented order (the later stamp, then
//! the more restrictive kind: absent, denied, rejected, pending, accepted;
//! then the greater hash), written with exit 0 and as many entries written
//! as values changed. At the end every pair of peers is identical
//! (`keycache diff` exits 0), and every key accepted was accepted by an
//! operation on some peer after the last revocation (reject or delete) of
//! its id on any peer: no revoked key comes back.

use crate::common;
use crate::common::{check_ok, pem, s, salt, small, Params, ParamsExt, Rng};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use keycache::history::{value_hash, Kind};
use keycache::snapshot::{Bank, Snapshot};
use serde_json::{json, Value};

/// (bank, id) -> (state, key): a peer's store as the model sees it. The
/// state is `accepted`, `pending`, `rejected`, or `denied` for the
/// `denied_keys` bank.
type Model = BTreeMap<(Bank, String), (&'static str, String)>;

fn layout() -> Params {
    small(1009, 1 << 20)
}

/// Runs the keycache binary with the test layout; rebuilds do not wait
/// (no Salt process maps the files meanwhile).
fn kc(args: &[&str]) -> Output {
    common::kc()
        .args(args)
        .layout(&layout())
        .no_settle()
        .output()
}

fn ok(out: &Output, what: &str) {
    check_ok(what, out);
}

fn state_name(s: &str) -> &'static str {
    match s {
        "accepted" => "accepted",
        "pending" => "pending",
        "rejected" => "rejected",
        other => panic!("state {other:?}"),
    }
}

/// What the store of `dir` holds, read by the library (which writes
/// nothing: no observation of the store).
fn read(dir: &Path) -> Model {
    let d = common::kc_dump(dir, &layout());
    let mut m = Model::new();
    for (id, e) in d["keys"].as_object().expect("keys") {
        let st = state_name(e["state"].as_str().expect("a state"));
        let key = e["pub"].as_str().expect("a key").to_owned();
        m.insert((Bank::Keys, id.clone()), (st, key));
    }
    for (id, e) in d["denied_keys"].as_object().expect("denied_keys") {
        let key = e[0].as_str().expect("a key").to_owned();
        m.insert((Bank::Denied, id.clone()), ("denied", key));
    }
    m
}

// --- The merge rule, as the model states it ----------------------------

/// A version: (stamp, how restrictive the kind is, hash of the value), and
/// the value (None: a tombstone).
type Ver = ((u64, u8, u64), Option<(&'static str, String)>);

/// The versions of a snapshot's entries (tombstones included).
fn versions(snap: &Snapshot) -> BTreeMap<(Bank, String), Ver> {
    snap.entries
        .iter()
        .map(|e| {
            let (rank, val) = match e.kind {
                Kind::Accepted => (0, Some("accepted")),
                Kind::Pending => (1, Some("pending")),
                Kind::Rejected => (2, Some("rejected")),
                Kind::Denied => (3, Some("denied")),
                Kind::Absent => (4, None),
            };
            let hash = if val.is_some() {
                value_hash(e.kind, &e.pub_key)
            } else {
                0
            };
            let key = String::from_utf8(e.pub_key.clone()).expect("a PEM key");
            (
                (e.bank, e.id.clone()),
                ((e.stamp, rank, hash), val.map(|v| (v, key))),
            )
        })
        .collect()
}

/// The merge of their snapshot into ours: per (bank, id), the value of the
/// version that wins (the greater (stamp, rank, hash)).
fn model_merge(ours: &Snapshot, theirs: &Snapshot) -> Model {
    let (o, t) = (versions(ours), versions(theirs));
    let keys: BTreeSet<&(Bank, String)> = o.keys().chain(t.keys()).collect();
    let mut out = Model::new();
    for k in keys {
        let win = match (o.get(k), t.get(k)) {
            (Some(a), Some(b)) => {
                if b.0 > a.0 {
                    b
                } else {
                    a
                }
            }
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => unreachable!(),
        };
        if let Some(v) = &win.1 {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

// --- Peers and their operations -----------------------------------------

/// What an operation did to an id, for the end's check.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// An operator (Salt's writer or `keycache accept`) accepted this key.
    Accept(String),
    /// An operator rejected or deleted the id.
    Revoke,
    /// Salt's writer put a pending key (a sign-in): a change, not an
    /// operator's action.
    Write,
}

/// When an event can have happened, as the stores' stamps tell (on the
/// counter of events and observations, [`Peers::clock`]), and what it left.
#[derive(Debug, Clone)]
struct Times {
    serial: u64,
    /// The peer it was made on ([`TREE`]: the tree both were made from).
    peer: usize,
    id: String,
    /// The earliest stamp a store gives it: an accept's, the last
    /// observation before it or the store's making; else the event itself.
    lower: u64,
    /// The latest: an accept's, the event itself; else the next
    /// observation of its peer (0 for a pending key a store was made with).
    upper: u64,
    /// The `keys` value it left (None: no entry).
    result: Option<(&'static str, String)>,
    operator: bool,
}

/// The peer of the events of a `localfs_key` tree that stores are made from.
const TREE: usize = usize::MAX;

struct Peers {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    dirs: Vec<PathBuf>,
    models: Vec<Model>,
    /// Every operation on an id, in the order they ran (they run one at a
    /// time): (id, event).
    events: Vec<(String, Event)>,
    /// Per peer, the ids its history has a version of (live or a
    /// tombstone): the ids of its snapshots, and of the snapshots merged
    /// into it.
    known: Vec<BTreeSet<String>>,
    keys_made: u64,
    merges: usize,
    /// Merges that took an accepted key out of accepted (a revocation that
    /// won), and that replaced a key by another one.
    revoked: usize,
    rekeyed: usize,
    /// Beside `events`, when each happened.
    times: Vec<Times>,
    /// Per peer, the serials of the events it knows of: its own, and those
    /// its peers knew of when it merged their snapshots.
    knows: Vec<BTreeSet<u64>>,
    /// A counter of events and observations, in the order they run.
    clock: u64,
    /// Per peer, the counter at its last observation, and at its making
    /// (0: never made; its history begins at its first observation).
    last_obs: Vec<u64>,
    made: Vec<u64>,
    /// Merges that changed an operator's value and were checked.
    undo_checks: usize,
}

const IDS: [&str; 10] = [
    "web-01", "web-02", "web-03", "db-01", "db-02", "cache-1", "cache-2", "mq-1", "mq-2", "edge",
];

impl Peers {
    fn new(n: usize) -> Peers {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let dirs: Vec<PathBuf> = (0..n)
            .map(|i| {
                let d = root.join(format!("peer-{i}"));
                std::fs::create_dir(&d).expect("mkdir");
                // Masters of one cluster: one master key pair.
                std::fs::write(d.join("master.pub"), common::pem("the-cluster", 451))
                    .expect("master.pub");
                d
            })
            .collect();
        Peers {
            _tmp: tmp,
            root,
            dirs,
            models: vec![Model::new(); n],
            events: Vec::new(),
            known: vec![BTreeSet::new(); n],
            keys_made: 0,
            merges: 0,
            revoked: 0,
            rekeyed: 0,
            times: Vec::new(),
            knows: vec![BTreeSet::new(); n],
            clock: 0,
            last_obs: vec![0; n],
            made: vec![0; n],
            undo_checks: 0,
        }
    }

    /// Records an event on peer `p` (or [`TREE`]) and when it can have
    /// happened.
    fn event(&mut self, p: usize, id: &str, ev: Event, result: Option<(&'static str, String)>) {
        self.clock += 1;
        let (lower, upper) = match ev {
            Event::Accept(_) if p != TREE => (self.last_obs[p].max(self.made[p]), self.clock),
            Event::Accept(_) => (0, self.clock),
            _ => (self.clock, u64::MAX),
        };
        let operator = ev != Event::Write;
        self.events.push((id.to_owned(), ev));
        self.times.push(Times {
            serial: self.clock,
            peer: p,
            id: id.to_owned(),
            lower,
            upper,
            result,
            operator,
        });
        if p == TREE {
            for k in &mut self.knows {
                k.insert(self.clock);
            }
        } else {
            self.knows[p].insert(self.clock);
        }
    }

    /// Peer `p` observed its store (a snapshot or a merge).
    fn observed(&mut self, p: usize) {
        self.clock += 1;
        self.last_obs[p] = self.clock;
        for t in &mut self.times {
            if t.peer == p && t.upper == u64::MAX {
                t.upper = self.clock;
            }
        }
    }

    /// Peer `p`'s store was made (its history began): the values it holds
    /// are as old as can be, but revocations (stamped at the making).
    fn made_now(&mut self, p: usize) {
        self.clock += 1;
        self.made[p] = self.clock;
        self.last_obs[p] = self.clock;
        for t in &mut self.times {
            if (t.peer == p || t.peer == TREE) && t.upper == u64::MAX {
                t.upper = if t.operator { self.clock } else { 0 };
            }
        }
    }

    /// The invariant beside "no revoked key comes back": a merge of peer
    /// `j` into peer `i` that changes the `keys` value an operator's action
    /// left on `i` (the last event of the id `i` knows of) does so only
    /// when `j` knew of an event of the id that may have come after it.
    fn check_not_undone(&mut self, i: usize, j: usize, want: &Model) {
        let ids: BTreeSet<String> = self.models[i]
            .keys()
            .chain(want.keys())
            .filter(|k| k.0 == Bank::Keys)
            .map(|k| k.1.clone())
            .collect();
        for id in ids {
            let k = (Bank::Keys, id.clone());
            let before = self.models[i].get(&k).cloned();
            if before == want.get(&k).cloned() {
                continue;
            }
            let last = self
                .times
                .iter()
                .filter(|t| t.id == id && self.knows[i].contains(&t.serial))
                .max_by_key(|t| t.serial);
            let Some(a) = last else { continue };
            if !a.operator || a.result != before {
                continue;
            }
            let excused = self.times.iter().any(|e| {
                e.id == id
                    && e.serial != a.serial
                    && self.knows[j].contains(&e.serial)
                    && e.upper > a.lower
            });
            assert!(
                excused,
                "peer {i} merging peer {j}: {id}'s {:?} (an operator's action, {a:?}) undone by a \
                 peer that never saw a later change of {id}; now {:?}",
                before.map(|v| v.0),
                want.get(&k).map(|v| v.0)
            );
            self.undo_checks += 1;
        }
    }

    fn fresh_key(&mut self, id: &str) -> String {
        self.keys_made += 1;
        pem(
            &format!("{id}-{}", self.keys_made),
            120 + (self.keys_made % 7) as usize * 30,
        )
    }

    /// Random operations on peer `p`: some through Salt's writer (one
    /// driver run), the rest through the CLI, in that order.
    fn random_ops(&mut self, rng: &mut Rng, p: usize, n: usize) {
        let mut salt_ops = Vec::new();
        let mut model = self.models[p].clone();
        let mut events = Vec::new();
        // Salt's writer: sign-ins (new pending keys, a key presented under an
        // id that holds another one goes to denied_keys), salt-key -a.
        for _ in 0..n / 2 {
            let id = *rng.pick(&IDS);
            let held = model.get(&(Bank::Keys, id.to_owned())).cloned();
            match (held, rng.below(3)) {
                (None, _) => {
                    let key = self.fresh_key(id);
                    salt_ops.push(json!({"op": "store", "bank": "keys", "id": id, "state": "pending", "pub": key}));
                    events.push((id.to_owned(), Event::Write, Some(("pending", key.clone()))));
                    model.insert((Bank::Keys, id.into()), ("pending", key));
                }
                (Some((_, _)), 0) => {
                    let key = self.fresh_key(id);
                    salt_ops
                        .push(json!({"op": "store", "bank": "denied_keys", "id": id, "pub": key}));
                    model.insert((Bank::Denied, id.into()), ("denied", key));
                }
                (Some(("pending", key)), _) => {
                    salt_ops.push(json!({"op": "store", "bank": "keys", "id": id, "state": "accepted", "pub": key}));
                    events.push((
                        id.to_owned(),
                        Event::Accept(key.clone()),
                        Some(("accepted", key.clone())),
                    ));
                    model.insert((Bank::Keys, id.into()), ("accepted", key));
                }
                _ => {}
            }
        }
        if !salt_ops.is_empty() {
            salt(
                &self.dirs[p],
                &layout(),
                &["apply"],
                Some(&Value::Array(salt_ops)),
            );
        }
        for (id, ev, result) in events {
            self.event(p, &id, ev, result);
        }
        // keycache accept, reject, delete. A revocation is one the store's
        // history can find: in a store that has a history, every one (an
        // id that a sign-in brought and a deletion removed between two
        // observations is in the removal log); in one that has none yet
        // (it never took a snapshot or merged), of an id still there at
        // its first observation.
        let dir = self.dirs[p].clone();
        let mut revokes: Vec<String> = Vec::new();
        for _ in 0..n - n / 2 {
            let id = *rng.pick(&IDS);
            let held = model.get(&(Bank::Keys, id.to_owned())).cloned();
            let op = match (&held, rng.below(4)) {
                (Some(("pending", _)), 0 | 1) => "accept",
                (Some(("pending", _)), 2) => "reject",
                (Some(_), 3) | (None, 3) => "delete",
                (Some(("rejected", _)), _) => "delete",
                _ => continue,
            };
            if op == "delete" && held.is_none() && !model.contains_key(&(Bank::Denied, id.into())) {
                continue;
            }
            ok(
                &kc(&[op, s(&dir), id]),
                &format!("keycache {op} {id} on peer {p}"),
            );
            match op {
                "accept" => {
                    let key = held.map(|h| h.1).unwrap_or_default();
                    let result = Some(("accepted", key.clone()));
                    self.event(p, id, Event::Accept(key.clone()), result);
                    model.insert((Bank::Keys, id.into()), ("accepted", key));
                }
                "reject" => {
                    let key = held.map(|h| h.1).unwrap_or_default();
                    self.event(p, id, Event::Revoke, Some(("rejected", key.clone())));
                    revokes.push(id.to_owned());
                    model.insert((Bank::Keys, id.into()), ("rejected", key));
                }
                _ => {
                    // A revocation when it removes a keys entry (not only a
                    // denied key).
                    if held.is_some() {
                        self.event(p, id, Event::Revoke, None);
                        revokes.push(id.to_owned());
                    }
                    model.remove(&(Bank::Keys, id.into()));
                    model.remove(&(Bank::Denied, id.into()));
                }
            }
        }
        // The revocations the history cannot find are taken back.
        let joined = dir.join(keycache::format::IDENTITY_FILE).exists();
        for id in revokes {
            let found = joined
                || self.known[p].contains(&id)
                || model.contains_key(&(Bank::Keys, id.clone()));
            if !found {
                let at = self
                    .events
                    .iter()
                    .rposition(|(x, e)| *x == id && *e == Event::Revoke)
                    .expect("the revocation");
                self.events.remove(at);
                self.times.remove(at);
            }
        }
        self.models[p] = model;
        assert_eq!(
            read(&self.dirs[p]),
            self.models[p],
            "peer {p} after its operations"
        );
    }

    /// Peer `i` merges peer `j`'s snapshot by the timer recipe (the base of
    /// the last merge from `j`, `j`'s base for `i` as --seen), by a pipe
    /// or through a file; `i`'s own snapshot is taken first, for the model.
    fn merge(&mut self, i: usize, j: usize, pipe: bool) {
        let base = self.root.join(format!("base-{i}-from-{j}"));
        let seen = self.root.join(format!("base-{j}-from-{i}"));
        let own = self.root.join(format!("own-{i}.snap"));
        let theirs = self.root.join(format!("snap-{j}"));
        self.observed(i);
        self.observed(j);
        ok(
            &kc(&["snapshot", s(&self.dirs[i]), "-o", s(&own)]),
            "keycache snapshot (ours)",
        );
        let mut margs: Vec<String> = vec!["merge".into(), s(&self.dirs[i]).into()];
        let out = if pipe {
            margs.push("-".into());
            margs.extend(["--base".into(), s(&base).into()]);
            margs.extend(["--write-base".into(), s(&base).into(), "--json".into()]);
            let lay = layout().args().join(" ");
            let bin = env!("CARGO_BIN_EXE_keycache");
            let script = format!(
                "set -o pipefail; '{bin}' snapshot '{}' --seen '{}' {lay} | tee '{}' | '{bin}' {} \
                 {lay}",
                s(&self.dirs[j]),
                s(&seen),
                s(&theirs),
                margs
                    .iter()
                    .map(|a| format!("'{a}'"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            Command::new("bash")
                .arg("-c")
                .arg(script)
                .env("KEYCACHE_REBUILD_SETTLE_MS", "0")
                .output()
                .expect("run the pipe")
        } else {
            ok(
                &kc(&[
                    "snapshot",
                    s(&self.dirs[j]),
                    "-o",
                    s(&theirs),
                    "--seen",
                    s(&seen),
                ]),
                "keycache snapshot (theirs)",
            );
            margs.push(s(&theirs).into());
            margs.extend(["--base".into(), s(&base).into()]);
            margs.extend(["--write-base".into(), s(&base).into(), "--json".into()]);
            let refs: Vec<&str> = margs.iter().map(String::as_str).collect();
            kc(&refs)
        };
        let code = out.status.code();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "merge {i}<-{j}: not JSON ({e}), exit {code:?}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(code, Some(0), "merge {i}<-{j}: {report}");
        assert!(base.exists(), "merge {i}<-{j} wrote no base");
        self.merges += 1;
        let ours = Snapshot::read_file(&own).expect("our snapshot");
        let theirs = Snapshot::read_file(&theirs).expect("their snapshot");
        let want = model_merge(&ours, &theirs);
        for e in ours.entries.iter().chain(&theirs.entries) {
            if e.bank == Bank::Keys {
                self.known[i].insert(e.id.clone());
            }
        }
        for e in &theirs.entries {
            if e.bank == Bank::Keys {
                self.known[j].insert(e.id.clone());
            }
        }
        let got = read(&self.dirs[i]);
        assert_eq!(
            got, want,
            "peer {i} after merging peer {j} (pipe: {pipe}); plan: {report:#}"
        );
        assert_eq!(
            report["written"].as_u64(),
            Some(count_changes(&self.models[i], &want)),
            "{report:#}"
        );
        for (k, (st, key)) in &self.models[i] {
            if *st == "accepted" && k.0 == Bank::Keys {
                match want.get(k) {
                    Some(("accepted", k2)) if k2 != key => self.rekeyed += 1,
                    Some(("accepted", _)) => {}
                    _ => self.revoked += 1,
                }
            }
        }
        self.check_not_undone(i, j, &want);
        let theirs_known = self.knows[j].clone();
        self.knows[i].extend(theirs_known);
        self.models[i] = want;
        // Every key accepted here was accepted by an operator somewhere.
        for ((bank, id), (state, key)) in &self.models[i] {
            if *bank == Bank::Keys && *state == "accepted" {
                assert!(
                    self.events
                        .iter()
                        .any(|(x, e)| x == id && *e == Event::Accept(key.clone())),
                    "peer {i}: {id} accepted with a key no operator accepted"
                );
            }
        }
    }

    fn all_same(&self) -> bool {
        self.models.windows(2).all(|w| w[0] == w[1])
    }

    /// Peer 1 and peer 0 merge each other (until both joined one
    /// cluster), every other peer merges peer 0, then peer 0 it.
    fn join(&mut self, rng: &mut Rng) {
        self.merge(1, 0, rng.one_in(2));
        self.merge(0, 1, rng.one_in(2));
        self.merge(1, 0, rng.one_in(2));
        for k in 2..self.dirs.len() {
            self.merge(k, 0, rng.one_in(2));
            self.merge(0, k, rng.one_in(2));
        }
    }

    /// Every ordered pair merges, in rounds, until the model says all peers
    /// agree (at most `rounds`).
    fn converge(&mut self, rng: &mut Rng, rounds: usize) {
        let n = self.dirs.len();
        for _ in 0..rounds {
            for i in 0..n {
                for j in 0..n {
                    if i != j {
                        self.merge(i, j, rng.one_in(3));
                    }
                }
            }
            if self.all_same() {
                return;
            }
        }
        let short =
            |v: Option<&(&'static str, String)>| v.map(|(st, k)| format!("{st} {}", &k[27..40]));
        let mut report = String::new();
        let keys: BTreeSet<_> = self.models.iter().flat_map(|m| m.keys()).collect();
        for k in keys {
            let vals: Vec<_> = self.models.iter().map(|m| short(m.get(k))).collect();
            if vals.windows(2).any(|w| w[0] != w[1]) {
                report.push_str(&format!("{k:?}: peers {vals:?}\n"));
            }
        }
        panic!("the peers did not converge in {rounds} rounds:\n{report}");
    }

    /// The end: every pair identical by `keycache diff`, equal to the
    /// model, and every accepted key accepted by an operator after the
    /// last revocation of its id.
    fn check_end(&self) {
        for (i, d) in self.dirs.iter().enumerate() {
            assert_eq!(read(d), self.models[i], "peer {i}");
            for j in i + 1..self.dirs.len() {
                let out = kc(&["diff", s(d), s(&self.dirs[j])]);
                check_ok(&format!("diff peer {i} peer {j}"), &out);
            }
            for ((bank, id), (state, key)) in &self.models[i] {
                if *bank != Bank::Keys || *state != "accepted" {
                    continue;
                }
                let last_revoke = self
                    .events
                    .iter()
                    .rposition(|(x, e)| x == id && *e == Event::Revoke);
                let accepted_after = self.events.iter().enumerate().any(|(n, (x, e))| {
                    x == id && *e == Event::Accept(key.clone()) && last_revoke.is_none_or(|r| n > r)
                });
                assert!(
                    accepted_after,
                    "peer {i}: {id} accepted with a key no operator accepted after the last \
                     revocation of {id} (a revoked key came back); {id}'s events: {:#?}",
                    self.events
                        .iter()
                        .filter(|(x, _)| x == id)
                        .map(|(_, e)| match e {
                            Event::Accept(k) => format!("accept {}", &k[27..45]),
                            Event::Revoke => "revoke".into(),
                            Event::Write => "sign-in".into(),
                        })
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}

/// Entries whose value differs between two models.
fn count_changes(a: &Model, b: &Model) -> u64 {
    let keys: BTreeSet<_> = a.keys().chain(b.keys()).collect();
    keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).count() as u64
}

/// The seeds to run: `fixed`, then as many more as
/// `KEYCACHE_MERGE_MODEL_SEEDS` says (a longer soak; 0 by default).
fn seeds(fixed: &[u64]) -> Vec<u64> {
    let more = std::env::var("KEYCACHE_MERGE_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    fixed
        .iter()
        .copied()
        .chain((0..more).map(|n| 1000 + n))
        .collect()
}

/// One run: returns (merges, revocations that won, keys replaced).
fn run(peers: usize, seed: u64, phases: usize) -> (usize, usize, usize) {
    let mut rng = Rng::new(seed);
    let mut p = Peers::new(peers);
    for i in 0..peers {
        p.random_ops(&mut rng, i, 8);
    }
    run_from(p, rng, phases)
}

/// Copies every regular file of peer `from`'s store into peer `to`'s (empty)
/// directory, as an operator copies a pki dir to set up a second master: the
/// copy holds what the original held, its history included.
fn copy_peer(p: &mut Peers, from: usize, to: usize) {
    for f in std::fs::read_dir(&p.dirs[from]).expect("ls") {
        let f = f.expect("entry");
        if f.file_type().expect("type").is_file() {
            std::fs::copy(f.path(), p.dirs[to].join(f.file_name())).expect("copy");
        }
    }
    p.models[to] = p.models[from].clone();
    p.known[to] = p.known[from].clone();
    p.knows[to] = p.knows[from].clone();
    p.last_obs[to] = p.last_obs[from];
    p.made[to] = p.made[from];
}

/// A second master set up as a copy of the first's store (made by `keycache
/// compact`, which begins its history), then operators' accepts, rejects and
/// deletes on both before the first merge.
fn run_copied(seed: u64, phases: usize) -> (usize, usize, usize) {
    let mut rng = Rng::new(seed);
    let mut p = Peers::new(2);
    p.random_ops(&mut rng, 0, 12);
    ok(&kc(&["compact", s(&p.dirs[0])]), "keycache compact");
    p.made_now(0);
    copy_peer(&mut p, 0, 1);
    for i in 0..2 {
        p.random_ops(&mut rng, i, 10);
    }
    run_from(p, rng, phases)
}

/// Two stores made by migrating one `localfs_key` tree twice (peer 1 after
/// peer 0 got operators' changes), then changes on both before the first
/// merge.
fn run_migrated_twice(seed: u64, phases: usize) -> (usize, usize, usize) {
    let mut rng = Rng::new(seed);
    let mut p = Peers::new(2);
    let tree = p.root.join("tree");
    for sub in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        std::fs::create_dir_all(tree.join(sub)).expect("mkdir");
    }
    for id in IDS {
        let key = p.fresh_key(id);
        let (sub, ev, result) = match rng.below(4) {
            0 => (
                "minions",
                Event::Accept(key.clone()),
                Some(("accepted", key.clone())),
            ),
            1 => (
                "minions_rejected",
                Event::Revoke,
                Some(("rejected", key.clone())),
            ),
            2 => continue,
            _ => ("minions_pre", Event::Write, Some(("pending", key.clone()))),
        };
        std::fs::write(tree.join(sub).join(id), &key).expect("write");
        p.event(TREE, id, ev, result);
    }
    for i in 0..2 {
        ok(
            &kc(&["migrate", s(&tree), "--out", s(&p.dirs[i])]),
            "keycache migrate",
        );
        p.made_now(i);
        p.models[i] = read(&p.dirs[i]);
        p.random_ops(&mut rng, i, 10);
    }
    p.random_ops(&mut rng, 0, 6);
    run_from(p, rng, phases)
}

/// The rest of a run: the peers join, then phases of changes and merges,
/// then rounds until they agree.
fn run_from(mut p: Peers, mut rng: Rng, phases: usize) -> (usize, usize, usize) {
    let peers = p.dirs.len();
    p.join(&mut rng);
    for phase in 0..phases {
        for i in 0..peers {
            p.random_ops(&mut rng, i, 8);
        }
        // A few random pairwise merges: partial, uneven exchange.
        for _ in 0..peers + phase {
            let i = rng.below(peers as u64) as usize;
            let j = (i + 1 + rng.below(peers as u64 - 1) as usize) % peers;
            p.merge(i, j, rng.one_in(2));
        }
    }
    // Quiet: rounds of every ordered pair.
    p.converge(&mut rng, 3);
    p.check_end();
    // Local changes after convergence travel too, deletions included.
    let id = IDS[0];
    if p.models[0].contains_key(&(Bank::Keys, id.into())) {
        ok(&kc(&["delete", s(&p.dirs[0]), id]), "delete");
        p.event(0, id, Event::Revoke, None);
        p.models[0].remove(&(Bank::Keys, id.into()));
        p.models[0].remove(&(Bank::Denied, id.into()));
        p.converge(&mut rng, 2);
        assert!(p
            .models
            .iter()
            .all(|m| !m.contains_key(&(Bank::Keys, id.into()))));
        p.check_end();
    }
    (p.merges, p.revoked, p.rekeyed)
}

#[test]
fn two_peers_converge_on_the_model() {
    let mut merges = 0;
    for seed in seeds(&[1, 2]) {
        merges += run(2, seed, 3).0;
    }
    assert!(merges >= 10, "{merges} merges");
}

#[test]
fn three_peers_converge_on_the_model() {
    let (mut merges, mut revoked, mut rekeyed) = (0, 0, 0);
    for seed in seeds(&[11, 12]) {
        let (m, r, k) = run(3, seed, 3);
        merges += m;
        revoked += r;
        rekeyed += k;
    }
    // The same ids get keys and revocations on several peers: merges must
    // take accepted keys out of accepted, and replace keys, for the test
    // to exercise the order of versions.
    assert!(
        revoked > 0 && rekeyed > 0,
        "in {merges} merges: {revoked} revocations taken, {rekeyed} keys replaced"
    );
}

#[test]
fn a_store_copied_from_another_and_a_tree_migrated_twice_keep_every_action() {
    // "No operator action undone by a peer that never saw a later one" is
    // asserted in every merge (`Peers::check_not_undone`).
    let mut merges = 0;
    for seed in seeds(&[21, 22, 23]) {
        merges += run_copied(seed, 2).0;
        merges += run_migrated_twice(seed + 100, 2).0;
    }
    assert!(merges >= 20, "{merges} merges");
}

#[test]
fn a_new_peer_catches_up_then_merges_like_the_others() {
    let mut rng = Rng::new(99);
    let mut p = Peers::new(3);
    for i in 0..2 {
        p.random_ops(&mut rng, i, 10);
    }
    // Peers 0 and 1 agree first; peer 2 is new and empty.
    p.merge(1, 0, false);
    p.merge(0, 1, false);
    p.merge(1, 0, false);
    assert!(p.models[0] == p.models[1]);
    // The new peer's first merge takes everything.
    p.merge(2, 0, true);
    assert_eq!(p.models[2], p.models[0]);
    p.random_ops(&mut rng, 2, 6);
    p.converge(&mut rng, 3);
    p.check_end();
}
