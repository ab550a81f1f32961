//! The replica's proofs against etcd's history and key state: the anchor
//! read back before a resume, the consistency check and its `not_held`
//! rule, bank files replaced behind a running replicator.

mod common;

use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use keycache::store::{KeyState, Store};
use keycache::tree::TreeSync;
use keycache_etcd::{block_on, ReplicaState, Report, Settings};
use keycache_testkit::etcd::Cluster;

use common::*;

/// A replicator of the store in `dir`, and the result of each of its
/// consistency checks as it comes.
fn checking(st: &Settings, dir: &Path) -> (Running, Receiver<&'static str>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let r = Running::reporting(st, dir, move |rep| {
        if let Report::Checked { result, .. } = rep {
            let _ = tx.send(*result);
        }
    });
    (r, rx)
}

/// The first check result other than `equal`, or the first to come once
/// `within` has passed.
fn first_not_equal(rx: &Receiver<&'static str>, within: Duration) -> &'static str {
    let start = Instant::now();
    loop {
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("a check");
        if r != "equal" || start.elapsed() > within {
            return r;
        }
    }
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
    let (c, mut st, dir) = one_member("/keycache/t12/");
    st.check_every = Duration::from_secs(1);
    put_key(&c, "/keycache/t12/keys/p", 2, "p");
    let (_r, rx) = checking(&st, dir.path());
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
    let result = first_not_equal(&rx, Duration::from_secs(10));
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
    let (c, st, dir) = one_member("/keycache/t13/");
    put_key(&c, "/keycache/t13/keys/a", 1, "a");
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
    let (c, mut st, dir) = one_member("/keycache/t14/");
    st.check_every = Duration::from_secs(1);
    for i in 0..12 {
        put_key(
            &c,
            &format!("/keycache/t14/keys/n{i:02}"),
            2,
            &format!("n{i}"),
        );
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
    let (c, mut st, dir) = one_member("/keycache/t15/");
    st.check_every = Duration::from_secs(1);
    put_key(&c, "/keycache/t15/keys/q", 1, "q");
    let version = c.etcdctl(&["version"]).expect("version");
    let exact = version
        .lines()
        .find_map(|l| l.strip_prefix("etcdctl version: "))
        .and_then(|v| {
            let p: Vec<u32> = v.trim().split('.').filter_map(|x| x.parse().ok()).collect();
            (p.len() == 3).then(|| (p[0], p[1], p[2]) >= (3, 5, 8))
        })
        .expect("etcdctl's version");
    let (_r, rx) = checking(&st, dir.path());
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
    // A check already under way may still say equal.
    let after = first_not_equal(&rx, Duration::from_secs(3));
    assert_eq!(
        after,
        if exact { "equal" } else { "skipped" },
        "etcd {version}"
    );
}

/// A `minions/<id>` removed by hand from a replica's key tree is reported
/// by the next consistency check (the report, and the state `keycache etcd
/// status` reads), and never written back by the replicator: a file
/// removed by hand may be a revocation, which an operator looks at.
#[test]
fn a_key_file_removed_by_hand_is_reported_and_not_written_back() {
    let (c, mut st, dir) = one_member("/keycache/t16/");
    st.check_every = Duration::from_secs(1);
    put_key(&c, "/keycache/t16/keys/a", 1, "a");
    let (tx, rx) = std::sync::mpsc::channel();
    let _r = Running::reporting(&st, dir.path(), move |rep| {
        if let Report::TreeDisagrees { count, first } = rep {
            let _ = tx.send((*count, first.clone()));
        }
    });
    wait_for(dir.path(), c.revision());
    let file = dir.path().join("minions/a");
    assert!(file.exists(), "the replica writes the accepted key's file");
    std::fs::remove_file(&file).expect("remove by hand");
    let (count, first) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a report of the tree");
    assert_eq!(count, 1);
    assert!(first.contains("minions/a"), "{first}");
    let check = ReplicaState::read(dir.path())
        .expect("read")
        .expect("state")
        .check
        .expect("a check recorded");
    assert_eq!(check.tree, Some(1), "{check:?}");
    // Checks go on; the file stays removed.
    let _ = rx.recv_timeout(Duration::from_secs(3));
    assert!(!file.exists(), "written back without an operator");
}
