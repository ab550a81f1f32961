//! Crash safety of the key tree: `keycache accept`,
//! `reject` and `delete` with the tree on, killed with SIGKILL after a
//! random delay, many times. After every kill: no minion has a
//! `minions/<id>` file (which Salt 3008.5's `validate_token` would accept)
//! unless the store holds it accepted with exactly that key. Every few
//! kills the tree is mended (`tree::mend`) and must then agree with the
//! store (`tree::check`); a sample of the trees left by kills is handed to
//! Salt's own `ReqServerChannel.validate_token` (`py/validate_token.py`),
//! which must accept exactly the minions whose file the store vouches for.
//!
//! Scale with `KEYCACHE_TREE_KILLS` (default 150).

use crate::common;
use crate::common::{env_u64, open, sized, ParamsExt};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keycache::tree;
use keycache::tree::TreeSync;
use keycache::{KeyState, MinionId, Store};
use keycache_testkit::rng::Rng;
use serde_json::{json, Value};

const IDS: [&str; 6] = ["m-0", "m-1", "m-2", "m-3", "m-4", "m-5"];

fn vt(args: &[&str], stdin: Option<&Value>) -> Value {
    common::run_py("validate_token.py", args, stdin)
}

/// The invariant: every `minions/<id>` entry is a regular file whose bytes
/// are the key the store holds accepted for `id`. Returns the ids whose
/// file the store vouches for.
fn check_invariant(pki: &Path, ctx: &str) -> Vec<String> {
    let st = open(pki, &sized(1009));
    let mut vouched = Vec::new();
    let Ok(rd) = std::fs::read_dir(pki.join("minions")) else {
        return vouched;
    };
    for e in rd {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            assert!(
                name.starts_with(tree::TEMP_PREFIX),
                "{ctx}: unexpected {name}"
            );
            continue;
        }
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        assert!(m.is_file(), "{ctx}: minions/{name} is not a regular file");
        let file = std::fs::read(e.path()).unwrap();
        let held = st.get(&MinionId::new(&name).unwrap()).unwrap();
        match held {
            Some(k) if k.state == KeyState::Accepted && k.public_key == file => vouched.push(name),
            other => panic!(
                "{ctx}: minions/{name} exists (Salt's validate_token would accept it) but the \
                 store holds {:?}",
                other.map(|k| (k.state, k.public_key == file))
            ),
        }
    }
    vouched.sort();
    vouched
}

fn copy_minions(pki: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("minions")).unwrap();
    for e in std::fs::read_dir(pki.join("minions")).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join("minions").join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn tree_writers_killed_at_random_moments_never_let_a_minion_in() {
    let kills = env_u64("KEYCACHE_TREE_KILLS", 150);
    let t = tempfile::tempdir().unwrap();
    let keys = t.path().join("keys");
    let pki = t.path().join("pki");
    std::fs::create_dir_all(pki.join("minions")).unwrap();
    // Each id's key, and another key (another minion's, under that id: a
    // minion that came back re-keyed, whose old private key must not pass).
    let alt_ids: Vec<String> = IDS.iter().map(|id| format!("{id}-alt")).collect();
    let mut all: Vec<&str> = IDS.to_vec();
    all.extend(alt_ids.iter().map(String::as_str));
    let made: std::collections::BTreeMap<String, String> =
        common::vt_keygen(&keys, &all).into_iter().collect();
    let pub_of = |id: &str| made[id].clone();
    let pubs: Vec<String> = IDS.iter().map(|id| pub_of(id)).collect();
    let alt: Vec<String> = alt_ids.iter().map(|id| pub_of(id)).collect();
    let bin = env!("CARGO_BIN_EXE_keycache");
    let mut rng = Rng::new(0x7ee_5eed);
    let start = Instant::now();
    let (mut killed, mut finished, mut mended) = (0u64, 0u64, 0u64);
    let mut samples: Vec<(PathBuf, Vec<String>)> = Vec::new();
    // Calibration: how long one run takes, to spread the kills over it.
    let mut full = Duration::from_millis(5);
    for k in 0..kills {
        // Refill: ids the store no longer holds come back pending (with
        // the tree on), some with their other key.
        {
            let st = Store::open_with(&pki, &sized(1009).options())
                .unwrap()
                .with_tree(TreeSync::On);
            for (i, id) in IDS.iter().enumerate() {
                let mid = MinionId::new(*id).unwrap();
                if st.get(&mid).unwrap().is_none() {
                    let pem = if rng.one_in(4) { &alt[i] } else { &pubs[i] };
                    st.put(&mid, KeyState::Pending, pem.as_bytes()).unwrap();
                }
            }
        }
        let mut ids: Vec<&str> = IDS.iter().copied().filter(|_| rng.one_in(2)).collect();
        if ids.is_empty() {
            ids.push(IDS[rng.below(IDS.len() as u64) as usize]);
        }
        let op = match rng.below(5) {
            0 | 1 => "accept",
            2 => "reject",
            _ => "delete",
        };
        let mut cmd = Command::new(bin);
        cmd.arg(op)
            .arg(&pki)
            .args(&ids)
            .args(["--size", "1009", "--tree", "always"])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if op != "delete" {
            cmd.arg("--include-all");
        }
        let t0 = Instant::now();
        let mut child = cmd.spawn().unwrap();
        if k < 5 {
            // Calibrate on a few whole runs.
            let st = child.wait().unwrap();
            assert!(st.code().is_some_and(|c| c <= 1), "{op}: {st:?}");
            full = full.max(t0.elapsed());
            finished += 1;
        } else {
            let delay = rng.below(full.as_micros() as u64 + 1);
            std::thread::sleep(Duration::from_micros(delay));
            let _ = child.kill();
            let st = child.wait().unwrap();
            if st.code().is_some() {
                assert!(st.code().is_some_and(|c| c <= 1), "{op}: {st:?}");
                finished += 1;
            } else {
                killed += 1;
            }
        }
        let ctx = format!("kill {k} ({op} {ids:?})");
        let vouched = check_invariant(&pki, &ctx);
        if k % 10 == 7 {
            let to = t.path().join(format!("sample-{k}"));
            copy_minions(&pki, &to);
            samples.push((to, vouched));
        }
        if rng.one_in(4) {
            let st = Store::open_with(&pki, &sized(1009).options()).unwrap();
            tree::mend(&st).unwrap();
            assert_eq!(tree::check(&st).unwrap(), vec![], "{ctx}: after mend");
            check_invariant(&pki, &format!("{ctx}, mended"));
            mended += 1;
        }
    }
    // Salt's own validate_token on the sampled trees: exactly the minions
    // whose file the store vouched for pass.
    let jobs: Vec<Value> = samples
        .iter()
        .map(|(p, _)| json!({"pki_dir": p, "ids": IDS}))
        .collect();
    let v = vt(
        &["check", "--keys", keys.to_str().unwrap(), "--stdin"],
        Some(&Value::Array(jobs)),
    );
    let results = v["results"].as_array().unwrap();
    let mut passed = 0;
    for (p, vouched) in &samples {
        for r in results.iter().filter(|r| r["pki_dir"] == json!(p)) {
            let id = r["id"].as_str().unwrap();
            let valid = r["valid"].as_bool().unwrap();
            // A re-keyed minion's file holds its other key: Salt refuses
            // the token of the first one. Vouched-for files with the
            // minion's own key must pass, and nothing else.
            let i = IDS.iter().position(|x| *x == id).unwrap();
            let own_key = std::fs::read(p.join("minions").join(id))
                .map(|b| b == pubs[i].as_bytes())
                .unwrap_or(false);
            let expect = vouched.iter().any(|x| x == id) && own_key;
            assert_eq!(
                valid,
                expect,
                "{}: validate_token({id}) = {valid}, the store vouches for {vouched:?}",
                p.display()
            );
            passed += usize::from(valid);
        }
    }
    eprintln!(
        "tree kills: {kills} runs, {killed} killed mid-run, {finished} finished, {mended} \
         mends, {} sampled trees checked by Salt's validate_token ({}; {passed} passes), \
         run time up to {:.1} ms, {:.1} s in all",
        samples.len(),
        v["mode"],
        full.as_secs_f64() * 1e3,
        start.elapsed().as_secs_f64()
    );
    assert!(killed > kills / 4, "too few kills landed inside a run");
    assert!(start.elapsed() < Duration::from_secs(50));
}
