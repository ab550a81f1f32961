//! The data measured on, made once under `--data` and reused: trees from
//! `tools/gen-pki-tree.py`, stores migrated from them with `keycache migrate`,
//! id lists, LMDB environments; or (`--generate rust`) stores put straight
//! from this tool, under names of their own (`store-N-rs`, ...).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use keycache::{MinionId, Store};
use keycache_bench::{build_lmdb, build_store, minion_id, open_options, table_size_for};
use keycache_testkit::rng::Rng;

use crate::util::{die, log, repo};

pub(crate) struct Data {
    pub(crate) dir: PathBuf,
    pub(crate) keycache: PathBuf,
    /// Stores made by puts from this tool (`keycache_bench::build_store`)
    /// rather than migrated from a tree.
    pub(crate) rust: bool,
}

pub(crate) struct Prepared {
    pub(crate) n: u64,
    pub(crate) size: u64,
    pub(crate) tree: PathBuf,
    pub(crate) store: PathBuf,
    pub(crate) hits_file: PathBuf,
    pub(crate) misses_file: PathBuf,
    pub(crate) sample_file: PathBuf,
}

impl Data {
    pub(crate) fn tree(&self, n: u64) -> PathBuf {
        let tree = self.dir.join(format!("tree-{n}"));
        let summary = self.dir.join(format!("tree-{n}.json"));
        if !summary.exists() {
            let _ = std::fs::remove_dir_all(&tree);
            log(&format!(
                "generating a tree of {n} minions (tools/gen-pki-tree.py)"
            ));
            let out = Command::new("python3")
                .arg(repo().join("tools/gen-pki-tree.py"))
                .arg(&tree)
                .args(["--minions", &n.to_string()])
                .stderr(Stdio::inherit())
                .output()
                .expect("run tools/gen-pki-tree.py");
            if !out.status.success() {
                die("tools/gen-pki-tree.py failed");
            }
            std::fs::write(&summary, &out.stdout).unwrap();
        }
        tree
    }

    /// What the names of this kind of data end with: `-rs` for stores put
    /// from this tool, nothing for migrated ones.
    fn tag(&self) -> &'static str {
        if self.rust {
            "-rs"
        } else {
            ""
        }
    }

    pub(crate) fn prepare(&self, n: u64) -> Prepared {
        let tag = self.tag();
        let size = table_size_for(n);
        let store = self.dir.join(format!("store-{n}{tag}"));
        let done = store.join(".compare-complete");
        let tree = if self.rust {
            self.dir.join(format!("tree-{n}"))
        } else {
            self.tree(n)
        };
        if self.rust && !done.exists() {
            let _ = std::fs::remove_dir_all(&store);
            log(&format!(
                "putting {n} minions into store-{n}{tag} (size {size})"
            ));
            let t0 = std::time::Instant::now();
            drop(build_store(&store, n, size));
            log(&format!(
                "store-{n}{tag}: {:.1} s",
                t0.elapsed().as_secs_f64()
            ));
            std::fs::write(&done, b"").unwrap();
        }
        if !done.exists() {
            let _ = std::fs::remove_dir_all(&store);
            std::fs::create_dir_all(&store).unwrap();
            log(&format!("migrating tree-{n} into store-{n} (size {size})"));
            let st = Command::new(&self.keycache)
                .arg("migrate")
                .arg(&tree)
                .arg("--out")
                .arg(&store)
                .args(["--size", &size.to_string()])
                .stdout(Stdio::null())
                .status()
                .expect("run keycache migrate");
            if !st.success() {
                die("keycache migrate failed");
            }
            std::fs::write(&done, b"").unwrap();
        }
        let hits_file = self.dir.join(format!("ids-{n}{tag}-hit.txt"));
        let misses_file = self.dir.join(format!("ids-{n}{tag}-miss.txt"));
        let sample_file = self.dir.join(format!("ids-{n}{tag}-sample10k.txt"));
        if !sample_file.exists() {
            let s = Store::open_with(&store, &open_options(size)).unwrap();
            let mut hits: Vec<String> = s.keys(None).unwrap().map(|r| r.unwrap().0).collect();
            let mut rng = Rng::new(n);
            rng.shuffle(&mut hits);
            // Absent ids of the same shape: numbers past the tree's.
            let mut misses: Vec<String> = (0..hits.len() as u64)
                .map(|k| minion_id(n + 1 + k))
                .collect();
            rng.shuffle(&mut misses);
            std::fs::write(&hits_file, hits.join("\n") + "\n").unwrap();
            std::fs::write(&misses_file, misses.join("\n") + "\n").unwrap();
            let sample: Vec<&str> = hits.iter().take(10_000).map(String::as_str).collect();
            std::fs::write(&sample_file, sample.join("\n") + "\n").unwrap();
        }
        Prepared {
            n,
            size,
            tree,
            store,
            hits_file,
            misses_file,
            sample_file,
        }
    }

    pub(crate) fn lmdb(&self, p: &Prepared, entries: &[(String, u8, Vec<u8>)]) -> PathBuf {
        let dir = self.dir.join(format!("lmdb-{}{}", p.n, self.tag()));
        let done = self
            .dir
            .join(format!("lmdb-{}{}.complete", p.n, self.tag()));
        if !done.exists() {
            let _ = std::fs::remove_dir_all(&dir);
            log(&format!(
                "building the LMDB environment for {} minions",
                p.n
            ));
            let (env, _) = build_lmdb(&dir, entries);
            env.prepare_for_closing().wait();
            std::fs::write(&done, b"").unwrap();
        }
        dir
    }
}

pub(crate) fn read_ids(path: &Path) -> Vec<MinionId> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| MinionId::new(l).unwrap())
        .collect()
}
