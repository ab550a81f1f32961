//! The warning about `keys.cache_driver`: a master config whose driver does
//! not read the banks gets one (`localfs_key`, the default, or any other);
//! `mmap_key` and `keycache` (the driver of `saltext.keycache`, which reads
//! and writes the same banks) do not.

use crate::common::{keycache, stderr};

const WARNING: &str = "does not read these banks";

/// Runs `keycache list -c CONF` on a master config with `driver` (none:
/// the option left out); returns stderr.
fn list_with(driver: Option<&str>) -> String {
    let t = tempfile::tempdir().unwrap();
    let pki = t.path().join("pki");
    let conf = t.path().join("etc");
    std::fs::create_dir(&pki).unwrap();
    std::fs::create_dir(&conf).unwrap();
    let mut text = format!("pki_dir: {}\nmmap_key_size: 1009\n", pki.display());
    if let Some(d) = driver {
        text.push_str(&format!("keys.cache_driver: {d}\n"));
    }
    std::fs::write(conf.join("master"), text).unwrap();
    let o = keycache(&["list", "-c", conf.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(o.status.success(), "{driver:?}: {err}");
    err
}

#[test]
fn only_drivers_that_do_not_read_the_banks_are_warned_about() {
    for driver in ["keycache", "mmap_key"] {
        let err = list_with(Some(driver));
        assert!(!err.contains("warning"), "{driver}: {err}");
        assert!(
            err.contains("pki"),
            "{driver}: the choice is still said: {err}"
        );
    }
    for (driver, named) in [
        (Some("localfs_key"), "localfs_key"),
        (None, "localfs_key"),
        (Some("redis"), "redis"),
    ] {
        let err = list_with(driver);
        assert!(
            err.contains(WARNING) && err.contains(&format!("keys.cache_driver is {named}")),
            "{driver:?}: {err}"
        );
    }
}
