//! The key state in etcd: one etcd key per (bank, id) under one prefix per
//! cluster, the value as the store's bank holds it.
//!
//! ```text
//! <prefix>keys/<id>          [state: 1 accepted, 2 pending, 3 rejected][public key PEM]
//! <prefix>denied_keys/<id>   [public key PEM]
//! <prefix>audit/<ns>-<hex>   the audit records of one transaction (JSON lines)
//! ```
//!
//! The `master_keys` bank never goes to etcd: the master's private keys stay
//! on each master.
//!
//! An `audit/` key is written by a [`crate::write::Writer`] with an actor,
//! in the transaction of the change it records: `<ns>` is the writer's wall
//! clock in nanoseconds since the Unix epoch, zero-padded to 20 digits (so
//! the keys sort by time, and retention deletes one range of them), and
//! `<hex>` 16 random hex digits (two writers in one nanosecond never share a
//! key). Its value is [`keycache::audit::Record::to_line`] of every id the
//! transaction changed, without a revision: the key's `mod_revision` is the
//! revision of the change. Audit keys are not key state: the replica, the
//! consistency check, the anchor and the counts of the prefix pass them
//! over ([`Prefix::is_audit`]); the replicator appends their records to its
//! store's log ([`crate::audit`]).

use std::time::{SystemTime, UNIX_EPOCH};

use keycache::store::{decode_key_value, encode_key_value, KeyState};
use keycache::Bank;
use keycache::MinionId;

use crate::error::{Error, Result};

/// The folder of the audit trail's keys under the prefix.
pub const AUDIT: &str = "audit";

/// The etcd keys of one cluster's key state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    prefix: String,
}

/// What one etcd key holds, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A `keys` bank entry.
    Key(KeyState, Vec<u8>),
    /// A `denied_keys` bank entry.
    Denied(Vec<u8>),
}

impl Value {
    /// The bank it belongs to.
    pub fn bank(&self) -> Bank {
        match self {
            Value::Key(..) => Bank::Keys,
            Value::Denied(_) => Bank::Denied,
        }
    }

    /// The bytes etcd holds.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Value::Key(s, pem) => encode_key_value(*s, pem),
            Value::Denied(pem) => pem.clone(),
        }
    }

    /// Decodes what etcd holds for `bank`: a `keys` value must carry a
    /// state byte and a key, and the key (in either bank) must be exactly
    /// one PEM public key block, as `migrate` and `merge` require
    /// ([`keycache::pem::check_public_key`]): a value of a state byte and
    /// anything else, written straight into etcd, grants nothing.
    pub fn decode(bank: Bank, bytes: &[u8]) -> std::result::Result<Value, &'static str> {
        let v = match bank {
            Bank::Keys => match decode_key_value(bytes) {
                Some((s, pem)) => Value::Key(s, pem.to_vec()),
                None => return Err("not a keys value ([state 1..3][public key])"),
            },
            Bank::Denied if bytes.is_empty() => return Err("an empty denied key"),
            Bank::Denied => Value::Denied(bytes.to_vec()),
        };
        let pem = match &v {
            Value::Key(_, p) | Value::Denied(p) => p,
        };
        keycache::pem::check_public_key(pem).map_err(|p| p.describe())?;
        Ok(v)
    }
}

impl Prefix {
    /// The layout under `prefix`, which must start with `/`, end with `/`
    /// and hold no NUL.
    pub fn new(prefix: &str) -> Result<Prefix> {
        if !prefix.starts_with('/') || !prefix.ends_with('/') || prefix.contains('\0') {
            return Err(Error::Config(format!(
                "prefix {prefix:?} must start and end with / and hold no NUL"
            )));
        }
        Ok(Prefix {
            prefix: prefix.to_owned(),
        })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The etcd key of (`bank`, `id`).
    pub fn key(&self, bank: Bank, id: &MinionId) -> Vec<u8> {
        format!("{}{}/{}", self.prefix, bank.name(), id.as_str()).into_bytes()
    }

    /// The end of the prefix's range (etcd's `range_end` for a prefix).
    pub fn range_end(&self) -> Vec<u8> {
        let mut end = self.prefix.as_bytes().to_vec();
        // The prefix ends with '/', so its last byte can be incremented.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        end
    }

    /// `<prefix>audit/`: where the audit trail's keys live.
    pub fn audit_prefix(&self) -> Vec<u8> {
        format!("{}{AUDIT}/", self.prefix).into_bytes()
    }

    /// The end of the audit prefix's range (`<prefix>audit0`).
    pub fn audit_range_end(&self) -> Vec<u8> {
        format!("{}{AUDIT}0", self.prefix).into_bytes()
    }

    /// The audit key of a transaction committed by a writer whose clock
    /// reads `now`: `<prefix>audit/<20-digit ns>-<16 hex nonce>`.
    pub fn audit_key(&self, now: SystemTime, nonce: u64) -> Vec<u8> {
        let mut k = self.audit_before(now);
        k.extend_from_slice(format!("-{nonce:016x}").as_bytes());
        k
    }

    /// `<prefix>audit/<20-digit ns of t>`: every audit key written before
    /// `t` sorts below it, every one written at or after it above.
    pub fn audit_before(&self, t: SystemTime) -> Vec<u8> {
        let ns = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        format!("{}{AUDIT}/{ns:020}", self.prefix).into_bytes()
    }

    /// Whether `key` is one of the audit trail's (under `<prefix>audit/`).
    pub fn is_audit(&self, key: &[u8]) -> bool {
        key.strip_prefix(self.prefix.as_bytes())
            .is_some_and(|rest| {
                rest.starts_with(AUDIT.as_bytes()) && rest.get(AUDIT.len()) == Some(&b'/')
            })
    }

    /// The ranges of the prefix that hold key state, the audit prefix left
    /// out: `[prefix, <prefix>audit/)` and `[<prefix>audit0, range end)`.
    pub fn state_ranges(&self) -> [(Vec<u8>, Vec<u8>); 2] {
        [
            (self.prefix.as_bytes().to_vec(), self.audit_prefix()),
            (self.audit_range_end(), self.range_end()),
        ]
    }

    /// The (bank, id) of an etcd key under the prefix; `None` for a key
    /// that is not one of the two banks' or whose id is not a valid
    /// minion id.
    pub fn parse(&self, key: &[u8]) -> Option<(Bank, MinionId)> {
        let rest = std::str::from_utf8(key).ok()?.strip_prefix(&self.prefix)?;
        let (bank, id) = rest.split_once('/')?;
        let bank = match bank {
            "keys" => Bank::Keys,
            "denied_keys" => Bank::Denied,
            _ => return None,
        };
        Some((bank, MinionId::new(id).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_stay_under_the_prefix() {
        let l = Prefix::new("/keycache/prod/").expect("prefix");
        let id = MinionId::new("web-1").expect("id");
        let k = l.key(Bank::Denied, &id);
        assert_eq!(k, b"/keycache/prod/denied_keys/web-1");
        assert_eq!(l.parse(&k), Some((Bank::Denied, id)));
        assert!(k.as_slice() >= l.prefix().as_bytes() && k < l.range_end());
        assert_eq!(l.range_end(), b"/keycache/prod0");
        assert_eq!(l.parse(b"/keycache/prod/master_keys/master.pem"), None);
        assert_eq!(l.parse(b"/keycache/other/keys/web-1"), None);
        assert_eq!(l.parse(b"/keycache/prod/keys/../x"), None);
        for bad in ["keycache/", "/keycache", "/a\0/"] {
            assert!(Prefix::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn audit_keys_sort_by_time_and_stay_apart_from_the_key_state() {
        let l = Prefix::new("/kc/").expect("prefix");
        let t = UNIX_EPOCH + std::time::Duration::from_nanos(1_795_925_106_789_000_001);
        let k = l.audit_key(t, 0xab);
        assert_eq!(k, b"/kc/audit/01795925106789000001-00000000000000ab");
        assert!(l.is_audit(&k));
        assert_eq!(l.parse(&k), None);
        assert!(k.as_slice() >= l.audit_prefix().as_slice() && k < l.audit_range_end());
        // Earlier keys sort below the cutoff of a later time, later above.
        let later = t + std::time::Duration::from_nanos(1);
        assert!(k < l.audit_before(later));
        assert!(l.audit_key(later, 0) > l.audit_before(later));
        assert!(l.audit_key(later, 0) > l.audit_key(t, u64::MAX));
        for not in [
            &b"/kc/auditx"[..],
            b"/kc/audit",
            b"/kc/keys/audit",
            b"/other/audit/1",
        ] {
            assert!(!l.is_audit(not), "{not:?}");
        }
        // The key state's ranges hold both banks, not the audit keys.
        let [(a, b), (c, d)] = l.state_ranges();
        let inside = |x: &Vec<u8>| (*x >= a && *x < b) || (*x >= c && *x < d);
        for key in [
            l.key(Bank::Keys, &MinionId::new("audit").expect("id")),
            l.key(Bank::Denied, &MinionId::new("x").expect("id")),
        ] {
            assert!(inside(&key), "{key:?}");
        }
        assert!(!inside(&k));
    }

    #[test]
    fn values_are_checked_as_the_store_would() {
        let pem = b"-----BEGIN PUBLIC KEY-----\nAB\n-----END PUBLIC KEY-----\n".to_vec();
        let v = Value::Key(KeyState::Pending, pem.clone());
        assert_eq!(Value::decode(Bank::Keys, &v.encode()), Ok(v));
        assert!(Value::decode(Bank::Keys, &pem).is_err());
        assert!(Value::decode(Bank::Keys, &[1]).is_err());
        assert!(Value::decode(Bank::Denied, b"").is_err());
        let private = b"-----BEGIN RSA PRIVATE KEY-----\nAB\n-----END RSA PRIVATE KEY-----\n";
        assert!(Value::decode(Bank::Denied, private).is_err());
        // A state byte and bytes that are not a PEM public key.
        for bad in [
            &b"\x01not a pem"[..],
            b"\x01",
            b"\x01-----BEGIN PUBLIC KEY-----\n",
        ] {
            assert!(Value::decode(Bank::Keys, bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            Value::decode(Bank::Denied, b"garbage"),
            Err("it does not start with a PEM public key block")
        );
    }
}
