//! Where the config comes from (flags, environment) and what flags
//! override; the path helpers against Python's.

use std::path::Path;

use super::*;
use crate::paths::normpath;

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
