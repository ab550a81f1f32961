//! The comparison of two stores (peers of an isolated-filesystem cluster):
//! which entries only one of them holds, and which differ.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::store::Store;

/// An entry that only one of the two stores holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OnlyIn {
    /// The minion id.
    pub id: String,
    /// The bank: `keys` or `denied_keys`.
    pub bank: &'static str,
    /// Its state: `accepted`, `pending`, `rejected`, or `denied` for the
    /// `denied_keys` bank.
    pub state: String,
}

/// An entry that both stores hold, with another state or another key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Differs {
    /// The minion id.
    pub id: String,
    /// The bank: `keys` or `denied_keys`.
    pub bank: &'static str,
    /// Its state in the first store.
    pub state_a: String,
    /// Its state in the second store.
    pub state_b: String,
    /// Whether both stores hold the same public key for it.
    pub same_key: bool,
}

/// How two stores differ ([`diff`]); each list in the order of (id, bank).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Diff {
    /// Both stores hold the same entries.
    pub same: bool,
    /// Entries only the first store holds.
    pub only_a: Vec<OnlyIn>,
    /// Entries only the second store holds.
    pub only_b: Vec<OnlyIn>,
    /// Entries both hold, with another state or key.
    pub differ: Vec<Differs>,
    /// Entries of the first store, both banks together.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub entries_a: usize,
}

/// Every entry of both banks: (id, bank) -> (state, key).
type Entries = BTreeMap<(String, &'static str), (String, Vec<u8>)>;

fn entries(s: &Store) -> Result<Entries> {
    let mut m = BTreeMap::new();
    for r in s.keys(None)? {
        let (id, e) = r?;
        m.insert((id, "keys"), (e.state.name().to_owned(), e.public_key));
    }
    for r in s.denied_keys()? {
        let (id, pem) = r?;
        m.insert((id, "denied_keys"), ("denied".to_owned(), pem));
    }
    Ok(m)
}

/// Compares the entries of both banks of `a` and `b`. An entry that cannot
/// be read is an error.
pub fn diff(a: &Store, b: &Store) -> Result<Diff> {
    let (ma, mb) = (entries(a)?, entries(b)?);
    let mut d = Diff {
        entries_a: ma.len(),
        ..Diff::default()
    };
    for ((id, bank), va) in &ma {
        match mb.get(&(id.clone(), *bank)) {
            None => d.only_a.push(OnlyIn {
                id: id.clone(),
                bank,
                state: va.0.clone(),
            }),
            Some(vb) if vb != va => d.differ.push(Differs {
                id: id.clone(),
                bank,
                state_a: va.0.clone(),
                state_b: vb.0.clone(),
                same_key: va.1 == vb.1,
            }),
            Some(_) => {}
        }
    }
    for ((id, bank), vb) in &mb {
        if !ma.contains_key(&(id.clone(), *bank)) {
            d.only_b.push(OnlyIn {
                id: id.clone(),
                bank,
                state: vb.0.clone(),
            });
        }
    }
    d.same = d.only_a.is_empty() && d.only_b.is_empty() && d.differ.is_empty();
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::small_store as store;
    use crate::{KeyState, MinionId};

    const PEM: &[u8] = b"-----BEGIN PUBLIC KEY-----\nk\n-----END PUBLIC KEY-----\n";
    const PEM2: &[u8] = b"-----BEGIN PUBLIC KEY-----\nk2\n-----END PUBLIC KEY-----\n";

    fn id(s: &str) -> MinionId {
        MinionId::new(s).expect("id")
    }

    #[test]
    fn diff_lists_what_differs_in_id_order() -> Result<()> {
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (a, b) = (store(da.path()), store(db.path()));
        assert_eq!(
            diff(&a, &b)?,
            Diff {
                same: true,
                ..Diff::default()
            }
        );
        for s in [&a, &b] {
            s.put(&id("both"), KeyState::Accepted, PEM)?;
            s.put(&id("state"), KeyState::Pending, PEM)?;
        }
        b.set_state(&id("state"), KeyState::Accepted)?;
        a.put(&id("key"), KeyState::Accepted, PEM)?;
        b.put(&id("key"), KeyState::Accepted, PEM2)?;
        a.put(&id("only-a"), KeyState::Rejected, PEM)?;
        b.deny(&id("both"), PEM)?;
        let d = diff(&a, &b)?;
        assert!(!d.same);
        assert_eq!(d.entries_a, 4);
        let only = |id: &str, bank, state: &str| OnlyIn {
            id: id.into(),
            bank,
            state: state.into(),
        };
        assert_eq!(d.only_a, [only("only-a", "keys", "rejected")]);
        assert_eq!(d.only_b, [only("both", "denied_keys", "denied")]);
        let ids: Vec<(&str, &str, &str, bool)> = d
            .differ
            .iter()
            .map(|e| (&*e.id, &*e.state_a, &*e.state_b, e.same_key))
            .collect();
        assert_eq!(
            ids,
            [
                ("key", "accepted", "accepted", false),
                ("state", "pending", "accepted", true)
            ]
        );
        Ok(())
    }
}
