//! The model of the etcd model test: each operation, what came of it, and
//! the checks of a key state (etcd's, or a replica's) against them.
//!
//! Every operation is a kind ([`Kind`]) whose effect on an id is fixed (a
//! sign-in puts a pending key, an accept an accepted one, a delete removes
//! both banks' entries, ...), and an outcome ([`Outcome`]): committed at a
//! known revision, refused, or unknown (a timeout: it may have committed,
//! at any revision, or not at all). From those, each etcd key gets its
//! writes, definite or possible, and:
//!
//! - [`Model::check_etcd`]: every value etcd holds was (possibly) written
//!   by an operation at the very revision etcd shows as its last change,
//!   and no operation definitely wrote the key after it; a key etcd does not
//!   hold was (possibly) deleted after its last definite put;
//! - [`Model::check_history`]: each definite write found what it needed
//!   (an accept an entry, a sign-in none), as etcd ordered the writes;
//! - [`Model::check_accepted`]: no id is accepted unless an accept of it
//!   (possibly) committed after its last definite reject or delete.
//!
//! An unknown outcome counts as possibly applied (it may explain a value)
//! and never as definitely applied (it never forbids one): conservative in
//! both directions; its revision is bounded as [`When::Between`] says.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

/// The phase name of the barrier writes (see [`When::Between`]).
pub const BARRIER: &str = "barrier";

/// The operations of a key shown in a message: the last ones.
const HISTORY: usize = 12;

/// A bank of the key state in etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum B {
    /// `keys`.
    Keys,
    /// `denied_keys`.
    Denied,
}

impl B {
    pub fn name(self) -> &'static str {
        match self {
            B::Keys => "keys",
            B::Denied => "denied_keys",
        }
    }
}

/// What an entry holds: a `keys` state, or a denied key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum St {
    Accepted,
    Pending,
    Rejected,
    Denied,
}

/// The kind of an operation. The Salt driver's operations, when it writes
/// through etcd, are kinds of their own here, with their effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A minion's sign-in: a pending key, put only if the id is absent from
    /// `keys` (the driver's `store` of a new minion key).
    SignIn,
    /// A key put into `denied_keys` only if absent there (the driver's
    /// `store` of a key that is not the accepted one).
    Deny,
    /// `keycache accept -c`.
    Accept,
    /// `keycache reject -c`.
    Reject,
    /// `keycache delete -c`.
    Delete,
    /// The driver's `flush` of `keys` (the first half of salt-key -d).
    FlushKeys,
    /// The driver's `flush` of `denied_keys` (its second half).
    FlushDenied,
}

impl Kind {
    /// What the operation does to each id it was done for: per bank, the
    /// new value or a removal.
    pub fn effects(self) -> &'static [(B, Option<St>)] {
        match self {
            Kind::SignIn => &[(B::Keys, Some(St::Pending))],
            Kind::Deny => &[(B::Denied, Some(St::Denied))],
            Kind::Accept => &[(B::Keys, Some(St::Accepted))],
            Kind::Reject => &[(B::Keys, Some(St::Rejected))],
            Kind::Delete => &[(B::Keys, None), (B::Denied, None)],
            Kind::FlushKeys => &[(B::Keys, None)],
            Kind::FlushDenied => &[(B::Denied, None)],
        }
    }
}

/// Which ids an operation names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Ids(Vec<String>),
    /// `--all`: ids taken from the master's replica (any id of the test).
    All,
}

/// What came of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// etcd committed it at `revision` for `ids` (none and revision 0:
    /// every id was skipped, nothing was sent).
    Done { ids: Vec<String>, revision: i64 },
    /// etcd committed it at `revision` for some of the target's ids (which
    /// ones is not known: the command failed waiting for its replica).
    Committed { revision: i64 },
    /// etcd refused it (its compare failed): nothing written.
    Refused,
    /// It failed before anything could be written: no connection to etcd
    /// could be made (`tcp connect error`: nothing was sent), or the read
    /// that decides the write failed.
    NotWritten,
    /// It failed: it may have committed, or not.
    Unknown,
}

/// One operation and its outcome.
#[derive(Debug, Clone)]
pub struct Rec {
    pub phase: &'static str,
    pub worker: usize,
    pub master: usize,
    pub kind: Kind,
    /// Made through `salt.cache.Cache` and the keycache driver (Salt's own
    /// code paths, `key_ops.py`), not the CLI or the etcd writer.
    pub driver: bool,
    pub target: Target,
    pub include_all: bool,
    pub outcome: Outcome,
    /// When it started and how long it took (from the test's start).
    pub at: Duration,
    pub took: Duration,
    /// The failure, when it failed.
    pub why: String,
}

impl std::fmt::Display for Rec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{:.3}s +{}ms {} w{} m{}] {:?}{} {:?}{} -> {:?}",
            self.at.as_secs_f64(),
            self.took.as_millis(),
            self.phase,
            self.worker,
            self.master,
            self.kind,
            if self.driver { " (driver)" } else { "" },
            self.target,
            if self.include_all {
                " --include-all"
            } else {
                ""
            },
            self.outcome
        )?;
        if !self.why.is_empty() {
            let last = self.why.lines().rfind(|l| !l.trim().is_empty());
            write!(f, " ({})", last.unwrap_or(""))?;
        }
        Ok(())
    }
}

/// When a write (possibly) committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    At(i64),
    /// At a revision strictly between these: after every operation that
    /// had committed when it started, and before the first barrier write
    /// that started after it ended (a barrier commits, in the leader's
    /// term, everything the leader's log holds before it; what no leader's
    /// log holds by then never commits).
    Between(i64, i64),
}

impl When {
    /// Whether it may have committed at a revision in `lo..=hi`.
    fn within(self, lo: i64, hi: i64) -> bool {
        match self {
            When::At(r) => lo <= r && r <= hi,
            When::Between(a, b) => a.max(lo - 1).saturating_add(1) < b.min(hi.saturating_add(1)),
        }
    }
}

/// One (possible) write of one etcd key.
#[derive(Debug, Clone, Copy)]
struct W {
    rec: usize,
    value: Option<St>,
    when: When,
    definite: bool,
}

/// The writes of every etcd key the operations touched.
pub struct Model<'a> {
    recs: &'a [Rec],
    writes: BTreeMap<(B, String), Vec<W>>,
}

impl<'a> Model<'a> {
    /// The model of `recs`; `universe`: the ids an `--all` may name.
    pub fn new(recs: &'a [Rec], universe: &[String]) -> Model<'a> {
        let mut writes: BTreeMap<(B, String), Vec<W>> = BTreeMap::new();
        // Commits known by revision, with when their operation ended; and
        // the barriers, with when they started.
        let committed: Vec<(Duration, i64)> = recs
            .iter()
            .filter_map(|r| match r.outcome {
                Outcome::Done { revision, .. } | Outcome::Committed { revision }
                    if revision > 0 =>
                {
                    Some((r.at + r.took, revision))
                }
                _ => None,
            })
            .collect();
        let barriers: Vec<(Duration, i64)> = recs
            .iter()
            .filter(|r| r.phase == BARRIER)
            .filter_map(|r| match r.outcome {
                Outcome::Done { revision, .. } => Some((r.at, revision)),
                _ => None,
            })
            .collect();
        let between = |r: &Rec| {
            let lo = committed
                .iter()
                .filter(|(end, _)| *end < r.at)
                .map(|&(_, rev)| rev)
                .max()
                .unwrap_or(0);
            let hi = barriers
                .iter()
                .filter(|(start, _)| *start > r.at + r.took)
                .map(|&(_, rev)| rev)
                .min()
                .unwrap_or(i64::MAX);
            When::Between(lo, hi)
        };
        for (i, r) in recs.iter().enumerate() {
            let named: Vec<String> = match &r.target {
                Target::Ids(ids) => ids.clone(),
                Target::All => universe.to_vec(),
            };
            let single = matches!(&r.target, Target::Ids(ids) if ids.len() == 1);
            let (ids, when, definite) = match &r.outcome {
                Outcome::Done { ids, revision } => (ids.clone(), When::At(*revision), true),
                Outcome::Committed { revision } => (named, When::At(*revision), single),
                Outcome::Unknown => (named, between(r), false),
                Outcome::Refused | Outcome::NotWritten => continue,
            };
            for id in ids {
                for &(bank, value) in r.kind.effects() {
                    writes.entry((bank, id.clone())).or_default().push(W {
                        rec: i,
                        value,
                        when,
                        definite,
                    });
                }
            }
        }
        Model { recs, writes }
    }

    fn of(&self, bank: B, id: &str) -> &[W] {
        self.writes
            .get(&(bank, id.to_owned()))
            .map_or(&[], Vec::as_slice)
    }

    /// The operations that (possibly) wrote (bank, id), for messages.
    pub fn history(&self, bank: B, id: &str) -> String {
        let mut out = String::new();
        let ws = self.of(bank, id);
        if ws.len() > HISTORY {
            let _ = write!(out, "\n    ({} earlier)", ws.len() - HISTORY);
        }
        for w in &ws[ws.len().saturating_sub(HISTORY)..] {
            let _ = write!(out, "\n    {}", self.recs[w.rec]);
        }
        if out.is_empty() {
            out.push_str("\n    (no operation)");
        }
        out
    }

    /// The operations that (possibly) wrote (bank, id) around revision
    /// `r`, for messages.
    pub fn history_near(&self, bank: B, id: &str, r: i64) -> String {
        let mut ws: Vec<&W> = self.of(bank, id).iter().collect();
        ws.sort_by_key(|w| match w.when {
            When::At(r) | When::Between(r, _) => r,
        });
        let at = ws.partition_point(|w| !w.when.within(r, i64::MAX));
        let lo = at.saturating_sub(HISTORY / 2);
        let mut out = String::new();
        for w in &ws[lo..(lo + HISTORY).min(ws.len())] {
            let _ = write!(out, "\n    {}", self.recs[w.rec]);
        }
        out
    }

    /// Checks etcd's key state (`etcd`: (bank, id) -> (value, the revision
    /// of its last change)): what is wrong, one line per key.
    pub fn check_etcd(&self, etcd: &EtcdState) -> Vec<String> {
        let keys: BTreeSet<&(B, String)> = self.writes.keys().chain(etcd.keys()).collect();
        let mut bad = Vec::new();
        for (bank, id) in keys {
            let ws = self.of(*bank, id);
            let last_definite = ws
                .iter()
                .filter(|w| w.definite)
                .filter_map(|w| match w.when {
                    When::At(r) => Some((r, w.value)),
                    When::Between(..) => None,
                })
                .max();
            match etcd.get(&(*bank, id.clone())) {
                Some(&(st, m)) => {
                    let explained = ws
                        .iter()
                        .any(|w| w.value == Some(st) && w.when.within(m, m));
                    if !explained {
                        bad.push(format!(
                            "etcd holds {}/{id} {st:?} since revision {m}, which no operation \
                             (possibly) wrote then; its operations:{}",
                            bank.name(),
                            self.history(*bank, id)
                        ));
                    } else if let Some((r, v)) = last_definite.filter(|&(r, _)| r > m) {
                        bad.push(format!(
                            "etcd holds {}/{id} {st:?} since revision {m}, but an operation \
                             wrote {v:?} at revision {r}; its operations:{}",
                            bank.name(),
                            self.history(*bank, id)
                        ));
                    }
                }
                None => {
                    if let Some((r, Some(v))) = last_definite {
                        let deleted = ws
                            .iter()
                            .any(|w| w.value.is_none() && w.when.within(r + 1, i64::MAX));
                        if !deleted {
                            bad.push(format!(
                                "etcd does not hold {}/{id}, but an operation wrote {v:?} at \
                                 revision {r} and none deleted it after; its operations:{}",
                                bank.name(),
                                self.history(*bank, id)
                            ));
                        }
                    }
                }
            }
        }
        bad
    }

    /// Each definite write found what it needed, as etcd ordered them: a
    /// state change (accept, reject) an entry, after its last definite
    /// removal a (possible) sign-in; a put-if-absent (sign-in, denied key)
    /// no entry, after its last definite put a (possible) removal. A
    /// write that skipped its compare, or a replica whose `--all` ids
    /// were applied blindly, breaks this.
    pub fn check_history(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for ((bank, id), ws) in &self.writes {
            for w in ws.iter().filter(|w| w.definite) {
                let When::At(r) = w.when else { continue };
                let before = ws
                    .iter()
                    .filter(|p| p.definite)
                    .filter_map(|p| match p.when {
                        When::At(pr) if pr < r => Some((pr, p.value)),
                        _ => None,
                    })
                    .max();
                let (needs, since): (fn(Option<St>) -> bool, i64) = match (w.value, before) {
                    (Some(St::Accepted | St::Rejected), Some((pr, None))) => (|v| v.is_some(), pr),
                    (Some(St::Accepted | St::Rejected), None) => (|v| v.is_some(), 0),
                    (Some(St::Pending | St::Denied), Some((pr, Some(_)))) => (|v| v.is_none(), pr),
                    _ => continue,
                };
                let found = ws
                    .iter()
                    .any(|p| needs(p.value) && p.when.within(since + 1, r - 1));
                if !found {
                    bad.push(format!(
                        "{}/{id}: {:?} committed at revision {r} on what it may not change (as of \
                         revision {since}); its operations:{}",
                        bank.name(),
                        w.value,
                        self.history_near(*bank, id, r)
                    ));
                }
            }
        }
        bad
    }

    /// [`Model::check_accepted`] of a replica whose store may hold any
    /// revision from `lo` (the revision it recorded) to `hi`: a replicator
    /// killed between a batch's store write and the revision's record
    /// leaves its store that far ahead (docs/design.md), until it runs
    /// again. Each id passes when it passes at some revision of the range,
    /// the same revision for the id's accept and its revocations.
    pub fn check_accepted_within(
        &self,
        accepted: &BTreeSet<String>,
        lo: i64,
        hi: i64,
    ) -> Vec<String> {
        let mut bad = Vec::new();
        for id in accepted {
            let one = BTreeSet::from([id.clone()]);
            if (lo..=hi.max(lo)).all(|r| !self.check_accepted(&one, r).is_empty()) {
                bad.extend(self.check_accepted(&one, hi.max(lo)));
            }
        }
        bad
    }

    /// The highest revision an operation is known to have committed at.
    pub fn max_revision(&self) -> i64 {
        self.writes
            .values()
            .flatten()
            .filter_map(|w| match w.when {
                When::At(r) => Some(r),
                When::Between(..) => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The safety property on a key state at revision `upto` (a replica's,
    /// or etcd's): each of `accepted` was (possibly) accepted after its
    /// last definite reject or delete, at or before `upto`.
    pub fn check_accepted(&self, accepted: &BTreeSet<String>, upto: i64) -> Vec<String> {
        let mut bad = Vec::new();
        for id in accepted {
            let ws = self.of(B::Keys, id);
            let revoked = ws
                .iter()
                .filter(|w| w.definite && w.value != Some(St::Accepted))
                .filter(|w| w.value != Some(St::Pending))
                .filter_map(|w| match w.when {
                    When::At(r) if r <= upto => Some(r),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            let accepted_after = ws
                .iter()
                .any(|w| w.value == Some(St::Accepted) && w.when.within(revoked + 1, upto));
            if !accepted_after {
                bad.push(format!(
                    "{id} is accepted at revision {upto}, but no accept of it (possibly) \
                     committed after its last reject or delete (revision {revoked}); its \
                     operations:{}",
                    self.history(B::Keys, id)
                ));
            }
        }
        bad
    }
}

/// Decodes standard base64 (etcdctl's JSON).
pub fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {s:?}"),
        }
    };
    let mut out = Vec::new();
    for chunk in s.trim_end_matches('=').as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (val(c) << (18 - 6 * i)));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// etcd's key state: (bank, id) -> (value, the revision of its last
/// change).
pub type EtcdState = BTreeMap<(B, String), (St, i64)>;

/// etcd's key state under `prefix` from `etcdctl get PREFIX --prefix -w
/// json`: (bank, id) -> (value, mod revision); and the revision read.
pub fn etcd_state(json: &str, prefix: &str) -> (EtcdState, i64) {
    let v: Value = serde_json::from_str(json).expect("etcdctl json");
    let mut out = BTreeMap::new();
    for kv in v["kvs"].as_array().map_or(&[][..], Vec::as_slice) {
        let key = String::from_utf8(base64(kv["key"].as_str().expect("key"))).expect("utf-8");
        let value = base64(kv["value"].as_str().unwrap_or(""));
        let rest = key.strip_prefix(prefix).expect("under the prefix");
        let (bank, id) = rest.split_once('/').expect("bank/id");
        if bank == "audit" {
            // The audit trail's records: no key state.
            continue;
        }
        let (bank, st) = match (bank, value.first()) {
            ("keys", Some(1)) => (B::Keys, St::Accepted),
            ("keys", Some(2)) => (B::Keys, St::Pending),
            ("keys", Some(3)) => (B::Keys, St::Rejected),
            ("denied_keys", Some(_)) => (B::Denied, St::Denied),
            _ => panic!("etcd holds {key} = {value:?}: not a key state"),
        };
        let m = kv["mod_revision"].as_i64().expect("mod_revision");
        out.insert((bank, id.to_owned()), (st, m));
    }
    (out, v["header"]["revision"].as_i64().expect("revision"))
}

/// The key state a `keycache list --json` shows: (bank, id) -> value.
pub fn listing_state(l: &Value) -> BTreeMap<(B, String), St> {
    let mut out = BTreeMap::new();
    for (field, bank, st) in STATES {
        for id in l[field].as_array().expect("a list") {
            out.insert((bank, id.as_str().expect("id").to_owned()), st);
        }
    }
    out
}

/// The key tree's directories, and what a file in each stands for.
pub const STATES: [(&str, B, St); 4] = [
    ("minions", B::Keys, St::Accepted),
    ("minions_pre", B::Keys, St::Pending),
    ("minions_rejected", B::Keys, St::Rejected),
    ("minions_denied", B::Denied, St::Denied),
];

#[test]
fn a_window_holds_the_revisions_strictly_between_its_bounds() {
    assert!(When::Between(3, 5).within(4, 4));
    assert!(!When::Between(3, 5).within(5, 9));
    assert!(!When::Between(3, 5).within(0, 3));
    assert!(When::Between(3, i64::MAX).within(9, i64::MAX));
    assert!(When::At(4).within(4, 4) && !When::At(4).within(5, 9));
}

#[test]
fn base64_decodes_what_etcdctl_prints() {
    assert_eq!(base64("L2tleWNhY2hlLw=="), b"/keycache/");
    assert_eq!(base64("AWFi"), b"\x01ab");
    assert_eq!(base64("AWE="), b"\x01a");
}

/// The history of seed 2111's failure: minion-09 deleted at 1119, signed
/// in at 1126, accepted at 1131. A replica that recorded 1130 and holds it
/// accepted is wrong, unless its replicator was killed between a batch's
/// store write and its record (its store may then hold 1131); one that
/// holds it accepted between the delete and the sign-in is wrong either
/// way.
#[test]
fn a_killed_replicas_store_may_be_a_batch_ahead_of_its_revision() {
    let rec = |kind, revision| Rec {
        phase: "test",
        worker: 0,
        master: 0,
        kind,
        driver: false,
        target: Target::Ids(vec!["m".into()]),
        include_all: true,
        outcome: Outcome::Done {
            ids: vec!["m".into()],
            revision,
        },
        at: Duration::ZERO,
        took: Duration::ZERO,
        why: String::new(),
    };
    let recs = [
        rec(Kind::SignIn, 1100),
        rec(Kind::Accept, 1113),
        rec(Kind::Delete, 1119),
        rec(Kind::SignIn, 1126),
        rec(Kind::Accept, 1131),
    ];
    let model = Model::new(&recs, &[]);
    let m = BTreeSet::from(["m".to_owned()]);
    assert_eq!(model.max_revision(), 1131);
    assert!(model.check_accepted(&m, 1115).is_empty());
    assert_eq!(model.check_accepted(&m, 1130).len(), 1);
    assert!(model.check_accepted(&m, 1131).is_empty());
    assert!(model.check_accepted_within(&m, 1130, 1131).is_empty());
    assert_eq!(model.check_accepted_within(&m, 1120, 1130).len(), 1);
    assert_eq!(model.check_accepted_within(&m, 1125, 1125).len(), 1);
}
