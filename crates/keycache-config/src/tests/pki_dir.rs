//! Where the store directory comes from: `pki_dir`, `cluster_pki_dir` with
//! and without `cluster_id`, `root_dir`, relative directories.

use std::path::Path;

use super::*;

#[test]
fn master_config_standalone_fixture() {
    let dir = fixture("standalone");
    let c = load_dir(&dir).unwrap();
    assert!(c.found);
    assert_eq!(
        c.files,
        vec![
            dir.join("master"),
            dir.join("master.d/10-layout.conf"),
            dir.join("master.d/20-size.conf"),
        ]
    );
    assert_eq!(c.store_dir().value, Path::new("/srv/salt/pki/master"));
    assert_eq!(c.store_dir().from, c.pki_dir.as_ref().unwrap().from);
    assert!(!c.clustered);
    assert_eq!(
        c.params(),
        Params {
            size: 20011,
            slot_size: 128,
            id_size: 80,
            max_segment_bytes: format::DEFAULT_MAX_SEGMENT_BYTES,
        }
    );
    // Which file set each value.
    assert_eq!(
        from_file(&c.mmap_key_size),
        (dir.join("master.d/20-size.conf"), 2)
    );
    assert_eq!(from_file(&c.mmap_key_slot_size), (dir.join("master"), 5));
    assert_eq!(c.layout().max_segment_bytes.from, Origin::Default);
    assert!(c.uses_mmap_key());
    assert_eq!(c.user.as_ref().unwrap().value, "salt");
    let text = c.describe();
    assert!(
        text.starts_with(&format!(
            "master config: {} (+ master.d/10-layout.conf, master.d/20-size.conf)\n",
            dir.join("master").display()
        )),
        "{text}"
    );
    assert!(
        text.contains("store: /srv/salt/pki/master (pki_dir in master:2)\n"),
        "{text}"
    );
    assert!(
        text.contains("mmap_key_size 20011 (master.d/20-size.conf:2)"),
        "{text}"
    );
    assert!(
        text.contains("mmap_key_max_segment_bytes 1073741824 (default)"),
        "{text}"
    );
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["store_dir"]["value"], "/srv/salt/pki/master");
    assert_eq!(json["layout"]["size"]["value"], 20011);
    assert_eq!(json["layout"]["size"]["from"]["kind"], "file");
    assert_eq!(json["layout"]["size"]["from"]["line"], 2);
    assert_eq!(json["layout"]["id_size"]["from"]["key"], "mmap_key_id_size");
    assert_eq!(
        json["layout"]["max_segment_bytes"]["from"]["kind"],
        "default"
    );
    assert_eq!(json["cache_driver"], "mmap_key");
    assert_eq!(json["files"].as_array().unwrap().len(), 3);
}

#[test]
fn master_config_cluster_fixture_uses_cluster_pki_dir() {
    let dir = fixture("cluster");
    let c = load_dir(&dir).unwrap();
    assert!(c.clustered);
    assert_eq!(c.cluster_id.as_ref().unwrap().value, "prod");
    assert_eq!(c.store_dir().value, Path::new("/srv/cluster/pki"));
    assert_eq!(
        c.store_dir().from,
        Origin::File {
            file: dir.join("master.d/cluster.conf"),
            line: 5,
            key: "cluster_pki_dir".into()
        }
    );
    assert_eq!(c.pki_dir().value, Path::new("/etc/salt/pki/master"));
    assert_eq!(c.params().max_segment_bytes, 268_435_456);
    let text = c.describe();
    assert!(
        text.contains(
            "store: /srv/cluster/pki (cluster_pki_dir in master.d/cluster.conf:5; cluster_id \"prod\")\n"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["store_dir"]["value"], "/srv/cluster/pki");
    assert_eq!(json["clustered"], true);
}

#[test]
fn master_config_cluster_id_without_cluster_pki_dir_falls_back_to_pki_dir() {
    let (_t, c) = loaded(&[(
        "master",
        "root_dir: /srv/root\npki_dir: /pki\ncluster_id: c1\n",
    )]);
    assert!(c.clustered);
    // Salt: cluster_pki_dir = pki_dir (after the root_dir prefix).
    assert_eq!(
        c.cluster_pki_dir().unwrap().value,
        Path::new("/srv/root/pki")
    );
    assert_eq!(c.store_dir().value, Path::new("/srv/root/pki"));
    assert!(c.notes.iter().any(|n| n.contains("falls back to pki_dir")));
    // An empty cluster_pki_dir too.
    let (_t, c) = loaded(&[("master", "cluster_id: c1\ncluster_pki_dir: ''\n")]);
    assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
}

#[test]
fn master_config_cluster_pki_dir_without_cluster_id_is_ignored() {
    for cid in ["", "cluster_id: null\n", "cluster_id: ~\n"] {
        let (_t, c) = loaded(&[("master", &format!("{cid}cluster_pki_dir: /srv/c\n"))]);
        assert!(!c.clustered);
        assert_eq!(c.cluster_pki_dir(), None);
        assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
        assert!(c
            .notes
            .iter()
            .any(|n| n.contains("ignored without cluster_id")));
    }
    // cluster_id set but false to Python ('' or 0): Salt's apply_master_config
    // sets cluster_pki_dir, mmap_key's init_kwargs still picks pki_dir.
    for cid in ["''", "0"] {
        let (_t, c) = loaded(&[(
            "master",
            &format!("cluster_id: {cid}\ncluster_pki_dir: /srv/c\n"),
        )]);
        assert!(!c.clustered);
        assert_eq!(c.cluster_pki_dir().unwrap().value, Path::new("/srv/c"));
        assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
    }
    // An integer cluster_id is set (Salt's _validate_opts takes str(1)).
    let (_t, c) = loaded(&[("master", "cluster_id: 7\ncluster_pki_dir: /srv/c\n")]);
    assert!(c.clustered);
    assert_eq!(c.store_dir().value, Path::new("/srv/c"));
}

#[test]
fn master_config_relative_cluster_pki_dir_is_the_working_directorys_and_noted() {
    let (_t, c) = loaded(&[("master", "cluster_id: c\ncluster_pki_dir: rel/c\n")]);
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(c.store_dir().value, cwd.join("rel/c"));
    let notes = c.notes.join("\n");
    assert!(
        notes.contains("cluster_pki_dir \"rel/c\"")
            && notes.contains("is relative")
            && notes.contains(&cwd.join("rel/c").display().to_string()),
        "{notes}"
    );
    assert!(c.describe().contains("note: cluster_pki_dir \"rel/c\""));
    // Absolute: no note.
    let t = scratch(&[("master", "cluster_id: c\ncluster_pki_dir: /abs/c\n")]);
    assert!(!load_dir(t.path())
        .unwrap()
        .notes
        .join("\n")
        .contains("relative"));
}

#[test]
fn master_config_root_dir_prefixes_pki_dir_as_salt_does() {
    let cases = [
        // (root_dir, pki_dir, Salt's pki_dir)
        (None, None, "/etc/salt/pki/master"),
        (Some("/srv/r"), None, "/srv/r/etc/salt/pki/master"),
        (
            Some("/srv/r/"),
            Some("/etc/salt/pki/m"),
            "/srv/r/etc/salt/pki/m",
        ),
        (Some("/srv/r"), Some("/srv/r/pki"), "/srv/r/pki"),
        (Some("/srv/r"), Some("pki"), "/srv/r/pki"),
        (None, Some("pki/master"), "/pki/master"),
        (None, Some("/a/b/../c/"), "/a/c"),
        // Salt's quirk: pki_dir equal to root_dir is prefixed again.
        (Some("/srv/r"), Some("/srv/r"), "/srv/r/srv/r"),
    ];
    for (root, pki, want) in cases {
        let mut text = String::new();
        if let Some(r) = root {
            text += &format!("root_dir: {r}\n");
        }
        if let Some(p) = pki {
            text += &format!("pki_dir: {p}\n");
        }
        let (_t, c) = loaded(&[("master", &text)]);
        assert_eq!(c.store_dir().value, Path::new(want), "{root:?} {pki:?}");
    }
    // cluster_pki_dir is not prefixed.
    let t = scratch(&[(
        "master",
        "root_dir: /srv/r\ncluster_id: c\ncluster_pki_dir: /srv/c\n",
    )]);
    assert_eq!(
        load_dir(t.path()).unwrap().store_dir().value,
        Path::new("/srv/c")
    );
}
