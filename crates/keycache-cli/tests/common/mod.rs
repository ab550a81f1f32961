//! The test kit's helpers, plus the `keycache` binary of this crate.
#![allow(dead_code, unused_imports)]

use std::process::{Command, Output};

pub use keycache_testkit::common::*;
use keycache_testkit::crash::Cli;
use serde_json::Value;

pub mod salt_master;

/// The keycache binary of this crate, for the test kit's crash checks.
pub fn cli() -> Cli {
    Cli::new(env!("CARGO_BIN_EXE_keycache"))
}

/// Runs the keycache binary.
pub fn keycache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keycache"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run keycache")
}

/// Runs the keycache binary and parses its stdout as JSON.
pub fn keycache_json(args: &[&str]) -> (Output, Value) {
    let out = keycache(args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "keycache {args:?}: stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, v)
}

/// The skipped entries of a `keycache migrate --json` report, as (file
/// name, reason) pairs in report order.
pub fn skipped_reasons(report: &Value) -> Vec<(String, String)> {
    report["skipped"]
        .as_array()
        .expect("a skipped list")
        .iter()
        .map(|s| {
            let path = std::path::Path::new(s["path"].as_str().expect("a path"));
            let name = path.file_name().expect("a file name").to_string_lossy();
            (
                name.into_owned(),
                s["reason"].as_str().expect("a reason").to_owned(),
            )
        })
        .collect()
}

/// The stdout of a keycache run that must have succeeded (panics with its
/// status and output otherwise).
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "keycache failed ({:?}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
