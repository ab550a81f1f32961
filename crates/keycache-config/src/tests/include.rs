//! `master.d/` and `include`: order and precedence, globs, relative paths,
//! missing files, cycles, files that are not regular.

use std::path::Path;

use super::*;

#[test]
fn master_config_master_d_overrides_in_sorted_order() {
    let (t, c) = loaded(&[
        ("master", "mmap_key_size: 101\nmmap_key_id_size: 32\n"),
        ("master.d/b.conf", "mmap_key_size: 303\n"),
        (
            "master.d/a.conf",
            "mmap_key_size: 202\nmmap_key_slot_size: 64\n",
        ),
        ("master.d/c.conf.bak", "mmap_key_size: 999\n"),
        ("master.d/.hidden.conf", "mmap_key_size: 998\n"),
    ]);
    let d = t.path();
    assert_files(&c, d, &["master", "master.d/a.conf", "master.d/b.conf"]);
    assert_eq!(c.params().size, 303);
    assert_eq!(c.params().slot_size, 64);
    assert_eq!(c.params().id_size, 32);
    assert_eq!(from_file(&c.mmap_key_size), (d.join("master.d/b.conf"), 1));
    // A null in a later file unsets an earlier value (dict.update).
    let (_t, c) = loaded(&[
        ("master", "cluster_id: c1\ncluster_pki_dir: /srv/c\n"),
        ("master.d/x.conf", "cluster_id: null\n"),
    ]);
    assert!(!c.clustered);
    assert_eq!(c.store_dir().value, Path::new(DEFAULT_PKI_DIR));
}

#[test]
fn master_config_default_include_can_be_changed_by_the_main_file_only() {
    let (_t, c) = loaded(&[
        ("master", "default_include: conf.d/*.yml\n"),
        (
            "conf.d/x.yml",
            "mmap_key_size: 11\ndefault_include: other/*\n",
        ),
        ("other/y", "mmap_key_size: 12\n"),
        ("master.d/z.conf", "mmap_key_size: 13\n"),
    ]);
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
    assert_files(
        &c,
        d,
        &[
            "master",
            "master.d/a.conf",
            "extra/1.yaml",
            "extra/2.yaml",
            "abs/abs.conf",
        ],
    );
    assert_eq!(c.params().size, 4);
    assert_eq!(c.params().slot_size, 300);
    assert_eq!(c.params().id_size, 100);
    // A string include, and the include option of an included file:
    // relative to that file, loaded after it and overriding it.
    let (t, c) = loaded(&[
        ("master", "include: sub/main.conf\nmmap_key_size: 1\n"),
        (
            "sub/main.conf",
            "include: nested/*.conf\nmmap_key_size: 5\nmmap_key_id_size: 50\n",
        ),
        ("sub/nested/n.conf", "mmap_key_id_size: 51\n"),
    ]);
    let d = t.path();
    assert_files(&c, d, &["master", "sub/main.conf", "sub/nested/n.conf"]);
    assert_eq!(c.params().size, 5);
    assert_eq!(c.params().id_size, 51);
}

#[test]
fn master_config_missing_include_is_a_note_not_an_error() {
    let (_t, c) = loaded(&[(
        "master",
        "include:\n  - nothing/*.conf\n  - absent.conf\nmmap_key_size: 7\n",
    )]);
    assert_eq!(c.params().size, 7);
    assert_eq!(c.files.len(), 1);
    let notes = c.notes.join("\n");
    assert!(notes.contains("nothing/*.conf: matches no file"), "{notes}");
    assert!(notes.contains("absent.conf: matches no file"), "{notes}");
    // A missing master.d is silent, as in Salt (verbose=False).
    assert!(!notes.contains("master.d"), "{notes}");
}

#[test]
fn master_config_include_of_the_main_file_is_no_cycle() {
    let (_t, c) = loaded(&[
        ("master", "mmap_key_size: 101\n"),
        (
            "master.d/a.conf",
            "include: ../master\nmmap_key_size: 202\n",
        ),
    ]);
    assert_eq!(c.params().size, 101);
    assert_eq!(c.files.len(), 3, "{:?}", c.files);
    // Through the main file's own include, it is one.
    assert_cycle(&[
        ("master", "include: master.d/a.conf\n"),
        ("master.d/a.conf", "include: ../master\n"),
    ]);
}

#[test]
fn master_config_include_cycle_is_an_error() {
    assert_cycle(&[
        ("master", "include: a.conf\n"),
        ("a.conf", "include: b.conf\n"),
        ("b.conf", "include: a.conf\n"),
    ]);
}

/// The config dir of `files` is refused as an include cycle.
fn assert_cycle(files: &[(&str, &str)]) {
    let t = scratch(files);
    let e = load_dir(t.path()).unwrap_err();
    assert!(matches!(e, ConfigError::Cycle { .. }), "{e}");
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

/// `c` was read from exactly `names` (below `dir`), in that order.
fn assert_files(c: &MasterConfig, dir: &Path, names: &[&str]) {
    let want: Vec<_> = names.iter().map(|n| dir.join(n)).collect();
    assert_eq!(c.files, want);
}
