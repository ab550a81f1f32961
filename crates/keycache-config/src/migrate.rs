//! The migration of a master's `localfs_key` tree and own key files into
//! its store, as `keycache migrate` and `salt-run keycache.migrate` both
//! run it ([`migrate`]): the master's keys are found and checked first (a
//! refusal writes nothing), then the key banks are written, then the
//! `master_keys` bank.

use std::path::{Path, PathBuf};

use keycache::master_keys::{self, MasterKeyOptions, MasterKeysReport, OnDiffer};
use keycache::migrate::{MigrateOptions, Report};
use keycache::table::OpenOptions;
use serde::Serialize;

use crate::MasterConfig;

/// Why a migration was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The engine's error (nothing written when it refused).
    #[error(transparent)]
    Store(#[from] keycache::Error),
    /// The master has key files, but the bank would not hold its pair
    /// under the names Salt's `MasterKeys` looks for: Salt would generate
    /// a new pair. Nothing was written.
    #[error(
        "{}: the master's key pair is not where Salt's MasterKeys looks for it \
         ({master}.pem, else master.pem, for the master id {id} from {from}), but the \
         directory holds master key files ({}): migrated so, the master would generate a new \
         pair and its minions (and cluster peers) would refuse it. Give the master's id as \
         Salt's opts hold it (`id` in the master config read with -c, or --master-id ID), or \
         leave the master_keys bank alone with --no-master-keys; nothing was written",
        pki_dir.display(),
        files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    MasterPairMisplaced {
        /// The master's pki_dir.
        pki_dir: PathBuf,
        /// The id without `_master`.
        master: String,
        /// The master id used.
        id: String,
        /// Where it came from.
        from: String,
        /// The master's key files found.
        files: Vec<PathBuf>,
    },
}

/// The master's id as Salt's opts hold it, and where it was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MasterId {
    /// The id (`<host>_master` by Salt's default).
    pub id: String,
    /// Where it came from, in words.
    pub from: String,
}

/// The directories of a migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    /// The master's pki_dir (its own keys).
    pub pki_dir: PathBuf,
    /// A cluster peer's cluster_pki_dir, where the banks go.
    pub cluster_dir: Option<PathBuf>,
    /// The key tree read.
    pub tree: PathBuf,
}

impl Dirs {
    /// The directories a master config gives: the banks and the tree in
    /// `cluster_pki_dir` when `cluster_id` is true (where Salt's
    /// `localfs_key` and `validate_token` use them), else in `pki_dir`.
    pub fn of_config(cfg: &MasterConfig) -> Dirs {
        let pki_dir = cfg.pki_dir().value;
        let cluster_dir = if cfg.clustered {
            cfg.cluster_pki_dir().map(|c| c.value)
        } else {
            None
        };
        Dirs {
            tree: cluster_dir.clone().unwrap_or_else(|| pki_dir.clone()),
            pki_dir,
            cluster_dir,
        }
    }

    /// Where the banks are written.
    pub fn target(&self) -> &Path {
        self.cluster_dir.as_deref().unwrap_or(&self.pki_dir)
    }
}

/// A migration to run.
#[derive(Clone)]
pub struct Job {
    /// Its directories.
    pub dirs: Dirs,
    /// The key banks' migration (`out`: the cluster dir); its `made` hook
    /// is [`migrate`]'s own (the peer merge's history begins).
    pub opts: MigrateOptions,
    /// How the banks are opened (ownership, timings).
    pub open: OpenOptions,
    /// The master's id, which names its keys in `master_keys`; `None`:
    /// the `master_keys` bank is left alone.
    pub master_id: Option<MasterId>,
    /// What to do with a `master_keys` entry whose bytes differ.
    pub on_differ: OnDiffer,
}

/// What a migration did (or, dry, would do): the JSON report of `keycache
/// migrate --json`.
#[derive(Debug, Clone, Serialize)]
pub struct Migrated {
    /// The key banks'.
    #[serde(flatten)]
    pub report: Report,
    /// The master's keys' (`None`: none found, or left alone).
    pub master_keys: Option<MasterKeysReport>,
    /// The master id the master_keys names were derived from.
    pub master_id: Option<MasterId>,
}

/// The master's own keys, collected and checked before anything is
/// written.
struct MasterPlan {
    id: MasterId,
    dir: PathBuf,
    collected: master_keys::Collected,
    plan: MasterKeysReport,
}

/// Runs `job`; `progress` is told (done, total) while the tree is read.
pub fn migrate(job: &Job, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Migrated, MigrateError> {
    let dirs = &job.dirs;
    let master = match &job.master_id {
        Some(id) => plan_master_keys(
            &dirs.pki_dir,
            dirs.cluster_dir.as_deref(),
            id.clone(),
            job.on_differ,
            &job.open,
        )?,
        None => None,
    };
    // The store made, its history begins (for the peer merge): every
    // migration of the job's kind, from the CLI or a runner, begins it.
    let opts = MigrateOptions {
        made: Some(keycache_merge::history::begin_on_migration()),
        ..job.opts.clone()
    };
    let report = keycache::migrate::migrate(&dirs.tree, &opts, progress)?;
    let master_keys = match &master {
        Some(m) if !job.opts.dry_run => Some(master_keys::write(
            &m.dir,
            &m.collected,
            &job.open,
            job.on_differ,
        )?),
        Some(m) => Some(m.plan.clone()),
        None => None,
    };
    Ok(Migrated {
        report,
        master_keys,
        master_id: master.map(|m| m.id),
    })
}

/// The master's id as Salt's opts hold it: `given` (a flag: the id and
/// the flag's name), else the master config's `id` (what Salt's
/// `apply_master_config` keeps), else the one read off the `master.pem`
/// symlink of a Salt 3008 pki_dir, else `master` (the names of a tree from
/// before Salt 3008).
pub fn master_id(
    given: Option<(String, &str)>,
    config: Option<&MasterConfig>,
    pki_dir: &Path,
) -> MasterId {
    if let Some((id, flag)) = given {
        return MasterId {
            id,
            from: flag.to_owned(),
        };
    }
    if let Some(s) = config.and_then(|c| c.id.as_ref()) {
        if !s.value.is_empty() {
            return MasterId {
                id: s.value.clone(),
                from: s.from.to_string(),
            };
        }
    }
    if let Some((id, target)) = master_id_of(pki_dir) {
        return MasterId {
            id,
            from: format!("the master.pem symlink (-> {})", target.display()),
        };
    }
    MasterId {
        id: "master".into(),
        from: "no --master-id, no `id` in a master config (-c), no master.pem symlink into \
               PKI_DIR"
            .into(),
    }
}

/// The master's id off a Salt 3008 pki_dir: `master.pem` is a symlink to
/// `<master_id>.pem` there (crypt.py `_setup_keys`), and the id is that
/// with `_master`. The link's directory and `pki_dir` are compared
/// resolved (canonical): Salt writes the link with the configured, absolute
/// `pki_dir`, which a relative PKI_DIR does not spell alike. Returns the id
/// and the link's target.
fn master_id_of(pki_dir: &Path) -> Option<(String, PathBuf)> {
    let target = std::fs::read_link(pki_dir.join("master.pem")).ok()?;
    let name = target.file_name()?.to_str()?;
    let stem = name.strip_suffix(".pem")?.to_owned();
    if stem.is_empty() || stem == "master" {
        return None;
    }
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => pki_dir.join(p),
        _ => pki_dir.to_path_buf(),
    };
    let here = std::fs::canonicalize(pki_dir).ok()?;
    (std::fs::canonicalize(parent).ok()? == here).then(|| (format!("{stem}_master"), target))
}

/// Collects the master's own keys and plans their write (a plan only: the
/// write comes after the key banks'); `None` when the tree holds none of
/// them. Refuses, writing nothing, when the bank holds other bytes under a
/// name (unless `on_differ` replaces), and when the master has key files
/// but the bank would not hold its pair under the names Salt's
/// `MasterKeys` looks for (Salt would then generate a new one).
fn plan_master_keys(
    pki_dir: &Path,
    cluster_dir: Option<&Path>,
    id: MasterId,
    on_differ: OnDiffer,
    open: &OpenOptions,
) -> Result<Option<MasterPlan>, MigrateError> {
    if !pki_dir.is_dir() {
        // The migration refuses it, with its own message.
        return Ok(None);
    }
    let mopts = MasterKeyOptions::new(id.id.clone());
    let collected = master_keys::collect(pki_dir, cluster_dir, &mopts)?;
    let own = master_keys::own_key_files(pki_dir, &mopts)?;
    if collected.files.is_empty() && own.is_empty() {
        return Ok(None);
    }
    let dir = master_keys::store_dir(pki_dir, cluster_dir).to_path_buf();
    let plan = master_keys::plan(&dir, &collected, open, on_differ)?;
    if !own.is_empty() && !plan.holds_master_pair(&mopts) {
        return Err(MigrateError::MasterPairMisplaced {
            pki_dir: pki_dir.to_path_buf(),
            master: mopts.master_id().to_owned(),
            id: id.id,
            from: id.from,
            files: own,
        });
    }
    Ok(Some(MasterPlan {
        id,
        dir,
        collected,
        plan,
    }))
}
