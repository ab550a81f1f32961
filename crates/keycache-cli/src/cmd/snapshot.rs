//! `keycache snapshot`: the `keys` and `denied_keys` banks as of one moment,
//! with each entry's version and the store's tombstones, in one checksummed
//! file (see `keycache_merge::snapshot`), to stdout or a file: what `keycache
//! merge` on another peer reads.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use keycache_merge::snapshot::{self, Snapshot, SnapshotOptions};

use crate::args::{ConfiguredStore, StoreArgs};
use crate::output::{errln, esc_path, CmdError, CmdResult};

/// The arguments of `keycache snapshot`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// Where to write the snapshot: `-` (the default) for stdout, which must
    /// not be a terminal, or a file, replaced atomically.
    #[arg(short = 'o', long = "output", value_name = "FILE", default_value = "-")]
    output: PathBuf,
    /// Accepted for the timers of keycache 0.1 and ignored: entries now
    /// carry their versions, and deletions their tombstones.
    #[arg(long, value_name = "FILE", hide = true)]
    seen: Option<PathBuf>,
    /// How long tombstones (deletions) are kept and sent, in days: give
    /// every peer's snapshot and merge the same.
    #[arg(long, value_name = "DAYS", default_value_t = 30)]
    horizon_days: u64,
    /// How long to wait for each bank's lock (held by a Salt master or
    /// another keycache that is writing), in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    lock_wait: f64,
    #[command(flatten)]
    layout: StoreArgs,
}

/// `--lock-wait SECONDS` as a duration, or a usage error.
pub(crate) fn lock_wait(secs: f64) -> Result<Duration, CmdError> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        CmdError::usage(format!(
            "--lock-wait {secs}: give a number of seconds, 0 or more"
        ))
    })
}

/// Writes `snap` to stdout (refusing a terminal) when `out` is `-`, else
/// to the file `out`, atomically.
pub(crate) fn write(snap: &Snapshot, out: &Path) -> Result<(), CmdError> {
    if out != Path::new("-") {
        return Ok(snap.write_file(out)?);
    }
    let mut stdout = std::io::stdout().lock();
    snap.write_to(&mut stdout)?;
    stdout
        .flush()
        .map_err(|e| CmdError::usage(format!("writing the snapshot to stdout: {e}")))
}

/// Runs `keycache snapshot`: exit code 0, or 2 when the store cannot be
/// read (nothing is written then).
pub(crate) fn run(a: Args) -> CmdResult {
    let to_stdout = a.output == Path::new("-");
    if to_stdout && std::io::stdout().is_terminal() {
        return Err(CmdError::usage(
            "refusing to write a binary snapshot to a terminal: pipe it (keycache snapshot | \
             ssh peer keycache merge -) or give -o FILE",
        ));
    }
    let opts = SnapshotOptions {
        lock_wait: lock_wait(a.lock_wait)?,
        history: keycache_merge::history::HistoryOptions {
            horizon: Duration::from_secs(a.horizon_days.saturating_mul(86_400)),
            ..keycache_merge::history::HistoryOptions::default()
        },
    };
    let _ = &a.seen;
    let store = a.layout.open(&a.store.dir())?;
    if to_stdout {
        write(&snapshot::take(&store, &opts)?, &a.output)?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    // Into a file: streamed from the banks (no copy of every key in memory).
    let n = snapshot::take_to_file(&store, &opts, &a.output)?;
    errln!(
        "keycache: snapshot of {}: {n} entries written to {}",
        esc_path(store.dir()),
        esc_path(&a.output)
    );
    Ok(std::process::ExitCode::SUCCESS)
}
