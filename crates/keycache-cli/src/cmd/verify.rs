//! `keycache verify [--repair]`: the consistency check of both banks.

use keycache::verify::{check_and_mend, BankFinding, TreeVerify, VerifyReport};

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

/// Runs `keycache verify`: exit code 0 when the store (and its key tree,
/// when checked) is clean, or was repaired back to clean without losing an
/// entry.
pub(crate) fn run(a: Args) -> CmdResult {
    // The mode decides which state directories are compared and mended.
    let (store, mode, master) =
        TreeMode::open_master(a.tree, &a.layout, &a.store.dir(), TreeMode::Auto)?;
    let actor = crate::args::actor(master, a.reason.reason.clone(), None);
    let out = check_and_mend(&store, a.repair, mode == TreeMode::Auto, &actor)?;
    if a.json.json {
        print_json(&out);
    } else {
        print_text(&out.report);
        if let Some(t) = &out.tree {
            print_tree(t);
        }
        if out.report.clean && out.tree_ok() {
            outln!("{}: clean", esc_path(store.dir()));
        }
    }
    Ok(exit(out.passed()))
}

fn print_tree(t: &TreeVerify) {
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
