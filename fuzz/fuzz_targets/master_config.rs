//! The Salt master config reader on arbitrary configs
//! (keycache_testkit::fuzzing::master_config).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keycache_testkit::fuzzing::master_config(data);
});
