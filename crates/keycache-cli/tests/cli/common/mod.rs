//! The test kit's helpers (`keycache_testkit::common` and the command
//! builder of `keycache_testkit::cmd`), plus what needs this crate's
//! `keycache` binary.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::process::Output;

pub use keycache_testkit::cmd::{check_fails, check_ok, parse_json, stderr, stdout, TestCommand};
pub use keycache_testkit::common::*;
pub use keycache_testkit::crash::env_u64;
use keycache_testkit::crash::Cli;
pub use keycache_testkit::peers::*;
use serde_json::Value;

pub mod etcd;
pub mod salt_master;
pub mod validate_token;

/// The keycache binary of this crate.
pub const BIN: &str = env!("CARGO_BIN_EXE_keycache");

/// The keycache binary, to be given its arguments and run
/// ([`TestCommand`]: `kc().args([..]).layout(&p).ok()`).
pub fn kc() -> TestCommand {
    TestCommand::new(BIN)
}

/// The keycache binary of this crate, for the test kit's crash checks.
pub fn cli() -> Cli {
    Cli::new(BIN)
}

/// The sample `localfs_key` tree of the repository (`tools/sample-pki`).
pub fn sample_pki() -> PathBuf {
    repo().join("tools/sample-pki")
}

/// `keycache export STORE --to TREE --size 1009`, to be given more
/// arguments and run.
pub fn export(store: &Path, tree: &Path) -> TestCommand {
    let mut c = kc();
    c.args(["export", s(store), "--to", s(tree)])
        .args(SIZE_1009);
    c
}

/// A generated `localfs_key` tree at `pki` (`tools/gen-pki-tree.py PKI
/// ARGS`).
pub fn gen_pki_tree(pki: &Path, args: &[&str]) {
    TestCommand::new(python())
        .arg(repo().join("tools/gen-pki-tree.py"))
        .arg(pki)
        .args(args)
        .ok();
}

/// The sample tree migrated into `dir` (table size 1009).
pub fn sample_store(dir: &Path) {
    keycache_ok(&[
        "migrate",
        s(&sample_pki()),
        "--out",
        s(dir),
        "--size",
        "1009",
    ]);
}

/// A new temporary directory with the [`sample_store`] in its `store/`.
pub fn sample_store_dir() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    sample_store(&st);
    (t, st)
}

/// A path as a `&str` argument (the tests' paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// The layout flag of the stores of the tree, merge and config tests:
/// Salt's default layout but 1009 slots (`sized(1009)`).
pub const SIZE_1009: [&str; 2] = ["--size", "1009"];

/// [`SIZE_1009`] as owned strings, for the test kit's helpers.
pub fn size_1009() -> Vec<String> {
    SIZE_1009.iter().map(|a| a.to_string()).collect()
}

/// Runs the keycache binary with `args` then [`SIZE_1009`]; its output,
/// whatever its status.
pub fn keycache_1009(args: &[&str]) -> Output {
    kc().args(args).args(SIZE_1009).output()
}

/// Runs the keycache binary; its output, whatever its status.
pub fn keycache(args: &[&str]) -> Output {
    kc().args(args).output()
}

/// Runs the keycache binary and parses its stdout as JSON (whatever its
/// status: the output is returned for the test to check).
pub fn keycache_json(args: &[&str]) -> (Output, Value) {
    let mut c = kc();
    let out = c.args(args).output();
    let v = parse_json(&c.line(), &out);
    (out, v)
}

/// Runs the keycache binary, which must succeed (else a panic with the
/// command line, its status, stdout and stderr); its output.
pub fn keycache_ok(args: &[&str]) -> Output {
    kc().args(args).ok_output()
}

/// Runs the keycache binary, which must succeed; its stdout and stderr.
pub fn keycache_ok_texts(args: &[&str]) -> (String, String) {
    let o = keycache_ok(args);
    (stdout(&o), stderr(&o))
}

/// Runs the keycache binary, which must succeed; its stdout as JSON.
pub fn keycache_ok_json(args: &[&str]) -> Value {
    kc().args(args).json()
}

/// Runs the keycache binary, which must exit with `code`; its stderr.
pub fn keycache_fails(args: &[&str], code: i32) -> String {
    kc().args(args).fails(code)
}

/// Runs the keycache binary, which must exit with `code`; its output.
pub fn keycache_exits(args: &[&str], code: i32) -> Output {
    kc().args(args).fails_output(code)
}

/// Runs the keycache binary, which must exit with `code`; its stdout as
/// JSON.
pub fn keycache_json_exits(args: &[&str], code: i32) -> Value {
    let mut c = kc();
    let out = c.args(args).fails_output(code);
    parse_json(&c.line(), &out)
}

/// What each finding of a `keycache verify --json` report says
/// (`findings[].finding.what`), in report order.
pub fn finding_whats(report: &Value) -> Vec<&str> {
    report["findings"]
        .as_array()
        .expect("a findings list")
        .iter()
        .map(|f| f["finding"]["what"].as_str().expect("a finding"))
        .collect()
}

/// The strings of the JSON array `v` (each must be one).
pub fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_str().expect("a string"))
        .collect()
}

/// The skipped entries of a `keycache migrate --json` report, as (file
/// name, reason) pairs in report order.
pub fn skipped_reasons(report: &Value) -> Vec<(String, String)> {
    report["skipped"]
        .as_array()
        .expect("a skipped list")
        .iter()
        .map(|s| {
            let path = Path::new(s["path"].as_str().expect("a path"));
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
    check_ok("keycache", o);
    stdout(o)
}

/// The files of the key tree of `dir`, as `minions/ID` and so on (dot-files,
/// keycache's temporaries among them, left out).
pub fn tree_files(dir: &Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for sub in keycache::tree::TreeDir::NAMES {
        let Ok(rd) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for e in rd {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') {
                out.insert(format!("{sub}/{name}"));
            }
        }
    }
    out
}

/// A config directory `T/etc` whose `master` holds `extra` lines and names
/// `T/pki` as pki_dir, with a store of 1009 slots and `mmap_key` as the
/// key cache; and that store in `T/pki`, holding `ids` pending, each with
/// the key `key(id)`.
pub fn configured_store(
    t: &Path,
    extra: &str,
    ids: &[&str],
    key: impl Fn(&str) -> String,
) -> (PathBuf, PathBuf, keycache::Store) {
    let etc = t.join("etc");
    let pki = t.join("pki");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::write(
        etc.join("master"),
        format!(
            "{extra}pki_dir: {}\nmmap_key_size: 1009\nkeys.cache_driver: mmap_key\n",
            pki.display()
        ),
    )
    .unwrap();
    let st = open(&pki, &sized(1009));
    for i in ids {
        let id = keycache::MinionId::new(*i).unwrap();
        st.put(&id, keycache::KeyState::Pending, key(i).as_bytes())
            .unwrap();
    }
    (etc, pki, st)
}
