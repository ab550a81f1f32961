//! "No revoked key comes back": one test per way the merges of
//! keycache 0.1 (unions without a base, three-way merges with one) brought
//! a revoked key back or took another cluster's state, each asserting the
//! safety property itself on Salt masters (pki dirs with banks and the
//! localfs_key tree, judged by Salt 3008.5's own
//! `ReqServerChannel.validate_token`), through the library as the
//! `keycache` commands call it, and docs/install.md's timer recipe
//! (snapshot B, merge it into A with `--base F --write-base F`; see
//! [`masters`]):
//!
//! - a) a new peer's first merges do not undo a deletion the cluster made;
//! - b) a peer restored from a backup does not bring back a key revoked
//!   after the backup;
//! - c) a replayed older snapshot of a peer is refused, the store and the
//!   base untouched;
//! - d) lost bases (the first timer runs) do not re-add a deleted key;
//! - e) another cluster's snapshot, and the store's own, are refused;
//! - f) a wiped peer deletes nothing: refused until it merged from the
//!   cluster, then it gets the keys back;
//! - g) a snapshot entry whose value is not a public key (empty, junk, a
//!   2 MB key, a private key) is refused naming the id, nothing written;
//! - h) a base that cannot be written, a base that cannot be read: refused,
//!   nothing merged; an old keycache's base is read as none;
//! - i) a mass deletion on a peer is refused unless allowed;
//! - k) three new masters that first merge one another settle on one
//!   cluster;
//! - l) a key deleted right after a merge brought it stays deleted;
//! - snapshots send the tombstones within their horizon.
//!
//! Every refusal leaves the store directory byte for byte and inode for
//! inode as it was (`keycache_testkit::peers::files`). A merge killed
//! mid-way (j) needs a process to kill: the `keycache` binary's tests keep
//! it, with the note the command prints for an old keycache's base.

mod masters;

use std::path::{Path, PathBuf};

use keycache_merge::merge::{Base, BaseFile, MergeOptions};
use keycache_merge::snapshot::SnapshotOptions;
use keycache_testkit::common::{kc_dump, pem, small, TREE_DIRS};
use keycache_testkit::peers::{
    base_path, files, files_changed, snapshot_bytes, snapshot_parts, vt_keygen, vt_passing, Files,
    RawEntry, RawHeader,
};

use masters::{
    accept, accept_all, delete, merge, merge_file, migrate_tree, ok, pki_master, refused, reject,
    same_stores, snapshot_to, snapshot_with, text, timer_pull, Merged,
};

/// Asserts that no file of `dir` changed since `before`.
fn unchanged(before: &Files, dir: &Path) {
    assert_eq!(files_changed(before, &files(dir)), Vec::<String>::new());
}

/// Masters of one cluster, in `t`, and the Salt keys of their minions.
struct Cluster {
    t: PathBuf,
    keys: PathBuf,
    ids: Vec<String>,
    m: Vec<PathBuf>,
}

impl Cluster {
    /// Masters `names`: the first holds `ids` pending in its tree; the
    /// second and first merge each other (until both joined one cluster),
    /// every other merges the first, then the first it; the first accepts
    /// every id and every master merges it: every id accepted everywhere.
    fn new(t: &Path, names: &[&str], ids: &[&str]) -> Cluster {
        let keys = t.join("keys");
        let pubs = vt_keygen(&keys, ids);
        let mut m = vec![pki_master(t, names[0], &pubs)];
        for n in &names[1..] {
            m.push(pki_master(t, n, &[]));
        }
        let c = Cluster {
            t: t.to_path_buf(),
            keys,
            ids: ids.iter().map(|s| s.to_string()).collect(),
            m,
        };
        c.pulls(&[(1, 0), (0, 1), (1, 0)]);
        for k in 2..names.len() {
            c.pull_ok(k, 0);
            c.pull_ok(0, k);
        }
        accept_all(&c.m[0]);
        for k in 1..names.len() {
            c.pull_ok(k, 0);
        }
        let all: Vec<Vec<String>> = vec![c.ids.clone(); names.len()];
        assert_eq!(c.passing(), all, "every id accepted on every master");
        c
    }

    /// [`Cluster::pull_ok`] for each (a, b) in turn.
    fn pulls(&self, pairs: &[(usize, usize)]) {
        for &(a, b) in pairs {
            self.pull_ok(a, b);
        }
    }

    /// Master `a` merges master `b`'s snapshot by the timer recipe.
    fn pull(&self, a: usize, b: usize) -> Merged {
        timer_pull(&self.t, &self.m[a], &self.m[b], &MergeOptions::default())
    }

    fn pull_ok(&self, a: usize, b: usize) -> keycache_merge::merge::MergeReport {
        ok(self.pull(a, b))
    }

    /// Per master, the ids whose minion Salt's validate_token accepts.
    fn passing(&self) -> Vec<Vec<String>> {
        let pkis: Vec<&Path> = self.m.iter().map(PathBuf::as_path).collect();
        let ids: Vec<&str> = self.ids.iter().map(String::as_str).collect();
        vt_passing(&self.keys, &pkis, &ids)
    }

    /// Asserts that `id` passes on no master, and every id of `others` on
    /// every master.
    fn revoked_everywhere(&self, id: &str, others: &[&str]) {
        for (k, p) in self.passing().iter().enumerate() {
            assert!(
                !p.iter().any(|x| x == id),
                "{id} passes Salt's validate_token on {}: a revoked key came back",
                self.m[k].display()
            );
            for o in others {
                assert!(
                    p.iter().any(|x| x == o),
                    "{o} does not pass on {}",
                    self.m[k].display()
                );
            }
        }
    }

    /// Asserts that every pair of masters is identical (`keycache diff`).
    fn same(&self) {
        for k in 1..self.m.len() {
            assert!(
                same_stores(&self.m[0], &self.m[k]),
                "{} and {} differ",
                self.m[0].display(),
                self.m[k].display()
            );
        }
    }

    /// A snapshot of master `k` in `t/NAME`.
    fn snapshot(&self, k: usize, name: &str) -> PathBuf {
        let f = self.t.join(name);
        snapshot_to(&self.m[k], &f);
        f
    }
}

#[test]
fn a_new_peers_first_merges_keep_a_deletion() {
    let t = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2", "m3"]);
    delete(&c.m[0], &["m1"]);
    // C is new: it merges from B (which still holds m1), then from A.
    c.m.push(pki_master(t.path(), "c", &[]));
    c.pulls(&[(2, 1), (2, 0), (0, 2), (1, 0), (1, 2)]);
    c.revoked_everywhere("m1", &["m2", "m3"]);
    c.same();
}

#[test]
fn a_peer_restored_from_a_backup_does_not_bring_back_a_revoked_key() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2", "m3"]);
    let backup = t.path().join("b-backup");
    keycache_testkit::crash::copy_tree(&c.m[1], &backup);
    delete(&c.m[1], &["m2"]);
    reject(&c.m[1], "m3");
    c.pull_ok(0, 1);
    c.revoked_everywhere("m2", &["m1"]);
    // B is restored from the backup: m2 accepted there again, m3 too.
    std::fs::remove_dir_all(&c.m[1]).unwrap();
    keycache_testkit::crash::copy_tree(&backup, &c.m[1]);
    let p = c.passing();
    assert!(p[1].contains(&"m2".to_owned()) && p[1].contains(&"m3".to_owned()));
    for (a, b) in [(0, 1), (1, 0), (0, 1)] {
        let o = c.pull(a, b);
        // Made with nothing held pending, or refused.
        assert!(
            o.as_ref().map_or(true, |(p, _)| p.counts().held == 0),
            "merge {a}<-{b}: {}",
            text(&o)
        );
    }
    c.revoked_everywhere("m2", &["m1"]);
    c.revoked_everywhere("m3", &["m1"]);
    c.same();
}

#[test]
fn a_replayed_older_snapshot_is_refused_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2"]);
    let old = c.snapshot(1, "b-old.snap");
    delete(&c.m[1], &["m1"]);
    c.pull_ok(0, 1);
    c.revoked_everywhere("m1", &["m2"]);
    let base = base_path(&c.t, &c.m[0], &c.m[1]);
    let base_bytes = std::fs::read(&base).unwrap();
    let before = files(&c.m[0]);
    // With the timer's base, and without: the store's own record refuses it.
    for with_base in [true, false] {
        let o = if with_base {
            merge(&c.m[0], &old, &base)
        } else {
            merge_file(&c.m[0], &old, None, None, &MergeOptions::default())
        };
        refused(&o, &["older", "replay"]);
        unchanged(&before, &c.m[0]);
        assert_eq!(
            std::fs::read(&base).unwrap(),
            base_bytes,
            "the base changed"
        );
    }
    c.revoked_everywhere("m1", &["m2"]);
}

#[test]
fn lost_bases_do_not_re_add_a_deleted_key() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2"]);
    c.pulls(&[(0, 1), (1, 0)]);
    for e in std::fs::read_dir(&c.t).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("base-")
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    // A deletes m1 while B still holds it; the timers run without bases.
    delete(&c.m[0], &["m1"]);
    c.pull_ok(0, 1);
    assert_eq!(c.passing()[0], ["m2"], "A took m1 back from B");
    c.pull_ok(1, 0);
    c.revoked_everywhere("m1", &["m2"]);
    assert!(base_path(&c.t, &c.m[0], &c.m[1]).exists());
    c.same();
}

#[test]
fn another_clusters_snapshot_and_the_stores_own_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2"]);
    let x = tempfile::tempdir().unwrap();
    let other = Cluster::new(x.path(), &["x", "y"], &["m1", "m3"]);
    let theirs = other.snapshot(0, "x.snap");
    let base = base_path(&c.t, &c.m[0], &c.m[1]);
    let base_bytes = std::fs::read(&base).unwrap();
    let before = files(&c.m[0]);
    let o = merge(&c.m[0], &theirs, &base);
    refused(&o, &["another cluster"]);
    unchanged(&before, &c.m[0]);
    assert_eq!(std::fs::read(&base).unwrap(), base_bytes);
    // A's own snapshot, by the timer recipe's arguments.
    let own = c.snapshot(0, "a.snap");
    let before = files(&c.m[0]);
    let o = merge(&c.m[0], &own, &base);
    refused(&o, &["own"]);
    unchanged(&before, &c.m[0]);
    assert_eq!(
        std::fs::read(&base).unwrap(),
        base_bytes,
        "the base changed"
    );
    let left: Vec<_> = std::fs::read_dir(&c.t)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("keycache-tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    assert_eq!(c.passing(), vec![vec!["m1".to_owned(), "m2".to_owned()]; 2]);
}

/// Empties master `k`'s directory (`banks_only`: only the banks' files,
/// the history and the tree kept), then recreates the tree's state
/// directories, as the master's start does. The cluster key stays: a
/// master has its key pair (a merge refuses a store without one).
fn wipe(c: &Cluster, k: usize, banks_only: bool) {
    for e in std::fs::read_dir(&c.m[k]).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name == "cluster.pub" || (banks_only && !name.starts_with(".mmap_")) {
            continue;
        }
        if p.is_dir() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
    for d in TREE_DIRS {
        std::fs::create_dir_all(c.m[k].join(d)).unwrap();
    }
}

#[test]
fn a_wiped_peer_deletes_nothing_and_gets_the_keys_back() {
    for banks_only in [false, true] {
        let t = tempfile::tempdir().unwrap();
        let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2", "m3"]);
        wipe(&c, 1, banks_only);
        // A wiped store is a new store: its snapshot holds no tombstone,
        // and A's merge of it writes nothing.
        let o = c.pull(0, 1);
        let written = ok(o).written;
        assert_eq!(written, 0, "entries written");
        assert_eq!(c.passing()[0].len(), 3, "A keeps every key");
        // B merges from A: it gets every key back.
        c.pull_ok(1, 0);
        let written = c.pull_ok(0, 1).written;
        assert_eq!(written, 0, "entries written");
        let all = vec!["m1".to_owned(), "m2".to_owned(), "m3".to_owned()];
        assert_eq!(
            c.passing(),
            vec![all.clone(), all],
            "banks only: {banks_only}"
        );
        c.same();
    }
}

#[test]
fn a_snapshot_entry_that_is_not_a_public_key_is_refused_naming_the_id() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2"]);
    let good = std::fs::read(c.snapshot(1, "b.snap")).unwrap();
    let (h, entries) = snapshot_parts(&good);
    let stamp = h.generation;
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("an empty key", Vec::new(), &["empty"]),
        (
            "junk",
            b"this is not a PEM key\n\x00\x01".to_vec(),
            &["not a public key"],
        ),
        (
            "a 2 MB key",
            pem("huge", 2 << 20).into_bytes(),
            &["more than"],
        ),
        (
            "a private key",
            b"-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n".to_vec(),
            &["private key"],
        ),
    ];
    let before = files(&c.m[0]);
    let base = base_path(&c.t, &c.m[0], &c.m[1]);
    let base_bytes = std::fs::read(&base).unwrap();
    for (what, key, words) in cases {
        for id in ["m1", "zz-new"] {
            let mut e = entries.clone();
            e.retain(|x| !(x.bank == 1 && x.id == id.as_bytes()));
            e.push(RawEntry {
                bank: 1,
                kind: 1,
                id: id.as_bytes().to_vec(),
                key: key.clone(),
                stamp,
            });
            e.sort_by(|a, b| (a.bank, &a.id).cmp(&(b.bank, &b.id)));
            let f = c.t.join("crafted.snap");
            std::fs::write(&f, snapshot_bytes(&h, &e)).unwrap();
            let o = merge(&c.m[0], &f, &base);
            let ctx = format!("{what} for {id}");
            let err = match &o {
                Ok(_) => panic!("{ctx}: {}", text(&o)),
                Err(e) => e.to_string().to_lowercase(),
            };
            assert!(
                err.contains(&format!("\"{id}\"")) && words.iter().any(|w| err.contains(w)),
                "{ctx}: the message names neither the id nor what is wrong: {err}"
            );
            assert_eq!(
                files_changed(&before, &files(&c.m[0])),
                Vec::<String>::new(),
                "{ctx}"
            );
            assert_eq!(std::fs::read(&base).unwrap(), base_bytes, "{ctx}");
        }
    }
    assert_eq!(c.passing()[0], ["m1", "m2"]);
}

#[test]
fn bases_that_cannot_be_written_or_read_refuse_the_merge() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2"]);
    delete(&c.m[1], &["m1"]);
    let snap = c.snapshot(1, "b.snap");
    let before = files(&c.m[0]);
    let a = &c.m[0];
    let opts = MergeOptions::default();
    // A next base where no file can be: under a regular file.
    let file = c.t.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let o = merge_file(a, &snap, None, Some(&file.join("base")), &opts);
    refused(&o, &["a-file"]);
    unchanged(&before, &c.m[0]);
    // A base that exists but cannot be read as a base: a directory, junk.
    let dir = c.t.join("a-dir");
    std::fs::create_dir(&dir).unwrap();
    let junk = c.t.join("junk-base");
    std::fs::write(&junk, b"not a base at all").unwrap();
    for bad in [&dir, &junk] {
        let o = merge_file(a, &snap, Some(bad), None, &opts);
        let name = bad.to_string_lossy().to_lowercase();
        refused(&o, &[name.as_str()]);
        assert!(!text(&o).contains("union"), "{}", text(&o));
        unchanged(&before, &c.m[0]);
    }
    assert_eq!(c.passing()[0], ["m1", "m2"]);
    // An older keycache's base (a version 1 snapshot) is read as no base:
    // the merge runs and the next base replaces it.
    let old = c.t.join("old-base");
    let mut v1 = b"KCSNAP\r\n".to_vec();
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&[0u8; 60]);
    std::fs::write(&old, &v1).unwrap();
    assert!(
        matches!(Base::read_file(&old), Ok(BaseFile::Old)),
        "an older keycache's base"
    );
    ok(merge(a, &snap, &old));
    assert_eq!(&std::fs::read(&old).unwrap()[..8], b"KCBASE\r\n");
    assert_eq!(c.passing()[0], ["m2"]);
}

#[test]
fn a_mass_deletion_is_refused_unless_allowed() {
    let t = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..30).map(|i| format!("m{i:02}")).collect();
    let pubs: Vec<(String, String)> = ids.iter().map(|id| (id.clone(), pem(id, 400))).collect();
    let a = pki_master(t.path(), "a", &pubs);
    let b = pki_master(t.path(), "b", &[]);
    let pull = |x: &Path, y: &Path, opts: &MergeOptions| timer_pull(t.path(), x, y, opts);
    let defaults = MergeOptions::default();
    for (x, y) in [(&b, &a), (&a, &b), (&b, &a)] {
        ok(pull(x, y, &defaults));
    }
    accept_all(&a);
    ok(pull(&b, &a, &defaults));
    let doomed: Vec<&str> = ids[..24].iter().map(String::as_str).collect();
    delete(&b, &doomed);
    let before = files(&a);
    let o = pull(&a, &b, &defaults);
    refused(&o, &["24 of this store's 30 keys"]);
    assert_eq!(files_changed(&before, &files(&a)), Vec::<String>::new());
    let allow = MergeOptions {
        allow_mass_revoke: true,
        ..MergeOptions::default()
    };
    let o = pull(&a, &b, &allow);
    let what = text(&o);
    ok(o);
    let d = kc_dump(&a, &small(1009, 1 << 30));
    assert_eq!(d["keys"].as_object().unwrap().len(), 6, "{what}");
    for id in &doomed {
        assert!(!a.join("minions").join(id).exists(), "minions/{id} left");
    }
}

#[test]
fn three_new_masters_that_first_merge_one_another_settle_on_one_cluster() {
    let t = tempfile::tempdir().unwrap();
    let m: Vec<PathBuf> = ["p", "q", "r"]
        .iter()
        .map(|n| pki_master(t.path(), n, &[]))
        .collect();
    // Each new store has a cluster of its own; order them by it.
    let mut by_cluster: Vec<(RawHeader, usize)> = (0..3)
        .map(|k| {
            let f = t.path().join(format!("first-{k}.snap"));
            snapshot_to(&m[k], &f);
            (RawHeader::of(&std::fs::read(&f).unwrap()), k)
        })
        .collect();
    by_cluster.sort_by_key(|(h, _)| h.cluster);
    let (low, mid, high) = (by_cluster[0].1, by_cluster[1].1, by_cluster[2].1);
    let pull = |x: usize, y: usize| timer_pull(t.path(), &m[x], &m[y], &MergeOptions::default());
    // The middle one is merged first by both others, then merges the
    // lowest: every merge between new stores, each allowed.
    for (x, y) in [(low, mid), (high, mid), (mid, low)] {
        ok(pull(x, y));
    }
    // Two rounds of every pair: all of them must merge.
    let mut refusals = Vec::new();
    for _ in 0..2 {
        for x in 0..3 {
            for y in 0..3 {
                if x != y {
                    let o = pull(x, y);
                    if !o.as_ref().is_ok_and(|(p, _)| p.counts().held == 0) {
                        refusals.push(format!("{x}<-{y}: {}", text(&o)));
                    }
                }
            }
        }
    }
    assert!(
        refusals.is_empty(),
        "three new masters did not settle on one cluster: {} merges refused:\n{}",
        refusals.len(),
        refusals.join("\n")
    );
}

#[test]
fn a_key_deleted_right_after_a_merge_brought_it_stays_deleted() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2"]);
    // A new minion, accepted on B; A's merge brings it.
    let extra_keys = vt_keygen(&c.keys, &["m3"]);
    std::fs::write(c.m[1].join("minions_pre/m3"), &extra_keys[0].1).unwrap();
    migrate_tree(&c.m[1]);
    accept(&c.m[1], "m3");
    c.pull_ok(0, 1);
    let mut c = c;
    c.ids.push("m3".into());
    assert_eq!(c.passing()[0], ["m1", "m2", "m3"]);
    // A's operator deletes it at once (before A's next merge).
    delete(&c.m[0], &["m3"]);
    c.pulls(&[(1, 0), (0, 1), (1, 0)]);
    c.revoked_everywhere("m3", &["m1", "m2"]);
    c.same();
}

/// A snapshot's horizon (`snapshot --horizon-days`): tombstones within it
/// travel, older ones are forgotten (0 days: none kept).
#[test]
fn snapshot_sends_tombstones_within_its_horizon() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::new(t.path(), &["a", "b"], &["m1", "m2"]);
    delete(&c.m[0], &["m1"]);
    let tombstones = |days: u64| {
        let f = t.path().join(format!("h{days}.snap"));
        let mut opts = SnapshotOptions::default();
        opts.history.horizon = std::time::Duration::from_secs(days * 86_400);
        snapshot_with(&c.m[0], &f, &opts);
        let (_, entries) = snapshot_parts(&std::fs::read(&f).unwrap());
        entries
            .iter()
            .filter(|e| e.kind == 0)
            .map(|e| String::from_utf8_lossy(&e.id).into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(tombstones(30), vec!["m1".to_owned()]);
    assert_eq!(tombstones(0), Vec::<String>::new());
}
