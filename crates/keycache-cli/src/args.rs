//! The argument groups the commands share, each defined once: the store
//! directory, the store's layout ([`Layout`]), `--json` and `--user`; minion
//! ids given as arguments ([`minion_id`]); and the notice that a writer
//! waits for a bank's lock ([`announce_lock_wait`]).

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use keycache::files::{Ownership, DEFAULT_MODE};
use keycache::format::{self, Params};
use keycache::store::{Store, DENIED_INDEX, KEYS_INDEX};
use keycache::table::OpenOptions;
use keycache::{Error, MinionId};

use crate::output::{errln, esc, esc_path, CmdError};

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
    /// Owner of the files written: `USER[:GROUP]`, each a name or a number.
    #[arg(long, value_name = "USER")]
    pub(crate) user: Option<String>,
}

/// chown's "no change" value (`(uid_t)-1`): never a real owner.
const NO_CHANGE: u32 = u32::MAX;

impl User {
    /// The ownership `--user` asks for, if given; a bad `--user` fails with
    /// exit code 2 and its own message.
    pub(crate) fn ownership(&self) -> Result<Option<Ownership>, CmdError> {
        self.user.as_deref().map(user_ownership).transpose()
    }
}

/// The ownership `--user USER[:GROUP]` names: user and group names are
/// resolved through the system's user database (NSS: `/etc/passwd`, LDAP,
/// sssd...); a user alone gives its primary group (a numeric uid that no
/// user has, the group of the same number). Mode 0600.
pub(crate) fn user_ownership(spec: &str) -> Result<Ownership, CmdError> {
    let bad = |why: &str| CmdError::usage(format!("--user \"{}\": {why}", esc(spec)));
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() || group.is_some_and(str::is_empty) {
        return Err(bad("give USER or USER:GROUP (names or numbers)"));
    }
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (
            uid,
            uzers::get_user_by_uid(uid).map(|u| u.primary_group_id()),
        ),
        Err(_) => {
            let u = uzers::get_user_by_name(user).ok_or_else(|| bad("no such user"))?;
            (u.uid(), Some(u.primary_group_id()))
        }
    };
    let gid = match group {
        None => primary.unwrap_or(uid),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => uzers::get_group_by_name(g)
                .ok_or_else(|| bad("no such group"))?
                .gid(),
        },
    };
    if uid == NO_CHANGE || gid == NO_CHANGE {
        return Err(bad(
            "4294967295 is chown's \"no change\" value (-1), not an owner",
        ));
    }
    Ok(Ownership {
        owner: Some((uid, gid)),
        mode: DEFAULT_MODE,
        explicit: true,
    })
}

/// Before a command writes the banks of `dir`: when another process (a
/// Salt master, another keycache) holds a bank's lock, says so on stderr,
/// so that the wait the library then makes is not a silent hang. Takes
/// nothing: the lock is tried and let go at once.
pub(crate) fn announce_lock_wait(dir: &Path) {
    for index in [KEYS_INDEX, DENIED_INDEX] {
        let path = format::lock_path(&dir.join(index));
        let Ok(f) = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        else {
            continue; // absent (a new bank) or not ours to open: the writer will say
        };
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            continue;
        }
        if let Err(std::fs::TryLockError::WouldBlock) = f.try_lock() {
            errln!(
                "keycache: waiting for the lock of {} (a Salt master or another keycache is writing)",
                esc_path(&path)
            );
        }
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

    /// Opens the store in `dir` with these parameters, and checks that
    /// they are the layout of its files ([`Store::check_layout`]) before
    /// anything is read or written: a store opened with another layout is
    /// refused. (Damage is not a layout mismatch: `verify` still opens a
    /// damaged store.)
    pub(crate) fn open(&self, dir: &Path) -> Result<Store, Error> {
        self.open_with(dir, self.options(self.params(dir)?))
    }

    /// [`Layout::open`] with the given options.
    pub(crate) fn open_with(&self, dir: &Path, opts: OpenOptions) -> Result<Store, Error> {
        let store = Store::open_with(dir, &opts)?;
        store.check_layout()?;
        Ok(store)
    }
}
