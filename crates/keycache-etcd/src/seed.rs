//! Seeding: an existing store's key state into an empty prefix, in
//! transactions within etcd's limits (operations per transaction, bytes
//! per request).

use etcd_client::{Client, GetOptions, Txn, TxnOp};
use keycache::store::Store;
use keycache::MinionId;

use crate::connect::Settings;
use crate::error::{Error, Result};

/// Operations per transaction (etcd's default `--max-txn-ops` is 128).
pub const OPS_PER_TXN: usize = 120;
/// Bytes of keys and values per transaction (etcd's default
/// `--max-request-bytes` is 1.5 MiB).
pub const BYTES_PER_TXN: usize = 1024 * 1024;

/// What a seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seeded {
    /// Entries put.
    pub put: u64,
    /// Keys of the prefix removed (with `replace`: those the store lacks).
    pub removed: u64,
    /// Transactions.
    pub txns: u64,
    /// etcd's revision after the last one.
    pub revision: i64,
}

/// How many keys of the key state the prefix holds (the audit trail's,
/// `<prefix>audit/`, are not counted: a prefix that holds only them is
/// empty), and etcd's revision.
pub async fn count(client: &mut Client, settings: &Settings) -> Result<(i64, i64)> {
    let mut n = 0;
    let mut revision = 0;
    for (from, end) in settings.layout.state_ranges() {
        let mut o = GetOptions::new().with_range(end).with_count_only();
        if revision > 0 {
            // Both ranges at one revision.
            o = o.with_revision(revision);
        }
        let r = client
            .get(from, Some(o))
            .await
            .map_err(|e| settings.err("range (count)", e))?;
        n += r.count();
        if revision == 0 {
            revision = r.header().map_or(0, |h| h.revision());
        }
    }
    Ok((n, revision))
}

/// Puts every entry of `store` (both banks) under the prefix. A prefix
/// that holds keys is refused unless `replace`; with it, its keys the
/// store lacks are removed after the puts.
pub async fn seed(
    client: &mut Client,
    settings: &Settings,
    store: &Store,
    replace: bool,
) -> Result<Seeded> {
    let (n, _) = count(client, settings).await?;
    if n > 0 && !replace {
        return Err(Error::PrefixNotEmpty {
            prefix: settings.layout.prefix().to_owned(),
            count: n,
        });
    }
    let entries = crate::replica::local_entries(store)?
        .into_iter()
        .map(|(b, id, v)| Ok((b, MinionId::new(id)?, v)))
        .collect::<keycache::Result<Vec<_>>>()?;
    let mut done = Seeded::default();
    let l = &settings.layout;
    let mut ops: Vec<TxnOp> = Vec::new();
    let mut bytes = 0;
    let mut wanted = std::collections::HashSet::new();
    for (bank, id, v) in &entries {
        let key = l.key(*bank, id);
        let val = v.encode();
        if ops.len() == OPS_PER_TXN || bytes + key.len() + val.len() > BYTES_PER_TXN {
            commit(client, settings, &mut ops, &mut done).await?;
            bytes = 0;
        }
        bytes += key.len() + val.len();
        wanted.insert(key.clone());
        ops.push(TxnOp::put(key, val, None));
        done.put += 1;
    }
    commit(client, settings, &mut ops, &mut done).await?;
    if replace && n > 0 {
        let listing = crate::list::list(client, settings).await?;
        let stale: Vec<Vec<u8>> = listing
            .entries
            .keys()
            .map(|(b, id)| l.key(*b, id))
            .filter(|k| !wanted.contains(k))
            .collect();
        for k in stale {
            ops.push(TxnOp::delete(k, None));
            done.removed += 1;
            if ops.len() == OPS_PER_TXN {
                commit(client, settings, &mut ops, &mut done).await?;
            }
        }
        commit(client, settings, &mut ops, &mut done).await?;
    }
    Ok(done)
}

async fn commit(
    client: &mut Client,
    settings: &Settings,
    ops: &mut Vec<TxnOp>,
    done: &mut Seeded,
) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    let r = client
        .txn(Txn::new().and_then(std::mem::take(ops)))
        .await
        .map_err(|e| settings.err("txn (seed)", e))?;
    done.txns += 1;
    done.revision = r.header().map_or(done.revision, |h| h.revision());
    Ok(())
}
