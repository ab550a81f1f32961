//! `keycache migrate`: a `localfs_key` tree into `mmap_key` banks.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use keycache::master_keys::{self, MasterKeyOptions, MasterKeysReport};
use keycache::migrate::{self, MigrateOptions, Report as MigrateReport};
use keycache::table::OpenOptions;

use crate::args::{announce_lock_wait, Json, Layout, User};
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
    /// Write the banks here (the cluster_pki_dir) instead of PKI_DIR.
    /// Default: the master config's cluster_pki_dir when it sets
    /// cluster_id, else PKI_DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The master's id as Salt's opts hold it (`<host>_master`), which
    /// names its key pair in the master_keys bank. Default: read off the
    /// `master.pem` symlink of a Salt 3008 pki_dir.
    #[arg(long, value_name = "ID")]
    master_id: Option<String>,
    /// Leave the master_keys bank (the master's own keys) alone.
    #[arg(long)]
    no_master_keys: bool,
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

/// The report of `keycache migrate`: the key banks' and the master's keys'.
#[derive(serde::Serialize)]
struct Out<'a> {
    #[serde(flatten)]
    report: &'a MigrateReport,
    master_keys: Option<MasterKeysReport>,
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
    let opts = MigrateOptions {
        rebuild_settle: open.rebuild_settle,
        params,
        out: cluster_dir.clone(),
        dry_run: a.dry_run,
        replace: a.replace,
        skip_long_ids: a.skip_long_ids,
        ownership,
    };
    let report = migrate_with_progress(&tree, &opts)?;
    let master_keys = if a.no_master_keys {
        None
    } else {
        migrate_master_keys(
            &pki_dir,
            cluster_dir.as_deref(),
            a.master_id,
            a.dry_run,
            &open,
        )?
    };
    if a.json.json {
        print_json(&Out {
            report: &report,
            master_keys,
        });
    } else {
        print_text(&report);
        if let Some(m) = &master_keys {
            print_master_keys(m);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The master's id off a Salt 3008 pki_dir: `master.pem` is a symlink to
/// `<master_id>.pem` there (crypt.py `_setup_keys`), and the id is that
/// with `_master`.
fn master_id_of(pki_dir: &Path) -> Option<String> {
    let target = std::fs::read_link(pki_dir.join("master.pem")).ok()?;
    let name = target.file_name()?.to_str()?;
    let stem = name.strip_suffix(".pem")?;
    (target
        .parent()
        .is_none_or(|p| p.as_os_str().is_empty() || p == pki_dir)
        && !stem.is_empty())
    .then(|| format!("{stem}_master"))
}

/// Copies the master's own keys into the `master_keys` bank (a plan only
/// with `dry_run`); `None` when the tree holds none of them.
fn migrate_master_keys(
    pki_dir: &Path,
    cluster_dir: Option<&Path>,
    master_id: Option<String>,
    dry_run: bool,
    open: &OpenOptions,
) -> Result<Option<MasterKeysReport>, CmdError> {
    // Without an id, "master": its pair is `master.pem`/`.pub`, which Salt
    // renames to its id's own names when it first starts.
    let id = master_id
        .or_else(|| master_id_of(pki_dir))
        .unwrap_or_else(|| "master".into());
    let collected = master_keys::collect(pki_dir, cluster_dir, &MasterKeyOptions::new(id))?;
    if collected.files.is_empty() {
        return Ok(None);
    }
    let dir = master_keys::store_dir(pki_dir, cluster_dir);
    let report = if dry_run {
        master_keys::plan(dir, &collected, open)?
    } else {
        master_keys::write(dir, &collected, open)?
    };
    Ok(Some(report))
}

/// The master keys part of the text report: names only.
fn print_master_keys(r: &MasterKeysReport) {
    let names = |v: &[String]| v.iter().map(|n| esc(n)).collect::<Vec<_>>().join(", ");
    outln!(
        "master_keys: {} written, {} unchanged",
        r.written.len(),
        r.unchanged.len()
    );
    if !r.written.is_empty() {
        outln!("  written: {}", names(&r.written));
    }
    if !r.replaced.is_empty() {
        outln!(
            "  replaced (the bank held other bytes): {}",
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
