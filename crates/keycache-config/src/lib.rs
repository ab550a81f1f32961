//! The Salt master config, read as Salt 3008.5 reads it, for the store
//! directory and layout a command works on.
//!
//! ```
//! use keycache_config::{MasterConfig, Source};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let etc = tempfile::tempdir()?;
//! std::fs::write(etc.path().join("master"), "pki_dir: /srv/pki\nmmap_key_size: 10007\n")?;
//! let config = MasterConfig::load(&Source::config_dir(etc.path()))?;
//! assert_eq!(config.store_dir().value, std::path::Path::new("/srv/pki"));
//! assert_eq!(config.layout().size.value, 10007);
//! # Ok(())
//! # }
//! ```
//!
//! [`Source`] says which file (`-c/--config-dir DIR` as salt-key has it,
//! `--master-config FILE`, or the default `/etc/salt/master`);
//! [`MasterConfig::load`] reads it with its includes and gives the options
//! keycache needs, each with the file and line that set it.
//!
//! # Salt's rules (salt 3008.5, `salt/config/__init__.py`)
//!
//! - `master_config`: the main file, then the files of `default_include`
//!   (default `master.d/*.conf`, only the main file can change it), then
//!   those of `include` (only the main file's); each step overrides the
//!   keys of the ones before (`dict.update`). Relative patterns are relative
//!   to the directory of the config path (`include_config`: `~` expanded,
//!   `glob.glob`, matches sorted).
//! - `include_config`: an included file's own `include` is loaded right
//!   after it, relative to it, and overrides it; later files override
//!   earlier ones. A pattern that matches nothing is no error (Salt warns
//!   for `include`, says nothing for `default_include`).
//! - `_read_conf_file`: an empty file (or one whose document is `null`,
//!   `false`, `0`, `''`, `[]`) is an empty config; any other non-mapping
//!   document is an error.
//! - `apply_master_config`/`prepend_root_dir`: `pki_dir` (default
//!   `/etc/salt/pki/master`) is prefixed with `root_dir` (default `/`),
//!   relative or not, and normalised (`salt.utils.path.join`); a path under
//!   `root_dir` already is not prefixed twice. `cluster_pki_dir` is not
//!   prefixed. With `cluster_id` set (not null) and `cluster_pki_dir` unset
//!   or empty, `cluster_pki_dir` is `pki_dir`; without `cluster_id`,
//!   `cluster_pki_dir` is ignored.
//! - `salt/cache/mmap_key.py` `init_kwargs`: the store is `cluster_pki_dir`
//!   when `cluster_id` is true (Python truth: not empty, not 0), else
//!   `pki_dir`; `_get_cache`: `mmap_key_size` (1000000), `mmap_key_slot_size`
//!   (96), `mmap_key_id_size` (64), `mmap_key_max_segment_bytes`, falling
//!   back to `mmap_cache_max_segment_bytes`, then 1 GiB.
//! - `keys.cache_driver` is one flat option (default `localfs_key`).
//!
//! # Where keycache is stricter than Salt
//!
//! Salt only logs some mistakes and goes on; keycache, which would otherwise
//! open the wrong directory or layout, refuses them with the file and line:
//! a file that does not parse (Salt skips a broken *included* file), a value
//! of the wrong type (Salt's `_validate_opts` only warns, and `mmap_key_*`
//! are not checked at all: a string crashes the cache later), an explicit
//! config file (`-c`, `--master-config`, `SALT_CONFIG_DIR`) that does not
//! exist (Salt uses its defaults), an unreadable file, and an include cycle
//! (Salt recurses until Python's limit). An absent file at the default
//! path means Salt's defaults, as in Salt, and the result says so.
//!
//! # YAML
//!
//! Salt reads YAML 1.1 through PyYAML and its own loader; the `yaml` module composes
//! the events of `saphyr-parser` the way that loader constructs them (see
//! there: YAML 1.1 booleans and integers, `010` is 10, duplicate keys are
//! an error). `saphyr-parser` is maintained, pure Rust, has two small
//! dependencies, and gives every event its line and column, which the
//! errors need; a serde crate (`serde_norway`, the maintained fork of the
//! deprecated `serde_yaml`) would resolve scalars by YAML 1.2 rules and
//! keep the last of duplicate keys, and `serde_yml` is deprecated.

pub mod actor;
mod error;
pub mod etcd;
mod glob;
mod load;
pub mod migrate;
mod paths;
mod report;
mod salt_opts;
mod yaml;

#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use keycache::format::{self, Params};
use keycache::tree::TreeSync;
use serde::Serialize;

pub use error::ConfigError;
use paths::{abspath, expanduser, prepend_root_dir};
pub use salt_opts::SaltOpts;

/// Salt's `CONFIG_DIR` on Linux (`salt.syspaths`).
pub const DEFAULT_CONFIG_DIR: &str = "/etc/salt";
/// Salt's default `pki_dir` for a master (`LIB_STATE_DIR/pki/master`).
pub const DEFAULT_PKI_DIR: &str = "/etc/salt/pki/master";
/// Salt's default `root_dir` (`salt.syspaths.ROOT_DIR`).
pub const DEFAULT_ROOT_DIR: &str = "/";
/// Salt's default `default_include` for a master.
pub const DEFAULT_INCLUDE: &str = "master.d/*.conf";
/// Salt's default `keys.cache_driver`.
pub const DEFAULT_CACHE_DRIVER: &str = "localfs_key";

/// Which master config to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file read.
    pub file: PathBuf,
    /// The path includes are relative to (Salt's `path` argument; differs
    /// from `file` only with `SALT_MASTER_CONFIG`).
    pub include_base: PathBuf,
    /// Whether an absent `file` is an error (else Salt's defaults apply).
    pub required: bool,
    /// How it was chosen, for messages: `--master-config`,
    /// `-c/--config-dir`, `SALT_CONFIG_DIR`, `SALT_MASTER_CONFIG`, `default`.
    pub how: &'static str,
}

impl Source {
    /// `DIR/master`, as `salt-key -c DIR` reads it; an error when absent.
    pub fn config_dir(dir: &Path) -> Source {
        let file = Path::new(&abspath(&expanduser(&dir.to_string_lossy()))).join("master");
        Source {
            include_base: file.clone(),
            file,
            required: true,
            how: "-c/--config-dir",
        }
    }

    /// One explicit file (`--master-config FILE`); an error when absent.
    pub fn file(file: &Path) -> Source {
        let file = PathBuf::from(abspath(&expanduser(&file.to_string_lossy())));
        Source {
            include_base: file.clone(),
            file,
            required: true,
            how: "--master-config",
        }
    }

    /// `/etc/salt/master`; when absent, Salt's defaults.
    pub fn default_path() -> Source {
        let file = Path::new(DEFAULT_CONFIG_DIR).join("master");
        Source {
            include_base: file.clone(),
            file,
            required: false,
            how: "default",
        }
    }

    /// The source the flags and the process environment select.
    pub fn from_flags(config_dir: Option<&Path>, master_config: Option<&Path>) -> Source {
        Source::from_flags_env(config_dir, master_config, &|k| std::env::var_os(k))
    }

    /// [`Source::from_flags`] with the environment given: `--master-config`
    /// first, then `-c`, then `SALT_CONFIG_DIR` (salt-key's default for
    /// `-c`), then `SALT_MASTER_CONFIG` when it names a file (read in place
    /// of `/etc/salt/master`, includes still relative to `/etc/salt`, as
    /// Salt's `load_config` and `master_config` do), then the default.
    pub fn from_flags_env(
        config_dir: Option<&Path>,
        master_config: Option<&Path>,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Source {
        if let Some(f) = master_config {
            return Source::file(f);
        }
        if let Some(d) = config_dir {
            return Source::config_dir(d);
        }
        if let Some(d) = env("SALT_CONFIG_DIR").filter(|d| !d.is_empty()) {
            return Source {
                how: "SALT_CONFIG_DIR",
                ..Source::config_dir(Path::new(&d))
            };
        }
        let default = Source::default_path();
        if let Some(f) = env("SALT_MASTER_CONFIG").filter(|f| Path::new(f).is_file()) {
            return Source {
                file: PathBuf::from(f),
                required: true,
                how: "SALT_MASTER_CONFIG",
                ..default
            };
        }
        default
    }
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// Set in a file, at a line.
    File {
        /// The file.
        file: PathBuf,
        /// The line (1-based) of the value.
        line: usize,
        /// The option that set it (may differ from the one it stands for:
        /// `mmap_cache_max_segment_bytes`, `pki_dir`).
        key: String,
    },
    /// Salt's default.
    Default,
    /// Given on the command line.
    Flag {
        /// The flag (`--size`, or `DIR` for the store directory).
        flag: String,
    },
    /// An option of the opts a running Salt process handed over (a
    /// runner's `__opts__`), its config already read by Salt.
    Opts {
        /// The option.
        key: String,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { file, line, key } => write!(f, "{key}, {}:{line}", file.display()),
            Origin::Default => f.write_str("Salt's default"),
            Origin::Flag { flag } => f.write_str(flag),
            Origin::Opts { key } => write!(f, "{key} of the master's opts"),
        }
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Setting<T> {
    /// The value.
    pub value: T,
    /// Where it came from.
    pub from: Origin,
}

/// The options of a Salt master config that keycache uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterConfig {
    /// The main file (Salt's `conf_file`).
    pub conf_file: PathBuf,
    /// How it was chosen ([`Source::how`]).
    pub how: &'static str,
    /// Whether it exists (absent at the default path: Salt's defaults).
    pub found: bool,
    /// The files read, in the order Salt reads them.
    pub files: Vec<PathBuf>,
    /// What Salt would warn about, and what keycache assumed.
    pub notes: Vec<String>,
    /// `root_dir`.
    pub root_dir: Option<Setting<String>>,
    /// `pki_dir`, as written.
    pub pki_dir: Option<Setting<String>>,
    /// `cluster_id` (an integer is kept as its decimal string).
    pub cluster_id: Option<Setting<String>>,
    /// Whether `cluster_id` is true to Python (what `init_kwargs` tests).
    pub clustered: bool,
    /// `cluster_pki_dir`, as written.
    pub cluster_pki_dir: Option<Setting<String>>,
    /// `mmap_key_size`.
    pub mmap_key_size: Option<Setting<u64>>,
    /// `mmap_key_slot_size`.
    pub mmap_key_slot_size: Option<Setting<usize>>,
    /// `mmap_key_id_size`.
    pub mmap_key_id_size: Option<Setting<usize>>,
    /// `mmap_key_max_segment_bytes`, or `mmap_cache_max_segment_bytes`.
    pub mmap_key_max_segment_bytes: Option<Setting<u64>>,
    /// `user`.
    pub user: Option<Setting<String>>,
    /// `id`, as written (an integer as its decimal string, as Salt's
    /// `_read_conf_file` makes it); unset or empty, Salt uses the host's id
    /// with `_master` appended.
    pub id: Option<Setting<String>>,
    /// `keys.cache_driver` (`None` inside: set to null).
    pub cache_driver: Option<Setting<Option<String>>>,
    /// `keycache_etcd` (see [`etcd`]): the etcd cluster this master's
    /// store is a replica of; `None` when unset, null or empty.
    pub etcd: Option<Setting<etcd::EtcdSettings>>,
    /// `keycache_tree`, as the Salt driver reads it: `true` (its default)
    /// keeps the whole key tree in step ([`TreeSync::On`]), `false` none
    /// of it ([`TreeSync::Off`]), `accepted` only `minions/`
    /// ([`TreeSync::Accepted`]); `None` when unset.
    pub keycache_tree: Option<Setting<TreeSync>>,
}

impl MasterConfig {
    /// `root_dir` as Salt uses it: `os.path.abspath` of the option.
    pub fn root_dir(&self) -> String {
        let raw = self
            .root_dir
            .as_ref()
            .map_or(DEFAULT_ROOT_DIR, |s| s.value.as_str());
        abspath(raw)
    }

    /// `pki_dir` as Salt uses it: `root_dir` prefixed, normalised.
    pub fn pki_dir(&self) -> Setting<PathBuf> {
        let (raw, from) = match &self.pki_dir {
            Some(s) => (s.value.as_str(), s.from.clone()),
            None => (DEFAULT_PKI_DIR, Origin::Default),
        };
        Setting {
            value: PathBuf::from(prepend_root_dir(&self.root_dir(), raw)),
            from,
        }
    }

    /// `cluster_pki_dir` as Salt's `apply_master_config` leaves it: unset
    /// without `cluster_id`; `pki_dir` when `cluster_id` is set and it is
    /// unset or empty. A relative one is resolved against the working
    /// directory, as salt-key and salt-run resolve it (Salt keeps it
    /// relative, so each process resolves it against its own working
    /// directory; the config's notes say so).
    pub fn cluster_pki_dir(&self) -> Option<Setting<PathBuf>> {
        self.cluster_pki_dir_for(self.pki_dir())
    }

    /// [`MasterConfig::cluster_pki_dir`] with `pki_dir` standing for the
    /// config's `pki_dir` (a `PKI_DIR` given on the command line): Salt's
    /// fallback to `pki_dir` follows it.
    pub fn cluster_pki_dir_for(&self, pki_dir: Setting<PathBuf>) -> Option<Setting<PathBuf>> {
        self.cluster_id.as_ref()?;
        match &self.cluster_pki_dir {
            Some(s) if !s.value.is_empty() => Some(Setting {
                value: PathBuf::from(abspath(&s.value)),
                from: s.from.clone(),
            }),
            _ => Some(pki_dir),
        }
    }

    /// The store directory Salt's mmap_key uses (`init_kwargs`):
    /// `cluster_pki_dir` when `cluster_id` is true, else `pki_dir`.
    pub fn store_dir(&self) -> Setting<PathBuf> {
        if self.clustered {
            if let Some(c) = self.cluster_pki_dir() {
                return c;
            }
        }
        self.pki_dir()
    }

    /// The layout, each value with its origin (Salt's defaults for unset
    /// options).
    pub fn layout(&self) -> LayoutOptions {
        fn or<T: Clone>(s: &Option<Setting<T>>, d: T) -> Setting<T> {
            s.clone().unwrap_or(Setting {
                value: d,
                from: Origin::Default,
            })
        }
        LayoutOptions {
            size: or(&self.mmap_key_size, format::DEFAULT_SIZE),
            slot_size: or(&self.mmap_key_slot_size, format::DEFAULT_SLOT_SIZE),
            id_size: or(&self.mmap_key_id_size, format::DEFAULT_ID_SIZE),
            max_segment_bytes: or(
                &self.mmap_key_max_segment_bytes,
                format::DEFAULT_MAX_SEGMENT_BYTES,
            ),
        }
    }

    /// The layout as [`Params`] (not validated: [`Params::validate`]).
    #[cfg(test)]
    pub fn params(&self) -> Params {
        let l = self.layout();
        Params {
            size: l.size.value,
            slot_size: l.slot_size.value,
            id_size: l.id_size.value,
            max_segment_bytes: l.max_segment_bytes.value,
        }
    }

    /// `keys.cache_driver` as Salt uses it: `localfs_key` when unset,
    /// `None` when set to null (Salt then uses the `cache` option).
    pub fn cache_driver(&self) -> Option<&str> {
        match &self.cache_driver {
            None => Some(DEFAULT_CACHE_DRIVER),
            Some(s) => s.value.as_deref(),
        }
    }

    /// Whether the master keeps its keys in mmap_key stores.
    pub fn uses_mmap_key(&self) -> bool {
        self.cache_driver() == Some("mmap_key")
    }

    /// `keycache_tree` when the config sets it.
    pub fn tree(&self) -> Option<TreeSync> {
        self.keycache_tree.as_ref().map(|s| s.value)
    }
}

/// The four layout options, each with its origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayoutOptions {
    /// `mmap_key_size`.
    pub size: Setting<u64>,
    /// `mmap_key_slot_size`.
    pub slot_size: Setting<usize>,
    /// `mmap_key_id_size`.
    pub id_size: Setting<usize>,
    /// `mmap_key_max_segment_bytes`.
    pub max_segment_bytes: Setting<u64>,
}

/// What the command line gives explicitly: each overrides the master
/// config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explicit {
    /// The store directory (the commands' `DIR`).
    pub dir: Option<PathBuf>,
    /// The argument that gave `dir`, for messages (None: `DIR`).
    pub dir_flag: Option<&'static str>,
    /// `--size`.
    pub size: Option<u64>,
    /// `--slot-size`.
    pub slot_size: Option<usize>,
    /// `--id-size`.
    pub id_size: Option<usize>,
    /// `--max-segment-bytes`.
    pub max_segment_bytes: Option<u64>,
}

/// The store directory and layout a command uses, each with its origin:
/// a flag, else the master config, else Salt's default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// The store directory.
    pub store_dir: Setting<PathBuf>,
    /// The layout.
    pub layout: LayoutOptions,
}

impl Choice {
    /// The layout as [`Params`].
    pub fn params(&self) -> Params {
        Params {
            size: self.layout.size.value,
            slot_size: self.layout.slot_size.value,
            id_size: self.layout.id_size.value,
            max_segment_bytes: self.layout.max_segment_bytes.value,
        }
    }

    /// Whether neither a flag nor the config gave the size: the caller may
    /// read it from the store's index files instead (what `--size` does
    /// when absent), where Salt would use its default.
    pub fn size_is_default(&self) -> bool {
        self.layout.size.from == Origin::Default
    }
}

/// The layout of the store in `dir`: `base`'s params, but when nothing gave
/// the size (`size_is_default`), the size of the index files (after
/// finishing a rebuild a crash interrupted, unless `finish` is false: a dry
/// run writes nothing).
pub fn store_params(
    dir: &Path,
    base: &keycache::table::OpenOptions,
    size_is_default: bool,
    finish: bool,
) -> keycache::Result<Params> {
    match (size_is_default, finish) {
        (false, _) => Ok(base.params),
        (true, true) => Params::detect(dir, base),
        (true, false) => Ok(Params::from_files(dir, base.params)),
    }
}

impl MasterConfig {
    /// The flags over this config ([`Choice`]).
    pub fn choose(&self, e: &Explicit) -> Choice {
        fn pick<T: Clone>(flag: Option<&T>, name: &str, s: Setting<T>) -> Setting<T> {
            match flag {
                Some(v) => Setting {
                    value: v.clone(),
                    from: Origin::Flag { flag: name.into() },
                },
                None => s,
            }
        }
        let l = self.layout();
        Choice {
            store_dir: pick(
                e.dir.as_ref(),
                e.dir_flag.unwrap_or("DIR"),
                self.store_dir(),
            ),
            layout: LayoutOptions {
                size: pick(e.size.as_ref(), "--size", l.size),
                slot_size: pick(e.slot_size.as_ref(), "--slot-size", l.slot_size),
                id_size: pick(e.id_size.as_ref(), "--id-size", l.id_size),
                max_segment_bytes: pick(
                    e.max_segment_bytes.as_ref(),
                    "--max-segment-bytes",
                    l.max_segment_bytes,
                ),
            },
        }
    }
}
