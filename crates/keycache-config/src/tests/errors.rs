//! Configs Salt refuses or reads oddly: bad YAML, documents that are not
//! mappings, wrong types, integers as Salt reads them, missing files.

use std::path::Path;

use super::*;

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
        let (_t, c) = loaded(&[("master", text)]);
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
    let (_t, c) = loaded(&[("master", "mmap_cache_max_segment_bytes: 4096\n")]);
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

/// `keycache_tree` as the driver reads it: YAML booleans (1.1's `yes`/`off`
/// too) and integers by their truth, null as false, the string `accepted`;
/// another string is refused naming the file, the line and the option.
#[test]
fn keycache_tree_takes_a_truth_or_accepted() {
    use keycache::tree::TreeSync;
    let (_t, c) = loaded(&[("master", "pki_dir: /p\n")]);
    assert_eq!(c.tree(), None);
    for (text, want) in [
        ("true", TreeSync::On),
        ("yes", TreeSync::On),
        ("1", TreeSync::On),
        ("false", TreeSync::Off),
        ("off", TreeSync::Off),
        ("0", TreeSync::Off),
        ("null", TreeSync::Off),
        ("accepted", TreeSync::Accepted),
        ("'accepted'", TreeSync::Accepted),
    ] {
        let (_t, c) = loaded(&[("master", &format!("keycache_tree: {text}\n"))]);
        assert_eq!(c.tree(), Some(want), "{text}");
    }
    for text in ["'false'", "Accepted", "minions", "[accepted]"] {
        let t = scratch(&[("master", &format!("pki_dir: /p\nkeycache_tree: {text}\n"))]);
        let e = load_dir(t.path()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("keycache_tree") && msg.contains("master") && msg.contains(":2"),
            "{text}: {msg}"
        );
    }
}
