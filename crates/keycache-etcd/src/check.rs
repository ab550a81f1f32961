//! The consistency check: a replica against etcd at one revision, as
//! Kubernetes checks its watch cache against etcd.
//!
//! The replicator runs it when it starts and then every
//! [`Settings::check_every`], between two batches, so that the store holds
//! exactly the revision it records: a digest of what the store holds
//! (both banks: id and value) against the same digest of what etcd holds
//! under the prefix at that revision, read page by page and never held
//! whole. Entries etcd holds that no store could take (a value that
//! grants nothing, an id longer than the layout's) are left out of etcd's
//! side, as the replica leaves them out; the audit trail's keys are not
//! read (the replicator trims them at each check: [`crate::audit::trim`]). A difference (a store changed
//! behind the replicator's back, a copy, a history that forked, a bug) is
//! counted, reported, and answered by a list; a check is never fatal.
//!
//! The digest is a sum of per-entry 128-bit hashes, so neither side needs
//! an order. etcd's `mod_revision`s are not in it: the store does not hold
//! them; the history they would prove is checked by [`crate::anchor`].

use etcd_client::Client;
use keycache::store::Store;
use keycache::Bank;

use crate::connect::Settings;
use crate::error::Result;
use crate::list::{pages, Paging};
use crate::prefix::Value;
use crate::replica::{self, Applied};

/// A digest of a key state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest {
    /// Entries.
    pub entries: u64,
    sum: u128,
}

impl Digest {
    /// What `other` holds beyond `self`, as a digest's difference: the
    /// same entries missing on one side give the same difference whatever
    /// else both sides hold (the sum is of per-entry hashes).
    pub fn minus(&self, other: &Digest) -> (u64, u128) {
        (
            self.entries.wrapping_sub(other.entries),
            self.sum.wrapping_sub(other.sum),
        )
    }

    fn add(&mut self, bank: Bank, id: &str, value: &Value) {
        let mut b = Vec::with_capacity(bank.name().len() + id.len() + 2 + 512);
        b.extend_from_slice(bank.name().as_bytes());
        b.push(b'/');
        b.extend_from_slice(id.as_bytes());
        b.push(0);
        b.extend_from_slice(&value.encode());
        self.entries += 1;
        self.sum = self.sum.wrapping_add(xxhash_rust::xxh3::xxh3_128(&b));
    }
}

/// The digest of what `store` holds.
pub fn local(store: &Store) -> Result<Digest> {
    let mut d = Digest::default();
    for (bank, id, v) in replica::local_entries(store)? {
        d.add(bank, &id, &v);
    }
    Ok(d)
}

/// The digest of what etcd holds under the prefix at `revision`, of the
/// entries `store` could hold; `None` when etcd compacted that revision.
pub async fn remote(
    client: &mut Client,
    settings: &Settings,
    store: &Store,
    revision: i64,
) -> Result<Option<Digest>> {
    let layout = &settings.layout;
    let mut d = Digest::default();
    let mut ignored = Applied::default();
    let r = pages(client, settings, revision, false, |kvs| {
        for kv in kvs {
            let Some(c) = replica::decode(layout, kv.key(), Some(kv.value()), &mut ignored) else {
                continue;
            };
            ignored.refused.clear();
            let Some(v) = c.value else { continue };
            let table = match c.bank {
                Bank::Keys => store.keys_table(),
                Bank::Denied => store.denied_table(),
            };
            if table.check_id(c.id.as_str().as_bytes()).is_ok() {
                d.add(c.bank, c.id.as_str(), &v);
            }
        }
    })
    .await;
    match r {
        Ok(_) => Ok(Some(d)),
        Err(Paging::Compacted) => Ok(None),
        Err(Paging::Failed(e)) => Err(e),
    }
}
