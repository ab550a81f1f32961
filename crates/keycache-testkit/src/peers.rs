//! Helpers of the snapshot and merge tests (over [`crate::common`]):
//! listings of a store directory for "nothing was written" checks,
//! snapshot files crafted byte by byte, Salt's `validate_token` on many
//! masters, masters made from a localfs_key tree, and docs/install.md's timer
//! recipe.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::run_py;

// --- Store directories, for "nothing was written" checks ---------------

/// Every file under a directory, recursively: relative path -> (kind `d`,
/// `l` or `f`, inode, bytes or link target).
pub type Files = std::collections::BTreeMap<PathBuf, (char, u64, Vec<u8>)>;

/// Every file under `dir` (see [`Files`]).
pub fn files(dir: &Path) -> Files {
    use std::os::unix::fs::MetadataExt;
    let mut out = Files::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("dir entry").path();
            let m = std::fs::symlink_metadata(&p).expect("lstat");
            let rel = p.strip_prefix(dir).expect("under dir").to_path_buf();
            if m.is_dir() {
                out.insert(rel, ('d', m.ino(), Vec::new()));
                stack.push(p);
            } else if m.is_symlink() {
                let t = std::fs::read_link(&p).expect("readlink");
                out.insert(rel, ('l', m.ino(), t.into_os_string().into_encoded_bytes()));
            } else {
                out.insert(rel, ('f', m.ino(), std::fs::read(&p).expect("read")));
            }
        }
    }
    out
}

/// What differs between two listings of [`files`], for failure messages:
/// empty when every file is byte for byte and inode for inode the same.
pub fn files_changed(a: &Files, b: &Files) -> Vec<String> {
    let mut v = Vec::new();
    for (p, x) in a {
        match b.get(p) {
            None => v.push(format!("{} removed", p.display())),
            Some(y) if y.0 != x.0 => v.push(format!("{} changed kind", p.display())),
            Some(y) if y.1 != x.1 => v.push(format!("{} replaced (inode)", p.display())),
            Some(y) if y.2 != x.2 => v.push(format!("{} changed bytes", p.display())),
            _ => {}
        }
    }
    for p in b.keys() {
        if !a.contains_key(p) {
            v.push(format!("{} added", p.display()));
        }
    }
    v
}

// --- Snapshot files of format version 2, byte by byte -------------------
//
// Written here from `docs/format.md` ("Snapshot files"), not by the
// library's writer (which refuses what these tests must craft).

/// The header of a crafted snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader {
    /// The format version (2).
    pub version: u32,
    /// Bit 0: the store has joined its cluster.
    pub flags: u32,
    /// The cluster.
    pub cluster: [u8; 16],
    /// The store.
    pub store: [u8; 16],
    /// The generation (the store's clock when taken).
    pub generation: u64,
}

impl RawHeader {
    /// The header of the snapshot file `b` (panics when it is too short).
    pub fn of(b: &[u8]) -> RawHeader {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let mut cluster = [0u8; 16];
        cluster.copy_from_slice(&b[16..32]);
        let mut store = [0u8; 16];
        store.copy_from_slice(&b[32..48]);
        RawHeader {
            version: u32_at(8),
            flags: u32_at(12),
            cluster,
            store,
            generation: u64::from_le_bytes(b[48..56].try_into().expect("8 bytes")),
        }
    }
}

/// One entry of a crafted snapshot: bank 1 `keys` / 2 `denied_keys`, kind
/// 0 absent / 1 accepted / 2 pending / 3 rejected / 4 denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    pub bank: u8,
    pub kind: u8,
    pub id: Vec<u8>,
    pub key: Vec<u8>,
    pub stamp: u64,
}

/// The bytes of a version 2 snapshot with `h` and `entries` (in the order
/// given), its checksum right.
pub fn snapshot_bytes(h: &RawHeader, entries: &[RawEntry]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"KCSNAP\r\n");
    b.extend_from_slice(&h.version.to_le_bytes());
    b.extend_from_slice(&h.flags.to_le_bytes());
    b.extend_from_slice(&h.cluster);
    b.extend_from_slice(&h.store);
    b.extend_from_slice(&h.generation.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        b.push(e.bank);
        b.push(e.kind);
        b.extend_from_slice(&(e.id.len() as u16).to_le_bytes());
        b.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
        b.extend_from_slice(&e.stamp.to_le_bytes());
        b.extend_from_slice(&e.id);
        b.extend_from_slice(&e.key);
    }
    b.extend_from_slice(&[0u8; 8]);
    reseal(&mut b);
    b
}

/// The header and entries of the version 2 snapshot file `b`, read by the
/// format's lengths without a check (panics when they run past the end).
pub fn snapshot_parts(b: &[u8]) -> (RawHeader, Vec<RawEntry>) {
    let h = RawHeader::of(b);
    let count = u64::from_le_bytes(b[56..64].try_into().expect("8 bytes"));
    let mut o = 64;
    let mut entries = Vec::new();
    for _ in 0..count {
        let id_len = u16::from_le_bytes([b[o + 2], b[o + 3]]) as usize;
        let key_len = u32::from_le_bytes(b[o + 4..o + 8].try_into().expect("4 bytes")) as usize;
        let stamp = u64::from_le_bytes(b[o + 8..o + 16].try_into().expect("8 bytes"));
        let id = b[o + 16..o + 16 + id_len].to_vec();
        let key = b[o + 16 + id_len..o + 16 + id_len + key_len].to_vec();
        entries.push(RawEntry {
            bank: b[o],
            kind: b[o + 1],
            id,
            key,
            stamp,
        });
        o += 16 + id_len + key_len;
    }
    (h, entries)
}

/// Makes the trailing checksum (xxh3-64 of every byte before it) right
/// again after an edit.
pub fn reseal(b: &mut [u8]) {
    let n = b.len() - 8;
    let sum = keycache::format::hash(&b[..n]);
    b[n..].copy_from_slice(&sum.to_le_bytes());
}

// --- Salt's validate_token (py/validate_token.py) ------------------------

/// Salt key pairs for `ids` in `keys/` (salt.crypt.gen_keys): (id, public
/// PEM) in the order of `ids`.
pub fn vt_keygen(keys: &Path, ids: &[&str]) -> Vec<(String, String)> {
    let v = run_py(
        "validate_token.py",
        &[
            "keygen",
            "--out",
            &keys.to_string_lossy(),
            "--ids",
            &ids.join(","),
        ],
        None,
    );
    ids.iter()
        .map(|id| {
            let pem = v["pubs"][id].as_str().expect("a public key");
            (id.to_string(), pem.to_owned())
        })
        .collect()
}

/// Per pki dir of `pkis`, the ids among `ids` whose token (made with the
/// private keys in `keys`) Salt's `ReqServerChannel.validate_token` accepts
/// on that master: what lets a minion run its requests there.
pub fn vt_passing(keys: &Path, pkis: &[&Path], ids: &[&str]) -> Vec<Vec<String>> {
    let jobs: Vec<Value> = pkis
        .iter()
        .map(|p| serde_json::json!({"pki_dir": p.to_string_lossy(), "ids": ids}))
        .collect();
    let v = run_py(
        "validate_token.py",
        &["check", "--keys", &keys.to_string_lossy(), "--stdin"],
        Some(&Value::Array(jobs)),
    );
    let results = v["results"].as_array().expect("results");
    pkis.iter()
        .map(|p| {
            let p = p.to_string_lossy();
            results
                .iter()
                .filter(|r| r["pki_dir"] == *p && r["valid"] == true)
                .map(|r| r["id"].as_str().expect("an id").to_owned())
                .collect()
        })
        .collect()
}

// --- Masters and docs/install.md's timer recipe -------------------------------

/// A Salt master's pki dir `root/name` (mode 0700): the localfs_key
/// directories, `pending` (id, PEM) in `minions_pre/`, migrated into banks
/// by `keycache migrate` (the tree stays, as after Salt's migration).
/// `extra`: the layout's arguments.
pub fn pki_master(
    kc: &crate::crash::Cli,
    root: &Path,
    name: &str,
    pending: &[(String, String)],
    extra: &[String],
) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let pki = root.join(name);
    for d in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        std::fs::create_dir_all(pki.join(d)).expect("mkdir");
    }
    std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    for (id, pem) in pending {
        std::fs::write(pki.join("minions_pre").join(id), pem).expect("write a key");
    }
    std::fs::write(pki.join("cluster.pub"), cluster_pub(root)).expect("write cluster.pub");
    succeeds(
        kc.cmd().arg("migrate").arg(&pki).args(extra),
        &format!("keycache migrate {}", pki.display()),
    );
    pki
}

/// The cluster key of the masters made under `root` (a Salt 3008
/// cluster's `cluster.pub`: what names a store's cluster): one per root,
/// so masters under other roots are another cluster.
pub fn cluster_pub(root: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    // FNV-1a of the root's path: distinct roots, distinct keys.
    let h = root
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    format!("-----BEGIN PUBLIC KEY-----\nMIIBcluster{h:016x}AQAB\n-----END PUBLIC KEY-----\n")
}

/// Where the timer recipe on `a` keeps its base for peer `b`:
/// `root/base-<a>-from-<b>`.
pub fn base_path(root: &Path, a: &Path, b: &Path) -> PathBuf {
    let name = |p: &Path| {
        p.file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned()
    };
    root.join(format!("base-{}-from-{}", name(a), name(b)))
}

/// docs/install.md's timer recipe on master `a` for peer `b`, through a file:
/// `keycache snapshot B --seen <b's base for a> -o SNAP`, then `keycache
/// merge A SNAP --base <a's base for b> --write-base <the same> MORE`
/// (`extra`, the layout's arguments, given to both). The snapshot must
/// succeed; returns the merge's output.
pub fn timer_pull(
    kc: &crate::crash::Cli,
    root: &Path,
    a: &Path,
    b: &Path,
    extra: &[String],
    more: &[&str],
) -> std::process::Output {
    let snap = root.join(format!(
        "{}.snap",
        b.file_name().expect("a name").to_string_lossy()
    ));
    succeeds(
        kc.cmd()
            .arg("snapshot")
            .arg(b)
            .arg("--seen")
            .arg(base_path(root, b, a))
            .arg("-o")
            .arg(&snap)
            .args(extra),
        &format!("keycache snapshot {}", b.display()),
    );
    let base = base_path(root, a, b);
    kc.cmd()
        .arg("merge")
        .arg(a)
        .arg(&snap)
        .arg("--base")
        .arg(&base)
        .arg("--write-base")
        .arg(&base)
        .args(extra)
        .args(more)
        .output()
        .expect("run keycache")
}

/// Runs `cmd` and fails the test, naming it `what` with its stderr, unless it
/// succeeds.
fn succeeds(cmd: &mut std::process::Command, what: &str) {
    let out = cmd.output().expect("run keycache");
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
