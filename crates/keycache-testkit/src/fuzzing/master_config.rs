//! Fuzz body: the Salt master config reader (`keycache -c DIR`) on
//! arbitrary configs: a `master` file, files under `master.d/`, and files
//! that `include` may name, their text from the input.
//!
//! Properties: reading never panics and never loops (include cycles are
//! refused); reading twice gives the same answer; an error names a file;
//! a config read gives an absolute store directory and origins that name
//! an absolute file (or Salt's default).

use keycache_config::{ConfigError, MasterConfig, Origin, Source};

/// The file names the input's parts are written to, in order.
const NAMES: [&str; 5] = [
    "master",
    "master.d/a.conf",
    "master.d/b.conf",
    "extra.conf",
    "sub/inc.conf",
];

/// The fuzz body.
pub fn master_config(data: &[u8]) {
    let dir = crate::scratch::fuzz_dir("master-config");
    let d = dir.path();
    std::fs::create_dir_all(d.join("master.d")).expect("mkdir");
    std::fs::create_dir_all(d.join("sub")).expect("mkdir");
    // Parts separated by NUL bytes; text as it comes (invalid UTF-8 too).
    for (name, part) in NAMES.iter().zip(data.split(|&b| b == 0)) {
        std::fs::write(d.join(name), part).expect("write");
    }
    let source = Source::config_dir(d);
    let first = MasterConfig::load(&source);
    let again = MasterConfig::load(&source);
    assert_eq!(first, again, "two reads of one config differ");
    match first {
        Err(e) => check_error(&e),
        Ok(c) => {
            let store = c.store_dir();
            assert!(
                store.value.is_absolute(),
                "a relative store dir {:?}",
                store.value
            );
            check_origin(&store.from);
            let l = c.layout();
            for o in [
                &l.size.from,
                &l.slot_size.from,
                &l.id_size.from,
                &l.max_segment_bytes.from,
            ] {
                check_origin(o);
            }
        }
    }
}

fn check_error(e: &ConfigError) {
    let s = e.to_string();
    assert!(s.contains('/'), "the error names no file: {s}");
}

fn check_origin(o: &Origin) {
    if let Origin::File { file, line, .. } = o {
        assert!(
            file.is_absolute() && *line >= 1,
            "an origin {file:?} line {line}"
        );
    }
}
