//! `keycache verify` and `verify --repair` tell the truth on a live store:
//! while Salt's own writer (the real `mmap_key.store`,
//! one process, fsyncs and all) adds keys to both banks and rolls heap
//! segments, every run must report the clean store as clean, and no repair
//! may rebuild it (the index and roster files keep their inodes, no
//! lost-entries file appears). A finding of the check without the lock that
//! the check under the lock refutes is counted (`unconfirmed`), never
//! reported.

use crate::common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{env_u64, kc_dump, keycache_json, salt_dump_many, small, Params, ParamsExt};
use serde_json::json;

/// Segments of 16 KiB: Salt's writer rolls a new one every ~30 keys.
fn layout() -> Params {
    small(20_011, 16 * 1024)
}

/// Salt's writer (after the test kit's `SALT_WRITER_PRELUDE`), until `stop` exists: `keys` gets a pending key per
/// round, `denied_keys` one every fifth round. Prints `started` after its
/// first write, and the number of rounds at the end.
const WRITER: &str = r#"
n = 0
while not os.path.exists(stop):
    body = ("live%06d" % n) * 40
    pem = "-----BEGIN PUBLIC KEY-----\n" + "\n".join(body[i:i + 64] for i in range(0, len(body), 64)) + "\n-----END PUBLIC KEY-----\n"
    mid = "live-%06d.example.com" % n
    mk.store("keys", mid, {"state": "pending", "pub": pem}, d)
    if n % 5 == 0:
        mk.store("denied_keys", mid, [pem], d)
    n += 1
    if n == 1:
        print("started", flush=True)
print(n, flush=True)
"#;

fn file_ids(dir: &Path) -> Vec<(String, u64)> {
    [
        ".mmap_keys.idx",
        ".mmap_keys.idx.roster",
        ".mmap_denied.idx",
        ".mmap_denied.idx.roster",
    ]
    .iter()
    .map(|n| {
        (
            n.to_string(),
            std::fs::metadata(dir.join(n)).map(|m| m.ino()).unwrap_or(0),
        )
    })
    .collect()
}

/// The `keys` bank's header count of occupied slots.
fn occupied(dir: &Path) -> u64 {
    use std::io::Read;
    let mut b = [0u8; 9];
    std::fs::File::open(dir.join(".mmap_keys.idx"))
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap();
    u64::from_le_bytes(b[1..9].try_into().unwrap())
}

#[test]
fn verify_and_repair_report_nothing_and_rebuild_nothing_while_salt_adds_keys() {
    let runs = env_u64("KEYCACHE_LIVE_VERIFY_RUNS", 150) as usize;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    std::fs::create_dir(&dir).unwrap();
    let l = layout();
    // Salt creates both banks.
    let seed: Vec<_> = (0..20)
        .flat_map(|i| {
            let id = format!("seed-{i:02}");
            let pem = common::pem(&id, 300);
            [
                json!({"op": "store", "bank": "keys", "id": id, "state": "accepted", "pub": pem}),
                json!({"op": "store", "bank": "denied_keys", "id": id, "pub": pem}),
            ]
        })
        .collect();
    common::salt(&dir, &l, &["apply"], Some(&serde_json::Value::Array(seed)));

    let stop = t.path().join("stop");
    let mut writer = common::spawn_salt_writer(WRITER, &dir, &stop, &l);
    let mut out = BufReader::new(writer.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "started", "Salt's writer did not start");

    let start = Instant::now();
    let dir_s = dir.to_str().unwrap();
    let largs = l.args();
    let (mut unconfirmed, mut problems) = (0u64, Vec::new());
    let mut with_unconfirmed = 0usize;
    // At least `runs` of each, and on until Salt added `BUSY` keys meanwhile
    // (a slow machine), within `BUDGET`.
    const BUSY: u64 = 200;
    const BUDGET: Duration = Duration::from_secs(30);
    let occ0 = occupied(&dir);
    let mut i = 0;
    while (i < 2 * runs || occupied(&dir) < occ0 + BUSY) && start.elapsed() < BUDGET {
        let repair = i % 2 == 1;
        i += 1;
        // The banks (Salt's writer keeps no key tree).
        let mut a = vec!["verify", dir_s, "--json", "--tree", "never"];
        if repair {
            a.push("--repair");
        }
        a.extend(largs.iter().map(String::as_str));
        let before = file_ids(&dir);
        let (o, v) = keycache_json(&a);
        let after = file_ids(&dir);
        let u = v["unconfirmed"].as_u64().unwrap_or(0);
        unconfirmed += u;
        with_unconfirmed += usize::from(u > 0);
        if o.status.code() != Some(0) || v["clean"] != true {
            problems.push(format!("run {i} (repair {repair}): {v}"));
        }
        if !v["repaired"].as_array().is_some_and(Vec::is_empty) {
            problems.push(format!("run {i}: rebuilt a clean bank: {v}"));
        }
        if before != after {
            problems.push(format!("run {i}: files replaced: {before:?} -> {after:?}"));
        }
    }
    let elapsed = start.elapsed();
    let added = occupied(&dir) - occ0;
    // Salt's writer was busy the whole time.
    let still_running = writer.try_wait().unwrap().is_none();
    std::fs::write(&stop, b"").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let status = writer.wait().unwrap();
    assert!(status.success(), "Salt's writer failed");
    let written: u64 = line.trim().parse().expect("the writer's count");
    eprintln!(
        "verify_live: {i} runs (verify and verify --repair in turn) in {:.1} s while Salt \
         added {added} keys: {} findings, {} rebuilds; {unconfirmed} findings of the check \
         without the lock (in {with_unconfirmed} runs) refuted under the lock",
        elapsed.as_secs_f64(),
        problems.len(),
        problems.iter().filter(|p| p.contains("rebuilt")).count(),
    );
    assert!(
        problems.is_empty(),
        "{} problems: {:#?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    assert!(still_running, "Salt's writer stopped before the runs ended");
    assert!(
        added >= BUSY && i >= 2 * runs,
        "Salt's writer added {added} keys during {i} runs in {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(40),
        "{i} runs took {elapsed:?}"
    );
    // Nothing was lost: both readers see every key Salt wrote.
    let kc = kc_dump(&dir, &l);
    let salt = &salt_dump_many(std::slice::from_ref(&dir), &l)[0].0;
    assert_eq!(kc["keys"], salt["keys"]);
    assert_eq!(kc["denied_keys"], salt["denied_keys"]);
    assert_eq!(kc["keys"].as_object().unwrap().len() as u64, 20 + written);
    assert!(!dir.join(".mmap_keys.idx.keycache-lost").exists());
}
