//! What the replica tests share: a replicator on its own thread, waits on
//! the recorded revision, puts through etcdctl.
#![allow(dead_code)]

use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keycache::audit::Actor;
use keycache::store::{KeyState, Store};
use keycache::tree::TreeSync;
use keycache::Bank;
use keycache::MinionId;
use keycache_etcd::write::{Current, Decision, Writer};
use keycache_etcd::{block_on, ReplicaState, Replicator, Report, Settings, Value};
use keycache_testkit::common::pem;
use keycache_testkit::etcd::Cluster;

pub fn id(s: &str) -> MinionId {
    MinionId::new(s).expect("id")
}

/// `N` new temporary directories, each removed when dropped.
pub fn dirs<const N: usize>() -> [tempfile::TempDir; N] {
    std::array::from_fn(|_| tempfile::tempdir().expect("dir"))
}

pub fn open(dir: &Path) -> Store {
    Store::open(dir)
        .expect("open store")
        .with_tree(TreeSync::On)
}

/// A replicator on its own thread, stopped when dropped.
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    pub fn start(settings: &Settings, dir: &Path) -> Running {
        Running::reporting(settings, dir, |_| {})
    }

    /// [`Running::start`], each report also given to `sink`.
    pub fn reporting(
        settings: &Settings,
        dir: &Path,
        sink: impl FnMut(&Report) + Send + 'static,
    ) -> Running {
        Running::of(settings, open(dir), sink)
    }

    /// [`Running::reporting`] of a store opened by the caller.
    pub fn of(
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

pub fn revision_of(dir: &Path) -> i64 {
    ReplicaState::read(dir)
        .expect("state")
        .map_or(0, |s| s.revision)
}

pub fn wait_for(dir: &Path, revision: i64) {
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
pub fn contents(dir: &Path) -> Vec<(Bank, String, Value)> {
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
pub fn first_byte(c: &Cluster, key: &str) -> u8 {
    let v = c.etcdctl(&["get", key, "--print-value-only"]).expect("get");
    v.as_bytes()[0]
}

/// Puts `key` into etcd with etcdctl: a `keys` value of `state` (1
/// accepted, 2 pending, 3 rejected) and `name`'s key.
pub fn put_key(c: &Cluster, key: &str, state: u8, name: &str) {
    let mut v = vec![state];
    v.extend_from_slice(pem(name, 100).as_bytes());
    c.etcdctl(&["put", key, std::str::from_utf8(&v).expect("utf8")])
        .expect("put");
}

/// What most tests begin with: a one-member cluster, the settings of
/// `prefix` in it, and an empty store directory.
pub fn one_member(prefix: &str) -> (Cluster, Settings, tempfile::TempDir) {
    let c = Cluster::start(1);
    let st = settings(&c, prefix);
    (c, st, tempfile::tempdir().expect("dir"))
}

pub fn settings(c: &Cluster, prefix: &str) -> Settings {
    Settings::plain(c.endpoints(), prefix).expect("settings")
}

/// A writer for the store in `dir` recording as `by`, given to `f`, on a
/// runtime of this call (a client does not outlive its runtime).
pub fn with_writer<T>(
    st: &Settings,
    dir: &Path,
    by: Option<&Actor>,
    f: impl AsyncFnOnce(&mut Writer) -> keycache_etcd::Result<T>,
) -> keycache_etcd::Result<T> {
    block_on(async {
        let mut w = Writer::connect(st.clone(), dir).await?;
        w.set_actor(by.cloned());
        f(&mut w).await
    })
}

/// A [`Writer::update`] decision: accept a key etcd holds pending, skip
/// any other (`not pending`).
pub fn accept_pending(_: &MinionId, cur: &Current) -> Decision {
    match &cur.key {
        Some((KeyState::Pending, p)) => Decision::Write(vec![(
            Bank::Keys,
            Some(Value::Key(KeyState::Accepted, p.clone())),
        )]),
        _ => Decision::Skip("not pending".into()),
    }
}

/// A [`Writer::update`] decision: remove the id from both banks, as
/// `salt-key -d` does.
pub fn delete_everywhere(_: &MinionId, _: &Current) -> Decision {
    Decision::Write(vec![(Bank::Keys, None), (Bank::Denied, None)])
}
