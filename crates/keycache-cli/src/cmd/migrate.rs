//! `keycache migrate`: a `localfs_key` tree into `mmap_key` banks.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use keycache::master_keys::{MasterKeysReport, OnDiffer};
use keycache::migrate::{MigrateOptions, Report as MigrateReport};
use keycache::table::OpenOptions;
use keycache_config::migrate::{self, Dirs, Job, MasterId, MigrateError, Migrated};

use crate::args::{announce_lock_wait, Json, StoreArgs, User};
use crate::master_config::{Origin, Setting};
use crate::output::{errln, esc, esc_path, outln, print_json, CmdError, CmdResult};

/// The arguments of `keycache migrate`.
#[derive(Debug, clap::Args)]
#[command(
    mut_arg("user", |a| a.help("Owner of the files written (USER[:GROUP], names or numbers), e.g. the Salt master's `user`. Default: the owner of the target directory")),
    mut_arg("json", |a| a.help("Print the report as one JSON document on stdout")),
)]
pub(crate) struct Args {
    /// The master's pki_dir. Default: the master config's (see -c).
    pki_dir: Option<PathBuf>,
    /// Write the banks here (the cluster_pki_dir) instead of PKI_DIR, with
    /// the key tree (minions/, ...) that Salt's validate_token reads there.
    /// Default: the master config's cluster_pki_dir when it sets
    /// cluster_id, else PKI_DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The master's id as Salt's opts hold it (the config's `id`, else
    /// `<host>_master`), which names its key pair in the master_keys bank.
    /// Default: the master config's `id` (with -c or --master-config), else
    /// read off the `master.pem` symlink of a Salt 3008 pki_dir.
    #[arg(long, value_name = "ID")]
    master_id: Option<String>,
    /// Leave the master_keys bank (the master's own keys) alone.
    #[arg(long, conflicts_with = "replace_master_keys")]
    no_master_keys: bool,
    /// Replace master_keys entries whose bytes differ from the files (by
    /// default the migration refuses, writing nothing: the bank's may be a
    /// newer key that Salt wrote there).
    #[arg(long)]
    replace_master_keys: bool,
    /// Count and report, write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Drop entries of the target banks (and key files of the target's key
    /// tree, with --out) that the tree does not have.
    #[arg(long)]
    replace: bool,
    /// Into an existing store: take the changes out of accepted or rejected
    /// that tree files older than the store's entries make (files left
    /// from before an earlier migration); by default the migration
    /// refuses them, writing nothing.
    #[arg(long)]
    replace_states: bool,
    /// Skip ids longer than --id-size instead of refusing the tree.
    #[arg(long)]
    skip_long_ids: bool,
    #[command(flatten)]
    user: User,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// Runs `keycache migrate`.
pub(crate) fn run(a: Args) -> CmdResult {
    let ownership = a.user.ownership()?;
    let given = a.pki_dir.clone().unwrap_or_default();
    let config = a.layout.config(&given)?;
    // The master's pki_dir (its own keys): PKI_DIR, which stands for the
    // config's pki_dir option, else the config's.
    let pki_dir = match (&config, &a.pki_dir) {
        (Some(cfg), None) => cfg.pki_dir().value,
        _ => given.clone(),
    };
    // A cluster peer's cluster_pki_dir: --out, else the config's when it
    // sets cluster_id (Salt's fallback to pki_dir following PKI_DIR).
    let from_config = match (&config, &a.out) {
        (Some(cfg), None) if cfg.clustered => cfg.cluster_pki_dir_for(Setting {
            value: pki_dir.clone(),
            from: match &a.pki_dir {
                Some(_) => Origin::Flag {
                    flag: "PKI_DIR".into(),
                },
                None => cfg.pki_dir().from,
            },
        }),
        _ => None,
    };
    let cluster_dir = a
        .out
        .clone()
        .or_else(|| from_config.as_ref().map(|c| c.value.clone()));
    // The tree read: where Salt keeps it, whether PKI_DIR is named or not:
    // a cluster peer's cluster_pki_dir (Salt's rebuild_from_localfs,
    // localfs_key and validate_token all use it; MasterKeys keeps only the
    // master's own keys in pki_dir), else PKI_DIR. With --out, PKI_DIR's
    // tree goes into the --out banks (a master becoming a cluster peer).
    let tree = match (&a.out, &cluster_dir) {
        (None, Some(c)) => c.clone(),
        _ => pki_dir.clone(),
    };
    if a.pki_dir.is_some() && tree != pki_dir {
        errln!(
            "keycache: cluster_id is set: the minion key tree is read from cluster_pki_dir {}, \
             as Salt reads it; PKI_DIR {} gives the master's own keys (to migrate PKI_DIR's \
             tree, name the banks' directory with --out)",
            esc_path(&tree),
            esc_path(&pki_dir)
        );
    }
    let target = cluster_dir.clone().unwrap_or_else(|| pki_dir.clone());
    // Said on stderr with where it comes from: a flag, or the config.
    let resolved = match (&a.out, &from_config, &a.pki_dir) {
        (Some(out), _, _) => a.layout.resolve_from(out, "--out", !a.dry_run)?,
        (None, Some(c), _) if !matches!(c.from, Origin::Flag { .. }) => {
            a.layout.resolve(Path::new(""), !a.dry_run)?
        }
        (None, _, Some(p)) => a.layout.resolve_from(p, "PKI_DIR", !a.dry_run)?,
        (None, _, None) => a.layout.resolve(Path::new(""), !a.dry_run)?,
    };
    debug_assert_eq!(resolved.dir, target);
    let params = resolved.params;
    if !a.dry_run {
        announce_lock_wait(&target);
    }
    let open = OpenOptions {
        ownership,
        ..a.layout.options(params)
    };
    let job = Job {
        opts: MigrateOptions {
            rebuild_settle: open.rebuild_settle,
            params,
            out: cluster_dir.clone(),
            dry_run: a.dry_run,
            replace: a.replace,
            replace_states: a.replace_states,
            skip_long_ids: a.skip_long_ids,
            ownership,
            ..MigrateOptions::default()
        },
        master_id: (!a.no_master_keys).then(|| {
            let flag = a.master_id.clone().map(|id| (id, "--master-id"));
            migrate::master_id(flag, config.as_ref(), &pki_dir)
        }),
        on_differ: if a.replace_master_keys {
            OnDiffer::Replace
        } else {
            OnDiffer::Refuse
        },
        dirs: Dirs {
            pki_dir,
            cluster_dir,
            tree,
        },
        open,
    };
    let out = migrate_with_progress(&job)?;
    if a.json.json {
        print_json(&out);
    } else {
        print_text(&out.report);
        if let (Some(r), Some(m)) = (&out.master_keys, &out.master_id) {
            print_master_keys(r, m);
        }
    }
    let report = &out.report;
    let stale = report.changes.iter().filter(|c| c.stale).count();
    if report.dry_run && stale > 0 && !a.replace_states {
        errln!(
            "keycache: {stale} change(s) out of accepted or rejected come from key files older \
             than the store's entries: the migration will refuse them, writing nothing, unless \
             --replace-states"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The master keys part of the text report: names only.
fn print_master_keys(r: &MasterKeysReport, id: &MasterId) {
    let names = |v: &[String]| v.iter().map(|n| esc(n)).collect::<Vec<_>>().join(", ");
    outln!(
        "master_keys: {} written, {} unchanged (master id {}, from {})",
        r.written.len(),
        r.unchanged.len(),
        esc(&id.id),
        esc(&id.from)
    );
    if !r.written.is_empty() {
        outln!("  written: {}", names(&r.written));
    }
    if !r.replaced.is_empty() {
        outln!(
            "  replaced (--replace-master-keys; the bank held other bytes): {}",
            names(&r.replaced)
        );
    }
    if !r.kept.is_empty() {
        outln!("  kept (in the bank, no file): {}", names(&r.kept));
    }
    for s in &r.skipped {
        outln!("  skipped: {} ({})", esc_path(&s.path), s.reason.describe());
    }
}

/// Migrates, with a progress bar on stderr when it is a terminal.
fn migrate_with_progress(job: &Job) -> Result<Migrated, CmdError> {
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
    let out = migrate::migrate(job, &progress);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    out.map_err(|e| match e {
        MigrateError::Store(e) => CmdError::from(e),
        e => CmdError::usage(esc(&e.to_string())),
    })
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
    for c in &report.changes {
        let to = c.to.map_or("absent", |s| s.name());
        let by = match &c.file {
            Some(f) => format!("by {}", esc_path(f)),
            None => "(--replace: not in the tree)".to_owned(),
        };
        outln!(
            "{}: {} {} -> {to} {by}{}",
            if report.dry_run {
                "would change"
            } else {
                "changed"
            },
            esc(&c.id),
            c.from,
            if c.stale {
                ", a file older than the store's entry (--replace-states)"
            } else {
                ""
            }
        );
    }
    for p in &report.minions_removed {
        outln!(
            "{} {}: the store does not hold it accepted",
            if report.dry_run {
                "would remove"
            } else {
                "removed"
            },
            esc_path(p)
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
    if let Some(dir) = &report.tree_dir {
        if report.dry_run {
            outln!(
                "would write the key tree (minions/, ...) into {}: Salt's validate_token reads it there",
                esc_path(dir)
            );
        } else {
            outln!(
                "key tree (minions/, ...) written into {}: {} files written, {} removed",
                esc_path(dir),
                report.tree_written,
                report.tree_removed
            );
        }
    }
    outln!(
        "table size {} ({:.2}% full), {:.3} s",
        report.size,
        report.load_factor * 100.0,
        report.seconds
    );
}
