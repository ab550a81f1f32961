//! Both banks checked (and repaired) at once, findings confirmed under the
//! banks' locks before they are reported.

use super::*;

/// A finding in one bank of a store.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BankFinding {
    /// The bank: `keys` or `denied_keys`.
    pub bank: &'static str,
    /// The problem.
    pub finding: Finding,
}

/// What the repair of one bank of a store did.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BankRepair {
    /// The bank: `keys` or `denied_keys`.
    pub bank: &'static str,
    /// Entries in the rebuilt bank.
    pub kept: u64,
    /// Ids whose entry could not be read back intact, with why.
    pub lost: Vec<(String, String)>,
    /// Old heap segment files the rebuild removed (see
    /// [`Repaired::removed_segments`]).
    pub removed_segments: Vec<PathBuf>,
    /// Where the lost entries are listed ([`lost_path`]), when any was lost.
    pub lost_file: Option<PathBuf>,
    /// What a check of the rebuilt bank found (empty when it is clean; the
    /// entries just lost are there, as [`FindingKind::Lost`]).
    pub findings_after: Vec<Finding>,
}

/// The check of both banks of a store ([`check_store`]), and the repairs
/// made.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct VerifyReport {
    /// No finding in either bank (before any repair).
    pub clean: bool,
    /// What was found and confirmed under the bank's lock, `keys` bank
    /// first.
    pub findings: Vec<BankFinding>,
    /// Findings of the check without the lock that the check under the
    /// lock did not confirm (writes seen half done): not reported.
    pub unconfirmed: u64,
    /// The banks repaired: each bank found damaged under its lock, when a
    /// repair was asked.
    pub repaired: Vec<BankRepair>,
}

impl VerifyReport {
    /// Whether the store passed: clean, or repaired back to clean without
    /// losing an entry.
    pub fn passed(&self) -> bool {
        // A store with findings has a repair of each bank with findings
        // when, and only when, a repair was asked.
        self.clean
            || (!self.repaired.is_empty()
                && self
                    .repaired
                    .iter()
                    .all(|r| r.findings_after.is_empty() && r.lost.is_empty())
                && self
                    .findings
                    .iter()
                    .all(|f| self.repaired.iter().any(|r| r.bank == f.bank)))
    }
}

/// The same problem, as two checks report it.
pub(super) fn same(a: &Finding, b: &Finding) -> bool {
    a.kind == b.kind && a.file == b.file && a.slot == b.slot && a.id == b.id
}

/// Whether `e` says the bank's lock file may not be opened or locked by
/// this user (a read-only store, a verify by another user).
fn lock_refused(e: &crate::Error) -> bool {
    matches!(e, crate::Error::Io { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem))
}

/// The findings of `found` (a check without the lock) that are in the
/// files: the bank is checked again under its lock, and that check's
/// findings are the answer. Where the lock may not be taken (no write
/// access), only the findings that three more checks, 100 ms apart, all
/// see again are kept.
fn confirm(t: &Table, check: Option<ValueCheck>, found: Vec<Finding>) -> Result<Vec<Finding>> {
    match verify_locked(t, check) {
        Ok(f) => Ok(f),
        Err(e) if lock_refused(&e) => {
            let mut keep = found;
            for _ in 0..3 {
                if keep.is_empty() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
                let again = verify(t, check)?;
                keep.retain(|f| again.iter().any(|g| same(f, g)));
            }
            Ok(keep)
        }
        Err(e) => Err(e),
    }
}

/// Checks both banks of `store` (the `keys` values as `[state][public
/// key]`) and, when `repair`, rebuilds each damaged bank from its intact
/// entries ([`repair`]) and checks it again.
///
/// A bank is first checked without its lock, so that a clean bank costs
/// its writers nothing; when that check finds something, the bank is
/// checked again under its lock, and only what that check finds is
/// reported (a bank that Salt writes meanwhile is not reported damaged for
/// a write seen half done). A repair decides under the lock too.
pub fn check_store(store: &crate::Store, repair: bool) -> Result<VerifyReport> {
    let banks: [(&'static str, &Table, Option<ValueCheck>); 2] = [
        ("keys", store.keys_table(), Some(check_key_value)),
        ("denied_keys", store.denied_table(), None),
    ];
    let mut findings = Vec::new();
    let mut repaired = Vec::new();
    let mut unconfirmed = 0u64;
    for (bank, t, check) in banks {
        let mut found = verify(t, check)?;
        if !found.is_empty() {
            let first = found.clone();
            found = confirm(t, check, found)?;
            unconfirmed += first
                .iter()
                .filter(|f| !found.iter().any(|g| same(f, g)))
                .count() as u64;
        }
        if repair && found.iter().any(|f| f.kind != FindingKind::Lost) {
            let r = self::repair(t, check)?;
            if r.rebuilt {
                repaired.push(BankRepair {
                    bank,
                    kept: r.kept,
                    lost: r.lost,
                    removed_segments: r.removed_segments,
                    lost_file: r.lost_file,
                    findings_after: verify_locked(t, check)?,
                });
            } else {
                // Mended meanwhile (a writer repairs a roster on its own):
                // what is left.
                found = verify_locked(t, check)?;
            }
        }
        findings.extend(
            found
                .into_iter()
                .map(|finding| BankFinding { bank, finding }),
        );
    }
    Ok(VerifyReport {
        clean: findings.is_empty(),
        findings,
        unconfirmed,
        repaired,
    })
}
