//! systemd's notify protocol for `keycache replicate` (`Type=notify`), as
//! `sd_notify(3)` speaks it: one datagram per message to the socket that
//! `NOTIFY_SOCKET` names (a path, or an abstract name written `@name`).
//!
//! - `READY=1` once the replicator applied its first list of etcd, or
//!   proved the replica it resumed current (its catch-up applied);
//! - `STATUS=revision N, lag M` whenever either changes (`, stale` added
//!   while the replica is stale);
//! - `WATCHDOG=1` every half of `WATCHDOG_USEC` while the replicator's loop
//!   is healthy ([`keycache_etcd::Metrics::health`]), so that systemd's
//!   watchdog restarts a replicator whose loop is stuck;
//! - `STOPPING=1` when SIGTERM or SIGINT asks it to stop; it then stops,
//!   exit code 0.
//!
//! Without `NOTIFY_SOCKET` nothing is sent and no signal is handled. A
//! datagram that cannot be sent is dropped: systemd then says what it
//! missed.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use keycache_etcd::Metrics;

use crate::output::{errln, esc};

/// How often readiness and the status are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The socket systemd listens on, and its watchdog's period.
#[derive(Debug)]
pub(crate) struct Notifier {
    socket: UnixDatagram,
    to: SocketAddr,
    /// Half of `WATCHDOG_USEC` (`None`: no watchdog for this process).
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` asks for (`None`: unset, or a socket
    /// that cannot be used, which is said on stderr).
    pub(crate) fn from_env() -> Option<Notifier> {
        let name = std::env::var_os("NOTIFY_SOCKET")?;
        let name = name.to_str().unwrap_or_default();
        let to = match name.strip_prefix('@') {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(abstract_name.as_bytes())
            }
            None if name.starts_with('/') => SocketAddr::from_pathname(name),
            None => Err(std::io::Error::other("neither a path nor @name")),
        };
        let socket = UnixDatagram::unbound();
        match (to, socket) {
            (Ok(to), Ok(socket)) => {
                let _ = socket.set_nonblocking(true);
                Some(Notifier {
                    socket,
                    to,
                    watchdog: watchdog(),
                })
            }
            (Err(e), _) | (_, Err(e)) => {
                errln!(
                    "keycache: replicate: NOTIFY_SOCKET={} cannot be used ({e}): not notifying \
                     systemd",
                    esc(name)
                );
                None
            }
        }
    }

    /// Sends `message` (`KEY=value` lines); a failure is dropped.
    pub(crate) fn send(&self, message: &str) {
        let _ = self.socket.send_to_addr(message.as_bytes(), &self.to);
    }

    /// Tells systemd what `metrics` say, forever: `READY=1` once, the
    /// status on each change, the watchdog's pings while healthy.
    pub(crate) async fn run(&self, metrics: &Metrics) -> std::convert::Infallible {
        let mut look = tokio::time::interval(LOOK_EVERY);
        // Without a watchdog the interval is never looked at.
        let mut ping = tokio::time::interval(self.watchdog.unwrap_or(Duration::from_secs(3600)));
        let mut ready = false;
        let mut last: Option<String> = None;
        self.send("STATUS=listing etcd, or catching up with it");
        loop {
            tokio::select! {
                _ = look.tick() => {
                    let st = metrics.standing();
                    let status = format!(
                        "STATUS=revision {}, lag {}{}",
                        st.revision,
                        st.lag,
                        if st.stale.is_some() { ", stale" } else { "" }
                    );
                    if !ready && metrics.proven() {
                        ready = true;
                        self.send(&format!("READY=1\n{status}"));
                        last = Some(status);
                    } else if ready && last.as_ref() != Some(&status) {
                        self.send(&status);
                        last = Some(status);
                    }
                }
                _ = ping.tick(), if self.watchdog.is_some() => {
                    if metrics.health().is_ok() {
                        self.send("WATCHDOG=1");
                    }
                }
            }
        }
    }
}

/// Half of `WATCHDOG_USEC`, when it is set for this process
/// (`WATCHDOG_PID` unset or this pid), as `sd_watchdog_enabled(3)` reads
/// it.
fn watchdog() -> Option<Duration> {
    if let Some(pid) = std::env::var_os("WATCHDOG_PID") {
        if pid.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id()) {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Waits for SIGTERM or SIGINT (never, when they cannot be handled).
pub(crate) async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            errln!("keycache: replicate: cannot handle SIGTERM and SIGINT ({e})");
            std::future::pending::<()>().await;
        }
    }
}
