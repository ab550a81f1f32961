//! Stores with history, and the CLI killed at every step of a run (its
//! rebuilds: compact, compact --to-size, migrate).

use super::*;

/// A store with history: entries in both banks, overwrites, removals and
/// several heap segments.
pub fn history_store(dir: &Path, rng: &mut Rng) -> Value {
    std::fs::create_dir_all(dir).unwrap();
    let store = Store::open_with(dir, &opts()).unwrap();
    for s in 0..60 {
        let op = random_op(rng, 2_000_000 + s, 1);
        apply(&store, &op).unwrap();
    }
    drop(store);
    common::kc_dump(dir, &layout())
}

/// Runs `cmd` (made for a fresh copy of the template) once to count its
/// system calls, then kills it at each of (a sample of) them and checks the
/// store with `check(dir)`; also builds power-loss images from the counting
/// run. Returns (syscalls, kills, images).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn kill_everywhere(
    name: &str,
    template: &Path,
    work: &Path,
    max_kills: u64,
    make: &dyn Fn(&Path) -> Command,
    check: &mut dyn FnMut(&Path, &str),
) -> (u64, u64, u64) {
    let mut rng = Rng::new(0x4242 ^ name.len() as u64);
    // Counting run, with power-loss images.
    let dir = work.join("count");
    copy_tree(template, &dir);
    let store_dir = dir.join("store");
    let mut disk = disk::Disk::new(&store_dir);
    let mut imgs = Vec::new();
    let mut n = 0u64;
    let end = tracer::run(make(&dir), Duration::from_secs(120), |s| {
        if !s.entry {
            disk.on_exit(s);
        } else {
            n += 1;
            if n.is_multiple_of(3) && imgs.len() < 400 {
                disk.refresh_latest();
                let img = work.join(format!("img-{n}"));
                disk.image(&mut rng, &img.join("store"));
                imgs.push(img);
            }
        }
        tracer::Action::Go
    });
    assert_eq!(end.exit_code, Some(0), "{name} under the tracer");
    let total = end.syscalls;
    check(&store_dir, &format!("{name}: finished"));
    let images = imgs.len() as u64;
    for img in imgs {
        check(
            &img.join("store"),
            &format!("{name}: power-loss image {}", img.display()),
        );
        std::fs::remove_dir_all(&img).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
    // Kills.
    let points: Vec<u64> = if total <= max_kills {
        (1..=total).collect()
    } else {
        (0..max_kills)
            .map(|i| 1 + i * total / max_kills + rng.below(total / max_kills))
            .collect()
    };
    let mut kills = 0;
    for k in points {
        let dir = work.join(format!("kill-{k}"));
        copy_tree(template, &dir);
        let end = tracer::kill_at(make(&dir), Duration::from_secs(120), k, |_| true);
        if end.killed {
            kills += 1;
        }
        check(
            &dir.join("store"),
            &format!("{name}: killed at syscall {k} of {total}"),
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    (total, kills, images)
}

/// `cp -a from to`.
pub fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Panics with `ctx` unless `verify` finds nothing in the store at `dir`.
pub fn assert_clean(dir: &Path, ctx: &str) {
    let store = Store::open_with(dir, &opts()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let f = findings(&store);
    assert!(f.is_empty(), "{ctx}: {f:?}");
}
