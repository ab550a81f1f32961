//! Random operation sequences on tiny tables checked against a model after every
//! step, through two handles (keycache::fuzzing::ops_model).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keycache::fuzzing::ops_model(data);
});
