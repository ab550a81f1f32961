//! The migrator on arbitrary localfs_key trees: odd names, sizes, symlinks,
//! directories, sockets (keycache::fuzzing::migrate_tree).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keycache::fuzzing::migrate_tree(data);
});
