//! The migrator on arbitrary localfs_key trees: odd names, sizes, symlinks,
//! directories, sockets (keycache_testkit::fuzzing::migrate_tree).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keycache_testkit::fuzzing::migrate_tree(data);
});
