//! A store made of arbitrary bytes: opened, read, listed, verified, repaired and
//! compacted, every answer checked against a reference reader (keycache_testkit::fuzzing::store_bytes).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keycache_testkit::fuzzing::store_bytes(data);
});
