//! Faults of the store directory and of what etcd holds: two replicators on
//! one store, a store copied from a live replica, a replica changed behind
//! its replicator's back, a value in etcd that is not a key.

use std::path::Path;
use std::time::{Duration, Instant};

use keycache_testkit::etcd::Cluster;

use super::{etcd_put, etcd_value, wait_log, wait_same, Findings, Master, BOUND, PREFIX};
use crate::common::s;

/// A second `keycache replicate -c A` while the first runs exits 2 within
/// 10 s, naming the first one's pid and the lock file; the first goes on:
/// a revocation through B still reaches A.
#[test]
fn a_second_replicator_on_one_store_is_refused_and_the_first_goes_on() {
    let c = Cluster::start(1);
    let (m, mut reps) = super::replicated(&c, &["a", "b"]);
    let (a, b) = (&m[0], &m[1]);
    let mut f = Findings::default();
    let first = reps[0].pid();
    let mut second = a.replicate();
    match second.wait_exit(Duration::from_secs(10)) {
        Some(st) => {
            let log = second.log();
            if st.code() != Some(2)
                || !log.contains(&first.to_string())
                || !log.contains(".keycache-etcd.lock")
            {
                f.note(Err(format!(
                    "the second replicator of A exited {st} (want 2) and said (want the first \
                     one's pid {first} and .keycache-etcd.lock):\n{log}"
                )));
            }
        }
        None => {
            f.note(Err(format!(
                "a second `keycache replicate -c A` still runs 10 s after it started, beside \
                 the first (pid {first}); it said:\n{}",
                second.log()
            )));
            second.kill();
        }
    }
    if !reps[0].running() {
        f.note(Err(format!(
            "the first replicator of A exited:\n{}",
            a.logs()
        )));
    }
    let k = a.ids("minions")[0].clone();
    let ack = b.revoke(&k);
    let dropped = super::poll(BOUND, Duration::from_millis(50), || {
        (!a.holds_accepted(&k)).then_some(())
    });
    if dropped.is_none() {
        f.note(Err(format!(
            "A still holds {k} accepted {BOUND:?} after its revocation through B:\n{}",
            a.logs()
        )));
    }
    f.hold(&[a, b], &[&k], ack, ack, Duration::from_millis(500));
    f.same(&[a], Duration::from_secs(10));
    f.finish();
}

/// Copies the files of `from` into `to` as `cp -a` or tar would, but for
/// the names `skip` (copied later by [`copy_file`]): directories first,
/// then files, modes kept.
fn copy_tree(from: &Path, to: &Path, skip: &[&str]) {
    for e in std::fs::read_dir(from).expect("read the store directory") {
        let e = e.expect("entry");
        let name = e.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        let ty = e.file_type().expect("type");
        if ty.is_dir() {
            std::fs::create_dir_all(&dst).expect("mkdir");
            copy_tree(&src, &dst, &[]);
        } else if ty.is_file() {
            std::fs::copy(&src, &dst).expect("copy");
        }
    }
}

fn copy_file(from: &Path, to: &Path, name: &str) {
    std::fs::copy(from.join(name), to.join(name)).expect("copy");
}

/// A's store copied while changes go on through B (the bank files and the
/// tree first; then two revocations and an accept land, which A applies;
/// then `.keycache-etcd`, last), and master C made with the copy: C's
/// replicator must not keep a key accepted that etcd revoked (the
/// invariant, from C's start), and C's replica ends equal to etcd.
#[test]
fn a_store_copied_from_a_live_replica_does_not_keep_revoked_keys() {
    let c = Cluster::start(1);
    let (m, _reps) = super::replicated(&c, &["a", "b"]);
    let (a, b) = (&m[0], &m[1]);
    let mut f = Findings::default();
    let accepted = a.ids("minions");
    let pending = a.ids("minions_pre");
    let copy = Master::new("c", &c);
    copy_tree(&a.pki, &copy.pki, &[".keycache-etcd"]);
    let k1 = accepted[0].clone();
    let k2 = accepted[1].clone();
    b.revoke(&k1);
    b.write("accept", &pending[0], &[]);
    let ack = b.write("reject", &k2, &["--include-all"]);
    a.wait_for(c.revision());
    copy_file(&a.pki, &copy.pki, ".keycache-etcd");
    assert!(
        copy.pki.join("minions").join(&k1).exists(),
        "the copy's tree is from before the revocations"
    );
    let _rc = copy.replicate();
    let started = Instant::now();
    f.hold(&[&copy], &[&k1, &k2], ack, started, Duration::from_secs(2));
    f.same(&[&copy], Duration::from_secs(10));
    f.finish();
}

/// A's store made to differ from etcd without etcd, its replicator
/// stopped: `.keycache-etcd` moved aside, a pending key accepted locally
/// (the CLI refuses a local write to a replica), the file moved back. A's
/// replicator started with `check_every: 1` finds the difference by its
/// consistency check within a few seconds: the replica equals etcd again,
/// the log says so (a line with "consistency"), and `etcd status --json`
/// has a `check` object.
#[test]
fn a_replica_changed_behind_its_replicators_back_is_mended_by_the_consistency_check() {
    let c = Cluster::start(1);
    let (m, mut reps) = super::replicated(&c, &["a"]);
    let a = &m[0];
    let mut f = Findings::default();
    reps[0].kill();
    let p = a.ids("minions_pre")[0].clone();
    let state = a.pki.join(".keycache-etcd");
    let aside = a.t.path().join("state-aside");
    std::fs::rename(&state, &aside).expect("move the state aside");
    a.kc()
        .args(["accept", s(&a.pki), &p, "--size", "1009"])
        .ok();
    std::fs::rename(&aside, &state).expect("move the state back");
    assert!(a.holds_accepted(&p), "accepted behind etcd's back");
    let (code, _, text) = a.diff();
    assert_eq!(code, Some(1), "the replica differs from etcd:\n{text}");
    a.write_config("  check_every: 1\n");
    reps[0] = a.replicate();
    f.note(wait_same(a, Duration::from_secs(10)));
    if a.holds_accepted(&p) {
        f.note(Err(format!(
            "A still holds {p} accepted (etcd: pending):\n{}",
            a.logs()
        )));
    }
    f.note(wait_log(a, "consistency", Duration::from_secs(5)));
    let (code, v, out) = a.status_json();
    if v.get("check").is_none_or(serde_json::Value::is_null) {
        f.note(Err(format!(
            "`keycache etcd status -c A --json` (exit {code:?}) has no check object:\n{out}"
        )));
    }
    f.finish();
}

/// A value put straight into etcd that is not a key (state byte 1,
/// accepted, then bytes that are not a PEM public key) over an accepted
/// key: no master holds the id accepted once it applied the revision, and
/// each replicator's log names the etcd key as "not held here".
#[test]
fn a_value_that_is_not_a_key_grants_nothing() {
    let c = Cluster::start(1);
    let (m, _reps) = super::replicated(&c, &["a", "b"]);
    let (a, b) = (&m[0], &m[1]);
    let mut f = Findings::default();
    let id = "evil";
    let key = format!("{PREFIX}keys/{id}");
    let good = etcd_value(&c, &format!("{PREFIX}keys/{}", a.ids("minions")[0])).expect("a key");
    let rev = etcd_put(&c, &key, &good);
    for x in [a, b] {
        x.wait_for(rev);
        assert!(x.holds_accepted(id), "{} holds {id} accepted first", x.name);
    }
    let rev = etcd_put(&c, &key, "\u{1}not a pem");
    for x in [a, b] {
        x.wait_for(rev);
        if x.holds_accepted(id) {
            let listed = x.ids("minions").iter().any(|i| i == id);
            f.note(Err(format!(
                "master {} holds {id} accepted after applying {key} = \"\\x01not a pem\" \
                 (revision {rev}; minions/{id}: {}, listed accepted: {listed}):\n{}",
                x.name,
                x.pki.join("minions").join(id).exists(),
                x.logs()
            )));
        }
        f.note(wait_log(
            x,
            &format!("not held here: {key}"),
            Duration::from_secs(5),
        ));
    }
    f.finish();
}
