//! A killed writer's key tree is finished by the next writer, with no
//! operator: bulk `accept`, `reject`, `delete` and `deny` of a few
//! thousand keys, a Salt driver's stream of accepts (`salt.cache` with
//! `keys.cache_driver: keycache`, as `salt-key -A` writes), a merge and an
//! export, each killed with SIGKILL at a random moment of its run. After
//! the kill, one call of a next writer (the same command again, a write of
//! another id, or the driver's first call), never `verify --repair`; then
//! Salt 3008.5 is the judge: its `mmap_key` (`salt_driver.py dump`) lists
//! the store, every id it lists accepted has `minions/<id>` with exactly
//! that key and no other id has one, its `validate_token` lets in exactly
//! the accepted minions of those with real key pairs, and `keycache verify`
//! finds nothing.
//!
//! Scale with `KEYCACHE_RESUME_ROUNDS` (rounds per writer, default 3) and
//! `KEYCACHE_RESUME_KEYS` (default 3000); `KEYCACHE_RESUME_WRITER=Accept`
//! (a [`Writer`]'s name) runs one writer.

use crate::common;
use crate::common::{env_u64, sized, ParamsExt};

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keycache::tree::{TreeSync, INTENT_FILE};
use keycache::{KeyState, MinionId, Params, Store};
use keycache_testkit::crash::copy_tree;
use keycache_testkit::rng::Rng;
use serde_json::{json, Value};

/// Minions with real key pairs, for Salt's `validate_token`.
const REAL: [&str; 4] = ["real-0", "real-1", "real-2", "real-3"];

fn layout() -> Params {
    sized(16_381)
}

fn kc() -> &'static str {
    env!("CARGO_BIN_EXE_keycache")
}

/// The writers killed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Writer {
    Accept,
    Reject,
    Delete,
    Deny,
    Driver,
    Merge,
    Export,
}

const WRITERS: [Writer; 7] = [
    Writer::Accept,
    Writer::Reject,
    Writer::Delete,
    Writer::Deny,
    Writer::Driver,
    Writer::Merge,
    Writer::Export,
];

/// The test's keys: `n` minions with made-up keys and [`REAL`] with real
/// ones, and the pending/accepted mix a store starts a round with.
struct Keys {
    dir: PathBuf,
    pubs: BTreeMap<String, String>,
}

impl Keys {
    fn new(t: &Path, n: u64) -> Keys {
        let dir = t.join("keypairs");
        let mut pubs: BTreeMap<String, String> =
            common::vt_keygen(&dir, &REAL).into_iter().collect();
        for i in 0..n {
            let id = format!("m-{i:05}");
            pubs.insert(id.clone(), common::pem(&id, 400));
        }
        Keys { dir, pubs }
    }
}

/// A store with the whole tree: every key pending, except every fifth
/// accepted (so that reject, delete and deny have accepted keys to take
/// out of `minions/`), and `master.pub` (a cluster, for merges).
fn template(t: &Path, keys: &Keys) -> PathBuf {
    let dir = t.join("template");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("master.pub"), common::pem("the-master", 400)).unwrap();
    let st = Store::open_with(&dir, &layout().options())
        .unwrap()
        .with_tree(TreeSync::On);
    st.batch(|b| {
        for (i, (id, pem)) in keys.pubs.iter().enumerate() {
            let s = if i % 5 == 0 {
                KeyState::Accepted
            } else {
                KeyState::Pending
            };
            b.put(&MinionId::new(id.as_str())?, s, pem.as_bytes())?;
        }
        Ok(())
    })
    .unwrap();
    dir
}

/// Salt's key operations through the driver with the master config
/// `conf` (`key_ops.py CONF`), to be given its stdio and started.
fn key_ops(conf: &Path) -> Command {
    let mut c = Command::new(common::python());
    c.arg(common::py_dir().join("key_ops.py")).arg(conf);
    c
}

/// A Salt master config for the driver: the store in `pki`, the tree on.
fn master_config(t: &Path, pki: &Path) -> PathBuf {
    let conf = t.join("master.conf");
    std::fs::write(
        &conf,
        format!(
            "pki_dir: {}\ncachedir: {}\nmmap_key_size: {}\nkeys.cache_driver: keycache\n\
             keycache_tree: true\n",
            pki.display(),
            t.join("cache").display(),
            layout().size
        ),
    )
    .unwrap();
    conf
}

/// Starts `w` on the store `dir` (a merge's snapshot in `snap`, an
/// export's target `out`).
fn start(w: Writer, dir: &Path, t: &Path, keys: &Keys, snap: &Path, out: &Path) -> Child {
    let d = dir.to_str().unwrap();
    let mut cmd = Command::new(kc());
    let size = layout().size.to_string();
    match w {
        Writer::Accept => cmd.args(["accept", d, "--all", "--include-all"]),
        Writer::Reject => cmd.args(["reject", d, "--all", "--include-all"]),
        Writer::Delete => cmd.args(["delete", d, "--all", "-y"]),
        Writer::Deny => cmd.args(["deny", d, "--all", "--include-all"]),
        Writer::Merge => cmd.args(["merge", d]).arg(snap),
        Writer::Export => cmd.args(["export", d, "--to"]).arg(out),
        Writer::Driver => {
            let conf = master_config(t, dir);
            let mut c = key_ops(&conf);
            c.stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut child = c.spawn().unwrap();
            let mut input = child.stdin.take().unwrap();
            let mut lines = String::new();
            for id in keys.pubs.keys() {
                lines
                    .push_str(&json!({"op": "accept", "id": id, "include_all": false}).to_string());
                lines.push('\n');
            }
            // Written by a thread: the pipe holds less than the stream.
            std::thread::spawn(move || {
                let _ = input.write_all(lines.as_bytes());
            });
            return child;
        }
    };
    if w != Writer::Export && w != Writer::Merge {
        cmd.args(["--tree", "always"]);
    }
    cmd.args(["--size", &size])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.spawn().unwrap()
}

/// A merge's snapshot: a peer of the same cluster that accepted every
/// key (`--seen` is not given: the peer's entries are all newer).
fn peer_snapshot(t: &Path, template: &Path) -> PathBuf {
    let peer = t.join("peer");
    copy_tree(template, &peer);
    let size = layout().size.to_string();
    let run = |args: &[&str]| {
        let o = Command::new(kc())
            .args(args)
            .args(["--size", &size])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let p = peer.to_str().unwrap();
    // Histories of both begin here (the template's copy is the store the
    // merges go into, and a snapshot of it before the peer's accepts).
    let base = t.join("base.snap");
    run(&["snapshot", p, "-o", base.to_str().unwrap()]);
    run(&["accept", p, "--all", "--include-all", "--tree", "always"]);
    let snap = t.join("peer.snap");
    run(&["snapshot", p, "-o", snap.to_str().unwrap()]);
    snap
}

/// Runs `next`, the next writer after a kill (its output is not judged:
/// only what it leaves).
fn run_next(next: &mut Command) -> String {
    let o = next.output().unwrap();
    assert!(
        o.status.code().is_some_and(|c| c <= 1),
        "next writer {next:?}: {o:?}"
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The judge: Salt's listing of `store` against the tree in `tree_dir`.
/// Returns the ids Salt lists accepted.
fn judge(store: &Path, tree_dir: &Path, keys: &Keys, ctx: &str) -> Vec<String> {
    let dump = common::salt(store, &layout(), &["dump"], None);
    let mut accepted: BTreeMap<String, String> = BTreeMap::new();
    for (id, v) in dump["keys"].as_object().unwrap() {
        if v["state"] == "accepted" {
            accepted.insert(id.clone(), v["pub"].as_str().unwrap().to_owned());
        }
    }
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(tree_dir.join("minions")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with('.'), "{ctx}: {name} left in minions/");
        files.insert(name, std::fs::read_to_string(e.path()).unwrap());
    }
    let missing: Vec<&String> = accepted
        .keys()
        .filter(|id| !files.contains_key(*id))
        .collect();
    let stray: Vec<&String> = files
        .keys()
        .filter(|id| !accepted.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty() && stray.is_empty(),
        "{ctx}: {} accepted without minions/<id> (first {:?}), {} files not accepted (first {:?})",
        missing.len(),
        missing.first(),
        stray.len(),
        stray.first()
    );
    for (id, pem) in &accepted {
        assert_eq!(
            &files[id], pem,
            "{ctx}: minions/{id} is not the accepted key"
        );
    }
    // Salt's validate_token on the minions with real keys.
    for (id, valid) in common::validate_token::check(&keys.dir, tree_dir, &REAL) {
        let id = id.as_str();
        assert_eq!(
            valid,
            Some(accepted.contains_key(id)),
            "{ctx}: validate_token({id}); accepted: {}",
            accepted.contains_key(id)
        );
    }
    accepted.into_keys().collect()
}

/// `keycache verify` of the store and its tree finds nothing.
fn verify_clean(dir: &Path, ctx: &str) {
    let o = Command::new(kc())
        .arg("verify")
        .arg(dir)
        .args(["--tree", "always", "--size", &layout().size.to_string()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{ctx}: verify: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_next_writer_finishes_the_tree_of_every_killed_writer() {
    let rounds = env_u64("KEYCACHE_RESUME_ROUNDS", 3);
    let n = env_u64("KEYCACHE_RESUME_KEYS", 3000);
    let t = tempfile::tempdir().unwrap();
    let keys = Keys::new(t.path(), n);
    let template = template(t.path(), &keys);
    let snap = peer_snapshot(t.path(), &template);
    let mut rng = Rng::new(0x2e5_0e7);
    let start_all = Instant::now();
    let (mut left_behind, mut resumed_said) = (0u32, 0u32);
    for w in WRITERS
        .into_iter()
        .filter(|w| std::env::var("KEYCACHE_RESUME_WRITER").map_or(true, |o| o == format!("{w:?}")))
    {
        // How long a whole run takes, to spread the kills over it.
        let full = {
            let dir = t.path().join(format!("{w:?}-whole"));
            copy_tree(&template, &dir);
            let out = t.path().join(format!("{w:?}-whole-out"));
            let t0 = Instant::now();
            let mut c = start(w, &dir, t.path(), &keys, &snap, &out);
            if w == Writer::Driver {
                // The stream ends when the store holds every accept.
                let deadline = Instant::now() + Duration::from_secs(120);
                let st = Store::open_with(&dir, &layout().options()).unwrap();
                while st.counts().unwrap().pending > 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
            }
            let _ = c.wait();
            t0.elapsed()
        };
        for r in 0..rounds {
            let ctx = format!("{w:?} round {r}");
            let dir = t.path().join(format!("{w:?}-{r}"));
            copy_tree(&template, &dir);
            let out = t.path().join(format!("{w:?}-{r}-out"));
            let mut c = start(w, &dir, t.path(), &keys, &snap, &out);
            // Over the whole run; the driver's accepts over their first
            // half (its run is long).
            let span = full.as_micros() as u64 / if w == Writer::Driver { 2 } else { 1 };
            std::thread::sleep(Duration::from_micros(rng.below(span + 1)));
            let _ = c.kill();
            let _ = c.wait();
            let tree_dir = if w == Writer::Export { &out } else { &dir };
            if w != Writer::Export {
                let intent = std::fs::read(dir.join(INTENT_FILE)).unwrap_or_default();
                if intent.starts_with(b"KCTI") {
                    left_behind += 1;
                }
            }
            // One call of the next writer.
            let d = dir.to_str().unwrap();
            let said = match (w, rng.below(3)) {
                (Writer::Export, _) => {
                    run_next(Command::new(kc()).args(["export", d, "--to"]).arg(&out))
                }
                (Writer::Driver, 0) | (_, 2) => {
                    // The driver's first call of the store, by another
                    // process: a sign-in of a new minion.
                    let conf = master_config(t.path(), &dir);
                    let mut c = key_ops(&conf);
                    c.stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped());
                    let mut child = c.spawn().unwrap();
                    let pem = common::pem("next-writer", 400);
                    writeln!(
                        child.stdin.take().unwrap(),
                        "{}",
                        json!({"op": "signin", "id": "next-writer", "pub": pem})
                    )
                    .unwrap();
                    let o = child.wait_with_output().unwrap();
                    assert!(
                        String::from_utf8_lossy(&o.stdout).contains("\"done\": true"),
                        "{ctx}: the driver's sign-in: {o:?}"
                    );
                    String::from_utf8_lossy(&o.stderr).into_owned()
                }
                (_, 0) => {
                    let mut again = Command::new(kc());
                    match w {
                        Writer::Merge => again.args(["merge", d]).arg(&snap),
                        Writer::Driver | Writer::Accept => {
                            again.args(["accept", d, "--all", "--include-all"])
                        }
                        Writer::Reject => again.args(["reject", d, "--all", "--include-all"]),
                        Writer::Delete => again.args(["delete", d, "--all", "-y"]),
                        Writer::Deny => again.args(["deny", d, "--all", "--include-all"]),
                        Writer::Export => unreachable!(),
                    };
                    run_next(again.args(["--size", &layout().size.to_string()]))
                }
                _ => {
                    // A write of one other id.
                    run_next(
                        Command::new(kc())
                            .args(["reject", d, "m-00001", "--include-all"])
                            .args(["--size", &layout().size.to_string()]),
                    )
                }
            };
            if said.contains("was interrupted") {
                resumed_said += 1;
            }
            let accepted = judge(&dir, tree_dir, &keys, &ctx);
            if w == Writer::Export {
                // The export's tree is the store's, whole.
                let o = Command::new(kc())
                    .args(["export", d, "--dry-run", "--json", "--to"])
                    .arg(&out)
                    .output()
                    .unwrap();
                let v: Value = serde_json::from_slice(&o.stdout).unwrap();
                assert_eq!(v["written"], json!(0), "{ctx}: export left {v}");
                assert_eq!(v["removed"], json!([]), "{ctx}: export left {v}");
                assert_eq!(v["replaced"], json!([]), "{ctx}: export left {v}");
            } else {
                verify_clean(&dir, &ctx);
            }
            eprintln!("{ctx}: {} accepted after the next writer", accepted.len());
            for p in [&dir, &out] {
                let _ = std::fs::remove_dir_all(p);
            }
        }
    }
    eprintln!(
        "resume: {} writers x {rounds} rounds of {n} keys, {left_behind} kills left a tree \
         write unfinished, {resumed_said} next writers said they finished one, {:.1} s",
        WRITERS.len(),
        start_all.elapsed().as_secs_f64()
    );
    assert!(
        left_behind > 0,
        "no kill landed inside a tree write: the test proves nothing"
    );
}
