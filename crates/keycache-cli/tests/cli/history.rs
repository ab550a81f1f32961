//! The audit trail through the CLI: `accept`, `reject`, `deny`, `delete`
//! and `merge` record each change they make to a local store (who, which
//! program and master, why, the key's fingerprint), and `keycache history`
//! shows the records: by id, since a time, as text or JSON lines. A
//! change refused by `--finger` leaves no record. A writer killed at
//! random moments leaves, for every id, the state its last record names
//! (after, or before: a change recorded but not made), never a change
//! without its record.
//!
//! Scale the kill test with `KEYCACHE_AUDIT_KILLS` (default 100).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use keycache::audit::parse_time;
use keycache::pem::finger;
use keycache::{KeyState, MinionId};
use keycache_testkit::rng::Rng;
use serde_json::Value;

use crate::common::{
    self, env_u64, files, files_changed, keycache_ok_json, open, pem, s, sized, stderr, stdout,
    TestCommand, SIZE_1009,
};

fn id(s: &str) -> MinionId {
    MinionId::new(s).unwrap()
}

/// The keycache binary with `args`, run as no `sudo` user unless `sudo`
/// names one (`SUDO_USER`).
fn kc(args: &[&str], sudo: Option<&str>) -> TestCommand {
    let mut c = common::kc();
    c.args(args);
    match sudo {
        Some(u) => {
            c.env("SUDO_USER", u);
        }
        None => {
            c.cmd().env_remove("SUDO_USER");
        }
    }
    c
}

/// `keycache history ARGS --json`, which must succeed: its records.
fn history(args: &[&str]) -> Vec<Value> {
    let mut a = vec!["history"];
    a.extend(args);
    a.push("--json");
    let out = kc(&a, None).ok();
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// The user the tests run as, by name.
fn user_name() -> String {
    uzers::get_effective_username()
        .and_then(|u| u.into_string().ok())
        .unwrap_or_else(|| format!("uid {}", uzers::get_effective_uid()))
}

/// The host's name, as `uname -n` prints it.
fn host_name() -> String {
    let o = std::process::Command::new("uname")
        .arg("-n")
        .output()
        .unwrap();
    String::from_utf8(o.stdout).unwrap().trim().to_owned()
}

/// A config directory `etc` whose `master` names `pki` as pki_dir (size
/// 1009), with `extra` lines; `pki` holds a store with `ids` pending, each
/// with its own key.
fn configured(t: &Path, extra: &str, ids: &[&str]) -> (PathBuf, PathBuf) {
    let (etc, pki, _) = crate::common::configured_store(t, extra, ids, key);
    (etc, pki)
}

/// The key of `id` in these tests.
fn key(id: &str) -> String {
    pem(&format!("{id} key"), 400)
}

/// The (action, from, to) of each record.
fn moves(records: &[Value]) -> Vec<(String, Value, Value)> {
    records
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap().to_owned(),
                r["from"].clone(),
                r["to"].clone(),
            )
        })
        .collect()
}

#[test]
fn every_change_is_recorded_with_who_why_and_the_key() {
    let t = tempfile::tempdir().unwrap();
    let (etc, pki) = configured(t.path(), "id: m1\n", &["web-1", "web-2"]);
    let c = s(&etc);

    // No log yet: nothing, exit 0, no note.
    let o = kc(&["history", "-c", c], None).ok_output();
    assert_eq!(stdout(&o), "");
    assert!(!stderr(&o).contains("skipped"), "{}", stderr(&o));
    assert_eq!(history(&["-c", c]), Vec::<Value>::new());

    // `get`'s fingerprint is Salt's pem_finger of the key's bytes.
    let f = finger(key("web-1").as_bytes());
    assert_eq!(
        keycache_ok_json(&["get", "-c", c, "web-1", "--json"])["finger"],
        f.as_str()
    );

    kc(
        &["accept", "-c", c, "web-1", "--reason", "CHG-1"],
        Some("alice"),
    )
    .ok();
    // A fingerprint that is not the key's: refused, nothing recorded.
    let before = files(&pki);
    let other = finger(key("web-2").as_bytes());
    kc(
        &[
            "reject",
            "-c",
            c,
            "web-1",
            "--include-all",
            "--finger",
            &other,
        ],
        None,
    )
    .fails(2);
    assert_eq!(files_changed(&before, &files(&pki)), Vec::<String>::new());
    assert_eq!(history(&["-c", c]).len(), 1);

    kc(
        &["reject", "-c", c, "web-1", "--include-all", "--finger", &f],
        None,
    )
    .ok();
    kc(&["deny", "-c", c, "web-1", "--include-all"], None).ok();
    kc(&["accept", "-c", c, "web-2"], None).ok();
    kc(&["delete", "-c", c, "web-1"], None).ok();
    // Nothing to do: nothing recorded.
    kc(&["accept", "-c", c, "web-2"], None).fails(1);

    let all = history(&["-c", c]);
    assert_eq!(all.len(), 5, "{all:#?}");
    let rs = history(&["-c", c, "web-1"]);
    let n = |s: &str| Value::from(s);
    assert_eq!(
        moves(&rs),
        vec![
            ("accept".into(), n("pending"), n("accepted")),
            ("reject".into(), n("accepted"), n("rejected")),
            ("deny".into(), n("rejected"), n("denied")),
            ("delete".into(), n("denied"), Value::Null),
        ]
    );
    let user = user_name();
    let mut last = i64::MIN;
    for (i, r) in rs.iter().enumerate() {
        assert_eq!(r["id"], "web-1");
        assert_eq!(r["finger"], f.as_str(), "{r}");
        assert_eq!(r["replaced_finger"], Value::Null, "{r}");
        assert_eq!(r["user"], user.as_str(), "{r}");
        assert_eq!(r["program"], "keycache", "{r}");
        assert_eq!(r["master"], "m1", "{r}");
        assert_eq!(r["revision"], Value::Null, "{r}");
        let (sudo, reason) = if i == 0 {
            (n("alice"), n("CHG-1"))
        } else {
            (Value::Null, Value::Null)
        };
        assert_eq!((&r["sudo_user"], &r["reason"]), (&sudo, &reason), "{r}");
        let ms = parse_time(r["time"].as_str().unwrap()).expect("an RFC 3339 time");
        assert!(ms >= last, "newest last: {rs:#?}");
        last = ms;
    }
    let web2 = history(&["--master-config", s(&etc.join("master")), "web-2"]);
    assert_eq!(
        moves(&web2),
        vec![("accept".into(), n("pending"), n("accepted"))]
    );
    assert_eq!(web2[0]["finger"], other.as_str());
    assert_eq!(
        all.iter()
            .filter(|r| r["id"] == "web-1")
            .cloned()
            .collect::<Vec<_>>(),
        rs
    );
    // The store directory given, without the config.
    assert_eq!(history(&[s(&pki), "web-1"]), rs);

    // --since: the records of that time or later, in RFC 3339 (with an
    // offset too) or a date.
    let t1 = rs[1]["time"].as_str().unwrap().to_owned();
    let since = parse_time(&t1).unwrap();
    let expect: Vec<Value> = all
        .iter()
        .filter(|r| parse_time(r["time"].as_str().unwrap()).unwrap() >= since)
        .cloned()
        .collect();
    assert!(expect.len() >= 3, "{expect:#?}");
    assert!(!expect.contains(&rs[0]) || rs[0]["time"] == rs[1]["time"]);
    assert_eq!(history(&["-c", c, "--since", &t1]), expect);
    // The same moment an hour east of UTC.
    let east = keycache::audit::rfc3339(
        std::time::UNIX_EPOCH + Duration::from_millis(since as u64 + 3_600_000),
    )
    .replace('Z', "+01:00");
    assert_eq!(history(&["-c", c, "--since", &east]), expect);
    assert_eq!(history(&["-c", c, "--since", "2000-01-01"]), all);
    assert_eq!(
        history(&["-c", c, "--since", "2999-01-01"]),
        Vec::<Value>::new()
    );
    assert_eq!(
        history(&["-c", c, "web-1", "--since", &t1]),
        expect
            .iter()
            .filter(|r| r["id"] == "web-1")
            .cloned()
            .collect::<Vec<_>>()
    );
    for bad in ["yesterday", "2026-13-01", "2026-11-29T04:05"] {
        let err = kc(&["history", "-c", c, "--since", bad], None).fails(2);
        assert!(err.contains(bad) && err.contains("--since"), "{err}");
    }
    kc(&["history", "-c", c, "web-1", "web-2"], None).fails(2);

    // The text: a line a record, in aligned columns.
    let text = kc(&["history", "-c", c, "web-1"], None).ok();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let short = format!("{}\u{2026}", &f[..16]);
    let col = |l: &str, w: &str| l.find(w).unwrap_or_else(|| panic!("{w:?} in {l:?}"));
    for ((l, r), (action, from_to)) in lines.iter().zip(&rs).zip([
        ("accept", "pending -> accepted"),
        ("reject", "accepted -> rejected"),
        ("deny", "rejected -> denied"),
        ("delete", "denied -> -"),
    ]) {
        assert!(l.contains("web-1") && l.contains(action), "{l}");
        assert!(l.contains(from_to), "{l}");
        assert!(l.contains(&user) && l.contains(" m1 "), "{l}");
        assert!(l.ends_with(&short) && !l.contains(&f), "{l}");
        assert!(l.starts_with(r["time"].as_str().unwrap()), "{l}");
        assert!(!l.contains('\u{1b}'), "no colour off a terminal: {l}");
    }
    assert!(
        lines[0].contains(&format!("{user} (alice)")),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("CHG-1"), "{}", lines[0]);
    assert!(lines[1..]
        .iter()
        .all(|l| !l.contains("CHG-1") && !l.contains("alice")));
    for w in ["keycache", " m1 ", &short] {
        let at: Vec<usize> = lines.iter().map(|l| col(l, w)).collect();
        assert!(
            at.windows(2).all(|p| p[0] == p[1]),
            "{w:?} aligned:\n{text}"
        );
    }

    // A line torn by a kill: skipped, said on stderr.
    let log = pki.join(keycache::format::AUDIT_LOG_FILE);
    let mut b = std::fs::read(&log).unwrap();
    b.extend_from_slice(b"{\"time\":\"2026-");
    std::fs::write(&log, b).unwrap();
    let o = kc(&["history", "-c", c, "--json"], None).ok_output();
    assert_eq!(stdout(&o).lines().count(), all.len());
    assert!(stderr(&o).contains("1 line(s)"), "{}", stderr(&o));
}

#[test]
fn the_master_is_the_configs_id_else_the_hosts() {
    let t = tempfile::tempdir().unwrap();
    let (etc, pki) = configured(t.path(), "", &["a", "b"]);
    kc(&["accept", "-c", s(&etc), "a"], None).ok();
    // A store directory given without a config: no master config read.
    kc(&["accept", s(&pki), "b"], None).args(SIZE_1009).ok();
    let rs = history(&[s(&pki)]);
    assert_eq!(rs.len(), 2, "{rs:#?}");
    assert_eq!(rs[0]["master"], format!("{}_master", host_name()).as_str());
    assert_eq!(rs[1]["master"], Value::Null);
    // No log, no config: nothing.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_eq!(history(&[s(&empty)]), Vec::<Value>::new());
    // No such directory: an error.
    kc(&["history", s(&t.path().join("nowhere"))], None).fails(2);
}

#[test]
fn a_merge_records_its_changes_as_merge() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    common::sample_store(&a);
    common::sample_store(&b);
    let who = "web-04.dc1.example.com";
    kc(&["accept", s(&b), who], None).args(SIZE_1009).ok();
    let snap = t.path().join("snap");
    kc(&["snapshot", s(&b), "-o", s(&snap)], None)
        .args(SIZE_1009)
        .ok();
    kc(
        &[
            "merge",
            s(&a),
            s(&snap),
            "--allow-unknown-cluster",
            "--reason",
            "sync from b",
        ],
        Some("bob"),
    )
    .args(SIZE_1009)
    .no_settle()
    .ok();
    let rs = history(&[s(&a)]);
    assert_eq!(rs.len(), 1, "{rs:#?}");
    let r = &rs[0];
    assert_eq!(
        (r["id"].as_str(), r["action"].as_str()),
        (Some(who), Some("merge"))
    );
    assert_eq!(
        (r["from"].as_str(), r["to"].as_str()),
        (Some("pending"), Some("accepted"))
    );
    assert_eq!(r["reason"], "sync from b");
    assert_eq!(r["sudo_user"], "bob");
    assert_eq!(r["program"], "keycache");
    let st = open(&a, &sized(1009));
    let e = st.get(&id(who)).unwrap().unwrap();
    assert_eq!(r["finger"], finger(&e.public_key).as_str());
    // The store it came from recorded the accept.
    let rb = history(&[s(&b)]);
    assert_eq!(
        moves(&rb),
        vec![("accept".into(), "pending".into(), "accepted".into())]
    );
}

/// An id's state as the records name it (`null`: no key).
fn state_name(st: &keycache::Store, i: &MinionId) -> Value {
    match st.get(i).unwrap() {
        Some(e) => Value::from(e.state.name()),
        None => Value::Null,
    }
}

/// What a kill left, counted.
#[derive(Debug, Default)]
struct KillTally {
    /// Kills that landed while the command ran.
    killed: u64,
    /// ... after it had appended its records.
    after_record: u64,
    /// ids whose last record is a change the kill kept from being made.
    recorded_not_made: u64,
    /// ids changed and recorded.
    made: u64,
    /// Lines torn by a kill.
    torn: usize,
}

/// `keycache accept`/`reject --include-all` of a batch of ids, killed at
/// random moments: after each kill, every id's state is the one it had
/// before unless the command recorded a change of it (then the change's
/// `to`, or its `from`: recorded but not made), and its last record names
/// the state it is in (as `to`, or as `from`).
#[test]
fn a_writer_killed_at_random_moments_leaves_no_change_without_its_record() {
    let rounds = env_u64("KEYCACHE_AUDIT_KILLS", 100);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    // A key tree: the command writes it between the record and its end.
    std::fs::create_dir(dir.join("minions")).unwrap();
    let names: Vec<String> = (0..48).map(|i| format!("minion-{i:02}")).collect();
    let ids: Vec<MinionId> = names.iter().map(|n| id(n)).collect();
    {
        let st = open(&dir, &sized(1009));
        for n in &names {
            st.put(&id(n), KeyState::Pending, key(n).as_bytes())
                .unwrap();
        }
    }
    let fingers: BTreeMap<&str, String> = names
        .iter()
        .map(|n| (n.as_str(), finger(key(n).as_bytes())))
        .collect();
    let mut state: BTreeMap<&str, Value> = names
        .iter()
        .map(|n| (n.as_str(), Value::from("pending")))
        .collect();
    let command = |verb: &str| {
        let mut c = common::kc();
        c.args([verb, s(&dir), "--include-all"])
            .args(&names)
            .args(SIZE_1009);
        c.cmd().env_remove("SUDO_USER");
        c
    };
    // The command that changes most ids.
    let verb = |accepted: usize| {
        if accepted * 2 > names.len() {
            "reject"
        } else {
            "accept"
        }
    };
    let mut seen = 0usize;
    // Whether the command recorded changes, and how many ids are
    // accepted.
    let mut check = |k: u64, tally: &mut KillTally| -> (bool, usize) {
        let (records, torn) = keycache::audit::read(&dir).unwrap();
        tally.torn = torn;
        let new = &records[seen..];
        seen = records.len();
        let st = open(&dir, &sized(1009));
        for (n, i) in names.iter().zip(&ids) {
            let now = state_name(&st, i);
            let before = state[n.as_str()].clone();
            let mine: Vec<_> = new.iter().filter(|r| &r.id == n).collect();
            assert!(mine.len() <= 1, "kill {k}: {n} recorded twice: {mine:?}");
            match mine.first() {
                None => assert_eq!(
                    now, before,
                    "kill {k}: {n} changed from {before} to {now} with no record of it"
                ),
                Some(r) => {
                    let (from, to) = (
                        r.from.as_deref().map_or(Value::Null, Value::from),
                        r.to.as_deref().map_or(Value::Null, Value::from),
                    );
                    assert_eq!(from, before, "kill {k}: {n}: the record's from: {r:?}");
                    assert!(now == to || now == from, "kill {k}: {n} is {now}: {r:?}");
                    assert_eq!(r.finger.as_ref(), Some(&fingers[n.as_str()]), "{r:?}");
                    assert_eq!(r.program, "keycache");
                    if now == to {
                        tally.made += 1;
                    } else {
                        tally.recorded_not_made += 1;
                    }
                }
            }
            // What the audit trail's documentation promises: the last
            // record of the id names the state it is in.
            if let Some(last) = records.iter().rev().find(|r| &r.id == n) {
                let named =
                    [&last.to, &last.from].map(|s| s.as_deref().map_or(Value::Null, Value::from));
                assert!(
                    named.contains(&now),
                    "kill {k}: {n} is {now}, last record {last:?}"
                );
            } else {
                assert_eq!(now, "pending", "kill {k}: {n} changed without a record");
            }
            state.insert(n.as_str(), now);
        }
        let accepted = state.values().filter(|v| *v == "accepted").count();
        (!new.is_empty(), accepted)
    };
    let mut tally = KillTally::default();
    // How long one command takes here (the fastest of three: the first
    // one's binary is cold), the range of the kills' delays, which then
    // follows the machine's load: a command that ended before its kill
    // shortens it, a kill lengthens it a little (a quarter of the
    // commands end).
    let mut whole = u64::MAX;
    let mut accepted = 0;
    for k in 0..3 {
        let v = verb(accepted);
        let start = Instant::now();
        command(v).ok();
        whole = whole.min(start.elapsed().as_micros() as u64);
        let recorded;
        (recorded, accepted) = check(k, &mut tally);
        assert!(recorded, "{v} recorded its changes");
    }
    let mut rng = Rng::new(0x0a0d_17e5_7a11);
    for k in 3..rounds + 3 {
        let v = verb(accepted);
        let mut child = command(v)
            .cmd()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(whole + whole / 4 + 1)));
        let _ = child.kill();
        let status = child.wait().unwrap();
        let recorded;
        (recorded, accepted) = check(k, &mut tally);
        if status.code().is_none() {
            tally.killed += 1;
            if recorded {
                tally.after_record += 1;
            }
            whole += whole / 24;
        } else {
            // Exit 1: an id was already so (the --include-all of ids
            // that a killed command left in both states).
            assert!(
                matches!(status.code(), Some(0 | 1)),
                "kill {k}: {v} failed: {status}"
            );
            whole = (whole - whole / 8).max(1000);
        }
    }
    eprintln!(
        "audit kills: {rounds} rounds of {} ids, kills within {whole} us at the end: {tally:?}",
        names.len()
    );
    assert!(
        tally.killed > rounds / 4,
        "too few kills landed in a command: {tally:?}"
    );
    assert!(
        tally.after_record > 0,
        "no kill landed after a record: {tally:?}"
    );
    // The whole log: each record of an id starts from the state the one
    // before it left (its `to`, or its `from` when it was not made).
    let (records, _) = keycache::audit::read(&dir).unwrap();
    let mut last: BTreeMap<&str, &keycache::audit::Record> = BTreeMap::new();
    for r in &records {
        if let Some(p) = last.get(r.id.as_str()) {
            assert!(r.from == p.to || r.from == p.from, "{p:?} then {r:?}");
        } else {
            assert_eq!(r.from.as_deref(), Some("pending"), "{r:?}");
        }
        last.insert(r.id.as_str(), r);
    }
}
