//! `keycache snapshot` of a store that Salt's own writer is changing: the
//! snapshot is the store as of one moment.
//!
//! Salt's writer (one Python process running the real Salt 3008.5
//! `salt.cache.mmap_key.store` / `flush_`, through `salt.utils.mmap_cache`,
//! with its `.lock` files, in-place rewrites and heap segments rolled every
//! few keys) stores and removes keys and denied keys of a few ids, each value
//! unique to (id, op), and logs every op it finished, in order. Meanwhile
//! `keycache snapshot` runs again and again (to a file and to stdout).
//!
//! Checked, for every snapshot: it reads back through the library (magic,
//! version, checksum); it holds no `master_keys`; every entry is byte for byte
//! a value Salt wrote for that id in that bank (never torn, never another id's
//! value); and the two banks together are exactly the store after some prefix
//! of Salt's ops (a moment: no half of a move between banks, no state between
//! two of Salt's writes). Its tombstones name only (bank, id) that Salt
//! removed, no stamp is after the snapshot's generation, and generations
//! grow from one snapshot to the next. Salt kept writing while the snapshots
//! ran (they show many distinct moments, and carry tombstones).
//!
//! `KEYCACHE_SNAP_SECONDS` sets how long the snapshots run (default 8).

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use crate::common::{check_ok, env_u64, small, Params, ParamsExt};
use keycache_merge::history::Kind;
use keycache_merge::snapshot::Snapshot;
use serde_json::Value;

/// Segments of 8 KiB: Salt's writer rolls one every dozen values.
fn layout() -> Params {
    small(1009, 8 * 1024)
}

/// Salt's writer (after the test kit's `SALT_WRITER_PRELUDE`): random ops on a few ids until `stop` exists, each value
/// `id|bank|op number|length|filler`; prints `started` once every id is in
/// both banks, then one JSON line per finished op
/// `[n, bank, id, state or null, pem or null]` (null pem: removed).
const WRITER: &str = r#"
rng = random.Random(20260)
IDS = ["snap-%02d.example.com" % i for i in range(12)]
STATES = ["accepted", "pending", "rejected"]
n = 0
def value(mid, bank, n, length):
    body = "%s|%s|%d|%d|" % (mid, bank, n, length)
    r = random.Random(n * 7919 + length)
    body += "".join(chr(65 + r.randrange(26)) for _ in range(max(0, length - len(body))))
    return "-----BEGIN PUBLIC KEY-----\n" + "\n".join(body[i:i + 64] for i in range(0, len(body), 64)) + "\n-----END PUBLIC KEY-----\n"
def op(bank, mid, kind):
    global n
    n += 1
    if kind == "store":
        pem = value(mid, bank, n, rng.choice([60, 120, 300, 451, 700, 900]))
        if bank == "keys":
            st = rng.choice(STATES)
            mk.store("keys", mid, {"state": st, "pub": pem}, d)
        else:
            st = None
            mk.store("denied_keys", mid, [pem], d)
    else:
        st, pem = None, None
        mk.flush_(bank, mid, cachedir=d)
    sys.stdout.write(json.dumps([n, bank, mid, st, pem]) + "\n")
for mid in IDS:
    op("keys", mid, "store")
    op("denied_keys", mid, "store")
sys.stdout.write("started\n")
sys.stdout.flush()
while not os.path.exists(stop):
    mid = rng.choice(IDS)
    k = rng.randrange(10)
    if k < 4:
        op("keys", mid, "store")
    elif k < 6:
        op("denied_keys", mid, "store")
    elif k < 8:
        # A move between banks: two ops, a moment between them.
        if rng.randrange(2):
            op("denied_keys", mid, "store"); op("keys", mid, "flush")
        else:
            op("keys", mid, "store"); op("denied_keys", mid, "flush")
    elif k < 9:
        op("keys", mid, "flush")
    else:
        op("denied_keys", mid, "flush")
    if n % 50 == 0:
        sys.stdout.flush()
sys.stdout.write("done %d\n" % n)
sys.stdout.flush()
"#;

/// One entry: (bank, id) -> (state, pem); state "" in `denied_keys`.
type State = BTreeMap<(String, String), (String, Vec<u8>)>;

/// One of Salt's ops: bank, id, and the (state, pem) stored or `None`
/// (removed).
type Op = (String, String, Option<Stored>);

/// A snapshot's tombstones: ((bank, id), stamp).
type Tombstones = Vec<((String, String), u64)>;

/// A stored value: (state, pem).
type Stored = (String, Vec<u8>);

fn entry_hash(k: &(String, String), v: &(String, Vec<u8>)) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    k.hash(&mut h);
    v.hash(&mut h);
    h.finish()
}

/// An order-free fingerprint of a state.
fn fingerprint(s: &State) -> u64 {
    s.iter()
        .fold(0u64, |a, (k, v)| a.wrapping_add(entry_hash(k, v)))
}

/// A snapshot's live entries as a [`State`], with its generation and its
/// tombstones ((bank, id) and stamp), through the library's reader (magic,
/// version, checksum, order). Every stamp is at most the generation.
fn read_snapshot(bytes: &[u8], ctx: &str) -> (State, u64, Tombstones) {
    let snap = Snapshot::read_from(&mut &bytes[..])
        .unwrap_or_else(|e| panic!("{ctx}: the snapshot does not read back: {e}"));
    let mut s = State::new();
    let mut tombstones = Vec::new();
    for e in &snap.entries {
        let bank = e.bank.name().to_owned();
        assert!(
            bank == "keys" || bank == "denied_keys",
            "{ctx}: a snapshot entry of bank {bank:?}"
        );
        assert!(
            e.stamp <= snap.generation,
            "{ctx}: {bank}/{} stamped {} after the snapshot's generation {}",
            e.id,
            e.stamp,
            snap.generation
        );
        if e.kind == Kind::Absent {
            tombstones.push(((bank, e.id.clone()), e.stamp));
            continue;
        }
        let state = e.state().map_or("", |st| st.name()).to_owned();
        let prev = s.insert((bank.clone(), e.id.clone()), (state, e.public_key.clone()));
        assert!(
            prev.is_none(),
            "{ctx}: {bank}/{} twice in the snapshot",
            e.id
        );
    }
    (s, snap.generation, tombstones)
}

#[test]
fn snapshots_taken_while_salt_writes_are_moments_of_the_store() {
    let secs = env_u64("KEYCACHE_SNAP_SECONDS", 8);
    let kc = common::cli();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    std::fs::create_dir(&dir).unwrap();
    let l = layout();
    let stop = t.path().join("stop");
    let mut writer = common::spawn_salt_writer(WRITER, &dir, &stop, &l);
    let mut out = BufReader::new(writer.stdout.take().unwrap());
    let mut log_text = String::new();
    loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "Salt's writer ended before it started");
        if line.trim() == "started" {
            break;
        }
        log_text.push_str(&line);
    }
    // The rest of the log, gathered while the snapshots run.
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        rest
    });

    let start = Instant::now();
    let mut snaps: Vec<(String, Vec<u8>)> = Vec::new();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(secs) || snaps.len() < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(secs + 40),
            "only {} snapshots in {:?}",
            snaps.len(),
            start.elapsed()
        );
        i += 1;
        let to_stdout = i.is_multiple_of(3);
        let file = t.path().join(format!("snap-{i}"));
        let mut cmd = kc.cmd();
        cmd.arg("snapshot").arg(&dir).args(l.args());
        if to_stdout {
            if i.is_multiple_of(6) {
                cmd.args(["-o", "-"]);
            }
        } else {
            cmd.arg("-o").arg(&file);
        }
        let o = cmd.output().unwrap();
        check_ok(&format!("keycache snapshot {i} while Salt writes"), &o);
        let bytes = if to_stdout {
            o.stdout
        } else {
            assert!(o.stdout.is_empty(), "snapshot -o FILE printed on stdout");
            std::fs::read(&file).unwrap()
        };
        snaps.push((
            format!(
                "snapshot {i} ({})",
                if to_stdout { "stdout" } else { "file" }
            ),
            bytes,
        ));
    }
    let elapsed = start.elapsed();
    let still_running = writer.try_wait().unwrap().is_none();
    std::fs::write(&stop, b"").unwrap();
    let status = writer.wait().unwrap();
    assert!(status.success(), "Salt's writer failed");
    log_text.push_str(&reader.join().unwrap());
    assert!(
        still_running,
        "Salt's writer stopped before the snapshots ended"
    );

    // Salt's ops, in order.
    let mut ops: Vec<Op> = Vec::new();
    let mut done = None;
    for line in log_text.lines() {
        if let Some(n) = line.strip_prefix("done ") {
            done = Some(n.parse::<usize>().unwrap());
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("log {line:?}: {e}"));
        let (n, bank, id) = (
            v[0].as_u64().unwrap() as usize,
            v[1].as_str().unwrap().to_owned(),
            v[2].as_str().unwrap().to_owned(),
        );
        assert_eq!(n, ops.len() + 1, "ops logged in order");
        let val = v[4].as_str().map(|pem| {
            (
                v[3].as_str().unwrap_or("").to_owned(),
                pem.as_bytes().to_vec(),
            )
        });
        ops.push((bank, id, val));
    }
    assert_eq!(done, Some(ops.len()), "the writer's log is complete");

    // The fingerprint of the store after each prefix of the ops.
    let mut state = State::new();
    let mut fp = 0u64;
    let mut prints: HashMap<u64, Vec<usize>> = HashMap::new();
    prints.entry(fp).or_default().push(0);
    // Every value Salt wrote, per (bank, id).
    let mut written: HashMap<(String, String), Vec<Stored>> = HashMap::new();
    for (m, (bank, id, val)) in ops.iter().enumerate() {
        let k = (bank.clone(), id.clone());
        if let Some(old) = state.remove(&k) {
            fp = fp.wrapping_sub(entry_hash(&k, &old));
        }
        if let Some(v) = val {
            fp = fp.wrapping_add(entry_hash(&k, v));
            state.insert(k.clone(), v.clone());
            written.entry(k).or_default().push(v.clone());
        }
        prints.entry(fp).or_default().push(m + 1);
    }
    let state_at = |m: usize| {
        let mut s = State::new();
        for (bank, id, val) in &ops[..m] {
            let k = (bank.clone(), id.clone());
            match val {
                Some(v) => {
                    s.insert(k, v.clone());
                }
                None => {
                    s.remove(&k);
                }
            }
        }
        s
    };

    let moment_of = |got: &State| {
        prints
            .get(&fingerprint(got))
            .and_then(|ms| ms.iter().copied().find(|&m| state_at(m) == *got))
    };
    // The check can fail: the `keys` bank of one moment with the
    // `denied_keys` bank of a later one (what copying the banks one after
    // the other, each under its own lock, could give) is no moment.
    let bank_of = |s: &State, b: &str| -> State {
        s.iter()
            .filter(|(k, _)| k.0 == b)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut mixed_refuted = 0;
    for m1 in (ops.len() / 4..ops.len() / 2).step_by((ops.len() / 40).max(1)) {
        let (a, b) = (state_at(m1), state_at(m1 + 6));
        if bank_of(&a, "keys") == bank_of(&b, "keys")
            || bank_of(&a, "denied_keys") == bank_of(&b, "denied_keys")
        {
            continue;
        }
        let mut mixed = bank_of(&a, "keys");
        mixed.extend(bank_of(&b, "denied_keys"));
        if moment_of(&mixed).is_none() {
            mixed_refuted += 1;
        }
    }
    assert!(
        mixed_refuted >= 3,
        "the moment check refuted only {mixed_refuted} mixed states"
    );

    // (bank, id) that Salt removed at some point: the only ones a
    // tombstone may name.
    let removed: std::collections::HashSet<(String, String)> = ops
        .iter()
        .filter(|(_, _, v)| v.is_none())
        .map(|(b, id, _)| (b.clone(), id.clone()))
        .collect();
    let mut moments = std::collections::BTreeSet::new();
    let mut last_generation = 0u64;
    let mut tombstones_seen = 0usize;
    for (ctx, bytes) in &snaps {
        let (got, generation, tombstones) = read_snapshot(bytes, ctx);
        // Taken one after the other: each generation is later.
        assert!(
            generation > last_generation,
            "{ctx}: generation {generation} not after the previous snapshot's {last_generation}"
        );
        last_generation = generation;
        for (k, _) in &tombstones {
            assert!(
                removed.contains(k),
                "{ctx}: a tombstone of {}/{}, which Salt never removed",
                k.0,
                k.1
            );
        }
        tombstones_seen += tombstones.len();
        // Never torn: each entry is a value Salt wrote for it.
        for ((bank, id), v) in &got {
            let ok = written
                .get(&(bank.clone(), id.clone()))
                .is_some_and(|w| w.contains(v));
            assert!(
                ok,
                "{ctx}: {bank}/{id} holds a value Salt never wrote for it (torn?): {:?} {:.120}",
                v.0,
                String::from_utf8_lossy(&v.1)
            );
        }
        // One moment: the store after some prefix of Salt's ops.
        let Some(m) = moment_of(&got) else {
            // Say which entries no single moment explains.
            let near = (0..=ops.len())
                .map(|m| {
                    let s = state_at(m);
                    let diff = s.iter().filter(|(k, v)| got.get(*k) != Some(*v)).count()
                        + got.keys().filter(|k| !s.contains_key(*k)).count();
                    (diff, m)
                })
                .min()
                .unwrap();
            let s = state_at(near.1);
            let mut diffs = Vec::new();
            for k in s.keys().chain(got.keys()) {
                if s.get(k) != got.get(k) {
                    diffs.push(format!(
                        "{}/{}: snapshot {:?}, store after op {} {:?}",
                        k.0,
                        k.1,
                        got.get(k)
                            .map(|v| (&v.0, String::from_utf8_lossy(&v.1)[..60].to_owned())),
                        near.1,
                        s.get(k)
                            .map(|v| (&v.0, String::from_utf8_lossy(&v.1)[..60].to_owned()))
                    ));
                }
            }
            diffs.dedup();
            panic!(
                "{ctx}: no moment of the store: {} entries differ from the nearest moment: {diffs:#?}",
                near.0
            );
        };
        moments.insert(m);
    }
    eprintln!(
        "snapshot_consistency: {} snapshots in {:.1} s while Salt made {} ops: {} distinct moments, \
         every one a prefix of Salt's ops",
        snaps.len(),
        elapsed.as_secs_f64(),
        ops.len(),
        moments.len()
    );
    assert!(
        tombstones_seen > 0,
        "no snapshot carried a tombstone of Salt's removals"
    );
    assert!(
        moments.len() >= snaps.len() / 2 && moments.len() >= 10,
        "Salt's writer hardly moved during the snapshots: {} moments in {} snapshots",
        moments.len(),
        snaps.len()
    );
}
