//! A peer's store as the model sees it ([`Model`]), read back by the library,
//! and the `keycache` binary run on the stores with the test layout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Output;

use keycache::Bank;

use crate::common;
use crate::common::{check_ok, small, Params};

/// (bank, id) -> (state, key): a peer's store as the model sees it. The
/// state is `accepted`, `pending`, `rejected`, or `denied` for the
/// `denied_keys` bank.
pub(super) type Model = BTreeMap<(Bank, String), (&'static str, String)>;

pub(super) fn layout() -> Params {
    small(1009, 1 << 20)
}

/// Runs the keycache binary with the test layout; rebuilds do not wait
/// (no Salt process maps the files meanwhile).
pub(super) fn kc(args: &[&str]) -> Output {
    common::kc()
        .args(args)
        .layout(&layout())
        .no_settle()
        .output()
}

pub(super) fn ok(out: &Output, what: &str) {
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
pub(super) fn read(dir: &Path) -> Model {
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

/// Entries whose value differs between two models.
pub(super) fn count_changes(a: &Model, b: &Model) -> u64 {
    let keys: BTreeSet<_> = a.keys().chain(b.keys()).collect();
    keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).count() as u64
}
