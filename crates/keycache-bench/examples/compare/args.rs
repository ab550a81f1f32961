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
/// tools/bench.sh compare. Without a subcommand it runs `run`.
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
    /// Internal: the writer process of section `scaling`, which changes
    /// existing keys at a fixed rate until its stdin closes.
    #[command(hide = true)]
    Writer(WriterArgs),
}

/// A list of thread counts: `1,2,4` (each at least 1), or `max` (also
/// `all`): 1, 2, 4, ... doubling, then every CPU the process may use
/// (`std::thread::available_parallelism`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Threads(pub(crate) Vec<usize>);

/// Parses `--threads` (see [`Threads`]).
pub(crate) fn threads(s: &str) -> Result<Threads, String> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "max" || part == "all" {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let mut t = 1;
            while t < cpus {
                v.push(t);
                t *= 2;
            }
            v.push(cpus);
        } else {
            match part.parse::<usize>() {
                Ok(t) if t >= 1 => v.push(t),
                _ => {
                    return Err(format!(
                        "{part:?}: a thread count (1 or more), `max` or `all`"
                    ))
                }
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        return Err("no thread count".into());
    }
    Ok(Threads(v))
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
    /// Sections: lookup, list, migrate, open, write, callgrind, scaling
    /// (`scaling` runs only when named).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lookup,list,migrate,open,write,callgrind"
    )]
    pub(crate) only: Vec<String>,
    /// Thread counts of section `scaling`: a comma list (`1,2,4,8`), or
    /// `max` (1, 2, 4, ... up to every CPU the process may use).
    #[arg(long, value_parser = threads, default_value = "1,2")]
    pub(crate) threads: Threads,
    /// Writes per second of the writer (process or thread) that runs beside
    /// the readers of section `scaling`.
    #[arg(long, value_parser = count, default_value = "1000")]
    pub(crate) writer_rate: u64,
    /// How the stores are made: `tree` (a `tools/gen-pki-tree.py` tree
    /// migrated with `keycache migrate`: needs python3 and the keycache
    /// binary) or `rust` (puts of the same kind of ids and keys straight
    /// from this tool, in batches; no tree, so no list or migrate section).
    #[arg(long, default_value = "tree", value_parser = ["tree", "rust"])]
    pub(crate) generate: String,
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

/// The writer process of section `scaling`: what it writes to, and how fast.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct WriterArgs {
    /// The keycache store to write to.
    #[arg(long)]
    pub(crate) store: Option<PathBuf>,
    /// Its table size.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) size: u64,
    /// The LMDB environment to write to.
    #[arg(long)]
    pub(crate) lmdb: Option<PathBuf>,
    /// A file of ids present in both, one a line (the first 65,536 are
    /// used; those in state accepted are changed).
    #[arg(long)]
    pub(crate) ids: PathBuf,
    /// Writes per second (each target).
    #[arg(long, value_parser = count, default_value = "1000")]
    pub(crate) rate: u64,
    /// Stops after this many seconds even if its stdin stays open.
    #[arg(long, default_value_t = 3600.0)]
    pub(crate) max_seconds: f64,
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CallgrindArgs {
    #[command(flatten)]
    pub(crate) lookup: LookupArgs,
    /// Lookups to count.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) lookups: usize,
}
