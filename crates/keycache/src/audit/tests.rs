//! The audit records and the log: times, change names, JSON lines both
//! ways, torn lines and rotation.

use super::*;
use std::time::{Duration, UNIX_EPOCH};

fn pem(n: u8) -> Vec<u8> {
    format!("-----BEGIN PUBLIC KEY-----\nAAAA{n}\n-----END PUBLIC KEY-----\n").into_bytes()
}

fn actor() -> Actor {
    Actor {
        user: Some("root".into()),
        sudo_user: Some("alice".into()),
        program: "keycache".into(),
        master: Some("m1".into()),
        reason: Some("CHG-1".into()),
        action: None,
    }
}

#[test]
fn times_are_rfc3339_utc_and_read_back() {
    let t = UNIX_EPOCH + Duration::from_millis(1_795_925_106_789);
    let s = rfc3339(t);
    assert_eq!(s, "2026-11-29T04:05:06.789Z");
    assert_eq!(parse_time(&s), Some(1_795_925_106_789));
    assert_eq!(
        parse_time("2026-11-29T05:05:06.789+01:00"),
        Some(1_795_925_106_789)
    );
    assert_eq!(parse_time("2026-11-29"), Some(1_795_910_400_000));
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    for bad in [
        "",
        "2026-13-01",
        "2026-11-29T25:00:00Z",
        "yesterday",
        "2026-11-29T04:05",
    ] {
        assert_eq!(parse_time(bad), None, "{bad}");
    }
}

#[test]
fn a_change_is_named_by_the_states_of_the_entry_acted_on() {
    let a = actor();
    let none = Entries::default();
    let pending = Entries {
        key: Some((KeyState::Pending, pem(1))),
        denied: None,
    };
    let accepted = Entries {
        key: Some((KeyState::Accepted, pem(1))),
        denied: None,
    };
    let t = SystemTime::now();
    let r = Record::of_change(&a, "m", &none, &pending, t).unwrap();
    assert_eq!(
        (r.action.as_str(), r.from, r.to.as_deref()),
        ("sign-in", None, Some("pending"))
    );
    assert_eq!(r.finger, Some(crate::pem::finger(&pem(1))));
    let r = Record::of_change(&a, "m", &pending, &accepted, t).unwrap();
    assert_eq!(r.action, "accept");
    assert_eq!(r.replaced_finger, None);
    assert!(Record::of_change(&a, "m", &accepted, &accepted, t).is_none());
    // A deny moves the key from one bank to the other.
    let denied = Entries {
        key: None,
        denied: Some(pem(2)),
    };
    let r = Record::of_change(&a, "m", &pending, &denied, t).unwrap();
    assert_eq!(
        (r.action.as_str(), r.from.as_deref(), r.to.as_deref()),
        ("deny", Some("pending"), Some("denied"))
    );
    assert_eq!(r.finger, Some(crate::pem::finger(&pem(2))));
    assert_eq!(r.replaced_finger, Some(crate::pem::finger(&pem(1))));
    // Deleting the accepted key of an id that also has a denied key.
    let both = Entries {
        key: Some((KeyState::Accepted, pem(1))),
        denied: Some(pem(2)),
    };
    let r = Record::of_change(&a, "m", &both, &denied, t).unwrap();
    assert_eq!(
        (r.action.as_str(), r.from.as_deref(), r.to),
        ("delete", Some("accepted"), None)
    );
    assert_eq!(r.finger, Some(crate::pem::finger(&pem(1))));
    // A merge names itself.
    let m = Actor {
        action: Some("merge".into()),
        ..actor()
    };
    assert_eq!(
        Record::of_change(&m, "m", &accepted, &none, t)
            .unwrap()
            .action,
        "merge"
    );
}

/// The log's JSON is JSON: what it writes any JSON reader reads, with
/// every character of free text kept, and what a JSON writer makes of
/// a record reads back.
#[test]
fn records_are_json_both_ways() {
    let r = Record {
        reason: Some("a \"quoted\" \\ reason\n\t\u{1}\u{2028} é 🔑".into()),
        revision: Some(-3),
        ..Record::of_change(
            &actor(),
            "m",
            &Entries::default(),
            &Entries {
                key: Some((KeyState::Pending, pem(1))),
                denied: None,
            },
            SystemTime::now(),
        )
        .unwrap()
    };
    let line = r.to_line();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["reason"], r.reason.clone().unwrap());
    assert_eq!(v["revision"], -3);
    assert_eq!(v["to"], "pending");
    assert!(v["from"].is_null());
    assert_eq!(Record::from_line(&line), Some(r.clone()));
    // Another writer's spacing, order and escapes.
    let mut o = v.as_object().unwrap().clone();
    o.insert("id".into(), "\u{e9}\u{1f511}".into());
    let other = serde_json::to_string_pretty(&serde_json::Value::Object(o)).unwrap();
    let back = Record::from_line(&other.replace('é', "\\u00e9")).unwrap();
    assert_eq!(back.id, "é🔑");
    assert_eq!(back.reason, r.reason);
    for bad in [
        "",
        "{",
        "{\"time\":1}",
        "{\"id\":\"m\"} x",
        "[1]",
        "{\"time\":\"t\",\"id\":\"m\",\"action\":\"a\",\"program\":\"p\",\"revision\":\"7\"}",
    ] {
        assert_eq!(Record::from_line(bad), None, "{bad}");
    }
}

#[test]
fn the_log_reads_back_skips_torn_lines_and_rotates() {
    let d = tempfile::tempdir().unwrap();
    let a = actor();
    let none = Entries::default();
    let pending = Entries {
        key: Some((KeyState::Pending, pem(1))),
        denied: None,
    };
    let mut r = Record::of_change(&a, "m1", &none, &pending, SystemTime::now()).unwrap();
    r.revision = Some(7);
    append(d.path(), std::slice::from_ref(&r)).unwrap();
    let mode = std::fs::metadata(path(d.path())).unwrap().permissions();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.mode() & 0o777, 0o600);
    // A torn line, as a kill leaves it.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path(d.path()))
        .unwrap();
    f.write_all(b"{\"time\":\"2026").unwrap();
    let mut r2 = r.clone();
    r2.id = "m2".into();
    r2.revision = Some(9);
    append(d.path(), std::slice::from_ref(&r2)).unwrap();
    let (all, torn) = read(d.path()).unwrap();
    assert_eq!(all, vec![r.clone(), r2.clone()]);
    assert_eq!(torn, 1);
    assert_eq!(logged_after(d.path(), 7).unwrap(), vec![r2.clone()]);
    assert_eq!(
        logged_after(d.path(), 6).unwrap(),
        vec![r.clone(), r2.clone()]
    );
    assert_eq!(logged_after(d.path(), 9).unwrap(), vec![]);
    // Past the size, the log moves to .1 and a new one begins.
    let big = Record {
        reason: Some("x".repeat(ROTATE_AT as usize)),
        ..r2.clone()
    };
    append(d.path(), std::slice::from_ref(&big)).unwrap();
    assert!(rotated(d.path(), 1).exists());
    // The new log does not reach back to revision 8: the rotated one is
    // read too.
    let after: Vec<String> = logged_after(d.path(), 8)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(after, ["m2", "m2"]);
    assert_eq!(logged_after(d.path(), 9).unwrap(), vec![]);
    append(d.path(), std::slice::from_ref(&r)).unwrap();
    let (all, _) = read(d.path()).unwrap();
    assert_eq!(all.last(), Some(&r));
    assert_eq!(all.len(), 4);
}
