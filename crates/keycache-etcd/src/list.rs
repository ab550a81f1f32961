//! Reading the whole key state of a prefix at one revision, page by page.

use std::collections::BTreeMap;

use etcd_client::{Client, GetOptions, KeyValue};
use keycache::Bank;
use keycache::MinionId;

use crate::connect::Settings;
use crate::error::{Error, Result};
use crate::prefix::Value;
use crate::replica::{self, Applied};
use crate::state::Anchor;

/// Keys read per page at first. etcd counts every key from a page's start
/// to the end of the range for each page (its `count`), so a list costs
/// O(n² / page): large pages (20,000 keys of about 500 bytes, 10 MB) make
/// 1M keys 50 pages instead of 500.
pub const PAGE: i64 = 20_000;
pub use crate::connect::MAX_RESPONSE;
/// gRPC's `OUT_OF_RANGE` status code: tonic's answer to a response larger
/// than the decoding limit, and etcd's to a revision compacted or not yet
/// reached.
pub(crate) const GRPC_OUT_OF_RANGE: i32 = 11;
/// The smallest page, after halving for responses over [`MAX_RESPONSE`].
pub const MIN_PAGE: i64 = 100;

/// The key state under a prefix at one revision.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The revision read.
    pub revision: i64,
    /// The etcd cluster's id.
    pub cluster_id: u64,
    /// etcd keys of the key state under the prefix (the audit trail's
    /// left out).
    pub keys: usize,
    /// The entries the store can hold.
    pub entries: BTreeMap<(Bank, MinionId), Value>,
    /// Keys passed over (see [`replica::decode`]).
    pub refused: Vec<(String, String)>,
    /// The key changed last under the prefix, the audit trail's left out
    /// (`None`: no such key): the anchor of a replica made from this
    /// listing.
    pub anchor: Option<Anchor>,
    /// The audit trail's keys: their `mod_revision` and value, in key
    /// order ([`crate::audit`]).
    pub audit: crate::audit::Found,
}

/// Why a paged read stopped.
#[derive(Debug)]
pub(crate) enum Paging {
    /// etcd compacted the revision asked for.
    Compacted,
    /// Any other failure.
    Failed(Error),
}

/// Reads the prefix of `settings` at `revision` (0: the current one, then
/// every page at the first page's), page by page, handing each page's
/// key-values to `f`; the revision read and the cluster id. Without
/// `audit`, the audit trail's range (`<prefix>audit/`) is not read.
pub(crate) async fn pages(
    client: &mut Client,
    settings: &Settings,
    revision: i64,
    audit: bool,
    mut f: impl FnMut(&[KeyValue]),
) -> std::result::Result<(i64, u64), Paging> {
    let layout = &settings.layout;
    let ranges: Vec<(Vec<u8>, Vec<u8>)> = if audit {
        vec![(layout.prefix().as_bytes().to_vec(), layout.range_end())]
    } else {
        layout.state_ranges().into()
    };
    let mut at = (revision, 0);
    let mut kv = client
        .kv_client()
        .max_decoding_message_size(settings.max_response);
    let mut page = PAGE;
    let mut first = true;
    for (mut from, end) in ranges {
        loop {
            let mut o = GetOptions::new().with_range(end.clone()).with_limit(page);
            if at.0 > 0 {
                o = o.with_revision(at.0);
            }
            let mut r = match kv.get(from.clone(), Some(o)).await {
                Ok(r) => r,
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() as i32 == GRPC_OUT_OF_RANGE => {
                    if s.message().contains("compacted") {
                        return Err(Paging::Compacted);
                    }
                    if page > MIN_PAGE {
                        // Values larger than usual: smaller pages.
                        page /= 2;
                        continue;
                    }
                    return Err(Paging::Failed(settings.err("range (list)", s)));
                }
                Err(e) => return Err(Paging::Failed(settings.err("range (list)", e))),
            };
            if first {
                let h = r
                    .header()
                    .ok_or_else(|| Paging::Failed(settings.err("range", "no header")))?;
                if at.0 == 0 {
                    at.0 = h.revision();
                }
                at.1 = h.cluster_id();
                first = false;
            }
            let more = r.more();
            let kvs = r.take_kvs();
            f(&kvs);
            match kvs.last() {
                Some(kv) if more => {
                    from = kv.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
    }
    Ok(at)
}

/// Lists the prefix of `settings` at one revision (the first page's).
pub async fn list(client: &mut Client, settings: &Settings) -> Result<Listing> {
    let layout = &settings.layout;
    let mut out = Listing::default();
    let mut applied = Applied::default();
    let mut last: Option<(i64, Anchor)> = None;
    let (revision, cluster_id) = pages(client, settings, 0, true, |kvs| {
        for kv in kvs {
            if layout.is_audit(kv.key()) {
                out.audit.push((kv.mod_revision(), kv.value().to_vec()));
                continue;
            }
            out.keys += 1;
            if last.as_ref().is_none_or(|(m, _)| kv.mod_revision() > *m) {
                last = Some((kv.mod_revision(), Anchor::of(kv, false)));
            }
            if let Some(c) = replica::decode(layout, kv.key(), Some(kv.value()), &mut applied) {
                if let Some(v) = c.value {
                    out.entries.insert((c.bank, c.id), v);
                }
            }
        }
    })
    .await
    .map_err(|p| match p {
        Paging::Compacted => settings.err("range (list)", "the revision was compacted"),
        Paging::Failed(e) => e,
    })?;
    (out.revision, out.cluster_id) = (revision, cluster_id);
    out.refused = applied.refused;
    out.anchor = last.map(|(_, a)| a);
    Ok(out)
}
