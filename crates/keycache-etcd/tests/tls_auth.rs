//! TLS (a CA, client certificates required) and etcd's own auth, against a
//! real etcd member on 127.0.0.1: the settings a production master uses.

use std::time::{Duration, Instant};

use keycache::store::{KeyState, Store};
use keycache::tree::TreeSync;
use keycache::Bank;
use keycache::MinionId;
use keycache_etcd::write::Writer;
use keycache_etcd::{block_on, ReplicaState, Replicator, Settings, Value};
use keycache_testkit::common::pem;
use keycache_testkit::etcd::{Cluster, Tls};

#[test]
fn a_replica_over_tls_with_a_client_certificate_and_a_password_works_and_wrong_ones_are_refused() {
    let certs = tempfile::tempdir().expect("dir");
    let tls = Tls::make(certs.path());
    let mut c = Cluster::start_with(1, Some(tls.clone()));
    // etcd's auth: root with a password, then auth on.
    c.etcdctl(&["user", "add", "root", "--new-user-password=s3cret"])
        .expect("user add");
    c.etcdctl(&["auth", "enable"]).expect("auth enable");
    c.user = Some("root:s3cret".into());
    let mut st = Settings::plain(c.endpoints(), "/keycache/tls/").expect("settings");
    assert!(
        st.endpoints[0].starts_with("https://"),
        "{:?}",
        st.endpoints
    );
    st.ca = Some(tls.ca.clone());
    st.identity = Some(tls.client.clone());
    st.user = Some(("root".into(), "s3cret".into()));

    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path())
        .expect("open")
        .with_tree(TreeSync::On);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s2 = st.clone();
    let t = std::thread::spawn(move || {
        let mut r = Replicator::new(s2, store, |_| {});
        block_on(async move {
            r.run(async {
                let _ = stopped.await;
            })
            .await
        })
    });
    let start = Instant::now();
    while ReplicaState::read(dir.path()).expect("state").is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the replica never listed over TLS"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let id = MinionId::new("tls-minion").expect("id");
    let v = Value::Key(KeyState::Pending, pem("tls", 100).into_bytes());
    block_on(async {
        let mut w = Writer::connect(st.clone(), dir.path()).await?;
        w.put_if(Bank::Keys, &id, None, Some(v)).await
    })
    .expect("a write over TLS with auth");
    let s = Store::open(dir.path()).expect("open");
    assert_eq!(
        s.get(&id).expect("get").map(|e| e.state),
        Some(KeyState::Pending)
    );
    assert!(dir.path().join("minions_pre/tls-minion").is_file());
    let _ = stop.send(());
    t.join().expect("join").expect("replicator");

    // A wrong password, no client certificate, no CA: refused, named.
    let count = |st: &Settings| {
        block_on(async {
            let mut cl = st.connect().await?;
            keycache_etcd::seed::count(&mut cl, st).await
        })
    };
    assert_eq!(count(&st).expect("count").0, 1);
    let mut bad = st.clone();
    bad.user = Some(("root".into(), "wrong".into()));
    let e = count(&bad).expect_err("wrong password");
    assert!(e.to_string().contains("etcd"), "{e}");
    let mut no_cert = st.clone();
    no_cert.identity = None;
    assert!(count(&no_cert).is_err(), "no client certificate");
    let mut no_ca = st.clone();
    no_ca.ca = None;
    assert!(
        count(&no_ca).is_err(),
        "a server certificate from an unknown CA"
    );
}
