//! Random operation sequences on tiny tables checked against a model after every
//! step, through two handles (keycache_testkit::fuzzing::ops_model).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keycache_testkit::fuzzing::ops_model(data);
});
