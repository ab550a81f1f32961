//! `keycache verify [--repair]`: the consistency check of both banks.

use keycache::verify::{check_store, BankFinding, VerifyReport};

use crate::args::{Json, Layout, StoreDir};
use crate::output::{exit, json_str, print_json, CmdResult};

/// The arguments of `keycache verify`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: StoreDir,
    /// Rebuild each damaged bank from its intact entries, atomically, and
    /// list what was lost (also in the bank's `.keycache-lost` file, which
    /// later runs report until the keys are back)
    #[arg(long)]
    repair: bool,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// Runs `keycache verify`: exit code 0 when the store is clean, or was
/// repaired back to clean without losing an entry.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir)?;
    let report = check_store(&store, a.repair)?;
    if a.json.json {
        print_json(&report);
    } else {
        print_text(&report);
        if report.clean {
            println!("{}: clean", store.dir().display());
        }
    }
    Ok(exit(report.passed()))
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
        println!("{}", finding_line(f));
    }
    // The bank and the lost ids and reasons are printed as JSON strings,
    // quotes and all, as they always were.
    for r in &report.repaired {
        println!(
            "repaired {}: kept {} entries, lost {}",
            json_str(r.bank),
            r.kept,
            r.lost.len()
        );
        for (id, why) in &r.lost {
            println!("  lost {}: {}", json_str(id), json_str(why));
        }
        for p in &r.removed_segments {
            println!(
                "  removed {} (its records moved; no live entry points into it)",
                json_str(&p.display().to_string())
            );
        }
        if let Some(p) = &r.lost_file {
            println!(
                "  lost entries listed in {}",
                json_str(&p.display().to_string())
            );
        }
        for f in &r.findings_after {
            println!(
                "  after: {}",
                finding_line(&BankFinding {
                    bank: r.bank,
                    finding: f.clone()
                })
            );
        }
    }
}
