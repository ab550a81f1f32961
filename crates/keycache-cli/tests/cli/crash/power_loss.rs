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

use keycache::Store;
use keycache_testkit::crash::{
    apply, kills, layout, models, opts, parse_log, random_op, stdout_of, try_check_crashed,
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
        let mut disk = disk::Disk::new(&dir);
        let mut text = String::new();
        let mut ready = false;
        let mut captured: Vec<(PathBuf, String)> = Vec::new();
        let every = 12 + rng.below(10);
        let mut count = 0u64;
        tracer::run(
            {
                let mut c = writer_command(&dir, rng.next(), 0, Some(60));
                c.stdout(Stdio::null());
                c
            },
            Duration::from_secs(120),
            |s| {
                if stdout_of(s, &mut text) && text.contains("@@READY") {
                    ready = true;
                }
                if !s.entry {
                    disk.on_exit(s);
                } else if ready {
                    count += 1;
                    if count.is_multiple_of(every) {
                        disk.refresh_latest();
                        let img = t.path().join(format!("img-{run}-{count}"));
                        disk.image(&mut rng, &img);
                        captured.push((img, text.clone()));
                    }
                }
                tracer::Action::Go
            },
        );
        syncs += disk.syncs;
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
