//! The whole check of a store as `keycache verify [--repair]` and `salt-run
//! keycache.verify` run it ([`check_and_mend`]): both banks, then the key tree
//! Salt's `validate_token` reads, each mended when asked.

use std::time::SystemTime;

use crate::audit::{self, Actor};
use crate::error::Result;
use crate::store::Store;
use crate::tree::{self, TreeDisagreement, TreeRepair};

use super::{check_store, missing_key_tree, BankFinding, VerifyReport};

/// The report of [`check_and_mend`]: the banks', and the tree's when it was
/// checked (the JSON of `keycache verify --json`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StoreVerify {
    /// The banks'.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub report: VerifyReport,
    /// The key tree's.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub tree: Option<TreeVerify>,
}

/// The key tree's part of a [`StoreVerify`].
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TreeVerify {
    /// What disagrees with the store (after the repair, when repaired).
    pub disagreements: Vec<TreeDisagreement>,
    /// What the repair did.
    pub repaired: Option<TreeRepair>,
}

impl StoreVerify {
    /// Whether the key tree, when checked, agrees with the store.
    pub fn tree_ok(&self) -> bool {
        self.tree
            .as_ref()
            .is_none_or(|t| t.disagreements.is_empty())
    }

    /// Whether the store passed: clean (or repaired back to clean without
    /// losing an entry), its tree in step.
    pub fn passed(&self) -> bool {
        self.report.passed() && self.tree_ok()
    }
}

/// Checks `store` (its tree as [`Store::tree`] says; `auto_tree`: the tree
/// mode is auto, so a store with accepted keys and no tree at all is a
/// finding) and, with `repair`, mends it: the damaged banks rebuilt, the
/// entries they lost recorded in the audit trail as removed by `actor`
/// (action `repair`), the tree made equal to the store.
pub fn check_and_mend(
    store: &Store,
    repair: bool,
    auto_tree: bool,
    actor: &Actor,
) -> Result<StoreVerify> {
    let tree_on = store.tree().is_on();
    if repair && tree_on {
        // Before anything is repaired: a tree mended toward no store loses
        // every key file.
        tree::require_store(store)?;
    }
    let mut report = check_store(store, repair)?;
    // The entries a repair could not keep leave the store: each a change
    // of the key state, recorded once the rebuild is done (what the entry
    // held cannot be read: no states, no fingerprint).
    let mut by = actor.clone();
    by.action = Some("repair".into());
    let now = SystemTime::now();
    let lost: Vec<audit::Record> = report
        .repaired
        .iter()
        .flat_map(|r| r.lost.iter())
        .map(|(id, _)| by.record(id, now))
        .collect();
    audit::append(store.dir(), &lost)?;
    // A store with accepted keys and no tree at all (auto finds none to
    // compare): Salt's validate_token refuses every accepted minion.
    let no_tree = if auto_tree && !tree_on {
        missing_key_tree(store)?
    } else {
        None
    };
    let tree = if tree_on || (repair && no_tree.is_some()) {
        let repaired = if repair {
            Some(tree::mend(store)?)
        } else {
            None
        };
        match tree::check(store) {
            Ok(disagreements) => Some(TreeVerify {
                disagreements,
                repaired,
            }),
            // An entry of the damaged banks cannot be read: they are
            // reported; the tree is compared once they are repaired.
            Err(e) if e.is_corrupt() && !report.clean && !repair => None,
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    if let (Some(finding), false) = (no_tree, repair) {
        report.findings.push(BankFinding {
            bank: "keys",
            finding,
        });
        report.clean = false;
    }
    let mut out = StoreVerify { report, tree };
    // `clean` says there is nothing to report: never beside the tree's
    // findings.
    if !out.tree_ok() {
        out.report.clean = false;
    }
    Ok(out)
}
