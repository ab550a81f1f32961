//! Section `migrate`: `keycache migrate` of a tree against reading every
//! file once and Salt's `rebuild_from_localfs` (extrapolated past
//! `--salt-migrate-max`); `migrate --out`, which also writes the key tree,
//! against the banks alone plus the floor of creating the same files (GNU
//! tar extracting them, a plain Rust loop), each made durable by one
//! `syncfs`; its report table.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use keycache_bench::table_size_for;
use serde_json::Value as Json;

use crate::contenders::{run_json, salt_driver};
use crate::data::Data;
use crate::measure::{Cfg, Samples};
use crate::report::Report;
use crate::util::{die, fmt_rate, fmt_ratio, fmt_secs, log, size_label, versus};

pub(crate) const M_KC: &str = "keycache migrate (process), the banks alone (in place)";
pub(crate) const M_OUT: &str = "keycache migrate --out (process), the banks and the key tree";
pub(crate) const M_READ1: &str = "read every file once (1 thread)";
pub(crate) const M_READ2: &str = "read every file once (2 threads)";
pub(crate) const M_SALT: &str = "Salt 3008.5 rebuild_from_localfs";
pub(crate) const M_TAR: &str = "floor: GNU tar extracting the same files, then syncfs";
pub(crate) const M_LOOP: &str = "floor: a plain Rust loop creating the same files, then syncfs";

/// The head of the report's table of migrate: heading and table header.
pub(crate) const MIGRATE_TABLE: &str = "### Migrating a `localfs_key` tree (median seconds; files in the page cache)\n\n| tree | what | seconds | it ÷ keycache migrate | keys/s |\n|---|---|---:|---:|---:|";

pub(crate) fn tree_files(tree: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        for e in std::fs::read_dir(tree.join(d)).unwrap() {
            v.push(e.unwrap().path());
        }
    }
    v
}

/// Lists the tree and reads every file once, in `threads` threads; bytes read.
pub(crate) fn read_tree(tree: &Path, threads: usize) -> u64 {
    let files = tree_files(tree);
    let chunk = files.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = files
            .chunks(chunk)
            .map(|c| {
                s.spawn(move || {
                    let mut n = 0u64;
                    for f in c {
                        let d = std::fs::read(f).unwrap();
                        n += d.len() as u64;
                        black_box(&d);
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// `keycache migrate` of `tree`: into `out` (`--out`: the banks and the
/// key tree, `out` made afresh) or, with `None`, in place (the banks
/// alone, removed afterwards). The filesystem is written back before the
/// timing starts, so no earlier step's writes are paid for here. Wall
/// seconds, and the seconds the command reports.
pub(crate) fn run_kc_migrate(
    data: &Data,
    tree: &Path,
    out: Option<&Path>,
    size: u64,
) -> (f64, f64) {
    remove_banks(tree);
    let mut c = Command::new(&data.keycache);
    c.arg("migrate").arg(tree);
    if let Some(out) = out {
        let _ = std::fs::remove_dir_all(out);
        std::fs::create_dir_all(out).unwrap();
        c.arg("--out").arg(out);
    }
    c.args(["--size", &size.to_string(), "--json"])
        .stderr(Stdio::inherit());
    syncfs(&data.dir);
    let t0 = Instant::now();
    let o = c.output().unwrap();
    let wall = t0.elapsed().as_secs_f64();
    remove_banks(tree);
    if !o.status.success() {
        die("keycache migrate failed");
    }
    let j: Json = serde_json::from_slice(&o.stdout).unwrap();
    (wall, j["seconds"].as_f64().unwrap_or(f64::NAN))
}

pub(crate) fn remove_banks(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".mmap_") || name.starts_with(".mmcache_") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

pub(crate) fn tree_files_total(data: &Data, n: u64) -> f64 {
    let j: Json =
        serde_json::from_slice(&std::fs::read(data.dir.join(format!("tree-{n}.json"))).unwrap())
            .unwrap();
    j["files"].as_f64().unwrap()
}

/// Writes back the filesystem holding `dir` ([`keycache_bench::write_back`]).
fn syncfs(dir: &Path) {
    if let Err(e) = keycache_bench::write_back(dir) {
        die(&e.to_string());
    }
}

/// The tree as a tar archive beside the data (made once, outside the
/// timing): the state directories and their key files.
fn tree_tar(data: &Data, tree: &Path, n: u64) -> PathBuf {
    let tar = data.dir.join(format!("tree-{n}.tar"));
    if !tar.exists() {
        let part = tar.with_extension("tar.part");
        let ok = Command::new("tar")
            .arg("-cf")
            .arg(&part)
            .arg("-C")
            .arg(tree)
            .args([
                "minions",
                "minions_pre",
                "minions_rejected",
                "minions_denied",
            ])
            .status()
            .unwrap();
        if !ok.success() {
            die("tar -cf of the tree failed");
        }
        std::fs::rename(&part, &tar).unwrap();
    }
    tar
}

/// The files of `tree`, read into memory (outside the timing): relative
/// path and bytes.
fn tree_contents(tree: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    tree_files(tree)
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(tree).unwrap().to_path_buf();
            let bytes = std::fs::read(&f).unwrap();
            (rel, bytes)
        })
        .collect()
}

/// The floor of a tree writer: the same files created under `out` (the
/// state directories first) by a plain loop, each a new file written
/// once, then one write-back of the filesystem; seconds.
fn create_files(out: &Path, files: &[(PathBuf, Vec<u8>)]) -> f64 {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    syncfs(out.parent().unwrap_or(out));
    let t0 = Instant::now();
    for d in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        std::fs::create_dir_all(out.join(d)).unwrap();
    }
    for (rel, bytes) in files {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(out.join(rel))
            .unwrap();
        f.write_all(bytes).unwrap();
    }
    syncfs(out);
    t0.elapsed().as_secs_f64()
}

/// GNU tar extracting `tar` under `out`, then one write-back; seconds.
fn extract_tar(out: &Path, tar: &Path) -> f64 {
    std::fs::create_dir_all(out).unwrap();
    syncfs(out);
    let t0 = Instant::now();
    let ok = Command::new("tar")
        .arg("-xf")
        .arg(tar)
        .arg("-C")
        .arg(out)
        .status()
        .unwrap();
    if !ok.success() {
        die("tar -xf failed");
    }
    syncfs(out);
    t0.elapsed().as_secs_f64()
}

/// `salt_per_key`: Salt's seconds per key file measured on a smaller tree,
/// used (and said to be) for trees over `salt_max`.
pub(crate) fn section_migrate(
    cfg: &Cfg,
    data: &Data,
    n: u64,
    salt_max: u64,
    salt_per_key: &mut Option<(u64, f64)>,
) -> Samples {
    let mut s = Samples::default();
    let tree = data.tree(n);
    let size = table_size_for(n);
    let out = data.dir.join("migrate-out");
    let floor_out = data.dir.join("migrate-floor");
    let tar = tree_tar(data, &tree, n);
    let contents = tree_contents(&tree);
    let _ = std::fs::remove_dir_all(&floor_out);
    log(&format!("migration of the {} tree", size_label(n)));
    for round in 0..cfg.rounds {
        let (wall, inner) = run_kc_migrate(data, &tree, None, size);
        s.add(M_KC, "seconds", wall);
        s.add(M_KC, "inner", inner);
        let t0 = Instant::now();
        black_box(read_tree(&tree, 1));
        s.add(M_READ1, "seconds", t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        black_box(read_tree(&tree, 2));
        s.add(M_READ2, "seconds", t0.elapsed().as_secs_f64());
        // The three writers of 100k small files take turns at going first:
        // a virtual disk's write-back speed drifts within a round.
        let (mut out_wall, mut tar_secs, mut loop_secs) = (0.0, 0.0, 0.0);
        for step in 0..3 {
            match (round + step) % 3 {
                0 => {
                    let (w, inner) = run_kc_migrate(data, &tree, Some(&out), size);
                    s.add(M_OUT, "seconds", w);
                    s.add(M_OUT, "inner", inner);
                    out_wall = w;
                    let _ = std::fs::remove_dir_all(&out);
                }
                1 => {
                    tar_secs = extract_tar(&floor_out, &tar);
                    s.add(M_TAR, "seconds", tar_secs);
                    let _ = std::fs::remove_dir_all(&floor_out);
                }
                _ => {
                    loop_secs = create_files(&floor_out, &contents);
                    s.add(M_LOOP, "seconds", loop_secs);
                    let _ = std::fs::remove_dir_all(&floor_out);
                }
            }
        }
        log(&format!(
            "  round {}/{}: keycache migrate {} (inside {}), read once {} / {}; \
             --out {}, floors: tar {}, loop {}",
            round + 1,
            cfg.rounds,
            fmt_secs(wall),
            fmt_secs(inner),
            fmt_secs(s.0[M_READ1]["seconds"][round]),
            fmt_secs(s.0[M_READ2]["seconds"][round]),
            fmt_secs(out_wall),
            fmt_secs(tar_secs),
            fmt_secs(loop_secs),
        ));
    }
    let _ = std::fs::remove_dir_all(&out);
    if cfg.salt && n <= salt_max {
        // Salt writes its banks beside the tree (pki_dir), one locked,
        // fsynced insert per key, at the same table size. One run: it is
        // slow and fsync-bound, so rounds would not change the picture.
        remove_banks(&tree);
        log(&format!(
            "  Salt rebuild_from_localfs on the {} tree (size {size}); about 6-13 ms per key",
            size_label(n)
        ));
        let mut c = Command::new(cfg.python.as_ref().unwrap());
        c.arg(salt_driver())
            .args(["--size", &size.to_string(), "migrate-bench", "--pki-dir"])
            .arg(&tree)
            .stderr(Stdio::inherit());
        let j = run_json(c);
        remove_banks(&tree);
        let secs = j["seconds"].as_f64().unwrap();
        let keys = j["counts"]["total"].as_f64().unwrap();
        s.add(M_SALT, "seconds", secs);
        s.add(M_SALT, "keys", keys);
        *salt_per_key = Some((n, secs / keys));
        log(&format!("  Salt: {}", fmt_secs(secs)));
    } else if let (true, Some((from, per_key))) = (cfg.salt, *salt_per_key) {
        // Salt's migration costs the same per key at any tree size (one
        // locked, fsynced insert per key), so a larger tree is extrapolated
        // from the per-key time measured on the smaller one.
        let keys = tree_files_total(data, n);
        s.add(M_SALT, "seconds", per_key * keys);
        s.add(M_SALT, "keys", keys);
        s.add(M_SALT, "extrapolated_from", from as f64);
        log(&format!(
            "  Salt: {} (extrapolated from {} per key on the {} tree)",
            fmt_secs(per_key * keys),
            fmt_secs(per_key),
            size_label(from)
        ));
    }
    s
}

pub(crate) fn report_migrate(r: &mut Report, all: &[(u64, Samples)]) {
    for (n, s) in all {
        let kc = s.med(M_KC, "seconds");
        for c in s.present([M_KC, M_READ1, M_READ2, M_OUT, M_TAR, M_LOOP, M_SALT]) {
            let v = s.med(c, "seconds");
            let ratio = if c == M_KC {
                "—".into()
            } else {
                fmt_ratio(v / kc)
            };
            let name = if c == M_KC || c == M_OUT {
                format!("{c}; inside: {}", fmt_secs(s.med(c, "inner")))
            } else if c == M_SALT {
                let from = s.med(M_SALT, "extrapolated_from");
                if from.is_finite() {
                    format!(
                        "{c}: **extrapolated** from its time per key on the {} tree",
                        size_label(from as u64)
                    )
                } else {
                    format!("{c} (one run, {} keys)", s.med(M_SALT, "keys"))
                }
            } else {
                c.to_string()
            };
            r.line(&format!(
                "| {} | {name} | {} | {ratio} | {} |",
                size_label(*n),
                fmt_secs(v),
                fmt_rate(*n as f64 / v)
            ));
        }
    }
    r.line("");
    if let Some((n, s)) = all.iter().rev().find(|(n, _)| *n >= 100_000).or(all.last()) {
        let at = size_label(*n);
        let kc = s.med(M_KC, "seconds");
        if s.0.contains_key(M_SALT) {
            let sl = s.med(M_SALT, "seconds");
            r.target(
                &format!("migration of the {at} tree: >= 200x faster than Salt"),
                versus(fmt_secs, kc, sl, sl / kc),
                sl >= 200.0 * kc,
            );
        }
        let floor = s.med(M_READ1, "seconds").min(s.med(M_READ2, "seconds"));
        r.target(
            &format!("migration of the {at} tree: within 2x of reading every file once"),
            versus(fmt_secs, kc, floor, kc / floor),
            kc <= 2.0 * floor,
        );
        if s.0.contains_key(M_OUT) {
            let create = s.med(M_TAR, "seconds").min(s.med(M_LOOP, "seconds"));
            let floor = create + kc;
            let out = s.med(M_OUT, "seconds");
            r.target(
                &format!(
                    "`migrate --out` of the {at} tree: within 1.5x of the file-creation floor \
                     (the faster of tar and the loop) plus the banks alone"
                ),
                versus(fmt_secs, out, floor, out / floor),
                out <= 1.5 * floor,
            );
        }
    }
}
