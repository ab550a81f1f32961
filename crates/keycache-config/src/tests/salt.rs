//! The reader against Salt 3008.5 itself: every config compared with what
//! `salt.config.master_config` and mmap_key make of it.

use super::*;

/// Salt 3008.5's own reading of a list of master config files: for each,
/// what `salt.config.master_config` and mmap_key's `init_kwargs` and
/// `_get_cache` make of it. The directories are resolved as the process
/// opens them (`os.path.abspath`: Salt keeps a relative `cluster_pki_dir`
/// relative, so it is the working directory's).
const SALT_READER: &str = r#"
import json, os, sys
import salt.config
import salt.cache.mmap_key as mk
import salt.utils.mmap_cache as mc
out = []
for path in json.load(sys.stdin):
    try:
        opts = salt.config.master_config(path)
    except SystemExit:
        out.append("refused")
        continue
    mk.__opts__ = opts
    g = opts.get
    out.append({
        "store": os.path.abspath(mk.init_kwargs({})["cachedir"]),
        "pki_dir": opts["pki_dir"],
        "cluster_pki_dir": opts["cluster_pki_dir"] and os.path.abspath(opts["cluster_pki_dir"]),
        "size": g("mmap_key_size", mk._DEFAULT_SIZE),
        "slot_size": g("mmap_key_slot_size", mk._DEFAULT_SLOT_SIZE),
        "id_size": g("mmap_key_id_size", mk._DEFAULT_ID_SIZE),
        "max_segment_bytes": g("mmap_key_max_segment_bytes",
            g("mmap_cache_max_segment_bytes", mc.DEFAULT_MAX_SEGMENT_BYTES)),
        "cache_driver": opts["keys.cache_driver"],
    })
json.dump(out, sys.stdout)
"#;

#[test]
fn master_config_agrees_with_salt_3008_5() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let r = root.display().to_string();
    let abs_inc = t.path().join("shared/abs.conf");
    std::fs::create_dir_all(abs_inc.parent().unwrap()).unwrap();
    std::fs::write(&abs_inc, "mmap_key_slot_size: 300\nmmap_key_size: 31\n").unwrap();
    let a = abs_inc.display().to_string();
    // Each case: files of one config directory (`master` first).
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![("master", String::new())],
        vec![(
            "master",
            "pki_dir: /srv/pki/\nmmap_key_size: 010007\n".into(),
        )],
        vec![(
            "master",
            "mmap_key_size: 0x2717\nmmap_key_slot_size: 1_28\nmmap_key_id_size: 1:20\n".into(),
        )],
        vec![
            (
                "master",
                "mmap_key_size: 101\nkeys.cache_driver: mmap_key\n".into(),
            ),
            ("master.d/b.conf", "mmap_key_size: 303\n".into()),
            (
                "master.d/a.conf",
                "mmap_key_size: 202\nmmap_key_id_size: 40\n".into(),
            ),
            ("master.d/.h.conf", "mmap_key_size: 9\n".into()),
            ("master.d/c.conf.bak", "mmap_key_size: 9\n".into()),
        ],
        vec![
            ("master", "cluster_id: c1\ncluster_pki_dir: /srv/c\n".into()),
            (
                "master.d/z.conf",
                "mmap_key_max_segment_bytes: 65536\n".into(),
            ),
        ],
        vec![("master", "cluster_id: c1\npki_dir: /srv/p\n".into())],
        vec![("master", "cluster_id: ''\ncluster_pki_dir: /srv/c\n".into())],
        vec![("master", "cluster_id: 0\ncluster_pki_dir: /srv/c\n".into())],
        vec![("master", "cluster_id: 7\ncluster_pki_dir: /srv/c\n".into())],
        vec![("master", "cluster_pki_dir: /srv/c\n".into())],
        vec![("master", "cluster_id: c\ncluster_pki_dir: ''\n".into())],
        vec![
            ("master", "cluster_id: c\ncluster_pki_dir: /srv/c\n".into()),
            ("master.d/x.conf", "cluster_id: null\n".into()),
        ],
        vec![("master", format!("root_dir: {r}\n"))],
        vec![("master", format!("root_dir: {r}/\npki_dir: {r}/pki\n"))],
        vec![("master", format!("root_dir: {r}\npki_dir: pki/m\n"))],
        vec![("master", format!("root_dir: {r}\npki_dir: {r}\n"))],
        vec![("master", "pki_dir: rel/pki\n".into())],
        vec![("master", "pki_dir: /a/./b/../c//\n".into())],
        vec![(
            "master",
            format!("root_dir: {r}\ncluster_id: c\ncluster_pki_dir: /srv/c\n"),
        )],
        vec![
            (
                "master",
                format!("mmap_key_size: 1\ninclude:\n  - extra/*.yaml\n  - {a}\n  - none/*\n"),
            ),
            (
                "master.d/a.conf",
                "mmap_key_size: 2\nmmap_key_id_size: 20\n".into(),
            ),
            ("extra/2.yaml", "mmap_key_size: 4\n".into()),
            (
                "extra/1.yaml",
                "mmap_key_size: 3\nmmap_key_id_size: 21\n".into(),
            ),
        ],
        vec![
            (
                "master",
                "include: sub/main.conf\nmmap_key_size: 1\n".into(),
            ),
            (
                "sub/main.conf",
                "include: [nested/*.conf]\nmmap_key_size: 5\nmmap_key_id_size: 50\n".into(),
            ),
            ("sub/nested/n.conf", "mmap_key_id_size: 51\n".into()),
        ],
        vec![
            ("master", "default_include: conf.d/*.yml\n".into()),
            (
                "conf.d/x.yml",
                "mmap_key_size: 11\ndefault_include: o/*\n".into(),
            ),
            ("o/y", "mmap_key_size: 12\n".into()),
            ("master.d/z.conf", "mmap_key_size: 13\n".into()),
        ],
        vec![
            ("master", "default_include: ''\n".into()),
            ("master.d/z.conf", "mmap_key_size: 13\n".into()),
        ],
        vec![(
            "master",
            "base: &b {mmap_key_size: 77, mmap_key_id_size: 33}\n<<: *b\nmmap_key_id_size: 34\n"
                .into(),
        )],
        vec![("master", "mmap_cache_max_segment_bytes: 4096\n".into())],
        vec![(
            "master",
            "mmap_cache_max_segment_bytes: 4096\nmmap_key_max_segment_bytes: 8192\n".into(),
        )],
        vec![("master", "keys.cache_driver: null\n".into())],
        vec![("master", "---\n0\n".into())],
        // A relative cluster_pki_dir: relative to the working directory.
        vec![("master", "cluster_id: c\ncluster_pki_dir: rel/c\n".into())],
        vec![(
            "master",
            "cluster_id: c\ncluster_pki_dir: ./x/../rel2\npki_dir: /srv/p\n".into(),
        )],
        // master.d/a.conf includes the main file again: read again (its
        // own default_include is not followed), overriding a.conf.
        vec![
            (
                "master",
                "pki_dir: /srv/m\nmmap_key_size: 101\nmmap_key_slot_size: 128\n".into(),
            ),
            (
                "master.d/a.conf",
                "include: ../master\nmmap_key_size: 202\nmmap_key_id_size: 40\n".into(),
            ),
            ("master.d/b.conf", "mmap_key_id_size: 41\n".into()),
        ],
        vec![
            ("master", "include: extra.conf\nmmap_key_size: 101\n".into()),
            (
                "master.d/a.conf",
                "include: [../master]\nmmap_key_id_size: 40\n".into(),
            ),
            ("extra.conf", "mmap_key_size: 303\n".into()),
        ],
    ];
    // Main files Salt refuses (its loader errors, master_config exits).
    let refused: Vec<&str> = vec![
        "mmap_key_size: 1\nmmap_key_size: 2\n",
        "1: a\ntrue: b\n",
        "just a string\n",
        "- a\n",
        "a: 1\n---\nb: 2\n",
        "a: !!python/object:os.system x\n",
        "a: [1, 2\nb: 3\n",
        "a: 1\n  b: 2\n",
    ];
    let cases: Vec<Vec<(&str, String)>> = cases
        .into_iter()
        .chain(
            refused
                .iter()
                .map(|r| vec![("master", format!("---\n{r}"))]),
        )
        .collect();
    let mut paths = Vec::new();
    for (i, files) in cases.iter().enumerate() {
        let d = t.path().join(format!("case{i}"));
        for (name, text) in files {
            let p = d.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            // A fixed id keeps Salt from looking up the host's name.
            let text = if *name == "master" && !text.starts_with("---") {
                format!("id: kc-test\n{text}")
            } else {
                text.clone()
            };
            std::fs::write(p, text).unwrap();
        }
        paths.push(d);
    }
    let input: Vec<String> = paths
        .iter()
        .map(|d| d.join("master").display().to_string())
        .collect();
    let mut child = std::process::Command::new(keycache_testkit::common::python())
        .stderr(std::process::Stdio::piped())
        .args(["-B", "-c", SALT_READER])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("SALT_CONFIG_DIR")
        .env_remove("SALT_MASTER_CONFIG")
        // Ours: relative paths resolve against the test's working directory.
        .current_dir(std::env::current_dir().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    serde_json::to_writer(child.stdin.take().unwrap(), &input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "Salt's reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let salt: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    for (i, d) in paths.iter().enumerate() {
        if salt[i] == "refused" {
            let e = load_dir(d).expect_err(&format!("case {i}: Salt refuses {:?}", cases[i]));
            assert!(
                matches!(
                    e,
                    ConfigError::Syntax { .. } | ConfigError::NotAMapping { .. }
                ),
                "case {i}: {e}"
            );
            continue;
        }
        let c = load_dir(d).unwrap_or_else(|e| panic!("case {i}: {e}"));
        let p = c.params();
        let ours = serde_json::json!({
            "store": c.store_dir().value,
            "pki_dir": c.pki_dir().value,
            "cluster_pki_dir": c.cluster_pki_dir().map(|s| s.value),
            "size": p.size,
            "slot_size": p.slot_size,
            "id_size": p.id_size,
            "max_segment_bytes": p.max_segment_bytes,
            "cache_driver": c.cache_driver(),
        });
        assert_eq!(ours, salt[i], "case {i}: {:?}", cases[i]);
    }
}
