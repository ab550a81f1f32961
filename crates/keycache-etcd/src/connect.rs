//! Settings (`keycache_etcd` in the master config) and the connection to
//! etcd: endpoints balanced by etcd-client, TLS with a CA and a client
//! certificate, etcd's user and password.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions};
use keycache_config::etcd::EtcdSettings;
use keycache_config::MasterConfig;

use crate::error::{Error, Result};
use crate::prefix::Prefix;

/// The largest response accepted from etcd, unless set otherwise
/// ([`Settings::max_response`]; tonic's default is 4 MB).
pub const MAX_RESPONSE: usize = 64 << 20;

/// How long audit keys stay in etcd (7 days): each master keeps its own
/// log, so etcd's copy only needs to outlive a replicator's downtime; a
/// replicator down longer misses the records trimmed meanwhile.
pub const AUDIT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How long a member may take to answer the read that proves it is up,
/// current and behind a leader, when connecting.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything a replicator or a writer needs to reach the key state in etcd.
#[derive(Clone)]
pub struct Settings {
    /// The endpoints, each `http://` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// The keys in etcd.
    pub layout: Prefix,
    /// The CA certificate (PEM) that signs the servers'.
    pub ca: Option<PathBuf>,
    /// The client certificate and its key (PEM).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// etcd's user and password.
    pub user: Option<(String, String)>,
    /// How long a write waits for etcd's commit and for the replica.
    pub write_timeout: Duration,
    /// How long without a proof of currency (see [`crate::replicator`])
    /// before a replica counts as stale.
    pub stale_after: Duration,
    /// How often the replicator checks its replica against etcd
    /// ([`crate::check`]).
    pub check_every: Duration,
    /// The largest response taken from etcd ([`MAX_RESPONSE`]
    /// unless a test lowers it): a list asks for smaller pages past it, a
    /// watch lists again.
    pub max_response: usize,
    /// How long the audit trail's keys stay in etcd
    /// ([`AUDIT_RETENTION`] unless a test lowers it): the
    /// replicator's consistency check deletes older ones.
    pub audit_retention: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is never printed.
        f.debug_struct("Settings")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.layout.prefix())
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The settings of a master config's `keycache_etcd`; `None` without
    /// one.
    pub fn from_config(cfg: &MasterConfig) -> Result<Option<Settings>> {
        let (Some(e), Some(prefix)) = (&cfg.etcd, cfg.etcd_prefix()) else {
            return Ok(None);
        };
        Settings::from_parts(&e.value, &prefix).map(Some)
    }

    /// The settings of a `keycache_etcd` mapping read some other way (the
    /// Salt driver reads it from the master's options) under `prefix`
    /// (see [`MasterConfig::etcd_prefix`] for the default): a bare
    /// `host:port` endpoint is http; `ca` or `cert` with an http endpoint
    /// is refused.
    pub fn from_parts(e: &EtcdSettings, prefix: &str) -> Result<Settings> {
        let endpoints: Vec<String> = e
            .endpoints
            .iter()
            .map(|u| {
                if u.starts_with("http://") || u.starts_with("https://") {
                    u.clone()
                } else {
                    format!("http://{u}")
                }
            })
            .collect();
        let tls = e.ca.is_some() || e.cert.is_some();
        if tls {
            if let Some(u) = endpoints.iter().find(|u| u.starts_with("http://")) {
                return Err(Error::Config(format!(
                    "endpoint {u} is plain http, but ca or cert is set: give https:// endpoints"
                )));
            }
        }
        Ok(Settings {
            endpoints,
            layout: Prefix::new(prefix)?,
            ca: e.ca.clone(),
            identity: e.cert.clone().zip(e.key.clone()),
            user: e.user.clone().zip(e.password.clone()),
            write_timeout: Duration::from_secs(e.write_timeout),
            stale_after: Duration::from_secs(e.stale_after),
            check_every: Duration::from_secs(e.check_every),
            max_response: MAX_RESPONSE,
            audit_retention: AUDIT_RETENTION,
        })
    }

    /// Settings for plain-http `endpoints` and `prefix`, with the default
    /// timeouts (tests and tools).
    pub fn plain(endpoints: Vec<String>, prefix: &str) -> Result<Settings> {
        Ok(Settings {
            endpoints,
            layout: Prefix::new(prefix)?,
            ca: None,
            identity: None,
            user: None,
            write_timeout: Duration::from_secs(keycache_config::etcd::DEFAULT_WRITE_TIMEOUT),
            stale_after: Duration::from_secs(keycache_config::etcd::DEFAULT_STALE_AFTER),
            check_every: Duration::from_secs(keycache_config::etcd::DEFAULT_CHECK_EVERY),
            max_response: MAX_RESPONSE,
            audit_retention: AUDIT_RETENTION,
        })
    }

    /// Connects to the first endpoint that answers a read with a leader
    /// behind it, starting from one picked by this process's id (so that
    /// the masters spread over the members) and trying each in turn: a
    /// member that is down or cut off from the quorum is passed over, where
    /// etcd-client's balancing over every endpoint would send some requests
    /// to it and fail them. The client talks to that one member; a caller
    /// whose requests fail later connects again.
    pub async fn connect(&self) -> Result<Client> {
        let first = std::process::id() as usize;
        self.connect_from(first).await.map(|(c, _)| c)
    }

    /// [`Settings::connect`] trying the endpoints from the one at `first`
    /// (modulo their count) on; the client and the index of its endpoint.
    /// The probe is a linearizable read that must answer within
    /// [`PROBE_TIMEOUT`]: a member whose disk stalls answers none.
    pub async fn connect_from(&self, first: usize) -> Result<(Client, usize)> {
        let opts = self.options()?;
        let n = self.endpoints.len();
        let mut why = Vec::new();
        for i in 0..n {
            let at = (first + i) % n.max(1);
            let ep = &self.endpoints[at];
            let probe = async {
                let mut c = Client::connect([ep.as_str()], Some(opts.clone())).await?;
                let o = GetOptions::new().with_keys_only().with_limit(1);
                c.get(self.layout.prefix(), Some(o)).await?;
                Ok::<Client, etcd_client::Error>(c)
            };
            match tokio::time::timeout(PROBE_TIMEOUT.max(self.write_timeout / 4), probe).await {
                Ok(Ok(c)) => return Ok((c, at)),
                Ok(Err(e)) => why.push(format!("{ep}: {e}")),
                Err(_) => why.push(format!("{ep}: no answer to a read in time")),
            }
        }
        Err(Error::etcd(&self.endpoints, "connect", why.join("; ")))
    }

    /// The client options: timeouts, TLS, auth.
    fn options(&self) -> Result<ConnectOptions> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(self.write_timeout)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_require_leader(true);
        if self.ca.is_some() || self.identity.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            opts = opts.with_tls(tls);
        }
        if let Some((u, p)) = &self.user {
            opts = opts.with_user(u.clone(), p.clone());
        }
        Ok(opts)
    }

    /// An error of a request to etcd.
    pub(crate) fn err(&self, op: &'static str, e: impl std::fmt::Display) -> Error {
        Error::etcd(&self.endpoints, op, e)
    }
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| Error::TlsFile {
        path: p.to_path_buf(),
        why: e.to_string(),
    })
}
