//! Fuzz body: random puts, state changes, denies, removes, batches,
//! compactions (into other sizes too) and reopens on tiny tables, checked
//! against a model after every step, through two handles.

use std::collections::BTreeMap;

use keycache::error::Error;
use keycache::format::{self, Params};
use keycache::store::{KeyState, Store};
use keycache::verify;
use keycache::MinionId;

use super::{banks_of, opts, state_of, Input};

const POOL: [&str; 10] = [
    "a",
    "b",
    "c",
    "dd",
    "e.f",
    "ü",
    "sixchr",
    "eightchr",
    "x y",
    "ninechars",
];
const MODEL_ID_SIZE: usize = 8;

#[derive(Debug, Clone)]
enum Sub {
    Put(usize, KeyState, Vec<u8>),
    SetState(usize, KeyState),
    Deny(usize, Vec<u8>),
    Remove(usize),
    RemoveDenied(usize),
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    keys: BTreeMap<String, (KeyState, Vec<u8>)>,
    korder: Vec<String>,
    denied: BTreeMap<String, Vec<u8>>,
    dorder: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    EmptyKey,
    TooLong,
    Full,
}

fn fail_of(e: &Error) -> Option<Fail> {
    match e {
        Error::InvalidId { why, .. } if why.contains("empty") => Some(Fail::EmptyKey),
        Error::IdTooLong { .. } => Some(Fail::TooLong),
        Error::TableFull { .. } => Some(Fail::Full),
        _ => None,
    }
}

fn pem_of(n: u64, len_sel: u8) -> Vec<u8> {
    match len_sel % 8 {
        0 => Vec::new(),
        1 => b"-".to_vec(),
        2 => format!("-----BEGIN PUBLIC KEY-----\n{n}\0\0").into_bytes(),
        l => {
            let body = format!("k{n:x}").repeat(usize::from(l) * 9);
            format!("-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n").into_bytes()
        }
    }
}

fn strip(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// Applies one transaction's staged writes (id -> final value, in first
/// staging order) to a bank of the model, as the table commits them.
fn commit_model<V: Clone>(
    map: &mut BTreeMap<String, V>,
    order: &mut Vec<String>,
    staged: &[(String, Option<V>)],
    capacity: u64,
) -> Result<(), Fail> {
    fits(map, staged, capacity)?;
    for (id, v) in staged {
        match v {
            Some(v) => {
                if map.insert(id.clone(), v.clone()).is_none() {
                    order.push(id.clone());
                }
            }
            None => {
                if map.remove(id).is_some() {
                    order.retain(|x| x != id);
                }
            }
        }
    }
    Ok(())
}

/// Whether `staged` fits: a batch's inserts may take the slots its own
/// removals free.
fn fits<V>(
    map: &BTreeMap<String, V>,
    staged: &[(String, Option<V>)],
    capacity: u64,
) -> Result<(), Fail> {
    let inserts = staged
        .iter()
        .filter(|(id, v)| v.is_some() && !map.contains_key(id))
        .count() as u64;
    let removals = staged
        .iter()
        .filter(|(id, v)| v.is_none() && map.contains_key(id))
        .count() as u64;
    if map.len() as u64 - removals + inserts > capacity {
        return Err(Fail::Full);
    }
    Ok(())
}

fn stage<V>(staged: &mut Vec<(String, Option<V>)>, id: &str, v: Option<V>) {
    match staged.iter_mut().find(|(i, _)| i == id) {
        Some(e) => e.1 = v,
        None => staged.push((id.to_owned(), v)),
    }
}

/// The model of `Store::batch` over `subs`: the results of the set_state
/// calls, or the failure (with the model as the failure leaves it).
fn model_batch(m: &mut Model, subs: &[Sub], capacity: u64) -> Result<Vec<bool>, Fail> {
    type Staged = Vec<(String, Option<(KeyState, Vec<u8>)>)>;
    let mut staged: Staged = Vec::new();
    let mut denied_ops: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    let mut results = Vec::new();
    let long = |i: usize| POOL[i].len() > MODEL_ID_SIZE;
    for s in subs {
        match s {
            Sub::Put(i, st, pem) => {
                if pem.is_empty() {
                    return Err(Fail::EmptyKey);
                }
                if long(*i) {
                    return Err(Fail::TooLong);
                }
                stage(&mut staged, POOL[*i], Some((*st, pem.clone())));
            }
            Sub::SetState(i, st) => {
                let cur = match staged.iter().find(|(x, _)| x == POOL[*i]) {
                    Some((_, v)) => v.clone(),
                    None => {
                        if long(*i) {
                            return Err(Fail::TooLong);
                        }
                        m.keys.get(POOL[*i]).cloned()
                    }
                };
                match cur {
                    None => results.push(false),
                    Some((_, pem)) => {
                        stage(&mut staged, POOL[*i], Some((*st, pem)));
                        results.push(true);
                    }
                }
            }
            Sub::Deny(i, pem) => {
                if pem.is_empty() {
                    return Err(Fail::EmptyKey);
                }
                if long(*i) {
                    return Err(Fail::TooLong);
                }
                denied_ops.push((POOL[*i].to_owned(), Some(pem.clone())));
            }
            Sub::Remove(i) => {
                if long(*i) {
                    return Err(Fail::TooLong);
                }
                stage(&mut staged, POOL[*i], None);
            }
            Sub::RemoveDenied(i) => {
                if long(*i) {
                    return Err(Fail::TooLong);
                }
                denied_ops.push((POOL[*i].to_owned(), None));
            }
        }
    }
    let mut dstaged = Vec::new();
    for (id, v) in denied_ops {
        stage(&mut dstaged, &id, v);
    }
    // Both banks fit, or the batch changes nothing.
    fits(&m.keys, &staged, capacity)?;
    fits(&m.denied, &dstaged, capacity)?;
    commit_model(&mut m.keys, &mut m.korder, &staged, capacity)?;
    commit_model(&mut m.denied, &mut m.dorder, &dstaged, capacity)?;
    Ok(results)
}

fn lib_batch(store: &Store, subs: &[Sub]) -> keycache::Result<Vec<bool>> {
    let mid = |i: usize| MinionId::new(POOL[i]).expect("pool ids are valid");
    store
        .batch(|b| {
            let mut out = Vec::new();
            for s in subs {
                match s {
                    Sub::Put(i, st, pem) => b.put(&mid(*i), *st, pem)?,
                    Sub::SetState(i, st) => out.push(b.set_state(&mid(*i), *st)?),
                    Sub::Deny(i, pem) => b.deny(&mid(*i), pem)?,
                    Sub::Remove(i) => b.remove(&mid(*i))?,
                    Sub::RemoveDenied(i) => b.remove_denied(&mid(*i))?,
                }
            }
            Ok(out)
        })
        .map(|(r, _)| r)
}

fn check_model(store: &Store, m: &Model, what: &str) {
    for (i, id) in POOL.iter().enumerate() {
        let mid = MinionId::new(*id).expect("valid");
        let got = store.get(&mid);
        let den = store.denied(&mid);
        if POOL[i].len() > MODEL_ID_SIZE {
            assert!(
                matches!(got, Err(Error::IdTooLong { .. })),
                "{what}: get of a long id: {got:?}"
            );
            assert!(matches!(den, Err(Error::IdTooLong { .. })));
            continue;
        }
        let got = got
            .unwrap_or_else(|e| panic!("{what}: get {id}: {e}"))
            .map(|e| (e.state, e.public_key));
        assert_eq!(got.as_ref(), m.keys.get(*id), "{what}: keys[{id}]");
        let den = den.unwrap_or_else(|e| panic!("{what}: denied {id}: {e}"));
        assert_eq!(
            den,
            m.denied.get(*id).cloned().map(strip),
            "{what}: denied[{id}]"
        );
    }
    let (keys, denied) = banks_of(store);
    let want: Vec<(String, KeyState, Vec<u8>)> = m
        .korder
        .iter()
        .map(|id| (id.clone(), m.keys[id].0, m.keys[id].1.clone()))
        .collect();
    assert_eq!(keys, want, "{what}: keys listing");
    let want: Vec<(String, Vec<u8>)> = m
        .dorder
        .iter()
        .map(|id| (id.clone(), strip(m.denied[id].clone())))
        .collect();
    assert_eq!(denied, want, "{what}: denied listing");
    let c = store.counts().expect("counts");
    let n = |s| m.keys.values().filter(|v| v.0 == s).count() as u64;
    assert_eq!(
        (c.accepted, c.pending, c.rejected, c.denied),
        (
            n(KeyState::Accepted),
            n(KeyState::Pending),
            n(KeyState::Rejected),
            m.denied.len() as u64
        ),
        "{what}: counts"
    );
    let f = verify::verify_store(store).expect("verify");
    assert!(f.is_empty(), "{what}: verify: {f:?}");
}

fn mtimes(store: &Store) -> BTreeMap<(bool, String), u64> {
    let mut out = BTreeMap::new();
    for t in [store.keys_table(), store.denied_table()] {
        for r in t.iter().expect("iter") {
            let r = r.expect("entry");
            out.insert(
                (
                    std::ptr::eq(t, store.keys_table()),
                    String::from_utf8_lossy(&r.id).into_owned(),
                ),
                r.mtime,
            );
        }
    }
    out
}

/// Random operation sequences on tiny tables, checked against a model.
pub fn ops_model(data: &[u8]) {
    const SIZES: [u64; 5] = [2, 3, 5, 9, 13];
    const SEG_CAPS: [u64; 4] = [40, 100, 400, 1 << 20];
    let mut inp = Input::new(data);
    let b = inp.u8();
    let mut params = Params {
        size: SIZES[usize::from(b % 5)],
        id_size: MODEL_ID_SIZE,
        slot_size: format::min_slot_size(MODEL_ID_SIZE) + 3,
        max_segment_bytes: SEG_CAPS[usize::from((b >> 3) % 4)],
    };
    let scratch = crate::scratch::fuzz_dir("ops");
    let dir = scratch.path();
    let mut store = Store::open_with(dir, &opts(params)).expect("open");
    let mut reader = Store::open_with(dir, &opts(params)).expect("open");
    let mut m = Model::default();
    let mut n = 0u64;
    let mut steps = 0;
    while !inp.done() && steps < 48 {
        steps += 1;
        let op = inp.u8();
        let id = usize::from(inp.u8()) % POOL.len();
        let arg = inp.u8();
        n += 1;
        let capacity = params.capacity();
        let sub = |k: u8, id: usize, arg: u8, n: u64| match k % 5 {
            0 => Sub::Put(id, state_of(arg), pem_of(n, arg >> 2)),
            1 => Sub::SetState(id, state_of(arg)),
            2 => Sub::Deny(id, pem_of(n, arg >> 2)),
            3 => Sub::Remove(id),
            _ => Sub::RemoveDenied(id),
        };
        let what = format!("step {steps} (op {op} id {} arg {arg})", POOL[id]);
        match op % 10 {
            k @ 0..=2 => {
                // A single write through the store's own method.
                let s = sub(k + (arg & 1) * 3, id, arg, n);
                let mut after = m.clone();
                let want = model_batch(&mut after, std::slice::from_ref(&s), capacity);
                let mid = MinionId::new(POOL[id]).expect("valid");
                let got: keycache::Result<Vec<bool>> = match &s {
                    Sub::Put(_, st, pem) => store.put(&mid, *st, pem).map(|()| vec![]),
                    Sub::SetState(_, st) => store.set_state(&mid, *st).map(|f| vec![f]),
                    Sub::Deny(_, pem) => store.deny(&mid, pem).map(|()| vec![]),
                    Sub::Remove(_) => store.remove(&mid).map(|f| vec![f]),
                    Sub::RemoveDenied(_) => store.remove_denied(&mid).map(|f| vec![f]),
                };
                let want = match (&s, want) {
                    (Sub::Remove(i), Ok(_)) => Ok(vec![m.keys.contains_key(POOL[*i])]),
                    (Sub::RemoveDenied(i), Ok(_)) => Ok(vec![m.denied.contains_key(POOL[*i])]),
                    (_, w) => w,
                };
                match (&got, &want) {
                    (Ok(g), Ok(w)) => assert_eq!(g, w, "{what}: {s:?}"),
                    (Err(e), Err(f)) => assert_eq!(fail_of(e), Some(*f), "{what}: {s:?}: {e}"),
                    _ => panic!("{what}: {s:?}: got {got:?}, model {want:?}"),
                }
                m = after;
            }
            3..=5 => {
                let k = usize::from(arg % 4) + 1;
                let mut subs = Vec::new();
                for j in 0..k {
                    let (a, i, g) = (inp.u8(), inp.u8(), inp.u8());
                    subs.push(sub(a, usize::from(i) % POOL.len(), g, n * 8 + j as u64));
                }
                let mut after = m.clone();
                let want = model_batch(&mut after, &subs, capacity);
                let got = lib_batch(&store, &subs);
                match (&got, &want) {
                    (Ok(g), Ok(w)) => assert_eq!(g, w, "{what}: {subs:?}"),
                    (Err(e), Err(f)) => {
                        assert_eq!(fail_of(e), Some(*f), "{what}: {subs:?}: {e}")
                    }
                    _ => panic!("{what}: {subs:?}: got {got:?}, model {want:?}"),
                }
                // A failed batch changes nothing (the model is left as it was).
                m = after;
            }
            6 => {
                let before = mtimes(&store);
                store.compact(None).expect("compact");
                assert_eq!(mtimes(&store), before, "{what}: compaction changed mtimes");
            }
            7 => {
                let size = SIZES[usize::from(arg % 5)];
                let cap = size - 1;
                let (k, d) = (m.keys.len() as u64, m.denied.len() as u64);
                if k > cap || d > cap {
                    // Does not fit: refused, both banks unchanged (checked
                    // against the model below, at the old size).
                    let r = store.compact(Some(size));
                    assert!(
                        matches!(r, Err(Error::TableFull { .. })),
                        "{what}: compact into {size}: {r:?}"
                    );
                } else {
                    let before = mtimes(&store);
                    store
                        .compact(Some(size))
                        .expect("compact into another size");
                    params.size = size;
                    store = Store::open_with(dir, &opts(params)).expect("reopen");
                    reader = Store::open_with(dir, &opts(params)).expect("reopen");
                    assert_eq!(mtimes(&store), before, "{what}: compaction changed mtimes");
                }
            }
            8 => {
                drop(store);
                store = Store::open_with(dir, &opts(params)).expect("reopen");
            }
            _ => check_model(&reader, &m, &format!("{what} (second handle)")),
        }
        check_model(&store, &m, &what);
    }
    check_model(&reader, &m, "end (second handle)");
}
