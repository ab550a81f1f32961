//! The master config reader against Salt 3008.5's rules: fixtures under
//! `tests/fixtures` and configs written to scratch
//! directories.

use std::path::{Path, PathBuf};

use super::paths::normpath;
use super::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A scratch config directory with `files` (relative path, content).
fn scratch(files: &[(&str, &str)]) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for (p, text) in files {
        let p = t.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    t
}

fn load_dir(dir: &Path) -> Result<MasterConfig, ConfigError> {
    MasterConfig::load(&Source::config_dir(dir))
}

fn from_file(s: &Option<Setting<impl Clone>>) -> (PathBuf, usize) {
    match &s.as_ref().unwrap().from {
        Origin::File { file, line, .. } => (file.clone(), *line),
        o => panic!("{o:?}"),
    }
}

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
    let t = scratch(&[(
        "master",
        "root_dir: /srv/root\npki_dir: /pki\ncluster_id: c1\n",
    )]);
    let c = load_dir(t.path()).unwrap();
    assert!(c.clustered);
    // Salt: cluster_pki_dir = pki_dir (after the root_dir prefix).
    assert_eq!(
        c.cluster_pki_dir().unwrap().value,
        Path::new("/srv/root/pki")
    );
    assert_eq!(c.store_dir().value, Path::new("/srv/root/pki"));
    assert!(c.notes.iter().any(|n| n.contains("falls back to pki_dir")));
    // An empty cluster_pki_dir too.
    let t = scratch(&[("master", "cluster_id: c1\ncluster_pki_dir: ''\n")]);
    let c = load_dir(t.path()).unwrap();
    assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
}

#[test]
fn master_config_cluster_pki_dir_without_cluster_id_is_ignored() {
    for cid in ["", "cluster_id: null\n", "cluster_id: ~\n"] {
        let t = scratch(&[("master", &format!("{cid}cluster_pki_dir: /srv/c\n"))]);
        let c = load_dir(t.path()).unwrap();
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
        let t = scratch(&[(
            "master",
            &format!("cluster_id: {cid}\ncluster_pki_dir: /srv/c\n"),
        )]);
        let c = load_dir(t.path()).unwrap();
        assert!(!c.clustered);
        assert_eq!(c.cluster_pki_dir().unwrap().value, Path::new("/srv/c"));
        assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
    }
    // An integer cluster_id is set (Salt's _validate_opts takes str(1)).
    let t = scratch(&[("master", "cluster_id: 7\ncluster_pki_dir: /srv/c\n")]);
    let c = load_dir(t.path()).unwrap();
    assert!(c.clustered);
    assert_eq!(c.store_dir().value, Path::new("/srv/c"));
}

#[test]
fn master_config_master_d_overrides_in_sorted_order() {
    let t = scratch(&[
        ("master", "mmap_key_size: 101\nmmap_key_id_size: 32\n"),
        ("master.d/b.conf", "mmap_key_size: 303\n"),
        (
            "master.d/a.conf",
            "mmap_key_size: 202\nmmap_key_slot_size: 64\n",
        ),
        ("master.d/c.conf.bak", "mmap_key_size: 999\n"),
        ("master.d/.hidden.conf", "mmap_key_size: 998\n"),
    ]);
    let c = load_dir(t.path()).unwrap();
    let d = t.path();
    assert_eq!(
        c.files,
        vec![
            d.join("master"),
            d.join("master.d/a.conf"),
            d.join("master.d/b.conf")
        ]
    );
    assert_eq!(c.params().size, 303);
    assert_eq!(c.params().slot_size, 64);
    assert_eq!(c.params().id_size, 32);
    assert_eq!(from_file(&c.mmap_key_size), (d.join("master.d/b.conf"), 1));
    // A null in a later file unsets an earlier value (dict.update).
    let t = scratch(&[
        ("master", "cluster_id: c1\ncluster_pki_dir: /srv/c\n"),
        ("master.d/x.conf", "cluster_id: null\n"),
    ]);
    let c = load_dir(t.path()).unwrap();
    assert!(!c.clustered);
    assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
}

#[test]
fn master_config_default_include_can_be_changed_by_the_main_file_only() {
    let t = scratch(&[
        ("master", "default_include: conf.d/*.yml\n"),
        (
            "conf.d/x.yml",
            "mmap_key_size: 11\ndefault_include: other/*\n",
        ),
        ("other/y", "mmap_key_size: 12\n"),
        ("master.d/z.conf", "mmap_key_size: 13\n"),
    ]);
    let c = load_dir(t.path()).unwrap();
    assert_eq!(c.params().size, 11);
    assert_eq!(c.files.len(), 2);
    // Empty: no default include at all.
    let t = scratch(&[
        ("master", "default_include: ''\n"),
        ("master.d/z.conf", "mmap_key_size: 13\n"),
    ]);
    assert_eq!(load_dir(t.path()).unwrap().files.len(), 1);
}

#[test]
fn master_config_include_globs_relative_paths_and_precedence() {
    let t = scratch(&[
        (
            "master",
            "mmap_key_size: 1\ninclude:\n  - extra/*.yaml\n  - /ABS/abs.conf\n",
        ),
        (
            "master.d/a.conf",
            "mmap_key_size: 2\nmmap_key_slot_size: 200\n",
        ),
        ("extra/2.yaml", "mmap_key_size: 4\n"),
        ("extra/1.yaml", "mmap_key_size: 3\nmmap_key_id_size: 100\n"),
        ("abs/abs.conf", "mmap_key_slot_size: 300\n"),
    ]);
    let master = std::fs::read_to_string(t.path().join("master")).unwrap();
    let abs = t.path().join("abs/abs.conf");
    std::fs::write(
        t.path().join("master"),
        master.replace("/ABS/abs.conf", abs.to_str().unwrap()),
    )
    .unwrap();
    let c = load_dir(t.path()).unwrap();
    let d = t.path();
    // main, then default_include (master.d), then include, each overriding.
    assert_eq!(
        c.files,
        vec![
            d.join("master"),
            d.join("master.d/a.conf"),
            d.join("extra/1.yaml"),
            d.join("extra/2.yaml"),
            abs.clone(),
        ]
    );
    assert_eq!(c.params().size, 4);
    assert_eq!(c.params().slot_size, 300);
    assert_eq!(c.params().id_size, 100);
    // A string include, and the include option of an included file:
    // relative to that file, loaded after it and overriding it.
    let t = scratch(&[
        ("master", "include: sub/main.conf\nmmap_key_size: 1\n"),
        (
            "sub/main.conf",
            "include: nested/*.conf\nmmap_key_size: 5\nmmap_key_id_size: 50\n",
        ),
        ("sub/nested/n.conf", "mmap_key_id_size: 51\n"),
    ]);
    let c = load_dir(t.path()).unwrap();
    let d = t.path();
    assert_eq!(
        c.files,
        vec![
            d.join("master"),
            d.join("sub/main.conf"),
            d.join("sub/nested/n.conf"),
        ]
    );
    assert_eq!(c.params().size, 5);
    assert_eq!(c.params().id_size, 51);
}

#[test]
fn master_config_missing_include_is_a_note_not_an_error() {
    let t = scratch(&[(
        "master",
        "include:\n  - nothing/*.conf\n  - absent.conf\nmmap_key_size: 7\n",
    )]);
    let c = load_dir(t.path()).unwrap();
    assert_eq!(c.params().size, 7);
    assert_eq!(c.files.len(), 1);
    let notes = c.notes.join("\n");
    assert!(notes.contains("nothing/*.conf: matches no file"), "{notes}");
    assert!(notes.contains("absent.conf: matches no file"), "{notes}");
    // A missing master.d is silent, as in Salt (verbose=False).
    assert!(!notes.contains("master.d"), "{notes}");
}

#[test]
fn master_config_relative_cluster_pki_dir_is_the_working_directorys_and_noted() {
    let t = scratch(&[("master", "cluster_id: c\ncluster_pki_dir: rel/c\n")]);
    let c = load_dir(t.path()).unwrap();
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
fn master_config_include_of_the_main_file_is_no_cycle() {
    let t = scratch(&[
        ("master", "mmap_key_size: 101\n"),
        (
            "master.d/a.conf",
            "include: ../master\nmmap_key_size: 202\n",
        ),
    ]);
    let c = load_dir(t.path()).unwrap();
    assert_eq!(c.params().size, 101);
    assert_eq!(c.files.len(), 3, "{:?}", c.files);
    // Through the main file's own include, it is one.
    let t = scratch(&[
        ("master", "include: master.d/a.conf\n"),
        ("master.d/a.conf", "include: ../master\n"),
    ]);
    let e = load_dir(t.path()).unwrap_err();
    assert!(matches!(e, ConfigError::Cycle { .. }), "{e}");
}

#[test]
fn master_config_include_cycle_is_an_error() {
    let t = scratch(&[
        ("master", "include: a.conf\n"),
        ("a.conf", "include: b.conf\n"),
        ("b.conf", "include: a.conf\n"),
    ]);
    let e = load_dir(t.path()).unwrap_err();
    assert!(matches!(e, ConfigError::Cycle { .. }), "{e}");
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
        let t = scratch(&[("master", &text)]);
        let c = load_dir(t.path()).unwrap();
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

#[test]
fn master_config_bad_yaml_names_file_line_and_column() {
    let dir = fixture("bad_yaml");
    let e = load_dir(&dir).unwrap_err();
    let ConfigError::Syntax { file, line, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(file, &dir.join("master.d/broken.conf"));
    assert!((2..=3).contains(line), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("broken.conf:"), "{msg}");
    assert!(msg.contains("not valid YAML"), "{msg}");
    // In the main file, with its line and column.
    let t = scratch(&[("master", "pki_dir: /x\n  bad: indent\n")]);
    let e = load_dir(t.path()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "master config {}:2:",
            t.path().join("master").display()
        )),
        "{msg}"
    );
    // Tabs, an unclosed quote, a duplicate key (Salt's loader refuses it).
    for (text, line) in [
        ("a: 1\n\tb: 2\n", 1),
        ("a: 'open\n", 1),
        ("mmap_key_size: 1\nmmap_key_size: 2\n", 2),
    ] {
        let t = scratch(&[("master", text)]);
        match load_dir(t.path()).unwrap_err() {
            ConfigError::Syntax { line: l, .. } => assert!(l >= line, "{text:?}: line {l}"),
            e => panic!("{text:?}: {e}"),
        }
    }
}

#[test]
fn master_config_non_mapping_documents() {
    // Salt's `safe_load(...) or {}`: these are an empty config.
    for text in [
        "",
        "# nothing\n",
        "---\n",
        "null\n",
        "false\n",
        "0\n",
        "[]\n",
        "''\n",
    ] {
        let t = scratch(&[("master", text)]);
        let c = load_dir(t.path()).unwrap();
        assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR), "{text:?}");
    }
    for text in ["just a string\n", "- a\n- b\n", "42\n"] {
        let t = scratch(&[("master", text)]);
        let e = load_dir(t.path()).unwrap_err();
        assert!(
            matches!(e, ConfigError::NotAMapping { .. }),
            "{text:?}: {e}"
        );
        assert!(e.to_string().contains("needs a mapping"), "{e}");
    }
    let t = scratch(&[("master", "a: 1\n---\nb: 2\n")]);
    assert!(matches!(
        load_dir(t.path()).unwrap_err(),
        ConfigError::Syntax { line: 2, .. }
    ));
}

#[test]
fn master_config_wrong_types_name_file_key_and_what_was_expected() {
    let cases = [
        (
            "mmap_key_size: big\n",
            "mmap_key_size",
            "a non-negative integer",
            "the string \"big\"",
        ),
        (
            "mmap_key_size: '10007'\n",
            "mmap_key_size",
            "a non-negative integer",
            "the string \"10007\"",
        ),
        (
            "mmap_key_size: 1.5e+6\n",
            "mmap_key_size",
            "a non-negative integer",
            "the float",
        ),
        (
            "mmap_key_slot_size: -96\n",
            "mmap_key_slot_size",
            "a non-negative integer",
            "-96",
        ),
        (
            "mmap_key_id_size: on\n",
            "mmap_key_id_size",
            "a non-negative integer",
            "boolean true",
        ),
        (
            "mmap_key_max_segment_bytes:\n",
            "mmap_key_max_segment_bytes",
            "a non-negative integer",
            "null",
        ),
        ("pki_dir: [a, b]\n", "pki_dir", "a string", "a list"),
        ("pki_dir:\n", "pki_dir", "a string", "null"),
        ("root_dir: 1\n", "root_dir", "a string", "the integer 1"),
        (
            "cluster_pki_dir: {a: 1}\n",
            "cluster_pki_dir",
            "a string or null",
            "a mapping",
        ),
        ("cluster_id: yes\n", "cluster_id", "a string", "boolean"),
        (
            "keys.cache_driver: 1\n",
            "keys.cache_driver",
            "a string or null",
            "integer",
        ),
        ("user: [salt]\n", "user", "a string", "a list"),
        (
            "include: 5\n",
            "include",
            "a string or a list of strings (glob patterns)",
            "integer",
        ),
        (
            "include: [a, 5]\n",
            "include",
            "a string or a list of strings (glob patterns)",
            "integer",
        ),
    ];
    for (text, key, expected, found) in cases {
        let t = scratch(&[("master.d/x.conf", &format!("# c\n{text}"))]);
        // A master file is absent, so -c errors: use the default-style source.
        let src = Source {
            required: false,
            ..Source::config_dir(t.path())
        };
        let e = MasterConfig::load(&src).unwrap_err();
        let ConfigError::Type {
            file,
            line,
            key: k,
            expected: x,
            found: f,
        } = &e
        else {
            panic!("{text:?}: {e}")
        };
        assert_eq!(file, &t.path().join("master.d/x.conf"), "{text:?}");
        assert_eq!(*line, 2, "{text:?}");
        assert_eq!(k, key, "{text:?}");
        assert_eq!(*x, expected, "{text:?}");
        assert!(f.contains(found), "{text:?}: {f}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("x.conf:2: {key}: expected {expected}")),
            "{msg}"
        );
    }
}

#[test]
fn master_config_integers_as_salt_reads_them() {
    for (text, want) in [
        ("1_000_003", 1_000_003),
        ("0x2717", 10007),
        ("010007", 10007), // Salt: decimal, not octal
        ("2:46:47", 10007),
    ] {
        let t = scratch(&[("master", &format!("mmap_key_size: {text}\n"))]);
        assert_eq!(load_dir(t.path()).unwrap().params().size, want, "{text}");
    }
    // mmap_cache_max_segment_bytes is the fallback of mmap_key_max_segment_bytes.
    let t = scratch(&[("master", "mmap_cache_max_segment_bytes: 4096\n")]);
    let c = load_dir(t.path()).unwrap();
    assert_eq!(c.params().max_segment_bytes, 4096);
    assert!(
        c.describe().contains("mmap_cache_max_segment_bytes"),
        "{}",
        c.describe()
    );
    let t = scratch(&[(
        "master",
        "mmap_cache_max_segment_bytes: 4096\nmmap_key_max_segment_bytes: 8192\n",
    )]);
    assert_eq!(load_dir(t.path()).unwrap().params().max_segment_bytes, 8192);
}

#[test]
fn master_config_missing_files() {
    // Explicit -c or --master-config: an error naming the file.
    let t = tempfile::tempdir().unwrap();
    let e = load_dir(t.path()).unwrap_err();
    assert_eq!(
        e,
        ConfigError::Missing {
            file: t.path().join("master"),
            how: "-c/--config-dir"
        }
    );
    assert!(e.to_string().contains("no such file"), "{e}");
    let e = MasterConfig::load(&Source::file(&t.path().join("m.yaml"))).unwrap_err();
    assert!(
        e.to_string()
            .contains("m.yaml (--master-config): no such file"),
        "{e}"
    );
    // The default path absent: Salt's defaults, and said so; master.d is
    // still read, as Salt reads it.
    let t = scratch(&[("master.d/x.conf", "mmap_key_size: 5\n")]);
    let src = Source {
        file: t.path().join("master"),
        include_base: t.path().join("master"),
        required: false,
        how: "default",
    };
    let c = MasterConfig::load(&src).unwrap();
    assert!(!c.found);
    assert_eq!(c.params().size, 5);
    assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
    assert_eq!(c.cache_driver(), Some("localfs_key"));
    assert!(!c.uses_mmap_key());
    assert!(c.notes.iter().any(|n| n.contains("Salt's defaults apply")));
    assert!(
        c.describe()
            .contains("absent: Salt's defaults (+ master.d/x.conf)"),
        "{}",
        c.describe()
    );
    // A directory in place of the file is an error.
    let t = scratch(&[("master/x", "")]);
    assert!(matches!(
        load_dir(t.path()).unwrap_err(),
        ConfigError::Io { .. }
    ));
}

#[test]
fn master_config_sources_from_flags_and_environment() {
    let none = |_: &str| None;
    assert_eq!(
        Source::from_flags_env(None, None, &none),
        Source::default_path()
    );
    let s = Source::from_flags_env(Some(Path::new("/x/salt/")), None, &none);
    assert_eq!(s.file, Path::new("/x/salt/master"));
    assert!(s.required);
    let s = Source::from_flags_env(Some(Path::new("/x")), Some(Path::new("/y/m.conf")), &none);
    assert_eq!(s.file, Path::new("/y/m.conf"));
    assert_eq!(s.how, "--master-config");
    let t = scratch(&[("alt/master", "mmap_key_size: 9\n")]);
    let dir = t.path().join("alt");
    let env_dir = |k: &str| (k == "SALT_CONFIG_DIR").then(|| dir.clone().into_os_string());
    let s = Source::from_flags_env(None, None, &env_dir);
    assert_eq!(
        (s.file.clone(), s.how),
        (dir.join("master"), "SALT_CONFIG_DIR")
    );
    // -c wins over SALT_CONFIG_DIR.
    assert_eq!(
        Source::from_flags_env(Some(Path::new("/z")), None, &env_dir).how,
        "-c/--config-dir"
    );
    // SALT_MASTER_CONFIG: read in place of /etc/salt/master when it is a
    // file; includes stay relative to /etc/salt (Salt's master_config).
    let f = dir.join("master");
    let env_file = |k: &str| (k == "SALT_MASTER_CONFIG").then(|| f.clone().into_os_string());
    let s = Source::from_flags_env(None, None, &env_file);
    assert_eq!(s.file, f);
    assert_eq!(s.include_base, Path::new("/etc/salt/master"));
    let env_absent =
        |k: &str| (k == "SALT_MASTER_CONFIG").then(|| OsString::from("/nonexistent/master"));
    assert_eq!(
        Source::from_flags_env(None, None, &env_absent),
        Source::default_path()
    );
}

#[test]
fn master_config_path_helpers_match_python() {
    for (p, want) in [
        ("", "."),
        ("/", "/"),
        ("//a", "//a"),
        ("///a//b/", "/a/b"),
        ("a/../../b", "../b"),
        ("/../a", "/a"),
        ("./a/./b/.", "a/b"),
    ] {
        assert_eq!(normpath(p), want, "{p:?}");
    }
}

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

#[test]
fn master_config_flags_override_the_config() {
    let dir = fixture("cluster");
    let c = load_dir(&dir).unwrap();
    let none = c.choose(&Explicit::default());
    assert_eq!(none.store_dir, c.store_dir());
    assert_eq!(none.layout, c.layout());
    assert_eq!(none.params(), c.params());
    assert!(none.size_is_default());
    let e = Explicit {
        dir: Some("/elsewhere".into()),
        size: Some(10007),
        id_size: Some(32),
        ..Explicit::default()
    };
    let ch = c.choose(&e);
    assert_eq!(ch.store_dir.value, Path::new("/elsewhere"));
    assert_eq!(ch.store_dir.from, Origin::Flag { flag: "DIR".into() });
    assert!(!ch.size_is_default());
    assert_eq!(
        ch.params(),
        Params {
            size: 10007,
            slot_size: 96,
            id_size: 32,
            max_segment_bytes: 268_435_456,
        }
    );
    let text = c.describe_choice(&ch);
    assert!(text.contains("store: /elsewhere (DIR given)\n"), "{text}");
    assert!(
        text.contains("layout: mmap_key_size 10007 (--size), mmap_key_slot_size 96 (default), mmap_key_id_size 32 (--id-size), mmap_key_max_segment_bytes 268435456 (master.d/cluster.conf:6)\n"),
        "{text}"
    );
    let json = serde_json::to_value(&ch).unwrap();
    assert_eq!(json["store_dir"]["from"]["kind"], "flag");
    assert_eq!(json["layout"]["size"]["from"]["flag"], "--size");
    assert_eq!(json["layout"]["max_segment_bytes"]["from"]["kind"], "file");
}

/// An included FIFO (or device) is refused, not read: reading one would
/// block for ever.
#[test]
fn an_included_fifo_is_refused_not_read() {
    let t = scratch(&[("master", "include: pipe.conf\n")]);
    let fifo = t.path().join("pipe.conf");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
    let e = MasterConfig::load(&Source::config_dir(t.path())).expect_err("refused");
    assert!(e.to_string().contains("not a regular file"), "{e}");
}
