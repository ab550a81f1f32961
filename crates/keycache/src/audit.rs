//! The audit trail: who changed which key, when, from what to what, and
//! why.
//!
//! Salt records none of it. Every keycache writer of the key state records
//! each change it makes as one [`Record`]: the CLI and the Salt driver
//! writing a local store do it through [`crate::Store::set_audit`] (the
//! records appended under the `keys` bank's lock, **before** the banks are
//! written); in etcd mode the writer puts them into etcd in the change's
//! own transaction, and every replicator appends those it applies to its
//! store's log (the `keycache-etcd` crate). So each master holds the
//! cluster's whole trail, whichever master made the change.
//!
//! # The log
//!
//! ```text
//! .keycache-audit.log      JSON lines, one record each, mode 0600, appended
//! .keycache-audit.log.1 .. .keycache-audit.log.4   rotated, .1 the newest
//! ```
//!
//! in the store directory. A write that would take the log past
//! [`ROTATE_AT`] bytes first renames it to `.1` (and `.1` to `.2`, and so
//! on; the fifth is dropped). Each append is fsynced before the change it
//! records is written: a kill between the two leaves a record of a change
//! that was not made (each id of a batch is then as before or as after),
//! never a change without its record. A line torn by a kill is skipped by
//! readers, and the next append starts on a new line.
//!
//! # Fields
//!
//! `time` (UTC, RFC 3339, milliseconds), `id`, `action` (`sign-in`,
//! `accept`, `reject`, `delete`, `deny`, or what made the change as a whole:
//! `merge`, `repair`), `from` and `to` (Salt's state names, `denied`, or
//! null for no key), `finger` (Salt's `pem_finger` of the key written, or
//! for a deletion of the key removed), `replaced_finger` (of another key
//! the change replaced), `user`, `sudo_user`, `program`, `master`, `reason`
//! and, in etcd mode, `revision` (the etcd revision that committed it).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::format::AUDIT_LOG_FILE;
use crate::key::KeyState;

/// Size past which an append rotates the log first.
pub const ROTATE_AT: u64 = 16 << 20;
/// Rotated logs kept (`.1` to `.4`).
pub const KEEP: u32 = 4;

/// Who makes a change, and why: what every record of it carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actor {
    /// The OS user the writer runs as.
    pub user: Option<String>,
    /// The user behind `sudo` (`SUDO_USER`), if any.
    pub sudo_user: Option<String>,
    /// The program: `keycache`, `salt-key`, `salt-master`, `salt-run`, ...
    pub program: String,
    /// The master config's `id`.
    pub master: Option<String>,
    /// The operator's reason (`--reason`).
    pub reason: Option<String>,
    /// The action of every record, when the change is one as a whole (a
    /// `merge`, a `repair`); else each record's is read from its states
    /// ([`action_of`]).
    pub action: Option<String>,
}

/// One id's entries in both banks, before or after a change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    /// The `keys` bank's entry.
    pub key: Option<(KeyState, Vec<u8>)>,
    /// The `denied_keys` bank's key.
    pub denied: Option<Vec<u8>>,
}

/// One change of one id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// UTC, RFC 3339 with milliseconds.
    pub time: String,
    /// The minion id.
    pub id: String,
    /// What was done.
    pub action: String,
    /// The state before (`accepted`, `pending`, `rejected`, `denied`), or
    /// None: no key.
    pub from: Option<String>,
    /// The state after.
    pub to: Option<String>,
    /// The fingerprint of the key written, or of the key removed.
    pub finger: Option<String>,
    /// The fingerprint of another key that the change replaced.
    pub replaced_finger: Option<String>,
    /// See [`Actor::user`].
    pub user: Option<String>,
    /// See [`Actor::sudo_user`].
    pub sudo_user: Option<String>,
    /// See [`Actor::program`].
    pub program: String,
    /// See [`Actor::master`].
    pub master: Option<String>,
    /// See [`Actor::reason`].
    pub reason: Option<String>,
    /// The etcd revision that committed it (etcd mode).
    pub revision: Option<i64>,
}

/// The action a change from `from` to `to` is, as an operator names it.
pub fn action_of(from: Option<&str>, to: Option<&str>) -> &'static str {
    match to {
        Some("accepted") => "accept",
        Some("rejected") => "reject",
        Some("denied") => "deny",
        Some(_) if from.is_none() || from == Some("pending") => "sign-in",
        Some(_) => "pending",
        None => "delete",
    }
}

impl Record {
    /// The record of `id` going from `before` to `after` by `actor` at
    /// `time`; None when nothing changed. The states are those of the
    /// entry acted on: of the `keys` bank when it changed (`denied` when
    /// the key moved to, or came from, the `denied_keys` bank), else of the
    /// `denied_keys` bank.
    pub fn of_change(
        actor: &Actor,
        id: &str,
        before: &Entries,
        after: &Entries,
        time: SystemTime,
    ) -> Option<Record> {
        if before == after {
            return None;
        }
        let denied_changed = before.denied != after.denied;
        let side = |e: &Entries, other: &Entries| -> Option<(String, Vec<u8>)> {
            if before.key != after.key {
                match &e.key {
                    Some((s, p)) => Some((s.name().to_owned(), p.clone())),
                    None if denied_changed && other.denied != e.denied => {
                        e.denied.clone().map(|p| ("denied".to_owned(), p))
                    }
                    None => None,
                }
            } else {
                e.denied.clone().map(|p| ("denied".to_owned(), p))
            }
        };
        let from = side(before, after);
        let to = side(after, before);
        let action = actor.action.clone().unwrap_or_else(|| {
            action_of(
                from.as_ref().map(|f| f.0.as_str()),
                to.as_ref().map(|t| t.0.as_str()),
            )
            .to_owned()
        });
        let finger = to
            .as_ref()
            .or(from.as_ref())
            .map(|k| crate::pem::finger(&k.1));
        let replaced_finger = match (&from, &to) {
            (Some(f), Some(t)) if f.1 != t.1 => Some(crate::pem::finger(&f.1)),
            _ => None,
        };
        Some(Record {
            time: rfc3339(time),
            id: id.to_owned(),
            action,
            from: from.map(|f| f.0),
            to: to.map(|t| t.0),
            finger,
            replaced_finger,
            user: actor.user.clone(),
            sudo_user: actor.sudo_user.clone(),
            program: actor.program.clone(),
            master: actor.master.clone(),
            reason: actor.reason.clone(),
            revision: None,
        })
    }

    /// The fields, in the documented order.
    fn fields(&self) -> [(&'static str, Field<'_>); 13] {
        fn s(v: &Option<String>) -> Field<'_> {
            v.as_deref().map_or(Field::Null, Field::Str)
        }
        [
            ("time", Field::Str(&self.time)),
            ("id", Field::Str(&self.id)),
            ("action", Field::Str(&self.action)),
            ("from", s(&self.from)),
            ("to", s(&self.to)),
            ("finger", s(&self.finger)),
            ("replaced_finger", s(&self.replaced_finger)),
            ("user", s(&self.user)),
            ("sudo_user", s(&self.sudo_user)),
            ("program", Field::Str(&self.program)),
            ("master", s(&self.master)),
            ("reason", s(&self.reason)),
            ("revision", self.revision.map_or(Field::Null, Field::Int)),
        ]
    }

    /// The record as one line of JSON, the fields in the documented order
    /// (what `keycache history --json` prints), with its newline.
    pub fn to_line(&self) -> String {
        let mut s = String::from("{");
        for (i, (k, v)) in self.fields().iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            json::string(&mut s, k);
            s.push(':');
            match v {
                Field::Str(t) => json::string(&mut s, t),
                Field::Int(n) => s.push_str(&n.to_string()),
                Field::Null => s.push_str("null"),
            }
        }
        s.push_str("}\n");
        s
    }

    /// Reads one line of the log (a JSON object of the fields above, in
    /// any order); None for a torn or foreign line.
    pub fn from_line(line: &str) -> Option<Record> {
        let mut m = json::object(line.trim())?;
        let mut opt = |k: &str| -> Option<Option<String>> {
            match m.remove(k) {
                None | Some(json::Value::Null) => Some(None),
                Some(json::Value::Str(s)) => Some(Some(s)),
                Some(json::Value::Int(_)) => None,
            }
        };
        let req = |v: Option<Option<String>>| v.flatten();
        Some(Record {
            time: req(opt("time"))?,
            id: req(opt("id"))?,
            action: req(opt("action"))?,
            from: opt("from")?,
            to: opt("to")?,
            finger: opt("finger")?,
            replaced_finger: opt("replaced_finger")?,
            user: opt("user")?,
            sudo_user: opt("sudo_user")?,
            program: req(opt("program"))?,
            master: opt("master")?,
            reason: opt("reason")?,
            revision: match m.remove("revision") {
                None | Some(json::Value::Null) => None,
                Some(json::Value::Int(n)) => Some(n),
                Some(json::Value::Str(_)) => return None,
            },
        })
    }

    /// Milliseconds since the Unix epoch of [`Record::time`].
    pub fn millis(&self) -> Option<i64> {
        parse_time(&self.time)
    }
}

/// One field's value, as the log writes it.
enum Field<'a> {
    Str(&'a str),
    Int(i64),
    Null,
}

/// The JSON of the log: a flat object of strings, integers and nulls, all
/// the log ever holds, so the engine needs no JSON library.
mod json {
    use std::collections::HashMap;

    /// A value of the log's objects.
    pub(super) enum Value {
        Str(String),
        Int(i64),
        Null,
    }

    /// Appends `t` as a JSON string.
    pub(super) fn string(out: &mut String, t: &str) {
        out.push('"');
        for c in t.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                    out.push_str(&format!("\\u{:04x}", c as u32))
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    /// Reads a flat JSON object (string, integer or null values); None for
    /// anything else.
    pub(super) fn object(s: &str) -> Option<HashMap<String, Value>> {
        let mut p = Parser {
            s: s.as_bytes(),
            i: 0,
        };
        let mut m = HashMap::new();
        p.expect(b'{')?;
        if !p.eat(b'}') {
            loop {
                let k = p.string()?;
                p.expect(b':')?;
                let v = p.value()?;
                m.insert(k, v);
                if p.eat(b'}') {
                    break;
                }
                p.expect(b',')?;
            }
        }
        p.ws();
        (p.i == p.s.len()).then_some(m)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.s.get(self.i).is_some_and(|b| b" \t\r\n".contains(b)) {
                self.i += 1;
            }
        }

        fn eat(&mut self, b: u8) -> bool {
            self.ws();
            let hit = self.s.get(self.i) == Some(&b);
            self.i += usize::from(hit);
            hit
        }

        fn expect(&mut self, b: u8) -> Option<()> {
            self.eat(b).then_some(())
        }

        fn value(&mut self) -> Option<Value> {
            self.ws();
            match self.s.get(self.i)? {
                b'"' => self.string().map(Value::Str),
                b'n' => {
                    let hit = self.s.get(self.i..self.i + 4) == Some(b"null");
                    self.i += 4;
                    hit.then_some(Value::Null)
                }
                _ => {
                    let start = self.i;
                    self.i += usize::from(self.s.get(self.i) == Some(&b'-'));
                    while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                        self.i += 1;
                    }
                    std::str::from_utf8(&self.s[start..self.i])
                        .ok()?
                        .parse()
                        .ok()
                        .map(Value::Int)
                }
            }
        }

        fn hex4(&mut self) -> Option<u32> {
            let h = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
            self.i += 4;
            u32::from_str_radix(h, 16).ok()
        }

        fn string(&mut self) -> Option<String> {
            self.expect(b'"')?;
            let mut out = Vec::new();
            loop {
                let b = *self.s.get(self.i)?;
                self.i += 1;
                match b {
                    b'"' => return String::from_utf8(out).ok(),
                    b'\\' => {
                        let e = *self.s.get(self.i)?;
                        self.i += 1;
                        let c = match e {
                            b'"' => '"',
                            b'\\' => '\\',
                            b'/' => '/',
                            b'b' => '\u{8}',
                            b'f' => '\u{c}',
                            b'n' => '\n',
                            b'r' => '\r',
                            b't' => '\t',
                            b'u' => {
                                let hi = self.hex4()?;
                                let code = if (0xd800..0xdc00).contains(&hi) {
                                    if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                                        return None;
                                    }
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if !(0xdc00..0xe000).contains(&lo) {
                                        return None;
                                    }
                                    0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                                } else {
                                    hi
                                };
                                char::from_u32(code)?
                            }
                            _ => return None,
                        };
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                    b if b < 0x20 => return None,
                    b => out.push(b),
                }
            }
        }
    }
}

/// The path of the log of the store in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(AUDIT_LOG_FILE)
}

/// The path of the `n`th rotated log (1: the newest).
fn rotated(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("{AUDIT_LOG_FILE}.{n}"))
}

fn open_append(p: &Path, dir: &Path) -> Result<(std::fs::File, bool)> {
    let created = std::fs::symlink_metadata(p).is_err();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .read(true)
        .mode(crate::files::DEFAULT_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(p)
        .map_err(|e| Error::io(p, "open", e))?;
    let meta = f.metadata().map_err(|e| Error::io(p, "stat", e))?;
    if !meta.is_file() {
        return Err(Error::NotARegularFile {
            path: p.to_path_buf(),
            why: "it is not a regular file",
        });
    }
    if created {
        Ownership::for_dir(dir)?.apply(&f, p)?;
    }
    Ok((f, created))
}

/// Shifts the rotated logs up by one and the log to `.1`.
fn rotate(dir: &Path) -> Result<()> {
    for n in (1..KEEP).rev() {
        let from = rotated(dir, n);
        if std::fs::symlink_metadata(&from).is_ok() {
            let to = rotated(dir, n + 1);
            std::fs::rename(&from, &to).map_err(|e| Error::io(&from, "rename", e))?;
        }
    }
    let p = path(dir);
    std::fs::rename(&p, rotated(dir, 1)).map_err(|e| Error::io(&p, "rename", e))?;
    crate::files::sync_dir(dir)
}

/// Appends `records` to the log of the store in `dir`, durably (fsynced;
/// the directory too when the file is new), rotating it first when it
/// would grow past [`ROTATE_AT`]. Call it holding the lock that orders the
/// changes recorded (a bank's, or the replicator's).
pub fn append(dir: &Path, records: &[Record]) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let mut bytes = Vec::new();
    for r in records {
        bytes.extend_from_slice(r.to_line().as_bytes());
    }
    let p = path(dir);
    let (mut f, mut created) = open_append(&p, dir)?;
    let len = f.metadata().map_err(|e| Error::io(&p, "stat", e))?.len();
    if len > 0 && len + bytes.len() as u64 > ROTATE_AT {
        drop(f);
        rotate(dir)?;
        (f, created) = open_append(&p, dir)?;
    } else if len > 0 {
        // A line torn by a kill is left alone; this append starts anew.
        let mut last = [0u8; 1];
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut last, len - 1)
            .map_err(|e| Error::io(&p, "read", e))?;
        if last[0] != b'\n' {
            bytes.insert(0, b'\n');
        }
    }
    f.write_all(&bytes)
        .map_err(|e| Error::io(&p, "append to", e))?;
    crate::files::sync_data(&f, &p)?;
    if created {
        crate::files::sync_dir(dir)?;
    }
    Ok(())
}

/// Every record of the store in `dir`, oldest first (the rotated logs,
/// then the log), and how many lines could not be read (torn by a kill).
pub fn read(dir: &Path) -> Result<(Vec<Record>, usize)> {
    let mut out = Vec::new();
    let mut torn = 0;
    let files = (1..=KEEP).rev().map(|n| rotated(dir, n)).chain([path(dir)]);
    for p in files {
        let mut f = match crate::files::open_regular(&p, false) {
            Ok(f) => f,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                continue
            }
            Err(e) => return Err(e),
        };
        let mut text = String::new();
        let mut b = Vec::new();
        f.read_to_end(&mut b)
            .map_err(|e| Error::io(&p, "read", e))?;
        text.push_str(&String::from_utf8_lossy(&b));
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match Record::from_line(line) {
                Some(r) => out.push(r),
                None => torn += 1,
            }
        }
    }
    Ok((out, torn))
}

/// The highest etcd revision the log of `dir` records (0: none): the
/// records of later revisions are the ones a replicator has yet to append.
pub fn last_revision(dir: &Path) -> Result<i64> {
    // The current log holds the newest; a log just rotated holds none.
    for p in [path(dir), rotated(dir, 1)] {
        let mut f = match crate::files::open_regular(&p, false) {
            Ok(f) => f,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                continue
            }
            Err(e) => return Err(e),
        };
        let mut b = Vec::new();
        f.read_to_end(&mut b)
            .map_err(|e| Error::io(&p, "read", e))?;
        let best = String::from_utf8_lossy(&b)
            .lines()
            .filter_map(Record::from_line)
            .filter_map(|r| r.revision)
            .max();
        if let Some(r) = best {
            return Ok(r);
        }
    }
    Ok(0)
}

/// `t` as RFC 3339 in UTC with milliseconds (`2026-11-29T04:05:06.789Z`;
/// a time before 1970 as 1970's first).
pub fn rfc3339(t: SystemTime) -> String {
    let ns = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    crate::hlc::show(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// Milliseconds since the Unix epoch of an RFC 3339 time
/// (`YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`), or of a date alone
/// (`YYYY-MM-DD`, its midnight UTC); None for anything else.
pub fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    let num = |a: usize, b: usize| -> Option<i64> {
        let t = s.get(a..b)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if s.get(4..5)? != "-"
        || s.get(7..8)? != "-"
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
    {
        return None;
    }
    let days = days_from_civil(y, m, d);
    if s.len() == 10 {
        return Some(days * 86_400_000);
    }
    if !matches!(s.get(10..11)?, "T" | "t" | " ") || s.get(13..14)? != ":" || s.get(16..17)? != ":"
    {
        return None;
    }
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut milli = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        let digits = &frac[..n];
        milli = format!("{:0<3}", &digits[..n.min(3)]).parse::<i64>().ok()?;
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let hh: i64 = o.get(1..3)?.parse().ok()?;
            let mm: i64 = o.get(4..6)?.parse().ok()?;
            let v = (hh * 60 + mm) * 60_000;
            if o.starts_with('-') {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    Some(days * 86_400_000 + ((h * 60 + mi) * 60 + sec) * 1000 + milli - offset)
}

/// Days since 1970-01-01 of a (year, month, day).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        assert_eq!(last_revision(d.path()).unwrap(), 9);
        // Past the size, the log moves to .1 and a new one begins.
        let big = Record {
            reason: Some("x".repeat(ROTATE_AT as usize)),
            ..r2.clone()
        };
        append(d.path(), std::slice::from_ref(&big)).unwrap();
        append(d.path(), std::slice::from_ref(&r)).unwrap();
        assert!(rotated(d.path(), 1).exists());
        let (all, _) = read(d.path()).unwrap();
        assert_eq!(all.last(), Some(&r));
        assert_eq!(all.len(), 4);
    }
}
