//! Minion keys as the `keys` bank holds them: the state, the value
//! encoding `[state: u8][PEM]` (1 accepted, 2 pending, 3 rejected), and the
//! entries lookups return.

use crate::error::{Error, Result};
use crate::table::Found;

/// One of the two banks of minion keys (Salt's `keys` and `denied_keys`):
/// what a snapshot entry, a version, an etcd key belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Bank {
    /// The `keys` bank: accepted, pending and rejected keys.
    #[cfg_attr(feature = "serde", serde(rename = "keys"))]
    Keys,
    /// The `denied_keys` bank: keys presented under an id that holds
    /// another key.
    #[cfg_attr(feature = "serde", serde(rename = "denied_keys"))]
    Denied,
}

impl Bank {
    /// Salt's name of the bank: `keys` or `denied_keys`.
    pub fn name(self) -> &'static str {
        match self {
            Bank::Keys => "keys",
            Bank::Denied => "denied_keys",
        }
    }
}

impl std::fmt::Display for Bank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The state of a key in the `keys` bank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum KeyState {
    /// Accepted (`minions/`).
    Accepted,
    /// Pending, unaccepted (`minions_pre/`).
    Pending,
    /// Rejected (`minions_rejected/`).
    Rejected,
}

impl KeyState {
    /// Every state, in `salt-key -L` order.
    pub const ALL: [KeyState; 3] = [KeyState::Accepted, KeyState::Pending, KeyState::Rejected];

    /// The state byte stored in front of the PEM.
    pub fn byte(self) -> u8 {
        match self {
            KeyState::Accepted => 1,
            KeyState::Pending => 2,
            KeyState::Rejected => 3,
        }
    }

    /// The state of a state byte.
    pub fn from_byte(b: u8) -> Option<KeyState> {
        match b {
            1 => Some(KeyState::Accepted),
            2 => Some(KeyState::Pending),
            3 => Some(KeyState::Rejected),
            _ => None,
        }
    }

    /// Salt's name: `accepted`, `pending`, `rejected`.
    pub fn name(self) -> &'static str {
        match self {
            KeyState::Accepted => "accepted",
            KeyState::Pending => "pending",
            KeyState::Rejected => "rejected",
        }
    }

    /// The state named exactly as Salt's `mmap_key` stores it (`accepted`,
    /// `pending`, `rejected`: [`KeyState::name`]). The driver takes a
    /// stored state through this, not through [`str::parse`], whose
    /// directory names and aliases (`minions`, `unaccepted`, ...) are the
    /// CLI's: `mmap_key` refuses them, and `{"state": "minions"}` must not
    /// become an accepted key.
    pub fn from_name(name: &str) -> Option<KeyState> {
        KeyState::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The localfs_key directory and `salt-key --out json` group name.
    pub fn dir_name(self) -> &'static str {
        TreeDir::of(self).name()
    }
}

/// A state directory of the `localfs_key` tree, by Salt's folder name
/// (salt/cache/localfs_key.py: `minions`, `minions_pre`,
/// `minions_rejected`, `minions_denied`). Public as
/// `keycache::tree::TreeDir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum TreeDir {
    /// `minions/`: accepted keys (what `validate_token` reads).
    #[cfg_attr(feature = "serde", serde(rename = "minions"))]
    Minions,
    /// `minions_pre/`: pending keys.
    #[cfg_attr(feature = "serde", serde(rename = "minions_pre"))]
    MinionsPre,
    /// `minions_rejected/`: rejected keys.
    #[cfg_attr(feature = "serde", serde(rename = "minions_rejected"))]
    MinionsRejected,
    /// `minions_denied/`: denied keys (the `denied_keys` bank).
    #[cfg_attr(feature = "serde", serde(rename = "minions_denied"))]
    MinionsDenied,
}

impl TreeDir {
    /// The four directories, in Salt's scan order (which is also their
    /// [`TreeDir::index`] order).
    pub const ALL: [TreeDir; 4] = [
        TreeDir::Minions,
        TreeDir::MinionsPre,
        TreeDir::MinionsRejected,
        TreeDir::MinionsDenied,
    ];

    /// Their names, in [`TreeDir::ALL`] order.
    pub const NAMES: [&'static str; 4] = [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ];

    /// Salt's folder name.
    pub fn name(self) -> &'static str {
        TreeDir::NAMES[self.index()]
    }

    /// The position in [`TreeDir::ALL`] (for per-directory arrays).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The directory of a `keys` bank state.
    pub fn of(state: KeyState) -> TreeDir {
        match state {
            KeyState::Accepted => TreeDir::Minions,
            KeyState::Pending => TreeDir::MinionsPre,
            KeyState::Rejected => TreeDir::MinionsRejected,
        }
    }

    /// The `keys` bank state of this directory's keys; None for
    /// `minions_denied` (the `denied_keys` bank, no state).
    pub fn state(self) -> Option<KeyState> {
        match self {
            TreeDir::Minions => Some(KeyState::Accepted),
            TreeDir::MinionsPre => Some(KeyState::Pending),
            TreeDir::MinionsRejected => Some(KeyState::Rejected),
            TreeDir::MinionsDenied => None,
        }
    }

    /// The directory named `name` (one of [`TreeDir::NAMES`]).
    pub fn from_name(name: &str) -> Option<TreeDir> {
        TreeDir::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| TreeDir::ALL[i])
    }
}

impl std::fmt::Display for TreeDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KeyState {
    type Err = Error;
    fn from_str(s: &str) -> Result<KeyState> {
        match s {
            "accepted" | "minions" => Ok(KeyState::Accepted),
            "pending" | "unaccepted" | "minions_pre" => Ok(KeyState::Pending),
            "rejected" | "minions_rejected" => Ok(KeyState::Rejected),
            _ => Err(Error::UnknownState(s.to_owned())),
        }
    }
}

impl std::fmt::Display for KeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An entry of the `keys` bank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// Its state.
    pub state: KeyState,
    /// The minion's public key, PEM bytes as stored.
    pub public_key: Vec<u8>,
    /// Unix nanoseconds of the last write.
    pub mtime: u64,
}

/// An entry of the `keys` bank borrowed from the buffer it was read into
/// ([`crate::Store::get_in`], [`KeyBatch`]): no allocation per lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef<'a> {
    /// Its state.
    pub state: KeyState,
    /// The minion's public key, PEM bytes as stored.
    pub public_key: &'a [u8],
    /// Unix nanoseconds of the last write.
    pub mtime: u64,
}

impl KeyRef<'_> {
    /// An owned copy.
    pub fn to_entry(&self) -> KeyEntry {
        KeyEntry {
            state: self.state,
            public_key: self.public_key.to_vec(),
            mtime: self.mtime,
        }
    }
}

/// The reusable buffers of [`crate::Store::get_many_in`]: the keys of the last
/// batch, one after another in one buffer, and where each is. Reused across
/// batches, it makes them allocation-free once it has grown to a batch's
/// size.
#[derive(Debug, Default, Clone)]
pub struct KeyBatch {
    pub(crate) buf: Vec<u8>,
    pub(crate) entries: Vec<Option<(KeyState, Found)>>,
}

impl KeyBatch {
    /// An empty batch.
    pub fn new() -> KeyBatch {
        KeyBatch::default()
    }

    /// Number of ids in the last batch.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the last batch had no ids.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of the `i`-th id of the last batch; `None` when it has
    /// none (or `i` is past the batch).
    pub fn get(&self, i: usize) -> Option<KeyRef<'_>> {
        let (state, f) = self.entries.get(i).copied().flatten()?;
        Some(self.key_ref(state, &f))
    }

    /// The entries of the last batch, in the order of its ids.
    pub fn iter(&self) -> impl Iterator<Item = Option<KeyRef<'_>>> + '_ {
        self.entries
            .iter()
            .map(|e| e.map(|(state, f)| self.key_ref(state, &f)))
    }

    fn key_ref(&self, state: KeyState, f: &Found) -> KeyRef<'_> {
        KeyRef {
            state,
            public_key: &f.value(&self.buf)[1..],
            mtime: f.mtime,
        }
    }
}

/// Decodes a `keys` bank value; `None` when it is not one (Salt then answers
/// "no entry").
pub fn decode_key_value(value: &[u8]) -> Option<(KeyState, &[u8])> {
    if value.len() < 2 {
        return None;
    }
    Some((KeyState::from_byte(value[0])?, &value[1..]))
}

/// Encodes a `keys` bank value.
pub fn encode_key_value(state: KeyState, pem: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(pem.len() + 1);
    v.push(state.byte());
    v.extend_from_slice(pem);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_dirs_are_salts_folders_in_scan_order_and_match_the_states() {
        assert_eq!(
            TreeDir::ALL.map(TreeDir::name),
            [
                "minions",
                "minions_pre",
                "minions_rejected",
                "minions_denied"
            ]
        );
        for (i, d) in TreeDir::ALL.into_iter().enumerate() {
            assert_eq!(d.index(), i);
            assert_eq!(TreeDir::from_name(d.name()), Some(d));
            assert_eq!(d.to_string(), d.name());
        }
        assert_eq!(TreeDir::from_name("minions_autosign"), None);
        for s in KeyState::ALL {
            assert_eq!(TreeDir::of(s).state(), Some(s));
            assert_eq!(s.dir_name(), TreeDir::of(s).name());
            assert_eq!(s.dir_name().parse::<KeyState>().ok(), Some(s));
        }
        assert_eq!(TreeDir::MinionsDenied.state(), None);
    }

    /// Salt's names, and only those: the directory names and aliases the
    /// CLI parses are not states `mmap_key` stores.
    #[test]
    fn from_name_takes_salts_three_names_only() {
        for s in KeyState::ALL {
            assert_eq!(KeyState::from_name(s.name()), Some(s));
        }
        for alias in [
            "minions",
            "minions_pre",
            "unaccepted",
            "minions_rejected",
            "Accepted",
            "",
        ] {
            assert_eq!(KeyState::from_name(alias), None, "{alias}");
        }
        assert_eq!("minions".parse::<KeyState>().ok(), Some(KeyState::Accepted));
    }
}
