//! Stalls: the disk of the member a replicator watches (fsfreeze), that
//! member stopped (SIGSTOP), a replicator stopped, and etcd compacting and
//! defragmenting its data while the replicas follow.

use std::time::{Duration, Instant};

use keycache_testkit::etcd::Cluster;
use keycache_testkit::skip::skip;

use super::guards::{Freeze, LoopMount};
use super::{Findings, Watched};

/// Resumes a member stopped with SIGSTOP when dropped.
struct Paused<'a> {
    c: &'a Cluster,
    i: usize,
    on: bool,
}

impl<'a> Paused<'a> {
    fn new(c: &'a Cluster, i: usize) -> Paused<'a> {
        c.pause_member(i);
        Paused { c, i, on: true }
    }

    fn resume(&mut self) {
        if std::mem::replace(&mut self.on, false) {
            self.c.resume_member(self.i);
        }
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.resume();
    }
}

/// Three members whose data directories are each on an ext4 of their own
/// (a loop device). A watches one of them (found from its connections);
/// B's config names the other two. That member's filesystem frozen
/// (`fsfreeze -f`: its WAL writes and fsyncs block, its raft loop with
/// them, while it still answers on its client port), K is revoked through
/// B: within the bound A drops K or says it is stale. Thawed, every
/// replica equals etcd.
#[test]
fn a_member_whose_disk_stalls_does_not_keep_a_revoked_key_on_its_watchers() {
    let what = "etcd_faults::stall::a_member_whose_disk_stalls_does_not_keep_a_revoked_key_on_its_watchers";
    if !keycache_testkit::skip::needs_root(what) {
        return;
    }
    if let Err(why) = super::guards::run("fsfreeze", &["--version"]) {
        skip(what, &format!("no fsfreeze: {why}"));
        return;
    }
    let mut mounts = Vec::new();
    for _ in 0..3 {
        match LoopMount::new(160) {
            Ok(m) => mounts.push(m),
            Err(why) => {
                skip(what, &format!("cannot make a loop-mounted ext4: {why}"));
                return;
            }
        }
    }
    let dirs: Vec<_> = mounts.iter().map(|m| m.dir().join("data")).collect();
    let c = Cluster::start_in(&dirs);
    let w = Watched::start(&c, Vec::new());
    let mut frozen = Freeze::new(&mounts[w.x].dir()).unwrap_or_else(|e| panic!("{e}"));
    w.revoke_across_fault(
        &c,
        Duration::from_secs(1),
        || frozen.thaw().unwrap_or_else(|e| panic!("{e}")),
        Duration::from_secs(10),
    );
}

/// The member A watches stopped with SIGSTOP (it keeps its sockets and
/// answers nothing); K revoked through B, whose config names the other
/// two: within the bound A drops K or says it is stale. Continued, every
/// replica equals etcd.
#[test]
fn a_stopped_member_does_not_keep_a_revoked_key_on_its_watchers() {
    let c = Cluster::start(3);
    let w = Watched::start(&c, Vec::new());
    let mut paused = Paused::new(&c, w.x);
    w.revoke_across_fault(
        &c,
        Duration::from_secs(1),
        || paused.resume(),
        Duration::from_secs(10),
    );
}

/// A's replicator stopped with SIGSTOP; K revoked through B: within the
/// bound A says it is stale (it cannot drop K). Continued, A drops K and
/// equals etcd.
#[test]
fn a_stopped_replicator_makes_its_master_stale() {
    let c = Cluster::start(1);
    let (m, reps) = super::replicated(&c, &["a", "b"]);
    let (a, b) = (&m[0], &m[1]);
    let k = a.ids("minions")[0].clone();
    let mut f = Findings::default();
    reps[0].pause(true);
    let ack = b.revoke(&k);
    f.hold(&[a, b], &[&k], ack, ack, Duration::from_secs(1));
    reps[0].pause(false);
    f.same(&[a, b], Duration::from_secs(10));
    f.finish();
}

/// Compaction and defragmentation: K1 revoked while A's replicator is down,
/// etcd compacted past A's revision and defragmented, A's replicator
/// started again (it must list); then K2 revoked while A replicates, etcd
/// compacted at once and defragmented again. Each revocation reaches A
/// and B within the bound; every replica equals etcd.
#[test]
fn compaction_and_defragmentation_do_not_keep_a_revoked_key() {
    let c = Cluster::start(3);
    let (m, mut reps) = super::replicated(&c, &["a", "b"]);
    let (a, b) = (&m[0], &m[1]);
    let accepted = a.ids("minions");
    let pending = a.ids("minions_pre");
    let (k1, k2) = (accepted[0].clone(), accepted[1].clone());
    let mut f = Findings::default();
    let defrag = || {
        c.etcdctl(&["defrag"])
            .unwrap_or_else(|e| panic!("etcdctl defrag: {e}"));
    };
    reps[0].kill();
    let ack = b.revoke(&k1);
    b.write("accept", &pending[0], &[]);
    c.compact(c.revision());
    defrag();
    reps[0] = a.replicate();
    let back = Instant::now();
    f.hold(&[a, b], &[&k1], ack, back, Duration::from_secs(1));
    let ack = b.revoke(&k2);
    c.compact(c.revision());
    defrag();
    b.write("accept", &pending[1], &[]);
    f.hold(&[a, b], &[&k2], ack, ack, Duration::from_secs(1));
    f.same(&[a, b], Duration::from_secs(10));
    f.finish();
}
