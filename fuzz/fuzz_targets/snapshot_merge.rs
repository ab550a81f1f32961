//! Untrusted snapshot bytes read and planned as `keycache merge --dry-run`
//! does (keycache_testkit::fuzzing::snapshot_merge).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keycache_testkit::fuzzing::snapshot_merge(data);
});
