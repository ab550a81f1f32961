//! Crash safety: power loss (x86_64 Linux, through ptrace).
//!
//! The writer of `crash/kill.rs` (the test binary re-executed as its
//! `#[ignore]`d `child_writer` test, in `main.rs`) runs under a tracer that
//! records, at every fsync/fdatasync/msync and every rename/unlink/create,
//! what is durable (`keycache_testkit::disk`); at random points a disk
//! image is built from the durable state of each file (as of its last sync)
//! with the unsynced pages of each file dropped or kept page by page (torn
//! tails, length before or after), and a namespace that is a prefix of the
//! directory operations since the last directory fsync. The images get the
//! checks of the kill tests, and Salt reads some of them.
//!
//! Scale with `KEYCACHE_CRASH_KILLS` (default 300: 6 runs).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use keycache::{KeyState, MinionId, Store};
use keycache_testkit::crash::{
    apply, ids, kills, layout, models, opts, parse_log, random_op, stdout_of, try_check_crashed,
    writer_command, Crash, Model, SaltCheck, Tally,
};
use keycache_testkit::rng::Rng;
use keycache_testkit::{disk, tracer};

/// Power loss during a writer's run: images at random system calls, each
/// checked (a slot torn across two pages included: see
/// `writer_power_loss_never_tears_a_slot`).
#[test]
fn writer_power_loss() {
    let torn = power_loss_runs((kills() / 50).max(2), 0x9999_aaaa_5555);
    assert_eq!(torn, 0, "images with a slot torn across pages");
}

/// Power loss can tear a slot that spans two pages: the status byte and id
/// from the new write, the offset, length and mtime from the old one (96-byte
/// slots straddle 4 KiB pages), so an inserted id reads as an empty value
/// (a denied key of zero bytes) or, in a reused slot, with the record of the
/// id that held the slot before.
#[test]
fn writer_power_loss_never_tears_a_slot() {
    let torn = power_loss_runs(8, 0x1357_2468);
    assert_eq!(torn, 0, "images with a torn slot");
}

/// Power loss while a writer keeps the whole key tree in step (random puts,
/// state changes, denies, removes, batches; a key moving from pending to
/// accepted is renamed from `minions_pre/` into `minions/`): images of the
/// store and its four state directories, each directory a prefix of its
/// operations since its own last fsync. In every image, before any other
/// writer: every `minions/<id>` holds exactly the key the store holds
/// accepted for `id` (none lets in what the store does not vouch for, none
/// is empty). Then the next writer's `resume_tree`: `minions/` is exactly
/// the store's accepted keys; the other directories (not fsynced) may lag,
/// and `mend` makes the tree equal to the store. Fails with the pending
/// file's data not made durable before its rename into `minions/` (an
/// empty `minions/<id>`).
#[test]
fn tree_power_loss() {
    use keycache::tree::{self, TreeDir, TreeProblem, TreeSync};
    let t = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(0x7ee5_0b0b);
    let subs: Vec<&str> = TreeDir::ALL.iter().map(|d| d.name()).collect();
    let (mut images, mut files, mut lagging) = (0u64, 0u64, 0u64);
    let mut syncs = 0u64;
    let runs = (kills() / 50).max(4);
    for run in 0..runs {
        let dir = t.path().join(format!("run-{run}"));
        std::fs::create_dir(&dir).unwrap();
        for s in &subs {
            std::fs::create_dir(dir.join(s)).unwrap();
        }
        // A store and its tree with some history, durable before the run.
        {
            let store = Store::open_with(&dir, &opts())
                .unwrap()
                .with_tree(TreeSync::On);
            for s in 0..30 {
                apply(&store, &random_op(&mut rng, 1_000_000 + s, 1)).unwrap();
            }
        }
        let mut disks = disk::Disks::new(&dir, &subs);
        let every = 60 + rng.below(40);
        let mut c = writer_command(&dir, rng.next(), 0, Some(80));
        c.env("KEYCACHE_CRASH_TREE", "1");
        let (captured, text) = traced_images(c, &mut disks, &mut rng, every, t.path(), run);
        assert!(!text.contains("@@E"), "the writer failed: {text}");
        syncs += disks.syncs();
        for (img, out) in captured {
            let op = out.lines().rev().find(|l| l.starts_with("@@"));
            let shown = format!(
                "{} (the writer's last line: {})",
                img.display(),
                op.unwrap_or_default()
            );
            let store = Store::open_with(&img, &opts())
                .unwrap_or_else(|e| panic!("{shown}: open: {e}"))
                .with_tree(TreeSync::On);
            // Before any writer: minions/ vouches for nothing else.
            let minions = img.join(TreeDir::Minions.name());
            for e in std::fs::read_dir(&minions).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                files += 1;
                let held = store
                    .get(&MinionId::new(name.clone()).unwrap())
                    .unwrap_or_else(|e| panic!("{shown}: get {name}: {e}"));
                let bytes = std::fs::read(e.path()).unwrap();
                match held {
                    Some(k) if k.state == KeyState::Accepted && k.public_key == bytes => {}
                    other => panic!(
                        "{shown}: minions/{name} ({} bytes) while the store holds {:?}",
                        bytes.len(),
                        other.map(|k| (k.state, k.public_key.len()))
                    ),
                }
            }
            // Every entry a lookup finds is listed (Salt's `list_all`, the
            // tree's view of the store).
            let mut listed = std::collections::BTreeSet::new();
            tree::KeySource::each_key(&store, &mut |id, _, _| {
                listed.insert(id);
            })
            .unwrap_or_else(|e| panic!("{shown}: list: {e}"));
            for id in ids() {
                let found = store.get(&MinionId::new(id.clone()).unwrap()).unwrap();
                assert!(
                    found.is_none() || listed.contains(&id),
                    "{shown}: {id} is found by a lookup and missing from the listing"
                );
            }
            // The next writer brings minions/ in step; the rest may lag.
            store
                .resume_tree()
                .unwrap_or_else(|e| panic!("{shown}: resume: {e}"));
            let found = tree::check(&store).unwrap();
            let wrong: Vec<_> = found
                .iter()
                .filter(|x| x.dir == TreeDir::Minions || x.problem == TreeProblem::NotAFile)
                .collect();
            assert!(wrong.is_empty(), "{shown}: after resume: {wrong:?}");
            lagging += u64::from(!found.is_empty());
            tree::mend(&store).unwrap_or_else(|e| panic!("{shown}: mend: {e}"));
            let left = tree::check(&store).unwrap();
            assert!(left.is_empty(), "{shown}: after mend: {left:?}");
            images += 1;
            drop(store);
            std::fs::remove_dir_all(&img).unwrap();
        }
    }
    eprintln!(
        "power loss (key tree): {runs} runs, {syncs} syncs followed, {images} images, \
         {files} minions/ files checked, {lagging} with other directories behind the store"
    );
    assert!(images >= 40, "too few images: {images}");
    assert!(files >= 100, "too few minions/ files checked: {files}");
}

/// Runs `runs` traced writers, checks power-loss images; returns how many
/// images failed only because of a slot torn across pages.
fn power_loss_runs(runs: u64, seed: u64) -> u64 {
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed);
    let mut torn = 0u64;
    let mut tally = Tally::default();
    let mut salt = SaltCheck::default();
    let mut images = 0u64;
    let mut syncs = 0u64;
    let start = Instant::now();
    for run in 0..runs {
        let dir = t.path().join(format!("run-{run}"));
        std::fs::create_dir(&dir).unwrap();
        // A store with some history, durable before the run.
        let seed_log = {
            let store = Store::open_with(&dir, &opts()).unwrap();
            let mut m = Model::default();
            // Odd runs start from an empty directory (bank creation).
            for s in 0..(30 * (run % 2)) {
                let op = random_op(&mut rng, 1_000_000 + s, 1);
                apply(&store, &op).unwrap();
                m.apply(&op);
            }
            m
        };
        let mut disks = disk::Disks::new(&dir, &[]);
        let every = 12 + rng.below(10);
        let c = writer_command(&dir, rng.next(), 0, Some(60));
        let (captured, _) = traced_images(c, &mut disks, &mut rng, every, t.path(), run);
        syncs += disks.syncs();
        for (img, text) in captured {
            let log = parse_log(&text, 0);
            assert!(log.error.is_none());
            let (before, after, _) = models(&seed_log, &log);
            match try_check_crashed(&kc, &img, &before, &after, &mut tally, Crash::PowerLoss) {
                Ok(_) => {
                    if images.is_multiple_of(8) {
                        salt.add(&img, img.with_extension("salt"));
                    }
                }
                Err((Some(id), msg)) if id_in_straddling_slot(&img, &id) => {
                    eprintln!("power loss image {}: torn slot: {msg}", img.display());
                    torn += 1;
                }
                Err((_, msg)) => panic!("power loss image {}: {msg}", img.display()),
            }
            images += 1;
            std::fs::remove_dir_all(&img).unwrap();
        }
    }
    let salted = salt.run("power loss");
    eprintln!(
        "power loss (writer): {runs} runs, {syncs} syncs followed, {images} images, {} in flight \
         ({} applied), {} with findings (all repaired), {torn} torn slots, {salted} read by Salt, \
         {:.1} s",
        tally.in_flight,
        tally.in_flight_applied,
        tally.with_findings,
        start.elapsed().as_secs_f64()
    );
    assert!(images >= 40, "too few images: {images}");
    torn
}

/// Runs the writer `cmd` traced, `disks` following it; at every `every`-th
/// system call once it is ready, a power-loss image `img-<run>-<n>` in
/// `t`, kept with the writer's output up to then. Returns the images and
/// the writer's whole output.
fn traced_images(
    mut cmd: std::process::Command,
    disks: &mut disk::Disks,
    rng: &mut Rng,
    every: u64,
    t: &Path,
    run: u64,
) -> (Vec<(PathBuf, String)>, String) {
    let mut text = String::new();
    let mut ready = false;
    let mut captured = Vec::new();
    let mut count = 0u64;
    cmd.stdout(Stdio::null());
    tracer::run(cmd, Duration::from_secs(120), |s| {
        if stdout_of(s, &mut text) && text.contains("@@READY") {
            ready = true;
        }
        if !s.entry {
            disks.on_exit(s);
        } else if ready {
            count += 1;
            if count.is_multiple_of(every) {
                disks.refresh_latest();
                let img = t.join(format!("img-{run}-{count}"));
                disks.image(rng, &img);
                captured.push((img, text.clone()));
            }
        }
        tracer::Action::Go
    });
    (captured, text)
}

/// Whether a slot holding `id` (whole or cut) in the image's `keys` or
/// `denied_keys` index spans two pages: a power loss can then leave its
/// status byte and id from one write and its pointer fields from another.
fn id_in_straddling_slot(dir: &Path, id: &str) -> bool {
    let l = layout();
    [".mmap_keys.idx", ".mmap_denied.idx"].iter().any(|n| {
        let ix = std::fs::read(dir.join(n)).unwrap_or_default();
        (1..l.size as usize).any(|s| {
            let off = s * l.slot_size;
            let Some(slot) = ix.get(off..off + l.slot_size) else {
                return false;
            };
            let raw = &slot[1..1 + l.id_size];
            let stored = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            let related = !stored.is_empty()
                && (stored == id.as_bytes()
                    || id.as_bytes().starts_with(stored)
                    || stored.starts_with(id.as_bytes()));
            related && off / 4096 != (off + 21 + l.id_size - 1) / 4096
        })
    })
}
