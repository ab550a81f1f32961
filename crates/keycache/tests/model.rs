//! Model-based test of the key store: random sequences of puts, state
//! changes, denies, removes, batches, reopens and compactions (also into
//! another size) on small tables — so probing wraps, DELETED slots are
//! reused, heap segments roll and tables fill up — checked after every step
//! against an in-memory model of both banks and their roster order.
//!
//! `PROPTEST_CASES` sets the number of cases (64 by default).
//! Every step must have exactly the model's outcome: a batch that does not
//! fit changes nothing in either bank, and its inserts may reuse the slots
//! its own removals free.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;

use keycache::table::Applied;
use keycache::{Error, KeyState, MinionId, OpenOptions, Store};
use keycache_testkit::common::refreshed_every as options;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

// ---------------------------------------------------------------------------
// Ids, values, operations
// ---------------------------------------------------------------------------

/// The ids the operations draw from: short ones, a UTF-8 one, one that is a
/// prefix of another, a 63-byte prefix of a 64-byte id (exact comparison, no
/// NUL after a full-width id), and a 64-byte multi-byte UTF-8 id.
static POOL: LazyLock<Vec<String>> = LazyLock::new(|| {
    let ids = vec![
        "a".to_owned(),
        "b".to_owned(),
        "web-01".to_owned(),
        "db-02.example.com".to_owned(),
        "m1".to_owned(),
        "m10".to_owned(),
        "nœud-é".to_owned(),
        ".hidden".to_owned(),
        "x".repeat(63),
        "x".repeat(64),
        "é".repeat(32),
        "minion with space".to_owned(),
    ];
    assert_eq!(ids[9].len(), 64);
    assert_eq!(ids[10].len(), 64);
    ids
});
const POOL_LEN: usize = 12;

fn mid(i: usize) -> MinionId {
    MinionId::new(POOL[i].clone()).unwrap()
}

/// A public key; printed lossily so that shrunk cases stay readable.
#[derive(Clone, PartialEq, Eq)]
struct Pem(Vec<u8>);

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Pem({}b {:?})",
            self.0.len(),
            String::from_utf8_lossy(&self.0)
        )
    }
}

#[derive(Debug, Clone)]
enum Sub {
    Put(usize, KeyState, Pem),
    SetState(usize, KeyState),
    Deny(usize, Pem),
    Remove(usize),
    RemoveDenied(usize),
}

#[derive(Debug, Clone)]
enum Op {
    /// One write through the matching `Store` method.
    One(Sub),
    /// Several writes in one `Store::batch`.
    Batch(Vec<Sub>),
    /// Drop the store and open it again.
    Reopen,
    /// `Store::compact(None)`.
    Compact,
    /// `Store::compact(Some(size))` into a size that the entries fit (the
    /// drawn size, raised as needed), then reopen with that size.
    CompactInto(u64),
}

fn state() -> impl Strategy<Value = KeyState> {
    prop_oneof![
        Just(KeyState::Accepted),
        Just(KeyState::Pending),
        Just(KeyState::Rejected)
    ]
}

fn text_pem(len: usize, n: u16) -> Vec<u8> {
    let base = format!(
        "-----BEGIN PUBLIC KEY-----\nMIIB{n:05}{}\n",
        (b'A' + (n % 26) as u8) as char
    );
    base.bytes().cycle().take(len).collect()
}

fn pem_strategy() -> impl Strategy<Value = Pem> {
    prop_oneof![
        12 => (1usize..=160, any::<u16>()).prop_map(|(len, n)| Pem(text_pem(len, n))),
        2 => proptest::collection::vec(any::<u8>(), 1..48).prop_map(Pem),
        // Trailing NULs (Salt strips them from denied keys); k = 0: only NULs.
        1 => (0usize..6, 1usize..4).prop_map(|(k, z)| {
            let mut v = vec![b'K'; k];
            v.extend(std::iter::repeat_n(0u8, z));
            Pem(v)
        }),
        // Refused: a key must not be empty.
        1 => Just(Pem(Vec::new())),
    ]
}

fn sub() -> impl Strategy<Value = Sub> {
    prop_oneof![
        5 => (0..POOL_LEN, state(), pem_strategy()).prop_map(|(i, s, p)| Sub::Put(i, s, p)),
        2 => (0..POOL_LEN, state()).prop_map(|(i, s)| Sub::SetState(i, s)),
        3 => (0..POOL_LEN, pem_strategy()).prop_map(|(i, p)| Sub::Deny(i, p)),
        3 => (0..POOL_LEN).prop_map(Sub::Remove),
        2 => (0..POOL_LEN).prop_map(Sub::RemoveDenied),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        14 => sub().prop_map(Op::One),
        4 => proptest::collection::vec(sub(), 2..7).prop_map(Op::Batch),
        1 => Just(Op::Reopen),
        1 => Just(Op::Compact),
        1 => (2u64..=20).prop_map(Op::CompactInto),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    size: u64,
    max_segment_bytes: u64,
    refresh_ms: u64,
    ops: Vec<Op>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        7u64..=17,
        150u64..600,
        prop_oneof![Just(0u64), Just(250u64)],
        proptest::collection::vec(op(), 1..=60),
    )
        .prop_map(|(size, max_segment_bytes, refresh_ms, ops)| Setup {
            size,
            max_segment_bytes,
            refresh_ms,
            ops,
        })
}

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

/// One bank: entries, and ids in roster (insertion) order.
#[derive(Debug, Clone, PartialEq)]
struct Bank<V> {
    map: BTreeMap<String, V>,
    order: Vec<String>,
}

impl<V> Default for Bank<V> {
    fn default() -> Self {
        Bank {
            map: BTreeMap::new(),
            order: Vec::new(),
        }
    }
}

impl<V: Clone> Bank<V> {
    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn get(&self, id: &str) -> Option<&V> {
        self.map.get(id)
    }

    /// A new id is appended to the roster; an existing one keeps its place.
    fn set(&mut self, id: &str, v: V) {
        if self.map.insert(id.to_owned(), v).is_none() {
            self.order.push(id.to_owned());
        }
    }

    fn remove(&mut self, id: &str) -> bool {
        if self.map.remove(id).is_some() {
            self.order.retain(|x| x != id);
            true
        } else {
            false
        }
    }

    fn in_order(&self) -> impl Iterator<Item = (&String, &V)> {
        self.order.iter().map(|id| (id, &self.map[id]))
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
struct Model {
    keys: Bank<(KeyState, Vec<u8>)>,
    denied: Bank<Vec<u8>>,
}

/// Writes staged in one transaction: collapsed per id (the last write
/// counts), ids in order of first staging — as `Txn` stages them.
struct Stage<V> {
    order: Vec<String>,
    map: HashMap<String, Option<V>>,
}

impl<V> Default for Stage<V> {
    fn default() -> Self {
        Stage {
            order: Vec::new(),
            map: HashMap::new(),
        }
    }
}

impl<V> Stage<V> {
    fn stage(&mut self, id: &str, v: Option<V>) {
        if self.map.insert(id.to_owned(), v).is_none() {
            self.order.push(id.to_owned());
        }
    }
}

/// What committing `st` into `bank` gives (as `Table::commit`: collapsed per
/// id, new ids appended in staging order), the counts it applies, whether
/// the result fits `cap` live entries, and whether the library's current
/// planning accepts it (it does not let the batch's inserts reuse the slots
/// its own removals free; see `batch_may_reuse_the_slots_it_frees`).
fn commit<V: Clone>(bank: &Bank<V>, st: &Stage<V>, cap: u64) -> (Bank<V>, Applied, bool) {
    let mut b = bank.clone();
    let mut a = Applied::default();
    for id in &st.order {
        match &st.map[id] {
            Some(v) => {
                if bank.get(id).is_some() {
                    a.updated += 1;
                } else {
                    a.inserted += 1;
                }
                b.set(id, v.clone());
            }
            None => {
                if b.remove(id) {
                    a.removed += 1;
                }
            }
        }
    }
    let live = bank.len();
    let fits = live - a.removed + a.inserted <= cap;
    (b, a, fits)
}

#[derive(Debug, Clone, PartialEq)]
enum Res {
    /// Succeeded; the bools that the calls returned (set_state, and remove
    /// / remove_denied as single calls), and what the batch applied.
    Ok(Vec<Option<bool>>, Option<Applied>),
    TableFull,
    EmptyPem,
}

#[derive(Debug, Clone)]
struct Outcome {
    res: Res,
    model: Model,
}

/// The outcome of writes `subs` on `m` (a one-element list: every step is
/// checked against a list of acceptable outcomes).
fn expect(m: &Model, subs: &[Sub], cap: u64, single: bool) -> Vec<Outcome> {
    let mut ks: Stage<(KeyState, Vec<u8>)> = Stage::default();
    let mut ds: Stage<Vec<u8>> = Stage::default();
    let mut results = Vec::new();
    let unchanged = |res| {
        vec![Outcome {
            res,
            model: m.clone(),
        }]
    };
    for s in subs {
        match s {
            Sub::Put(i, st, p) => {
                if p.0.is_empty() {
                    return unchanged(Res::EmptyPem);
                }
                ks.stage(&POOL[*i], Some((*st, p.0.clone())));
                results.push(None);
            }
            Sub::SetState(i, st) => {
                let id = &POOL[*i];
                let cur = match ks.map.get(id) {
                    Some(v) => v.clone(),
                    None => m.keys.get(id).cloned(),
                };
                match cur {
                    Some((_, pem)) => {
                        ks.stage(id, Some((*st, pem)));
                        results.push(Some(true));
                    }
                    None => results.push(Some(false)),
                }
            }
            Sub::Deny(i, p) => {
                if p.0.is_empty() {
                    return unchanged(Res::EmptyPem);
                }
                ds.stage(&POOL[*i], Some(p.0.clone()));
                results.push(None);
            }
            Sub::Remove(i) => {
                results.push(single.then(|| m.keys.get(&POOL[*i]).is_some()));
                ks.stage(&POOL[*i], None);
            }
            Sub::RemoveDenied(i) => {
                results.push(single.then(|| m.denied.get(&POOL[*i]).is_some()));
                ds.stage(&POOL[*i], None);
            }
        }
    }
    let (keys, ka, k_fits) = commit(&m.keys, &ks, cap);
    let (denied, da, d_fits) = commit(&m.denied, &ds, cap);
    let applied = Applied {
        inserted: ka.inserted + da.inserted,
        updated: ka.updated + da.updated,
        removed: ka.removed + da.removed,
    };
    let both = Model { keys, denied };
    let ok = Res::Ok(results, (!single).then_some(applied));
    let ideal = if k_fits && d_fits {
        Outcome {
            res: ok,
            model: both,
        }
    } else {
        Outcome {
            res: Res::TableFull,
            model: m.clone(),
        }
    };
    vec![ideal]
}

static STEPS: AtomicUsize = AtomicUsize::new(0);
static TABLE_FULL: AtomicUsize = AtomicUsize::new(0);

// ---------------------------------------------------------------------------
// Running and checking
// ---------------------------------------------------------------------------

fn strip_nuls(v: &[u8]) -> Vec<u8> {
    let mut v = v.to_vec();
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

fn to_res<T>(r: keycache::Result<T>, f: impl FnOnce(T) -> Res) -> Result<Res, String> {
    match r {
        Ok(v) => Ok(f(v)),
        Err(Error::TableFull { .. }) => Ok(Res::TableFull),
        Err(Error::InvalidId { why, .. }) if why.contains("public key is empty") => {
            Ok(Res::EmptyPem)
        }
        Err(e) => Err(format!("unexpected error: {e}")),
    }
}

fn run_one(s: &Store, sub: &Sub) -> Result<Res, String> {
    match sub {
        Sub::Put(i, st, p) => to_res(s.put(&mid(*i), *st, &p.0), |()| Res::Ok(vec![None], None)),
        Sub::SetState(i, st) => {
            to_res(s.set_state(&mid(*i), *st), |b| Res::Ok(vec![Some(b)], None))
        }
        Sub::Deny(i, p) => to_res(s.deny(&mid(*i), &p.0), |()| Res::Ok(vec![None], None)),
        Sub::Remove(i) => to_res(s.remove(&mid(*i)), |b| Res::Ok(vec![Some(b)], None)),
        Sub::RemoveDenied(i) => to_res(s.remove_denied(&mid(*i)), |b| Res::Ok(vec![Some(b)], None)),
    }
}

fn run_batch(s: &Store, subs: &[Sub]) -> Result<Res, String> {
    let r = s.batch(|b| {
        let mut out = Vec::new();
        for sub in subs {
            match sub {
                Sub::Put(i, st, p) => {
                    b.put(&mid(*i), *st, &p.0)?;
                    out.push(None);
                }
                Sub::SetState(i, st) => out.push(Some(b.set_state(&mid(*i), *st)?)),
                Sub::Deny(i, p) => {
                    b.deny(&mid(*i), &p.0)?;
                    out.push(None);
                }
                Sub::Remove(i) => {
                    b.remove(&mid(*i))?;
                    out.push(None);
                }
                Sub::RemoveDenied(i) => {
                    b.remove_denied(&mid(*i))?;
                    out.push(None);
                }
            }
        }
        Ok(out)
    });
    to_res(r, |(out, applied)| Res::Ok(out, Some(applied)))
}

/// Everything the store answers must be what the model says.
fn check(s: &Store, m: &Model) -> Result<(), String> {
    let e = |what: &str, err: Error| format!("{what}: {err}");
    for i in 0..POOL_LEN {
        let id = mid(i);
        let got = s.get(&id).map_err(|x| e("get", x))?;
        if let Some(k) = &got {
            if k.mtime == 0 {
                return Err(format!("get({id:?}): mtime 0"));
            }
        }
        let got = got.map(|k| (k.state, Pem(k.public_key)));
        let want = m.keys.get(&POOL[i]).map(|(st, p)| (*st, Pem(p.clone())));
        if got != want {
            return Err(format!("get({id:?}) = {got:?}, model {want:?}"));
        }
        let got = s.denied(&id).map_err(|x| e("denied", x))?.map(Pem);
        let want = m.denied.get(&POOL[i]).map(|p| Pem(strip_nuls(p)));
        if got != want {
            return Err(format!("denied({id:?}) = {got:?}, model {want:?}"));
        }
    }
    for filter in [
        None,
        Some(KeyState::Accepted),
        Some(KeyState::Pending),
        Some(KeyState::Rejected),
    ] {
        let got: Vec<(String, KeyState, Pem)> = s
            .keys(filter)
            .map_err(|x| e("keys", x))?
            .map(|r| r.map(|(id, k)| (id, k.state, Pem(k.public_key))))
            .collect::<Result<_, _>>()
            .map_err(|x| e("keys item", x))?;
        let want: Vec<(String, KeyState, Pem)> = m
            .keys
            .in_order()
            .filter(|(_, (st, _))| filter.is_none_or(|f| f == *st))
            .map(|(id, (st, p))| (id.clone(), *st, Pem(p.clone())))
            .collect();
        if got != want {
            return Err(format!("keys({filter:?}) = {got:?}\n  model {want:?}"));
        }
    }
    let got: Vec<(String, Pem)> = s
        .denied_keys()
        .map_err(|x| e("denied_keys", x))?
        .map(|r| r.map(|(id, p)| (id, Pem(p))))
        .collect::<Result<_, _>>()
        .map_err(|x| e("denied_keys item", x))?;
    let want: Vec<(String, Pem)> = m
        .denied
        .in_order()
        .map(|(id, p)| (id.clone(), Pem(strip_nuls(p))))
        .collect();
    if got != want {
        return Err(format!("denied_keys() = {got:?}\n  model {want:?}"));
    }
    let c = s.counts().map_err(|x| e("counts", x))?;
    let n = |st| m.keys.map.values().filter(|(s, _)| *s == st).count() as u64;
    let want = (
        n(KeyState::Accepted),
        n(KeyState::Pending),
        n(KeyState::Rejected),
        m.denied.len(),
    );
    if (c.accepted, c.pending, c.rejected, c.denied) != want {
        return Err(format!("counts() = {c:?}, model {want:?}"));
    }
    let st = s.stats().map_err(|x| e("stats", x))?;
    for (name, t, len) in [
        ("keys", st.keys, m.keys.len()),
        ("denied_keys", st.denied_keys, m.denied.len()),
    ] {
        if t.occupied != len {
            return Err(format!(
                "stats().{name}.occupied = {}, model {len}: {t:?}",
                t.occupied
            ));
        }
        if t.occupied + t.deleted > t.capacity || t.high_water > t.capacity {
            return Err(format!("stats().{name} inconsistent: {t:?}"));
        }
        if t.heap_live_bytes > t.heap_total_bytes {
            return Err(format!("stats().{name}: live bytes > total: {t:?}"));
        }
    }
    Ok(())
}

fn run_case(setup: &Setup) -> Result<(), TestCaseError> {
    let fail = |step: usize, op: &Op, msg: String| {
        TestCaseError::fail(format!("step {step} ({op:?}): {msg}"))
    };
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut opts = options(setup.size, setup.max_segment_bytes, setup.refresh_ms);
    let open = |o: &OpenOptions| {
        Store::open_with(dir.path(), o).map_err(|e| TestCaseError::fail(format!("open: {e}")))
    };
    let mut store = open(&opts)?;
    // With refresh 0, a second handle opened at the start must see every
    // change (new banks, new segments, compactions) at once.
    let mut observer = if setup.refresh_ms == 0 {
        Some(open(&opts)?)
    } else {
        None
    };
    let mut model = Model::default();
    for (step, op) in setup.ops.iter().enumerate() {
        STEPS.fetch_add(1, Ordering::Relaxed);
        let cap = opts.params.size - 1;
        let (candidates, got) = match op {
            Op::One(sub) => (
                expect(&model, std::slice::from_ref(sub), cap, true),
                run_one(&store, sub),
            ),
            Op::Batch(subs) => (expect(&model, subs, cap, false), run_batch(&store, subs)),
            Op::Reopen => {
                drop(store);
                store = open(&opts)?;
                (
                    vec![Outcome {
                        res: Res::Ok(vec![], None),
                        model: model.clone(),
                    }],
                    Ok(Res::Ok(vec![], None)),
                )
            }
            Op::Compact => {
                let r = store.compact(None).map(|()| Res::Ok(vec![], None));
                (
                    vec![Outcome {
                        res: Res::Ok(vec![], None),
                        model: model.clone(),
                    }],
                    r.map_err(|e| format!("compact: {e}")),
                )
            }
            Op::CompactInto(n) => {
                let need = model.keys.len().max(model.denied.len()) + 1;
                let mut size = (*n).max(need).max(2);
                if size == opts.params.size {
                    size += 1;
                }
                store
                    .compact(Some(size))
                    .map_err(|e| fail(step, op, format!("compact into {size}: {e}")))?;
                drop(store);
                // The old size no longer matches the files.
                match Store::open_with(dir.path(), &opts) {
                    Err(Error::Mismatch { .. }) => {}
                    other => {
                        return Err(fail(
                            step,
                            op,
                            format!("open with the old size {}: {other:?}", opts.params.size),
                        ))
                    }
                }
                opts.params.size = size;
                store = open(&opts)?;
                if observer.is_some() {
                    observer = Some(open(&opts)?);
                }
                (
                    vec![Outcome {
                        res: Res::Ok(vec![], None),
                        model: model.clone(),
                    }],
                    Ok(Res::Ok(vec![], None)),
                )
            }
        };
        let got = got.map_err(|e| fail(step, op, e))?;
        if got == Res::TableFull {
            TABLE_FULL.fetch_add(1, Ordering::Relaxed);
        }
        // The first candidate whose result and resulting state match is what happened.
        let mut errors = Vec::new();
        let mut matched = None;
        for c in &candidates {
            if c.res != got {
                errors.push(format!("result {got:?}, expected {:?}", c.res));
                continue;
            }
            match check(&store, &c.model) {
                Ok(()) => {
                    matched = Some(c.clone());
                    break;
                }
                Err(e) => errors.push(e),
            }
        }
        let Some(c) = matched else {
            return Err(fail(step, op, errors.join("\n  or: ")));
        };
        if let Some(o) = &observer {
            check(o, &c.model).map_err(|e| fail(step, op, format!("second handle: {e}")))?;
        }
        model = c.model;
    }
    // A second, fresh handle sees the same.
    let other = open(&opts)?;
    check(&other, &model).map_err(|e| TestCaseError::fail(format!("fresh handle: {e}")))?;
    Ok(())
}

#[test]
fn store_matches_model() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 1024,
        ..Config::default()
    });
    let result = runner.run(&setup(), |s| run_case(&s));
    eprintln!(
        "model: {cases} cases, {} steps, {} TableFull",
        STEPS.load(Ordering::Relaxed),
        TABLE_FULL.load(Ordering::Relaxed)
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------
// Batches and compactions that do not fit: minimal cases
// ---------------------------------------------------------------------------

fn pem(n: usize) -> Vec<u8> {
    format!("-----BEGIN PUBLIC KEY-----\nkey{n:04}\n-----END PUBLIC KEY-----\n").into_bytes()
}

fn id(s: &str) -> MinionId {
    MinionId::new(s).unwrap()
}

#[test]
fn batch_may_reuse_the_slots_it_frees() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &options(5, 1 << 20, 0)).unwrap();
    for i in 0..4 {
        s.put(&id(&format!("m{i}")), KeyState::Accepted, &pem(i))
            .unwrap();
    }
    // Full (4 data slots). Removing one and adding one ends at 4 entries.
    s.batch(|b| {
        b.remove(&id("m0"))?;
        b.put(&id("new"), KeyState::Pending, &pem(9))
    })
    .expect("a batch that ends within capacity must be accepted");
    assert_eq!(s.get(&id("m0")).unwrap(), None);
    assert_eq!(s.get(&id("new")).unwrap().unwrap().public_key, pem(9));
}

#[test]
fn a_failed_batch_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_with(d.path(), &options(3, 1 << 20, 0)).unwrap();
    s.deny(&id("d1"), &pem(1)).unwrap();
    s.deny(&id("d2"), &pem(2)).unwrap();
    // denied_keys is full (2 data slots); the keys bank is empty.
    let err = s
        .batch(|b| {
            b.put(&id("k"), KeyState::Accepted, &pem(3))?;
            b.deny(&id("d3"), &pem(4))
        })
        .unwrap_err();
    assert!(matches!(err, Error::TableFull { .. }), "{err}");
    assert_eq!(
        s.get(&id("k")).unwrap(),
        None,
        "the failed batch's put into the keys bank was committed"
    );
}

#[test]
fn compact_into_a_size_too_small_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let opts = options(17, 1 << 20, 0);
    let s = Store::open_with(d.path(), &opts).unwrap();
    s.put(&id("k"), KeyState::Accepted, &pem(1)).unwrap();
    for i in 0..4 {
        s.deny(&id(&format!("d{i}")), &pem(i)).unwrap();
    }
    // 1 key fits 2 data slots, 4 denied keys do not.
    let err = s.compact(Some(3)).unwrap_err();
    assert!(matches!(err, Error::TableFull { .. }), "{err}");
    drop(s);
    let s = Store::open_with(d.path(), &opts).expect("store left openable with its old size");
    assert_eq!(s.get(&id("k")).unwrap().unwrap().public_key, pem(1));
    assert_eq!(s.denied_keys().unwrap().count(), 4);
}
