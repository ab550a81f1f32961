//! The command line: `run` and the internal subcommands the tool runs
//! itself as child processes.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::util::die;

/// Side-by-side performance comparison of keycache against in-memory
/// HashMaps (std, hashbrown), LMDB through heed and Salt 3008.5's own
/// Python `mmap_key`.
///
/// Prints a Markdown report of medians and ratios; see
/// tools/bench-compare.sh. Without a subcommand it runs `run`.
#[derive(Debug, Parser)]
#[command(name = "compare", args_conflicts_with_subcommands = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Option<Cmd>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
    /// The comparison (the default).
    Run(RunArgs),
    /// Internal: does nothing (the start-up time of a child process).
    Noop,
    /// Internal: opens a store and looks up one id; prints the times as JSON.
    OpenFirst(OpenFirstArgs),
    /// Internal: the resident memory of a contender after 10,000 lookups.
    Rss(LookupArgs),
    /// Internal: a loop of lookups for callgrind to count.
    CallgrindLoop(CallgrindArgs),
}

/// A count: digits, `_` allowed as a separator (`1_000_000`).
pub(crate) fn count(s: &str) -> Result<u64, String> {
    s.replace('_', "")
        .parse()
        .map_err(|e| format!("{s:?}: {e}"))
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
    /// Store sizes (minions).
    #[arg(long, value_delimiter = ',', value_parser = count, default_value = "10000,100000,1000000")]
    pub(crate) sizes: Vec<u64>,
    /// Rounds; the tables give medians over them.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: usize,
    /// Seconds per Rust measurement.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) seconds: f64,
    /// Seconds per Salt measurement.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) salt_seconds: f64,
    /// The Salt venv's python (tools/setup-venv.sh); needed for the Salt
    /// contender.
    #[arg(long, value_name = "SALT_VENV_PYTHON")]
    pub(crate) python: Option<PathBuf>,
    /// Sections: lookup, list, migrate, open, write, callgrind.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lookup,list,migrate,open,write,callgrind"
    )]
    pub(crate) only: Vec<String>,
    /// Contenders: salt, lmdb, maps.
    #[arg(long, value_delimiter = ',', default_value = "salt,lmdb,maps")]
    pub(crate) contenders: Vec<String>,
    /// Tree sizes of the migration section.
    #[arg(long, value_delimiter = ',', value_parser = count, default_value = "10000,100000")]
    pub(crate) migrate_sizes: Vec<u64>,
    /// Largest tree Salt migrates (larger ones are extrapolated).
    #[arg(long, value_parser = count, default_value = "10000")]
    pub(crate) salt_migrate_max: u64,
    /// Where trees, stores and LMDB environments are kept [default:
    /// target/bench-data].
    #[arg(long, value_name = "DIR")]
    pub(crate) data: Option<PathBuf>,
    /// The keycache binary [default: target/release/keycache].
    #[arg(long, value_name = "BIN")]
    pub(crate) keycache: Option<PathBuf>,
    /// Where to write the raw samples [default: DATA/results.json].
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

/// The store a child process opens.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// The store directory.
    #[arg(long)]
    pub(crate) store: PathBuf,
    /// Its table size.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) size: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct OpenFirstArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The id to look up.
    #[arg(long)]
    pub(crate) id: String,
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LookupArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// A file of ids, one a line.
    #[arg(long)]
    pub(crate) ids: PathBuf,
    /// Who looks them up.
    #[arg(long, default_value = "keycache")]
    pub(crate) contender: String,
    /// The LMDB environment (contender lmdb).
    #[arg(long)]
    pub(crate) lmdb: Option<PathBuf>,
}

impl LookupArgs {
    pub(crate) fn lmdb(&self) -> &Path {
        self.lmdb
            .as_deref()
            .unwrap_or_else(|| die("contender lmdb needs --lmdb"))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CallgrindArgs {
    #[command(flatten)]
    pub(crate) lookup: LookupArgs,
    /// Lookups to count.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) lookups: usize,
}
