//! `keycache etcd seed|status|diff`, and what the commands that work with
//! etcd share: the master config's `keycache_etcd` ([`required`],
//! [`configured`]). The replicator itself is `keycache replicate`
//! (`super::replicate`); accept, reject and delete through etcd are
//! [`write`].

mod diff;
mod seed;
mod status;
pub(super) mod write;

use std::path::Path;

use clap::Subcommand;
use keycache_etcd::Settings;

use crate::args::StoreArgs;
use crate::output::{esc_path, CmdError, CmdResult};

/// The arguments of `keycache etcd`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

/// The arguments of `keycache etcd status` and `diff`: the master config
/// and `--json`.
#[derive(Debug, clap::Args)]
pub(crate) struct Plain {
    #[command(flatten)]
    json: crate::args::Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// The subcommands of `keycache etcd`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Put the key state of the master's store (or of --from: another
    /// store, or a localfs_key tree) into the etcd prefix of the master
    /// config's keycache_etcd, in transactions within etcd's limits. A
    /// prefix that already holds keys is refused (exit 2, nothing written)
    /// unless --replace. Never the master_keys bank.
    Seed(seed::Args),
    /// This master's replica against etcd: the revision it holds, etcd's,
    /// the keys under the prefix, the lag, the last proof of currency, the
    /// replicator, the last consistency check. Exits 1 when the replica is
    /// stale (not proven current within keycache_etcd's stale_after on the
    /// host's boot clock, no replicator running, or a state written for
    /// another store) or etcd cannot be reached.
    Status(Plain),
    /// Compare the master's store with the key state in etcd, entry by
    /// entry; exits 1 when they differ.
    Diff(Plain),
}

/// Runs `keycache etcd ...`.
pub(crate) fn run(a: Args) -> CmdResult {
    match a.command {
        Command::Seed(a) => seed::run(a),
        Command::Status(a) => status::run(a),
        Command::Diff(a) => diff::run(a),
    }
}

/// The etcd settings of the master config that `layout` names (the store
/// directory `dir`, when not empty, overriding the config's); `None`
/// without a master config or without `keycache_etcd` in it.
pub(crate) fn configured(layout: &StoreArgs, dir: &Path) -> Result<Option<Settings>, CmdError> {
    match layout.config(dir)? {
        Some(cfg) => Ok(Settings::from_config(&cfg)?),
        None => Ok(None),
    }
}

/// The etcd settings of the master config that `layout` names, which
/// `keycache {command}` needs: without `keycache_etcd`, exit 2 and what to
/// add.
pub(crate) fn required(layout: &StoreArgs, command: &str) -> Result<Settings, CmdError> {
    let Some(cfg) = layout.config(Path::new(""))? else {
        return Err(CmdError::usage(format!(
            "keycache {command} needs the master config (-c DIR or --master-config FILE)"
        )));
    };
    match Settings::from_config(&cfg)? {
        Some(s) => Ok(s),
        None => Err(CmdError::usage(format!(
            "keycache {command}: the master config {} has no keycache_etcd: add \
             `keycache_etcd: {{endpoints: [http://HOST:2379]}}` (see docs/cli.md) to replicate \
             the key state from etcd",
            if cfg.found {
                esc_path(&cfg.conf_file)
            } else {
                format!("{} (not found)", esc_path(&cfg.conf_file))
            }
        ))),
    }
}

/// Refuses `keycache {command}` writing the key state of `dir` itself when
/// `dir` is a replica of etcd (it holds the replicator's state file,
/// `.keycache-etcd`): etcd is that store's source of truth
/// ([`keycache_etcd::state::refused_around_etcd`]). Exit 2, nothing written; the
/// way through is the master config that names `keycache_etcd` (`-c`).
pub(crate) fn refuse_local_write(dir: &Path, command: &str) -> Result<(), CmdError> {
    let Some(file) = keycache_etcd::state::replica_file(dir) else {
        return Ok(());
    };
    Err(CmdError::usage(format!(
        "keycache {command}: {}",
        keycache_etcd::state::refused_around_etcd(
            &esc_path(dir),
            &esc_path(&file),
            "Change keys through etcd with -c DIR (the master config that names keycache_etcd)",
        )
    )))
}
