//! The argument groups the commands share, each defined once: the store
//! directory, the store's layout ([`StoreArgs`]), `--json` and `--user`; minion
//! ids given as arguments ([`minion_id`]); and the notice that a writer
//! waits for a bank's lock ([`announce_lock_wait`]).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use keycache::files::{Ownership, DEFAULT_MODE};
use keycache::format::{self, Params};
use keycache::format::{DENIED_INDEX, KEYS_INDEX};
use keycache::store::Store;
use keycache::table::OpenOptions;
use keycache::tree::TreeSync;
use keycache::MinionId;

use crate::master_config::{Explicit, MasterConfig, Source};
use crate::output::{errln, esc, esc_path, CmdError};

/// A minion id given on the command line, or a failure with exit code 2.
pub(crate) fn minion_id(s: &str) -> Result<MinionId, CmdError> {
    MinionId::new(s).map_err(|e| CmdError::usage(e.to_string()))
}

/// The store a command works on, which the master config may name: for
/// the commands whose only positional argument it is.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConfiguredStore {
    /// The store directory. Default: the one the Salt master config names
    /// (pki_dir, or cluster_pki_dir when cluster_id is set; see -c).
    dir: Option<PathBuf>,
}

impl ConfiguredStore {
    /// The directory given, or an empty path: the master config's.
    pub(crate) fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_default()
    }
}

/// The store directory and minion ids of `get`, `accept`, `reject` and
/// `delete`: `DIR ID...` as always, or, like `salt-key`, the ids alone
/// with `-c`/`--master-config` (the store directory is then the config's).
/// With the config, a first argument holding a `/` (never part of a minion
/// id) is still the store directory, overriding the config's, as a `DIR`
/// given to `list -c` does. With neither a flag nor an argument (`delete
/// --all`), the default master config names the store.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreIds {
    /// `DIR ID...`: the store directory (pki_dir or cluster_pki_dir), then
    /// minion ids. With -c or --master-config: minion ids only (the store
    /// directory is the master config's), unless the first holds a `/`:
    /// then it is the store directory.
    #[arg(value_name = "DIR|ID")]
    args: Vec<OsString>,
}

impl StoreIds {
    /// The store directory (empty: the master config's, see
    /// [`StoreArgs::resolve`]) and the ids, as the type's documentation says.
    pub(crate) fn split(&self, layout: &StoreArgs) -> Result<(PathBuf, Vec<String>), CmdError> {
        let dir_first = match self.args.first() {
            None => false,
            Some(_) if !layout.config_given() => true,
            Some(a) => a.as_bytes().contains(&b'/'),
        };
        let (dir, ids) = match self.args.split_first() {
            Some((d, rest)) if dir_first => (PathBuf::from(d), rest),
            _ => (PathBuf::new(), &self.args[..]),
        };
        let ids = ids
            .iter()
            .map(|a| {
                a.to_str().map(str::to_owned).ok_or_else(|| {
                    CmdError::usage(format!(
                        "invalid minion id \"{}\": it is not valid UTF-8",
                        esc(&a.to_string_lossy())
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok((dir, ids))
    }
}

/// `--json`.
#[derive(Debug, Clone, Copy, Args)]
pub(crate) struct Json {
    /// JSON output.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--reason`: why a change is made, for the audit trail.
#[derive(Debug, Clone, Args)]
pub(crate) struct Reason {
    /// Why the change is made (a ticket, a sentence): recorded with each
    /// change in the store's audit trail (see `keycache history`; through
    /// etcd, in the cluster's).
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: Option<String>,
}

/// Who a command that writes the key state records its changes as (see
/// `keycache::audit`): program `keycache`, the OS user, the user behind
/// `sudo` (`SUDO_USER`), the `id` of the master config the command reads
/// (`master`: None when it reads none, a store directory given without
/// `-c`), `reason`, and `action` for a change made as a whole (`merge`).
pub(crate) fn actor(
    master: Option<String>,
    reason: Option<String>,
    action: Option<&str>,
) -> keycache::audit::Actor {
    let sudo_user = std::env::var("SUDO_USER").ok();
    let mut a = crate::master_config::actor::actor("keycache", sudo_user, master, reason);
    a.action = action.map(str::to_owned);
    a
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
        let Ok(f) = keycache::files::open_regular(&path, false) else {
            continue; // absent (a new bank), not a regular file or not ours to open: the writer will say
        };
        if let Err(std::fs::TryLockError::WouldBlock) = f.try_lock() {
            errln!(
                "keycache: waiting for the lock of {} (a Salt master or another keycache is writing)",
                esc_path(&path)
            );
        }
    }
}

/// Where the store and its layout come from: the Salt master config
/// (`-c/--config-dir`, `--master-config`), overridden by explicit flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreArgs {
    /// Salt's configuration directory, as salt-key's -c: its `master` file
    /// and the files that one includes (`master.d/*.conf`) give the store
    /// directory and the mmap_key options. Read when given, or when no
    /// store directory is given (then `$SALT_CONFIG_DIR` or /etc/salt).
    #[arg(short = 'c', long = "config-dir", value_name = "DIR")]
    pub(crate) config_dir: Option<PathBuf>,
    /// One Salt master config file to read instead of `DIR/master`.
    #[arg(long, value_name = "FILE", conflicts_with = "config_dir")]
    pub(crate) master_config: Option<PathBuf>,
    /// Slots per table, header included (`mmap_key_size`). Default: the
    /// master config's, else inferred from an existing index file (after
    /// finishing a compaction a crash interrupted), else Salt's 1000000.
    #[arg(long, value_name = "N")]
    pub(crate) size: Option<u64>,
    /// Bytes per slot (`mmap_key_slot_size`). Default: the master config's,
    /// else Salt's 96.
    #[arg(long, value_name = "N")]
    pub(crate) slot_size: Option<usize>,
    /// Bytes of minion id per slot (`mmap_key_id_size`). Default: the master
    /// config's, else Salt's 64.
    #[arg(long, value_name = "N")]
    pub(crate) id_size: Option<usize>,
    /// Cap of one heap segment (`mmap_key_max_segment_bytes`). Default: the
    /// master config's, else Salt's 1073741824.
    #[arg(long, value_name = "N")]
    pub(crate) max_segment_bytes: Option<u64>,
}

/// The store directory and layout a command settled on.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The store directory.
    pub(crate) dir: PathBuf,
    /// Its layout (the size read off the index files when nothing gave it).
    pub(crate) params: Params,
    /// The master config's `keycache_tree`, when the config was read and
    /// sets it.
    pub(crate) tree: Option<TreeSync>,
    /// The master's id (the config's `id`, else Salt's `<host>_master`),
    /// when the config was read: what the audit trail records.
    pub(crate) master: Option<String>,
}

impl StoreArgs {
    /// Whether `-c/--config-dir` or `--master-config` is given.
    pub(crate) fn config_given(&self) -> bool {
        self.config_dir.is_some() || self.master_config.is_some()
    }

    /// The master config to read: when `-c` or `--master-config` is given,
    /// or when no store directory is (`dir` empty).
    pub(crate) fn config(&self, dir: &Path) -> Result<Option<MasterConfig>, CmdError> {
        if !self.config_given() && !dir.as_os_str().is_empty() {
            return Ok(None);
        }
        let source = Source::from_flags(self.config_dir.as_deref(), self.master_config.as_deref());
        Ok(Some(MasterConfig::load(&source)?))
    }

    /// The store directory (`dir`, else the master config's) and its
    /// layout (flags, else the master config, else Salt's defaults; the
    /// size, when neither gives it, read off the index files after
    /// finishing a rebuild a crash interrupted, unless `finish` is false:
    /// a dry run writes nothing). Says on stderr, once, which directory
    /// and layout a master config gave.
    pub(crate) fn resolve(&self, dir: &Path, finish: bool) -> Result<Resolved, CmdError> {
        self.resolve_from(dir, "DIR", finish)
    }

    /// [`StoreArgs::resolve`], `dir` (when not empty) given by the argument
    /// `flag` (`DIR`, `PKI_DIR`, `--out`), as the message on stderr says.
    pub(crate) fn resolve_from(
        &self,
        dir: &Path,
        flag: &'static str,
        finish: bool,
    ) -> Result<Resolved, CmdError> {
        let config = self.config(dir)?;
        let (dir, base, size_from_files) = match &config {
            Some(cfg) => {
                let choice = cfg.choose(&Explicit {
                    dir: (!dir.as_os_str().is_empty()).then(|| dir.to_path_buf()),
                    dir_flag: Some(flag),
                    size: self.size,
                    slot_size: self.slot_size,
                    id_size: self.id_size,
                    max_segment_bytes: self.max_segment_bytes,
                });
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    errln!("keycache: {}", cfg.describe_choice(&choice));
                    // mmap_key and the keycache driver read these banks.
                    if !cfg.uses_mmap_key() && cfg.cache_driver() != Some("keycache") {
                        errln!(
                            "keycache: warning: keys.cache_driver is {}, not mmap_key or keycache: a master with this config does not read these banks",
                            cfg.cache_driver().unwrap_or("localfs_key")
                        );
                    }
                });
                (
                    choice.store_dir.value.clone(),
                    choice.params(),
                    choice.size_is_default(),
                )
            }
            None => (
                dir.to_path_buf(),
                Params {
                    size: self.size.unwrap_or(format::DEFAULT_SIZE),
                    slot_size: self.slot_size.unwrap_or(format::DEFAULT_SLOT_SIZE),
                    id_size: self.id_size.unwrap_or(format::DEFAULT_ID_SIZE),
                    max_segment_bytes: self
                        .max_segment_bytes
                        .unwrap_or(format::DEFAULT_MAX_SEGMENT_BYTES),
                },
                self.size.is_none(),
            ),
        };
        let base = self.options(base);
        let params = crate::master_config::store_params(&dir, &base, size_from_files, finish)?;
        let tree = config.as_ref().and_then(MasterConfig::tree);
        let master = config.as_ref().map(crate::master_config::actor::master_id);
        Ok(Resolved {
            dir,
            params,
            tree,
            master,
        })
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

    /// Opens the store `dir` names (see [`StoreArgs::resolve`]), and checks
    /// that the layout is the layout of its files ([`Store::check_layout`])
    /// before anything is read or written: a store opened with another
    /// layout is refused. (Damage is not a layout mismatch: `verify` still
    /// opens a damaged store.)
    pub(crate) fn open(&self, dir: &Path) -> Result<Store, CmdError> {
        let r = self.resolve(dir, true)?;
        self.open_with(&r.dir, self.options(r.params))
    }

    /// [`StoreArgs::open`] with the given options.
    pub(crate) fn open_with(&self, dir: &Path, opts: OpenOptions) -> Result<Store, CmdError> {
        let store = Store::open_with(dir, &opts)?;
        store.check_layout()?;
        Ok(store)
    }
}
