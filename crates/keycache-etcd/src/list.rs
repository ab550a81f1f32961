//! Reading the whole key state of a prefix at one revision, page by page.

use std::collections::BTreeMap;

use etcd_client::{Client, GetOptions};
use keycache::snapshot::Bank;
use keycache::MinionId;

use crate::connect::Settings;
use crate::error::Result;
use crate::layout::Value;
use crate::replica::{self, Applied};

/// Keys read per page at first. etcd counts every key from a page's start
/// to the end of the range for each page (its `count`), so a list costs
/// O(n² / page): large pages (20,000 keys of about 500 bytes, 10 MB) make
/// 1M keys 50 pages instead of 500.
pub const PAGE: i64 = 20_000;
/// The largest response accepted (tonic's default is 4 MB).
pub const MAX_RESPONSE: usize = 64 << 20;
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
    /// etcd keys under the prefix.
    pub keys: usize,
    /// The entries the store can hold.
    pub entries: BTreeMap<(Bank, MinionId), Value>,
    /// Keys passed over (see [`replica::decode`]).
    pub refused: Vec<(String, String)>,
}

/// Lists the prefix of `settings` at one revision (the first page's).
pub async fn list(client: &mut Client, settings: &Settings) -> Result<Listing> {
    let layout = &settings.layout;
    let end = layout.range_end();
    let mut from = layout.prefix().as_bytes().to_vec();
    let mut out = Listing::default();
    let mut applied = Applied::default();
    let mut kv = client
        .kv_client()
        .max_decoding_message_size(settings.max_response);
    let mut page = PAGE;
    loop {
        let mut o = GetOptions::new().with_range(end.clone()).with_limit(page);
        if out.revision > 0 {
            o = o.with_revision(out.revision);
        }
        let mut r = match kv.get(from.clone(), Some(o)).await {
            Ok(r) => r,
            // Values larger than usual: smaller pages.
            Err(etcd_client::Error::GRpcStatus(s))
                if s.code() as i32 == GRPC_OUT_OF_RANGE && page > MIN_PAGE =>
            {
                page /= 2;
                continue;
            }
            Err(e) => return Err(settings.err("range (list)", e)),
        };
        if out.revision == 0 {
            let h = r
                .header()
                .ok_or_else(|| settings.err("range", "no header"))?;
            (out.revision, out.cluster_id) = (h.revision(), h.cluster_id());
        }
        let more = r.more();
        let kvs = r.take_kvs();
        for kv in &kvs {
            out.keys += 1;
            if let Some(c) = replica::decode(layout, kv.key(), Some(kv.value()), &mut applied) {
                if let Some(v) = c.value {
                    out.entries.insert((c.bank, c.id), v);
                }
            }
        }
        match kvs.last() {
            Some(kv) if more => {
                from = kv.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    out.refused = applied.refused;
    Ok(out)
}
