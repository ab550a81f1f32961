//! The consistency check: the replica's digest against etcd's at the revision
//! the store holds, and whether a list should mend a difference.

use etcd_client::Client;

use crate::error::Result;
use crate::metrics::Relist;
use crate::report::Report;
use crate::state::{boot_ms, CheckResult};

use super::{Next, Replicator};

/// The first etcd 3.5 release whose progress notifications never run
/// ahead of the events of their revision (etcd issue 15220).
const PROGRESS_EXACT: (u32, u32, u32) = (3, 5, 8);

impl Replicator {
    /// The consistency check at the revision the store holds: `Some(List)`
    /// when the replica differs from etcd and a list should mend it.
    pub(super) async fn check(&mut self, client: &mut Client) -> Result<Option<Next>> {
        // The store holds etcd's prefix as of the last proof too, when the
        // member's progress notifications come after the events of their
        // revision (3.5.8 and later): checked there, a quiet prefix is not
        // skipped for a revision etcd compacted long ago.
        let exact = self
            .versions
            .get(&self.member)
            .is_some_and(|v| v.is_some_and(|v| v >= PROGRESS_EXACT));
        let revision = if exact {
            self.state.revision.max(self.state.current_through)
        } else {
            self.state.revision
        };
        let local = crate::check::local(&self.store)?;
        let remote = crate::check::remote(client, &self.settings, &self.store, revision).await?;
        let last = self.state.check.clone();
        let (mut runs, mut differed) = last.map_or((0, 0), |c| (c.runs, c.differed));
        runs += 1;
        let (result, entries) = match remote {
            None => ("skipped", 0),
            Some(d) if d == local => ("equal", d.entries),
            Some(d) if self.listed_for_check || self.not_held == Some(d.minus(&local)) => {
                self.not_held = Some(d.minus(&local));
                ("not_held", d.entries)
            }
            Some(d) => ("differed", d.entries),
        };
        if result == "equal" {
            self.not_held = None;
        }
        if result == "differed" || result == "not_held" {
            differed += 1;
        }
        // The key tree against the store (after the replicator's own
        // writes, which keep it in step): what is left was done by hand.
        let tree = if self.store.tree().is_on() {
            Some(keycache::tree::check(&self.store)?)
        } else {
            None
        };
        self.state.check = Some(CheckResult {
            revision,
            result: result.to_owned(),
            entries,
            boot_ms: boot_ms(),
            runs,
            differed,
            tree: tree.as_ref().map(|t| t.len() as u64),
            tree_first: tree.as_ref().and_then(|t| t.first()).map(|d| d.to_string()),
        });
        self.write_state()?;
        (self.report)(Report::Checked {
            revision,
            entries,
            result,
        });
        if let Some(t) = tree.filter(|t| !t.is_empty()) {
            (self.report)(Report::TreeDisagrees {
                count: t.len() as u64,
                first: t[0].to_string(),
            });
        }
        self.listed_for_check = result == "differed";
        // The audit trail's retention: a failure is reported, and the next
        // check tries again.
        match crate::audit::trim(client, &self.settings, std::time::SystemTime::now()).await {
            Ok(0) => {}
            Ok(deleted) => (self.report)(Report::AuditTrimmed { deleted }),
            Err(e) => (self.report)(Report::AuditTrimFailed { why: e.to_string() }),
        }
        Ok((result == "differed").then_some(Next::List(Relist::CheckDiffers)))
    }
}
