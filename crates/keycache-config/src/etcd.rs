//! `keycache_etcd`: where a master's key store is replicated from.
//!
//! ```yaml
//! keys.cache_driver: keycache
//! keycache_etcd:
//!   endpoints: [https://10.0.0.1:2379, https://10.0.0.2:2379]
//!   prefix: /keycache/prod/          # default /keycache/<cluster_id or default>/
//!   ca: /etc/salt/etcd/ca.pem        # TLS: the CA, and a client certificate
//!   cert: /etc/salt/etcd/client.pem
//!   key: /etc/salt/etcd/client-key.pem
//!   user: salt                       # etcd's own auth
//!   password: secret
//!   write_timeout: 10                # seconds a write waits for etcd and the replica
//!   stale_after: 30                  # seconds without proof of currency before the replica is stale
//!   check_every: 300                 # seconds between consistency checks of the replica
//!   metrics: 9100                    # the replicator's /metrics, /healthz, /readyz (unset: none)
//! ```
//!
//! `metrics` is where `keycache replicate` (and the Salt engine) serve
//! Prometheus metrics and their health and readiness over HTTP: a port
//! alone listens on `127.0.0.1:PORT` (this host only); `HOST:PORT` (an IP
//! address, `[v6]:PORT`, or a host name) listens there, as given: an
//! operator who names an address means it. Unset, nothing listens.
//!
//! Salt ignores options it does not know, so the mapping sits beside the
//! master's own options. A value of the wrong type is refused with its file
//! and line, as the other options are.

use std::ops::RangeInclusive;
use std::path::PathBuf;

use serde::Serialize;

use crate::yaml::{Kind, Node};
use crate::ConfigError;

/// The default seconds a write through etcd waits for the commit and for
/// this master's replica to apply it.
pub const DEFAULT_WRITE_TIMEOUT: u64 = 10;

/// The default seconds without contact with etcd after which a replica
/// counts as stale.
pub const DEFAULT_STALE_AFTER: u64 = 30;

/// The default seconds between two consistency checks of a replica
/// against etcd (a digest of the prefix at one revision).
pub const DEFAULT_CHECK_EVERY: u64 = 300;

/// The seconds `write_timeout`, `stale_after` and `check_every` may be.
pub const SECONDS: RangeInclusive<u64> = 1..=86_400;

/// What the `metrics` option takes, for an error.
pub const METRICS_EXPECTED: &str = "a port from 1 to 65535, or HOST:PORT";

/// The listening address of the `metrics` option written as a number: a
/// port alone, on `127.0.0.1` (`None`: not a port from 1 to 65535).
pub fn metrics_port(port: i128) -> Option<String> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p > 0)
        .map(|p| format!("127.0.0.1:{p}"))
}

/// The listening address of the `metrics` option written as a string: a
/// port alone (`"9100"`) on `127.0.0.1`; else `HOST:PORT` as given, where
/// HOST is an IPv4 address, a bracketed IPv6 one or a host name (`None`:
/// none of these, or port 0).
pub fn metrics_address(s: &str) -> Option<String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return metrics_port(s.parse().ok()?);
    }
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return (a.port() > 0).then(|| s.to_owned());
    }
    let (host, port) = s.rsplit_once(':')?;
    let name = host.len() <= 253
        && host.bytes().any(|b| b.is_ascii_alphabetic())
        && !host.starts_with(['-', '.'])
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    let port =
        port.bytes().all(|b| b.is_ascii_digit()) && metrics_port(port.parse().ok()?).is_some();
    (name && port).then(|| s.to_owned())
}

/// The `keycache_etcd` mapping of a master config.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct EtcdSettings {
    /// `endpoints`: `http://host:port` or `https://host:port` (a bare
    /// `host:port` is http).
    pub endpoints: Vec<String>,
    /// `prefix`, as written (`None`: the default).
    pub prefix: Option<String>,
    /// `ca`: the CA certificate that signs the servers' (PEM).
    pub ca: Option<PathBuf>,
    /// `cert`: the client certificate (PEM).
    pub cert: Option<PathBuf>,
    /// `key`: the client certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// `user`: etcd's auth user.
    pub user: Option<String>,
    /// `password`: etcd's auth password (never printed).
    #[serde(skip)]
    pub password: Option<String>,
    /// `write_timeout`, seconds.
    pub write_timeout: u64,
    /// `stale_after`, seconds.
    pub stale_after: u64,
    /// `check_every`, seconds.
    pub check_every: u64,
    /// `metrics`: the address the replicator serves its metrics, health
    /// and readiness on, `HOST:PORT` (a port alone became
    /// `127.0.0.1:PORT`: [`metrics_port`], [`metrics_address`]); `None`:
    /// not served.
    pub metrics: Option<String>,
}

impl Default for EtcdSettings {
    /// No endpoint and nothing set, the default seconds: what a
    /// `keycache_etcd` mapping's options are read into.
    fn default() -> EtcdSettings {
        EtcdSettings {
            endpoints: Vec::new(),
            prefix: None,
            ca: None,
            cert: None,
            key: None,
            user: None,
            password: None,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            stale_after: DEFAULT_STALE_AFTER,
            check_every: DEFAULT_CHECK_EVERY,
            metrics: None,
        }
    }
}

impl EtcdSettings {
    /// The first pair of options that go together, (`cert`, `key`) then
    /// (`user`, `password`), of which only one is set.
    pub fn half_pair(&self) -> Option<(&'static str, &'static str)> {
        [
            ("cert", "key", self.cert.is_some() != self.key.is_some()),
            (
                "user",
                "password",
                self.user.is_some() != self.password.is_some(),
            ),
        ]
        .into_iter()
        .find(|p| p.2)
        .map(|(first, second, _)| (first, second))
    }
}

/// The etcd prefix of a master's key state, ending in `/`: `prefix` (the
/// option), else `/keycache/<cluster_id>/` for a master of a Salt cluster
/// (`cluster_id`), else `/keycache/default/`.
pub fn prefix_or_default(prefix: Option<&str>, cluster_id: Option<&str>) -> String {
    let p = match (prefix, cluster_id) {
        (Some(p), _) => p.to_string(),
        (None, Some(c)) => format!("/keycache/{c}/"),
        (None, None) => "/keycache/default/".to_string(),
    };
    if p.ends_with('/') {
        p
    } else {
        format!("{p}/")
    }
}

fn err(file: &std::path::Path, node: &Node, key: &str, expected: &'static str) -> ConfigError {
    let found = match &node.kind {
        Kind::Str(s) => format!("the string {s:?}"),
        Kind::Int(i) => format!("the integer {i}"),
        other => other.type_name().to_string(),
    };
    ConfigError::Type {
        file: file.to_path_buf(),
        line: node.line,
        key: format!("keycache_etcd.{key}"),
        expected,
        found,
    }
}

/// Reads the `keycache_etcd` mapping `node` of `file`; `None` when it is
/// null or empty (no etcd).
pub(crate) fn parse(
    file: &std::path::Path,
    node: &Node,
) -> Result<Option<EtcdSettings>, ConfigError> {
    let map = match &node.kind {
        Kind::Null => return Ok(None),
        Kind::Map(m) if m.is_empty() => return Ok(None),
        Kind::Map(m) => m,
        _ => {
            return Err(ConfigError::Type {
                file: file.to_path_buf(),
                line: node.line,
                key: "keycache_etcd".into(),
                expected: "a mapping",
                found: node.kind.type_name().into(),
            })
        }
    };
    let mut s = EtcdSettings::default();
    for (k, v) in map {
        let Kind::Str(name) = &k.kind else {
            return Err(err(file, k, "?", "a mapping with string keys"));
        };
        let string = |what: &str| match &v.kind {
            Kind::Str(x) if !x.is_empty() => Ok(x.clone()),
            _ => Err(err(file, v, what, "a non-empty string")),
        };
        let seconds = |what: &str| {
            match &v.kind {
                Kind::Int(i) => u64::try_from(*i).ok().filter(|n| SECONDS.contains(n)),
                _ => None,
            }
            .ok_or_else(|| err(file, v, what, "a number of seconds from 1 to 86400"))
        };
        match name.as_str() {
            "endpoints" => {
                s.endpoints = match &v.kind {
                    Kind::Str(x) if !x.is_empty() => vec![x.clone()],
                    Kind::Seq(items) if !items.is_empty() => items
                        .iter()
                        .map(|i| match &i.kind {
                            Kind::Str(x) if !x.is_empty() => Ok(x.clone()),
                            _ => Err(err(file, i, "endpoints", "a list of URLs")),
                        })
                        .collect::<Result<_, _>>()?,
                    _ => return Err(err(file, v, "endpoints", "a URL or a list of URLs")),
                }
            }
            "prefix" => s.prefix = Some(string("prefix")?),
            "ca" => s.ca = Some(string("ca")?.into()),
            "cert" => s.cert = Some(string("cert")?.into()),
            "key" => s.key = Some(string("key")?.into()),
            "user" => s.user = Some(string("user")?),
            "password" => s.password = Some(string("password")?),
            "write_timeout" => s.write_timeout = seconds("write_timeout")?,
            "stale_after" => s.stale_after = seconds("stale_after")?,
            "check_every" => s.check_every = seconds("check_every")?,
            "metrics" => {
                s.metrics = Some(
                    match &v.kind {
                        Kind::Int(i) => metrics_port(*i),
                        Kind::Str(x) => metrics_address(x),
                        _ => None,
                    }
                    .ok_or_else(|| err(file, v, "metrics", METRICS_EXPECTED))?,
                )
            }
            other => {
                return Err(ConfigError::Type {
                    file: file.to_path_buf(),
                    line: k.line,
                    key: format!("keycache_etcd.{other}"),
                    expected: "one of endpoints, prefix, ca, cert, key, user, password, \
                               write_timeout, stale_after, check_every, metrics",
                    found: "an unknown option".into(),
                })
            }
        }
    }
    if s.endpoints.is_empty() {
        return Err(ConfigError::Type {
            file: file.to_path_buf(),
            line: node.line,
            key: "keycache_etcd.endpoints".into(),
            expected: "a URL or a list of URLs",
            found: "nothing".into(),
        });
    }
    if let Some((first, _)) = s.half_pair() {
        return Err(ConfigError::Type {
            file: file.to_path_buf(),
            line: node.line,
            key: format!("keycache_etcd.{first}"),
            expected: if first == "cert" {
                "cert and key together"
            } else {
                "user and password together"
            },
            found: "only one of them".into(),
        });
    }
    Ok(Some(s))
}

impl crate::MasterConfig {
    /// The etcd prefix of this master's key state, ending in `/`: the
    /// `prefix` option, else `/keycache/<cluster_id>/` for a Salt cluster and
    /// `/keycache/default/` for masters without one. `None` without
    /// `keycache_etcd`.
    pub fn etcd_prefix(&self) -> Option<String> {
        let s = &self.etcd.as_ref()?.value;
        let cluster = self.cluster_id.as_ref().filter(|_| self.clustered);
        Some(prefix_or_default(
            s.prefix.as_deref(),
            cluster.map(|c| c.value.as_str()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::{ConfigError, MasterConfig, Source};

    fn load(text: &str) -> Result<MasterConfig, ConfigError> {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("master"), text).expect("write");
        MasterConfig::load(&Source::config_dir(dir.path()))
    }

    #[test]
    fn a_full_mapping_is_read_with_defaults_for_what_is_left_out() {
        let c = load(
            "cluster_id: prod\nkeycache_etcd:\n  endpoints: [http://127.0.0.1:2379, \
             http://127.0.0.1:2380]\n  ca: /ca.pem\n  cert: /c.pem\n  key: /k.pem\n  user: u\n  \
             password: p\n",
        )
        .expect("loads");
        let e = &c.etcd.as_ref().expect("etcd").value;
        assert_eq!(
            e.endpoints,
            ["http://127.0.0.1:2379", "http://127.0.0.1:2380"]
        );
        assert_eq!(e.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(
            (e.user.as_deref(), e.password.as_deref()),
            (Some("u"), Some("p"))
        );
        assert_eq!(e.write_timeout, super::DEFAULT_WRITE_TIMEOUT);
        assert_eq!(c.etcd_prefix().as_deref(), Some("/keycache/prod/"));
    }

    #[test]
    fn prefix_defaults_and_gets_its_slash() {
        let c = load("keycache_etcd: {endpoints: 'localhost:2379'}\n").expect("loads");
        assert_eq!(c.etcd_prefix().as_deref(), Some("/keycache/default/"));
        let c = load("keycache_etcd: {endpoints: [a:1], prefix: /kc/x}\n").expect("loads");
        assert_eq!(c.etcd_prefix().as_deref(), Some("/kc/x/"));
        assert_eq!(
            load("keycache_etcd: {}\n").expect("loads").etcd_prefix(),
            None
        );
        assert_eq!(load("pki_dir: /p\n").expect("loads").etcd, None);
    }

    /// The rules the Salt driver's reader shares (it reads Python values).
    #[test]
    fn the_shared_rules_pair_halves_and_default_prefixes() {
        use super::{prefix_or_default, EtcdSettings, SECONDS};
        let mut s = EtcdSettings::default();
        assert_eq!(s.half_pair(), None);
        s.key = Some("/k.pem".into());
        s.user = Some("u".into());
        assert_eq!(s.half_pair(), Some(("cert", "key")));
        s.cert = Some("/c.pem".into());
        assert_eq!(s.half_pair(), Some(("user", "password")));
        s.password = Some("p".into());
        assert_eq!(s.half_pair(), None);
        assert_eq!(prefix_or_default(Some("/kc/x"), Some("c")), "/kc/x/");
        assert_eq!(prefix_or_default(None, Some("c")), "/keycache/c/");
        assert_eq!(prefix_or_default(None, None), "/keycache/default/");
        assert!(SECONDS.contains(&1) && SECONDS.contains(&86_400));
        assert!(!SECONDS.contains(&0) && !SECONDS.contains(&86_401));
    }

    /// `metrics`: unset is off; a port alone listens on 127.0.0.1; an
    /// address is taken as given; anything else is refused, naming the
    /// option.
    #[test]
    fn metrics_takes_a_port_or_an_address() {
        let metrics = |v: &str| {
            load(&format!(
                "keycache_etcd:\n  endpoints: [a:1]\n  metrics: {v}\n"
            ))
            .map(|c| c.etcd.expect("etcd").value.metrics)
        };
        assert_eq!(
            load("keycache_etcd: {endpoints: [a:1]}\n")
                .expect("loads")
                .etcd
                .expect("etcd")
                .value
                .metrics,
            None
        );
        for (v, want) in [
            ("9100", "127.0.0.1:9100"),
            ("'9100'", "127.0.0.1:9100"),
            ("0.0.0.0:9100", "0.0.0.0:9100"),
            ("10.1.2.3:9100", "10.1.2.3:9100"),
            ("'[::1]:9100'", "[::1]:9100"),
            ("localhost:9100", "localhost:9100"),
            ("metrics-1.example.org:80", "metrics-1.example.org:80"),
        ] {
            assert_eq!(metrics(v).expect(v).as_deref(), Some(want), "{v}");
        }
        for v in [
            "0",
            "65536",
            "-1",
            "''",
            "':9100'",
            "localhost",
            "localhost:0",
            "localhost:+80",
            "1.2.3.999:80",
            "'a b:80'",
            "[9100]",
            "true",
            "9100.5",
        ] {
            match metrics(v) {
                Err(e @ ConfigError::Type { .. }) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("keycache_etcd.metrics")
                            && msg.contains(super::METRICS_EXPECTED),
                        "{v}: {msg}"
                    );
                }
                other => panic!("{v}: {other:?}"),
            }
        }
    }

    #[test]
    fn wrong_types_and_half_pairs_are_refused_with_the_line() {
        for (text, key) in [
            ("keycache_etcd: [a]\n", "keycache_etcd"),
            (
                "keycache_etcd:\n  endpoints: 5\n",
                "keycache_etcd.endpoints",
            ),
            ("keycache_etcd:\n  prefix: /p/\n", "keycache_etcd.endpoints"),
            (
                "keycache_etcd:\n  endpoints: [a:1]\n  cert: /c\n",
                "keycache_etcd.cert",
            ),
            (
                "keycache_etcd:\n  endpoints: [a:1]\n  user: u\n",
                "keycache_etcd.user",
            ),
            (
                "keycache_etcd:\n  endpoints: [a:1]\n  stale_after: 0\n",
                "keycache_etcd.stale_after",
            ),
            (
                "keycache_etcd:\n  endpoints: [a:1]\n  endpoint: x\n",
                "keycache_etcd.endpoint",
            ),
        ] {
            match load(text) {
                Err(ConfigError::Type { key: k, line, .. }) => {
                    assert_eq!(k, key, "{text}");
                    assert!(line >= 1, "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
