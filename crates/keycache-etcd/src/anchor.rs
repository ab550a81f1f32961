//! Whether etcd's history is still the one a replica applied.
//!
//! etcd restored from a backup with its members' names, peer URLs and
//! token keeps its cluster id, starts again at the backup's revision, and
//! soon reaches the revisions a replica recorded, with other changes: a
//! replica that trusted its recorded revision would resume its watch past
//! every change made after the restore, revocations among them. So before
//! a watch resumes, and before a writer takes a replica's recorded
//! revision as proof that it applied a commit, the replica's last applied
//! change ([`Anchor`]) is read back from etcd at the replica's revision:
//! the same key must show the same revision, version and value (or, for a
//! deletion, be absent there and present just before). A history that went
//! back (etcd behind the replica) or forked does not show it, and the
//! replica lists again.

use etcd_client::{Client, GetOptions};

use crate::connect::Settings;
use crate::error::Result;
use crate::list::GRPC_OUT_OF_RANGE;
use crate::state::Anchor;

/// What etcd's history says of a replica's anchor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// etcd holds the anchor at the replica's revision: the same history.
    Same,
    /// etcd's history is not the one the replica applied (why).
    Forked(String),
    /// The anchor cannot be checked (why): the revision was compacted, or
    /// the state names no anchor. Not proof of the same history.
    Unknown(String),
}

/// What a read at one revision found.
enum Read {
    Found(etcd_client::KeyValue),
    Absent,
    Compacted,
    Future,
}

/// Reads `key` at `revision`, or with `count_to` counts the keys from
/// `key` to it.
async fn read_at(
    client: &mut Client,
    settings: &Settings,
    key: &[u8],
    revision: i64,
    count_to: Option<Vec<u8>>,
) -> Result<(Read, i64)> {
    let mut o = GetOptions::new().with_revision(revision.max(1));
    if let Some(end) = count_to {
        o = o.with_range(end).with_count_only();
    }
    match client.get(key, Some(o)).await {
        Ok(mut r) => {
            let n = r.count();
            Ok((
                r.take_kvs()
                    .into_iter()
                    .next()
                    .map_or(Read::Absent, Read::Found),
                n,
            ))
        }
        Err(etcd_client::Error::GRpcStatus(s)) if s.code() as i32 == GRPC_OUT_OF_RANGE => {
            if s.message().contains("compacted") {
                Ok((Read::Compacted, 0))
            } else {
                Ok((Read::Future, 0))
            }
        }
        Err(e) => Err(settings.err("range (history check)", e)),
    }
}

/// Checks `anchor` (the last change a replica applied; `None`: its prefix
/// was empty when listed, and `listed` says whether it was listed at
/// `at`) against etcd's history at `at`, the revision the replica holds.
pub async fn verify(
    client: &mut Client,
    settings: &Settings,
    anchor: Option<&Anchor>,
    at: i64,
) -> Result<Verdict> {
    let future = || {
        Verdict::Forked(format!(
            "etcd has not reached revision {at}, which this replica holds: etcd went back \
             (restored from a backup?)"
        ))
    };
    let Some(a) = anchor else {
        // A replica listed from an empty prefix: etcd must hold nothing
        // under it at that revision (the audit trail's keys are no key
        // state: not counted).
        let mut n = 0;
        for (from, end) in settings.layout.state_ranges() {
            match read_at(client, settings, &from, at, Some(end)).await? {
                (Read::Future, _) => return Ok(future()),
                (Read::Compacted, _) => {
                    return Ok(Verdict::Unknown(format!("revision {at} was compacted")))
                }
                (_, c) => n += c,
            }
        }
        return Ok(if n == 0 {
            Verdict::Same
        } else {
            Verdict::Forked(format!(
                "etcd holds {n} keys under the prefix at revision {at}, where this replica \
                 listed none"
            ))
        });
    };
    let Some(key) = a.key_bytes() else {
        return Ok(Verdict::Unknown(
            "the state file's anchor is damaged".into(),
        ));
    };
    let shown = String::from_utf8_lossy(&key).into_owned();
    let forked = |what: String| {
        Verdict::Forked(format!(
            "etcd's history differs from the one this replica applied: at revision {at}, \
             {shown} {what} (etcd restored from a backup?)"
        ))
    };
    let (now, _) = read_at(client, settings, &key, at, None).await?;
    Ok(match (now, a.value_hash) {
        (Read::Future, _) => future(),
        (Read::Compacted, _) => Verdict::Unknown(format!("revision {at} was compacted")),
        (Read::Found(kv), Some(h)) => {
            let same = kv.mod_revision() == a.mod_revision
                && kv.create_revision() == a.create_revision
                && kv.version() == a.version
                && xxhash_rust::xxh3::xxh3_64(kv.value()) == h;
            if same {
                Verdict::Same
            } else {
                forked(format!(
                    "was changed at revision {}, not {}, or holds another value",
                    kv.mod_revision(),
                    a.mod_revision
                ))
            }
        }
        (Read::Absent, Some(_)) => forked(format!(
            "is absent, where this replica applied a change at revision {}",
            a.mod_revision
        )),
        (Read::Found(kv), None) => forked(format!(
            "exists (changed at revision {}), where this replica applied its deletion at \
             revision {}",
            kv.mod_revision(),
            a.mod_revision
        )),
        (Read::Absent, None) => {
            // A deletion: the key must have existed just before it.
            match read_at(client, settings, &key, a.mod_revision - 1, None).await? {
                (Read::Found(_), _) | (Read::Compacted, _) => Verdict::Same,
                (Read::Absent, _) | (Read::Future, _) => forked(format!(
                    "did not exist at revision {}, where this replica applied its deletion",
                    a.mod_revision - 1
                )),
            }
        }
    })
}
