//! Crash safety: kills at chosen system calls (x86_64 Linux, through ptrace).
//!
//! - The writer of `crash/kill.rs` (the test binary re-executed as its
//!   `#[ignore]`d `child_writer` test, in `main.rs`) killed at the entry
//!   of a random system call; the same checks after every kill (see
//!   `keycache_testkit::crash`).
//! - `keycache compact`, `keycache compact --to-size` and `keycache migrate`
//!   killed at every system call (or a wide sample), plus power-loss images
//!   of a traced run: the store is the whole previous state or the whole
//!   new one, and `verify` is clean.
//!
//! Scale with `KEYCACHE_CRASH_KILLS` (default 300; 2/3 of it for the writer).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::KilledWriters;
use crate::common::{check_ok, pem, Params, ParamsExt, TREE_DIRS};
use keycache::verify;
use keycache::Store;
use keycache_testkit::crash::{
    args_of, assert_clean, copy_tree, history_store, kill_everywhere, kills, layout, stdout_of,
    temp_files, writer_command, SaltCheck,
};
use keycache_testkit::rng::Rng;
use keycache_testkit::tracer;

#[test]
fn writer_killed_at_random_syscalls() {
    let kc = common::cli();
    let n = kills() * 2 / 3;
    let mut w = KilledWriters::new();
    let dir = w.dir().to_path_buf();
    let mut rng = Rng::new(0x7777_1111_3333);
    let mut by_call: BTreeMap<String, u64> = BTreeMap::new();
    let start = Instant::now();
    for k in 0..n {
        let target = rng.below(600);
        let mut text = String::new();
        let mut ready = false;
        let mut count = 0u64;
        let mut last = 0i64;
        let end = tracer::run(
            {
                let mut c = writer_command(&dir, rng.next(), w.seq, Some(200));
                c.stdout(Stdio::null());
                c
            },
            Duration::from_secs(60),
            |s| {
                if stdout_of(s, &mut text) && text.contains("@@READY") {
                    ready = true;
                }
                if s.entry && ready {
                    count += 1;
                    if count >= target {
                        last = s.nr;
                        return tracer::Action::Kill;
                    }
                }
                tracer::Action::Go
            },
        );
        if end.killed {
            *by_call.entry(tracer::syscall_name(last)).or_default() += 1;
        }
        w.check(&kc, k, &text, &format!("syscall kill {k} at #{target}"));
    }
    let salted = w.salt.run("syscall kills");
    let tally = &w.tally;
    eprintln!(
        "syscall kills: {n} runs, {} in flight ({} applied), {} with findings, {salted} read by Salt, \
         killed at {by_call:?}, {:.1} s",
        tally.in_flight,
        tally.in_flight_applied,
        tally.with_findings,
        start.elapsed().as_secs_f64()
    );
}

/// `keycache <args>` on a history store (made with `seed`) killed at every
/// step by [`kill_everywhere`] (as `name`) in `t`; `check(dir, ctx, want)`
/// judges each image, `want` the store's entries before. What
/// `kill_everywhere` counted.
fn killed_at_every_step(
    t: &Path,
    seed: u64,
    name: &str,
    args: &[&str],
    check: &mut dyn FnMut(&Path, &str, &serde_json::Value),
) -> (u64, u64, u64) {
    let kc = common::cli();
    let template = t.join("template");
    let want = history_store(&template.join("store"), &mut Rng::new(seed));
    let work = t.join("work");
    std::fs::create_dir(&work).unwrap();
    let make = |d: &Path| {
        let mut c = kc.cmd();
        c.args(args_of(&d.join("store"), args))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    kill_everywhere(name, &template, &work, kills(), &make, &mut |dir, ctx| {
        check(dir, ctx, &want)
    })
}

#[test]
fn compact_killed_at_every_step() {
    let t = tempfile::tempdir().unwrap();
    let mut salt = SaltCheck::default();
    let mut i = 0;
    let (total, kills, images) = killed_at_every_step(
        t.path(),
        31337,
        "compact",
        &["compact"],
        &mut |dir, ctx, want| {
            assert_eq!(
                &common::kc_dump(dir, &layout()),
                want,
                "{ctx}: entries changed"
            );
            assert_clean(dir, ctx);
            i += 1;
            if i % 25 == 0 {
                salt.add(dir, t.path().join(format!("salt-{i}")));
            }
        },
    );
    let salted = salt.run("compact");
    eprintln!("compact: {total} syscalls, killed at {kills}, {images} power-loss images, {salted} read by Salt");
}

/// `keycache compact --to-size` killed between the two banks leaves them in
/// two sizes.
#[test]
fn compact_to_size_killed_at_every_step() {
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let (total, kills, images) = killed_at_every_step(
        t.path(),
        4711,
        "compact --to-size",
        &["compact", "--to-size", "211"],
        &mut |dir, ctx, want| {
            let len = |n: &str| std::fs::metadata(dir.join(n)).map(|m| m.len()).unwrap_or(0);
            // The CLI, told no size, finishes a pending journal (which may
            // change the size) before it reads the size off the index.
            let l = layout();
            let mut a = vec![
                "verify".to_string(),
                dir.to_string_lossy().into_owned(),
                "--tree".into(),
                "never".into(),
            ];
            a.extend(l.args().into_iter().skip(2));
            let out = kc.cmd().args(&a).output().unwrap();
            check_ok(&format!("{ctx}: keycache verify without --size"), &out);
            let (k, d) = (len(".mmap_keys.idx"), len(".mmap_denied.idx"));
            assert_eq!(
                k, d,
                "{ctx}: the banks are in two sizes ({k} and {d} bytes)"
            );
            let size = k / 96;
            let l = Params { size, ..layout() };
            let store = Store::open_with(
                dir,
                &l.options_with(
                    keycache::table::DEFAULT_READ_RETRY,
                    std::time::Duration::ZERO,
                ),
            )
            .unwrap();
            let f = verify::verify_store(&store).unwrap();
            assert!(f.is_empty(), "{ctx}: {f:?}");
            assert_eq!(&common::kc_dump(dir, &l), want, "{ctx}: entries changed");
        },
    );
    eprintln!("compact --to-size: {total} syscalls, killed at {kills}, {images} images");
}

/// A localfs_key tree for the migration crash test.
fn make_tree(root: &Path, rng: &mut Rng) {
    for (i, d) in TREE_DIRS.iter().enumerate() {
        std::fs::create_dir_all(root.join(d)).unwrap();
        for n in 0..(6 + i * 2) {
            // Ids shared with the existing store's pool, and new ones.
            let id = if rng.below(2) == 0 {
                format!("m{:02}.crash.example", rng.below(40))
            } else {
                format!("tree-{i}-{n}")
            };
            std::fs::write(root.join(d).join(&id), pem(&format!("tree-{id}-{i}"), 300)).unwrap();
        }
    }
}

#[test]
fn migrate_killed_at_every_step() {
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let template = t.path().join("template");
    let mut rng = Rng::new(0xbeef);
    let before = history_store(&template.join("store"), &mut rng);
    make_tree(&template.join("pki"), &mut rng);
    let make = |d: &Path| {
        let mut c = kc.cmd();
        c.arg("migrate")
            .arg(d.join("pki"))
            .arg("--out")
            .arg(d.join("store"))
            .args(layout().args())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    // The new state, from an uninterrupted run.
    let full = t.path().join("full");
    copy_tree(&template, &full);
    assert!(make(&full).status().unwrap().success());
    let after = common::kc_dump(&full.join("store"), &layout());
    assert_ne!(before, after);
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let mut salt = SaltCheck::default();
    let (mut olds, mut news) = (0, 0);
    let mut i = 0;
    let (total, kills, images) = kill_everywhere(
        "migrate",
        &template,
        &work,
        kills(),
        &make,
        &mut |dir, ctx| {
            let got = common::kc_dump(dir, &layout());
            if got == before {
                olds += 1;
            } else if got == after {
                news += 1;
            } else {
                panic!("{ctx}: neither the previous state nor the new one: {got}");
            }
            assert_clean(dir, ctx);
            i += 1;
            if i % 25 == 0 {
                salt.add(dir, t.path().join(format!("salt-{i}")));
            }
        },
    );
    assert!(olds > 0 && news > 0, "{olds} old, {news} new");
    // Running it again after a kill finishes the job and leaves no temporaries.
    let dir = work.join("again");
    copy_tree(&template, &dir);
    tracer::kill_at(make(&dir), Duration::from_secs(60), total * 3 / 4, |_| true);
    assert!(make(&dir).status().unwrap().success());
    assert_eq!(common::kc_dump(&dir.join("store"), &layout()), after);
    assert_eq!(temp_files(&dir.join("store")), Vec::<String>::new());
    let salted = salt.run("migrate");
    eprintln!(
        "migrate: {total} syscalls, killed at {kills} ({olds} old, {news} new states), \
         {images} power-loss images, {salted} read by Salt"
    );
}

/// `keycache deny` of pending keys killed at every step: a key moving to
/// the denied keys is written there before it leaves the `keys` bank, so
/// each id keeps its key in one bank or both, never in neither (a pending
/// key lost); the audit trail, written before the banks, holds a `deny`
/// record of every id that reached `denied_keys`.
#[test]
fn deny_killed_at_every_step_keeps_every_key_in_a_bank() {
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let template = t.path().join("template");
    let store_dir = template.join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let ids: Vec<String> = (0..8).map(|i| format!("deny-{i}.crash.example")).collect();
    {
        let l = layout();
        let s = Store::open_with(
            &store_dir,
            &l.options_with(keycache::table::DEFAULT_READ_RETRY, Duration::ZERO),
        )
        .unwrap();
        s.batch(|b| {
            for id in &ids {
                let pem = pem(id, 300);
                b.put(
                    &keycache::MinionId::new(id).unwrap(),
                    keycache::store::KeyState::Pending,
                    pem.as_bytes(),
                )?;
            }
            Ok(())
        })
        .unwrap();
    }
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let make = |d: &Path| {
        let mut args: Vec<&str> = vec!["deny"];
        args.extend(ids.iter().map(String::as_str));
        let mut c = kc.cmd();
        c.args(args_of(&d.join("store"), &args))
            .arg("--tree")
            .arg("never")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let mut both = 0;
    let (total, kills, images) =
        kill_everywhere("deny", &template, &work, kills(), &make, &mut |dir, ctx| {
            let l = layout();
            let s = Store::open_with(
                dir,
                &l.options_with(keycache::table::DEFAULT_READ_RETRY, Duration::ZERO),
            )
            .unwrap();
            let (records, _) = keycache::audit::read(dir).unwrap();
            for id in &ids {
                let mid = keycache::MinionId::new(id).unwrap();
                let key = s.get(&mid).unwrap();
                let denied = s.denied(&mid).unwrap();
                let want = pem(id, 300).into_bytes();
                assert!(
                    key.is_some() || denied.is_some(),
                    "{ctx}: {id} is in neither bank: its key was lost"
                );
                if let Some(k) = &key {
                    assert_eq!(k.public_key, want, "{ctx}: {id}");
                }
                if let Some(d) = &denied {
                    assert_eq!(d, &want, "{ctx}: {id}");
                    assert!(
                        records.iter().any(|r| &r.id == id && r.action == "deny"),
                        "{ctx}: {id} is denied without a record of it"
                    );
                }
                if key.is_some() && denied.is_some() {
                    both += 1;
                }
            }
        });
    eprintln!(
        "deny: {total} syscalls, killed at {kills}, {images} images, {both} ids left in both banks"
    );
}
