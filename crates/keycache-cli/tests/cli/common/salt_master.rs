//! A Salt 3008.5 master's own keys, driven through the test kit's
//! `py/master_keys.py`: Salt's real `MasterKeys` (salt/crypt.py) under
//! `localfs_key` (to create a master's key files) or under `mmap_key` (to
//! check what a master started on a keycache-written store would serve).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::strings;
use keycache_testkit::cmd::check_ok;
use keycache_testkit::common::{py_dir, python, Params, ParamsExt, TREE_DIRS};
use serde_json::{json, Value};

/// One master as the driver sees it.
pub struct Master {
    /// Scratch root (Salt's root_dir, cachedir).
    pub root: PathBuf,
    /// `pki_dir`.
    pub pki: PathBuf,
    /// `cluster_id` and `cluster_pki_dir` of a cluster peer.
    pub cluster: Option<(String, PathBuf)>,
    /// The id as Salt's opts hold it (`m1_master`).
    pub id: String,
    /// `master_sign_pubkey: True`.
    pub sign: bool,
    /// The layout (`mmap_key_size`, ...) of the `mmap_key` runs.
    pub layout: Params,
}

impl Master {
    /// A standalone master with id `id`, its pki_dir `root/pki` (mode 0700).
    pub fn new(root: &Path, id: &str, layout: Params) -> Master {
        Master::at(root, "pki", id, layout)
    }

    /// A standalone master with id `id`, its pki_dir `root/<pki>` (mode
    /// 0700).
    pub fn at(root: &Path, pki: &str, id: &str, layout: Params) -> Master {
        Master {
            root: root.to_path_buf(),
            pki: private_dir(&root.join(pki)),
            cluster: None,
            id: id.to_string(),
            sign: false,
            layout,
        }
    }

    /// This master as a peer of cluster `cluster_id`, whose
    /// `cluster_pki_dir` is `dir`.
    pub fn in_cluster(mut self, cluster_id: &str, dir: &Path) -> Master {
        self.cluster = Some((cluster_id.to_string(), dir.to_path_buf()));
        self
    }

    /// This master with `master_sign_pubkey: True`.
    pub fn signing(mut self) -> Master {
        self.sign = true;
        self
    }

    /// Runs `master_keys.py` under `driver` with `args`.
    pub fn try_run(&self, driver: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(python());
        cmd.arg(py_dir().join("master_keys.py"))
            .arg("--root")
            .arg(&self.root)
            .arg("--pki-dir")
            .arg(&self.pki)
            .args(["--id", &self.id, "--driver", driver])
            .args(self.layout.args());
        if let Some((cid, dir)) = &self.cluster {
            cmd.args(["--cluster-id", cid])
                .arg("--cluster-pki-dir")
                .arg(dir);
        }
        if self.sign {
            cmd.arg("--sign");
        }
        cmd.args(args).output().expect("run master_keys.py")
    }

    /// [`Master::try_run`], which must succeed; its JSON document.
    pub fn run(&self, driver: &str, args: &[&str]) -> Value {
        let out = self.try_run(driver, args);
        check_ok(&format!("master_keys.py {args:?} failed"), &out);
        serde_json::from_slice(&out.stdout).expect("master_keys.py prints JSON")
    }

    /// Salt's MasterKeys under localfs_key: creates the keys in the tree;
    /// returns the public keys it serves.
    pub fn setup(&self, signature: bool) -> Value {
        let mut args = vec!["setup"];
        if signature {
            args.push("--signature");
        }
        let v = self.run("localfs_key", &args);
        assert!(!v["generated"].as_array().unwrap().is_empty(), "{v}");
        v["keys"].clone()
    }

    /// Salt's MasterKeys under mmap_key, and Cache.fetch of each name
    /// compared with its file.
    pub fn serve(&self, files: &[(String, PathBuf)]) -> Value {
        let expect: BTreeMap<&str, String> = files
            .iter()
            .map(|(n, p)| (n.as_str(), p.display().to_string()))
            .collect();
        let expect = serde_json::to_string(&expect).unwrap();
        self.run("mmap_key", &["serve", "--expect", &expect])
    }

    /// Where Salt's mmap_key keeps the master_keys bank.
    pub fn store_dir(&self) -> &Path {
        keycache::master_keys::store_dir(&self.pki, self.cluster.as_ref().map(|c| c.1.as_path()))
    }
}

/// Whether the venv's Salt can run MasterKeys (it needs `cryptography` and
/// `cffi`); reports the test skipped when not.
pub fn salt_crypto(what: &str) -> bool {
    let ok = Command::new(python())
        .args([
            "-c",
            "from cryptography.hazmat.primitives.asymmetric import rsa; import salt.crypt",
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        keycache_testkit::skip::skip(
            what,
            "the venv's Salt cannot import cryptography (tools/setup-venv.sh must install \
             cryptography and cffi for salt.crypt.MasterKeys)",
        );
    }
    ok
}

/// A scratch directory for the test `what`, or `None` (the test reported
/// skipped) when the venv's Salt cannot run MasterKeys ([`salt_crypto`]).
pub fn crypto_scratch(what: &str) -> Option<tempfile::TempDir> {
    salt_crypto(what).then(|| tempfile::tempdir().unwrap())
}

/// Creates `path` (and parents) with mode 0700.
pub fn private_dir(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
    path.to_path_buf()
}

/// The state directories a Salt master creates at start-up (empty).
pub fn state_dirs(pki: &Path) {
    for d in TREE_DIRS {
        std::fs::create_dir_all(pki.join(d)).unwrap();
    }
}

/// Every file of the master_keys bank in `dir` is 0600 or narrower;
/// returns how many there are.
pub fn assert_bank_private(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".mmap_master.idx") {
            let mode = e.metadata().unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode & !0o600, 0, "{name} is mode {mode:o}");
            n += 1;
        }
    }
    n
}

/// Salt served what it served before (`before`, [`Master::setup`]'s keys)
/// without generating a key, and `fetch` returned each file's content.
pub fn check_served(served: &Value, before: &Value, files: &[(String, PathBuf)]) {
    assert_eq!(
        served["generated"],
        json!([]),
        "Salt generated new keys: {}",
        served["generated"]
    );
    for k in ["pub_str", "master_pub", "cluster_pub", "sign_pub"] {
        assert_eq!(served["keys"][k], before[k], "{k} differs");
    }
    for (name, _) in files {
        let f = &served["fetch"][name];
        assert_eq!(f["equal"], json!(true), "fetch(master_keys, {name}): {f}");
    }
    let listed: Vec<&str> = strings(&served["list"]);
    for (name, _) in files {
        assert!(
            listed.contains(&name.as_str()),
            "{name} not listed: {listed:?}"
        );
    }
}
