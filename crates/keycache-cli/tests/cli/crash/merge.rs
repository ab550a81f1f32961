//! Crash safety of `keycache merge` (x86_64 Linux, through ptrace): the
//! merge of a peer's snapshot (keys added, deleted, moved between states,
//! given another key; denied keys added, replaced and removed) into a
//! pki_dir that holds the banks and the localfs_key tree, by docs/install.md's
//! timer recipe (`--base` and `--write-base` the same file), killed with
//! SIGKILL at a sample of its system calls (the entry of the call: before a
//! write, an fsync, a rename, an unlink; the history's writes included) and
//! after random delays.
//!
//! The two stores are peers of one cluster that agreed (merges both ways),
//! then the peer changed; the merge's new state is the peer's store, read
//! there. After every kill:
//! - every entry (bank, id) holds its old value or its new one, never
//!   anything else, as keycache reads the store (which rolls a rebuild
//!   journal forward) and, when no journal is left, as Salt's own `mmap_key`
//!   reads the banks as they lie (a sample of copies, read at the end). A
//!   merge writes its entries in one batch of both banks, which is not
//!   atomic across a crash: some entries old and others new is a state the
//!   merge's history records (every changed entry in flight) and the next
//!   merge finishes;
//! - the tree never vouches for a key the store does not hold: every
//!   `minions/<id>` file (what Salt's `validate_token` accepts) is a key the
//!   store holds accepted with exactly those bytes;
//! - the same merge run again finishes (exit 0) to the new state, with the
//!   key tree caught up (the merge mends the tree of the entries a killed
//!   merge had in flight): the tree agrees with the banks but for the
//!   temporary files of a killed tree write (dot-files that Salt never
//!   reads, removed by `keycache verify --repair`), and `keycache verify`
//!   (banks and tree) then exits 0;
//! - the history is the peer's: a snapshot of the store then holds, entry
//!   for entry, the versions of the peer's snapshot (no entry a killed merge
//!   had in flight is taken for a local change), and Salt's `mmap_key` reads
//!   the new state (a sample of copies).
//!
//! Scale with `KEYCACHE_MERGE_KILLS` (default 120 syscall kills, and a third
//! as many timed kills).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{check_ok, gen_pki_tree, small, Params, ParamsExt};
use keycache::{tree, KeyState, MinionId, Store};
use keycache_merge::merge::{self, MergeOptions};
use keycache_merge::snapshot::{self, Snapshot, SnapshotOptions};
use keycache_testkit::crash::{copy_dir, copy_tree, env_u64, Cli};
use keycache_testkit::rng::Rng;
use keycache_testkit::tracer;
use serde_json::Value;

fn layout() -> Params {
    small(1009, 16 * 1024)
}

/// `keycache ARGS[0] DIR ARGS[1..] <layout>`.
fn kc_args(dir: &Path, args: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    a.insert(1, dir.to_string_lossy().into_owned());
    a.extend(layout().args());
    a
}

fn run_ok(kc: &Cli, dir: &Path, args: &[&str], ctx: &str) -> Vec<u8> {
    let out = kc.cmd().args(kc_args(dir, args)).output().unwrap();
    check_ok(&format!("{ctx}: keycache {args:?}"), &out);
    out.stdout
}

/// A pki_dir at `root/store` with a localfs_key tree and the banks migrated
/// from it.
fn make_store(kc: &Cli, root: &Path) -> PathBuf {
    let pki = root.join("store");
    gen_pki_tree(
        &pki,
        &[
            "--minions",
            "80",
            "--seed",
            "11",
            "--pending",
            "0.2",
            "--rejected",
            "0.1",
            "--denied",
            "0.1",
        ],
    );
    run_ok(kc, &pki, &["migrate", "--no-master-keys"], "migrate");
    std::fs::write(pki.join("master.pub"), cluster_key()).unwrap();
    pki
}

/// The master public key both stores hold: they are of one cluster.
fn cluster_key() -> String {
    common::pem("the-cluster", 451)
}

/// The peer at `root/peer`, in step with `ours` (merges both ways, until
/// both stores joined one cluster), then changed: entries deleted, moved to
/// another state, given another key (accepted), denied keys replaced, new
/// keys and denied keys. Returns its directory.
fn make_peer(kc: &Cli, root: &Path, ours: &Path) -> PathBuf {
    let peer = root.join("peer");
    std::fs::create_dir(&peer).unwrap();
    std::fs::write(peer.join("master.pub"), cluster_key()).unwrap();
    for (into, from) in [(&peer, ours), (&ours.to_path_buf(), &peer), (&peer, ours)] {
        let snap = root.join("sync.snap");
        run_ok(
            kc,
            from,
            &["snapshot", "-o", snap.to_str().unwrap()],
            "snapshot",
        );
        run_ok(
            kc,
            into,
            &["merge", snap.to_str().unwrap()],
            "merge to agree",
        );
    }
    let l = layout();
    assert_eq!(common::kc_dump(&peer, &l), common::kc_dump(ours, &l));
    let st = Store::open_with(&peer, &l.options()).unwrap();
    let dump = common::kc_dump(&peer, &l);
    let mut n = 0;
    for (id, e) in dump["keys"].as_object().unwrap() {
        n += 1;
        let mid = MinionId::new(id.clone()).unwrap();
        let state = e["state"].as_str().unwrap().parse::<KeyState>().unwrap();
        match n % 7 {
            0 => assert!(st.remove(&mid).unwrap()),
            1 => {
                let to = match state {
                    KeyState::Accepted => KeyState::Rejected,
                    KeyState::Pending => KeyState::Accepted,
                    KeyState::Rejected => KeyState::Pending,
                };
                assert!(st.set_state(&mid, to).unwrap());
            }
            2 => {
                let pem = common::pem(&format!("{id}-rekeyed"), 451);
                st.put(&mid, KeyState::Accepted, pem.as_bytes()).unwrap();
            }
            _ => {}
        }
    }
    for (id, _) in dump["denied_keys"].as_object().unwrap() {
        n += 1;
        let mid = MinionId::new(id.clone()).unwrap();
        match n % 7 {
            0 => assert!(st.remove_denied(&mid).unwrap()),
            1 | 2 => {
                let pem = common::pem(&format!("{id}-denied2"), 451);
                st.deny(&mid, pem.as_bytes()).unwrap();
            }
            _ => {}
        }
    }
    for i in 0..25 {
        let id = format!("new-{i:02}.peer.example.org");
        let mid = MinionId::new(id.clone()).unwrap();
        st.put(
            &mid,
            KeyState::ALL[i % 3],
            common::pem(&id, 300 + 10 * i).as_bytes(),
        )
        .unwrap();
        if i % 5 == 0 {
            st.deny(&mid, common::pem(&format!("{id}-denied"), 451).as_bytes())
                .unwrap();
        }
    }
    peer
}

/// A snapshot's entries as (bank, id, kind, stamp, key), in order.
fn versions(s: &Snapshot) -> Vec<String> {
    s.entries
        .iter()
        .map(|e| {
            format!(
                "{} {} {} {} {}",
                e.bank,
                e.id,
                e.kind.name(),
                e.stamp,
                keycache::format::hash(&e.public_key)
            )
        })
        .collect()
}

/// The tree's invariant: every `minions/<id>` entry is a regular file whose
/// bytes the store holds accepted for `id`. (keycache's dump of the store.)
fn check_tree(dir: &Path, dump: &Value, ctx: &str) {
    let Ok(rd) = std::fs::read_dir(dir.join("minions")) else {
        return;
    };
    for e in rd {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        assert!(m.is_file(), "{ctx}: minions/{name} is not a regular file");
        let file = std::fs::read(e.path()).unwrap();
        let held = &dump["keys"][&name];
        assert!(
            held["state"] == "accepted"
                && held["pub"].as_str().map(str::as_bytes) == Some(&file[..]),
            "{ctx}: minions/{name} exists (Salt's validate_token accepts that key) but the store \
             holds {held}"
        );
    }
}

/// How a store as left compares with the old and new states.
enum Whole {
    Old,
    New,
    Mixed,
}

/// Whether every entry of `got` (a dump) is its value in `old` or in `new`
/// (absent included); the entries that are neither, if any.
fn entrywise(got: &Value, old: &Value, new: &Value) -> Result<Whole, Vec<String>> {
    let mut bad = Vec::new();
    for bank in ["keys", "denied_keys"] {
        let ids: std::collections::BTreeSet<&String> = [got, old, new]
            .iter()
            .filter_map(|d| d[bank].as_object())
            .flat_map(|m| m.keys())
            .collect();
        for id in ids {
            let g = &got[bank][id];
            if g != &old[bank][id] && g != &new[bank][id] {
                bad.push(format!("{bank}/{id}: {g}"));
            }
        }
    }
    if !bad.is_empty() {
        return Err(bad);
    }
    Ok(if got == old {
        Whole::Old
    } else if got == new {
        Whole::New
    } else {
        Whole::Mixed
    })
}

fn has_journal(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .contains(keycache::rebuild::JOURNAL)
    })
}

#[test]
fn merge_killed_at_random_points_leaves_old_or_new_state_whole() {
    let kc = common::cli();
    let l = layout();
    let t = tempfile::tempdir().unwrap();
    let template = t.path().join("template");
    std::fs::create_dir(&template).unwrap();
    let store0 = make_store(&kc, &template);
    let mut rng = Rng::new(0x006d_6572_6765);

    // The peer, in step with our store, then changed; its snapshot.
    let peer = make_peer(&kc, t.path(), &store0);
    let theirs_file = t.path().join("theirs.snap");
    run_ok(
        &kc,
        &peer,
        &["snapshot", "-o", theirs_file.to_str().unwrap()],
        "snapshot of the peer",
    );
    let theirs = Snapshot::read_file(&theirs_file).unwrap();

    let before = common::kc_dump(&store0, &l);
    let want = common::kc_dump(&peer, &l);
    let plan = {
        let st = Store::open_with(&store0, &l.options()).unwrap();
        merge::dry_run(&st, &theirs, &MergeOptions::default()).unwrap()
    };
    let c = plan.counts();
    assert!(
        c.added >= 25 && c.changed >= 8 && c.deleted >= 8 && c.held == 0,
        "the plan: {c:?}"
    );
    assert_ne!(before, want);

    // The timer recipe: the base beside the store (in the case's directory).
    let merge_args = |store: &Path| -> Vec<String> {
        let base = store.parent().unwrap().join("from-peer.base");
        let mut a = vec!["merge".to_string()];
        a.push(store.to_string_lossy().into_owned());
        a.push(theirs_file.to_string_lossy().into_owned());
        a.push("--base".into());
        a.push(base.to_string_lossy().into_owned());
        a.push("--write-base".into());
        a.push(base.to_string_lossy().into_owned());
        a.extend(l.args());
        a
    };
    let make = |store: &Path| {
        let mut c = kc.cmd();
        c.args(merge_args(store))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    // The history of a store the merge finished: the peer's versions.
    let want_versions = versions(&theirs);
    let check_history = |dir: &Path, ctx: &str| {
        let st = Store::open_with(dir, &l.options()).unwrap();
        let ours = snapshot::take(&st, &SnapshotOptions::default()).unwrap();
        let got = versions(&ours);
        let diff: Vec<_> = got
            .iter()
            .filter(|v| !want_versions.contains(v))
            .chain(want_versions.iter().filter(|v| !got.contains(v)))
            .take(8)
            .collect();
        assert!(
            diff.is_empty(),
            "{ctx}: the store's versions are not the peer's: {diff:#?}"
        );
    };

    // An uninterrupted run, counting system calls: the new state.
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let full = work.join("full");
    copy_tree(&template, &full);
    let end = tracer::run(make(&full.join("store")), Duration::from_secs(60), |_| {
        tracer::Action::Go
    });
    assert_eq!(end.exit_code, Some(0), "the merge under the tracer");
    let total = end.syscalls;
    let after = common::kc_dump(&full.join("store"), &l);
    assert!(
        after == want,
        "the merge's result is not the peer's store: {:#?}",
        common::dump_diff(&after, &want)
    );
    check_tree(&full.join("store"), &after, "uninterrupted merge");
    check_history(&full.join("store"), "uninterrupted merge");
    run_ok(
        &kc,
        &full.join("store"),
        &["verify"],
        "verify after the uninterrupted merge",
    );
    // How long it takes, for the timed kills.
    let t0 = Instant::now();
    let timed = work.join("timed");
    copy_tree(&template, &timed);
    assert!(make(&timed.join("store")).status().unwrap().success());
    let run_time = t0.elapsed();
    std::fs::remove_dir_all(&timed).unwrap();

    let n = env_u64("KEYCACHE_MERGE_KILLS", 120);
    let mut points: Vec<Option<u64>> = (0..n)
        .map(|i| Some(1 + i * total / n + rng.below((total / n).max(1))))
        .collect();
    points.extend((0..n / 3).map(|_| None));
    let (mut old, mut new, mut mixed, mut journals) = (0u64, 0u64, 0u64, 0u64);
    let mut temp_files = 0u64;
    let mut salt_raw: Vec<(PathBuf, String)> = Vec::new();
    let mut salt_done: Vec<PathBuf> = Vec::new();
    let start = Instant::now();
    for (k, point) in points.into_iter().enumerate() {
        let case = work.join(format!("kill-{k}"));
        copy_tree(&template, &case);
        let dir = case.join("store");
        let ctx = match point {
            Some(p) => {
                let end = tracer::kill_at(make(&dir), Duration::from_secs(60), p, |_| true);
                format!("killed at syscall {p} of {total} (killed: {})", end.killed)
            }
            None => {
                let delay = Duration::from_micros(rng.below(run_time.as_micros() as u64 + 1));
                let mut child = make(&dir).spawn().unwrap();
                std::thread::sleep(delay);
                let _ = child.kill();
                let st = child.wait().unwrap();
                format!("killed after {delay:?} of ~{run_time:?} ({st})")
            }
        };
        // The banks as they lie, for Salt: each entry old or new.
        if !has_journal(&dir) {
            if k % 4 == 0 {
                let raw = t.path().join(format!("salt-raw-{k}"));
                copy_dir(&dir, &raw);
                salt_raw.push((raw, ctx.clone()));
            }
        } else {
            journals += 1;
        }
        let got = common::kc_dump(&dir, &l);
        match entrywise(&got, &before, &after) {
            Ok(Whole::Old) => old += 1,
            Ok(Whole::New) => new += 1,
            Ok(Whole::Mixed) => mixed += 1,
            Err(bad) => panic!(
                "{ctx}: entries that are neither their old value nor their new one: {bad:#?}"
            ),
        }
        check_tree(&dir, &got, &ctx);
        // The merge again: finishes to the new state.
        let out = make(&dir).stderr(Stdio::piped()).output().unwrap();
        check_ok(&format!("{ctx}: the merge again"), &out);
        let again = common::kc_dump(&dir, &l);
        assert!(
            again == after,
            "{ctx}: the merge again did not reach the new state (left: the store, right: the \
             new state): {:#?}",
            common::dump_diff(&again, &after)
        );
        check_tree(&dir, &again, &format!("{ctx}, merged again"));
        // The tree agrees with the banks, but for the temporary files of a
        // tree write that was killed (dot-files Salt never reads; `verify`
        // reports them and `verify --repair` removes them, as after any
        // writer killed mid-write: crash_tree.rs).
        {
            let st = Store::open_with(&dir, &l.options()).unwrap();
            let (temps, other): (Vec<_>, Vec<_>) = tree::check(&st)
                .unwrap()
                .into_iter()
                .partition(|d| d.problem == tree::TreeProblem::TempFile);
            assert!(
                other.is_empty(),
                "{ctx}: after the merge again, the key tree disagrees with the banks: {other:#?}"
            );
            if !temps.is_empty() {
                temp_files += 1;
                run_ok(&kc, &dir, &["verify", "--repair"], &ctx);
            }
        }
        let v = kc.cmd().args(kc_args(&dir, &["verify"])).output().unwrap();
        check_ok(
            &format!("{ctx}: keycache verify (banks and key tree) after the merge again"),
            &v,
        );
        check_history(&dir, &ctx);
        if k % 8 == 0 {
            let done = t.path().join(format!("salt-done-{k}"));
            copy_dir(&dir, &done);
            salt_done.push(done);
        }
        std::fs::remove_dir_all(&case).unwrap();
    }
    // Salt's own mmap_key reads the copies.
    let raw_dirs: Vec<PathBuf> = salt_raw.iter().map(|(d, _)| d.clone()).collect();
    for ((dump, log), (dir, ctx)) in common::salt_dump_many(&raw_dirs, &l)
        .into_iter()
        .zip(&salt_raw)
    {
        assert!(
            dump.get("error").is_none(),
            "{ctx}: Salt failed on the store as left: {dump}"
        );
        assert!(
            log.iter().all(|x| !x.starts_with("salt: ")),
            "{ctx}: Salt logged on {}: {log:?}",
            dir.display()
        );
        let s = serde_json::json!({"keys": dump["keys"], "denied_keys": dump["denied_keys"]});
        if let Err(bad) = entrywise(&s, &before, &after) {
            panic!(
                "{ctx}: Salt reads entries of the store as left that are neither old nor new: \
                 {bad:#?}"
            );
        }
    }
    for (dump, log) in common::salt_dump_many(&salt_done, &l) {
        assert!(
            dump.get("error").is_none(),
            "Salt failed after the merge again: {dump}"
        );
        assert!(log.iter().all(|x| !x.starts_with("salt: ")), "{log:?}");
        assert_eq!(dump["keys"], after["keys"]);
        assert_eq!(dump["denied_keys"], after["denied_keys"]);
    }
    eprintln!(
        "merge_kill: {total} syscalls per merge; {} kills: {old} left the old state, {new} the \
         new one, {mixed} some entries old and others new, {journals} a journal to roll \
         forward, {temp_files} a killed tree write's temporary file; Salt read {} stores as \
         left and {} merged again; {:.1} s",
        old + new + mixed,
        salt_raw.len(),
        salt_done.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        old > 0 && new > 0 && mixed > 0,
        "the kills did not land before, within and after the commit"
    );
}
