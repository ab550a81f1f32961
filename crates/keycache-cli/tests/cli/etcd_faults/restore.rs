//! etcd restored from a backup: every member's data directory replaced by
//! a restore of one snapshot, and the cluster started again. The key state
//! goes back to the backup's (revocations made after it are undone: etcd
//! is the truth), and so does the revision. With the same cluster token
//! the cluster id stays the same, so a replica that recorded a revision of
//! the old history cannot tell by the id; once etcd's revision passes the
//! one it recorded, nor by the revision.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use keycache_testkit::etcd::Cluster;

use super::{etcd_put, etcd_value, fill_past, wait_same, Findings, Master, Replicating, PREFIX};

/// The token the testkit's members start with.
const TOKEN: &str = "keycache-test";

/// Three members, masters `a`, `b`, `d` replicating the seeded sample; a
/// snapshot saved; after it a revocation and an accept through `b` and ten
/// new keys, which every replica applies. What the restore tests start from.
struct Backup {
    c: Cluster,
    a: Master,
    b: Master,
    d: Master,
    reps: Vec<Replicating>,
    snapshot: PathBuf,
    /// Accepted in the backup, untouched after it: revoked after the
    /// restore.
    k: String,
    /// Accepted in the backup, untouched after it.
    k2: String,
    /// Revoked after the backup (accepted again by the restore).
    r1: String,
    /// The highest revision a replica recorded before the restore.
    recorded: i64,
}

fn backup() -> Backup {
    let c = Cluster::start(3);
    let (mut masters, reps) = super::replicated(&c, &["a", "b", "d"]);
    let d = masters.pop().expect("d");
    let b = masters.pop().expect("b");
    let a = masters.pop().expect("a");
    let accepted = a.ids("minions");
    let pending = a.ids("minions_pre");
    assert!(accepted.len() >= 3 && !pending.is_empty(), "{accepted:?}");
    let snapshot = a.t.path().join("backup.db");
    c.snapshot_save(0, &snapshot);
    let r1 = accepted[2].clone();
    b.revoke(&r1);
    b.write("accept", &pending[0], &[]);
    // More keys under the prefix, so that the replicas record a revision
    // well past the backup's: the writes made after the restore (a health
    // check, a delete) do not reach it by chance.
    let value = etcd_value(&c, &format!("{PREFIX}keys/{}", accepted[0])).expect("a key");
    for n in 0..10 {
        etcd_put(&c, &format!("{PREFIX}keys/after-backup-{n}"), &value);
    }
    let now = c.revision();
    for m in [&a, &b, &d] {
        m.wait_for(now);
    }
    let recorded = [&a, &b, &d].iter().map(|m| m.revision()).max().unwrap_or(0);
    Backup {
        k: accepted[0].clone(),
        k2: accepted[1].clone(),
        r1,
        c,
        a,
        b,
        d,
        reps,
        snapshot,
        recorded,
    }
}

/// Stops every member, restores each from `snapshot` with `token`, starts
/// them and waits for a quorum.
fn restore_all(c: &mut Cluster, snapshot: &std::path::Path, token: &str) {
    let n = c.members.len();
    for i in 0..n {
        c.stop_member(i);
    }
    for i in 0..n {
        c.restore_member(i, snapshot, token);
    }
    for i in 0..n {
        c.start_member(i);
    }
    c.wait_healthy(Duration::from_secs(30));
}

/// Every member reports one cluster id; that id.
fn one_cluster_id(c: &Cluster) -> u64 {
    let ids = c.cluster_ids();
    assert!(
        !ids.is_empty() && ids.iter().all(|&i| i == ids[0]),
        "the members disagree on the cluster id: {ids:?}"
    );
    ids[0]
}

/// Restored with the same token (the same cluster id), the revision going
/// back below what the replicas recorded. Then: a write through master A,
/// whose replicator is stopped, must not be reported as applied (A still
/// holds the old history's revision, which is higher than the commit's):
/// exit 2 naming the commit's revision. K, accepted in the backup, is
/// revoked through B; filler keys outside the prefix take etcd's revision
/// past what A (replicator killed before the restore, restarted now) and D
/// (replicator stopped with SIGSTOP through the restore and the filler,
/// continued now) recorded, so that neither can tell the new history from
/// the old by the cluster id or the revision. Every master drops K or says
/// it is stale within the bound, and every replica ends equal to etcd.
#[test]
fn a_restore_with_the_same_token_reaches_every_replica() {
    let Backup {
        mut c,
        a,
        b,
        d,
        mut reps,
        snapshot,
        k,
        k2,
        r1,
        recorded,
    } = backup();
    let mut f = Findings::default();
    let before = one_cluster_id(&c);
    // A's replicator killed, B's too (B gets a new one on the restored
    // etcd), D's stopped.
    reps[0].kill();
    reps[1].kill();
    reps[2].pause(true);
    restore_all(&mut c, &snapshot, TOKEN);
    assert_eq!(
        one_cluster_id(&c),
        before,
        "a restore with the same token keeps the cluster id"
    );
    let restored = c.revision();
    assert!(
        restored < recorded,
        "the restore takes etcd's revision ({restored}) back below the replicas' ({recorded})"
    );
    assert!(a.holds_accepted(&k2), "A holds {k2} accepted before");
    // A write through A: etcd commits it at a revision below the one A
    // holds of the old history; A's replicator is not running, so the
    // replica has not applied it.
    let out = a.kc().args(["delete", "-c", a.c(), &k2]).output();
    let commit = c.revision();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() != Some(2) || !err.contains(&format!("revision {commit}")) {
        f.note(Err(format!(
            "`keycache delete -c A {k2}` right after the restore, A's replicator stopped: exit \
             {:?} (want 2, naming the commit's revision {commit}); A holds {k2} accepted: {}; \
             stdout: {}stderr: {err}",
            out.status.code(),
            a.holds_accepted(&k2),
            String::from_utf8_lossy(&out.stdout)
        )));
    }
    // B on the restored etcd: its replica equals etcd (it holds r1
    // accepted again) before anything is revoked through it.
    reps[1] = b.replicate();
    wait_same(&b, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"));
    assert!(b.holds_accepted(&r1), "the restore brought {r1} back");
    let ack = b.revoke(&k);
    fill_past(&c, recorded);
    reps[0] = a.replicate();
    reps[2].pause(false);
    let back = Instant::now();
    f.hold(&[&a, &b, &d], &[&k], ack, back, Duration::from_secs(2));
    f.same(&[&a, &b, &d], Duration::from_secs(10));
    f.finish();
}

/// Restored with a new token: a new cluster id. Replicator A kept running
/// (it reconnects), D's stopped through the restore and the filler (which
/// takes the revision past what both recorded): both list the new cluster
/// again; K revoked through B after the restore reaches every master within
/// the bound, and every replica ends equal to etcd.
#[test]
fn a_restore_with_a_new_token_makes_every_replica_list_again() {
    let Backup {
        mut c,
        a,
        b,
        d,
        reps,
        snapshot,
        k,
        r1,
        recorded,
        ..
    } = backup();
    let mut f = Findings::default();
    let before = one_cluster_id(&c);
    reps[2].pause(true);
    restore_all(&mut c, &snapshot, "keycache-test-restored");
    let after = one_cluster_id(&c);
    assert_ne!(after, before, "a new token makes a new cluster id");
    // B (kept running) lists the new cluster: it holds r1 accepted again.
    wait_same(&b, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"));
    assert!(b.holds_accepted(&r1), "the restore brought {r1} back");
    let ack = b.revoke(&k);
    fill_past(&c, recorded);
    reps[2].pause(false);
    let back = Instant::now();
    f.hold(&[&a, &b, &d], &[&k], ack, back, Duration::from_secs(2));
    f.same(&[&a, &b, &d], Duration::from_secs(10));
    f.finish();
}
