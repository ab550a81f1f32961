//! The audit trail in etcd mode, against a real etcd member on 127.0.0.1:
//! records committed with the changes they record, appended by every
//! replicator to its store's log in revision order, passed over as key
//! state, and trimmed by the retention.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use etcd_client::GetOptions;
use keycache::audit::{Actor, Record};
use keycache::store::{KeyState, Store};
use keycache::Bank;
use keycache_etcd::write::Decision;
use keycache_etcd::{block_on, Report, Settings, Value};
use keycache_testkit::common::pem;
use keycache_testkit::etcd::Cluster;

mod common;

use common::*;

fn actor(user: &str, master: &str) -> Actor {
    Actor {
        user: Some(user.into()),
        sudo_user: Some(format!("{user}-sudo")),
        program: "keycache".into(),
        master: Some(master.into()),
        reason: Some(format!("CHG-{user}")),
        action: None,
    }
}

fn key_of(name: &str) -> Vec<u8> {
    pem(name, 100).into_bytes()
}

/// The records of the log of the store in `dir` (none torn).
fn log(dir: &Path) -> Vec<Record> {
    let (records, torn) = keycache::audit::read(dir).expect("read the log");
    assert_eq!(torn, 0, "torn lines in {}", dir.display());
    records
}

/// Every audit key in etcd: (key, mod_revision, value), in key order.
fn audit_kvs(st: &Settings) -> Vec<(String, i64, Vec<u8>)> {
    block_on(async {
        let mut cl = st.connect().await?;
        let l = &st.layout;
        let r = cl
            .get(
                l.audit_prefix(),
                Some(GetOptions::new().with_range(l.audit_range_end())),
            )
            .await
            .map_err(|e| keycache_etcd::Error::Config(e.to_string()))?;
        Ok(r.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.mod_revision(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    })
    .expect("audit keys")
}

/// A sink of reports to look at later.
fn sink() -> (
    Arc<Mutex<Vec<Report>>>,
    impl FnMut(&Report) + Send + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    (seen, move |r: &Report| {
        s.lock().expect("lock").push(r.clone())
    })
}

/// Waits (at most 20 s) until `seen` holds a report `f` picks.
fn wait_report(seen: &Arc<Mutex<Vec<Report>>>, what: &str, f: impl Fn(&Report) -> bool) {
    let start = Instant::now();
    while !seen.lock().expect("lock").iter().any(&f) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no {what} report: {:?}",
            seen.lock().expect("lock")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What one record must say.
struct Want<'a> {
    id: &'a str,
    action: &'a str,
    from: Option<&'a str>,
    to: Option<&'a str>,
    key: &'a str,
    by: &'a Actor,
    revision: i64,
}

fn check(got: &[Record], want: &[Want<'_>]) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (g, w) in got.iter().zip(want) {
        let what = format!("{g:?}");
        assert_eq!(g.id, w.id, "{what}");
        assert_eq!(g.action, w.action, "{what}");
        assert_eq!(g.from.as_deref(), w.from, "{what}");
        assert_eq!(g.to.as_deref(), w.to, "{what}");
        assert_eq!(
            g.finger,
            Some(keycache::pem::finger(&key_of(w.key))),
            "{what}"
        );
        assert_eq!(g.replaced_finger, None, "{what}");
        assert_eq!(g.user, w.by.user, "{what}");
        assert_eq!(g.sudo_user, w.by.sudo_user, "{what}");
        assert_eq!(g.program, w.by.program, "{what}");
        assert_eq!(g.master, w.by.master, "{what}");
        assert_eq!(g.reason, w.by.reason, "{what}");
        assert_eq!(g.revision, Some(w.revision), "{what}");
        let t = g.millis().expect("time");
        assert!((now - 60_000..=now).contains(&t), "{what}");
    }
}

/// Signs `ids` in (pending, each its own key); the revision.
fn sign_in(st: &Settings, dir: &Path, by: Option<&Actor>, ids: &[&str]) -> i64 {
    let ids: Vec<_> = ids.iter().map(|i| id(i)).collect();
    with_writer(st, dir, by, async |w| {
        w.update(&ids, |id, _| {
            Decision::Write(vec![(
                Bank::Keys,
                Some(Value::Key(KeyState::Pending, key_of(id.as_str()))),
            )])
        })
        .await
    })
    .expect("sign in")
    .revision
}

/// Accepts the pending keys of `ids`; the revision.
fn accept(st: &Settings, dir: &Path, by: Option<&Actor>, ids: &[&str]) -> i64 {
    let ids: Vec<_> = ids.iter().map(|i| id(i)).collect();
    with_writer(st, dir, by, async |w| w.update(&ids, accept_pending).await)
        .expect("accept")
        .revision
}

/// Writes with an actor through two masters (an update on A, a driver
/// removal on B) reach both masters' logs: the same records in the same
/// order, each with the revision etcd committed it at, in the writer's
/// master's log by the time the write returns; a write without an actor
/// leaves none. A third master listing etcd later logs the same records;
/// no audit key is reported as a key the store cannot hold.
#[test]
fn every_master_logs_every_record_at_the_revision_etcd_committed_it() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/audit1/");
    let [a, b, later] = dirs();
    let (seen_a, sink_a) = sink();
    let _ra = Running::reporting(&st, a.path(), sink_a);
    let _rb = Running::start(&st, b.path());
    let at = c.revision();
    wait_for(a.path(), at);
    wait_for(b.path(), at);
    let (alice, bob) = (actor("alice", "a"), actor("bob", "b"));

    let r1 = sign_in(&st, a.path(), Some(&alice), &["m1", "m2"]);
    // In A's log by the time the write returned.
    assert_eq!(log(a.path()).len(), 2);
    let r2 = accept(&st, a.path(), Some(&alice), &["m1"]);
    assert_eq!(log(a.path()).len(), 3);
    // Without an actor: no record, no audit key.
    let r3 = accept(&st, b.path(), None, &["m2"]);
    assert_eq!(audit_kvs(&st).len(), 2);
    // Salt's driver on B removes m1 (salt-key -d): one entry, one record.
    let expected = Value::Key(KeyState::Accepted, key_of("m1"));
    let r4 = with_writer(&st, b.path(), Some(&bob), async |w| {
        w.put_if(Bank::Keys, &id("m1"), Some(&expected), None).await
    })
    .expect("remove");
    assert!(r1 < r2 && r2 < r3 && r3 < r4, "{r1} {r2} {r3} {r4}");
    let want = [
        Want {
            id: "m1",
            action: "sign-in",
            from: None,
            to: Some("pending"),
            key: "m1",
            by: &alice,
            revision: r1,
        },
        Want {
            id: "m2",
            action: "sign-in",
            from: None,
            to: Some("pending"),
            key: "m2",
            by: &alice,
            revision: r1,
        },
        Want {
            id: "m1",
            action: "accept",
            from: Some("pending"),
            to: Some("accepted"),
            key: "m1",
            by: &alice,
            revision: r2,
        },
        Want {
            id: "m1",
            action: "delete",
            from: Some("accepted"),
            to: None,
            key: "m1",
            by: &bob,
            revision: r4,
        },
    ];
    // In B's log by the time the removal returned.
    check(&log(b.path()), &want);
    wait_for(a.path(), r4);
    check(&log(a.path()), &want);
    assert_eq!(log(a.path()), log(b.path()));
    // One audit key per transaction, at the revision of its change.
    let revs: Vec<i64> = audit_kvs(&st).iter().map(|k| k.1).collect();
    assert_eq!(revs, [r1, r2, r4]);

    // A master that lists etcd later logs the same records.
    let _rl = Running::start(&st, later.path());
    wait_for(later.path(), r4);
    assert_eq!(log(later.path()), log(a.path()));
    // Audit keys are no key state: one key (m2) in the prefix, and none
    // reported as a key the store cannot hold.
    let (n, _) = block_on(async {
        let mut cl = st.connect().await?;
        keycache_etcd::seed::count(&mut cl, &st).await
    })
    .expect("count");
    assert_eq!(n, 1);
    assert_eq!(contents(a.path()).len(), 1);
    for r in seen_a.lock().expect("lock").iter() {
        if let Report::Applied { applied, .. } | Report::Listed { applied, .. } = r {
            assert!(applied.refused.is_empty(), "{r:?}");
        }
    }
}

/// A write returns with its record in its master's log (the replicator
/// appends a batch's records before it records the batch's revision),
/// round after round on two masters.
#[test]
fn a_write_returns_with_its_record_in_its_masters_log() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/audit4/");
    let dirs: [_; 2] = dirs();
    let _r: Vec<Running> = dirs.iter().map(|d| Running::start(&st, d.path())).collect();
    for d in &dirs {
        wait_for(d.path(), c.revision());
    }
    let by = actor("carol", "c");
    for i in 0..40 {
        let dir = dirs[i % 2].path();
        let name = format!("r{i}");
        let v = Value::Key(KeyState::Pending, key_of(&name));
        let rev = with_writer(&st, dir, Some(&by), async |w| {
            w.put_if(Bank::Keys, &id(&name), None, Some(v)).await
        })
        .expect("sign in");
        let last = log(dir).pop().expect("a record");
        assert_eq!(
            (last.id.as_str(), last.revision),
            (name.as_str(), Some(rev))
        );
    }
}

/// A prefix that holds only audit keys (every key deleted) is empty: a
/// replica listed from it resumes after a restart (its anchor, none, still
/// holds), its consistency check finds it equal, its log keeps each record
/// once, and a seed into it is not refused.
#[test]
fn a_prefix_of_audit_keys_alone_is_an_empty_prefix() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/audit2/");
    let [a, d] = dirs();
    let _ra = Running::start(&st, a.path());
    wait_for(a.path(), c.revision());
    let alice = actor("alice", "a");
    sign_in(&st, a.path(), Some(&alice), &["x"]);
    with_writer(&st, a.path(), Some(&alice), async |w| {
        w.update(&[id("x")], delete_everywhere).await
    })
    .expect("delete");
    assert_eq!(audit_kvs(&st).len(), 2);
    {
        let (seen, s) = sink();
        let _rd = Running::reporting(&st, d.path(), s);
        wait_for(d.path(), c.revision());
        wait_report(&seen, "listed", |r| matches!(r, Report::Listed { .. }));
    }
    assert_eq!(log(d.path()), log(a.path()));
    let (seen, s) = sink();
    let _rd = Running::reporting(&st, d.path(), s);
    wait_report(&seen, "checked", |r| matches!(r, Report::Checked { .. }));
    for r in seen.lock().expect("lock").iter() {
        assert!(
            !matches!(r, Report::Relist { .. } | Report::Listed { .. }),
            "{r:?}"
        );
        if let Report::Checked { result, .. } = r {
            assert_eq!(*result, "equal", "{r:?}");
        }
    }
    assert_eq!(log(d.path()).len(), 2);
    // A seed into it is not refused.
    let src = tempfile::tempdir().expect("dir");
    Store::open(src.path())
        .expect("open")
        .batch(|b| b.put(&id("y"), KeyState::Accepted, &key_of("y")))
        .expect("store");
    let seeded = block_on(async {
        let mut cl = st.connect().await?;
        keycache_etcd::seed::seed(&mut cl, &st, &Store::open(src.path())?, false).await
    })
    .expect("seed into a prefix of audit keys alone");
    assert_eq!(seeded.put, 1);
}

/// The retention deletes, at a consistency check, the audit keys older
/// than the cutoff and only those; the logs keep every record; a check
/// that finds nothing to trim deletes nothing.
#[test]
fn the_retention_deletes_only_the_audit_keys_older_than_the_cutoff() {
    let (c, mut st, a) = one_member("/keycache/audit3/");
    st.audit_retention = Duration::from_secs(3600);
    st.check_every = Duration::from_millis(200);
    let now = SystemTime::now();
    let ages = [3 * 3600, 3600 + 60, 3600 - 60, 0];
    let record = |i: usize| Record {
        time: keycache::audit::rfc3339(now - Duration::from_secs(ages[i])),
        id: format!("m{i}"),
        action: "accept".into(),
        from: Some("pending".into()),
        to: Some("accepted".into()),
        finger: Some(keycache::pem::finger(&key_of("m"))),
        program: "keycache".into(),
        ..Record::default()
    };
    let keys: Vec<Vec<u8>> = (0..ages.len())
        .map(|i| {
            st.layout.audit_key(
                now - Duration::from_secs(ages[i]),
                keycache_etcd::audit::nonce(),
            )
        })
        .collect();
    block_on(async {
        let mut cl = st.connect().await?;
        for (i, k) in keys.iter().enumerate() {
            cl.put(k.clone(), keycache_etcd::audit::value(&[record(i)]), None)
                .await
                .map_err(|e| keycache_etcd::Error::Config(e.to_string()))?;
        }
        Ok(())
    })
    .expect("put audit keys");
    let (seen, s) = sink();
    let _ra = Running::reporting(&st, a.path(), s);
    wait_report(&seen, "trimmed", |r| {
        matches!(r, Report::AuditTrimmed { deleted: 2 })
    });
    let left: Vec<Vec<u8>> = audit_kvs(&st)
        .into_iter()
        .map(|k| k.0.into_bytes())
        .collect();
    assert_eq!(left, keys[2..]);
    // Listed before the first check: every record, in revision order.
    let ids: Vec<String> = log(a.path()).into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["m0", "m1", "m2", "m3"]);
    // Two checks more: nothing more to trim, nothing written.
    let rev = c.revision();
    let checks = |seen: &Arc<Mutex<Vec<Report>>>| {
        seen.lock()
            .expect("lock")
            .iter()
            .filter(|r| matches!(r, Report::Checked { .. }))
            .count()
    };
    let n = checks(&seen);
    let start = Instant::now();
    while checks(&seen) < n + 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "no more checks");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.revision(), rev);
    let trims = seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|r| {
            matches!(
                r,
                Report::AuditTrimmed { .. } | Report::AuditTrimFailed { .. }
            )
        })
        .count();
    assert_eq!(trims, 1);
    assert_eq!(log(a.path()).len(), 4);
}
