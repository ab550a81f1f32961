//! The master keeps its identity across a migration:
//! `keycache::master_keys` fills the `master_keys` bank from a localfs_key
//! master, checked through the real Salt 3008.5: Salt's own `MasterKeys`
//! creates the keys under `localfs_key`, keycache stores them, and then
//! `MasterKeys` under `mmap_key` serves the same master (and cluster) public
//! key without generating any, and `Cache.fetch("master_keys", name)`
//! returns each file's content. The driver is `py/master_keys.py` of the
//! test kit; it needs `cryptography` (and its `cffi`) in the venv.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::salt_master::{
    assert_bank_private, check_served, crypto_scratch, private_dir, state_dirs, Master,
};
use crate::common::{keycache_ok_texts, small, Params, ParamsExt};
use keycache::master_keys::{
    self, Collected, MasterKeyOptions, MasterKeySkipReason, MasterKeysReport, OnDiffer,
};
use keycache::table::Table;
use serde_json::{json, Value};

const SIZE: u64 = 1009;

fn layout() -> Params {
    small(SIZE, 1 << 30)
}

fn names(c: &Collected) -> Vec<&str> {
    c.files.iter().map(|f| f.name.as_str()).collect()
}

fn file_list(c: &Collected) -> Vec<(String, PathBuf)> {
    c.files
        .iter()
        .map(|f| (f.name.clone(), f.path.clone()))
        .collect()
}

/// Nothing in the report, nor in a collected file's Debug, shows a key.
fn assert_no_key_material(c: &Collected, r: &MasterKeysReport) {
    for text in [format!("{c:?}"), format!("{r:?}")] {
        assert!(!text.contains("BEGIN"), "key material in {text}");
        assert!(!text.contains("MII"), "key material in {text}");
    }
}

/// Master `m1_master`, with a signing pair when `signing`, set up (Salt
/// made its keys): its scratch directory, the master and what the setup
/// reported; `None` when Salt's crypto is missing (the test `what` is
/// skipped).
fn m1_master(what: &str, signing: bool) -> Option<(tempfile::TempDir, Master, Value)> {
    let t = crypto_scratch(what)?;
    let m = Master::new(t.path(), "m1_master", layout());
    let m = if signing { m.signing() } else { m };
    let before = m.setup(signing);
    Some((t, m, before))
}

#[test]
fn standalone_master_keeps_its_identity() {
    let Some((_t, m, before)) = m1_master("standalone_master_keeps_its_identity", true) else {
        return;
    };
    assert!(before["sign_pub"].is_string());

    let opts = MasterKeyOptions::new("m1_master");
    let c = master_keys::collect(&m.pki, None, &opts).unwrap();
    assert_eq!(
        names(&c),
        [
            "m1.pem",
            "m1.pub",
            "m1_master_pubkey_signature",
            "master_sign.pem",
            "master_sign.pub"
        ]
    );
    // Salt 3008.5 leaves master.pem/master.pub as symlinks to m1.pem/m1.pub.
    let skipped: Vec<(&str, MasterKeySkipReason)> = c
        .skipped
        .iter()
        .map(|s| (s.name.as_str(), s.reason))
        .collect();
    assert_eq!(
        skipped,
        [
            ("master.pem", MasterKeySkipReason::Symlink),
            ("master.pub", MasterKeySkipReason::Symlink)
        ]
    );

    let r = master_keys::write(m.store_dir(), &c, &layout().options(), OnDiffer::Refuse).unwrap();
    assert_eq!(r.written, names(&c));
    assert!(r.replaced.is_empty() && r.unchanged.is_empty() && r.kept.is_empty());
    assert_no_key_material(&c, &r);
    assert!(assert_bank_private(m.store_dir()) >= 4);

    let files = file_list(&c);
    check_served(&m.serve(&files), &before, &files);
    assert_bank_private(m.store_dir());

    // Again: nothing changes.
    let again =
        master_keys::write(m.store_dir(), &c, &layout().options(), OnDiffer::Refuse).unwrap();
    assert_eq!(again.unchanged, names(&c));
    assert!(again.written.is_empty() && again.replaced.is_empty());
}

#[test]
fn cluster_peer_keeps_master_and_cluster_keys() {
    let Some(t) = crypto_scratch("cluster_peer_keeps_master_and_cluster_keys") else {
        return;
    };
    let cluster = private_dir(&t.path().join("cluster"));
    let m1 = Master::at(t.path(), "pki1", "m1_master", layout())
        .in_cluster("c1", &cluster)
        .signing();
    let before = m1.setup(true);
    // A second peer sharing the cluster pki dir adds peers/m2.pub.
    let m2 = Master::at(t.path(), "pki2", "m2_master", layout()).in_cluster("c1", &cluster);
    m2.setup(false);
    assert!(before["cluster_pub"].is_string());
    // get_pub_str serves the cluster key (clean_key: no trailing newline).
    assert_eq!(
        before["pub_str"].as_str().unwrap(),
        before["cluster_pub"].as_str().unwrap().trim_end()
    );

    let opts = MasterKeyOptions::new("m1_master");
    let c = master_keys::collect(&m1.pki, Some(&cluster), &opts).unwrap();
    assert_eq!(
        names(&c),
        [
            "cluster.pem",
            "cluster.pub",
            "m1.pem",
            "m1.pub",
            // Without master_pubkey_signature set, localfs_key reads the
            // signature from cluster_pki_dir, where gen_signature wrote it.
            "m1_master_pubkey_signature",
            "master_sign.pem",
            "master_sign.pub",
            "peers/m1.pub",
            "peers/m2.pub"
        ]
    );
    let by_name: BTreeMap<&str, &Path> = c
        .files
        .iter()
        .map(|f| (f.name.as_str(), f.path.as_path()))
        .collect();
    assert!(by_name["m1.pem"].starts_with(&m1.pki));
    assert!(by_name["cluster.pem"].starts_with(&cluster));
    assert!(by_name["m1_master_pubkey_signature"].starts_with(&cluster));

    assert_eq!(m1.store_dir(), cluster.as_path());
    let r = master_keys::write(m1.store_dir(), &c, &layout().options(), OnDiffer::Refuse).unwrap();
    assert_eq!(r.written, names(&c));
    assert_no_key_material(&c, &r);
    assert!(assert_bank_private(&cluster) >= 4);
    assert!(!m1.pki.join(".mmap_master.idx").exists());

    let files = file_list(&c);
    check_served(&m1.serve(&files), &before, &files);
    assert_bank_private(&cluster);
}

/// The failure this module fixes, reproduced: with an empty bank Salt's
/// MasterKeys generates a new key pair (and writes the bank with its umask);
/// keycache's write refuses to replace it by default (it could be a newer
/// key), and with `OnDiffer::Replace` puts the tree's keys back, replacing
/// the generated ones, and narrows the files Salt created.
#[test]
fn empty_bank_makes_salt_generate_and_write_restores() {
    let Some((_t, m, before)) =
        m1_master("empty_bank_makes_salt_generate_and_write_restores", false)
    else {
        return;
    };
    let served = m.serve(&[]);
    assert_ne!(served["generated"], json!([]));
    assert_ne!(served["keys"]["master_pub"], before["master_pub"]);

    let c = master_keys::collect(&m.pki, None, &MasterKeyOptions::new("m1_master")).unwrap();
    // By default, a bank value that differs refuses the write (a plan too).
    for dry in [true, false] {
        let run = if dry {
            master_keys::plan
        } else {
            master_keys::write
        };
        match run(m.store_dir(), &c, &layout().options(), OnDiffer::Refuse) {
            Err(keycache::Error::MasterKeysDiffer { names, .. }) => {
                assert_eq!(names, "m1.pem, m1.pub")
            }
            other => panic!("expected MasterKeysDiffer, got {other:?}"),
        }
    }
    let plan =
        master_keys::plan(m.store_dir(), &c, &layout().options(), OnDiffer::Replace).unwrap();
    assert!(plan.dry_run);
    assert_eq!(plan.replaced, ["m1.pem", "m1.pub"]);
    // Salt created the bank with its umask (0644 under root's 022).
    let heap = m.pki.join(".mmap_master.idx.heap");
    let salt_mode = std::fs::metadata(&heap).unwrap().permissions().mode() & 0o777;
    let r = master_keys::write(m.store_dir(), &c, &layout().options(), OnDiffer::Replace).unwrap();
    assert_eq!(r.replaced, ["m1.pem", "m1.pub"]);
    assert!(r.written.is_empty());
    assert_eq!(r.tightened.contains(&heap), salt_mode & !0o600 != 0);
    assert_bank_private(m.store_dir());

    let files = file_list(&c);
    check_served(&m.serve(&files), &before, &files);
}

/// Salt's mmap_key stores a master_keys value as its bytes, str or bytes
/// alike (no marker), and reads keycache's values back.
#[test]
fn value_encoding_is_the_raw_bytes() {
    // Cache.store needs no cryptography: this runs in the plain venv too.
    let t = tempfile::tempdir().unwrap();
    let m = Master::new(t.path(), "m1_master", layout());
    let value = "-----BEGIN PUBLIC KEY-----\nnœud\n-----END PUBLIC KEY-----\n";
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    m.run(
        "mmap_key",
        &[
            "store",
            "--name",
            "as-str.pub",
            "--value-hex",
            &hex,
            "--as",
            "str",
        ],
    );
    m.run(
        "mmap_key",
        &[
            "store",
            "--name",
            "peers/as-bytes.pub",
            "--value-hex",
            &hex,
            "--as",
            "bytes",
        ],
    );
    let table = Table::open(
        m.pki.join(keycache::format::MASTER_INDEX),
        &layout().options(),
    )
    .unwrap();
    for name in ["as-str.pub", "peers/as-bytes.pub"] {
        let got = table.get(name.as_bytes()).unwrap().expect("stored");
        assert_eq!(got.value, value.as_bytes(), "{name}");
    }
    assert_eq!(
        master_keys::names(&m.pki, &layout().options()).unwrap(),
        ["as-str.pub", "peers/as-bytes.pub"]
    );
}

/// What collect leaves out, without Salt: symlinks (in and out of the
/// tree), empty and non-text files, dot-files, other files, names the
/// layout cannot hold, pki_dir names found in cluster_pki_dir.
#[test]
fn collect_and_write_skip_what_salt_cannot_serve() {
    let t = tempfile::tempdir().unwrap();
    let pki = private_dir(&t.path().join("pki"));
    let cluster = private_dir(&t.path().join("cluster"));
    let outside = t.path().join("outside.pem");
    std::fs::write(&outside, "-----BEGIN RSA PRIVATE KEY-----\nX\n").unwrap();
    let pem = "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n";
    std::fs::write(pki.join("m1.pem"), "-----BEGIN RSA PRIVATE KEY-----\nY\n").unwrap();
    std::fs::write(pki.join("m1.pub"), pem).unwrap();
    std::os::unix::fs::symlink(&outside, pki.join("master.pem")).unwrap();
    std::fs::write(pki.join("master_sign.pub"), "").unwrap();
    std::fs::write(pki.join("master_sign.pem"), b"\xff\xfe").unwrap();
    std::fs::write(cluster.join("cluster.pub"), pem).unwrap();
    std::os::unix::fs::symlink(&outside, cluster.join("cluster.pem")).unwrap();
    std::fs::write(cluster.join("master.pub"), pem).unwrap();
    std::fs::write(cluster.join("notes.txt"), "hello").unwrap();
    std::fs::write(cluster.join(".hidden.pem"), pem).unwrap();
    std::fs::create_dir(cluster.join("minions")).unwrap();
    std::fs::write(cluster.join("minions").join("web1"), pem).unwrap();
    std::fs::create_dir(cluster.join("peers")).unwrap();
    std::fs::write(cluster.join("peers").join("m2.pub"), pem).unwrap();
    std::fs::write(cluster.join("peers").join("m2.pem"), pem).unwrap();
    let long = format!("{}.pub", "p".repeat(60));
    std::fs::write(cluster.join("peers").join(&long), pem).unwrap();

    let c = master_keys::collect(&pki, Some(&cluster), &MasterKeyOptions::new("m1")).unwrap();
    assert_eq!(
        names(&c),
        [
            "cluster.pub",
            "m1.pem",
            "m1.pub",
            "peers/m2.pub",
            &format!("peers/{long}")
        ]
    );
    let skipped: BTreeMap<&str, MasterKeySkipReason> = c
        .skipped
        .iter()
        .map(|s| (s.name.as_str(), s.reason))
        .collect();
    let want: BTreeMap<&str, MasterKeySkipReason> = [
        ("cluster.pem", MasterKeySkipReason::Symlink),
        ("master.pem", MasterKeySkipReason::Symlink),
        ("master.pub", MasterKeySkipReason::WrongDir),
        ("master_sign.pem", MasterKeySkipReason::NotText),
        ("master_sign.pub", MasterKeySkipReason::Empty),
        ("notes.txt", MasterKeySkipReason::NotAKeyName),
        ("peers/m2.pem", MasterKeySkipReason::NotAKeyName),
    ]
    .into_iter()
    .collect();
    assert_eq!(skipped, want);

    // A bank that Salt's umask made 0644 is narrowed; new files are 0600.
    let store = t.path().join("store");
    let r = master_keys::write(&store, &c, &layout().options(), OnDiffer::Refuse).unwrap();
    assert_eq!(
        r.written,
        ["cluster.pub", "m1.pem", "m1.pub", "peers/m2.pub"]
    );
    assert_eq!(
        r.skipped
            .iter()
            .find(|s| s.name == format!("peers/{long}"))
            .map(|s| s.reason),
        Some(MasterKeySkipReason::NameTooLong)
    );
    assert_no_key_material(&c, &r);
    assert!(assert_bank_private(&store) >= 4);
    let heap = store.join(".mmap_master.idx.heap");
    std::fs::set_permissions(&heap, std::fs::Permissions::from_mode(0o644)).unwrap();
    let again = master_keys::write(&store, &c, &layout().options(), OnDiffer::Refuse).unwrap();
    assert_eq!(again.tightened, [heap]);
    assert_bank_private(&store);

    // A caller's ownership never widens the mode.
    let wide = keycache::OpenOptions {
        ownership: Some(keycache::files::Ownership {
            owner: None,
            mode: 0o644,
            explicit: false,
        }),
        ..layout().options()
    };
    let store2 = t.path().join("store2");
    master_keys::write(&store2, &c, &wide, OnDiffer::Refuse).unwrap();
    assert!(assert_bank_private(&store2) >= 4);
}

/// A tree from before Salt 3008 (regular master.pem/master.pub, no id-named
/// pair), migrated after Salt already ran under mmap_key and generated a new
/// pair into the bank: the tree's pair is stored under both names, so the
/// generated `m1.pem` is replaced (when replacing is asked for) and Salt
/// serves the tree's key.
#[test]
fn pre_3008_tree_wins_over_a_generated_pair() {
    let Some((_t, m, before)) = m1_master("pre_3008_tree_wins_over_a_generated_pair", false) else {
        return;
    };
    for ext in ["pem", "pub"] {
        let link = m.pki.join(format!("master.{ext}"));
        std::fs::remove_file(&link).unwrap();
        std::fs::rename(m.pki.join(format!("m1.{ext}")), &link).unwrap();
    }
    let generated = m.serve(&[]);
    assert_ne!(generated["generated"], json!([]));
    assert_ne!(generated["keys"]["master_pub"], before["master_pub"]);

    let c = master_keys::collect(&m.pki, None, &MasterKeyOptions::new("m1_master")).unwrap();
    assert_eq!(names(&c), ["m1.pem", "m1.pub", "master.pem", "master.pub"]);
    assert!(c.files[0].path.ends_with("master.pem"));
    let r = master_keys::write(m.store_dir(), &c, &layout().options(), OnDiffer::Replace).unwrap();
    assert_eq!(r.replaced, ["m1.pem", "m1.pub"]);
    assert_eq!(r.written, ["master.pem", "master.pub"]);

    let files = file_list(&c);
    check_served(&m.serve(&files), &before, &files);
}

/// `keycache migrate` of a Salt 3008.5 master's pki_dir keeps the master's
/// identity: the master_keys bank is filled (the id read off the
/// `master.pem` symlink), Salt's MasterKeys under mmap_key generates nothing
/// and serves the same public keys, and `list --bank master_keys` shows
/// names only.
#[test]
fn keycache_migrate_keeps_the_masters_identity() {
    let Some((_t, m, before)) = m1_master("keycache_migrate_keeps_the_masters_identity", true)
    else {
        return;
    };
    state_dirs(&m.pki);
    let pki = m.pki.display().to_string();
    let size = SIZE.to_string();
    let (out, _) = keycache_ok_texts(&["migrate", &pki, "--size", &size]);
    assert!(out.contains("master_keys: 5 written"), "{out}");
    let c = master_keys::collect(&m.pki, None, &MasterKeyOptions::new("m1_master")).unwrap();
    let files = file_list(&c);
    check_served(&m.serve(&files), &before, &files);
    assert!(assert_bank_private(&m.pki) >= 4);
    // Names only, never key bytes, in text and JSON.
    for json in [false, true] {
        let mut args = vec!["list", &pki, "--bank", "master_keys", "--size", &size];
        if json {
            args.push("--json");
        }
        let (out, _) = keycache_ok_texts(&args);
        assert!(
            out.contains("m1.pem") && out.contains("master_sign.pub"),
            "{out}"
        );
        assert!(!out.contains("BEGIN"), "key material listed: {out}");
    }
    let (out, _) = keycache_ok_texts(&["migrate", &pki, "--size", &size, "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["master_keys"]["unchanged"].as_array().map(Vec::len),
        Some(5),
        "{v}"
    );
    assert!(!out.contains("BEGIN"), "key material in the report: {out}");
}

/// A cluster peer migrated through its master config (`-c`): the banks go
/// where Salt's mmap_key looks (cluster_pki_dir), with the config's layout;
/// the master and cluster keys are served unchanged; the commands say which
/// directory and layout they used.
#[test]
fn keycache_migrate_with_the_master_config_of_a_cluster_peer() {
    let Some(t) = crypto_scratch("keycache_migrate_with_the_master_config_of_a_cluster_peer")
    else {
        return;
    };
    let cluster = private_dir(&t.path().join("cluster"));
    let m = Master::new(t.path(), "m1_master", layout()).in_cluster("c1", &cluster);
    let before = m.setup(false);
    state_dirs(&m.pki);
    state_dirs(&cluster);
    // A pending minion key in the cluster tree.
    std::fs::write(
        cluster.join("minions_pre/web-1"),
        common::pem("web-1", 5).as_bytes(),
    )
    .unwrap();
    let conf = t.path().join("etc");
    std::fs::create_dir_all(conf.join("master.d")).unwrap();
    std::fs::write(
        conf.join("master"),
        format!(
            "pki_dir: {}\ncluster_id: c1\ncluster_pki_dir: {}\nkeys.cache_driver: mmap_key\n",
            m.pki.display(),
            cluster.display()
        ),
    )
    .unwrap();
    std::fs::write(
        conf.join("master.d/layout.conf"),
        format!("mmap_key_size: {SIZE}\n"),
    )
    .unwrap();
    let c = conf.display().to_string();
    let (_, err) = keycache_ok_texts(&["migrate", "-c", &c]);
    assert!(err.contains(&cluster.display().to_string()), "{err}");
    assert!(err.contains(&format!("mmap_key_size {SIZE}")), "{err}");
    let idx = std::fs::metadata(cluster.join(".mmap_keys.idx")).unwrap();
    assert_eq!(idx.len(), SIZE * 96, "the config's mmap_key_size");
    assert!(
        !m.pki.join(".mmap_keys.idx").exists(),
        "banks written to pki_dir"
    );
    let (out, _) = keycache_ok_texts(&["list", "-c", &c, "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["minions_pre"], json!(["web-1"]), "{v}");
    let collected =
        master_keys::collect(&m.pki, Some(&cluster), &MasterKeyOptions::new("m1_master")).unwrap();
    let files = file_list(&collected);
    check_served(&m.serve(&files), &before, &files);
}

/// A master config that does not parse: an error naming the file and line,
/// exit 2, nothing written.
#[test]
fn a_bad_master_config_is_refused_naming_file_and_line() {
    let t = tempfile::tempdir().unwrap();
    let conf = t.path().join("etc");
    std::fs::create_dir_all(conf.join("master.d")).unwrap();
    std::fs::write(conf.join("master"), "pki_dir: /nonexistent\n").unwrap();
    std::fs::write(conf.join("master.d/bad.conf"), "mmap_key_size: 10\n  : [\n").unwrap();
    let c = conf.display().to_string();
    for args in [vec!["list", "-c", &c], vec!["migrate", "-c", &c]] {
        let o = common::keycache(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("master.d/bad.conf:2"), "{args:?}: {err}");
    }
    assert!(!Path::new("/nonexistent").exists());
}
