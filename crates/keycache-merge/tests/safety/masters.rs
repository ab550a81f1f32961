//! Salt masters driven through the library, the way the `keycache`
//! commands drive it: pki dirs migrated with their history begun
//! (`keycache migrate`), key state changed with the key tree kept in step
//! (`keycache accept/reject/delete`), snapshots taken
//! (`keycache snapshot -o FILE`) and merged (`keycache merge STORE FILE
//! --base F --write-base F`: the base read and checked, the next one
//! prepared before the merge writes anything and put in place after it),
//! and docs/install.md's timer recipe made of the two.

use std::path::{Path, PathBuf};

use keycache::migrate::{migrate, MigrateOptions};
use keycache::tree::TreeSync;
use keycache::{KeyState, MinionId, OpenOptions, Params, Store};
use keycache_merge::history::{self, History};
use keycache_merge::merge::{self, Base, BaseFile, MergeOptions, MergePlan, MergeReport};
use keycache_merge::snapshot::{self, SnapshotOptions};
use keycache_testkit::peers::{base_path, cluster_pub};

/// What a merge returns: its plan and what it wrote.
pub type Merged = keycache_merge::Result<(MergePlan, MergeReport)>;

/// The layout of every store here: Salt's default, 1009 slots.
pub fn options() -> OpenOptions {
    OpenOptions {
        params: Params {
            size: 1009,
            ..Params::default()
        },
        ..OpenOptions::default()
    }
}

/// The store in `dir`, its key tree kept in step when it has one (what
/// the writing commands open).
pub fn open(dir: &Path) -> Store {
    let mut s = Store::open_with(dir, &options()).expect("open the store");
    s.set_tree(TreeSync::auto(dir));
    s.resume_tree().expect("resume the tree");
    s
}

/// `keycache migrate DIR`: the tree of `dir` into its banks, the store's
/// history begun.
pub fn migrate_tree(dir: &Path) {
    let opts = MigrateOptions {
        params: options().params,
        made: Some(history::begin_on_migration()),
        ..MigrateOptions::default()
    };
    migrate(dir, &opts, &|_, _| {}).expect("migrate");
}

/// A Salt master's pki dir `root/name` (mode 0700): the localfs_key
/// directories, `pending` (id, PEM) in `minions_pre/`, the cluster key of
/// `root`, migrated into banks (the tree stays, as after Salt's migration).
pub fn pki_master(root: &Path, name: &str, pending: &[(String, String)]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let pki = root.join(name);
    for d in keycache::tree::TreeDir::NAMES {
        std::fs::create_dir_all(pki.join(d)).expect("mkdir");
    }
    std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    for (id, pem) in pending {
        std::fs::write(pki.join("minions_pre").join(id), pem).expect("write a key");
    }
    std::fs::write(pki.join("cluster.pub"), cluster_pub(root)).expect("write cluster.pub");
    migrate_tree(&pki);
    pki
}

fn mid(id: &str) -> MinionId {
    MinionId::new(id).expect("a valid id")
}

/// `keycache accept DIR --all`: every pending key accepted.
pub fn accept_all(dir: &Path) {
    let s = open(dir);
    let pending: Vec<(String, Vec<u8>)> = s
        .keys(None)
        .expect("list")
        .map(|r| r.expect("an entry"))
        .filter(|(_, e)| e.state == KeyState::Pending)
        .map(|(id, e)| (id, e.public_key))
        .collect();
    for (id, key) in pending {
        s.put(&mid(&id), KeyState::Accepted, &key).expect("accept");
    }
}

/// `keycache accept DIR ID`.
pub fn accept(dir: &Path, id: &str) {
    set_state(dir, id, KeyState::Accepted);
}

/// `keycache reject DIR ID --include-all`: its key rejected, whatever its
/// state.
pub fn reject(dir: &Path, id: &str) {
    set_state(dir, id, KeyState::Rejected);
}

fn set_state(dir: &Path, id: &str, state: KeyState) {
    let s = open(dir);
    let e = s.get(&mid(id)).expect("get").expect("the id has a key");
    s.put(&mid(id), state, &e.public_key)
        .expect("change the state");
}

/// `keycache delete DIR IDS`.
pub fn delete(dir: &Path, ids: &[&str]) {
    let s = open(dir);
    for id in ids {
        assert!(s.remove(&mid(id)).expect("delete"), "{id} was not there");
    }
}

/// `keycache snapshot DIR -o FILE`, with `opts`.
pub fn snapshot_with(dir: &Path, file: &Path, opts: &SnapshotOptions) {
    let s = Store::open_with(dir, &options()).expect("open the store");
    snapshot::take_to_file(&s, opts, file).expect("snapshot");
}

/// `keycache snapshot DIR -o FILE`.
pub fn snapshot_to(dir: &Path, file: &Path) {
    snapshot_with(dir, file, &SnapshotOptions::default());
}

/// `keycache merge DIR SNAP [--base BASE] [--write-base NEXT]`, with
/// `opts`: the plan and report, or the error the command prints.
pub fn merge_file(
    dir: &Path,
    snap: &Path,
    base: Option<&Path>,
    next: Option<&Path>,
    opts: &MergeOptions,
) -> Merged {
    let base = match base {
        None => None,
        Some(p) => match Base::read_file(p)? {
            BaseFile::Missing | BaseFile::Old => None,
            BaseFile::Base(b) => Some(b),
        },
    };
    let store = open(dir);
    let h = History::load(store.dir(), &opts.history)?;
    let mut f = std::fs::File::open(snap).expect("open the snapshot");
    let theirs = merge::read_snapshot(&h, &mut f, &snap.to_string_lossy())?;
    let cluster = history::cluster_of(&store)?;
    merge::check_cluster_known(Some(store.dir()), cluster, &theirs, opts)?;
    if let Some(b) = &base {
        b.check(&theirs)?;
    }
    let prepared = next.map(|p| Base::of(&theirs).prepare(p)).transpose()?;
    let r = merge::merge_with(&store, h, &theirs, opts)?;
    if let Some(p) = prepared {
        p.commit()?;
    }
    Ok(r)
}

/// `keycache merge DIR SNAP --base BASE --write-base BASE`.
pub fn merge(dir: &Path, snap: &Path, base: &Path) -> Merged {
    merge_file(dir, snap, Some(base), Some(base), &MergeOptions::default())
}

/// docs/install.md's timer recipe on master `a` for peer `b`, through a
/// file: B's snapshot in `root/<b>.snap`, merged into A with A's base for
/// B (`root/base-<a>-from-<b>`) read and written, with `opts`.
pub fn timer_pull(root: &Path, a: &Path, b: &Path, opts: &MergeOptions) -> Merged {
    let snap = root.join(format!(
        "{}.snap",
        b.file_name().expect("a name").to_string_lossy()
    ));
    snapshot_to(b, &snap);
    let base = base_path(root, a, b);
    merge_file(a, &snap, Some(&base), Some(&base), opts)
}

/// A merge that must have succeeded with nothing held pending (what the
/// command's exit 0 says); its report.
pub fn ok(r: Merged) -> MergeReport {
    let (plan, report) = r.unwrap_or_else(|e| panic!("the merge failed: {e}"));
    assert_eq!(plan.counts().held, 0, "entries held pending");
    report
}

/// A refusal, with `words` (one of them) in the message.
pub fn refused(r: &Merged, words: &[&str]) {
    let err = match r {
        Ok(_) => panic!("the merge was made"),
        Err(e) => e.to_string().to_lowercase(),
    };
    assert!(
        words.iter().any(|w| err.contains(w)),
        "the message says none of {words:?}: {err}"
    );
}

/// What a merge did, for failure messages.
pub fn text(r: &Merged) -> String {
    match r {
        Ok((plan, report)) => format!("merged: {:?}; {} written", plan.counts(), report.written),
        Err(e) => format!("error: {e}"),
    }
}

/// `keycache diff A B` exits 0: both stores hold the same entries.
pub fn same_stores(a: &Path, b: &Path) -> bool {
    let (sa, sb) = (
        Store::open_with(a, &options()).expect("open"),
        Store::open_with(b, &options()).expect("open"),
    );
    keycache::diff::diff(&sa, &sb).expect("diff").same
}
