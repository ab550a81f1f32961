//! Reading the files: Salt's `master_config`, `include_config` and
//! `_read_conf_file`, and the options' types.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::yaml::{self, Kind, Node};
use super::{
    glob,
    paths::{abspath, expanduser},
    ConfigError, MasterConfig, Origin, Setting, Source, DEFAULT_INCLUDE,
};
use keycache::tree::TreeSync;

/// A top-level option as a file set it.
#[derive(Debug, Clone)]
struct Entry {
    node: Node,
    file: Rc<PathBuf>,
}

type Opts = HashMap<String, Entry>;

fn io_err(file: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError::Io {
        file: file.to_path_buf(),
        why: e.to_string(),
    }
}

/// Salt's `_read_conf_file`: the file's top-level options. Only a regular
/// file is read (a symlink to one is followed, as Salt follows it): an
/// `include` glob that matches a FIFO or a device (`include: /*/*5` matched
/// `/dev/tty5` under the fuzzer) would block the read for ever, where Salt
/// hangs.
fn read_conf_file(file: &Path) -> Result<Opts, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO without a writer must not block either.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(file)
        .map_err(|e| io_err(file, &e))?;
    let meta = f.metadata().map_err(|e| io_err(file, &e))?;
    if !meta.is_file() {
        return Err(ConfigError::Io {
            file: file.to_path_buf(),
            why: "not a regular file (a FIFO, a device or a directory): not read".into(),
        });
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(|e| io_err(file, &e))?;
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
    pub fn load(source: &Source) -> Result<MasterConfig, ConfigError> {
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
        // The main file is not on the stack: Salt reads it again when an
        // included file includes it (`include: ../master` in master.d/),
        // without its default_include; a cycle is only a chain of
        // `include`s that comes back to a file it is following.
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
        let clustered = o.get("cluster_id").is_some_and(|e| e.node.kind.truthy());
        let cluster_id = opt_name(o, "cluster_id")?;
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
        if let Some(s) = cluster_pki_dir
            .as_ref()
            .filter(|s| cluster_id.is_some() && !s.value.is_empty() && !s.value.starts_with('/'))
        {
            let at = match &s.from {
                Origin::File { file, line, .. } => format!("{}:{line}", file.display()),
                o => o.to_string(),
            };
            notes.push(format!(
                "cluster_pki_dir {:?} ({at}) is relative: Salt keeps it relative, so each Salt \
                 process resolves it against its own working directory (/ for a master started \
                 with -d or by systemd, the current directory for salt-key and salt-run); \
                 keycache resolves it against its own, as salt-key does: {}. Make it absolute",
                s.value,
                abspath(&s.value)
            ));
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
        let id = opt_name(o, "id")?;
        let etcd = match o.get("keycache_etcd") {
            None => None,
            Some(e) => {
                crate::etcd::parse(&e.file, &e.node)?.map(|v| setting(e, "keycache_etcd", v))
            }
        };
        let keycache_tree = match o.get("keycache_tree") {
            None => None,
            Some(e) => Some(setting(e, "keycache_tree", tree_setting(e)?)),
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
            id,
            cache_driver,
            etcd,
            keycache_tree,
        };
        Ok(cfg)
    }
}

/// `keycache_tree` as the Salt driver takes it: `accepted`, or any other
/// value but a string by Python's truth (`true`, `1`: the whole tree;
/// `false`, `0`, null: none of it). Another string is refused, as the
/// driver refuses it (Python would take `"false"` as true).
fn tree_setting(e: &Entry) -> Result<TreeSync, ConfigError> {
    Ok(match &e.node.kind {
        Kind::Str(s) if s == "accepted" => TreeSync::Accepted,
        Kind::Bool(true) => TreeSync::On,
        Kind::Bool(false) | Kind::Null => TreeSync::Off,
        Kind::Int(i) if *i != 0 => TreeSync::On,
        Kind::Int(_) => TreeSync::Off,
        _ => return Err(type_err(e, "keycache_tree", "true, false or accepted")),
    })
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
/// A name Salt also takes as an integer (`cluster_id`, `id`), kept as its
/// decimal string; null is unset.
fn opt_name(o: &Opts, key: &str) -> Result<Option<Setting<String>>, ConfigError> {
    let Some(e) = o.get(key) else {
        return Ok(None);
    };
    match &e.node.kind {
        Kind::Null => Ok(None),
        Kind::Str(s) => Ok(Some(setting(e, key, s.clone()))),
        Kind::Int(i) => Ok(Some(setting(e, key, i.to_string()))),
        _ => Err(type_err(e, key, "a string")),
    }
}

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
