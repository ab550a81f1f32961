//! Minion ids, validated with Salt's rules.

use std::fmt;

use crate::error::{Error, Result};

/// A minion id that Salt accepts: not empty, not `.` or `..`, and without
/// `/`, `\` or NUL (Salt's `valid_id`: the id joined to the pki dir must
/// name a direct child of it). The length against a table's id size is
/// checked by the table, which knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MinionId(String);

impl MinionId {
    /// Validates `id`.
    pub fn new(id: impl Into<String>) -> Result<MinionId> {
        let id = id.into();
        validate(&id)?;
        Ok(MinionId(id))
    }

    /// Validates raw bytes, which must be UTF-8.
    pub fn from_bytes(id: &[u8]) -> Result<MinionId> {
        match std::str::from_utf8(id) {
            Ok(s) => MinionId::new(s),
            Err(_) => Err(Error::InvalidId {
                id: String::from_utf8_lossy(id).into_owned(),
                why: "it is not valid UTF-8",
            }),
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for MinionId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<[u8]> for MinionId {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Display for MinionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks `id` against Salt's rules without allocating.
#[inline]
pub fn validate(id: &str) -> Result<()> {
    let why = if id.is_empty() {
        "it is empty"
    } else if id == "." || id == ".." {
        "it names a directory, not a file in the pki dir"
    } else if id.bytes().any(|b| matches!(b, b'/' | b'\\' | 0)) {
        "it contains '/', '\\' or NUL"
    } else {
        return Ok(());
    };
    Err(Error::InvalidId {
        id: id.to_owned(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salt_rules() {
        for bad in ["", ".", "..", "a/b", "/", "a\\b", "nul\0id", "../x"] {
            assert!(MinionId::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["web-01", "...", ".hidden", "a..b", "ünïcødé", "x y", "a:b"] {
            assert_eq!(MinionId::new(good).unwrap().as_str(), good);
        }
        assert!(MinionId::from_bytes(b"\xff\xfe").is_err());
    }
}
