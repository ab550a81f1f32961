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
use std::time::SystemTime;

use crate::error::{Error, Result};
use crate::files::Ownership;
use crate::format::AUDIT_LOG_FILE;
use crate::key::KeyState;

mod json;

pub use crate::clock::{parse_time, rfc3339};

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

impl Actor {
    /// A record of `id` by this actor at `time`, with no states and no
    /// fingerprint (an entry that could not be read), its action this
    /// actor's (else `change`): what [`Record::of_change`] fills in.
    pub fn record(&self, id: &str, time: SystemTime) -> Record {
        Record {
            time: rfc3339(time),
            id: id.to_owned(),
            action: self.action.clone().unwrap_or_else(|| "change".to_owned()),
            user: self.user.clone(),
            sudo_user: self.sudo_user.clone(),
            program: self.program.clone(),
            master: self.master.clone(),
            reason: self.reason.clone(),
            ..Record::default()
        }
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
            action,
            from: from.map(|f| f.0),
            to: to.map(|t| t.0),
            finger,
            replaced_finger,
            ..actor.record(id, time)
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
        .custom_flags(crate::files::NO_FOLLOW)
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
            Err(e) if e.is_not_found() => continue,
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

/// The records the log of `dir` holds of etcd revisions after `revision`,
/// oldest first: those a replicator whose store records `revision` may be
/// given again (it appends before it records the revision applied), and
/// must not log twice.
pub fn logged_after(dir: &Path, revision: i64) -> Result<Vec<Record>> {
    let mut out: Vec<Record> = Vec::new();
    // The current log holds the newest; the rotated one is read too when
    // the current may not reach back that far (a log just rotated).
    for p in [path(dir), rotated(dir, 1)] {
        let mut f = match crate::files::open_regular(&p, false) {
            Ok(f) => f,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let mut b = Vec::new();
        f.read_to_end(&mut b)
            .map_err(|e| Error::io(&p, "read", e))?;
        let logged: Vec<Record> = String::from_utf8_lossy(&b)
            .lines()
            .filter_map(Record::from_line)
            .filter(|r| r.revision.is_some())
            .collect();
        let reaches_back = logged
            .first()
            .is_some_and(|r| r.revision.unwrap_or(0) <= revision);
        let mut after: Vec<Record> = logged
            .into_iter()
            .filter(|r| r.revision.unwrap_or(0) > revision)
            .collect();
        after.append(&mut out);
        out = after;
        if reaches_back {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
