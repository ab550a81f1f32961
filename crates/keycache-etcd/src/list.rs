//! Reading the whole key state of a prefix at one revision, page by page.

use std::collections::BTreeMap;

use etcd_client::{Client, GetOptions};
use keycache::snapshot::Bank;
use keycache::MinionId;

use crate::connect::Settings;
use crate::error::Result;
use crate::layout::Value;
use crate::replica::{self, Applied};

/// Keys read per page.
pub const PAGE: i64 = 2_000;

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
    loop {
        let mut o = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if out.revision > 0 {
            o = o.with_revision(out.revision);
        }
        let mut r = client
            .get(from.clone(), Some(o))
            .await
            .map_err(|e| settings.err("range (list)", e))?;
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
