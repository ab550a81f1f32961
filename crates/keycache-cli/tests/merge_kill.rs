//! Crash safety of `keycache merge` (x86_64 Linux, through ptrace): a
//! three-way merge of a peer's snapshot (keys added, deleted, moved between
//! states, given another key; denied keys added, replaced and removed) into
//! a pki_dir that holds the banks and the localfs_key tree, killed with
//! SIGKILL at a sample of its system calls (the entry of the call: before a
//! write, an fsync, a rename, an unlink) and after random delays.
//!
//! After every kill:
//! - when no rebuild journal is left, the banks as they lie (before keycache
//!   opens them) are the old state whole or the new one whole, as Salt's own
//!   `mmap_key` reads them (a sample of copies, read at the end);
//! - keycache (which rolls a journal forward) reads the old state whole or
//!   the new state whole, never a mix;
//! - the tree never vouches for a key the store does not hold: every
//!   `minions/<id>` file (what Salt's `validate_token` accepts) is a key the
//!   store holds accepted with exactly those bytes;
//! - the same merge run again finishes (exit 0) to the new state, `keycache
//!   verify` (banks and tree) is clean, and Salt's `mmap_key` reads the new
//!   state (a sample of copies).
//!
//! Scale with `KEYCACHE_MERGE_KILLS` (default 120 syscall kills, and a third
//! as many timed kills).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Layout;
use keycache::merge::{self, MergeOptions};
use keycache::snapshot::{Bank, Entry, Snapshot};
use keycache::KeyState;
use keycache_testkit::crash::{copy_dir, copy_tree, env_u64, Cli};
use keycache_testkit::rng::Rng;
use keycache_testkit::tracer;
use serde_json::Value;

fn layout() -> Layout {
    Layout::small(1009, 16 * 1024)
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
    assert!(
        out.status.success(),
        "{ctx}: keycache {args:?}: exit {:?}: {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A pki_dir at `root/store` with a localfs_key tree and the banks migrated
/// from it.
fn make_store(kc: &Cli, root: &Path) -> PathBuf {
    let pki = root.join("store");
    let out = Command::new(common::python())
        .arg(common::repo().join("tools/gen-pki-tree.py"))
        .arg(&pki)
        .args([
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
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gen-pki-tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run_ok(kc, &pki, &["migrate", "--no-master-keys"], "migrate");
    pki
}

/// Their snapshot: the base with changes of every kind on their side.
fn theirs_of(base: &Snapshot, rng: &mut Rng) -> Snapshot {
    let mut entries: Vec<Entry> = Vec::new();
    let mut n = 0;
    for e in &base.entries {
        n += 1;
        let mut e = e.clone();
        e.mtime += 1_000_000_000;
        match (e.bank, n % 7) {
            // Deleted on their side.
            (_, 0) => continue,
            // Another state.
            (Bank::Keys, 1) => {
                e.state = Some(KeyState::ALL[(rng.below(3)) as usize]);
                if e.state == base.get(Bank::Keys, &e.id).unwrap().state {
                    e.state = Some(match e.state {
                        Some(KeyState::Accepted) => KeyState::Rejected,
                        _ => KeyState::Accepted,
                    });
                }
            }
            // Another key (accepted on their side).
            (Bank::Keys, 2) => {
                e.pub_key = common::pem(&format!("{}-rekeyed", e.id), 451).into_bytes();
                e.state = Some(KeyState::Accepted);
            }
            // A replaced denied key.
            (Bank::Denied, 1 | 2) => {
                e.pub_key = common::pem(&format!("{}-denied2", e.id), 451).into_bytes();
            }
            _ => {}
        }
        entries.push(e);
    }
    for i in 0..25 {
        let id = format!("new-{i:02}.peer.example.org");
        entries.push(Entry {
            bank: Bank::Keys,
            id: id.clone(),
            state: Some(KeyState::ALL[i % 3]),
            pub_key: common::pem(&id, 300 + 10 * i).into_bytes(),
            mtime: 1_700_000_000_000_000_000 + i as u64,
        });
        if i % 5 == 0 {
            entries.push(Entry {
                bank: Bank::Denied,
                id: id.clone(),
                state: None,
                pub_key: common::pem(&format!("{id}-denied"), 451).into_bytes(),
                mtime: 1_700_000_000_000_000_000 + i as u64,
            });
        }
    }
    Snapshot::from_entries(entries).unwrap()
}

/// The state of a snapshot (or plan result) in `kc_dump`'s shape.
fn dump_of(s: &Snapshot) -> Value {
    let mut keys = serde_json::Map::new();
    let mut denied = serde_json::Map::new();
    for e in &s.entries {
        let pem = String::from_utf8_lossy(&e.pub_key).into_owned();
        match e.bank {
            Bank::Keys => {
                keys.insert(
                    e.id.clone(),
                    serde_json::json!({"state": e.state.unwrap().name(), "pub": pem}),
                );
            }
            Bank::Denied => {
                denied.insert(e.id.clone(), serde_json::json!([pem]));
            }
        }
    }
    serde_json::json!({"keys": keys, "denied_keys": denied})
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

    // The base: our store as both peers last agreed on it.
    let base_file = t.path().join("base.snap");
    run_ok(
        &kc,
        &store0,
        &["snapshot", "-o", base_file.to_str().unwrap()],
        "snapshot",
    );
    let base = Snapshot::read_file(&base_file).unwrap();
    let theirs = theirs_of(&base, &mut rng);
    let theirs_file = t.path().join("theirs.snap");
    theirs.write_file(&theirs_file).unwrap();

    let before = common::kc_dump(&store0, &l);
    let plan = merge::plan(&base, &theirs, Some(&base), &MergeOptions::default());
    let c = plan.counts();
    assert!(
        c.added >= 25 && c.changed >= 8 && c.deleted >= 8 && c.conflicts == 0,
        "the plan: {c:?}"
    );
    let want = dump_of(&plan.result);
    assert_ne!(before, want);

    let merge_args: Vec<String> = {
        let mut a = vec!["merge".to_string()];
        a.push(store0.to_string_lossy().into_owned());
        a.push(theirs_file.to_string_lossy().into_owned());
        a.push("--base".into());
        a.push(base_file.to_string_lossy().into_owned());
        a.extend(l.args());
        a
    };
    let make = |store: &Path| {
        let mut c = kc.cmd();
        let mut a = merge_args.clone();
        a[1] = store.to_string_lossy().into_owned();
        c.args(a).stdout(Stdio::null()).stderr(Stdio::null());
        c
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
    assert_eq!(after, want, "the merge's result is not the plan's");
    check_tree(&full.join("store"), &after, "uninterrupted merge");
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
    let (mut old, mut new, mut journals) = (0u64, 0u64, 0u64);
    let mut salt_raw: Vec<(PathBuf, String)> = Vec::new();
    let mut salt_done: Vec<PathBuf> = Vec::new();
    let mut stale_tree: Vec<String> = Vec::new();
    let start = Instant::now();
    for (k, point) in points.into_iter().enumerate() {
        let case = work.join(format!("kill-{k}"));
        copy_tree(&template, &case);
        let dir = case.join("store");
        let ctx = match point {
            Some(p) => {
                let mut c = 0;
                let end = tracer::run(make(&dir), Duration::from_secs(60), |s| {
                    if s.entry {
                        c += 1;
                        if c == p {
                            return tracer::Action::Kill;
                        }
                    }
                    tracer::Action::Go
                });
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
        // The banks as they lie, for Salt: old or new whole.
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
        if got == before {
            old += 1;
        } else if got == after {
            new += 1;
        } else {
            panic!("{ctx}: the store is neither the old state nor the new one: {got}");
        }
        check_tree(&dir, &got, &ctx);
        // The merge again: finishes to the new state.
        let out = make(&dir).stderr(Stdio::piped()).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{ctx}: the merge again: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let again = common::kc_dump(&dir, &l);
        assert_eq!(
            again, after,
            "{ctx}: the merge again did not reach the new state"
        );
        check_tree(&dir, &again, &format!("{ctx}, merged again"));
        let v = kc
            .cmd()
            .args(kc_args(&dir, &["verify", "--json"]))
            .output()
            .unwrap();
        if v.status.code() != Some(0) {
            let j: Value = serde_json::from_slice(&v.stdout).unwrap_or_else(|e| {
                panic!(
                    "{ctx}: keycache verify after the merge again: exit {:?}, not JSON ({e}): {}",
                    v.status.code(),
                    String::from_utf8_lossy(&v.stderr)
                )
            });
            let tree_only = j["clean"] == true
                && j["findings"].as_array().is_some_and(Vec::is_empty)
                && j["tree"]["disagreements"]
                    .as_array()
                    .is_some_and(|d| !d.is_empty());
            assert!(
                tree_only,
                "{ctx}: keycache verify after the merge again: {j:#}"
            );
            // The banks are clean but the tree lags them: counted, failed at
            // the end; `verify --repair` must mend it.
            let d = j["tree"]["disagreements"].as_array().unwrap();
            let mut what: Vec<String> = d
                .iter()
                .map(|x| {
                    format!(
                        "{} {}",
                        x["dir"].as_str().unwrap_or("?"),
                        x["problem"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            what.sort();
            what.dedup();
            stale_tree.push(format!(
                "{ctx}: {} tree entries ({})",
                d.len(),
                what.join(", ")
            ));
            run_ok(
                &kc,
                &dir,
                &["verify", "--repair"],
                &format!("{ctx}: verify --repair"),
            );
            run_ok(
                &kc,
                &dir,
                &["verify"],
                &format!("{ctx}: verify after --repair"),
            );
        }
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
        assert!(
            s == before || s == after,
            "{ctx}: Salt reads the store as left neither old nor new: {s}"
        );
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
         new one, {journals} a journal to roll forward; Salt read {} stores as left and {} \
         merged again; {} left the tree behind after the merge again; {:.1} s",
        old + new,
        salt_raw.len(),
        salt_done.len(),
        stale_tree.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        stale_tree.is_empty(),
        "after {} of {} kills, the merge run again left the key tree behind the banks \
         (accepted keys without their minions/ file, which Salt's validate_token needs; \
         `keycache verify` exits 1 until `verify --repair`):\n{}",
        stale_tree.len(),
        old + new,
        stale_tree[..stale_tree.len().min(8)].join("\n")
    );
    assert!(
        old > 0 && new > 0,
        "the kills did not land on both sides of the commit"
    );
}
