//! `keycache verify [--repair]`: the consistency check of both banks.

use keycache::tree::{TreeDisagreement, TreeRepair};
use keycache::verify::{check_store, missing_key_tree, BankFinding, VerifyReport};

use crate::args::{ConfiguredStore, Json, StoreArgs};
use crate::cmd::state::TreeMode;
use crate::output::{esc_path, exit, json_str, outln, print_json, print_tree_changes, CmdResult};

/// The arguments of `keycache verify`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// Rebuild each damaged bank from its intact entries, atomically, and
    /// list what was lost (also in the bank's `.keycache-lost` file, which
    /// later runs report until the keys are back)
    #[arg(long)]
    repair: bool,
    #[command(flatten)]
    reason: crate::args::Reason,
    /// Also compare the localfs_key tree (minions/, minions_pre/, ...) with
    /// the store, which Salt's validate_token reads on every request
    /// (`--repair` makes it equal to the store, and refuses a directory
    /// without a store: run `keycache migrate` first): always, never, or
    /// auto, when the store's directory holds a `minions` entry (auto
    /// reports a store with accepted keys and no `minions` as a finding,
    /// which `--repair` mends by writing the tree); `accepted`: minions/
    /// alone. Default: the master config's keycache_tree when the config
    /// is read (false: never, accepted: accepted), else auto.
    #[arg(long, value_enum, value_name = "WHEN")]
    tree: Option<TreeMode>,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// What `keycache verify` prints with `--json`: the banks' report, and the
/// tree's when it was checked.
#[derive(serde::Serialize)]
struct Out<'a> {
    #[serde(flatten)]
    report: &'a VerifyReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    tree: Option<TreeOut>,
}

/// The key tree's part of the report.
#[derive(serde::Serialize)]
struct TreeOut {
    /// What disagrees with the store (after the repair, with `--repair`).
    disagreements: Vec<TreeDisagreement>,
    /// What `--repair` did.
    repaired: Option<TreeRepair>,
}

/// Runs `keycache verify`: exit code 0 when the store (and its key tree,
/// when checked) is clean, or was repaired back to clean without losing an
/// entry.
pub(crate) fn run(a: Args) -> CmdResult {
    // The mode decides which state directories are compared and mended.
    let (store, mode, master) =
        TreeMode::open_master(a.tree, &a.layout, &a.store.dir(), TreeMode::Auto)?;
    let tree_on = store.tree().is_on();
    if a.repair && tree_on {
        // Before anything is repaired: a tree mended toward no store loses
        // every key file.
        keycache::tree::require_store(&store)?;
    }
    let mut report = check_store(&store, a.repair)?;
    // The entries a repair could not keep leave the store: each a change
    // of the key state, recorded once the rebuild is done (what the entry
    // held cannot be read: no states, no fingerprint).
    let lost: Vec<keycache::audit::Record> = report
        .repaired
        .iter()
        .flat_map(|r| r.lost.iter())
        .map(|(id, _)| {
            crate::args::actor(master.clone(), a.reason.reason.clone(), Some("repair"))
                .record(id, std::time::SystemTime::now())
        })
        .collect();
    keycache::audit::append(store.dir(), &lost)?;
    // A store with accepted keys and no tree at all (auto finds none to
    // compare): Salt's validate_token refuses every accepted minion.
    let no_tree = if mode == TreeMode::Auto && !tree_on {
        missing_key_tree(&store)?
    } else {
        None
    };
    let tree = if tree_on || (a.repair && no_tree.is_some()) {
        let repaired = if a.repair {
            Some(keycache::tree::mend(&store)?)
        } else {
            None
        };
        match keycache::tree::check(&store) {
            Ok(disagreements) => Some(TreeOut {
                disagreements,
                repaired,
            }),
            // An entry of the damaged banks cannot be read: they are
            // reported; the tree is compared once they are repaired.
            Err(e) if e.is_corrupt() && !report.clean && !a.repair => None,
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    if let (Some(finding), false) = (no_tree, a.repair) {
        report.findings.push(BankFinding {
            bank: "keys",
            finding,
        });
        report.clean = false;
    }
    let tree_ok = tree.as_ref().is_none_or(|t| t.disagreements.is_empty());
    // `clean` says there is nothing to report: never beside the tree's
    // findings.
    if !tree_ok {
        report.clean = false;
    }
    if a.json.json {
        print_json(&Out {
            report: &report,
            tree,
        });
    } else {
        print_text(&report);
        if let Some(t) = &tree {
            print_tree(t);
        }
        if report.clean && tree_ok {
            outln!("{}: clean", esc_path(store.dir()));
        }
    }
    Ok(exit(report.passed() && tree_ok))
}

fn print_tree(t: &TreeOut) {
    if let Some(r) = &t.repaired {
        print_tree_changes("tree: ", "", &r.written, &r.removed);
    }
    for d in &t.disagreements {
        outln!("tree: {}", crate::output::esc(&d.to_string()));
    }
}

/// `bank: file[ @offset][ slot N][ id "ID"]: what`.
fn finding_line(f: &BankFinding) -> String {
    let BankFinding { bank, finding: f } = f;
    let mut loc = format!("{}", f.file.display());
    if let Some(o) = f.offset {
        loc.push_str(&format!(" @{o}"));
    }
    if let Some(s) = f.slot {
        loc.push_str(&format!(" slot {s}"));
    }
    if let Some(i) = &f.id {
        loc.push_str(&format!(" id {i:?}"));
    }
    format!("{bank}: {loc}: {}", f.what)
}

fn print_text(report: &VerifyReport) {
    for f in &report.findings {
        outln!("{}", finding_line(f));
    }
    // The bank and the lost ids and reasons are printed as JSON strings,
    // quotes and all, as they always were.
    for r in &report.repaired {
        outln!(
            "repaired {}: kept {} entries, lost {}",
            json_str(r.bank),
            r.kept,
            r.lost.len()
        );
        for (id, why) in &r.lost {
            outln!("  lost {}: {}", json_str(id), json_str(why));
        }
        for p in &r.removed_segments {
            outln!(
                "  removed {} (its records moved; no live entry points into it)",
                json_str(&p.display().to_string())
            );
        }
        if let Some(p) = &r.lost_file {
            outln!(
                "  lost entries listed in {}",
                json_str(&p.display().to_string())
            );
        }
        for f in &r.findings_after {
            outln!(
                "  after: {}",
                finding_line(&BankFinding {
                    bank: r.bank,
                    finding: f.clone()
                })
            );
        }
    }
}
