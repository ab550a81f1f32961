//! The audit trail in etcd mode: records written into etcd with the
//! changes they record, and appended by every replicator to its store's
//! log ([`keycache::audit`]), so that each master holds the whole
//! cluster's trail, whichever master made a change.
//!
//! - **Written**: a [`crate::write::Writer`] given an actor
//!   ([`crate::write::Writer::set_actor`]) puts one `<prefix>audit/` key
//!   ([`crate::prefix`]) in each transaction that changes the key state:
//!   the records of every id the transaction changes, as JSON lines. The
//!   record commits with the change, or neither does; the key's
//!   `mod_revision` is the change's revision.
//! - **Logged**: every replicator appends the records of the audit keys it
//!   applies (from its watch, or from a list) to its store's log, each
//!   with its revision, in revision order, before it records the revision
//!   its store holds: a writer whose wait for its replica returned finds
//!   the record in its master's log. The replicator passes over the
//!   records its log holds of revisions past the one its store records
//!   ([`keycache::audit::logged_after`] when it starts), compared whole: a
//!   replicator killed after an append and before its state was written
//!   appends nothing twice when its watch gives it the batch again; one
//!   killed during an append leaves a torn line (skipped by readers), and
//!   the next appends every record of the batch not logged whole, those of
//!   a revision it had begun included.
//! - **Trimmed**: at each consistency check ([`crate::check`]) the
//!   replicator deletes the audit keys older than
//!   [`crate::Settings::audit_retention`] ([`AUDIT_RETENTION`]: 7 days).
//!   Each master keeps its own log (rotated by size, never by etcd's
//!   retention); etcd's copy only needs to outlive a replicator's downtime.
//!   A replicator down longer than that misses the records trimmed
//!   meanwhile, and so does a new master's first list.
//!
//! A history that went back (etcd restored from a backup) commits new
//! changes at revisions a log already holds: the replicator lists again
//! (see [`crate::anchor`]), and a list appends every listed record the log
//! does not hold, compared whole rather than by revision
//! ([`Log::append_listed`]), then follows from the listed revision.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use etcd_client::{Client, DeleteOptions, GetOptions};
use keycache::audit::Record;

use crate::connect::Settings;
use crate::error::Result;

pub use crate::connect::AUDIT_RETENTION;

/// A nonce for an audit key ([`crate::Prefix::audit_key`]): the time, the
/// process, the thread and a counter, hashed. Not a secret: it only keeps
/// two writers' keys of one nanosecond apart.
pub fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let thread = format!("{:?}", std::thread::current().id());
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&ns.to_le_bytes());
    b.extend_from_slice(&std::process::id().to_le_bytes());
    b.extend_from_slice(&n.to_le_bytes());
    b.extend_from_slice(thread.as_bytes());
    // A stack address differs between processes (ASLR).
    let here = 0u8;
    b.extend_from_slice(&(std::ptr::addr_of!(here) as usize).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&b)
}

/// The value of an audit key: `records` as JSON lines, without revisions.
pub fn value(records: &[Record]) -> Vec<u8> {
    let mut v = Vec::new();
    for r in records {
        let r = Record {
            revision: None,
            ..r.clone()
        };
        v.extend_from_slice(r.to_line().as_bytes());
    }
    v
}

/// The records of an audit key's value, each given `revision`; lines that
/// are not records are passed over.
pub fn records(value: &[u8], revision: i64) -> Vec<Record> {
    String::from_utf8_lossy(value)
        .lines()
        .filter_map(Record::from_line)
        .map(|r| Record {
            revision: Some(revision),
            ..r
        })
        .collect()
}

/// The audit keys a replicator found (its watch's batch, a list): their
/// `mod_revision` and value.
pub type Found = Vec<(i64, Vec<u8>)>;

/// What tells two records apart in a log: the revision, the time, the id
/// and the action. etcd restored from a backup commits new changes at
/// revisions a log already went past; their records differ in time.
type Seen = (Option<i64>, String, String, String);

fn seen(r: &Record) -> Seen {
    (r.revision, r.time.clone(), r.id.clone(), r.action.clone())
}

/// A replicator's side of its store's log: the records it logged of
/// revisions past the one its store records, which a watch may give it
/// again.
#[derive(Debug, Default)]
pub struct Log {
    /// Read from the log once, when first needed.
    held: Option<std::collections::HashSet<Seen>>,
}

impl Log {
    /// Appends to the log of `dir`, in one append, the records of `found`
    /// past `applied` (the revision the store records) that the log does
    /// not hold yet, in revision order (the records of one revision in the
    /// order found); how many. A replicator killed after an append and
    /// before it recorded the revision is given the batch again; one
    /// killed in the middle of an append left some records of a revision
    /// whole and one torn: the records held are passed over, the others
    /// appended.
    pub fn append(&mut self, dir: &Path, mut found: Found, applied: i64) -> Result<usize> {
        if found.is_empty() {
            return Ok(0);
        }
        let held = match &mut self.held {
            Some(h) => h,
            None => self.held.insert(
                keycache::audit::logged_after(dir, applied)?
                    .iter()
                    .map(seen)
                    .collect(),
            ),
        };
        held.retain(|s| s.0.unwrap_or(0) > applied);
        found.sort_by_key(|(rev, _)| *rev);
        let mut new = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (rev, v) in found.iter().filter(|(rev, _)| *rev > applied) {
            for r in records(v, *rev) {
                let s = seen(&r);
                if !held.contains(&s) && new.insert(s) {
                    out.push(r);
                }
            }
        }
        keycache::audit::append(dir, &out)?;
        held.extend(new);
        Ok(out.len())
    }

    /// Appends the records of a list: each record the log does not hold
    /// yet (compared whole, not by revision alone: etcd restored from a
    /// backup commits new changes at revisions the log already went past),
    /// in revision order; how many. The watch that follows starts after
    /// the list's revision, which the store then records.
    pub fn append_listed(&mut self, dir: &Path, mut found: Found) -> Result<usize> {
        let mut out = Vec::new();
        if !found.is_empty() {
            let (held, _) = keycache::audit::read(dir)?;
            let held: std::collections::HashSet<Seen> = held.iter().map(seen).collect();
            found.sort_by_key(|(rev, _)| *rev);
            for (rev, v) in &found {
                out.extend(
                    records(v, *rev)
                        .into_iter()
                        .filter(|r| !held.contains(&seen(r))),
                );
            }
            keycache::audit::append(dir, &out)?;
        }
        self.held = Some(Default::default());
        Ok(out.len())
    }
}

/// Deletes the audit keys of `settings`' prefix written before `now` minus
/// [`Settings::audit_retention`], in one DeleteRange (after a count, so that
/// a check that finds nothing to trim writes nothing); how many.
pub async fn trim(client: &mut Client, settings: &Settings, now: SystemTime) -> Result<i64> {
    let Some(cutoff) = now.checked_sub(settings.audit_retention) else {
        return Ok(0);
    };
    let l = &settings.layout;
    let (from, end) = (l.audit_prefix(), l.audit_before(cutoff));
    let r = client
        .get(
            from.clone(),
            Some(GetOptions::new().with_range(end.clone()).with_count_only()),
        )
        .await
        .map_err(|e| settings.err("range (audit retention)", e))?;
    if r.count() == 0 {
        return Ok(0);
    }
    let r = client
        .delete(from, Some(DeleteOptions::new().with_range(end)))
        .await
        .map_err(|e| settings.err("delete (audit retention)", e))?;
    Ok(r.deleted())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> Record {
        Record {
            time: "2026-11-29T04:05:06.789Z".into(),
            id: id.into(),
            action: "accept".into(),
            from: Some("pending".into()),
            to: Some("accepted".into()),
            program: "keycache".into(),
            revision: Some(3),
            ..Record::default()
        }
    }

    #[test]
    fn values_read_back_with_the_revision_of_their_key() {
        let v = value(&[record("a"), record("b")]);
        assert!(!String::from_utf8_lossy(&v).contains("\"revision\":3"));
        let mut torn = v.clone();
        torn.extend_from_slice(b"{\"time\"");
        let got = records(&torn, 9);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].id, "b");
        assert!(got.iter().all(|r| r.revision == Some(9)));
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn the_log_takes_each_revision_once_in_order() {
        let d = tempfile::tempdir().expect("dir");
        let mut log = Log::default();
        let v = |id: &str| value(&[record(id)]);
        assert_eq!(
            log.append(d.path(), vec![(7, v("b")), (5, v("a"))], 0)
                .expect("append"),
            2
        );
        // A replay, and one new revision.
        assert_eq!(
            log.append(d.path(), vec![(5, v("a")), (7, v("b")), (8, v("c"))], 4)
                .expect("append"),
            1
        );
        // A new replicator reads the last revision from the log.
        let mut again = Log::default();
        assert_eq!(
            again
                .append(d.path(), vec![(8, v("c"))], 7)
                .expect("append"),
            0
        );
        let (all, _) = keycache::audit::read(d.path()).expect("read");
        let ids: Vec<(&str, Option<i64>)> =
            all.iter().map(|r| (r.id.as_str(), r.revision)).collect();
        assert_eq!(ids, [("a", Some(5)), ("b", Some(7)), ("c", Some(8))]);
    }

    /// A replicator killed in the middle of an append leaves the records of
    /// one revision partly logged, the last of them torn: the next one
    /// appends the records of that revision the log lacks, and only those.
    #[test]
    fn a_revision_torn_by_a_kill_is_finished_by_the_next_replicator() {
        let d = tempfile::tempdir().expect("dir");
        let v = value(&[record("a"), record("b"), record("c")]);
        let mut log = Log::default();
        log.append(d.path(), vec![(5, value(&[record("z")]))], 0)
            .expect("append");
        // The kill: revision 9's "a" whole, "b" torn, "c" never written.
        let whole = records(&v, 9);
        let mut bytes = whole[0].to_line().into_bytes();
        let b = whole[1].to_line();
        bytes.extend_from_slice(&b.as_bytes()[..b.len() / 2]);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(keycache::audit::path(d.path()))
            .expect("open");
        std::io::Write::write_all(&mut f, &bytes).expect("write");
        drop(f);
        // The next replicator's watch replays revisions 5 and 9, then 10.
        let mut again = Log::default();
        let found = vec![
            (5, value(&[record("z")])),
            (9, v),
            (10, value(&[record("d")])),
        ];
        assert_eq!(again.append(d.path(), found.clone(), 4).expect("append"), 3);
        assert_eq!(again.append(d.path(), found, 4).expect("replay"), 0);
        let (all, torn) = keycache::audit::read(d.path()).expect("read");
        assert_eq!(torn, 1);
        let ids: Vec<(&str, Option<i64>)> =
            all.iter().map(|r| (r.id.as_str(), r.revision)).collect();
        assert_eq!(
            ids,
            [
                ("z", Some(5)),
                ("a", Some(9)),
                ("b", Some(9)),
                ("c", Some(9)),
                ("d", Some(10))
            ]
        );
    }

    /// etcd restored from a backup commits new changes at revisions the
    /// log went past: a list appends the records the log lacks, compared
    /// whole, and the watch after it takes revisions past the list's.
    #[test]
    fn a_list_after_a_restore_appends_the_records_at_revisions_already_passed() {
        let d = tempfile::tempdir().expect("dir");
        let mut log = Log::default();
        let v = |id: &str| value(&[record(id)]);
        log.append(d.path(), vec![(5, v("a")), (7, v("b")), (9, v("c"))], 0)
            .expect("append");
        // The backup held revision 5; the restored etcd committed "x" at 7.
        assert_eq!(
            log.append_listed(d.path(), vec![(5, v("a")), (7, v("x"))])
                .expect("list"),
            1
        );
        assert_eq!(
            log.append(d.path(), vec![(8, v("y"))], 7).expect("watch"),
            1
        );
        let (all, _) = keycache::audit::read(d.path()).expect("read");
        let ids: Vec<(&str, Option<i64>)> =
            all.iter().map(|r| (r.id.as_str(), r.revision)).collect();
        assert_eq!(
            ids,
            [
                ("a", Some(5)),
                ("b", Some(7)),
                ("c", Some(9)),
                ("x", Some(7)),
                ("y", Some(8))
            ]
        );
        // A replicator started after the list, its store at revision 8:
        // the restored etcd's revision 9 is another change than the one
        // the log holds at 9 (another time), and is logged.
        let later = |id: &str| {
            let mut r = record(id);
            r.time = "2026-11-29T05:00:00.000Z".into();
            value(&[r])
        };
        let mut again = Log::default();
        let found = vec![(8, v("y")), (9, later("c")), (10, later("z"))];
        assert_eq!(again.append(d.path(), found, 8).expect("watch"), 2);
        let (all, _) = keycache::audit::read(d.path()).expect("read");
        let tail: Vec<(&str, Option<i64>, &str)> = all
            .iter()
            .skip(5)
            .map(|r| (r.id.as_str(), r.revision, &r.time[11..13]))
            .collect();
        assert_eq!(tail, [("c", Some(9), "05"), ("z", Some(10), "05")]);
    }
}
