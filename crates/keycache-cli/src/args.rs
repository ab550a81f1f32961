//! The argument groups the commands share, each defined once: the store
//! directory, the store's layout ([`Layout`]), `--json` and `--user`; and
//! minion ids given as arguments ([`minion_id`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use keycache::files::Ownership;
use keycache::format::{self, Params};
use keycache::store::Store;
use keycache::table::OpenOptions;
use keycache::{Error, MinionId};

use crate::output::CmdError;

/// A minion id given on the command line, or a failure with exit code 2.
pub(crate) fn minion_id(s: &str) -> Result<MinionId, CmdError> {
    MinionId::new(s).map_err(|e| CmdError::usage(e.to_string()))
}

/// The store a command works on.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreDir {
    /// The store directory.
    pub(crate) dir: PathBuf,
}

/// `--json`.
#[derive(Debug, Clone, Copy, Args)]
pub(crate) struct Json {
    /// JSON output.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--user`: the owner of the files a command writes.
#[derive(Debug, Clone, Args)]
pub(crate) struct User {
    /// Owner of the files written (user name or `UID[:GID]`).
    #[arg(long, value_name = "USER")]
    pub(crate) user: Option<String>,
}

impl User {
    /// The ownership `--user` asks for, if given.
    pub(crate) fn ownership(&self) -> Result<Option<Ownership>, Error> {
        self.user.as_deref().map(Ownership::for_user).transpose()
    }
}

/// The layout options of Salt's master config; they must match the store.
#[derive(Debug, Clone, Args)]
pub(crate) struct Layout {
    /// Slots per table, header included (`mmap_key_size`). Default: inferred
    /// from an existing index file (after finishing a compaction a crash
    /// interrupted), else Salt's 1000000.
    #[arg(long, value_name = "N")]
    pub(crate) size: Option<u64>,
    /// Bytes per slot (`mmap_key_slot_size`).
    #[arg(long, value_name = "N", default_value_t = format::DEFAULT_SLOT_SIZE)]
    pub(crate) slot_size: usize,
    /// Bytes of minion id per slot (`mmap_key_id_size`).
    #[arg(long, value_name = "N", default_value_t = format::DEFAULT_ID_SIZE)]
    pub(crate) id_size: usize,
    /// Cap of one heap segment (`mmap_key_max_segment_bytes`).
    #[arg(long, value_name = "N", default_value_t = format::DEFAULT_MAX_SEGMENT_BYTES)]
    pub(crate) max_segment_bytes: u64,
}

impl Layout {
    /// The parameters, with the size inferred from `dir`'s index files
    /// (after finishing a compaction that a crash interrupted, which may
    /// change it).
    pub(crate) fn params(&self, dir: &Path) -> Result<Params, Error> {
        self.params_of(dir, true)
    }

    /// [`Layout::params`], finishing an interrupted compaction first only
    /// when `finish` (a dry run writes nothing).
    pub(crate) fn params_of(&self, dir: &Path, finish: bool) -> Result<Params, Error> {
        let base = self.options(Params {
            size: self.size.unwrap_or(format::DEFAULT_SIZE),
            slot_size: self.slot_size,
            id_size: self.id_size,
            max_segment_bytes: self.max_segment_bytes,
        });
        match (self.size, finish) {
            (Some(_), _) => Ok(base.params),
            (None, true) => Params::detect(dir, &base),
            (None, false) => Ok(Params::from_files(dir, base.params)),
        }
    }

    /// Open options with `params` and the tunables of the environment
    /// (`KEYCACHE_READ_RETRY_MS`, `KEYCACHE_REBUILD_SETTLE_MS`).
    pub(crate) fn options(&self, params: Params) -> OpenOptions {
        let ms = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        let d = OpenOptions::default();
        OpenOptions {
            params,
            read_retry: ms("KEYCACHE_READ_RETRY_MS").unwrap_or(d.read_retry),
            rebuild_settle: ms("KEYCACHE_REBUILD_SETTLE_MS").unwrap_or(d.rebuild_settle),
            ..d
        }
    }

    /// Opens the store in `dir` with these parameters.
    pub(crate) fn open(&self, dir: &Path) -> Result<Store, Error> {
        Store::open_with(dir, &self.options(self.params(dir)?))
    }
}
