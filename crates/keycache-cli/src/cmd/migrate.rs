//! `keycache migrate`: a `localfs_key` tree into `mmap_key` banks.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use keycache::migrate::{self, MigrateOptions, Report as MigrateReport};

use crate::args::{announce_lock_wait, Json, Layout, User};
use crate::output::{esc, esc_path, outln, print_json, CmdResult};

/// The arguments of `keycache migrate`.
#[derive(Debug, clap::Args)]
#[command(
    mut_arg("user", |a| a.help("Owner of the files written (USER[:GROUP], names or numbers), e.g. the Salt master's `user`. Default: the owner of the target directory")),
    mut_arg("json", |a| a.help("Print the report as one JSON document on stdout")),
)]
pub(crate) struct Args {
    /// The master's pki_dir.
    pki_dir: PathBuf,
    /// Write the banks here (the cluster_pki_dir) instead of PKI_DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Count and report, write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Drop entries of the target banks that the tree does not have.
    #[arg(long)]
    replace: bool,
    /// Skip ids longer than --id-size instead of refusing the tree.
    #[arg(long)]
    skip_long_ids: bool,
    #[command(flatten)]
    user: User,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// Runs `keycache migrate`.
pub(crate) fn run(a: Args) -> CmdResult {
    let ownership = a.user.ownership()?;
    let target = a.out.clone().unwrap_or_else(|| a.pki_dir.clone());
    let params = a.layout.params_of(&target, !a.dry_run)?;
    if !a.dry_run {
        announce_lock_wait(&target);
    }
    let opts = MigrateOptions {
        rebuild_settle: a.layout.options(params).rebuild_settle,
        params,
        out: a.out,
        dry_run: a.dry_run,
        replace: a.replace,
        skip_long_ids: a.skip_long_ids,
        ownership,
    };
    let report = migrate_with_progress(&a.pki_dir, &opts)?;
    if a.json.json {
        print_json(&report);
    } else {
        print_text(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// Migrates, with a progress bar on stderr when it is a terminal.
fn migrate_with_progress(
    pki_dir: &std::path::Path,
    opts: &MigrateOptions,
) -> keycache::Result<MigrateReport> {
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} reading keys {pos}/{len} [{bar:30}] {per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let report = migrate::migrate(pki_dir, opts, &progress);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    report
}

fn print_text(report: &MigrateReport) {
    let c = &report.migrated;
    outln!(
        "{} {} -> {}",
        if report.dry_run {
            "would migrate"
        } else {
            "migrated"
        },
        esc_path(&report.pki_dir),
        esc_path(&report.target)
    );
    outln!(
        "  accepted: {}\n  pending:  {}\n  rejected: {}\n  denied:   {}",
        c.accepted,
        c.pending,
        c.rejected,
        c.denied
    );
    let k = &report.kept;
    if k.accepted + k.pending + k.rejected + k.denied > 0 {
        outln!(
            "kept from the existing banks: {} accepted, {} pending, {} rejected, {} denied",
            k.accepted,
            k.pending,
            k.rejected,
            k.denied
        );
    }
    if report.dropped > 0 {
        outln!(
            "dropped from the existing banks (--replace): {}",
            report.dropped
        );
    }
    for d in &report.duplicates {
        let states: Vec<&str> = d.found_in.iter().map(|s| s.name()).collect();
        outln!(
            "duplicate: {} found {} -> {}",
            esc(&d.id),
            states.join(", "),
            d.state
        );
    }
    for s in &report.skipped {
        // The reason's name is its serde name (`dot_file`, `not_a_public_key`).
        let reason = serde_json::to_value(&s.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        outln!("skipped: {} ({reason}: {})", esc(&s.path), esc(&s.detail));
    }
    outln!(
        "table size {} ({:.2}% full), {:.3} s",
        report.size,
        report.load_factor * 100.0,
        report.seconds
    );
}
