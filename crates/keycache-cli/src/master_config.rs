//! The Salt master config, read as Salt 3008.5 reads it, for the store
//! directory and layout a command works on.
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
//! Salt reads YAML 1.1 through PyYAML and its own loader; [`yaml`] composes
//! the events of `saphyr-parser` the way that loader constructs them (see
//! there: YAML 1.1 booleans and integers, `010` is 10, duplicate keys are
//! an error). `saphyr-parser` is maintained, pure Rust, has two small
//! dependencies, and gives every event its line and column, which the
//! errors need; a serde crate (`serde_norway`, the maintained fork of the
//! deprecated `serde_yaml`) would resolve scalars by YAML 1.2 rules and
//! keep the last of duplicate keys, and `serde_yml` is deprecated.

mod glob;
mod yaml;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use keycache::format::{self, Params};
use serde::Serialize;

use crate::output::CmdError;
use yaml::{Kind, Node};

/// Salt's `CONFIG_DIR` on Linux (`salt.syspaths`).
pub(crate) const DEFAULT_CONFIG_DIR: &str = "/etc/salt";
/// Salt's default `pki_dir` for a master (`LIB_STATE_DIR/pki/master`).
pub(crate) const DEFAULT_PKI_DIR: &str = "/etc/salt/pki/master";
/// Salt's default `root_dir` (`salt.syspaths.ROOT_DIR`).
pub(crate) const DEFAULT_ROOT_DIR: &str = "/";
/// Salt's default `default_include` for a master.
pub(crate) const DEFAULT_INCLUDE: &str = "master.d/*.conf";
/// Salt's default `keys.cache_driver`.
pub(crate) const DEFAULT_CACHE_DRIVER: &str = "localfs_key";

/// Which master config to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    /// The file read.
    pub(crate) file: PathBuf,
    /// The path includes are relative to (Salt's `path` argument; differs
    /// from `file` only with `SALT_MASTER_CONFIG`).
    pub(crate) include_base: PathBuf,
    /// Whether an absent `file` is an error (else Salt's defaults apply).
    pub(crate) required: bool,
    /// How it was chosen, for messages: `--master-config`,
    /// `-c/--config-dir`, `SALT_CONFIG_DIR`, `SALT_MASTER_CONFIG`, `default`.
    pub(crate) how: &'static str,
}

impl Source {
    /// `DIR/master`, as `salt-key -c DIR` reads it; an error when absent.
    pub(crate) fn config_dir(dir: &Path) -> Source {
        let file = Path::new(&abspath(&expanduser(&dir.to_string_lossy()))).join("master");
        Source {
            include_base: file.clone(),
            file,
            required: true,
            how: "-c/--config-dir",
        }
    }

    /// One explicit file (`--master-config FILE`); an error when absent.
    pub(crate) fn file(file: &Path) -> Source {
        let file = PathBuf::from(abspath(&expanduser(&file.to_string_lossy())));
        Source {
            include_base: file.clone(),
            file,
            required: true,
            how: "--master-config",
        }
    }

    /// `/etc/salt/master`; when absent, Salt's defaults.
    pub(crate) fn default_path() -> Source {
        let file = Path::new(DEFAULT_CONFIG_DIR).join("master");
        Source {
            include_base: file.clone(),
            file,
            required: false,
            how: "default",
        }
    }

    /// The source the flags and the process environment select.
    pub(crate) fn from_flags(config_dir: Option<&Path>, master_config: Option<&Path>) -> Source {
        Source::from_flags_env(config_dir, master_config, &|k| std::env::var_os(k))
    }

    /// [`Source::from_flags`] with the environment given: `--master-config`
    /// first, then `-c`, then `SALT_CONFIG_DIR` (salt-key's default for
    /// `-c`), then `SALT_MASTER_CONFIG` when it names a file (read in place
    /// of `/etc/salt/master`, includes still relative to `/etc/salt`, as
    /// Salt's `load_config` and `master_config` do), then the default.
    pub(crate) fn from_flags_env(
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
pub(crate) enum Origin {
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
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { file, line, key } => write!(f, "{key}, {}:{line}", file.display()),
            Origin::Default => f.write_str("Salt's default"),
        }
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Setting<T> {
    /// The value.
    pub(crate) value: T,
    /// Where it came from.
    pub(crate) from: Origin,
}

/// A master config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfigError {
    /// An explicit config file that does not exist.
    Missing {
        /// The file.
        file: PathBuf,
        /// How it was chosen ([`Source::how`]).
        how: &'static str,
    },
    /// A file that cannot be read.
    Io {
        /// The file.
        file: PathBuf,
        /// Why.
        why: String,
    },
    /// A file that is not valid YAML (or not what Salt's loader accepts).
    Syntax {
        /// The file.
        file: PathBuf,
        /// 1-based.
        line: usize,
        /// 1-based.
        col: usize,
        /// What is wrong.
        why: String,
    },
    /// A file whose document is not a mapping.
    NotAMapping {
        /// The file.
        file: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// An option with a value of the wrong type.
    Type {
        /// The file.
        file: PathBuf,
        /// 1-based line of the value.
        line: usize,
        /// The option.
        key: String,
        /// What Salt needs.
        expected: &'static str,
        /// What the file has.
        found: String,
    },
    /// Includes that include each other.
    Cycle {
        /// The file included again.
        file: PathBuf,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Missing { file, how } => {
                write!(f, "master config {} ({how}): no such file", file.display())
            }
            ConfigError::Io { file, why } => {
                write!(f, "master config {}: cannot read: {why}", file.display())
            }
            ConfigError::Syntax {
                file,
                line,
                col,
                why,
            } => write!(
                f,
                "master config {}:{line}:{col}: not valid YAML: {why}",
                file.display()
            ),
            ConfigError::NotAMapping { file, found } => write!(
                f,
                "master config {}: the document is {found}; Salt needs a mapping of options",
                file.display()
            ),
            ConfigError::Type {
                file,
                line,
                key,
                expected,
                found,
            } => write!(
                f,
                "master config {}:{line}: {key}: expected {expected}, found {found}",
                file.display()
            ),
            ConfigError::Cycle { file } => write!(
                f,
                "master config {}: included again by its own includes (a cycle)",
                file.display()
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for CmdError {
    fn from(e: ConfigError) -> CmdError {
        CmdError::usage(e.to_string())
    }
}

/// A top-level option as a file set it.
#[derive(Debug, Clone)]
struct Entry {
    node: Node,
    file: Rc<PathBuf>,
}

type Opts = HashMap<String, Entry>;

/// The options of a Salt master config that keycache uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MasterConfig {
    /// The main file (Salt's `conf_file`).
    pub(crate) conf_file: PathBuf,
    /// How it was chosen ([`Source::how`]).
    pub(crate) how: &'static str,
    /// Whether it exists (absent at the default path: Salt's defaults).
    pub(crate) found: bool,
    /// The files read, in the order Salt reads them.
    pub(crate) files: Vec<PathBuf>,
    /// What Salt would warn about, and what keycache assumed.
    pub(crate) notes: Vec<String>,
    /// `root_dir`.
    pub(crate) root_dir: Option<Setting<String>>,
    /// `pki_dir`, as written.
    pub(crate) pki_dir: Option<Setting<String>>,
    /// `cluster_id` (an integer is kept as its decimal string).
    pub(crate) cluster_id: Option<Setting<String>>,
    /// Whether `cluster_id` is true to Python (what `init_kwargs` tests).
    pub(crate) clustered: bool,
    /// `cluster_pki_dir`, as written.
    pub(crate) cluster_pki_dir: Option<Setting<String>>,
    /// `mmap_key_size`.
    pub(crate) mmap_key_size: Option<Setting<u64>>,
    /// `mmap_key_slot_size`.
    pub(crate) mmap_key_slot_size: Option<Setting<usize>>,
    /// `mmap_key_id_size`.
    pub(crate) mmap_key_id_size: Option<Setting<usize>>,
    /// `mmap_key_max_segment_bytes`, or `mmap_cache_max_segment_bytes`.
    pub(crate) mmap_key_max_segment_bytes: Option<Setting<u64>>,
    /// `user`.
    pub(crate) user: Option<Setting<String>>,
    /// `keys.cache_driver` (`None` inside: set to null).
    pub(crate) cache_driver: Option<Setting<Option<String>>>,
}

fn io_err(file: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError::Io {
        file: file.to_path_buf(),
        why: e.to_string(),
    }
}

/// Salt's `_read_conf_file`: the file's top-level options.
fn read_conf_file(file: &Path) -> Result<Opts, ConfigError> {
    let bytes = std::fs::read(file).map_err(|e| io_err(file, &e))?;
    let text = String::from_utf8(bytes).map_err(|e| ConfigError::Io {
        file: file.to_path_buf(),
        why: format!("not UTF-8 text ({e})"),
    })?;
    let doc = yaml::load(&text).map_err(|e| ConfigError::Syntax {
        file: file.to_path_buf(),
        line: e.line,
        col: e.col,
        why: e.message,
    })?;
    let rc = Rc::new(file.to_path_buf());
    let mut opts = Opts::new();
    match doc {
        None => {}
        Some(n) if !n.kind.truthy() => {}
        Some(Node {
            kind: Kind::Map(pairs),
            ..
        }) => {
            for (k, v) in pairs {
                // Only string keys can be the options keycache reads.
                if let Kind::Str(k) = k.kind {
                    opts.insert(
                        k,
                        Entry {
                            node: v,
                            file: rc.clone(),
                        },
                    );
                }
            }
        }
        Some(n) => {
            return Err(ConfigError::NotAMapping {
                file: file.to_path_buf(),
                found: n.kind.type_name(),
            })
        }
    }
    Ok(opts)
}

fn type_err(e: &Entry, key: &str, expected: &'static str) -> ConfigError {
    let found = match &e.node.kind {
        Kind::Str(s) => format!("the string {s:?}"),
        Kind::Int(i) => format!("the integer {i}"),
        Kind::BigInt(s) => format!("the integer {s}"),
        Kind::Float(s) => format!("the float {s}"),
        Kind::Bool(b) => format!("the boolean {}", if *b { "true" } else { "false" }),
        other => other.type_name().to_string(),
    };
    ConfigError::Type {
        file: e.file.to_path_buf(),
        line: e.node.line,
        key: key.to_string(),
        expected,
        found,
    }
}

/// The patterns of `include`/`default_include`: a string or a list of
/// strings; nothing when false to Python.
fn patterns(e: Option<&Entry>, key: &str) -> Result<Vec<String>, ConfigError> {
    let Some(e) = e else {
        return Ok(Vec::new());
    };
    if !e.node.kind.truthy() {
        return Ok(Vec::new());
    }
    const WANT: &str = "a string or a list of strings (glob patterns)";
    match &e.node.kind {
        Kind::Str(s) => Ok(vec![s.clone()]),
        Kind::Seq(items) => items
            .iter()
            .map(|n| match &n.kind {
                Kind::Str(s) => Ok(s.clone()),
                _ => Err(type_err(
                    &Entry {
                        node: n.clone(),
                        file: e.file.clone(),
                    },
                    key,
                    WANT,
                )),
            })
            .collect(),
        _ => Err(type_err(e, key, WANT)),
    }
}

struct Loader {
    files: Vec<PathBuf>,
    notes: Vec<String>,
    stack: Vec<PathBuf>,
}

impl Loader {
    /// Salt's `include_config`.
    fn include(
        &mut self,
        patterns: &[String],
        orig: &Path,
        verbose: bool,
    ) -> Result<Opts, ConfigError> {
        let mut configuration = Opts::new();
        let base = orig.parent().unwrap_or(Path::new(""));
        for pat in patterns {
            let pat = expanduser(pat);
            let path = if Path::new(&pat).is_absolute() {
                PathBuf::from(&pat)
            } else {
                base.join(&pat)
            };
            let matches = glob::glob_sorted(&path);
            if matches.is_empty() && verbose {
                self.notes.push(format!(
                    "include {}: matches no file (Salt only warns)",
                    path.display()
                ));
            }
            for f in matches {
                let key = std::fs::canonicalize(&f).unwrap_or_else(|_| f.clone());
                if self.stack.contains(&key) {
                    return Err(ConfigError::Cycle { file: f });
                }
                self.files.push(f.clone());
                let mut opts = read_conf_file(&f)?;
                let nested = patterns_of(&opts, "include")?;
                if !nested.is_empty() {
                    self.stack.push(key);
                    let sub = self.include(&nested, &f, verbose)?;
                    self.stack.pop();
                    opts.extend(sub);
                }
                // Salt merges with dictupdate.update (recursive, lists
                // merged); for the scalar options read here that is a
                // replacement.
                configuration.extend(opts);
            }
        }
        Ok(configuration)
    }
}

fn patterns_of(opts: &Opts, key: &str) -> Result<Vec<String>, ConfigError> {
    patterns(opts.get(key), key)
}

impl MasterConfig {
    /// Reads the master config of `source` with its includes, as Salt's
    /// `master_config` does.
    pub(crate) fn load(source: &Source) -> Result<MasterConfig, ConfigError> {
        let mut loader = Loader {
            files: Vec::new(),
            notes: Vec::new(),
            stack: Vec::new(),
        };
        let exists = match std::fs::metadata(&source.file) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io_err(&source.file, &e)),
        };
        let mut overrides = if exists {
            loader.files.push(source.file.clone());
            read_conf_file(&source.file)?
        } else if source.required {
            return Err(ConfigError::Missing {
                file: source.file.clone(),
                how: source.how,
            });
        } else {
            loader.notes.push(format!(
                "{} does not exist: Salt's defaults apply",
                source.file.display()
            ));
            Opts::new()
        };
        let default_include = match overrides.get("default_include") {
            Some(_) => patterns_of(&overrides, "default_include")?,
            None => vec![DEFAULT_INCLUDE.to_string()],
        };
        let include = patterns_of(&overrides, "include")?;
        let key = std::fs::canonicalize(&source.file).unwrap_or_else(|_| source.file.clone());
        loader.stack.push(key);
        let d = loader.include(&default_include, &source.include_base, false)?;
        overrides.extend(d);
        let i = loader.include(&include, &source.include_base, true)?;
        overrides.extend(i);
        MasterConfig::from_opts(source, exists, loader, &overrides)
    }

    fn from_opts(
        source: &Source,
        found: bool,
        loader: Loader,
        o: &Opts,
    ) -> Result<MasterConfig, ConfigError> {
        let mut notes = loader.notes;
        let cluster_id = o.get("cluster_id");
        let clustered = cluster_id.is_some_and(|e| e.node.kind.truthy());
        let cluster_id = match cluster_id {
            None => None,
            Some(e) => match &e.node.kind {
                Kind::Null => None,
                Kind::Str(s) => Some(setting(e, "cluster_id", s.clone())),
                Kind::Int(i) => Some(setting(e, "cluster_id", i.to_string())),
                _ => return Err(type_err(e, "cluster_id", "a string")),
            },
        };
        let mut cluster_pki_dir = opt_str(o, "cluster_pki_dir", true)?;
        if cluster_id.is_none() {
            if let Some(s) = cluster_pki_dir.take() {
                if !s.value.is_empty() {
                    notes.push(format!(
                        "cluster_pki_dir ({}) is ignored without cluster_id, as Salt ignores it",
                        s.from
                    ));
                }
            }
        }
        if cluster_id.is_some() && cluster_pki_dir.as_ref().is_none_or(|s| s.value.is_empty()) {
            notes
                .push("cluster_id without cluster_pki_dir: Salt falls back to pki_dir".to_string());
        }
        let max_segment = match opt_int(o, "mmap_key_max_segment_bytes")? {
            Some(s) => Some(s),
            None => opt_int(o, "mmap_cache_max_segment_bytes")?,
        };
        let cache_driver = match o.get("keys.cache_driver") {
            None => None,
            Some(e) => match &e.node.kind {
                Kind::Null => Some(setting(e, "keys.cache_driver", None)),
                Kind::Str(s) => Some(setting(e, "keys.cache_driver", Some(s.clone()))),
                _ => return Err(type_err(e, "keys.cache_driver", "a string or null")),
            },
        };
        let cfg = MasterConfig {
            conf_file: source.file.clone(),
            how: source.how,
            found,
            files: loader.files,
            notes,
            root_dir: opt_str(o, "root_dir", false)?,
            pki_dir: opt_str(o, "pki_dir", false)?,
            cluster_id,
            clustered,
            cluster_pki_dir,
            mmap_key_size: opt_int(o, "mmap_key_size")?,
            mmap_key_slot_size: to_usize(opt_int(o, "mmap_key_slot_size")?),
            mmap_key_id_size: to_usize(opt_int(o, "mmap_key_id_size")?),
            mmap_key_max_segment_bytes: max_segment,
            user: opt_str(o, "user", false)?,
            cache_driver,
        };
        Ok(cfg)
    }

    /// `root_dir` as Salt uses it: `os.path.abspath` of the option.
    pub(crate) fn root_dir(&self) -> String {
        let raw = self
            .root_dir
            .as_ref()
            .map_or(DEFAULT_ROOT_DIR, |s| s.value.as_str());
        abspath(raw)
    }

    /// `pki_dir` as Salt uses it: `root_dir` prefixed, normalised.
    pub(crate) fn pki_dir(&self) -> Setting<PathBuf> {
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
    /// unset or empty. A relative one is taken relative to `/`, the working
    /// directory of a master daemon.
    pub(crate) fn cluster_pki_dir(&self) -> Option<Setting<PathBuf>> {
        self.cluster_id.as_ref()?;
        match &self.cluster_pki_dir {
            Some(s) if !s.value.is_empty() => Some(Setting {
                value: Path::new("/").join(&s.value),
                from: s.from.clone(),
            }),
            _ => Some(self.pki_dir()),
        }
    }

    /// The store directory Salt's mmap_key uses (`init_kwargs`):
    /// `cluster_pki_dir` when `cluster_id` is true, else `pki_dir`.
    pub(crate) fn store_dir(&self) -> Setting<PathBuf> {
        if self.clustered {
            if let Some(c) = self.cluster_pki_dir() {
                return c;
            }
        }
        self.pki_dir()
    }

    /// The layout, each value with its origin (Salt's defaults for unset
    /// options).
    pub(crate) fn layout(&self) -> Layout {
        fn or<T: Clone>(s: &Option<Setting<T>>, d: T) -> Setting<T> {
            s.clone().unwrap_or(Setting {
                value: d,
                from: Origin::Default,
            })
        }
        Layout {
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
    pub(crate) fn params(&self) -> Params {
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
    pub(crate) fn cache_driver(&self) -> Option<&str> {
        match &self.cache_driver {
            None => Some(DEFAULT_CACHE_DRIVER),
            Some(s) => s.value.as_deref(),
        }
    }

    /// Whether the master keeps its keys in mmap_key stores.
    pub(crate) fn uses_mmap_key(&self) -> bool {
        self.cache_driver() == Some("mmap_key")
    }

    /// What was read and what it gives, for humans: the files, the store
    /// directory, the layout, each with where it came from, and the notes.
    pub(crate) fn describe(&self) -> String {
        let mut s = String::new();
        if self.found {
            let files: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
            s += &format!("master config: {}\n", files.join(", "));
        } else {
            s += &format!(
                "master config: {} absent, Salt's defaults\n",
                self.conf_file.display()
            );
        }
        let store = self.store_dir();
        let why = match (&self.cluster_id, self.clustered) {
            (Some(id), true) => format!("cluster_id {:?}, {}", id.value, id.from),
            _ => "no cluster_id".to_string(),
        };
        s += &format!(
            "store: {} ({}; {why})\n",
            store.value.display(),
            match &store.from {
                Origin::Default => "pki_dir, Salt's default".to_string(),
                o => o.to_string(),
            },
        );
        let l = self.layout();
        let p = |name: &str, v: String, o: &Origin| match o {
            Origin::Default => format!("{name} {v} (default)"),
            Origin::File { file, line, key } if key == name => {
                format!("{name} {v} ({}:{line})", file.display())
            }
            o => format!("{name} {v} ({o})"),
        };
        s += &format!(
            "layout: {}, {}, {}, {}\n",
            p("mmap_key_size", l.size.value.to_string(), &l.size.from),
            p(
                "mmap_key_slot_size",
                l.slot_size.value.to_string(),
                &l.slot_size.from
            ),
            p(
                "mmap_key_id_size",
                l.id_size.value.to_string(),
                &l.id_size.from
            ),
            p(
                "mmap_key_max_segment_bytes",
                l.max_segment_bytes.value.to_string(),
                &l.max_segment_bytes.from
            ),
        );
        s += &format!(
            "keys.cache_driver: {}\n",
            self.cache_driver()
                .unwrap_or("null (the `cache` option's driver)")
        );
        for n in &self.notes {
            s += &format!("note: {n}\n");
        }
        s
    }

    fn report(&self) -> Report<'_> {
        Report {
            conf_file: &self.conf_file,
            how: self.how,
            found: self.found,
            files: &self.files,
            store_dir: self.store_dir(),
            pki_dir: self.pki_dir(),
            cluster_id: self.cluster_id.as_ref(),
            clustered: self.clustered,
            cluster_pki_dir: self.cluster_pki_dir(),
            root_dir: self.root_dir(),
            layout: self.layout(),
            user: self.user.as_ref(),
            cache_driver: self.cache_driver(),
            notes: &self.notes,
        }
    }
}

impl Serialize for MasterConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.report().serialize(s)
    }
}

/// The JSON form of a [`MasterConfig`]: what was read and what it gives.
#[derive(Serialize)]
struct Report<'a> {
    conf_file: &'a Path,
    how: &'static str,
    found: bool,
    files: &'a [PathBuf],
    store_dir: Setting<PathBuf>,
    pki_dir: Setting<PathBuf>,
    cluster_id: Option<&'a Setting<String>>,
    clustered: bool,
    cluster_pki_dir: Option<Setting<PathBuf>>,
    root_dir: String,
    layout: Layout,
    user: Option<&'a Setting<String>>,
    cache_driver: Option<&'a str>,
    notes: &'a [String],
}

/// The four layout options, each with its origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Layout {
    /// `mmap_key_size`.
    pub(crate) size: Setting<u64>,
    /// `mmap_key_slot_size`.
    pub(crate) slot_size: Setting<usize>,
    /// `mmap_key_id_size`.
    pub(crate) id_size: Setting<usize>,
    /// `mmap_key_max_segment_bytes`.
    pub(crate) max_segment_bytes: Setting<u64>,
}

fn setting<T>(e: &Entry, key: &str, value: T) -> Setting<T> {
    Setting {
        value,
        from: Origin::File {
            file: e.file.to_path_buf(),
            line: e.node.line,
            key: key.to_string(),
        },
    }
}

/// A string option; null is unset only when `nullable` (Salt's default for
/// it is `None`).
fn opt_str(o: &Opts, key: &str, nullable: bool) -> Result<Option<Setting<String>>, ConfigError> {
    let Some(e) = o.get(key) else {
        return Ok(None);
    };
    match &e.node.kind {
        Kind::Str(s) => Ok(Some(setting(e, key, s.clone()))),
        Kind::Null if nullable => Ok(None),
        _ => Err(type_err(
            e,
            key,
            if nullable {
                "a string or null"
            } else {
                "a string"
            },
        )),
    }
}

/// A non-negative integer option (a boolean is refused, though Python
/// would take `true` as 1).
fn opt_int(o: &Opts, key: &str) -> Result<Option<Setting<u64>>, ConfigError> {
    let Some(e) = o.get(key) else {
        return Ok(None);
    };
    match &e.node.kind {
        Kind::Int(i) => u64::try_from(*i)
            .map(|v| Some(setting(e, key, v)))
            .map_err(|_| type_err(e, key, "a non-negative integer")),
        _ => Err(type_err(e, key, "a non-negative integer")),
    }
}

fn to_usize(s: Option<Setting<u64>>) -> Option<Setting<usize>> {
    s.map(|s| Setting {
        value: usize::try_from(s.value).unwrap_or(usize::MAX),
        from: s.from,
    })
}

/// `os.path.expanduser` for `~` and `~/...` (`~user` is left as is).
fn expanduser(p: &str) -> String {
    if p == "~" || p.starts_with("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            let home = home.to_string_lossy().trim_end_matches('/').to_string();
            let home = if home.is_empty() { "/".into() } else { home };
            return format!("{home}{}", &p[1..]);
        }
    }
    p.to_string()
}

/// `posixpath.normpath`.
pub(crate) fn normpath(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let initial = if path.starts_with("//") && !path.starts_with("///") {
        2
    } else {
        usize::from(path.starts_with('/'))
    };
    let mut new: Vec<&str> = Vec::new();
    for comp in path.split('/') {
        if comp.is_empty() || comp == "." {
            continue;
        }
        if comp != ".." || (initial == 0 && new.is_empty()) || new.last() == Some(&"..") {
            new.push(comp);
        } else if !new.is_empty() {
            new.pop();
        }
    }
    let out = format!("{}{}", "/".repeat(initial), new.join("/"));
    if out.is_empty() {
        ".".into()
    } else {
        out
    }
}

/// `posixpath.abspath`.
pub(crate) fn abspath(p: &str) -> String {
    if p.starts_with('/') {
        normpath(p)
    } else {
        let cwd = std::env::current_dir()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".into());
        normpath(&format!("{cwd}/{p}"))
    }
}

/// `salt.utils.path.join(root, path)` on POSIX.
fn salt_path_join(root: &str, path: &str) -> String {
    let root = normpath(root);
    let p = normpath(path);
    let stripped = p.trim_start_matches('/');
    let joined = if root.ends_with('/') || root.is_empty() {
        format!("{root}{stripped}")
    } else {
        format!("{root}/{stripped}")
    };
    normpath(&joined)
}

/// Salt's `prepend_root_dir` for one path option, `root_dir` already
/// `abspath`ed; `salt.syspaths.ROOT_DIR` is `/`, so its stripped form is
/// empty and every absolute path "starts with" it.
pub(crate) fn prepend_root_dir(root_dir: &str, path: &str) -> String {
    let def_root = "";
    let tmp_def = (path == def_root || path.starts_with(&format!("{def_root}/")))
        .then(|| &path[def_root.len()..])
        .filter(|s| !s.is_empty());
    let tmp_root = (!root_dir.is_empty()
        && (path == root_dir || path.starts_with(&format!("{root_dir}/"))))
    .then(|| &path[root_dir.len()..])
    .filter(|s| !s.is_empty());
    let p = match (tmp_def, tmp_root) {
        (Some(d), None) => d,
        (None, Some(r)) => r,
        // def_root ("") is in every root_dir: the root_dir-relative part.
        (Some(_), Some(r)) => r,
        (None, None) if path.starts_with('/') => return path.to_string(),
        (None, None) => path,
    };
    salt_path_join(root_dir, p)
}
