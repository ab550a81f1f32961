//! `keycache export-master-keys`: the master's key pair written out of the
//! `master_keys` bank as `master.pem` (0600) and `master.pub`, for a second
//! master of a multi-master setup (Salt's tutorial copies those two files;
//! under keycache they live only in the bank).

use std::path::PathBuf;

use crate::args::{ConfiguredStore, Json, StoreArgs};
use crate::master_config::actor;
use crate::output::{esc, esc_path, outln, print_json, CmdResult};

/// The arguments of `keycache export-master-keys`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// The directory to write master.pem and master.pub into (created 0700
    /// when missing). Neither file may exist there: nothing is replaced.
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
    /// The master's id as Salt's opts hold it, which names its pair in the
    /// bank (`<id without _master>.pem`). Default: the master config's `id`
    /// (with -c), else `<host name>_master`, as Salt does; the bank's
    /// master.pem/master.pub when it holds no pair under that id.
    #[arg(long, value_name = "ID")]
    master_id: Option<String>,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// The JSON report.
#[derive(serde::Serialize)]
struct Out<'a> {
    master_id: &'a str,
    #[serde(flatten)]
    report: &'a keycache::master_keys::PairReport,
}

/// Runs `keycache export-master-keys`.
pub(crate) fn run(a: Args) -> CmdResult {
    let dir = a.store.dir();
    let config = a.layout.config(&dir)?;
    let id = match (&a.master_id, &config) {
        (Some(id), _) => id.clone(),
        (None, Some(cfg)) => actor::master_id(cfg),
        (None, None) => format!("{}_master", actor::host_name()),
    };
    let r = a.layout.resolve(&dir, true)?;
    let opts = a.layout.options(r.params);
    let mopts = keycache::master_keys::MasterKeyOptions::new(id.clone());
    let report = keycache::master_keys::write_pair(&r.dir, &opts, &mopts, &a.to)?;
    if a.json.json {
        print_json(&Out {
            master_id: &id,
            report: &report,
        });
    } else {
        outln!(
            "wrote the master key pair ({} and {} of {}'s master_keys bank, master id {}) to {} (0600) and {}",
            esc(&report.from[0]),
            esc(&report.from[1]),
            esc_path(&r.dir),
            esc(&id),
            esc_path(&report.pem),
            esc_path(&report.public)
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
