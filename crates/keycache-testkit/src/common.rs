//! Helpers shared by the integration tests: the real Salt 3008.5 driver,
//! layouts ([`Params`] with [`ParamsExt`]), the `localfs_key` tree's
//! folders, PEM-like values and dumps of a store by Salt and by keycache.
//! (The CLI tests' command builder is [`crate::cmd::TestCommand`].)
//! (The seeded PRNG is [`crate::rng::Rng`], re-exported here.)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub use keycache::{OpenOptions, Params};

use serde_json::Value;

pub use crate::rng::Rng;

/// The repository (workspace) root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory of `salt_driver.py`, the real Salt 3008.5 driver.
pub fn py_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("py")
}

/// The venv python with salt==3008.5, as `tools/setup-venv.sh` installs it.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KEYCACHE_PYTHON") {
        return PathBuf::from(p);
    }
    let p = repo().join(".venv/bin/python");
    assert!(
        p.exists(),
        "no Python with Salt 3008.5: run the test command of README.md (tools/test.sh), \
         which installs it with tools/setup-venv.sh, or set KEYCACHE_PYTHON"
    );
    p
}

/// The four folders of Salt's `localfs_key` tree, in Salt's order:
/// accepted, pending, rejected, denied (the library's [`TreeDir`] names).
///
/// [`TreeDir`]: keycache::tree::TreeDir
pub const TREE_DIRS: [&str; 4] = keycache::tree::TreeDir::NAMES;

/// The layout flags the CLI and the Salt driver take, and the open options
/// of the tests, for a [`Params`] (the layout of a table: the tests' one
/// layout type).
pub trait ParamsExt {
    /// `--size N --max-segment-bytes N --id-size N --slot-size N`.
    fn args(&self) -> Vec<String>;
    /// Open options of this layout: no refresh interval, the library's
    /// default tunables.
    fn options(&self) -> OpenOptions;
    /// [`ParamsExt::options`] with the given read retry time and rebuild
    /// settle time (zero: damaged stores read at full speed, rebuilds that
    /// no Salt writer shares do not wait).
    fn options_with(&self, read_retry: Duration, rebuild_settle: Duration) -> OpenOptions;
}

impl ParamsExt for Params {
    fn args(&self) -> Vec<String> {
        vec![
            "--size".into(),
            self.size.to_string(),
            "--max-segment-bytes".into(),
            self.max_segment_bytes.to_string(),
            "--id-size".into(),
            self.id_size.to_string(),
            "--slot-size".into(),
            self.slot_size.to_string(),
        ]
    }

    fn options(&self) -> OpenOptions {
        OpenOptions {
            params: *self,
            refresh: Duration::from_millis(0),
            ..OpenOptions::default()
        }
    }

    fn options_with(&self, read_retry: Duration, rebuild_settle: Duration) -> OpenOptions {
        OpenOptions {
            read_retry,
            rebuild_settle,
            ..self.options()
        }
    }
}

/// Open options of `size` slots and heap segments of at most
/// `max_segment_bytes` (the default ids and slots), refreshed every
/// `refresh_ms`, with no ownership to keep.
pub fn refreshed_every(size: u64, max_segment_bytes: u64, refresh_ms: u64) -> OpenOptions {
    OpenOptions {
        params: Params {
            size,
            max_segment_bytes,
            ..Params::default()
        },
        refresh: Duration::from_millis(refresh_ms),
        ownership: None,
        ..OpenOptions::default()
    }
}

/// A layout as the Python scripts of `py/` take it: size, slot size, id
/// size and largest heap segment, as positional arguments.
fn script_layout(layout: &Params) -> [String; 4] {
    [
        layout.size,
        layout.slot_size as u64,
        layout.id_size as u64,
        layout.max_segment_bytes,
    ]
    .map(|n| n.to_string())
}

/// A layout of `size` slots and heap segments of at most `seg` bytes, with
/// 64-byte ids in 96-byte slots (small stores that roll segments soon).
pub fn small(size: u64, seg: u64) -> Params {
    Params {
        size,
        max_segment_bytes: seg,
        id_size: 64,
        slot_size: 96,
    }
}

/// Salt's default layout but for `size` slots.
pub fn sized(size: u64) -> Params {
    Params {
        size,
        ..Params::default()
    }
}

/// The store of `dir` opened with `layout` ([`ParamsExt::options`]).
pub fn open(dir: &Path, layout: &Params) -> keycache::Store {
    keycache::Store::open_with(dir, &layout.options())
        .unwrap_or_else(|e| panic!("open {}: {e}", dir.display()))
}

/// Runs the Salt driver: `salt_driver.py --dir DIR <layout> ARGS`, feeding
/// `stdin`; panics with its stderr unless it succeeds; returns its JSON.
pub fn salt(dir: &Path, layout: &Params, args: &[&str], stdin: Option<&Value>) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(py_dir().join("salt_driver.py"))
        .arg("--dir")
        .arg(dir)
        .args(layout.args())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start the Salt driver");
    {
        let mut sin = child.stdin.take().expect("stdin");
        if let Some(v) = stdin {
            sin.write_all(v.to_string().as_bytes()).expect("write ops");
        }
    }
    let out = child.wait_with_output().expect("run the Salt driver");
    assert!(
        out.status.success(),
        "salt_driver {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "salt_driver output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A PEM-looking public key of about `len` bytes, unique to `tag`.
pub fn pem(tag: &str, len: usize) -> String {
    let tag: String = tag
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                b as char
            } else {
                '+'
            }
        })
        .collect();
    let mut body = String::new();
    let mut n = 0u64;
    while body.len() < len {
        body.push_str(&format!("{tag}{n:x}"));
        n += 1;
    }
    body.truncate(len.max(1));
    let lines: Vec<String> = body
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        lines.join("\n")
    )
}

/// Salt's own view (`salt_driver.py dump`: `list_all` of both banks) of many
/// store directories with one Python process. Returns, per directory, the
/// dump and the Salt log lines (`salt: LEVEL ...`) it printed on stderr.
pub fn salt_dump_many(dirs: &[PathBuf], layout: &Params) -> Vec<(Value, Vec<String>)> {
    // Salt keeps every bank it opened open: a few dozen stores per process.
    if dirs.len() > 40 {
        return dirs
            .chunks(40)
            .flat_map(|c| salt_dump_many(c, layout))
            .collect();
    }
    if dirs.is_empty() {
        return Vec::new();
    }
    let script = r#"
import argparse, json, sys
sys.path.insert(0, sys.argv[1])
import salt_driver as sd
size, slot, ids, seg = (int(x) for x in sys.argv[2:6])
for line in sys.stdin:
    d = line.rstrip("\n")
    if not d:
        continue
    args = argparse.Namespace(dir=d, size=size, slot_size=slot, id_size=ids, max_segment_bytes=seg)
    sys.stderr.write("@@DIR " + d + "\n")
    sys.stderr.flush()
    try:
        sd.cmd_dump(args)
    except Exception as exc:
        sys.stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        sys.stdout.flush()
"#;
    let mut cmd = Command::new(python());
    cmd.arg("-c")
        .arg(script)
        .arg(py_dir())
        .args(script_layout(layout))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start python");
    let mut input = String::new();
    for d in dirs {
        input.push_str(&d.to_string_lossy());
        input.push('\n');
    }
    let mut sin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        let _ = sin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().expect("run python");
    writer.join().expect("stdin writer");
    assert!(
        out.status.success(),
        "salt dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dumps: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("dump JSON"))
        .collect();
    assert_eq!(dumps.len(), dirs.len(), "one dump per directory");
    let mut logs: Vec<Vec<String>> = Vec::new();
    for l in String::from_utf8_lossy(&out.stderr).lines() {
        if l.starts_with("@@DIR ") {
            logs.push(Vec::new());
        } else if let Some(last) = logs.last_mut() {
            last.push(l.to_owned());
        }
    }
    logs.resize(dirs.len(), Vec::new());
    dumps.into_iter().zip(logs).collect()
}

/// keycache's view of a store in the shape of the driver's dump: `keys`
/// `{id: {"state", "pub"}}` and `denied_keys` `{id: [pem]}`.
pub fn kc_dump(dir: &Path, layout: &Params) -> Value {
    let store = keycache::Store::open_with(dir, &layout.options()).expect("open");
    let mut keys = serde_json::Map::new();
    for r in store.keys(None).expect("list") {
        let (id, e) = r.expect("entry");
        keys.insert(
            id,
            serde_json::json!({"state": e.state.name(),
                "pub": String::from_utf8_lossy(&e.public_key)}),
        );
    }
    let mut denied = serde_json::Map::new();
    for r in store.denied_keys().expect("list") {
        let (id, pem) = r.expect("entry");
        denied.insert(id, serde_json::json!([String::from_utf8_lossy(&pem)]));
    }
    serde_json::json!({"keys": keys, "denied_keys": denied})
}

/// Runs the Python script `py/SCRIPT` of the test kit with the venv's
/// Python, feeding `stdin` as JSON; panics with its stderr unless it
/// succeeds; returns the JSON it prints.
pub fn run_py(script: &str, args: &[&str], stdin: Option<&Value>) -> Value {
    let mut child = Command::new(python())
        .arg(py_dir().join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    {
        let mut sin = child.stdin.take().expect("stdin");
        if let Some(v) = stdin {
            sin.write_all(v.to_string().as_bytes())
                .expect("write stdin");
        }
    }
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{script} {args:?}: stdout is not JSON ({e})"))
}

/// The start of every writer of [`spawn_salt_writer`]: imports `argparse`,
/// `json`, `os`, `random`, `sys` and the driver (`sd`); sets `d` (the
/// store), `stop` (the stop file), `args` (the layout) and `mk` (Salt's
/// `mmap_key` on `d`).
pub const SALT_WRITER_PRELUDE: &str = r#"
import argparse, json, os, random, sys
sys.path.insert(0, sys.argv[1])
import salt_driver as sd
d, stop = sys.argv[2], sys.argv[3]
size, slot, ids, seg = (int(x) for x in sys.argv[4:8])
args = argparse.Namespace(dir=d, size=size, slot_size=slot, id_size=ids, max_segment_bytes=seg)
mk = sd._mmap_key_for(args, d)
"#;

/// Starts `script` (Python source run with `-c`, after
/// [`SALT_WRITER_PRELUDE`]) as a writer through Salt's own mmap_key, with
/// the venv's Python and the arguments the concurrent tests' writers take:
/// the test kit's `py/` directory, the store, the stop file (the writer
/// ends when it appears) and `layout`'s four parameters. Its stdout is
/// piped (the writer reports there), its stderr inherited.
pub fn spawn_salt_writer(
    script: &str,
    dir: &Path,
    stop: &Path,
    layout: &Params,
) -> std::process::Child {
    Command::new(python())
        .arg("-c")
        .arg(format!("{SALT_WRITER_PRELUDE}{script}"))
        .arg(py_dir())
        .arg(dir)
        .arg(stop)
        .args(script_layout(layout))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start Salt's writer")
}

/// What differs between two dumps of [`kc_dump`]'s shape, one line per
/// (bank, id), keys shortened: for failure messages.
pub fn dump_diff(a: &Value, b: &Value) -> Vec<String> {
    let short = |v: &Value| -> String {
        let pem = v["pub"].as_str().or(v[0].as_str()).unwrap_or("");
        let body: String = pem.lines().nth(1).unwrap_or("").chars().take(16).collect();
        match v["state"].as_str() {
            Some(s) => format!("{s} {body}"),
            None if v.is_null() => "absent".into(),
            None => format!("denied {body}"),
        }
    };
    let mut out = Vec::new();
    for bank in ["keys", "denied_keys"] {
        let ids: std::collections::BTreeSet<&String> = [a, b]
            .iter()
            .filter_map(|d| d[bank].as_object())
            .flat_map(|m| m.keys())
            .collect();
        for id in ids {
            let (x, y) = (&a[bank][id], &b[bank][id]);
            if x != y {
                out.push(format!("{bank}/{id}: {} | {}", short(x), short(y)));
            }
        }
    }
    out
}
