//! The replicator's metrics (Prometheus' text format), health and
//! readiness, served over HTTP when `keycache_etcd: {metrics: ADDR}` is
//! set ([`bind`], [`serve`]): `/metrics`, `/healthz`, `/readyz`.
//!
//! Every [`Replicator`](crate::Replicator) keeps a [`Metrics`] handle
//! ([`Replicator::metrics`](crate::Replicator::metrics)), fed by the
//! replicator itself: the state it records (revisions, its proof of
//! currency), the reason of each list, its reports (batches applied,
//! entries not held, consistency checks), the store's key counts, and a
//! heartbeat at each step of its loop. What depends on time (the age of
//! the last proof, staleness, readiness) is computed when asked (a scrape,
//! a probe), so that it moves while etcd does not answer and the loop
//! waits.
//!
//! - **Healthy** (`/healthz`): the replicator's loop stepped within
//!   [`Metrics::healthy_within`], its longest bounded wait with room to
//!   spare. etcd unreachable is healthy: the loop keeps trying.
//! - **Ready** (`/readyz`): this replicator applied its first list of etcd
//!   (or proved a resumed replica current, its catch-up applied), and the
//!   replica is not stale, as `keycache etcd status` judges it
//!   ([`ReplicaState::stale`]: a proof of currency within `stale_after`, on
//!   the host's boot clock).
//!
//! No label holds a minion id: every label value is from a small fixed set.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use keycache::store::Store;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::connect::{Settings, PROBE_TIMEOUT};
use crate::error::{Error, Result};
use crate::report::Report;
use crate::state::{boot_ms, ReplicaState};

/// Why the replicator listed etcd (the `reason` of
/// `keycache_relists_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relist {
    /// No readable state: the store's first list (or one after its state
    /// file was lost).
    Start,
    /// The state names another prefix or etcd cluster, or a revision etcd
    /// has not reached (etcd replaced, or restored from a backup).
    Mismatch,
    /// The state was not written for this store's files (a copy or a
    /// restore of the directory).
    NotBound,
    /// etcd's history does not hold the last change the store applied (a
    /// restore that forked it).
    Forked,
    /// That last change could not be looked at (compacted): unverified.
    Unverified,
    /// The watch's revision was compacted.
    Compacted,
    /// A catch-up larger than the replicator takes.
    TooLarge,
    /// A consistency check found the replica differing from etcd.
    CheckDiffers,
    /// The store's files were replaced behind the replicator's back.
    FilesReplaced,
}

impl Relist {
    /// Every reason, in the order they are exposed.
    pub const ALL: [Relist; 9] = [
        Relist::Start,
        Relist::Mismatch,
        Relist::NotBound,
        Relist::Forked,
        Relist::Unverified,
        Relist::Compacted,
        Relist::TooLarge,
        Relist::CheckDiffers,
        Relist::FilesReplaced,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Relist::Start => "start",
            Relist::Mismatch => "mismatch",
            Relist::NotBound => "not_bound",
            Relist::Forked => "forked",
            Relist::Unverified => "unverified",
            Relist::Compacted => "compacted",
            Relist::TooLarge => "too_large",
            Relist::CheckDiffers => "check_differs",
            Relist::FilesReplaced => "files_replaced",
        }
    }
}

/// The `result` values of `keycache_consistency_checks_total`: the
/// replica equal to etcd, differing (listed again), still differing right
/// after a list (entries it cannot hold), skipped (etcd compacted the
/// revision), or the check failed (etcd did not answer it).
pub const CHECK_RESULTS: [&str; 5] = ["same", "differs", "not_held", "skipped", "failed"];

/// The `state` values of `keycache_keys`.
pub const KEY_STATES: [&str; 4] = ["accepted", "pending", "rejected", "denied"];

/// How long a connection's request may take to arrive, and how long one
/// connection may stay open.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 16;

type Label = [(&'static str, &'static str); 1];

/// A handle on one replicator's metrics (clones share them).
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("dir", &self.0.dir)
            .finish_non_exhaustive()
    }
}

struct Inner {
    registry: Registry,
    replica_revision: Gauge,
    etcd_revision: Gauge,
    lag: Gauge,
    contact_age: Gauge<f64, AtomicU64>,
    stale: Gauge,
    ready: Gauge,
    relists: Family<Label, Counter>,
    apply_seconds: Histogram,
    watch_events: Counter,
    keys: Family<Label, Gauge>,
    not_held: Counter,
    checks: Family<Label, Counter>,
    /// The store directory, and the settings staleness is judged by.
    dir: PathBuf,
    stale_after: Duration,
    healthy_within: Duration,
    /// When these metrics were made, on the boot clock, and the boot: a
    /// proof taken since is this replicator's.
    started_ms: u64,
    boot_id: String,
    /// The loop's last step, on the boot clock.
    beat_ms: AtomicU64,
    /// The state the replicator last recorded (or resumed from).
    state: Mutex<Option<ReplicaState>>,
    /// This replicator applied a list, or proved its replica current.
    proven: AtomicBool,
    /// The store changed since its keys were last counted.
    keys_due: AtomicBool,
    /// Someone reads the metrics (a server runs): keys are counted.
    served: AtomicBool,
}

/// A replica's standing, computed when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// Why it is stale (`None`: proven current within `stale_after`).
    pub stale: Option<String>,
    /// Why it is not ready (`None`: ready).
    pub not_ready: Option<String>,
    /// The revision the store holds.
    pub revision: i64,
    /// The latest etcd revision the replicator saw.
    pub etcd_revision: i64,
    /// Revisions etcd has that the replica is not proven to hold.
    pub lag: i64,
    /// How long ago the last proof of currency was (`None`: never).
    pub contact_age: Option<Duration>,
}

impl Metrics {
    /// The metrics of a replicator of the store in `dir` from the etcd of
    /// `settings`.
    pub fn new(dir: &Path, settings: &Settings) -> Metrics {
        let mut registry = Registry::default();
        let replica_revision = Gauge::default();
        let etcd_revision = Gauge::default();
        let lag = Gauge::default();
        let contact_age = Gauge::<f64, AtomicU64>::default();
        let stale = Gauge::default();
        let ready = Gauge::default();
        let relists = Family::<Label, Counter>::default();
        let apply_seconds = Histogram::new(exponential_buckets(0.0005, 2.5, 12));
        let watch_events = Counter::default();
        let keys = Family::<Label, Gauge>::default();
        let not_held = Counter::default();
        let checks = Family::<Label, Counter>::default();
        for r in Relist::ALL {
            let _ = relists.get_or_create(&[("reason", r.label())]);
        }
        for s in KEY_STATES {
            let _ = keys.get_or_create(&[("state", s)]);
        }
        for r in CHECK_RESULTS {
            let _ = checks.get_or_create(&[("result", r)]);
        }
        registry.register(
            "keycache_replica_revision",
            "The etcd revision the replica holds: every change under the prefix up to it",
            replica_revision.clone(),
        );
        registry.register(
            "keycache_etcd_revision",
            "The latest etcd revision the replicator saw",
            etcd_revision.clone(),
        );
        registry.register(
            "keycache_replica_lag_revisions",
            "etcd's revision minus the latest the replica is proven to hold",
            lag.clone(),
        );
        registry.register(
            "keycache_replica_last_contact_age_seconds",
            "Seconds since the replicator last proved the replica current (+Inf: never)",
            contact_age.clone(),
        );
        registry.register(
            "keycache_replica_stale",
            "1 when the replica is not proven current within stale_after",
            stale.clone(),
        );
        registry.register(
            "keycache_replica_ready",
            "1 once the replicator applied its first list (or proved a resumed replica \
             current) and the replica is not stale",
            ready.clone(),
        );
        registry.register(
            "keycache_relists",
            "Lists of etcd's whole prefix, by reason",
            relists.clone(),
        );
        registry.register(
            "keycache_apply_seconds",
            "Seconds to apply one batch of watched changes to the store and its key tree",
            apply_seconds.clone(),
        );
        registry.register(
            "keycache_watch_events",
            "Changes of the key state applied from etcd's watch",
            watch_events.clone(),
        );
        registry.register(
            "keycache_keys",
            "Keys in the replica, by state (denied: the denied_keys bank)",
            keys.clone(),
        );
        registry.register(
            "keycache_not_held",
            "etcd entries this store did not take (a full bank, a value that is no key), \
             counted at each list or batch that met them",
            not_held.clone(),
        );
        registry.register(
            "keycache_consistency_checks",
            "Consistency checks of the replica against etcd, by result",
            checks.clone(),
        );
        let now = boot_ms();
        Metrics(Arc::new(Inner {
            registry,
            replica_revision,
            etcd_revision,
            lag,
            contact_age,
            stale,
            ready,
            relists,
            apply_seconds,
            watch_events,
            keys,
            not_held,
            checks,
            dir: dir.to_path_buf(),
            stale_after: settings.stale_after,
            healthy_within: healthy_within(settings),
            started_ms: now,
            boot_id: crate::state::boot_id(),
            beat_ms: AtomicU64::new(now),
            state: Mutex::new(None),
            proven: AtomicBool::new(false),
            keys_due: AtomicBool::new(true),
            served: AtomicBool::new(false),
        }))
    }

    /// How long the loop may go without a step before it is unhealthy.
    pub fn healthy_within(&self) -> Duration {
        self.0.healthy_within
    }

    /// A step of the replicator's loop.
    pub(crate) fn beat(&self) {
        self.0.beat_ms.store(boot_ms(), Ordering::Relaxed);
    }

    /// Runs `f`, a wait whose length grows with the prefix (a list, a
    /// consistency check: page by page, each page bounded), stepping the
    /// heartbeat every second while it runs.
    pub(crate) async fn beating<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(f);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                r = &mut f => return r,
                _ = tick.tick() => self.beat(),
            }
        }
    }

    /// The state the replicator recorded (or resumed from): a proof of
    /// currency taken by this replicator (a list is one) makes it ready
    /// once it is not stale.
    pub(crate) fn recorded(&self, s: &ReplicaState) {
        if s.contact_boot_ms >= self.0.started_ms && s.boot_id == self.0.boot_id {
            self.0.proven.store(true, Ordering::Relaxed);
        }
        *self.0.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
    }

    /// A list of the whole prefix, for `why`.
    pub(crate) fn relisted(&self, why: Relist) {
        self.0
            .relists
            .get_or_create(&[("reason", why.label())])
            .inc();
    }

    /// A consistency check that failed (etcd did not answer it).
    pub(crate) fn check_failed(&self) {
        self.0.checks.get_or_create(&[("result", "failed")]).inc();
    }

    /// What a report tells: batches, entries not held, checks; a list or
    /// a batch also makes the key counts due.
    pub(crate) fn report(&self, r: &Report) {
        let refused = match r {
            Report::Listed { applied, .. } => {
                self.0.keys_due.store(true, Ordering::Relaxed);
                applied.refused.len()
            }
            Report::Applied {
                events,
                applied,
                took,
                ..
            } => {
                self.0.keys_due.store(true, Ordering::Relaxed);
                self.0.watch_events.inc_by(*events as u64);
                self.0.apply_seconds.observe(took.as_secs_f64());
                applied.refused.len()
            }
            Report::Checked { result, .. } => {
                let result = match *result {
                    "equal" => "same",
                    "differed" => "differs",
                    "not_held" => "not_held",
                    _ => "skipped",
                };
                self.0.checks.get_or_create(&[("result", result)]).inc();
                0
            }
            _ => 0,
        };
        self.0.not_held.inc_by(refused as u64);
    }

    /// Counts the keys of `store` by state when it changed since the last
    /// count and someone reads the metrics (a walk of both banks: the
    /// replicator asks at most once per tick). A store that cannot be read
    /// keeps the last counts.
    pub(crate) fn count_keys(&self, store: &Store) {
        if !self.0.served.load(Ordering::Relaxed) || !self.0.keys_due.swap(false, Ordering::Relaxed)
        {
            return;
        }
        let Ok(c) = store.counts() else {
            self.0.keys_due.store(true, Ordering::Relaxed);
            return;
        };
        for (state, n) in KEY_STATES
            .into_iter()
            .zip([c.accepted, c.pending, c.rejected, c.denied])
        {
            self.0
                .keys
                .get_or_create(&[("state", state)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// `Ok`: the loop stepped that long ago, within
    /// [`Metrics::healthy_within`]; `Err`: why it is not healthy.
    pub fn health(&self) -> std::result::Result<Duration, String> {
        let age =
            Duration::from_millis(boot_ms().saturating_sub(self.0.beat_ms.load(Ordering::Relaxed)));
        if age <= self.0.healthy_within {
            Ok(age)
        } else {
            Err(format!(
                "the replicator's loop has not stepped for {:.1} s (more than {:.1} s)",
                age.as_secs_f64(),
                self.0.healthy_within.as_secs_f64()
            ))
        }
    }

    /// Whether this replicator applied its first list, or proved its
    /// resumed replica current (stale or not since).
    pub fn proven(&self) -> bool {
        self.0.proven.load(Ordering::Relaxed)
    }

    /// The replica's standing now.
    pub fn standing(&self) -> Standing {
        let state = self
            .0
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(s) = state else {
            let why = "the replicator has not listed etcd, nor proven a resumed replica current, \
                       yet"
            .to_owned();
            return Standing {
                stale: Some(why.clone()),
                not_ready: Some(why),
                revision: 0,
                etcd_revision: 0,
                lag: 0,
                contact_age: None,
            };
        };
        let stale = s.stale(&self.0.dir, self.0.stale_after);
        let not_ready = if !self.proven() {
            Some(
                "the replicator has not applied its first list of etcd (nor proven the replica \
                 it resumed current) yet"
                    .to_owned(),
            )
        } else {
            stale.as_ref().map(|why| format!("stale: {why}"))
        };
        Standing {
            stale,
            not_ready,
            revision: s.revision,
            etcd_revision: s.etcd_revision,
            lag: (s.etcd_revision - s.revision.max(s.current_through)).max(0),
            contact_age: s.contact_age(),
        }
    }

    /// The metrics in Prometheus' text format (version 0.0.4), the gauges
    /// that depend on time computed now.
    pub fn encode(&self) -> String {
        let st = self.standing();
        let i = &self.0;
        i.replica_revision.set(st.revision);
        i.etcd_revision.set(st.etcd_revision);
        i.lag.set(st.lag);
        i.contact_age
            .set(st.contact_age.map_or(f64::INFINITY, |d| d.as_secs_f64()));
        i.stale.set(i64::from(st.stale.is_some()));
        i.ready.set(i64::from(st.not_ready.is_none()));
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &i.registry);
        out
    }
}

/// How long the replicator's loop may go without a step and still be
/// healthy: its longest bounded wait (a connect that tries every endpoint,
/// then three requests to etcd of up to `write_timeout` each, or a
/// backoff of 5 s), with 5 s to spare. A list or a consistency check of a
/// large prefix steps at each page.
pub fn healthy_within(settings: &Settings) -> Duration {
    let endpoints = u32::try_from(settings.endpoints.len().max(1)).unwrap_or(u32::MAX);
    let connect = PROBE_TIMEOUT.max(settings.write_timeout / 4) * endpoints;
    connect + (settings.write_timeout * 3).max(Duration::from_secs(5)) + Duration::from_secs(5)
}

/// Listens on `addr` (`HOST:PORT`, see `keycache_etcd: {metrics}`); an
/// address that cannot be listened on is an error that names it.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Error::Config(format!(
            "metrics: cannot listen on {addr} (keycache_etcd.metrics): {e}"
        ))
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` of `metrics` on `listener`,
/// forever (HTTP/1.1; each connection a task of the runtime, at most 16 at
/// once, each closed after 30 s).
/// Run it beside the replicator, on its runtime.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
) -> std::convert::Infallible {
    metrics.0.served.store(true, Ordering::Relaxed);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // The semaphore is never closed.
        let slot = slots.clone().acquire_owned().await.ok();
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of descriptors, say: a moment, then on.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let m = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let r = respond(&m, &req);
                async move { Ok::<_, std::convert::Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
            drop(slot);
        });
    }
}

/// [`Replicator::run`](crate::Replicator::run) until `stop` completes,
/// with its metrics served on `listener` beside it (`None`: not served),
/// on the same runtime.
pub async fn run_serving(
    replicator: &mut crate::Replicator,
    listener: Option<tokio::net::TcpListener>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let metrics = replicator.metrics();
    let serving = async {
        match listener {
            Some(l) => match serve(l, metrics).await {},
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = replicator.run(stop) => r,
        () = serving => Ok(()),
    }
}

/// The answer to one request.
fn respond<B>(m: &Metrics, req: &Request<B>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = content_type.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "only GET and HEAD\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            m.encode(),
        ),
        "/healthz" => match m.health() {
            Ok(age) => reply(
                StatusCode::OK,
                TEXT,
                format!(
                    "ok: the replicator's loop stepped {:.1} s ago\n",
                    age.as_secs_f64()
                ),
            ),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
        },
        "/readyz" => match m.standing().not_ready {
            None => reply(StatusCode::OK, TEXT, "ready\n".into()),
            Some(why) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("not ready: {why}\n"),
            ),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /metrics, /healthz, /readyz\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::plain(vec!["http://127.0.0.1:1".into()], "/p/").expect("settings")
    }

    /// Every metric is exposed from the start, each labelled family with
    /// its whole fixed set of values; the gauges that depend on time say
    /// stale and not ready before any state.
    #[test]
    fn every_metric_is_exposed_before_anything_happened() {
        let dir = tempfile::tempdir().expect("dir");
        let m = Metrics::new(dir.path(), &settings());
        let text = m.encode();
        for name in [
            "keycache_replica_revision 0",
            "keycache_etcd_revision 0",
            "keycache_replica_lag_revisions 0",
            "keycache_replica_last_contact_age_seconds +Inf",
            "keycache_replica_stale 1",
            "keycache_replica_ready 0",
            "keycache_relists_total{reason=\"start\"} 0",
            "keycache_relists_total{reason=\"files_replaced\"} 0",
            "keycache_apply_seconds_count 0",
            "keycache_watch_events_total 0",
            "keycache_keys{state=\"accepted\"} 0",
            "keycache_keys{state=\"denied\"} 0",
            "keycache_not_held_total 0",
            "keycache_consistency_checks_total{result=\"failed\"} 0",
        ] {
            assert!(text.contains(&format!("{name}\n")), "{name}:\n{text}");
        }
        assert!(m.standing().not_ready.is_some());
        assert!(m.health().is_ok());
    }

    /// Reports move the counters; a state recorded with a proof taken by
    /// this replicator makes it proven; the lag counts only revisions the
    /// replica is not proven to hold.
    #[test]
    fn reports_and_states_move_the_metrics() {
        let dir = tempfile::tempdir().expect("dir");
        let m = Metrics::new(dir.path(), &settings());
        m.relisted(Relist::Compacted);
        m.check_failed();
        m.report(&Report::Applied {
            revision: 9,
            events: 3,
            applied: crate::replica::Applied {
                written: 2,
                removed: 1,
                refused: vec![("k".into(), "full".into())],
            },
            took: Duration::from_millis(2),
        });
        m.report(&Report::Checked {
            revision: 9,
            entries: 1,
            result: "equal",
        });
        let s = ReplicaState {
            prefix: "/p/".into(),
            revision: 9,
            etcd_revision: 15,
            current_through: 12,
            contact_boot_ms: boot_ms(),
            boot_id: crate::state::boot_id(),
            ..ReplicaState::default()
        };
        assert!(!m.proven());
        m.recorded(&s);
        assert!(m.proven());
        let text = m.encode();
        for line in [
            "keycache_relists_total{reason=\"compacted\"} 1",
            "keycache_consistency_checks_total{result=\"failed\"} 1",
            "keycache_consistency_checks_total{result=\"same\"} 1",
            "keycache_watch_events_total 3",
            "keycache_not_held_total 1",
            "keycache_apply_seconds_count 1",
            "keycache_replica_revision 9",
            "keycache_etcd_revision 15",
            "keycache_replica_lag_revisions 3",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line}:\n{text}");
        }
        // Not bound to this directory's files: stale, so not ready.
        let st = m.standing();
        assert!(st.stale.is_some() && st.not_ready.is_some(), "{st:?}");
        // An old proof (a resumed state) does not make it proven.
        let m = Metrics::new(dir.path(), &settings());
        m.recorded(&ReplicaState {
            contact_boot_ms: 1,
            ..s
        });
        assert!(!m.proven());
    }

    #[test]
    fn healthy_within_covers_the_longest_bounded_wait() {
        let mut s = settings();
        s.write_timeout = Duration::from_secs(10);
        assert_eq!(healthy_within(&s), Duration::from_millis(37_500));
        s.endpoints = vec!["a".into(), "b".into(), "c".into()];
        s.write_timeout = Duration::from_secs(1);
        assert_eq!(healthy_within(&s), Duration::from_secs(16));
    }
}
